// Deterministic dQ (the backward with deterministic=True): a workgroup owns kBlockM query
// rows of one head, four waves of N, and walks their visible key blocks exactly like the
// forward (fwd_kernel.h), recomputing S and dP instead of summing dQ with atomics:
//   S^T = K Q^T, P^T = exp2(S^T - LSE), dP^T = V dO^T, dS^T = P^T (dP^T - D),
//   dQ^T += K^T dS^T   (dQ = scale * dQ^T transposed at the end).
// dS^T's registers are the B operand of the last product, as P^T's are in the forward.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/dropout.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "bwd_kernel.h"
#include "dropout_tile.h"
#include "kv_blocks.h"
#include "fmha/fmha.h"
#include "scores.h"
#include "tile/buffer.h"
#include "tile/lds.h"
#include "tile/mfma.h"

namespace fmha {
namespace hip {

// N: the MFMA shape and the queries per wave, as in FwdTraits.
template <class T_, int kHeadDim_, int N_, int kBlockN_, bool kDropout_, bool kScoreMod_>
struct BwdDqTraits {
  using T = T_;
  static constexpr int N = N_;
  static constexpr int kWaves = 4, kThreads = kWaves * kWaveSize;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kWaves * N, kBlockN = kBlockN_;
  static constexpr bool kDropout = kDropout_, kScoreMod = kScoreMod_;
  static_assert(kHeadDim % N == 0 && kBlockN % N == 0, "tile shape");
  using TileKV = LdsTile<kBlockN, kHeadDim>;
  using Keep = KeepMask<kBlockM, kBlockN, /*kKeysContiguous=*/true>;
  static constexpr int kLdsBytes = 2 * TileKV::kBytes + (kDropout ? Keep::kBytes : 0);
  static_assert(kLdsBytes <= 65536, "gfx90a and gfx942 have 64 KB of LDS per workgroup");
};

template <class K>
__global__ void __launch_bounds__(K::kThreads) bwd_dq_kernel(const fmha_bwd_params p, const float* delta_ws) {
  using T = typename K::T;
  constexpr int N = K::N, D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  constexpr int kK = Mfma<N>::kK, kStepsPerBlock = N / kK;
  using TileKV = typename K::TileKV;

  const fmha_problem& pr = p.problem;
  const int m_block = ceil_div(pr.seqlen_q, kBlockM) - 1 - block_x();
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
  const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);
  const int n_begin = geom.key_begin(m0) / kBlockN;
  const int n_end = ceil_div(geom.key_end(m1), kBlockN);

  __shared__ __attribute__((aligned(16))) char lds[K::kLdsBytes];
  const TileKV sK{reinterpret_cast<uint16_t*>(lds)};
  const TileKV sV{reinterpret_cast<uint16_t*>(lds + TileKV::kBytes)};
  const typename K::Keep keep{reinterpret_cast<uint8_t*>(lds + 2 * TileKV::kBytes)};

  // Q^T and dO^T as B fragments (k = head dim), and the row's LSE and D, for the whole loop.
  const int rows = m1 - m0 - q0;
  const GlobalTile gQ = GlobalTile::make(static_cast<const uint16_t*>(p.q.data) + seq.q_offset(p.q, m0 + q0, h),
                                         p.q.row_stride, rows, d);
  const GlobalTile gdO = GlobalTile::make(
      static_cast<const uint16_t*>(p.dout.data) + seq.q_offset(p.dout, m0 + q0, h), p.dout.row_stride, rows, d);
  Frag rQ[D / kK], rdO[D / kK];
#pragma unroll
  for (int s = 0; s < D / kK; ++s) rQ[s] = frag_rows<N>(gQ, 0, kK * s, lane), rdO[s] = frag_rows<N>(gdO, 0, kK * s, lane);
  const int i = m0 + q0 + lane_index<N>(lane);
  const int64_t row_idx = seq.lse_index(pr, min(i, m1 - 1), h);
  const float lse = i < m1 ? lse_log2(p.lse[row_idx]) : INFINITY;
  const float delta = i < m1 ? delta_ws[row_idx] : 0.f;

  KvBlocks<TileKV, K::kThreads, kBlockN> kv(p.k, p.v, seq, hk, d);

  Acc<N> acc_dq[D / N];  // dQ^T: head-dim rows, this wave's queries in the lanes
  clear<N>(acc_dq);
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);
  const uint32_t bh = (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h;

  if (n_begin < n_end) kv.load(n_end - 1, tid);
  for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
    const int n0 = n_block * kBlockN;
    barrier();  // every wave is done with the previous K, V and keep mask
    kv.store(sK, sV, tid);
    if (K::kDropout) keep.template draw<K::kThreads>(drop, bh, m0, n0, tid);
    barrier();
    if (n_block > n_begin) kv.load(n_block - 1, tid);

    // S^T = K Q^T -> P^T = exp2(S^T - LSE).
    Acc<N> acc_s[kBlockN / N], th[kBlockN / N];
    clear<N>(acc_s);
    gemm<T, N, D / kK>(
        acc_s, [&](int m, int s) { return frag_rows<N>(sK, m * N, kK * s, lane); }, [&](int s) { return rQ[s]; });
    score.apply<K::kScoreMod>(acc_s, th, ScoreCoords<true, N>{n0, m0 + q0, lane},
                             score.needs_mask(m0, m1, n0, kBlockN));
    exp2_row<N>(acc_s, score.post_scale, lse);  // P^T = exp2(S^T - LSE); its sum is not needed

    // dP^T = V dO^T, then dS^T.
    Acc<N> acc_dp[kBlockN / N];
    clear<N>(acc_dp);
    gemm<T, N, D / kK>(
        acc_dp, [&](int m, int s) { return frag_rows<N>(sV, m * N, kK * s, lane); }, [&](int s) { return rdO[s]; });
    make_ds<K::kDropout, K::kScoreMod, N>(
        acc_s, acc_dp, th, drop, [&](int, int) { return delta; },
        [&](int m, int e) {
          const int key = m * N + acc_row<N>(e & ~3, lane);
          return (keep.four(q0 + lane_index<N>(lane), key) >> (8 * (e & 3))) & 0xFFu;
        });

    // dQ^T += K^T dS^T: K^T read column-wise from the row-major K tile.
    gemm<T, N, kBlockN / kK>(
        acc_dq, [&](int m, int s) { return frag_cols<N>(sK, kK * s, m * N, lane); },
        [&](int s) { return acc_frag<T, N>(acc_dp[s / kStepsPerBlock], s % kStepsPerBlock); });
  }

#pragma unroll
  for (int m = 0; m < D / N; ++m) acc_dq[m] *= pr.scale;
  uint16_t* dq = static_cast<uint16_t*>(p.dq.data) + seq.q_offset(p.dq, m0 + q0, h);
  store_acc_t<T, N>(GlobalTile::make(dq, p.dq.row_stride, rows, d), acc_dq, 0, 0, lane);
}

}  // namespace hip
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace hip {

template <class Traits>
void run_bwd_dq(const fmha_bwd_params& p, const float* delta, hipStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int m_blocks = ceil_div(pr.seqlen_q, Traits::kBlockM);
  if (m_blocks == 0 || pr.batch == 0) return;
  bwd_dq_kernel<Traits><<<dim3(m_blocks, pr.num_heads_q, pr.batch), Traits::kThreads, 0, stream>>>(p, delta);
  check_hip(hipGetLastError(), "bwd_dq_kernel launch");
}

}  // namespace hip
}  // namespace fmha
