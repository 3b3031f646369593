// Warp-level matrix products on mma.sync m16n8k16 with fp32 accumulators.
//
// An accumulator tile float[MT][NT][4] is (16 MT) x (8 NT) per warp; lane l holds, of each
// 16x8 block, rows g = l / 4 and g + 8, columns 2t and 2t + 1 (t = l % 4): elements
// [0], [1] on row g and [2], [3] on row g + 8.  Operands come from swizzled shared tiles
// (smem.h) through ldmatrix, or, for P and dS, straight from accumulators: the accumulator
// of two adjacent 16x8 blocks is exactly an A fragment of one 16x16 block.
#pragma once

#include <math.h>
#include <stdint.h>

#include "ptx.h"
#include "smem.h"

namespace fmha {
namespace cuda {

// The ldmatrix address of one lane for one access pattern of a tile.  A pattern puts the
// lane's row at r0 + l % 8 + 8 * row_bit and its 16-byte chunk at c0 / 8 + chunk_bit.  With
// r0 a multiple of 8 and c0 of 16, the swizzle reduces to XOR of the chunk with a per-lane
// constant z, and (c0 / 8) ^ z = (c0 / 8 & ~7) + ((c0 / 8 & 7) ^ z): four per-lane offsets
// and compile-time constants, instead of one live register per (row, column) visited.
// The lane's row offset lives in those four offsets and `base` is the tile's address, the
// same in every lane, so tiles of one width read with one pattern share the offsets
// (fewer live registers: the backward's spills fell from 164 to 140 bytes).
//
// Columns are relative to c_origin (a multiple of 16, e.g. a warp's first column), folded
// into the offsets here: then c0 is a compile-time constant in the unrolled products and so
// is the offset index.  (An index that depends on the warp puts the offsets in local
// memory, one load per ldmatrix: the backward's dK/dV and dQ products did that.)
template <class Tile>
struct LdsmAddr {
  uint32_t base;
  uint32_t xor_off[4];

  __device__ __forceinline__ LdsmAddr(const void* tile, int row_bit, int chunk_bit, int lane, int c_origin = 0) {
    const int r = lane % 8 + 8 * row_bit;
    const int co = c_origin / 8;  // even
    base = smem_addr(tile) + (co & ~7) * 16;
    const int z = chunk_bit ^ Tile::swizzle(r);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = (co & 7) + 2 * j;  // the chunk past base, below 16
      xor_off[j] = r * Tile::kColsC * 2 + ((c & ~7) + ((c & 7) ^ z)) * 16;
    }
  }
  __device__ __forceinline__ uint32_t operator()(int r0, int c0) const {
    const int kc = c0 / 8;
    return base + r0 * Tile::kColsC * 2 + (kc & ~7) * 16 + xor_off[(kc & 7) / 2];
  }
};

// The four access patterns (see ldmatrix's fragment layouts):
//  A: 16x16 at (r0, c0) of a tile stored [m][k]             rows +8 for matrices 1, 3
//  At: A (16 m x 16 k) of the transpose of a tile [k][m]     at (k0, m0): rows +8 for 2, 3
//  B: two 8-column n-blocks x 16 k of a tile stored [n][k]  at (n0, k0): rows +8 for 2, 3
//  Bt: the same from a tile stored [k][n]                   at (k0, n0): rows +8 for 1, 3
template <class Tile>
__device__ __forceinline__ LdsmAddr<Tile> ldsm_a(const void* s, int lane) {
  return LdsmAddr<Tile>(s, (lane / 8) % 2, lane / 16, lane);
}
template <class Tile>
__device__ __forceinline__ LdsmAddr<Tile> ldsm_at(const void* s, int lane, int c_origin = 0) {
  return LdsmAddr<Tile>(s, lane / 16, (lane / 8) % 2, lane, c_origin);
}
template <class Tile>
__device__ __forceinline__ LdsmAddr<Tile> ldsm_b(const void* s, int lane) {
  return LdsmAddr<Tile>(s, lane / 16, (lane / 8) % 2, lane);
}
template <class Tile>
__device__ __forceinline__ LdsmAddr<Tile> ldsm_bt(const void* s, int lane, int c_origin = 0) {
  return LdsmAddr<Tile>(s, (lane / 8) % 2, lane / 16, lane, c_origin);
}

template <int MT, int NT>
__device__ __forceinline__ void clear(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
}

// acc += A B^T over k in [0, K): A (ldsm_a pattern, [m][k]) has this warp's 16-row blocks
// at rows a_row0 + m * a_stride; B (ldsm_b pattern, [n][k]) the NT * 8 rows from b_row0.
// Works as well for A^T (ldsm_at pattern on a [k][m] tile, a_row0/a_stride in m) with
// kTransA, and for B stored [k][n] (ldsm_bt pattern, b_row0 in n) with kTransB.
template <int K, bool kTransA, bool kTransB, class TA, class TB, int MT, int NT, class T>
__device__ __forceinline__ void gemm(float (&acc)[MT][NT][4], const LdsmAddr<TA>& a_addr, int a_row0, int a_stride,
                                     const LdsmAddr<TB>& b_addr, int b_row0) {
  static_assert(NT % 2 == 0 && K % 16 == 0, "n in pairs of 8-column blocks, k in steps of 16");
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (kTransA)
        ldmatrix_x4_trans(a[m], a_addr(k, a_row0 + m * a_stride));
      else
        ldmatrix_x4(a[m], a_addr(a_row0 + m * a_stride, k));
    }
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b[4];
      if (kTransB)
        ldmatrix_x4_trans(b, b_addr(k, b_row0 + n * 8));
      else
        ldmatrix_x4(b, b_addr(b_row0 + n * 8, k));
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma_16816<T>(acc[m][n], a[m], b[0], b[1]);
        mma_16816<T>(acc[m][n + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// A fragments (MT x NT/2 of them) from fp32 accumulators, rounded to T.
template <class T, int MT, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[MT][NT / 2][4], const float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int k = 0; k < NT / 2; ++k) {
      a[m][k][0] = pack2<T>(acc[m][2 * k][0], acc[m][2 * k][1]);
      a[m][k][1] = pack2<T>(acc[m][2 * k][2], acc[m][2 * k][3]);
      a[m][k][2] = pack2<T>(acc[m][2 * k + 1][0], acc[m][2 * k + 1][1]);
      a[m][k][3] = pack2<T>(acc[m][2 * k + 1][2], acc[m][2 * k + 1][3]);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Four floats as e4m3 bytes, a in the lowest (round to nearest, saturating to +-448).
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

// Accumulators (m16n8 layout, NT 8-column blocks) as e4m3 A fragments of k32 steps, each
// value staying in its thread: register j of step k packs the values of blocks 4k + (j & 2)
// and 4k + (j & 2) + 1 in row g + 8 (j & 1), so fragment column 4t + i (+16) holds
// accumulator column 2t + (i & 1) + 8 (i >> 1) (+16); the B operand's k order must match
// (fp8_key_of in fwd_sm90_kernel.h).
template <int MT, int NT>
__device__ __forceinline__ void acc_to_a8(uint32_t (&a)[MT][NT / 4][4], const float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int k = 0; k < NT / 4; ++k)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = 4 * k + (j & 2), e = 2 * (j & 1);
        a[m][k][j] = pack4_e4m3(acc[m][n][e], acc[m][n][e + 1], acc[m][n + 1][e], acc[m][n + 1][e + 1]);
      }
}
#endif

// acc += A B: A in registers (MT x KT fragments), B from a tile stored [k][n] (ldsm_bt
// pattern), k rows from b_row0, NT * 8 columns from n0.
template <class TB, int MT, int KT, int NT, class T>
__device__ __forceinline__ void gemm_rs(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KT][4],
                                        const LdsmAddr<TB>& b_addr, int b_row0, int n0) {
#pragma unroll
  for (int k = 0; k < KT; ++k)
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_addr(b_row0 + k * 16, n0 + n * 8));
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma_16816<T>(acc[m][n], a[m][k], b[0], b[1]);
        mma_16816<T>(acc[m][n + 1], a[m][k], b[2], b[3]);
      }
    }
}

// Writes an accumulator tile, rounded to T, into a shared tile at rows r0 + m * r_stride
// (+ g, g + 8) and columns c0 + 8 n (+ 2t).  Addresses come from Tile::offset per store.
// The backward's loop uses this form at D >= 128 (BwdTraits::kHoistStores): the compiler
// keeps the addresses out of registers.
template <class Tile, class T, int MT, int NT>
__device__ __forceinline__ void store_acc_in_loop(T* s, const float (&acc)[MT][NT][4], int r0, int r_stride, int c0,
                                                  int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int r = r0 + m * r_stride + g, c = c0 + n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(s + Tile::offset(r, c)) = pack2<T>(acc[m][n][0], acc[m][n][1]);
      *reinterpret_cast<uint32_t*>(s + Tile::offset(r + 8, c)) = pack2<T>(acc[m][n][2], acc[m][n][3]);
    }
}

// The same, for epilogues (once per tile).  r0, r_stride and c0 must be multiples of 8 (every
// caller's are multiples of 16), so all of a thread's rows share row r0 + g's swizzle: it is
// computed once, unsigned, and each store is a chunk XOR plus a constant row offset.  Against
// the form above this halves the forward's epilogue (1053 -> 593 sm_90 instructions at
// D = 128); inside the backward's loop at D >= 128 the hoisted column offsets spill instead.
template <class Tile, class T, int MT, int NT>
__device__ __forceinline__ void store_acc(T* s, const float (&acc)[MT][NT][4], int r0, int r_stride, int c0, int lane) {
  const unsigned g = unsigned(lane) / 4, t = unsigned(lane) % 4, row = unsigned(r0) + g;
  const unsigned swz = Tile::swizzle_unsigned(row);
  const unsigned base = row * Tile::kColsC + 2 * t, chunk0 = unsigned(c0) / 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const unsigned col = base + ((chunk0 + n) ^ swz) * 8;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const unsigned at = col + m * r_stride * Tile::kColsC;
      *reinterpret_cast<uint32_t*>(s + at) = pack2<T>(acc[m][n][0], acc[m][n][1]);
      *reinterpret_cast<uint32_t*>(s + at + 8 * Tile::kColsC) = pack2<T>(acc[m][n][2], acc[m][n][3]);
    }
  }
}

// v[0] = v[0] op v[1] op ... op v[N - 1] by a tree of depth ceil(log2 N), not a chain of
// N - 1 dependent instructions: for the softmax's row maxima and sums, whose latency the
// next products wait on.  Overwrites v.
template <int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int n = 0; n + w < N; n += 2 * w) v[n] = op(v[n], v[n + w]);
  return v[0];
}

// The online softmax's passes over row r (0: g, 1: g + 8) of a 16-row accumulator block:
// this lane's maximum of it, P = exp2(s * scale - ref) in place with this lane's sum, and
// the rescaling of O's row.  The same names over the HIP tile layer's fragments (mfma.h).
// row_max<true> reduces by a tree (the sm_90a forward's rows of up to 256 keys, whose
// maximum the next products wait on); exp2_row sums in one chain of adds beside the exp2s,
// one chain per column parity (RowSum::kParity), or by a tree after them (RowSum::kTree).
enum class RowSum { kChain, kParity, kTree };
template <bool kTree = false, int NT>
__device__ __forceinline__ float row_max(const float (&acc)[NT][4], int r) {
  if constexpr (kTree) {
    float m[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) m[n] = fmaxf(acc[n][2 * r], acc[n][2 * r + 1]);
    return tree_reduce(m, [](float x, float y) { return fmaxf(x, y); });
  } else {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(acc[n][2 * r], acc[n][2 * r + 1]));
    return mx;
  }
}
template <RowSum kSum = RowSum::kChain, int NT>
__device__ __forceinline__ float exp2_row(float (&acc)[NT][4], int r, float scale, float ref) {
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 2 * r; e < 2 * r + 2; ++e) {
      acc[n][e] = fast_exp2(fmaf(acc[n][e], scale, -ref));
      if constexpr (kSum != RowSum::kTree) sum[kSum == RowSum::kParity ? e % 2 : 0] += acc[n][e];
    }
  if constexpr (kSum == RowSum::kTree) {
    float s[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n] = acc[n][2 * r] + acc[n][2 * r + 1];
    sum[0] = tree_reduce(s, [](float x, float y) { return x + y; });
  }
  return kSum == RowSum::kChain ? sum[0] : sum[0] + sum[1];
}
// exp2_row element by element, where the caller gives each element's reference (the
// backward's tiles: a query's LSE per row, or per column in the sm_90a backward's S^T):
// element (n, e) of this lane, P = exp2(s * scale - ref) in place; returns that P.  HIP's
// tile layer has the same overload (hip_fmha/tile/mfma.h).
template <int NT>
__device__ __forceinline__ float exp2_row(float (&acc)[NT][4], int n, int e, float scale, float ref) {
  return acc[n][e] = fast_exp2(fmaf(acc[n][e], scale, -ref));
}
template <int NT>
__device__ __forceinline__ void mul_row(float (&acc)[NT][4], int r, float f) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][2 * r] *= f, acc[n][2 * r + 1] *= f;
}

// Row reductions over the four lanes that share a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Column reductions over the eight lanes that share t = l % 4: an accumulator column's
// rows g (and g + 8, which the caller folds in first).
__device__ __forceinline__ float col_max(float x) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float col_sum(float x) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace cuda
}  // namespace fmha
