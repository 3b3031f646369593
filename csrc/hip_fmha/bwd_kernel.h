// Attention backward on CDNA matrix cores (FlashAttention-2, Algorithm 2), from the
// forward's LSE:
//   P = exp(S - LSE), dV = dropout(P)^T dO, dP = dropout(dO V^T), dS = P (dP - D),
//   dK = scale * dS^T Q, dQ = scale * dS K,  with D = rowsum(dO * O) - dLSE.
//
// bwd_kernel: a workgroup owns kBlockN = 64 keys of one KV head, 16 per wave, and walks
// over every query block that sees them, for every query head sharing that KV head (GQA
// sums in registers, no atomics for dK/dV).  Each wave holds its keys' K and V as operand
// fragments for the whole kernel and computes S = Q K^T with v_mfma_f32_16x16x16, which
// puts a key in each lane: P and dS then feed dV^T = dO^T P and dK^T = Q^T dS straight
// from their registers (tile/mfma.h).  With atomic_dq it also adds dQ = dS K into an fp32
// workspace with atomics (dS through LDS, since that product sums over all the block's
// keys); without it, bwd_dq_kernel (bwd_dq_kernel.h) computes dQ query block by query
// block, so the result is bitwise deterministic.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/dropout.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "dropout_tile.h"
#include "fmha/fmha.h"
#include "scores.h"
#include "tile/buffer.h"
#include "tile/lds.h"
#include "tile/mfma.h"

namespace fmha {
namespace hip {

// kScoreMod (softcap or ALiBi may be on) is compile-time in the backward, not in the
// forward: softcap's gradient needs tanh(s / softcap) kept in registers across the dP
// product, and the plain instance, free of both passes and of the slope load, needs fewer
// registers where the backward is short of them.
template <class T_, int kHeadDim_, int kBlockM_, bool kDropout_, bool kScoreMod_>
struct BwdTraits {
  using T = T_;
  static constexpr int N = 16;  // v_mfma_f32_16x16x16: 16 keys per wave
  static constexpr int kWaves = 4, kThreads = kWaves * kWaveSize;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kWaves * N;
  static constexpr bool kDropout = kDropout_, kScoreMod = kScoreMod_;
  // dQ = dS K of the block (kBlockM x D, summed over all kBlockN keys) is split over the
  // waves as kWavesQ x kWavesD tiles whose widths are whole 16-column MFMA blocks.
  static constexpr int kWavesD = (kHeadDim / 4) % 16 == 0 ? 4 : 2, kWavesQ = kWaves / kWavesD;
  static constexpr int kDqRows = kBlockM / kWavesQ, kDqCols = kHeadDim / kWavesD;
  static_assert(kHeadDim % 32 == 0 && kBlockM % 16 == 0 && kDqRows % 16 == 0 && kDqCols % 16 == 0,
                "backward tile shape");
  using TileQ = LdsTile<kBlockM, kHeadDim>;  // Q and dO
  using TileDsT = LdsTile<kBlockN, kBlockM>;  // dS^T, for the atomic dQ product
  using Keep = KeepMask<kBlockM, kBlockN, /*kKeysContiguous=*/false>;
  static constexpr int kLdsBytes =
      2 * TileQ::kBytes + TileDsT::kBytes + 2 * kBlockM * 4 + (kDropout ? Keep::kBytes : 0);
  static_assert(kLdsBytes <= 65536, "gfx90a and gfx942 have 64 KB of LDS per workgroup");
};

// From P (scores already exp2'd) and dP to dropout(P) and dS, in place, for element e of
// block b: p <- P z (for dV), dp <- dS = P (dP z - D) softcap', where z = 0 or 1 / (1 - p)
// is the dropout factor.  delta(b, e) gives D of the element's row, kept(b, e) its keep byte.
template <bool kDropout, bool kScoreMod, int N, int B, class Delta, class Kept>
FMHA_DEVICE void make_ds(Acc<N> (&p)[B], Acc<N> (&dp)[B], const Acc<N> (&th)[B], const DropoutParams& drop,
                         const Delta& delta, const Kept& kept) {
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int e = 0; e < Mfma<N>::kRegs; ++e) {
      const float z = kDropout ? (kept(b, e) ? drop.scale : 0.f) : 1.f;
      const float pv = p[b][e];
      float ds = pv * (dp[b][e] * z - delta(b, e));
      if (kScoreMod) ds *= 1.f - th[b][e] * th[b][e];
      dp[b][e] = ds;
      p[b][e] = pv * z;
    }
}

template <class K>
__global__ void __launch_bounds__(K::kThreads) bwd_kernel(const fmha_bwd_params p, float* dq_accum,
                                                          const float* delta_ws, bool atomic_dq) {
  using T = typename K::T;
  constexpr int N = K::N, D = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  using TileQ = typename K::TileQ;
  using TileDsT = typename K::TileDsT;

  const fmha_problem& pr = p.problem;
  const int n_block = block_x(), hk = block_y(), b = block_z();
  const Sequence seq = Sequence::get(pr, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.k_rows) return;
  const int group = pr.num_heads_q / pr.num_heads_k;
  const int d = pr.head_dim;
  const int tid = thread_id(), lane = lane_id(), wave = wave_id();
  const int k0 = wave * N;  // this wave's keys: n0 + k0 + lane % 16

  __shared__ __attribute__((aligned(16))) char lds[K::kLdsBytes];
  const TileQ sQ{reinterpret_cast<uint16_t*>(lds)};
  const TileQ sdO{reinterpret_cast<uint16_t*>(lds + TileQ::kBytes)};
  const TileDsT sdSt{reinterpret_cast<uint16_t*>(lds + 2 * TileQ::kBytes)};
  float* sLse = reinterpret_cast<float*>(lds + 2 * TileQ::kBytes + TileDsT::kBytes);
  float* sDelta = sLse + kBlockM;
  const typename K::Keep keep{reinterpret_cast<uint8_t*>(sDelta + kBlockM)};

  // K and V of this wave's keys as B fragments (k = head dim) of S = Q K^T and dP = dO V^T,
  // and K of the whole block as B fragments (k = keys) of this wave's share of dQ = dS K;
  // all read once, straight from global memory, zero past the sequence's keys.
  const GlobalTile gK = GlobalTile::make(static_cast<const uint16_t*>(p.k.data) + seq.k_offset(p.k, n0, hk),
                                         p.k.row_stride, seq.len_k - n0, d);
  const GlobalTile gV = GlobalTile::make(static_cast<const uint16_t*>(p.v.data) + seq.k_offset(p.v, n0, hk),
                                         p.v.row_stride, seq.len_k - n0, d);
  Frag rK[D / 16], rV[D / 16];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) rK[s] = frag_rows<N>(gK, k0, 16 * s, lane), rV[s] = frag_rows<N>(gV, k0, 16 * s, lane);
  const int dq_row0 = (wave % K::kWavesQ) * K::kDqRows, dq_col0 = (wave / K::kWavesQ) * K::kDqCols;
  Frag rKt[K::kDqCols / N][kBlockN / 16];
  if (atomic_dq) {
#pragma unroll
    for (int n = 0; n < K::kDqCols / N; ++n)
#pragma unroll
      for (int s = 0; s < kBlockN / 16; ++s) rKt[n][s] = frag_cols<N>(gK, 16 * s, dq_col0 + n * N, lane);
  }

  const MaskGeometry geom = sequence_mask(pr, seq);
  int m_begin = 0, n_m = 0;
  if (n0 < seq.len_k) {
    m_begin = geom.query_begin(n0) / kBlockM;
    n_m = max(0, ceil_div(geom.query_end(min(n0 + kBlockN, seq.len_k)), kBlockM) - m_begin);
  }
  const int n_iters = group * n_m;

  // Q and dO of query block `it` (head hk * group + it / n_m, block m_begin + it % n_m)
  // travel global -> registers (issued an iteration ahead) -> LDS.
  TileCopy<TileQ, K::kThreads> copy_q, copy_do;
  float lse_next = 0.f, delta_next = 0.f;
  // Row 0 of query head hk * group of Q and dO, computed once: fewer live scalar registers.
  const uint16_t* q_head = static_cast<const uint16_t*>(p.q.data) + seq.q_offset(p.q, 0, hk * group);
  const uint16_t* do_head = static_cast<const uint16_t*>(p.dout.data) + seq.q_offset(p.dout, 0, hk * group);
  auto fetch = [&](int it) {
    const int hg = it / n_m, h = hk * group + hg, m0 = (m_begin + it % n_m) * kBlockM;
    const uint16_t* q = q_head + hg * p.q.head_stride + m0 * p.q.row_stride;
    const uint16_t* dout = do_head + hg * p.dout.head_stride + m0 * p.dout.row_stride;
    copy_q.load(GlobalTile::make(q, p.q.row_stride, seq.len_q - m0, d), tid);
    copy_do.load(GlobalTile::make(dout, p.dout.row_stride, seq.len_q - m0, d), tid);
    if (tid < kBlockM && m0 + tid < seq.len_q) {
      const int64_t idx = seq.lse_index(pr, m0 + tid, h);
      lse_next = p.lse[idx], delta_next = delta_ws[idx];
    } else {
      lse_next = INFINITY, delta_next = 0.f;  // rows past the end: P = 0
    }
  };

  Acc<N> acc_dk[D / N], acc_dv[D / N];  // dK^T, dV^T: head-dim rows, this wave's keys in the lanes
  clear<N>(acc_dk);
  clear<N>(acc_dv);
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);

  if (n_iters > 0) fetch(0);
  for (int it = 0; it < n_iters; ++it) {
    const int h = hk * group + it / n_m, m0 = (m_begin + it % n_m) * kBlockM;
    const uint32_t bh = (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h;
    barrier();  // every wave is done with the previous Q, dO, dS^T, LSE and keep mask
    copy_q.store(sQ, tid);
    copy_do.store(sdO, tid);
    if (tid < kBlockM) sLse[tid] = lse_log2(lse_next), sDelta[tid] = delta_next;
    if (K::kDropout) keep.template draw<K::kThreads>(drop, bh, m0, n0, tid);
    barrier();
    if (it + 1 < n_iters) fetch(it + 1);  // in flight during the math below
    const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);
    const ScoreCoords<false, N> at{m0, n0 + k0, lane};  // S: queries down the registers, keys in the lanes

    // S = Q K^T -> P = exp2(S - LSE).
    Acc<N> acc_s[kBlockM / N], th[kBlockM / N];
    clear<N>(acc_s);
    gemm<T, N, D / 16>(
        acc_s, [&](int m, int s) { return frag_rows<N>(sQ, m * N, 16 * s, lane); }, [&](int s) { return rK[s]; });
    score.apply<K::kScoreMod>(acc_s, th, at, score.needs_mask(m0, m0 + kBlockM, n0, kBlockN));
#pragma unroll
    for (int m = 0; m < kBlockM / N; ++m)
#pragma unroll
      for (int g = 0; g < Mfma<N>::kRegs / 4; ++g) {
        const int row = m * N + acc_row<N>(4 * g, lane);  // four consecutive query rows
#pragma unroll
        for (int e = 0; e < 4; ++e) exp2_row<N>(acc_s[m], 4 * g + e, score.post_scale, sLse[row + e]);
      }

    // dP = dO V^T, then dS and dropout(P).
    Acc<N> acc_dp[kBlockM / N];
    clear<N>(acc_dp);
    gemm<T, N, D / 16>(
        acc_dp, [&](int m, int s) { return frag_rows<N>(sdO, m * N, 16 * s, lane); }, [&](int s) { return rV[s]; });
    make_ds<K::kDropout, K::kScoreMod, N>(
        acc_s, acc_dp, th, drop, [&](int m, int e) { return sDelta[at.x(m, e) - m0]; },
        [&](int m, int e) {
          const int row = at.x(m, e & ~3) - m0;
          return (keep.four(row, k0 + lane_index<N>(lane)) >> (8 * (e & 3))) & 0xFFu;
        });

    // dV^T += dO^T dropout(P), dK^T += Q^T dS: dO^T and Q^T read column-wise from their
    // row-major tiles, P and dS straight from their registers (k = query rows).
    gemm<T, N, kBlockM / 16>(
        acc_dv, [&](int m, int s) { return frag_cols<N>(sdO, 16 * s, m * N, lane); },
        [&](int s) { return acc_frag<T, N>(acc_s[s], 0); });
    gemm<T, N, kBlockM / 16>(
        acc_dk, [&](int m, int s) { return frag_cols<N>(sQ, 16 * s, m * N, lane); },
        [&](int s) { return acc_frag<T, N>(acc_dp[s], 0); });

    // dQ += dS K into the fp32 workspace (scaled by dq_convert_kernel): dS^T goes through
    // LDS because this product sums over the keys of all four waves.
    if (atomic_dq) {
      store_acc_t<T, N>(sdSt, acc_dp, k0, 0, lane);
      barrier();
      Acc<N> acc_dq[K::kDqRows / N][K::kDqCols / N];
      clear<N>(acc_dq);
      gemm<T, N, kBlockN / 16>(
          acc_dq, [&](int m, int s) { return frag_cols<N>(sdSt, 16 * s, dq_row0 + m * N, lane); },
          [&](int n, int s) { return rKt[n][s]; });
#pragma unroll
      for (int m = 0; m < K::kDqRows / N; ++m)
#pragma unroll
        for (int e = 0; e < Mfma<N>::kRegs; ++e) {
          const int i = m0 + dq_row0 + m * N + acc_row<N>(e, lane);
          if (i >= seq.len_q) continue;
          const int64_t index = seq.lse_index(pr, i, h);
          float* row = dq_accum + index * D;
          const int swizzle = dq_accum_swizzle(index);
#pragma unroll
          for (int n = 0; n < K::kDqCols / N; ++n) {
            const int c = dq_col0 + n * N + lane_index<N>(lane);
            if (c < d) atomic_add(row + (c ^ swizzle), acc_dq[m][n][e]);
          }
        }
    }
  }

  // Epilogue: dK = scale * dK^T transposed, dV; lanes write their key rows, 8 bytes per store.
#pragma unroll
  for (int m = 0; m < D / N; ++m) acc_dk[m] *= pr.scale;
  const int rows = seq.k_rows - n0 - k0;
  store_acc_t<T, N>(GlobalTile::make(static_cast<uint16_t*>(p.dk.data) + seq.k_offset(p.dk, n0 + k0, hk),
                                     p.dk.row_stride, rows, d),
                    acc_dk, 0, 0, lane);
  store_acc_t<T, N>(GlobalTile::make(static_cast<uint16_t*>(p.dv.data) + seq.k_offset(p.dv, n0 + k0, hk),
                                     p.dv.row_stride, rows, d),
                    acc_dv, 0, 0, lane);
}

}  // namespace hip
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace hip {

template <class Traits>
void run_bwd(const fmha_bwd_params& p, float* dq_accum, const float* delta, bool atomic_dq, hipStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int n_blocks = ceil_div(pr.seqlen_k, Traits::kBlockN);
  if (n_blocks == 0 || pr.batch == 0) return;
  bwd_kernel<Traits><<<dim3(n_blocks, pr.num_heads_k, pr.batch), Traits::kThreads, 0, stream>>>(p, dq_accum, delta,
                                                                                                 atomic_dq);
  check_hip(hipGetLastError(), "bwd_kernel launch");
}

}  // namespace hip
}  // namespace fmha
