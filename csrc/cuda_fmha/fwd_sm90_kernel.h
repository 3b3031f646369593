// Attention forward on sm_90a, the design of FlashAttention-3 (Shah et al. 2024) on our own
// tile layer (tile/sm90.h).  A persistent CTA works through tiles of kBlockM query rows of
// one (sequence, head) (tile_order.h); its threads split into warpgroups by role:
//
//   producer (warpgroup 0, one thread): TMA copies of each tile's Q, and of its K_j and V_j
//     into rings of kStages buffers, each buffer guarded by a full and an empty mbarrier.
//   consumers (warpgroups 1..kConsumers, 64 query rows each): S = Q K_j^T on wgmma from
//     shared memory, scores and online softmax in registers, O += P V_j on wgmma with P
//     from registers (Algorithm 1's lines 9-12, FA2 and FA3's order of blocks).
//
// Inside a consumer the products of one block overlap the softmax of another (FA3's
// intra-warpgroup pipelining): block j's S = Q K_j^T and the previous block's O += P V are
// issued together, and the softmax of S_j runs while O += P V is still on the tensor
// cores.  With two consumers, named barriers make them take turns issuing (ping-pong), so
// one's softmax also overlaps the other's products.  setmaxnreg moves registers from the
// producer (which needs few) to the consumers.  The rings run on from tile to tile, so the
// next tile's first K block loads during the last one's final products and epilogue.
//
// fp8 (T = __nv_fp8_e4m3, FlashAttention-3's fp8 forward): the same kernel on m64nNk32
// e4m3 products.  wgmma reads 8-bit operands K-major only, so P V takes V transposed (head
// dim x keys) from the workspace, where fp8_v_transpose_kernel (fwd_fp8.cu) writes it with
// each 32-key group's columns in the order P's registers hold their keys (fp8_key_of), so P
// goes from its accumulators to A fragments without moving between lanes (acc_to_a8;
// fwd_fp8.h has V^T's layout).  The
// descales fold into the score scale and the output's 1 / l; O leaves as bfloat16.
#pragma once

#include <type_traits>

#include <math.h>

#include "../common/kv_cache.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"
#include "fwd_fp8.h"
#include "launch.h"
#include "scores.h"
#include "tile/mma.h"
#include "tile/sm90.h"
#include "tile_order.h"

namespace fmha {
namespace cuda {

// What the producer reads through: the copy engine's maps of q, k and v, and the block table
// when k and v are a paged cache (pages.block_table non-null; FwdSm90Pages, launch.h).
struct FwdSm90Maps {
  CUtensorMap q, k, v;
  FwdSm90Pages pages;
  int unit;  // tiles a CTA takes at a time (tile_order_unit)
};

// How O leaves a tile (FwdSm90Traits::kOStore).
enum class OStore {
  kRegisters,  // straight from registers, four bytes per store
  kQBuffer,    // staged through the tile's Q buffer, 16-byte rows out
  kOwnBuffer,  // staged through a buffer of its own, 16-byte rows out
};

// kBlockM / 64 consumer warpgroups: two (240 registers each), or three (192 rows, 160
// registers each: D = 64's tiles over long key ranges, FwdSm90Tile::kMLong in configs.h).
// kPingPong: the consumers take turns issuing their products, in a ring (0, 1, ..., 0), so
// that one's softmax overlaps the others' tensor-core work (FA3's inter-warpgroup schedule).
// kOStore_: an OStore to force (tools/tune/tune_sm90.cu), or -1 for the rule below.
template <class T_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kScoreMod_,
          bool kPingPong_ = (kBlockM_ > 64), int kOStore_ = -1>
struct FwdSm90Traits {
  using T = T_;
  static constexpr bool kFp8 = std::is_same<T, __nv_fp8_e4m3>::value;
  using TO = std::conditional_t<kFp8, __nv_bfloat16, T>;  // out's element
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr bool kScoreMod = kScoreMod_;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kNT = kBlockN / 8;  // 8-column blocks of S per warp
  static constexpr int kDT = kHeadDim / 8;  // 8-column blocks of O per warp
  static_assert(kBlockM % 64 == 0 && kConsumers >= 1 && kConsumers <= 3, "one to three 64-row consumers");
  static_assert(kBlockN % (kFp8 ? 32 : 16) == 0 && kBlockN <= 256 && kHeadDim % 32 == 0, "tile shape");
  static_assert(!kFp8 || (kHeadDim % 64 == 0 && kBlockN % 64 == 0), "fp8: head dims 64, 128, 256; 64-key multiples");
  using TileQ = std::conditional_t<kFp8, Sm90Tile8<kBlockM, kHeadDim>, Sm90Tile<kBlockM, kHeadDim>>;
  using TileKV = std::conditional_t<kFp8, Sm90Tile8<kBlockN, kHeadDim>, Sm90Tile<kBlockN, kHeadDim>>;
  // V's ring: blocks of V as K's, or for fp8 of V^T (head dim x keys: one 128-key slab, or
  // 64-key slabs for other multiples of 64).
  using TileV = std::conditional_t<kFp8, Sm90Tile8<kHeadDim, kBlockN>, TileKV>;
  static constexpr int kKSteps = kBlockN * (int)sizeof(T) / 32;  // k-steps of P V: 16 keys, or 32 (fp8)
  // Registers per thread after setmaxnreg: the producer keeps few, the consumers share the
  // rest of the 64K (24 x 128 + 240 x 256 = 64512; 32 x 128 + 160 x 384 = 65536).
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || kConsumers >= 2, "turns take two consumers or more");
  // Tiles per unit of the tile order without a mask (tile_order.h): single tiles at 16-bit
  // D = 96 and 256, 1.03-1.07x and 1.00-1.10x non-causal against pairs; pairs elsewhere,
  // where single tiles ran 0.98-1.04x (D = 64, 128, 192 and fp8; one H100, docs/tuning.md).
  static constexpr int kUnmaskedUnit = !kFp8 && (kHeadDim == 96 || kHeadDim == 256) ? 1 : 2;
  // The sorted tail under a causal mask (tile_order.h) at D = 64's 192-row tiles: 1.02-1.09x
  // causal at S = 4k-16k (with softcap 1.03-1.08x), unmasked calls level; at the 128-row
  // tiles it ran 0.73-1.01x causal (D = 256 at S = 512-2k 0.73-0.83x; one H100,
  // docs/tuning.md).
  static constexpr bool kSortedTail = !kFp8 && kBlockM == 192;
  // Shared memory: Q | K ring | V ring | [O] | mbarriers; every tile starts on a 1024-byte
  // line, the period of the 128-byte swizzle.
  static constexpr int kOffK = TileQ::kBytes;
  static constexpr int kOffV = kOffK + kStages * TileKV::kBytes;
  static constexpr int kOffO = kOffV + kStages * TileV::kBytes;
  // How O leaves (tools/tune/tune_sm90.cu on an H200): at D <= 64 straight from registers
  // (4-7% faster than staging there); above, staged so that 16-byte rows go out (the direct
  // stores cost 1-5% at D = 128 and up to 11% and 14% at D = 192 and 256), through a
  // buffer of its own where it fits 227 KB, else through the consumer's rows of the Q
  // buffer.  Unless O uses the Q buffer, Q is free after the tile's last S = Q K^T, and the
  // next tile's Q loads during the last P V and the epilogue.  (The fit counts one pair of
  // Q barriers, kQParts below, as a buffer of its own implies.)
  // fp8 stages O (bf16, TileO) in a buffer of its own too: its Q buffer holds 8-bit rows.
  using TileO = Sm90Tile<kBlockM, kHeadDim>;
  static constexpr OStore kOStore =
      kOStore_ >= 0 ? OStore(kOStore_)
      : kHeadDim <= 64 ? OStore::kRegisters
      : kOffO + TileO::kBytes + (2 + 4 * kStages) * 8 + 1024 <= 232448 ? OStore::kOwnBuffer
      : kFp8 ? OStore::kRegisters
             : OStore::kQBuffer;
  static constexpr bool kReleaseQEarly = kOStore != OStore::kQBuffer;
  // Q in parts of its own barriers: where O is staged in the Q buffer, one part per consumer
  // (its 64 rows), so that a consumer's next Q loads once its own epilogue is done instead of
  // every consumer's: 1.01-1.04x at D = 256 and up to 1.03x at D = 192 below 4k keys (H100,
  // O bitwise equal).  Where Q is released after the last S = Q K^T anyway, one part: split
  // there, D = 128 ran 0.95-0.99x (docs/tuning.md).
  static constexpr int kQParts = kReleaseQEarly ? 1 : kConsumers;
  static constexpr int kBars = 2 * kQParts + 4 * kStages;
  // How the softmax sums a row: by a tree after its exp2s, or in two chains of adds beside
  // them.  At D = 64 two chains were 0.5-3.8% faster than one (the kernel before) and the
  // tree 0-3% slower than two; above, the tree gave D = 96 up to 4.4%, D = 128 -0.6 to +3.5%
  // over two calls, D = 192 and 256 within 2% (tools/tune/tune_sm90.cu, docs/tuning.md).
  static constexpr bool kTreeSum = kHeadDim > 64;
  // Where O takes block i's rescale factor: late, after block i - 1's P V has landed, outside
  // the consumer's turn (FlashAttention-4's order at D <= 128), or early, inside the turn
  // between issuing S_{i+1} = Q K^T and P_i V_i.  Late is 2.5-4.7% faster with three
  // consumers (D = 64's 192-row tiles, whose ring of turns is longer); with two it moved
  // points by -3 to +5% with no head dim ahead throughout (tools/tune/tune_sm90.cu,
  // docs/tuning.md), so two keep it early.
  static constexpr bool kRescaleLate = kConsumers == 3;
  // O's rescale skipped in a block where no row of the warp moved its maximum, the maxima
  // moving only when a block's exceeds them by more than kRescaleSlack (log2 units; P stays
  // below 2^8; FlashAttention-4's conditional rescaling).  Where the rescale sits inside the
  // consumer's turn (two consumers), at 16 bits: D = 128 1.01-1.06x, D = 96-256 0.98-1.08x,
  // D = 64's 128-row tiles 1.01-1.06x (one H100).  Not with three consumers, whose late
  // rescale is outside the turns (0.98-1.02x), nor at fp8: a row's largest P, an exact 1
  // where the maximum moves, would be rounded to e4m3 (by up to 2^-4) while l sums it
  // unrounded, and test_fp8's error bound failed (docs/tuning.md).
  static constexpr bool kLazyRescale = !kFp8 && !kRescaleLate;
  static constexpr float kRescaleSlack = 8.f;
  // Roles from a warp-uniform warpgroup index (warpgroup_index, tile/sm90.h), as the backward
  // takes them: the wgmma descriptors then stay in uniform registers instead of being copied
  // there (R2UR) before every wgmma.  bf16/fp16 at D = 64 only: R2URs 51 -> 38, no new spills,
  // 1.00-1.01x with O bitwise unchanged (H200); at D = 96 (83 -> 72) 0.97-0.99x up to 2k keys;
  // above, ptxas spills, and fp8 at D = 64 gains R2URs (docs/tuning.md).
  static constexpr bool kUniformRoles = kHeadDim <= 64 && !kFp8;
  // Q's descriptors rebuilt for every S = Q K^T (one add per k-step) rather than hoisted out
  // of the key loop, where fp8 at D = 256 held them in 16 registers and spilled 24 B: without
  // the spills 1.01-1.06x under a causal mask, level without (one H100).  Elsewhere level
  // (16-bit) or 1-6% slower (fp8 at D = 64 and 128), so they stay hoisted.
  static constexpr bool kQDescPerBlock = kFp8 && kHeadDim == 256;
  // fp8's scale (softmax scale x q_descale x k_descale, read per tile) folded into the exp2s
  // in a copy of the key loop for tiles where it is positive, the other copy scaling the
  // scores first: no branch on it inside the loop, which ptxas otherwise keeps, cutting the
  // softmax off from the wait for P V.  D = 256: 1.01-1.04x from S = 1k, level at 512 (one
  // H100); folding unconditionally moved the wait at D = 128 too, which ran 0.96-1.00x.
  static constexpr bool kFoldPerTile = kFp8 && kHeadDim == 256 && !kScoreMod;
  // The key loop in runs by mask: the blocks every row of the tile sees whole run in a loop
  // of their own, with no branch on the mask (nor, in the plain 16-bit instances, on folding
  // the scale), so that ptxas schedules the row maxima and the first exp2s ahead of the wait
  // for the previous P V, as in FlashAttention-4's unmasked loop.  Kernel alone, O bitwise
  // unchanged (H100): D = 96-192 1.03-1.09x from S = 2k (0.95-1.04x at 512-1k), fp8 D = 128
  // 1.02-1.05x, D = 256 (both) 0.98-1.04x, D = 64's 192-row tiles 1.04-1.06x; D = 64's 128-row tiles 0.93-0.98x
  // and fp8 D = 64 0.97-1.02x, which keep one loop with the tests inside (docs/tuning.md).
  static constexpr bool kMaskRuns = kHeadDim > 64 || (kConsumers == 3 && !kFp8);
  // A consumer skips the tile's leading key blocks that none of its rows sees: under a causal
  // mask, wherever a consumer's 64 rows end a key block or more before the tile's (192-row
  // tiles, and key blocks shorter than the tile; 128 x 128 tiles only under other masks, which
  // do not take the code).  Kernel alone, O bitwise unchanged (one H100): causal D = 64's
  // 192-row tiles 1.02-1.03x at 4-16k keys, D = 192 and 256 1.00-1.02x (docs/tuning.md).
  static constexpr bool kSkipBlocks = kBlockN < kBlockM;
  static constexpr int kOffBar = kOffO + (kOStore == OStore::kOwnBuffer ? TileO::kBytes : 0);
  static constexpr int kSmemBytes = kOffBar + kBars * 8 + 1024;  // + slack to align the base
  static_assert(TileQ::kBytes % 1024 == 0 && TileKV::kBytes % 1024 == 0 && TileV::kBytes % 1024 == 0,
                "tiles on 1024-byte lines");
  static_assert(!kFp8 || kOStore != OStore::kQBuffer, "fp8's Q buffer holds 8-bit rows");
};

// An fp8 input's dequantization factor for sequence b, KV head hk (fmha_descale).
__device__ __forceinline__ float descale_at(const fmha_descale& d, int b, int hk) {
  return d.data == nullptr ? 1.f : __ldg(d.data + (int64_t)b * d.batch_stride + (int64_t)hk * d.head_stride);
}

// Named barriers: 0 is __syncthreads; 1 to 3 are the consumers' turns (ping-pong), 4 to 6
// each consumer's own (the epilogue).
constexpr int kBarTurn = 1, kBarEpilogue = 4;

// What one tile covers: query rows [m0, m1) of sequence b, head h, and the key blocks
// n_end - 1, n_end - 2, ..., n_end - n_blocks it visits (the last first, as in
// fwd_kernel.h: the blocks a causal mask cuts come first).
struct FwdTileWork {
  Sequence seq;
  MaskGeometry geom;
  int m0, m1, h, hk, b, n_end, n_blocks;
  // group: query heads per KV head (divided once per CTA, not per tile).
  __device__ __forceinline__ FwdTileWork(const fmha_problem& pr, int m_block, int h_, int b_, int block_m,
                                         int block_n, int group)
      : seq(Sequence::get(pr, b_)), h(h_), b(b_) {
    m0 = m_block * block_m;
    m1 = min(m0 + block_m, seq.len_q);
    hk = h / group;
    geom = MaskGeometry::make(seq.len_q, seq.len_k, pr.window_left, pr.window_right,
                              pr.mask_align == FMHA_ALIGN_TOP_LEFT);
    n_end = 0, n_blocks = 0;
    if (m0 < seq.len_q) {
      const int n_begin = geom.key_begin(m0) / block_n;
      n_end = (geom.key_end(m1) + block_n - 1) / block_n;
      n_blocks = max(n_end - n_begin, 0);
    }
  }
  __device__ __forceinline__ bool has_rows() const { return m0 < seq.len_q; }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A paged cache comes in boxes of pg.box_rows keys (a divisor of both the page size and
// kBlockN, so a box never crosses a page), issued by the producer warpgroup's four warps:
// box c of a key block by lane c / 4 of warp c % 4.  From one warp, pages of 16 (eight
// boxes per 64-column slab of a 128-key block) ran 1.25x the contiguous call's time at 8k
// keys of context (H200 and H100): the issue of the boxes, a loop over the lanes, was the
// bound; from four, 1.06x (H100, docs/tuning.md).  box_page: the page of this thread's box
// for key block n0, or num_pages, outside the map, for boxes past the sequence's keys: the
// copy engine writes zeros for those and touches no memory.  The producer looks block
// i + 1's pages up while it waits for block i's slots, so that the read of the table is off
// the loads' path, and reuses K_i's pages for V_i.
constexpr int kPagedWarps = 4;

// The producer warp's index through a shuffle, which ptxas then knows is warp-uniform (from
// threadIdx.x alone the producer spilled at 24 registers), and this thread's box.
__device__ __forceinline__ int paged_warp() { return __shfl_sync(~0u, (int)threadIdx.x / 32, 0); }
__device__ __forceinline__ int paged_box() { return paged_warp() + kPagedWarps * ((int)threadIdx.x % 32); }

template <class K>
__device__ __forceinline__ int box_page(const FwdSm90Pages& pg, const FwdTileWork& w, int n0, int box = paged_box()) {
  const int key = n0 + pg.box_rows * box;
  if (pg.box_rows * box >= K::kBlockN || key >= w.seq.len_k) return pg.num_pages;
  return clamp_index(pg.block_table[(int64_t)w.b * pg.table_stride + key / pg.page_size], 0, pg.num_pages - 1);
}

// Key block [n0, n0 + kBlockN) of sequence w.b from a paged cache into `tile`: each thread its
// box (box_page), all arriving on `full`.  With `v` given (V blocks), the box that holds the
// sequence's end comes by cp.async from warp 0 instead, its rows past the end zero-filled:
// P's zeros there must not meet a NaN or inf in an unfilled cache slot (K's rows past the end
// only reach scores that the mask replaces).  Warp 0 arrives once that copy has landed; the
// other warps' boxes may complete before the arrival, which the barrier's count holds back.
template <class K>
__device__ __forceinline__ void load_pages(typename K::T* tile, const CUtensorMap* map, uint64_t* full,
                                           const FwdSm90Pages& pg, const FwdTileWork& w, int n0, int page,
                                           int head_dim, const fmha_tensor* v) {
  using T = typename K::T;
  using TileKV = typename K::TileKV;
  const int lane = threadIdx.x % 32, warp = paged_warp(), rows = pg.box_rows, len = w.seq.len_k;
  // Lane c of every warp tests box c: the same cut in each.
  const int key_c = n0 + rows * lane;
  const unsigned cut = __ballot_sync(~0u, v != nullptr && rows * lane < K::kBlockN && key_c < len && key_c + rows > len);
  const int cut_box = cut != 0 ? __ffs(cut) - 1 : -1;
  if (warp == 0 && cut != 0) {
    const int key0 = n0 + rows * cut_box, page0 = box_page<K>(pg, w, n0, cut_box);
    const T* base = static_cast<const T*>(v->data) + page0 * v->batch_stride +
                    (int64_t)(key0 % pg.page_size) * v->row_stride + (int64_t)w.hk * v->head_stride;
    constexpr int kCols = K::kHeadDim / 8;  // 16-byte chunks of a row (head_dim is a multiple of 8)
#pragma unroll 1
    for (int idx = lane; idx < rows * kCols; idx += 32) {
      const int r = idx / kCols, c = idx % kCols * 8;
      const bool in = key0 + r < len && c < head_dim;
      cp_async_16(tile + TileKV::offset(rows * cut_box + r, c), in ? base + r * v->row_stride + c : base, in ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();  // the plain copies, before the tensor cores read them
  }
  if (warp == 0) {
    __syncwarp();
    if (lane == 0) mbar_arrive_expect_tx(full, TileKV::kBytes - (cut != 0 ? rows * TileKV::kSpan * TileKV::kSlabs : 0));
    __syncwarp();
  }
  const int box = warp + kPagedWarps * lane;
  if (rows * box < K::kBlockN && box != cut_box) {
#pragma unroll
    for (int s = 0; s < TileKV::kSlabs; ++s)
      tma_load_4d(tile + s * (TileKV::kSlabBytes / 2) + rows * box * TileKV::kSlab, map, full, s * TileKV::kSlab,
                  (n0 + rows * box) % pg.page_size, w.hk, page);
  }
}
#endif

// The scores' rule for a tile: kFold < 0 the instance's own (the plain 16-bit instances fold
// the scale into the exp2s unconditionally, the dispatch sending a scale <= 0 to the
// score-mod instance; fp8 tests it at run time, its descales being on the device); 1 folded,
// 0 applied to the scores (K::kFoldPerTile picks one per tile).
template <class K, int kFold>
__device__ __forceinline__ ScoreMod fwd_score(const fmha_problem& pr, const MaskGeometry& geom, int b, int h,
                                              float qk_descale) {
  if constexpr (kFold < 0) {
    return ScoreMod::make<K::kScoreMod, K::kMaskRuns && !K::kScoreMod && !K::kFp8>(pr, geom, b, h, qk_descale);
  } else {
    ScoreMod s = ScoreMod::make<false, kFold == 1>(pr, geom, b, h, qk_descale);
    if constexpr (kFold == 0) {
      s.fold_scale = false;
      s.post_scale = 1.f;
    }
    return s;
  }
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ fmha_fwd_params p, const __grid_constant__ FwdSm90Maps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename K::T;
  using TileQ = typename K::TileQ;
  using TileKV = typename K::TileKV;
  using TileV = typename K::TileV;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  constexpr int kNT = K::kNT, kDT = K::kDT, kHeadDim = K::kHeadDim;
  const fmha_problem& pr = p.problem;
  const TileOrder order((pr.seqlen_q + kBlockM - 1) / kBlockM, pr.num_heads_q, pr.batch, maps.unit,
                        K::kSortedTail && tile_order_sorted_tail(pr));
  const int group = pr.num_heads_q / pr.num_heads_k;

  extern __shared__ char smem_raw[];
  char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = reinterpret_cast<T*>(smem + K::kOffK);
  T* sV = reinterpret_cast<T*>(smem + K::kOffV);
  uint64_t* full_q = reinterpret_cast<uint64_t*>(smem + K::kOffBar);  // one per part of Q (kQParts)
  uint64_t* empty_q = full_q + K::kQParts;
  uint64_t* full_k = empty_q + K::kQParts;
  uint64_t* empty_k = full_k + kStages;
  uint64_t* full_v = empty_k + kStages;
  uint64_t* empty_v = full_v + kStages;

  const int tid = threadIdx.x, wg = K::kUniformRoles ? warpgroup_index() : tid / 128;
  if (tid == 0) {
    // Q's parts: one arrival per consumer warpgroup after its last product that reads Q, or,
    // when O is staged in the Q buffer, one per thread of the part's consumer after its last
    // read of it.
#pragma unroll
    for (int c = 0; c < K::kQParts; ++c) {
      mbar_init(full_q + c, 1);
      mbar_init(empty_q + c, K::kReleaseQEarly ? K::kConsumers : 128);
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k + s, 1);
      mbar_init(full_v + s, 1);
      mbar_init(empty_k + s, K::kConsumers);  // one arrival per consumer warpgroup
      mbar_init(empty_v + s, K::kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();

  // ---------------------------------------------------------------- producer
  // One thread issues every copy (the first warp, from a paged cache: load_pages).  K and V
  // blocks run through their rings under a count `it` that continues from tile to tile, in
  // the consumers' order K_0, K_1, V_0, K_2, V_1, ...; the next tile's K_0 goes out before
  // its Q, whose buffer the consumers free only after their epilogue.
  if (wg == 0) {
    setmaxnreg_dec<K::kProducerRegs>();
    const bool paged = !K::kFp8 && maps.pages.block_table != nullptr;
    if (tid >= (paged ? 32 * kPagedWarps : 1)) return;
    const bool leader = tid == 0;
    if (leader) {
      prefetch_tensormap(&maps.q);
      prefetch_tensormap(&maps.k);
      prefetch_tensormap(&maps.v);
    }
    int it = 0, q_phase = 0;
    auto produce = [&](int m_block, int h, int b) {
      const FwdTileWork w(pr, m_block, h, b, kBlockM, kBlockN, group);
      if (!w.has_rows()) return;
      // Map coordinates: varlen maps span the packed rows of one "batch".
      const int batch = w.seq.varlen ? 0 : b;
      const int k_row = (int)w.seq.k_row0;
      auto load = [&](T* ring, const CUtensorMap* map, uint64_t* full, uint64_t* empty, int i, int page) {
        const int stage = (it + i) % kStages;
        mbar_wait(empty + stage, (((it + i) / kStages) & 1) ^ 1);  // the first pass finds the slots free
        const int n0 = (w.n_end - 1 - i) * kBlockN;
        if constexpr (K::kFp8) {
          if (ring == sV) {  // V^T: a box of one slab's keys by the head dim, per slab
            T* tile = ring + stage * TileV::kElems;
            mbar_arrive_expect_tx(full + stage, TileV::kBytes);
            const int col = (int)(w.seq.varlen ? fp8_vt_col0(w.seq.k_row0, b) : 0) + n0;
#pragma unroll
            for (int s = 0; s < TileV::kSlabs; ++s)
              tma_load_4d(tile + s * TileV::kSlabElems, map, full + stage, col + s * TileV::kSlab, 0, w.hk, batch);
            return;
          }
        } else if (paged) {
          return load_pages<K>(ring + stage * TileKV::kElems, map, full + stage, maps.pages, w, n0, page,
                               pr.head_dim, ring == sV ? &p.v : nullptr);
        }
        T* tile = ring + stage * TileKV::kElems;
        mbar_arrive_expect_tx(full + stage, TileKV::kBytes);
#pragma unroll
        for (int s = 0; s < TileKV::kSlabs; ++s)
          tma_load_4d(tile + s * TileKV::kSlabElems, map, full + stage, s * TileKV::kSlab, k_row + n0, w.hk, batch);
      };
      auto page_of = [&](int i) {
        return paged && i < w.n_blocks ? box_page<K>(maps.pages, w, (w.n_end - 1 - i) * kBlockN) : 0;
      };
      int page = page_of(0), page_next = page_of(1);
      if (w.n_blocks > 0) load(sK, &maps.k, full_k, empty_k, 0, page);
      constexpr int kPartRows = kBlockM / K::kQParts;
#pragma unroll 1
      for (int c = 0; c < K::kQParts; ++c) {  // part c of Q, once its consumers have let go of the last
        mbar_wait(empty_q + c, q_phase ^ 1);
        if (leader && w.n_blocks > 0) {
          mbar_arrive_expect_tx(full_q + c, TileQ::kBytes / K::kQParts);
#pragma unroll
          for (int s = 0; s < TileQ::kSlabs; ++s)
            tma_load_4d(sQ + s * TileQ::kSlabElems + c * kPartRows * TileQ::kSlab, &maps.q, full_q + c,
                        s * TileQ::kSlab, (int)w.seq.q_row0 + w.m0 + kPartRows * c, h, batch);
        } else if (leader) {
          mbar_arrive(full_q + c);  // rows that see no key: the consumers only write zeros through sQ
        }
      }
      for (int i = 1; i < w.n_blocks; ++i) {
        const int page_prev = page;
        page = page_next;
        page_next = page_of(i + 1);
        load(sK, &maps.k, full_k, empty_k, i, page);
        load(sV, &maps.v, full_v, empty_v, i - 1, page_prev);
      }
      if (w.n_blocks > 0) load(sV, &maps.v, full_v, empty_v, w.n_blocks - 1, page);
      it += w.n_blocks;
      q_phase ^= 1;
    };
    // With the sorted tail the producer walks the order in two loops (its registers hold
    // only that form, TileOrder::for_each_two_loops); the consumers in one.
    if constexpr (K::kSortedTail)
      order.for_each_two_loops(blockIdx.x, gridDim.x, produce);
    else
      order.for_each(blockIdx.x, gridDim.x, produce);
    return;
  }

  // ---------------------------------------------------------------- consumers
  setmaxnreg_inc<K::kConsumerRegs>();
  // The consumer index; with three consumers (160 registers each) it comes through a shuffle
  // from lane 0, which tells ptxas it is warp-uniform: without it the turns' barrier ids
  // spilled in the main loop (108 B).  With two it would move the register allocation and
  // spill (24 B at D = 128), so it does not.
  const int cw = K::kConsumers == 3 ? __shfl_sync(~0u, wg - 1, 0) : wg - 1;
  const int tid_wg = tid % 128, warp_wg = tid_wg / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_wg = cw * 64;  // this warpgroup's first row in the tile
  const KMajorDesc<TileQ> desc_q(sQ, row_wg);
  // Ping-pong turns, consumer 0 first: the last consumer passes it the CTA's first turn
  // here, and consumer 0 takes the last consumer's last pass after the last tile.  Each
  // consumer passes the turn to the next after every issue, the last of a tile included, so
  // that consumer 0 may start the next tile's first product while the others still store
  // this one.  Every consumer issues equally often (n_blocks + 1 times per tile), so the
  // ring never stalls.
  auto turn_wait = [&] {
    if (K::kPingPong) named_barrier_sync(kBarTurn + cw, 256);
  };
  // (For two consumers the next is written 1 - cw: the modulo compiled to other register
  // assignments at D = 128.)
  auto turn_pass = [&] {
    if (K::kPingPong) named_barrier_arrive(kBarTurn + (K::kConsumers == 2 ? 1 - cw : (cw + 1) % K::kConsumers), 256);
  };
  if (K::kPingPong && cw == K::kConsumers - 1) named_barrier_arrive(kBarTurn, 256);
  int it = 0, q_phase = 0;

  order.for_each<K::kSortedTail>(blockIdx.x, gridDim.x, [&](int m_block, int h, int b) {
    const FwdTileWork w(pr, m_block, h, b, kBlockM, kBlockN, group);
    if (!w.has_rows()) return;
    const int m0 = w.m0, m1 = w.m1, n_blocks = w.n_blocks;
    const int row0 = m0 + row_wg + warp_wg * 16;  // this warp's first query row
    const int wm0 = m0 + row_wg, wm1 = max(min(wm0 + 64, m1), wm0 + 1);

    float acc_o[kDT][4];
#pragma unroll
    for (int n = 0; n < kDT; ++n) acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;
    SoftmaxRow stats[2] = {SoftmaxRow::empty(), SoftmaxRow::empty()};  // rows g and g + 8
    const int q_part = K::kQParts == 1 ? 0 : cw;  // this consumer's part of Q
    mbar_wait(full_q + q_part, q_phase);

    if (n_blocks > 0) {
      const float qk_descale = K::kFp8 ? descale_at(p.q_descale, b, w.hk) * descale_at(p.k_descale, b, w.hk) : 1.f;
      // The key blocks, with the score rule kFold (fwd_score): the tile's scale decides which
      // copy runs where kFoldPerTile, so that neither has a branch on it inside the loop.
      auto key_blocks = [&](auto kFold) {
        const ScoreMod score = fwd_score<K, decltype(kFold)::value>(pr, w.geom, b, h, qk_descale);

        float acc_s[1][kNT][4];
        uint32_t a_p[1][K::kKSteps][4];  // P as wgmma A fragments
        float rescale[2] = {1.f, 1.f};
        bool o_rescale = true;  // kLazyRescale: a row of this warp moved its maximum

        auto issue_qk = [&](int i) {  // S = Q K_i^T
          const KMajorDesc<TileKV> desc_k(sK + ((it + i) % kStages) * TileKV::kElems, 0);
          uint32_t q_lo = (uint32_t)desc_q.base;
          if constexpr (K::kQDescPerBlock) asm volatile("" : "+r"(q_lo));
          fence_operand(acc_s[0]);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kHeadDim * (int)sizeof(T) / 32; ++kk)
            Wgmma<T, kBlockN>::template ss<0, 0>(
                acc_s[0], K::kQDescPerBlock ? desc_q.k_desc(q_lo, kk) : desc_q.k_desc(kk), desc_k.k_desc(kk), kk > 0);
          wgmma_commit();
          fence_operand(acc_s[0]);
        };
        auto issue_pv = [&](int i) {  // O += P V_i
          const T* tile_v = sV + ((it + i) % kStages) * TileV::kElems;
          fence_operand(acc_o);
          wgmma_fence();
          if constexpr (K::kFp8) {
            const KMajorDesc<TileV> desc_v(tile_v, 0);  // V^T
#pragma unroll
            for (int kk = 0; kk < K::kKSteps; ++kk)
              Wgmma<T, kHeadDim>::template rs<0>(acc_o, a_p[0][kk], desc_v.k_desc(kk), 1);
          } else {
            const MnMajorDesc<TileV> desc_v(tile_v);
#pragma unroll
            for (int kk = 0; kk < K::kKSteps; ++kk)
              Wgmma<T, kHeadDim>::template rs<1>(acc_o, a_p[0][kk], desc_v.k_desc(kk), 1);
          }
          wgmma_commit();
          fence_operand(acc_o);
        };
        auto release = [&](uint64_t* empty, int i) {
          if (tid_wg == 0) mbar_arrive(empty + (it + i) % kStages);
        };
        // The last product that reads Q is done: unless O goes through the Q buffer, the
        // producer may bring the next tile's.
        auto release_q = [&] {
          if (K::kReleaseQEarly && tid_wg == 0) mbar_arrive(empty_q + q_part);
        };
        auto wait_full = [&](uint64_t* full, int i) { mbar_wait(full + (it + i) % kStages, ((it + i) / kStages) & 1); };

        // Scores of block i, the new row maxima, rescale[] for O, and P = exp2(S - max) in
        // acc_s (Algorithm 1, lines 9-11).
        auto needs_mask = [&](int i) { return score.needs_mask(wm0, wm1, (w.n_end - 1 - i) * kBlockN, kBlockN); };
        auto softmax = [&](int i, bool mask) {
          score.apply(acc_s, row0, 16, (w.n_end - 1 - i) * kBlockN, lane, mask);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float ref;
            const float block_max = quad_max(row_max<true>(acc_s[0], r)) * score.post_scale;
            rescale[r] = K::kLazyRescale ? stats[r].update_lazy(block_max, K::kRescaleSlack, ref)
                                         : stats[r].update(block_max, ref);
            stats[r].add(rescale[r], exp2_row<K::kTreeSum ? RowSum::kTree : RowSum::kParity>(acc_s[0], r,
                                                                                             score.post_scale, ref));
          }
          if constexpr (K::kLazyRescale) o_rescale = __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f);
        };
        auto rescale_o = [&] {
          if (!K::kLazyRescale || o_rescale) {
            mul_row(acc_o, 0, rescale[0]);
            mul_row(acc_o, 1, rescale[1]);
          }
        };
        auto pack_p = [&] {
          if constexpr (K::kFp8)
            acc_to_a8(a_p, acc_s);
          else
            acc_to_a<T>(a_p, acc_s);
        };

        // The leading blocks that none of this consumer's rows sees (K::kSkipBlocks) take no
        // product: the consumer takes their turns and passes their buffers on once they have
        // landed (an early arrival would count toward the slot's previous phase), and its first
        // block is the first it sees.  The count comes through a shuffle from lane 0, which
        // tells ptxas it is warp-uniform: the loops' block indices start from it, and from a
        // per-thread value the K descriptors would move to vector registers (3x the R2URs).
        int first = 0;
        if constexpr (K::kSkipBlocks) {
          first = __shfl_sync(~0u, min(w.geom.blocks_unseen(wm1, w.n_end, kBlockN), n_blocks - 1), 0);
#pragma unroll 1
          for (int i = 0; i < first; ++i) {
            wait_full(full_k, i);
            turn_wait();
            turn_pass();
            release(empty_k, i);
            wait_full(full_v, i);
            release(empty_v, i);
          }
        }
        wait_full(full_k, first);
        turn_wait();
        issue_qk(first);
        turn_pass();
        wgmma_wait<0>();
        fence_operand(acc_s[0]);
        release(empty_k, first);
        if (first == n_blocks - 1) release_q();
        softmax(first, needs_mask(first));
        pack_p();

        // Block i of the loops below: `mask` a bool, or (kMaskRuns) a constant in each of three
        // loops, so that the blocks that need no mask run without a branch that would cut the
        // softmax off from the wait for P V in ptxas's schedule.
        auto step = [&](int i, auto mask) {
          wait_full(full_k, i);
          turn_wait();
          issue_qk(i);
          if constexpr (!K::kRescaleLate) rescale_o();  // by block i - 1's maxima, before its P V joins O
          wait_full(full_v, i - 1);
          issue_pv(i - 1);
          turn_pass();
          wgmma_wait<1>();  // S_i is in; P_{i-1} V_{i-1} may still run
          fence_operand(acc_s[0]);
          release(empty_k, i);
          if (i == n_blocks - 1) release_q();
          if constexpr (std::is_same_v<decltype(mask), bool>)
            softmax(i, mask);
          else
            softmax(i, decltype(mask)::value);
          wgmma_wait<0>();
          fence_operand(acc_o);
          release(empty_v, i - 1);
          pack_p();
          if constexpr (K::kRescaleLate) rescale_o();  // O, P_{i-1} V_{i-1} in, to block i's maxima
        };
        // Blocks that need the mask come first (the diagonal, the end of the keys) and last (a
        // window's left edge): a row's visible keys are one interval, so the blocks every row of
        // the tile sees whole are one run between them.  Decided for the CTA's rows, not this
        // warpgroup's: the bounds then derive from warp-uniform values only, and so do the
        // wgmma descriptors indexed by i (per-warpgroup bounds put them in vector registers).
        if constexpr (K::kMaskRuns) {
          auto tile_needs_mask = [&](int i) { return score.needs_mask(m0, m1, (w.n_end - 1 - i) * kBlockN, kBlockN); };
          int i_end = n_blocks;
          while (i_end > 1 && tile_needs_mask(i_end - 1)) --i_end;
          int i = first + 1;
          for (; i < i_end && tile_needs_mask(i); ++i) step(i, std::true_type{});
          for (; i < i_end; ++i) step(i, std::false_type{});
          for (; i < n_blocks; ++i) step(i, std::true_type{});
        } else {
          for (int i = first + 1; i < n_blocks; ++i) step(i, needs_mask(i));
        }

        if constexpr (!K::kRescaleLate) rescale_o();
        wait_full(full_v, n_blocks - 1);
        turn_wait();
        issue_pv(n_blocks - 1);
        turn_pass();
        wgmma_wait<0>();
        fence_operand(acc_o);
        release(empty_v, n_blocks - 1);
      };
      if constexpr (K::kFoldPerTile) {
        if (pr.scale * qk_descale > 0.f)
          key_blocks(std::integral_constant<int, 1>{});
        else
          key_blocks(std::integral_constant<int, 0>{});
      } else {
        key_blocks(std::integral_constant<int, -1>{});
      }
    } else if (K::kReleaseQEarly && tid_wg == 0) {
      mbar_arrive(empty_q + q_part);  // no key: Q is not read
    }

    // Epilogue (lines 14-15): O / l and LSE; O is stored in rows inside the sequence and
    // columns inside head_dim only.
    float* lse = p.lse;
    using TO = typename K::TO;
    TO* gO = static_cast<TO*>(p.out.data) + w.seq.q_offset(p.out, m0, h);
    const float v_descale = K::kFp8 ? descale_at(p.v_descale, b, w.hk) : 1.f;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(stats[r].sum);
      inv[r] = softmax_inv_sum(l) * v_descale;
      const int i = row0 + g + 8 * r;
      if (lse != nullptr && t == 0 && i < m1) lse[w.seq.lse_index(pr, i, h)] = softmax_lse(stats[r].max, l);
    }
    if constexpr (K::kOStore == OStore::kRegisters) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = row0 + g + 8 * r;
        if (i < m1) {
          TO* dst = gO + (i - m0) * p.out.row_stride + 2 * t;
#pragma unroll
          for (int n = 0; n < kDT; ++n)
            if (n * 8 + 2 * t < pr.head_dim)
              *reinterpret_cast<uint32_t*>(dst + n * 8) =
                  pack2<TO>(acc_o[n][2 * r] * inv[r], acc_o[n][2 * r + 1] * inv[r]);
        }
      }
    } else {
      // Through this warpgroup's rows of the staging buffer, 16-byte rows out.  The thread
      // index enters through an opaque copy: its addresses are the same in every tile, and
      // hoisted out of the tile loop they would stay live (and spill) through the main loop.
      using TileO = typename K::TileO;
      TO* sO = K::kOStore == OStore::kOwnBuffer ? reinterpret_cast<TO*>(smem + K::kOffO) : reinterpret_cast<TO*>(sQ);
      unsigned tid_e = unsigned(tid_wg);
      asm volatile("" : "+r"(tid_e));
      // Every warp of the group is done reading its rows (of Q, or of the last tile's O).
      named_barrier_sync(kBarEpilogue + cw, 128);
      {
        const unsigned r = unsigned(row_wg) + (tid_e / 32) * 16 + (tid_e % 32) / 4, c0 = 2 * (tid_e % 4);
#pragma unroll
        for (int n = 0; n < kDT; ++n) {
          *reinterpret_cast<uint32_t*>(sO + TileO::offset(r, c0 + n * 8)) =
              pack2<TO>(acc_o[n][0] * inv[0], acc_o[n][1] * inv[0]);
          *reinterpret_cast<uint32_t*>(sO + TileO::offset(r + 8, c0 + n * 8)) =
              pack2<TO>(acc_o[n][2] * inv[1], acc_o[n][3] * inv[1]);
        }
      }
      named_barrier_sync(kBarEpilogue + cw, 128);
      constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
      const int rows_valid = m1 - m0, cols_valid = pr.head_dim;
#pragma unroll
      for (int i = 0; i < 64 * kChunks / 128; ++i) {
        const unsigned idx = tid_e + i * 128;
        const int r = row_wg + int(idx / kChunks), c = int(idx % kChunks) * 8;
        copy_16_if(gO + r * p.out.row_stride + c, sO + TileO::offset(r, c), r < rows_valid && c < cols_valid);
      }
      if constexpr (K::kOStore == OStore::kQBuffer) {
        // The copy engine may write the next Q over what this thread read: order the reads first.
        fence_proxy_async_shared();
        mbar_arrive(empty_q + q_part);
      }
    }
    it += n_blocks;
    q_phase ^= 1;
  });
  if (K::kPingPong && cw == 0) turn_wait();  // the last consumer's last pass
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace cuda
}  // namespace fmha

#include <algorithm>
#include <numeric>

#include "tma.h"

namespace fmha {
namespace cuda {

// Returns false, launching nothing, when the copy engine cannot describe the tensors (the
// caller then runs the mma.sync kernel).
template <class K>
bool run_fwd_sm90(const fmha_fwd_params& p, cudaStream_t stream, const FwdSm90Pages* pages) {
  const fmha_problem& pr = p.problem;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? pr.total_q : pr.seqlen_q, rows_k = varlen ? pr.total_k : pr.seqlen_k;
  const int64_t batches = varlen ? 1 : pr.batch;
  FwdSm90Maps maps;
  auto encode = [&](CUtensorMap* map, const fmha_tensor& t, int64_t rows, int heads, int box_rows) {
    return encode_tensor_map(map, t.data, pr.dtype, pr.head_dim, rows, heads, batches, t.row_stride, t.head_stride,
                             t.batch_stride, K::TileQ::kSlab, box_rows);
  };
  // A paged cache is read in boxes of (page row, head, page) with as many rows as divide both
  // the page and the key block (box_page): one box per block for pages of 256 and 128-key
  // blocks, eight of 16 rows for pages of 16.
  maps.pages = pages != nullptr ? *pages : FwdSm90Pages{};
  maps.pages.box_rows = pages != nullptr ? std::gcd(pages->page_size, K::kBlockN) : 0;
  // fp8 has no other path: a call without keys, whose tiles read no K or V block, gets maps
  // over q instead (the copy engine refuses an empty tensor).
  const bool no_keys = K::kFp8 && rows_k == 0;
  auto encode_kv = [&](CUtensorMap* map, const fmha_tensor& t) {
    if (no_keys) return encode(map, p.q, rows_q, pr.num_heads_q, K::kBlockN);
    if (pages == nullptr) return encode(map, t, rows_k, pr.num_heads_k, K::kBlockN);
    return encode_tensor_map(map, t.data, pr.dtype, pr.head_dim, pages->page_size, pr.num_heads_k, pages->num_pages,
                             t.row_stride, t.head_stride, t.batch_stride, K::TileQ::kSlab, maps.pages.box_rows);
  };
  // fp8: V^T from the workspace (fp8_v_transpose), keys innermost, a box of one key block by
  // the head dim.
  auto encode_v = [&](CUtensorMap* map) {
    if constexpr (K::kFp8) {
      if (no_keys) return encode_kv(map, p.q);
      const int64_t cols = fp8_vt_cols(pr);
      return encode_tensor_map(map, p.workspace, pr.dtype, cols, pr.head_dim, pr.num_heads_k, batches, cols,
                               cols * pr.head_dim, cols * pr.head_dim * pr.num_heads_k, K::TileV::kSlab,
                               K::kHeadDim);
    }
    return encode_kv(map, p.v);
  };
  if (!encode(&maps.q, p.q, rows_q, pr.num_heads_q, K::kBlockM / K::kQParts) || !encode_kv(&maps.k, p.k) || !encode_v(&maps.v))
    return false;
  const int64_t blocks_q = (pr.seqlen_q + K::kBlockM - 1) / K::kBlockM, sms = device_sm_count();
  maps.unit = tile_order_unit(pr, K::kUnmaskedUnit, blocks_q * pr.num_heads_q * pr.batch, sms);
  // The sorted tail's single tiles can keep a CTA per SM where pairs would not fill them.
  const int64_t ctas = tile_order_ctas(blocks_q, pr.num_heads_q, pr.batch, varlen,
                                       K::kSortedTail && tile_order_sorted_tail(pr) ? 1 : maps.unit, sms);
  if (ctas == 0) return true;
  const dim3 grid((unsigned)ctas);
  auto kernel = fwd_sm90_kernel<K>;
  set_max_smem(reinterpret_cast<const void*>(kernel), K::kSmemBytes);
  kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(p, maps);
  check_cuda(cudaGetLastError(), "fwd_sm90_kernel launch");
  return true;
}

}  // namespace cuda
}  // namespace fmha
