// Hopper (sm_90a) primitives, one function per PTX instruction or descriptor: mbarriers,
// TMA tile copies, wgmma fences and shared-memory matrix descriptors, setmaxnreg, named
// barriers; and Sm90Tile, the shared-memory layout the copy engine writes and wgmma reads.
// Nothing here knows about attention.  Everything but the layout arithmetic compiles only
// in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); kernels guard their bodies the same way.
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "ptx.h"
#include "wgmma_ops.h"

namespace fmha {
namespace cuda {

// kRows x kCols elements of kElemBytes (2, or 1 for fp8) as kCols / kSlab column slabs of
// kRows x kSlab, each row of a slab one swizzle span (128 bytes, or 64 for the narrow slabs
// D = 96 needs, and fp8 at D = 64): the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B /
// _64B and a box of kSlab x kRows, and the one wgmma's descriptors describe.  kSlab_
// narrows the slabs of a tile whose columns wgmma must address in 32-column halves (the
// backward's K at D = 64).  Within a slab, row r's 16-byte chunk c lies at chunk
// c ^ swizzle(r), the same function as SmemTile's (smem.h), so eight consecutive rows of one
// chunk column fall in eight different bank groups.
template <int kRows, int kCols, int kSlab_ = (kCols % 64 == 0 ? 64 : 32), int kElemBytes_ = 2>
struct Sm90Tile {
  static constexpr int kElemBytes = kElemBytes_;
  static constexpr int kSlab = kSlab_;  // elements per slab row
  static constexpr int kSlabs = kCols / kSlab;
  static constexpr int kSpan = kSlab * kElemBytes;  // bytes per slab row: the swizzle span
  static constexpr int kChunk = 16 / kElemBytes;    // elements per 16-byte chunk
  static_assert(kCols % kSlab == 0 && (kSpan == 64 || kSpan == 128) && kRows % 8 == 0, "tile shape");
  static constexpr int kSlabBytes = kRows * kSpan;
  static constexpr int kBytes = kSlabs * kSlabBytes;
  static constexpr int kSlabElems = kSlabBytes / kElemBytes, kElems = kBytes / kElemBytes;
  static constexpr int kRowsC = kRows, kColsC = kCols;
  // The descriptor's layout type (2 bits at 62): 1 = 128-byte swizzle, 2 = 64-byte.
  static constexpr uint64_t kLayoutType = kSpan == 128 ? 1 : 2;
  // Slabs must start on the swizzle pattern's period (8 rows).
  static constexpr int kAlign = 8 * kSpan;

  __device__ __forceinline__ static unsigned swizzle(unsigned r) { return kSpan == 128 ? r % 8 : (r / 2) % 4; }
  // Element offset of (r, c).
  __device__ __forceinline__ static unsigned offset(unsigned r, unsigned c) {
    return (c / kSlab) * kSlabElems + r * kSlab + ((((c % kSlab) / kChunk) ^ swizzle(r)) * kChunk) + c % kChunk;
  }
};

// The same layout for fp8 (one byte per element): 128-element slabs, 64 where the columns
// are not a multiple of 128 (D = 64).
template <int kRows, int kCols>
using Sm90Tile8 = Sm90Tile<kRows, kCols, (kCols % 128 == 0 ? 128 : 64), 1>;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- shared-memory matrix descriptors (wgmma) ----
// Start address, leading and stride byte offsets in 16-byte units, swizzle mode at bit 62.
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes,
                                                   uint64_t layout_type) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lead_bytes >> 4) << 16) |
         ((uint64_t)(stride_bytes >> 4) << 32) | (layout_type << 62);
}

// An operand stored K-major in a Sm90Tile (rows = M or N, columns = K), e.g. Q and K for
// S = Q K^T.  A wgmma reads 8-row groups SBO = 8 spans apart; its k-columns (16 of 16 bits,
// 32 of 8) are one 32-byte step inside a swizzled row (LBO unused).  k_desc(kk) is the
// descriptor of the kk-th such step starting at row `row0` (a multiple of 8).
template <class Tile>
struct KMajorDesc {
  uint64_t base;
  __device__ __forceinline__ KMajorDesc(const void* tile, int row0)
      : base(make_smem_desc(smem_addr(tile) + row0 * Tile::kSpan, 16, 8 * Tile::kSpan, Tile::kLayoutType)) {}
  static __device__ __forceinline__ uint32_t k_offset(int kk) {
    const int byte = kk * 32;
    return (uint32_t)(((byte / Tile::kSpan) * Tile::kSlabBytes + byte % Tile::kSpan) >> 4);
  }
  __device__ __forceinline__ uint64_t k_desc(int kk) const { return base + k_offset(kk); }
  // The same from a low word the caller passes in (e.g. laundered through an empty asm, so
  // that ptxas rebuilds the steps' descriptors where they are used instead of holding them
  // all in registers): the offset stays in the start-address field, which never carries
  // into the next (shared memory ends below 256 KB).
  __device__ __forceinline__ uint64_t k_desc(uint32_t lo, int kk) const {
    return (base & 0xffffffff00000000ull) | (lo + k_offset(kk));
  }
};

// An operand stored MN-major in a Sm90Tile (rows = K, columns = N), e.g. V (keys x head dim)
// as B of O = P V: N runs along the slab rows, and a wgmma's N = kCols spans every slab
// (LBO = one slab apart); its 16 k-rows are two 8-row groups (SBO = 8 spans).
template <class Tile>
struct MnMajorDesc {
  uint64_t base;
  __device__ __forceinline__ explicit MnMajorDesc(const void* tile)
      : base(make_smem_desc(smem_addr(tile), Tile::kSlabBytes, 8 * Tile::kSpan, Tile::kLayoutType)) {}
  __device__ __forceinline__ uint64_t k_desc(int kk) const { return base + (uint64_t)((kk * 16 * Tile::kSpan) >> 4); }
};

// ---- wgmma ordering ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous wgmma that owns them (it does not know they are in flight).
template <int NT>
__device__ __forceinline__ void fence_operand(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// ---- warpgroup roles ----
// This thread's warpgroup (threadIdx.x / 128) broadcast from lane 0, which tells the
// compiler it is the same across the warp: what derives from it (a consumer's rows, its
// wgmma descriptors) then lives in uniform registers, computed once per warp, where
// threadIdx.x / 128 left them per thread, copied to uniform registers before every wgmma.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }

// ---- register reallocation between warpgroups ----
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- named barriers (id 0 is __syncthreads) ----
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- mbarriers ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initializations visible to the copy engine (then a __syncthreads to the CTA).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives and announces `bytes` of copies that will complete on this barrier's phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// ---- TMA ----
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One box of a 4-d tensor map (coordinates innermost first) into shared memory, completing
// as transaction bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// `bytes` (a multiple of 16) from global into shared memory, both 16-byte aligned, completing
// as transaction bytes on `bar`.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(reinterpret_cast<uint64_t>(gmem)), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace cuda
}  // namespace fmha
