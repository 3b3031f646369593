// Wave-per-row kernels: the fp32 attention path (vector ALUs, fp32 throughout) and the
// small helpers around the matrix-core kernels (backward pre/post-processing, varlen
// padding rows, the debug probability output).  A wave owns one (row, head); lane l owns
// the head-dim elements l, l + 64, ...; every score is a wave-wide dot product.  Each
// kernel follows the CPU backend's loop structure with the same csrc/common/ functions
// (the CUDA backend's rowwise.h, at wave64), so the fp32 path computes what the CPU does.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/dropout.h"
#include "../common/mask.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"

namespace fmha {
namespace hip {

constexpr int kRowWaves = 4;                       // waves per workgroup
constexpr int kRowThreads = kRowWaves * kWaveSize;
constexpr int kLaneElems = 256 / kWaveSize;        // head-dim elements per lane (head_dim <= 256)

// Elements of a tensor of dtype T (float, f16, bf16) as floats.
template <class T>
FMHA_DEVICE float load_elem(const void* base, int64_t i) {
  if constexpr (sizeof(T) == 4)
    return static_cast<const float*>(base)[i];
  else
    return to_float<T>(static_cast<const uint16_t*>(base)[i]);
}
template <class T>
FMHA_DEVICE void store_elem(void* base, int64_t i, float x) {
  if constexpr (sizeof(T) == 4)
    static_cast<float*>(base)[i] = x;
  else
    static_cast<uint16_t*>(base)[i] = to_bits<T>(x);
}

FMHA_DEVICE float wave_sum(float x) {
#pragma unroll
  for (int o = kWaveSize / 2; o > 0; o /= 2) x += lane_xor(x, o);
  return x;
}

// A row of head_dim elements, distributed over the lanes; `off` is the row's element offset.
struct LaneRow {
  float v[kLaneElems];
  template <class T>
  FMHA_DEVICE void load(const void* base, int64_t off, int d, int lane) {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) {
      const int e = lane + kWaveSize * c;
      v[c] = e < d ? load_elem<T>(base, off + e) : 0.f;
    }
  }
  template <class T>
  FMHA_DEVICE void store(void* base, int64_t off, int d, int lane, float scale = 1.f) const {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) {
      const int e = lane + kWaveSize * c;
      if (e < d) store_elem<T>(base, off + e, v[c] * scale);
    }
  }
  FMHA_DEVICE void zero() {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) v[c] = 0.f;
  }
  template <class T>
  FMHA_DEVICE float dot(const void* base, int64_t off, int d, int lane) const {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) {
      const int e = lane + kWaveSize * c;
      if (e < d) s += v[c] * load_elem<T>(base, off + e);
    }
    return wave_sum(s);
  }
  template <class T>
  FMHA_DEVICE void axpy(float a, const void* base, int64_t off, int d, int lane) {
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) {
      const int e = lane + kWaveSize * c;
      if (e < d) v[c] += a * load_elem<T>(base, off + e);
    }
  }
  FMHA_DEVICE void axpy(float a, const LaneRow& x) {
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
  FMHA_DEVICE HeadInfo(const fmha_problem& p, int b, int h)
      : seq(Sequence::get(p, b)),
        geom(sequence_mask(p, seq)),
        score(ScoreParams::make(p.scale, p.softcap)),
        drop(DropoutParams::make(p.dropout_p, p.seed, p.offset)),
        slope(p.alibi_slopes ? p.alibi_slopes[(int64_t)b * p.alibi_batch_stride + h] : 0.f),
        bh((uint32_t)b * (uint32_t)p.num_heads_q + (uint32_t)h),
        hk(h / (p.num_heads_q / p.num_heads_k)) {}
  // Score of visible (i, j) from q.k; *capped gets it before ALiBi (softcap gradient).
  // ScoreParams::apply with arch.h's tanh: ocml's tanhf is a device-library call.
  FMHA_DEVICE float scores(float qk, int i, int j, float* capped) const {
    float s = qk * score.scale;
    if (score.softcap > 0.f) s = score.softcap * tanh_f32(s * score.softcap_inv);
    *capped = s;
    return slope != 0.f ? s - slope * geom.alibi_distance(i, j) : s;
  }
  FMHA_DEVICE float dropout_factor(float p_drop, int i, int j) const {
    if (p_drop == 0.f) return 1.f;
    return drop.keep(bh, i, j) ? drop.scale : 0.f;
  }
};

// (sequence b, head h, row i) of a wave: grid (ceil(rows / kRowWaves), heads, batch).
struct WaveRow {
  int b, h, i, lane;
  FMHA_DEVICE WaveRow() : b(block_z()), h(block_y()), i(block_x() * kRowWaves + wave_id()), lane(lane_id()) {}
};

// ---- fp32 attention (T = float; the code is generic) ----

template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_fwd_kernel(const fmha_fwd_params p) {
  const WaveRow w;
  const fmha_problem& pr = p.problem;
  const HeadInfo hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow q, acc;
  q.load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  acc.zero();
  float m = -INFINITY, l = 0.f;
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float capped;
    const float s2 = hd.scores(q.dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, w.lane), w.i, j, &capped) * kLog2e;
    const float m_new = fmaxf(m, s2);
    const float r = softmax_rescale(m, m_new);
    const float pj = exp2f(s2 - m_new);
    l = l * r + pj;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c) acc.v[c] *= r;
    const float wgt = pj * hd.dropout_factor(pr.dropout_p, w.i, j);
    if (wgt != 0.f) acc.axpy<T>(wgt, p.v.data, hd.seq.k_offset(p.v, j, hd.hk), d, w.lane);
    m = m_new;
  }
  acc.store<T>(p.out.data, hd.seq.q_offset(p.out, w.i, w.h), d, w.lane, softmax_inv_sum(l));
  if (p.lse != nullptr && w.lane == 0) p.lse[hd.seq.lse_index(pr, w.i, w.h)] = softmax_lse(m, l);
}

// Gradient of q.k at (i, j) and dropout(P)_ij; false when (i, j) contributes nothing.
template <class T>
FMHA_DEVICE bool rowwise_grad(const fmha_bwd_params& p, const HeadInfo& hd, const LaneRow& q, const LaneRow& dout,
                              float lse, float delta, int i, int j, int lane, float* dqk, float* p_dropped) {
  const int d = p.problem.head_dim;
  float capped;
  const float s = hd.scores(q.dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, lane), i, j, &capped);
  const float pij = prob_from_lse(s, lse);
  if (pij == 0.f) return false;
  const float z = hd.dropout_factor(p.problem.dropout_p, i, j);
  *p_dropped = pij * z;
  const float dp = dout.dot<T>(p.v.data, hd.seq.k_offset(p.v, j, hd.hk), d, lane) * z;
  *dqk = pij * (dp - delta) * hd.score.grad_factor(capped);
  return true;
}

// dQ rows: wave per (row, query head).
template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_bwd_dq_kernel(const fmha_bwd_params p, const float* delta) {
  const WaveRow w;
  const fmha_problem& pr = p.problem;
  const HeadInfo hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow q, dout, dq;
  q.load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  dout.load<T>(p.dout.data, hd.seq.q_offset(p.dout, w.i, w.h), d, w.lane);
  dq.zero();
  const int64_t idx = hd.seq.lse_index(pr, w.i, w.h);
  const float lse = p.lse[idx], dl = delta[idx];
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float dqk, pd;
    if (rowwise_grad<T>(p, hd, q, dout, lse, dl, w.i, j, w.lane, &dqk, &pd))
      dq.axpy<T>(dqk, p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, w.lane);
  }
  dq.store<T>(p.dq.data, hd.seq.q_offset(p.dq, w.i, w.h), d, w.lane);
}

// dK, dV rows: wave per (key row, KV head), summing over the query heads of its group.
// Grid (ceil(max key rows / kRowWaves), Hk, batch).
template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_bwd_dkdv_kernel(const fmha_bwd_params p, const float* delta) {
  const WaveRow w;  // w.h is the KV head, w.i the key row
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
        q.load<T>(p.q.data, seq.q_offset(p.q, i, h), d, w.lane);
        dout.load<T>(p.dout.data, seq.q_offset(p.dout, i, h), d, w.lane);
        const int64_t idx = seq.lse_index(pr, i, h);
        float dqk, pd;
        if (!rowwise_grad<T>(p, hd, q, dout, p.lse[idx], delta[idx], i, j, w.lane, &dqk, &pd)) continue;
        dv.axpy(pd, dout);
        dk.axpy(dqk, q);
      }
    }
  }
  dk.store<T>(p.dk.data, seq.k_offset(p.dk, j, w.h), d, w.lane);
  dv.store<T>(p.dv.data, seq.k_offset(p.dv, j, w.h), d, w.lane);
}

// ---- helpers of the matrix-core path ----

// D_i = dO_i . O_i - dLSE_i, laid out like the LSE.
template <class T>
__global__ void __launch_bounds__(kRowThreads) bwd_delta_kernel(const fmha_bwd_params p, float* delta) {
  const WaveRow w;
  const fmha_problem& pr = p.problem;
  const Sequence seq = Sequence::get(pr, w.b);
  if (w.i >= seq.len_q) return;
  LaneRow o;
  o.load<T>(p.out.data, seq.q_offset(p.out, w.i, w.h), pr.head_dim, w.lane);
  const float dot = o.dot<T>(p.dout.data, seq.q_offset(p.dout, w.i, w.h), pr.head_dim, w.lane);
  const int64_t idx = seq.lse_index(pr, w.i, w.h);
  if (w.lane == 0) delta[idx] = dot - (p.dlse ? p.dlse[idx] : 0.f);
}

// dQ = scale * accumulator, for every row of dq (rows of no sequence get 0).  Grid
// (ceil(rows / kRowWaves), Hq); fixed-length rows are b * Sq + i.
template <class T>
__global__ void __launch_bounds__(kRowThreads) dq_convert_kernel(const fmha_bwd_params p, const float* dq_accum,
                                                                 int64_t rows, int head_dim_padded) {
  const int64_t row = (int64_t)block_x() * kRowWaves + wave_id();
  const int h = block_y(), lane = lane_id();
  if (row >= rows) return;
  const fmha_problem& pr = p.problem;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  const int64_t off = varlen ? row * p.dq.row_stride + (int64_t)h * p.dq.head_stride
                             : (row / pr.seqlen_q) * p.dq.batch_stride + (row % pr.seqlen_q) * p.dq.row_stride +
                                   (int64_t)h * p.dq.head_stride;
  LaneRow acc;
  acc.load<float>(dq_accum, (row * pr.num_heads_q + h) * head_dim_padded, pr.head_dim, lane);
  acc.store<T>(p.dq.data, off, pr.head_dim, lane, pr.scale);
}

// Varlen rows outside every sequence ([0, cu[0]) and [cu[B], total)): zeros in `t` (all
// heads) and -inf in `lse` if given.  Grid (ceil(total / kRowWaves), heads).
template <class T>
__global__ void __launch_bounds__(kRowThreads) zero_outside_kernel(fmha_tensor t, float* lse, const int32_t* cu,
                                                                   int batch, int total, int head_dim) {
  const int row = block_x() * kRowWaves + wave_id();
  const int h = block_y(), lane = lane_id();
  if (row >= total) return;
  const int first = min(max(cu[0], 0), total), last = min(max(cu[batch], first), total);
  if (row >= first && row < last) return;
  const int64_t off = (int64_t)row * t.row_stride + (int64_t)h * t.head_stride;
  for (int c = lane; c < head_dim; c += kWaveSize) store_elem<T>(t.data, off + c, 0.f);
  if (lse != nullptr && lane == 0) lse[(int64_t)h * total + row] = -INFINITY;
}

// The debug probability output (flash_attn's return_attn_probs): P with dropped entries
// negated, zero outside each sequence.  A wave per (b, h, row i); lanes over keys.
template <class T>
__global__ void __launch_bounds__(kRowThreads) probs_kernel(const fmha_fwd_params p) {
  const WaveRow w;
  const fmha_problem& pr = p.problem;
  if (w.i >= pr.seqlen_q) return;
  const HeadInfo hd(pr, w.b, w.h);
  const int64_t row = (int64_t)w.b * p.probs.batch_stride + (int64_t)w.h * p.probs.head_stride +
                      (int64_t)w.i * p.probs.row_stride;
  const bool in_seq = w.i < hd.seq.len_q;
  LaneRow q;
  float lse = -INFINITY;
  if (in_seq) {
    q.load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), pr.head_dim, w.lane);
    lse = p.lse[hd.seq.lse_index(pr, w.i, w.h)];
  }
  const int jb = in_seq ? hd.geom.key_begin(w.i) : 0, je = in_seq ? hd.geom.key_end(w.i + 1) : 0;
  for (int j = 0; j < pr.seqlen_k; ++j) {
    float val = 0.f;
    if (j >= jb && j < je) {  // uniform across the wave
      float capped;
      const float s = hd.scores(q.dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), pr.head_dim, w.lane), w.i, j,
                                &capped);
      val = prob_from_lse(s, lse);
      if (hd.dropout_factor(pr.dropout_p, w.i, j) == 0.f) val = -val;
    }
    if (w.lane == 0) store_elem<T>(p.probs.data, row + j, val);
  }
}

}  // namespace hip
}  // namespace fmha
