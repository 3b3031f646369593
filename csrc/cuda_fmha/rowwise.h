// Warp-per-row kernels: the fp32 attention path (CUDA cores, fp32 throughout) and the small
// helpers around the tensor-core kernels (backward pre/post-processing, varlen padding
// rows, the debug probability output).  A warp owns one (row, head); lane l owns the
// head-dim elements l, l + 32, ...; every score is a warp-wide dot product.  Each kernel
// follows the CPU backend's loop structure with the same csrc/common/ functions, so the
// fp32 path computes what the CPU computes, only faster.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "../common/dropout.h"
#include "../common/mask.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"

namespace fmha {
namespace cuda {

constexpr int kRowWarps = 4;                // warps per CTA
constexpr int kLaneElems = 256 / 32;        // head-dim elements per lane (head_dim <= 256)

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// A row of head_dim elements, distributed over the lanes.
struct LaneRow {
  float v[kLaneElems];
  template <class T>
  __device__ __forceinline__ void load(const T* row, int d, int lane) {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) v[c] = lane + 32 * c < d ? to_float(row[lane + 32 * c]) : 0.f;
  }
  template <class T>
  __device__ __forceinline__ void store(T* row, int d, int lane, float scale = 1.f) const {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c)
      if (lane + 32 * c < d) row[lane + 32 * c] = from_float<T>(v[c] * scale);
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) v[c] = 0.f;
  }
  template <class T>
  __device__ __forceinline__ float dot(const T* row, int d, int lane) const {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c)
      if (lane + 32 * c < d) s += v[c] * to_float(row[lane + 32 * c]);
    return warp_sum(s);
  }
  template <class T>
  __device__ __forceinline__ void axpy(float a, const T* row, int d, int lane) {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c)
      if (lane + 32 * c < d) v[c] += a * to_float(row[lane + 32 * c]);
  }
  __device__ __forceinline__ void axpy(float a, const LaneRow& x) {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) v[c] += a * x.v[c];
  }
};

// Per (sequence, query head): what every row-wise kernel needs, from csrc/common/.
struct HeadInfo {
  Sequence seq;
  MaskGeometry geom;
  ScoreParams score;
  DropoutParams drop;
  float slope;
  uint32_t bh;
  int hk;
  __device__ HeadInfo(const fmha_problem& p, int b, int h)
      : seq(Sequence::get(p, b)),
        geom(MaskGeometry::make(seq.len_q, seq.len_k, p.window_left, p.window_right,
                                p.mask_align == FMHA_ALIGN_TOP_LEFT)),
        score(ScoreParams::make(p.scale, p.softcap)),
        drop(DropoutParams::make(p.dropout_p, p.seed, p.offset)),
        slope(p.alibi_slopes ? p.alibi_slopes[(int64_t)b * p.alibi_batch_stride + h] : 0.f),
        bh((uint32_t)b * (uint32_t)p.num_heads_q + (uint32_t)h),
        hk(h / (p.num_heads_q / p.num_heads_k)) {}
  // Score of visible (i, j) from q.k; *capped gets it before ALiBi (softcap gradient).
  __device__ __forceinline__ float scores(float qk, int i, int j, float* capped) const {
    const float s = score.apply(qk);
    *capped = s;
    return slope != 0.f ? s - slope * geom.alibi_distance(i, j) : s;
  }
  __device__ __forceinline__ float dropout_factor(float p_drop, int i, int j) const {
    if (p_drop == 0.f) return 1.f;
    return drop.keep(bh, i, j) ? drop.scale : 0.f;
  }
};

// (sequence b, head h, row i) of a warp: grid (ceil(rows / kRowWarps), heads, batch).
struct WarpRow {
  int b, h, i, lane;
  __device__ WarpRow() : b(blockIdx.z), h(blockIdx.y), i(blockIdx.x * kRowWarps + threadIdx.x / 32), lane(threadIdx.x % 32) {}
};

// ---- fp32 attention (T = float; the code is generic) ----

template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_fwd_kernel(const __grid_constant__ fmha_fwd_params p) {
  const WarpRow w;
  const fmha_problem& pr = p.problem;
  const HeadInfo hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow q, acc;
  q.load(static_cast<const T*>(p.q.data) + hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  acc.zero();
  float m = -INFINITY, l = 0.f;
  const T* k = static_cast<const T*>(p.k.data);
  const T* v = static_cast<const T*>(p.v.data);
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float capped;
    const float s2 = hd.scores(q.dot(k + hd.seq.k_offset(p.k, j, hd.hk), d, w.lane), w.i, j, &capped) * kLog2e;
    const float m_new = fmaxf(m, s2);
    const float r = softmax_rescale(m, m_new);
    const float pj = exp2f(s2 - m_new);
    l = l * r + pj;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) acc.v[c] *= r;
    const float wgt = pj * hd.dropout_factor(pr.dropout_p, w.i, j);
    if (wgt != 0.f) acc.axpy(wgt, v + hd.seq.k_offset(p.v, j, hd.hk), d, w.lane);
    m = m_new;
  }
  acc.store(static_cast<T*>(p.out.data) + hd.seq.q_offset(p.out, w.i, w.h), d, w.lane, softmax_inv_sum(l));
  if (p.lse != nullptr && w.lane == 0) p.lse[hd.seq.lse_index(pr, w.i, w.h)] = softmax_lse(m, l);
}

// Gradient of q.k at (i, j) and dropout(P)_ij; false when (i, j) contributes nothing.
template <class T>
__device__ __forceinline__ bool rowwise_grad(const fmha_bwd_params& p, const HeadInfo& hd, const LaneRow& q,
                                             const LaneRow& dout, float lse, float delta, int i, int j, int lane,
                                             float* dqk, float* p_dropped) {
  const int d = p.problem.head_dim;
  float capped;
  const float s = hd.scores(q.dot(static_cast<const T*>(p.k.data) + hd.seq.k_offset(p.k, j, hd.hk), d, lane), i, j,
                            &capped);
  const float pij = prob_from_lse(s, lse);
  if (pij == 0.f) return false;
  const float z = hd.dropout_factor(p.problem.dropout_p, i, j);
  *p_dropped = pij * z;
  const float dp = dout.dot(static_cast<const T*>(p.v.data) + hd.seq.k_offset(p.v, j, hd.hk), d, lane) * z;
  *dqk = pij * (dp - delta) * hd.score.grad_factor(capped);
  return true;
}

// dQ rows: warp per (row, query head).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_bwd_dq_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                         const float* delta) {
  const WarpRow w;
  const fmha_problem& pr = p.problem;
  const HeadInfo hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow q, dout, dq;
  q.load(static_cast<const T*>(p.q.data) + hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  dout.load(static_cast<const T*>(p.dout.data) + hd.seq.q_offset(p.dout, w.i, w.h), d, w.lane);
  dq.zero();
  const int64_t idx = hd.seq.lse_index(pr, w.i, w.h);
  const float lse = p.lse[idx], dl = delta[idx];
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float dqk, pd;
    if (rowwise_grad<T>(p, hd, q, dout, lse, dl, w.i, j, w.lane, &dqk, &pd))
      dq.axpy(dqk, static_cast<const T*>(p.k.data) + hd.seq.k_offset(p.k, j, hd.hk), d, w.lane);
  }
  dq.store(static_cast<T*>(p.dq.data) + hd.seq.q_offset(p.dq, w.i, w.h), d, w.lane);
}

// dK, dV rows: warp per (key row, KV head), summing over the query heads of its group.
// Grid (ceil(max key rows / kRowWarps), Hk, batch).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_bwd_dkdv_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                           const float* delta) {
  const WarpRow w;  // w.h is the KV head, w.i the key row
  const fmha_problem& pr = p.problem;
  const Sequence seq = Sequence::get(pr, w.b);
  const int j = w.i;
  if (j >= seq.k_rows) return;
  const int d = pr.head_dim, group = pr.num_heads_q / pr.num_heads_k;
  LaneRow dk, dv, q, dout;
  dk.zero();
  dv.zero();
  if (j < seq.len_k) {
    for (int gq = 0; gq < group; ++gq) {
      const int h = w.h * group + gq;
      const HeadInfo hd(pr, w.b, h);
      const int ie = hd.geom.query_end(j + 1);
      for (int i = hd.geom.query_begin(j); i < ie; ++i) {
        q.load(static_cast<const T*>(p.q.data) + seq.q_offset(p.q, i, h), d, w.lane);
        dout.load(static_cast<const T*>(p.dout.data) + seq.q_offset(p.dout, i, h), d, w.lane);
        const int64_t idx = seq.lse_index(pr, i, h);
        float dqk, pd;
        if (!rowwise_grad<T>(p, hd, q, dout, p.lse[idx], delta[idx], i, j, w.lane, &dqk, &pd)) continue;
        dv.axpy(pd, dout);
        dk.axpy(dqk, q);
      }
    }
  }
  dk.store(static_cast<T*>(p.dk.data) + seq.k_offset(p.dk, j, w.h), d, w.lane);
  dv.store(static_cast<T*>(p.dv.data) + seq.k_offset(p.dv, j, w.h), d, w.lane);
}

// ---- helpers of the tensor-core path ----

// D_i = dO_i . O_i - dLSE_i, laid out like the LSE.
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) bwd_delta_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                    float* delta) {
  const WarpRow w;
  const fmha_problem& pr = p.problem;
  const Sequence seq = Sequence::get(pr, w.b);
  if (w.i >= seq.len_q) return;
  LaneRow o;
  o.load(static_cast<const T*>(p.out.data) + seq.q_offset(p.out, w.i, w.h), pr.head_dim, w.lane);
  const float dot = o.dot(static_cast<const T*>(p.dout.data) + seq.q_offset(p.dout, w.i, w.h), pr.head_dim, w.lane);
  const int64_t idx = seq.lse_index(pr, w.i, w.h);
  if (w.lane == 0) delta[idx] = dot - (p.dlse ? p.dlse[idx] : 0.f);
}

// dQ = scale * accumulator, for every row of dq (rows of no sequence get 0).  Grid
// (ceil(rows / kRowWarps), Hq); fixed-length rows are b * Sq + i.
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) dq_convert_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                     const float* dq_accum, int64_t rows,
                                                                     int head_dim_padded) {
  const int64_t row = (int64_t)blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int h = blockIdx.y, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const fmha_problem& pr = p.problem;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  const int64_t off = varlen ? row * p.dq.row_stride + (int64_t)h * p.dq.head_stride
                             : (row / pr.seqlen_q) * p.dq.batch_stride + (row % pr.seqlen_q) * p.dq.row_stride +
                                   (int64_t)h * p.dq.head_stride;
  LaneRow acc;
  acc.load(dq_accum + (row * pr.num_heads_q + h) * head_dim_padded, pr.head_dim, lane);
  acc.store(static_cast<T*>(p.dq.data) + off, pr.head_dim, lane, pr.scale);
}

// Varlen rows outside every sequence ([0, cu[0]) and [cu[B], total)): zeros in `t` (all
// heads) and -inf in `lse` if given.  Grid (ceil(total / kRowWarps), heads).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) zero_outside_kernel(fmha_tensor t, float* lse, const int32_t* cu,
                                                                       int batch, int total, int head_dim) {
  const int row = blockIdx.x * kRowWarps + threadIdx.x / 32;
  const int h = blockIdx.y, lane = threadIdx.x % 32;
  if (row >= total) return;
  const int first = min(max(cu[0], 0), total), last = min(max(cu[batch], first), total);
  if (row >= first && row < last) return;
  T* dst = static_cast<T*>(t.data) + (int64_t)row * t.row_stride + (int64_t)h * t.head_stride;
  for (int c = lane; c < head_dim; c += 32) dst[c] = from_float<T>(0.f);
  if (lse != nullptr && lane == 0) lse[(int64_t)h * total + row] = -INFINITY;
}

// The debug probability output (flash_attn's return_attn_probs): P with dropped entries
// negated, zero outside each sequence.  A warp per (b, h, row i); lanes over keys.
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) probs_kernel(const __grid_constant__ fmha_fwd_params p) {
  const WarpRow w;
  const fmha_problem& pr = p.problem;
  if (w.i >= pr.seqlen_q) return;
  const HeadInfo hd(pr, w.b, w.h);
  T* row = static_cast<T*>(p.probs.data) + (int64_t)w.b * p.probs.batch_stride + (int64_t)w.h * p.probs.head_stride +
           (int64_t)w.i * p.probs.row_stride;
  const bool in_seq = w.i < hd.seq.len_q;
  LaneRow q;
  float lse = -INFINITY;
  if (in_seq) {
    q.load(static_cast<const T*>(p.q.data) + hd.seq.q_offset(p.q, w.i, w.h), pr.head_dim, w.lane);
    lse = p.lse[hd.seq.lse_index(pr, w.i, w.h)];
  }
  const int jb = in_seq ? hd.geom.key_begin(w.i) : 0, je = in_seq ? hd.geom.key_end(w.i + 1) : 0;
  for (int j = 0; j < pr.seqlen_k; ++j) {
    float val = 0.f;
    if (j >= jb && j < je) {  // uniform across the warp
      float capped;
      const float s = hd.scores(q.dot(static_cast<const T*>(p.k.data) + hd.seq.k_offset(p.k, j, hd.hk), pr.head_dim,
                                      w.lane),
                                w.i, j, &capped);
      val = prob_from_lse(s, lse);
      if (hd.dropout_factor(pr.dropout_p, w.i, j) == 0.f) val = -val;
    }
    if (w.lane == 0) row[j] = from_float<T>(val);
  }
}

}  // namespace cuda
}  // namespace fmha
