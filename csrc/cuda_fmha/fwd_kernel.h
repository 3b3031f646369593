// Attention forward on sm80+ (FlashAttention-2, Algorithm 1): a CTA owns kBlockM query rows
// of one (sequence, head) and streams the visible K/V blocks through shared memory,
// keeping the output accumulator and the online-softmax statistics in registers.
//
// Pipeline per key block (one K and one V buffer, loads overlapped with math):
//   wait K_j | issue V_j | S = Q K_j^T, scores, mask | wait V_j | issue K_{j-1} |
//   online softmax | dropout | O += P V_j
// The first block's V is issued with Q and K, so that a CTA's start waits on memory once,
// not twice (at S = 512 a CTA visits only 8-11 blocks).
// Blocks are visited from the last to the first, so the blocks that need masking under a
// causal mask come first and the rest skip the per-element test.
#pragma once

#include <math.h>

#include <type_traits>

#include "../common/dropout.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"
#include "scores.h"
#include "tile_order.h"
#include "tile/mma.h"
#include "tile/smem.h"

namespace fmha {
namespace cuda {

// kScoreMod = false: an instance for problems without softcap and ALiBi, free of both passes
// and of the slope load (configs.h says for which head dims it pays).
template <class T_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kDropout_, bool kScoreMod_>
struct FwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kNWarps = kNWarps_;
  static constexpr bool kDropout = kDropout_, kScoreMod = kScoreMod_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMT = kBlockM / (16 * kNWarps);  // 16-row blocks per warp
  static constexpr int kNT = kBlockN / 8;               // 8-column blocks of S per warp
  static constexpr int kDT = kHeadDim / 8;              // 8-column blocks of O per warp
  static_assert(kBlockM % (16 * kNWarps) == 0 && kBlockN % 16 == 0 && kHeadDim % 32 == 0, "tile shape");
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * TileKV::kBytes;
};

template <class K>
__global__ void __launch_bounds__(K::kThreads) fwd_kernel(const __grid_constant__ fmha_fwd_params p, int order_units) {
  using T = typename K::T;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kMT = K::kMT, kNT = K::kNT, kDT = K::kDT;
  using TileQ = typename K::TileQ;
  using TileKV = typename K::TileKV;

  const fmha_problem& pr = p.problem;
  // The (query blocks, (head, batch)) grid in wave_block_order (tile_order.h): under a causal
  // mask groups of units, each unit's last query block (the longest) first.
  int slot, unit;
  wave_block_order(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x, gridDim.y * gridDim.z,
                   order_units, slot, unit);
  const int m_block = gridDim.x - 1 - slot;
  const int h = unit % gridDim.y, b = unit / gridDim.y;
  const Sequence seq = Sequence::get(pr, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;
  const int m1 = min(m0 + kBlockM, seq.len_q);
  const int hk = h / (pr.num_heads_q / pr.num_heads_k);
  const int d = pr.head_dim;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;

  const MaskGeometry geom = MaskGeometry::make(seq.len_q, seq.len_k, pr.window_left, pr.window_right,
                                               pr.mask_align == FMHA_ALIGN_TOP_LEFT);
  const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);
  const int n_begin = geom.key_begin(m0) / kBlockN;
  const int n_end = (geom.key_end(m1) + kBlockN - 1) / kBlockN;

  extern __shared__ __align__(128) char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + TileQ::kElems;
  T* sV = sK + TileKV::kElems;

  const T* q = static_cast<const T*>(p.q.data);
  const T* k = static_cast<const T*>(p.k.data);
  const T* v = static_cast<const T*>(p.v.data);
  const T* gQ = q + seq.q_offset(p.q, m0, h);
  const T* gK = k + seq.k_offset(p.k, 0, hk);
  const T* gV = v + seq.k_offset(p.v, 0, hk);
  const TileCopy<TileQ, K::kThreads> copy_q(tid);
  const TileCopy<TileKV, K::kThreads> copy_kv(tid);
  auto load_k = [&](int n_block) {
    const int n0 = n_block * kBlockN;
    copy_kv.load_async(sK, gK + n0 * p.k.row_stride, p.k.row_stride, seq.len_k - n0, d, k);
  };
  auto load_v = [&](int n_block) {
    const int n0 = n_block * kBlockN;
    copy_kv.load_async(sV, gV + n0 * p.v.row_stride, p.v.row_stride, seq.len_k - n0, d, v);
  };

  copy_q.load_async(sQ, gQ, p.q.row_stride, m1 - m0, d, q);
  if (n_begin < n_end) load_k(n_end - 1);
  cp_async_commit();
  if (n_begin < n_end) load_v(n_end - 1);
  cp_async_commit();

  // This warp's rows: m0 + row0 + m * kRowStride + {g, g + 8}.
  constexpr int kRowStride = 16 * K::kNWarps;
  const int row0 = warp * 16;
  float acc_o[kMT][kDT][4];
  clear(acc_o);
  SoftmaxRow softmax[kMT][2];  // rows g and g + 8 of each 16-row block
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) softmax[m][r] = SoftmaxRow::empty();

  const auto a_q = ldsm_a<TileQ>(sQ, lane);
  const auto b_k = ldsm_b<TileKV>(sK, lane);
  const auto bt_v = ldsm_bt<TileKV>(sV, lane);
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);
  const uint32_t bh = (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h;

  // One key block; only its first kNTb 8-key columns are computed (kNTb < kNT for a first
  // block that is mostly padding, below).
  auto step = [&](auto nt_tag, const int n_block) {
    constexpr int kNTb = decltype(nt_tag)::value;
    const int n0 = n_block * kBlockN;

    // S = Q K^T, then scores in log2 units (Algorithm 1, line 9).
    float acc_s[kMT][kNTb][4];
    clear(acc_s);
    gemm<K::kHeadDim, false, false, TileQ, TileKV, kMT, kNTb, T>(acc_s, a_q, row0, kRowStride, b_k, 0);
    score.apply(acc_s, m0 + row0, kRowStride, n0, lane, score.needs_mask(m0, m1, n0, kBlockN));

    cp_async_wait<0>();
    __syncthreads();  // V_j landed; every warp is done with K_j
    if (n_block > n_begin) {
      load_k(n_block - 1);
      cp_async_commit();
    }

    // Online softmax (lines 10-11): new row max, rescale O and the row sum, P = exp2(S - m).
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float ref;
        const float rescale = softmax[m][r].update(quad_max(row_max(acc_s[m], r)) * score.post_scale, ref);
        softmax[m][r].add(rescale, exp2_row(acc_s[m], r, score.post_scale, ref));
        mul_row(acc_o[m], r, rescale);
      }

    // Dropout zeroes P after the row sum; the 1 / (1 - p) scale is applied once at the end.
    if (K::kDropout) {
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int n = 0; n < kNTb; n += 2) {
          const int i = m0 + row0 + m * kRowStride + g, j = n0 + n * 8 + 2 * t;
          const U32x4 bits = drop.group_bits(bh, i, j);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ii = i + 8 * (e / 2), jj = j + (e % 2);
            if (DropoutParams::element_bits(bits, ii, jj) >= drop.threshold) acc_s[m][n][e] = 0.f;
            if (DropoutParams::element_bits(bits, ii, jj + 8) >= drop.threshold) acc_s[m][n + 1][e] = 0.f;
          }
        }
    }

    // O += P V (line 12).
    uint32_t a_p[kMT][kNTb / 2][4];
    acc_to_a<T>(a_p, acc_s);
    gemm_rs<TileKV, kMT, kNTb / 2, kDT, T>(acc_o, a_p, bt_v, 0, 0);
  };

  // The first block visited (the last in key order) holds the keys up to key_end, often a
  // fraction of a block: at D = 128's 48-key blocks, 512 keys leave 32 live in the eleventh
  // and 1024 leave 16, 3% of the work in padding.  Blocks whose width divides in three run it
  // on a third or two thirds of the width.
  int n_block = n_end - 1;
  if constexpr (kNT % 3 == 0) {
    const int first_live = geom.key_end(m1) - n_block * kBlockN;
    if (n_block >= n_begin && first_live <= 2 * kBlockN / 3) {
      cp_async_wait<1>();
      __syncthreads();  // Q and K_j landed; V_j is in flight
      if (first_live <= kBlockN / 3)
        step(std::integral_constant<int, kNT / 3>{}, n_block);
      else
        step(std::integral_constant<int, 2 * kNT / 3>{}, n_block);
      --n_block;
    }
  }
  for (; n_block >= n_begin; --n_block) {
    if (n_block == n_end - 1) {
      cp_async_wait<1>();
      __syncthreads();  // Q and K_j landed; V_j is in flight
    } else {
      cp_async_wait<0>();
      __syncthreads();  // K_j landed; every warp is done with V_{j+1}
      load_v(n_block);
      cp_async_commit();
    }
    step(std::integral_constant<int, kNT>{}, n_block);
  }

  // Epilogue (lines 14-15): O / l, LSE; O goes out through shared memory in 16-byte rows.
  cp_async_wait<0>();
  const float drop_scale = K::kDropout ? drop.scale : 1.f;
  float* lse = p.lse;
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(softmax[m][r].sum);
      const float inv = softmax_inv_sum(l) * drop_scale;
#pragma unroll
      for (int n = 0; n < kDT; ++n) acc_o[m][n][2 * r] *= inv, acc_o[m][n][2 * r + 1] *= inv;
      const int i = m0 + row0 + m * kRowStride + g + 8 * r;
      if (lse != nullptr && t == 0 && i < m1) lse[seq.lse_index(pr, i, h)] = softmax_lse(softmax[m][r].max, l);
    }
  __syncthreads();  // the loop's last reads of sQ are done in every warp
  store_acc<TileQ>(sQ, acc_o, row0, kRowStride, 0, lane);
  __syncthreads();
  T* gO = static_cast<T*>(p.out.data) + seq.q_offset(p.out, m0, h);
  copy_q.store(gO, p.out.row_stride, sQ, m1 - m0, d);
}

}  // namespace cuda
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace cuda {

template <class Traits>
void run_fwd(const fmha_fwd_params& p, cudaStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int m_blocks = (pr.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks == 0 || pr.batch == 0) return;
  const dim3 grid(m_blocks, pr.num_heads_q, pr.batch);
  auto kernel = fwd_kernel<Traits>;
  set_max_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  const int order_units = wave_order_units(
      pr, m_blocks, wave_slots(reinterpret_cast<const void*>(kernel), Traits::kThreads, Traits::kSmemBytes));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, order_units);
  check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

}  // namespace cuda
}  // namespace fmha
