// Attention backward on sm80+ (FlashAttention-2, Algorithm 2), from the forward's LSE:
//   P = exp(S - LSE), dV = dropout(P)^T dO, dP = dropout(dO V^T), dS = P (dP - D),
//   dK = scale * dS^T Q, dQ = scale * dS K,  with D = rowsum(dO * O) - dLSE.
//
// bwd_kernel: a CTA owns kBlockN keys of one KV head and walks over every query block that
// sees them, for every query head sharing that KV head (GQA sums in registers, no atomics
// for dK/dV).  With atomic_dq it also adds dQ into an fp32 workspace: on sm90+ each query
// block's dQ goes through shared memory and one bulk reduction (the TMA unit adds it while
// the warps go on; fp32 atomics from registers held the warps up on their registers), on
// sm80-89 with atomics.  Without atomic_dq, bwd_dq_kernel computes dQ query-block by
// query-block, so the result is bitwise deterministic (at the price of recomputing S, dP).
#pragma once

#include <math.h>

#include "../common/dropout.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"
#include "launch.h"
#include "scores.h"
#include "tile_order.h"
#include "tile/mma.h"
#include "tile/smem.h"

namespace fmha {
namespace cuda {

// kScoreMod (softcap or ALiBi may be on) is compile-time in the backward, not in the
// forward: softcap's gradient needs tanh(s / softcap) kept in registers across the dP
// product, and the plain instance, free of both passes and of the slope load, needs fewer
// registers where the backward is short of them.
// kSmallSmem: the tile for GPUs with 99 KB of shared memory per block (sm86/89/120), whose
// kernel body is compiled only for architectures that can need it (bwd_kernel).
template <class T_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kDropout_, bool kScoreMod_,
          bool kSmallSmem_ = false>
struct BwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr bool kDropout = kDropout_, kScoreMod = kScoreMod_, kSmallSmem = kSmallSmem_;
  static constexpr int kNWarps = 8, kThreads = 256;
  // Warp grids: S and dP are (kBlockM x kBlockN) on 2 x 4 warps; dK and dV (kBlockN x D) on
  // kWM_KV x kWN_KV; dQ (kBlockM x D) on kWM_Q x kWN_Q; an even number of 8-column blocks
  // each.  Each picks the split with fewer shared-memory fragment reads per warp: dK/dV
  // 2 x 4 where D >= 2 kBlockN (D = 192, 256), else 4 x 2; dQ 4 x 2 up to D = 96
  // (measured 1% faster at D = 64 than 2 x 4), 2 x 4 above.
  static constexpr int kWM_S = 2, kWN_S = 4;
  static constexpr int kMT_S = kBlockM / (16 * kWM_S), kNT_S = kBlockN / (8 * kWN_S);
  static constexpr int kWM_KV = kHeadDim >= 2 * kBlockN ? 2 : 4, kWN_KV = kNWarps / kWM_KV;
  static constexpr int kMT_KV = kBlockN / (16 * kWM_KV), kNT_KV = kHeadDim / (8 * kWN_KV);
  static constexpr int kWM_Q = kHeadDim <= 96 ? 4 : 2, kWN_Q = kNWarps / kWM_Q;
  static constexpr int kMT_Q = kBlockM / (16 * kWM_Q), kNT_Q = kHeadDim / (8 * kWN_Q);
  static_assert(kMT_S >= 1 && kNT_S % 2 == 0 && kMT_KV >= 1 && kNT_KV % 2 == 0 && kMT_Q >= 1 && kNT_Q % 2 == 0,
                "backward tile shape");
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  using TileP = SmemTile<kBlockM, kBlockN>;
  static constexpr int kSmemBytes =
      2 * TileKV::kBytes + 2 * kStages * TileQ::kBytes + 2 * TileP::kBytes + 2 * kStages * kBlockM * 4;
  // sm90+: the query block's dQ in fp32, added to the accumulator by one bulk reduction.
  static constexpr int kDqSmemBytes = kBlockM * kHeadDim * 4;
  // P and dS go to shared memory by store_acc (one swizzle per thread, the column offsets
  // kept in registers) where that frees registers, else by store_acc_in_loop (offsets
  // recomputed per store).  sm_90 spills with store_acc: D = 32, 64, 96 fewer in every
  // instance (D = 64: 128 B -> 0, 812 -> 664 with dropout and score mods); D = 128 and 256
  // more (0 -> 16 and 0 -> 24 B); D = 192 none either way.
  static constexpr bool kHoistStores = kHeadDim <= 96;
};

// How bwd_kernel delivers dQ.
enum class DqMode : int {
  kNone = 0,     // not at all (bwd_dq_kernel computes it, deterministically)
  kAtomic = 1,   // fp32 atomics from registers
  kBulk = 2,     // sm90+: through shared memory, one bulk reduction per query block
};

// Deterministic dQ: kBlockM query rows (16 per warp) against all their keys.
template <class T_, int kHeadDim_, int kBlockM_, int kBlockN_, bool kDropout_, bool kScoreMod_>
struct BwdDqTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr bool kDropout = kDropout_, kScoreMod = kScoreMod_;
  static constexpr int kNWarps = kBlockM / 16, kThreads = kNWarps * 32;
  static constexpr int kNT = kBlockN / 8, kDT = kHeadDim / 8;
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = 2 * TileQ::kBytes + 4 * TileKV::kBytes;
};

// From P (scores already exp2'd) and dP to dropout(P) and dS, in place:
// p <- dropout(P) (for dV), dp <- dS = P (dropout(dP) - D) * softcap'.
template <bool kDropout, bool kScoreMod, int MT, int NT>
__device__ __forceinline__ void make_ds(float (&p)[MT][NT][4], float (&dp)[MT][NT][4], const float (&th)[MT][NT][4],
                                        const float (&delta)[MT][2], const DropoutParams& drop,
                                        uint32_t bh, int i0, int row_stride, int j0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      U32x4 bits{};
      if (kDropout) bits = drop.group_bits(bh, i0 + m * row_stride + g, j0 + n * 8 + 2 * t);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int nn = n + h;
          float z = 1.f;
          if (kDropout) {
            const int i = i0 + m * row_stride + g + 8 * (e / 2), j = j0 + nn * 8 + 2 * t + (e % 2);
            z = DropoutParams::element_bits(bits, i, j) < drop.threshold ? drop.scale : 0.f;
          }
          const float pv = p[m][nn][e];
          float ds = pv * (dp[m][nn][e] * z - delta[m][e / 2]);
          if (kScoreMod) ds *= 1.f - th[m][nn][e] * th[m][nn][e];
          dp[m][nn][e] = ds;
          p[m][nn][e] = pv * z;
        }
    }
}

template <class K>
__device__ __forceinline__ void bwd_block(const fmha_bwd_params& p, float* dq_accum, const float* delta_ws,
                                          DqMode dq_mode, int order_units) {
  using T = typename K::T;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages, D = K::kHeadDim;
  using TileQ = typename K::TileQ;
  using TileKV = typename K::TileKV;
  using TileP = typename K::TileP;

  const fmha_problem& pr = p.problem;
  // CTA (blockIdx.x, unit) of the (key blocks, (KV head, batch)) grid takes its key block and
  // unit in wave_block_order (tile_order.h), as the sm_90a backward does: under a causal mask,
  // groups of units with every unit's longest CTA (key block 0) first.
  int n_block, unit;
  wave_block_order(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x, gridDim.y * gridDim.z,
                   order_units, n_block, unit);
  const int hk = unit % gridDim.y, b = unit / gridDim.y;
  const Sequence seq = Sequence::get(pr, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.k_rows) return;
  const int group = pr.num_heads_q / pr.num_heads_k;
  const int d = pr.head_dim;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4;

  extern __shared__ __align__(128) char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + TileKV::kElems;
  T* sQ = sV + TileKV::kElems;                // [kStages]
  T* sdO = sQ + kStages * TileQ::kElems;      // [kStages]
  T* sP = sdO + kStages * TileQ::kElems;
  T* sdS = sP + TileP::kElems;
  float* sLse = reinterpret_cast<float*>(sdS + TileP::kElems);  // [kStages][kBlockM]
  float* sDelta = sLse + kStages * kBlockM;                     // [kStages][kBlockM]
  float* sdQ = sDelta + kStages * kBlockM;                      // [kBlockM][D], kBulk only
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool bulk_dq = dq_mode == DqMode::kBulk;
#else
  const bool bulk_dq = false;
#endif
  const T* q = static_cast<const T*>(p.q.data);
  const T* k = static_cast<const T*>(p.k.data);
  const T* v = static_cast<const T*>(p.v.data);
  const T* dout = static_cast<const T*>(p.dout.data);
  const TileCopy<TileQ, K::kThreads> copy_q(tid);
  const TileCopy<TileKV, K::kThreads> copy_kv(tid);
  copy_kv.load_async(sK, k + seq.k_offset(p.k, n0, hk), p.k.row_stride, seq.len_k - n0, d, k);
  copy_kv.load_async(sV, v + seq.k_offset(p.v, n0, hk), p.v.row_stride, seq.len_k - n0, d, v);

  const MaskGeometry geom = MaskGeometry::make(seq.len_q, seq.len_k, pr.window_left, pr.window_right,
                                               pr.mask_align == FMHA_ALIGN_TOP_LEFT);
  int m_begin = 0, n_m = 0;
  if (n0 < seq.len_k) {
    m_begin = geom.query_begin(n0) / kBlockM;
    n_m = max(0, (geom.query_end(min(n0 + kBlockN, seq.len_k)) + kBlockM - 1) / kBlockM - m_begin);
  }
  const int n_iters = group * n_m;

  // Iteration it covers head hk * group + it / n_m, query block m_begin + it % n_m; the
  // pair advances by one step instead of being divided out of `it` each time.
  struct Step {
    int h, m0;
  };
  auto next = [&](Step s) {
    s.m0 += kBlockM;
    if (s.m0 == (m_begin + n_m) * kBlockM) s.m0 = m_begin * kBlockM, ++s.h;
    return s;
  };
  // The bulk reduction of the query block before: one thread issues it once every warp's
  // part is in sdQ, and waits for its reads before sdQ is written again.
  auto flush_dq = [&](Step s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (tid == 0) {
      const int rows = min(kBlockM, seq.len_q - s.m0);
      bulk_reduce_add_f32(dq_accum + dq_accum_index(pr, seq, s.m0, s.h, D), sdQ, (uint32_t)(rows * D * 4));
      bulk_commit();
    }
#endif
  };

  // Loads the query block of iteration `it` (at step s) into its stage.
  auto issue = [&](int it, Step s) {
    const int h = s.h, m0 = s.m0;
    const int st = it % kStages;
    copy_q.load_async(sQ + st * TileQ::kElems, q + seq.q_offset(p.q, m0, h), p.q.row_stride, seq.len_q - m0, d, q);
    copy_q.load_async(sdO + st * TileQ::kElems, dout + seq.q_offset(p.dout, m0, h), p.dout.row_stride,
                      seq.len_q - m0, d, dout);
    if (tid < kBlockM) {
      const bool ok = m0 + tid < seq.len_q;
      const int64_t idx = ok ? seq.lse_index(pr, m0 + tid, h) : 0;
      cp_async_4(sLse + st * kBlockM + tid, p.lse + idx, ok ? 4 : 0);
      cp_async_4(sDelta + st * kBlockM + tid, delta_ws + idx, ok ? 4 : 0);
    }
  };
  Step cur{hk * group, m_begin * kBlockM}, prev = cur;
  if (n_iters > 0) issue(0, cur);
  cp_async_commit();

  // Warp placements.
  const int s_row0 = (warp % K::kWM_S) * 16, s_col0 = (warp / K::kWM_S) * 8 * K::kNT_S;
  constexpr int kSRowStride = 16 * K::kWM_S;
  const int kv_row0 = (warp % K::kWM_KV) * 16, kv_col0 = (warp / K::kWM_KV) * 8 * K::kNT_KV;
  constexpr int kKVRowStride = 16 * K::kWM_KV;
  const int q_row0 = (warp % K::kWM_Q) * 16, q_col0 = (warp / K::kWM_Q) * 8 * K::kNT_Q;
  constexpr int kQRowStride = 16 * K::kWM_Q;

  const auto b_k = ldsm_b<TileKV>(sK, lane);
  const auto b_v = ldsm_b<TileKV>(sV, lane);
  // Patterns that walk columns take the warp's first column as their origin (LdsmAddr).
  const auto bt_k = ldsm_bt<TileKV>(sK, lane, q_col0);
  const auto at_p = ldsm_at<TileP>(sP, lane, kv_row0);
  const auto at_ds = ldsm_at<TileP>(sdS, lane, kv_row0);
  const auto a_ds = ldsm_a<TileP>(sdS, lane);

  float acc_dk[K::kMT_KV][K::kNT_KV][4], acc_dv[K::kMT_KV][K::kNT_KV][4];
  clear(acc_dk);
  clear(acc_dv);
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);

  for (int it = 0; it < n_iters; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // this stage landed; every warp is done with the previous iteration
    const Step nxt = next(cur);
    if (kStages == 2 && it + 1 < n_iters) issue(it + 1, nxt);
    cp_async_commit();
    if (bulk_dq && it > 0) flush_dq(prev);
    const int st = it % kStages;
    const int h = cur.h, m0 = cur.m0;
    const T* sQs = sQ + st * TileQ::kElems;
    const T* sdOs = sdO + st * TileQ::kElems;
    const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);

    // S = Q K^T -> P = exp2(S - LSE).
    float acc_s[K::kMT_S][K::kNT_S][4], th[K::kMT_S][K::kNT_S][4];
    clear(acc_s);
    gemm<D, false, false, TileQ, TileKV, K::kMT_S, K::kNT_S, T>(acc_s, ldsm_a<TileQ>(sQs, lane), s_row0,
                                                               kSRowStride, b_k, s_col0);
    score.apply<K::kScoreMod>(acc_s, th, m0 + s_row0, kSRowStride, n0 + s_col0, lane,
                              score.needs_mask(m0, m0 + kBlockM, n0, kBlockN));
    float delta[K::kMT_S][2];
#pragma unroll
    for (int m = 0; m < K::kMT_S; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = s_row0 + m * kSRowStride + g + 8 * r;
        const float lse = lse_log2(sLse[st * kBlockM + row]);
        delta[m][r] = sDelta[st * kBlockM + row];
        exp2_row(acc_s[m], r, score.post_scale, lse);  // P = exp2(S - LSE); its sum is not needed
      }

    // dP = dO V^T, then dS; P and dS go to shared memory for the transposed products.
    float acc_dp[K::kMT_S][K::kNT_S][4];
    clear(acc_dp);
    gemm<D, false, false, TileQ, TileKV, K::kMT_S, K::kNT_S, T>(acc_dp, ldsm_a<TileQ>(sdOs, lane), s_row0,
                                                               kSRowStride, b_v, s_col0);
    make_ds<K::kDropout, K::kScoreMod>(acc_s, acc_dp, th, delta, drop,
                         (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h, m0 + s_row0, kSRowStride,
                         n0 + s_col0, lane);
    if constexpr (K::kHoistStores) {
      store_acc<TileP>(sP, acc_s, s_row0, kSRowStride, s_col0, lane);
      store_acc<TileP>(sdS, acc_dp, s_row0, kSRowStride, s_col0, lane);
    } else {
      store_acc_in_loop<TileP>(sP, acc_s, s_row0, kSRowStride, s_col0, lane);
      store_acc_in_loop<TileP>(sdS, acc_dp, s_row0, kSRowStride, s_col0, lane);
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // sdQ is free again after this barrier.  (The wait shares its scoreboard with cp.async,
    // so thread 0 also waits for the next stage's loads.  Measured slower: a second sdQ
    // buffer to wait an iteration later, which leaves too little L1 for the register
    // spills; issuing the next stage's loads after this barrier instead of at the top.)
    if (bulk_dq && tid == 0) bulk_wait_read();
#endif
    __syncthreads();

    // dV += dropout(P)^T dO, dK += dS^T Q (scaled at the end).
    gemm<kBlockM, true, true, TileP, TileQ, K::kMT_KV, K::kNT_KV, T>(acc_dv, at_p, 0, kKVRowStride,
                                                                    ldsm_bt<TileQ>(sdOs, lane, kv_col0), 0);
    gemm<kBlockM, true, true, TileP, TileQ, K::kMT_KV, K::kNT_KV, T>(acc_dk, at_ds, 0, kKVRowStride,
                                                                    ldsm_bt<TileQ>(sQs, lane, kv_col0), 0);
    // One stage: the next query block's loads start once every warp is done with Q and dO,
    // so that they land while dQ is computed and stored.
    if (kStages == 1 && it + 1 < n_iters) {
      __syncthreads();
      issue(it + 1, nxt);
      cp_async_commit();
    }

    // dQ += dS K into the fp32 workspace (scaled by the postprocess kernel).
    if (dq_mode != DqMode::kNone) {
      float acc_dq[K::kMT_Q][K::kNT_Q][4];
      clear(acc_dq);
      gemm<kBlockN, false, true, TileP, TileKV, K::kMT_Q, K::kNT_Q, T>(acc_dq, a_ds, q_row0, kQRowStride, bt_k,
                                                                      0);
      if (bulk_dq) {
        // [kBlockM][D] in the accumulator's layout, swizzle included: this thread's rows
        // differ by multiples of 4 (kQRowStride, 8), so they share one swizzle.
        const int swizzle = dq_accum_swizzle(seq.lse_index(pr, m0, h) + q_row0 + g);
#pragma unroll
        for (int m = 0; m < K::kMT_Q; ++m)
#pragma unroll
          for (int n = 0; n < K::kNT_Q; ++n) {
            float* dst = sdQ + (q_row0 + m * kQRowStride + g) * D + ((q_col0 + n * 8 + 2 * (lane % 4)) ^ swizzle);
            *reinterpret_cast<float2*>(dst) = make_float2(acc_dq[m][n][0], acc_dq[m][n][1]);
            *reinterpret_cast<float2*>(dst + 8 * D) = make_float2(acc_dq[m][n][2], acc_dq[m][n][3]);
          }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        fence_proxy_async_shared();  // visible to the bulk reduction after the next barrier
#endif
      } else {
#pragma unroll
        for (int m = 0; m < K::kMT_Q; ++m)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = m0 + q_row0 + m * kQRowStride + g + 8 * r;
            if (i >= seq.len_q) continue;
            const int64_t index = seq.lse_index(pr, i, h);
            float* row = dq_accum + index * D;
            const int swizzle = dq_accum_swizzle(index);
#pragma unroll
            for (int n = 0; n < K::kNT_Q; ++n) {
              const int c = q_col0 + n * 8 + 2 * (lane % 4);
              if (c < d) {
                atomicAdd(row + (c ^ swizzle), acc_dq[m][n][2 * r]);
                atomicAdd(row + (c ^ swizzle) + 1, acc_dq[m][n][2 * r + 1]);
              }
            }
          }
      }
    }
    prev = cur;
    cur = nxt;
  }

  // Epilogue: dK = scale * acc_dk, dV; out through shared memory (sK, sV are free now).
  cp_async_wait<0>();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bulk_dq && n_iters > 0) {
    __syncthreads();
    flush_dq(prev);
    // Shared memory must outlive the reads; the adds themselves complete with the grid.
    if (tid == 0) bulk_wait_read();
  }
#endif
#pragma unroll
  for (int m = 0; m < K::kMT_KV; ++m)
#pragma unroll
    for (int n = 0; n < K::kNT_KV; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[m][n][e] *= pr.scale;
  __syncthreads();
  store_acc<TileKV>(sK, acc_dk, kv_row0, kKVRowStride, kv_col0, lane);
  store_acc<TileKV>(sV, acc_dv, kv_row0, kKVRowStride, kv_col0, lane);
  __syncthreads();
  const int rows = min(kBlockN, seq.k_rows - n0);
  copy_kv.store(static_cast<T*>(p.dk.data) + seq.k_offset(p.dk, n0, hk), p.dk.row_stride, sK, rows, d);
  copy_kv.store(static_cast<T*>(p.dv.data) + seq.k_offset(p.dv, n0, hk), p.dv.row_stride, sV, rows, d);
}

template <class K>
__global__ void __launch_bounds__(K::kThreads) bwd_dq_kernel(const __grid_constant__ fmha_bwd_params p,
                                                             const float* delta_ws) {
  using T = typename K::T;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kNT = K::kNT, kDT = K::kDT;
  using TileQ = typename K::TileQ;
  using TileKV = typename K::TileKV;

  const fmha_problem& pr = p.problem;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const Sequence seq = Sequence::get(pr, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;
  const int m1 = min(m0 + kBlockM, seq.len_q);
  const int hk = h / (pr.num_heads_q / pr.num_heads_k);
  const int d = pr.head_dim;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4;

  const MaskGeometry geom = MaskGeometry::make(seq.len_q, seq.len_k, pr.window_left, pr.window_right,
                                               pr.mask_align == FMHA_ALIGN_TOP_LEFT);
  const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);
  const int n_begin = geom.key_begin(m0) / kBlockN;
  const int n_end = (geom.key_end(m1) + kBlockN - 1) / kBlockN;

  extern __shared__ __align__(128) char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + TileQ::kElems;
  T* sK = sdO + TileQ::kElems;  // [2] stages, then sV [2]
  T* sV = sK + 2 * TileKV::kElems;

  const T* q = static_cast<const T*>(p.q.data);
  const T* k = static_cast<const T*>(p.k.data);
  const T* v = static_cast<const T*>(p.v.data);
  const T* dout = static_cast<const T*>(p.dout.data);
  const TileCopy<TileQ, K::kThreads> copy_q(tid);
  const TileCopy<TileKV, K::kThreads> copy_kv(tid);
  copy_q.load_async(sQ, q + seq.q_offset(p.q, m0, h), p.q.row_stride, m1 - m0, d, q);
  copy_q.load_async(sdO, dout + seq.q_offset(p.dout, m0, h), p.dout.row_stride, m1 - m0, d, dout);
  auto issue = [&](int n_block) {
    const int n0 = n_block * kBlockN, st = n_block % 2;
    copy_kv.load_async(sK + st * TileKV::kElems, k + seq.k_offset(p.k, n0, hk), p.k.row_stride, seq.len_k - n0, d, k);
    copy_kv.load_async(sV + st * TileKV::kElems, v + seq.k_offset(p.v, n0, hk), p.v.row_stride, seq.len_k - n0, d, v);
  };
  if (n_begin < n_end) issue(n_end - 1);
  cp_async_commit();

  const int row0 = warp * 16;
  float lse[2], delta[1][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m0 + row0 + g + 8 * r;
    const int64_t idx = seq.lse_index(pr, min(i, m1 - 1), h);
    lse[r] = i < m1 ? lse_log2(p.lse[idx]) : INFINITY;
    delta[0][r] = i < m1 ? delta_ws[idx] : 0.f;
  }
  const auto a_q = ldsm_a<TileQ>(sQ, lane);
  const auto a_do = ldsm_a<TileQ>(sdO, lane);
  const DropoutParams drop = DropoutParams::make(pr.dropout_p, pr.seed, pr.offset);
  const uint32_t bh = (uint32_t)b * (uint32_t)pr.num_heads_q + (uint32_t)h;
  float acc_dq[1][kDT][4];
  clear(acc_dq);

  for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
    const int n0 = n_block * kBlockN, st = n_block % 2;
    cp_async_wait<0>();
    __syncthreads();  // K_j, V_j landed; every warp is done with block j + 1
    if (n_block > n_begin) issue(n_block - 1);
    cp_async_commit();
    const T* sKs = sK + st * TileKV::kElems;
    const T* sVs = sV + st * TileKV::kElems;

    float acc_s[1][kNT][4], th[1][kNT][4], acc_dp[1][kNT][4];
    clear(acc_s);
    gemm<K::kHeadDim, false, false, TileQ, TileKV, 1, kNT, T>(acc_s, a_q, row0, 0, ldsm_b<TileKV>(sKs, lane), 0);
    score.apply<K::kScoreMod>(acc_s, th, m0 + row0, 0, n0, lane, score.needs_mask(m0, m0 + kBlockM, n0, kBlockN));
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) exp2_row(acc_s[0], n, e, score.post_scale, lse[e / 2]);  // P = exp2(S - LSE)
    clear(acc_dp);
    gemm<K::kHeadDim, false, false, TileQ, TileKV, 1, kNT, T>(acc_dp, a_do, row0, 0, ldsm_b<TileKV>(sVs, lane), 0);
    make_ds<K::kDropout, K::kScoreMod>(acc_s, acc_dp, th, delta, drop, bh, m0 + row0, 0, n0, lane);
    uint32_t a_ds[1][kNT / 2][4];
    acc_to_a<T>(a_ds, acc_dp);
    gemm_rs<TileKV, 1, kNT / 2, kDT, T>(acc_dq, a_ds, ldsm_bt<TileKV>(sKs, lane), 0, 0);
  }

  cp_async_wait<0>();
#pragma unroll
  for (int n = 0; n < kDT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[0][n][e] *= pr.scale;
  __syncthreads();
  store_acc<TileQ>(sQ, acc_dq, row0, 0, 0, lane);
  __syncthreads();
  copy_q.store(static_cast<T*>(p.dq.data) + seq.q_offset(p.dq, m0, h), p.dq.row_stride, sQ, m1 - m0, d);
}

// Architectures whose blocks get at least 163 KB of shared memory (A100, H100/H200, B200)
// never run the 99 KB tiles (the dispatch picks them by the device's limit), so their
// bodies are left out there: machine code is built per architecture, without PTX, and the
// build and wheel stay small.  Every other architecture compiles them.
#if defined(__CUDA_ARCH__) && !defined(FMHA_SMALL_SMEM_BWD_EVERYWHERE) && \
    (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000 || __CUDA_ARCH__ == 1030)
#define FMHA_SKIP_SMALL_SMEM_BWD 1
#else
#define FMHA_SKIP_SMALL_SMEM_BWD 0
#endif

template <class K>
__global__ void __launch_bounds__(K::kThreads) bwd_kernel(const __grid_constant__ fmha_bwd_params p, float* dq_accum,
                                                          const float* delta_ws, DqMode dq_mode, int order_units) {
  if constexpr (K::kSmallSmem && FMHA_SKIP_SMALL_SMEM_BWD)
    __trap();
  else
    bwd_block<K>(p, dq_accum, delta_ws, dq_mode, order_units);
}

template <class Traits>
void run_bwd(const fmha_bwd_params& p, float* dq_accum, const float* delta, bool atomic_dq, cudaStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int n_blocks = (pr.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if (n_blocks == 0 || pr.batch == 0) return;
  const dim3 grid(n_blocks, pr.num_heads_k, pr.batch);
  auto kernel = bwd_kernel<Traits>;
  // sm90+ kernels always get the dQ block's room; they use it when the accumulator allows a
  // bulk reduction (16-byte aligned).
  const bool sm90 = device_cc_major() >= 9;
  const int smem = Traits::kSmemBytes + (sm90 ? Traits::kDqSmemBytes : 0);
  const DqMode mode = !atomic_dq                                            ? DqMode::kNone
                      : sm90 && reinterpret_cast<uintptr_t>(dq_accum) % 16 == 0 ? DqMode::kBulk
                                                                            : DqMode::kAtomic;
  set_max_smem(reinterpret_cast<const void*>(kernel), smem);
  const int order_units =
      wave_order_units(pr, n_blocks, wave_slots(reinterpret_cast<const void*>(kernel), Traits::kThreads, smem));
  kernel<<<grid, Traits::kThreads, smem, stream>>>(p, dq_accum, delta, mode, order_units);
  check_cuda(cudaGetLastError(), "bwd_kernel launch");
}

template <class Traits>
void run_bwd_dq(const fmha_bwd_params& p, const float* delta, cudaStream_t stream) {
  const fmha_problem& pr = p.problem;
  const int m_blocks = (pr.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks == 0 || pr.batch == 0) return;
  const dim3 grid(m_blocks, pr.num_heads_q, pr.batch);
  auto kernel = bwd_dq_kernel<Traits>;
  set_max_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, delta);
  check_cuda(cudaGetLastError(), "bwd_dq_kernel launch");
}

}  // namespace cuda
}  // namespace fmha
