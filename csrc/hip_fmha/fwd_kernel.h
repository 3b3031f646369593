// Attention forward on CDNA matrix cores (FlashAttention-2, Algorithm 1): a workgroup owns
// kBlockM query rows of one (sequence, head), four waves of N queries each, and streams
// the visible K/V blocks through LDS, keeping O and the softmax statistics in registers.
//
// Each wave computes S^T = K Q^T rather than S: an MFMA accumulator puts its column in
// the lane, so every lane then holds one query's scores (a share of the block's keys, the
// rest in lanes l ^ N, ...).  Row max and row sum are register loops plus one or two lane
// exchanges, the rescale of O^T is per lane, and S^T's registers are already the B operand
// of O^T = V^T P^T (tile/mfma.h).
//
// Per key block: store the prefetched K_j, V_j into LDS | issue the loads of K_{j-1},
// V_{j-1} | S^T = K Q^T, scores, mask | online softmax | dropout | O^T += V^T P^T.
// Blocks are visited from the last to the first, so the blocks that need masking under a
// causal mask come first and the rest skip the per-element test.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/dropout.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "dropout_tile.h"
#include "kv_blocks.h"
#include "fmha/fmha.h"
#include "scores.h"
#include "tile/buffer.h"
#include "tile/lds.h"
#include "tile/mfma.h"

namespace fmha {
namespace hip {

// N: the MFMA shape (32: v_mfma_f32_32x32x8, 16: v_mfma_f32_16x16x16) and the queries per
// wave; four waves.
template <class T_, int kHeadDim_, int N_, int kBlockN_, bool kDropout_>
struct FwdTraits {
  using T = T_;
  static constexpr int N = N_;
  static constexpr int kWaves = 4, kThreads = kWaves * kWaveSize;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kWaves * N, kBlockN = kBlockN_;
  static constexpr bool kDropout = kDropout_;
  static_assert(kHeadDim % N == 0 && kBlockN % N == 0, "tile shape");
  using TileKV = LdsTile<kBlockN, kHeadDim>;
  using Keep = KeepMask<kBlockM, kBlockN, /*kKeysContiguous=*/true>;
  static constexpr int kLdsBytes = 2 * TileKV::kBytes + (kDropout ? Keep::kBytes : 0);
  static_assert(kLdsBytes <= 65536, "gfx90a and gfx942 have 64 KB of LDS per workgroup");
};

template <class K>
__global__ void __launch_bounds__(K::kThreads) fwd_kernel(const fmha_fwd_params p) {
  using T = typename K::T;
  constexpr int N = K::N, D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  constexpr int kK = Mfma<N>::kK, kStepsPerBlock = N / kK;
  using TileKV = typename K::TileKV;

  const fmha_problem& pr = p.problem;
  const int m_block = ceil_div(pr.seqlen_q, kBlockM) - 1 - block_x();  // longest (causal) blocks first
  const int h = block_y(), b = block_z();
  const Sequence seq = Sequence::get(pr, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;
  const int m1 = min(m0 + kBlockM, seq.len_q);
  const int hk = h / (pr.num_heads_q / pr.num_heads_k);
  const int d = pr.head_dim;
  const int tid = thread_id(), lane = lane_id();
  const int q0 = wave_id() * N;  // this wave's queries: m0 + q0 + lane % N

  const MaskGeometry geom = sequence_mask(pr, seq);
  const ScoreMod score = ScoreMod::make(pr, geom, b, h);
  const int n_begin = geom.key_begin(m0) / kBlockN;
  const int n_end = ceil_div(geom.key_end(m1), kBlockN);

  __shared__ __attribute__((aligned(16))) char lds[K::kLdsBytes];
  const TileKV sK{reinterpret_cast<uint16_t*>(lds)};
  const TileKV sV{reinterpret_cast<uint16_t*>(lds + TileKV::kBytes)};
  const typename K::Keep keep{reinterpret_cast<uint8_t*>(lds + 2 * TileKV::kBytes)};

  // Q^T as B fragments (k = head dim) for the whole loop, straight from global memory.
  const uint16_t* q = static_cast<const uint16_t*>(p.q.data);
  const GlobalTile gQ = GlobalTile::make(q + seq.q_offset(p.q, m0 + q0, h), p.q.row_stride, m1 - m0 - q0, d);
  Frag rQ[D / kK];
#pragma unroll
  for (int s = 0; s < D / kK; ++s) rQ[s] = frag_rows<N>(gQ, 0, kK * s, lane);

  // K_j and V_j travel global -> registers (issued a block ahead) -> LDS.
  KvBlocks<TileKV, K::kThreads, kBlockN> kv(p.k, p.v, seq, hk, d);

  Acc<N> acc_o[D / N];  // O^T: head-dim rows, this wave's queries in the lanes
  clear<N>(acc_o);
  SoftmaxRow softmax = SoftmaxRow::empty();  // of query m0 + q0 + lane % N
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);
  const uint32_t bh = (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h;

  if (n_begin < n_end) kv.load(n_end - 1, tid);
  for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
    const int n0 = n_block * kBlockN;
    barrier();  // every wave is done with the previous K, V and keep mask
    kv.store(sK, sV, tid);
    if (K::kDropout) keep.template draw<K::kThreads>(drop, bh, m0, n0, tid);
    barrier();
    if (n_block > n_begin) kv.load(n_block - 1, tid);  // in flight during the math below

    // S^T = K Q^T, then scores in log2 units (Algorithm 1, line 9).
    Acc<N> acc_s[kBlockN / N];
    clear<N>(acc_s);
    gemm<T, N, D / kK>(
        acc_s, [&](int m, int s) { return frag_rows<N>(sK, m * N, kK * s, lane); }, [&](int s) { return rQ[s]; });
    score.apply<false>(acc_s, acc_s, ScoreCoords<true, N>{n0, m0 + q0, lane}, score.needs_mask(m0, m1, n0, kBlockN));

    // Online softmax (lines 10-11): new row max, rescale O and the row sum, P = exp2(S - m).
    float ref;
    const float rescale = softmax.update(row_reduce_max<N>(row_max<N>(acc_s)) * score.post_scale, ref);
    softmax.add(rescale, exp2_row<N>(acc_s, score.post_scale, ref));
    mul_row<N>(acc_o, rescale);

    // Dropout zeroes P after the row sum; the 1 / (1 - p) scale is applied once at the end.
    if (K::kDropout) {
#pragma unroll
      for (int m = 0; m < kBlockN / N; ++m)
#pragma unroll
        for (int g = 0; g < Mfma<N>::kRegs / 4; ++g) {
          const uint32_t kept = keep.four(q0 + lane_index<N>(lane), m * N + acc_row<N>(4 * g, lane));
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_s[m][4 * g + e] = ((kept >> (8 * e)) & 0xFFu) ? acc_s[m][4 * g + e] : 0.f;
        }
    }

    // O^T += V^T P^T (line 12): V^T read column-wise from the row-major V tile, P^T from
    // the score registers.
    gemm<T, N, kBlockN / kK>(
        acc_o, [&](int m, int s) { return frag_cols<N>(sV, kK * s, m * N, lane); },
        [&](int s) { return acc_frag<T, N>(acc_s[s / kStepsPerBlock], s % kStepsPerBlock); });
  }

  // Epilogue (lines 14-15): O / l and the LSE; O^T goes out transposed, 8 bytes per store.
  const float l = row_reduce_sum<N>(softmax.sum);
  const float inv = softmax_inv_sum(l) * (K::kDropout ? drop.scale : 1.f);
#pragma unroll
  for (int m = 0; m < D / N; ++m) acc_o[m] *= inv;
  const int i = m0 + q0 + lane_index<N>(lane);
  if (p.lse != nullptr && lane < N && i < m1) p.lse[seq.lse_index(pr, i, h)] = softmax_lse(softmax.max, l);
  uint16_t* out = static_cast<uint16_t*>(p.out.data) + seq.q_offset(p.out, m0 + q0, h);
  store_acc_t<T, N>(GlobalTile::make(out, p.out.row_stride, m1 - m0 - q0, d), acc_o, 0, 0, lane);
}

}  // namespace hip
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace hip {

template <class Traits>
void run_fwd(const fmha_fwd_params& p, hipStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int m_blocks = ceil_div(pr.seqlen_q, Traits::kBlockM);
  if (m_blocks == 0 || pr.batch == 0) return;
  fwd_kernel<Traits><<<dim3(m_blocks, pr.num_heads_q, pr.batch), Traits::kThreads, 0, stream>>>(p);
  check_hip(hipGetLastError(), "fwd_kernel launch");
}

}  // namespace hip
}  // namespace fmha
