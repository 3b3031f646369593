// Row-wise kernel bodies, one lane group per row: the fp32 attention path (fp32 throughout,
// no matrix units) and the small helpers around the matrix-unit kernels (backward pre- and
// post-processing, varlen padding rows, the debug probability output).  A group of G::kWidth
// lanes (a CUDA warp of 32, a CDNA wave of 64) owns one (row, head); lane l owns the
// head-dim elements l, l + kWidth, ...; every score is a group-wide dot product.  Each body
// follows the CPU backend's loop structure with the same csrc/common/ functions, so the
// fp32 path computes what the CPU computes.
//
// Device-only, and free of thread and block ids: each backend's rowwise.h supplies the lane
// group policy G and thin __global__ wrappers that map the grid to a RowId.  Include it
// after the backend's runtime header (HIP's __device__ comes from hip_runtime.h).
//
// The policy G provides, all static:
//   kWidth                        lanes per group
//   sum(x), max(x)                group-wide reductions, the result in every lane
//   broadcast(x, t)               x of lane t
//   sync()                        orders the group's shared-memory accesses (__syncwarp)
//   load<T>(base, i), store<T>(base, i, x)   element i of a T tensor as a float
//   from_bits<T>(b), to_bits<T>(x)  a 16-bit T's bits and a float (round to nearest even)
//   shfl_xor(x, m)                x of lane (this lane ^ m)
//   tanh(x), exp(x), log(x)       the backend's versions (HIP avoids device-library calls)
#pragma once

#include <math.h>
#include <stdint.h>

#include "dropout.h"
#include "fmha/fmha.h"
#include "macros.h"
#include "mask.h"
#include "sequence.h"
#include "softmax.h"

namespace fmha {

// (sequence b, head h, row i) of a lane group, and this lane's index in it.
struct RowId {
  int b, h, i, lane;
};

// A row of head_dim (<= 256) elements, distributed over the lanes; `off` is the row's
// element offset in `base`.
template <class G>
struct LaneRow {
  static constexpr int kElems = FMHA_MAX_HEAD_DIM / G::kWidth;  // head-dim elements per lane
  float v[kElems];

  // Element e is read at off + (e ^ swizzle) (the dQ accumulator's layout).
  template <class T>
  FMHA_DEVICE void load(const void* base, int64_t off, int d, int lane, int swizzle = 0) {
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = lane + G::kWidth * c;
      v[c] = e < d ? G::template load<T>(base, off + (e ^ swizzle)) : 0.f;
    }
  }
  template <class T>
  FMHA_DEVICE void store(void* base, int64_t off, int d, int lane, float scale = 1.f) const {
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = lane + G::kWidth * c;
      if (e < d) G::template store<T>(base, off + e, v[c] * scale);
    }
  }
  FMHA_DEVICE void zero() {
#pragma unroll
    for (int c = 0; c < kElems; ++c) v[c] = 0.f;
  }
  template <class T>
  FMHA_DEVICE float dot(const void* base, int64_t off, int d, int lane) const {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = lane + G::kWidth * c;
      if (e < d) s += v[c] * G::template load<T>(base, off + e);
    }
    return G::sum(s);
  }
  template <class T>
  FMHA_DEVICE void axpy(float a, const void* base, int64_t off, int d, int lane) {
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = lane + G::kWidth * c;
      if (e < d) v[c] += a * G::template load<T>(base, off + e);
    }
  }
  FMHA_DEVICE void axpy(float a, const LaneRow& x) {
#pragma unroll
    for (int c = 0; c < kElems; ++c) v[c] += a * x.v[c];
  }
};

// ScoreParams::apply with the policy's tanh: scale * q.k, then the softcap.
template <class G>
FMHA_DEVICE float row_score(const ScoreParams& sp, float qk) {
  float s = qk * sp.scale;
  if (sp.softcap > 0.f) s = sp.softcap * G::tanh(s * sp.softcap_inv);
  return s;
}

// Per (sequence, query head): what every row-wise body needs, from csrc/common/.
template <class G>
struct RowHead {
  Sequence seq;
  MaskGeometry geom;
  ScoreParams score;
  DropoutParams drop;
  float slope;
  uint32_t bh;
  int hk;
  FMHA_DEVICE RowHead(const fmha_problem& p, int b, int h)
      : seq(Sequence::get(p, b)),
        geom(sequence_mask(p, seq)),
        score(ScoreParams::make(p.scale, p.softcap)),
        drop(DropoutParams::make(p.dropout_p, p.seed, p.offset)),
        slope(alibi_slope(p, b, h)),
        bh((uint32_t)b * (uint32_t)p.num_heads_q + (uint32_t)h),
        hk(h / (p.num_heads_q / p.num_heads_k)) {}
  // Score of visible (i, j) from q.k; *capped gets it before ALiBi (softcap gradient).
  FMHA_DEVICE float scores(float qk, int i, int j, float* capped) const {
    const float s = row_score<G>(score, qk);
    *capped = s;
    return slope != 0.f ? s - slope * geom.alibi_distance(i, j) : s;
  }
  FMHA_DEVICE float dropout_factor(float p_drop, int i, int j) const {
    if (p_drop == 0.f) return 1.f;
    return drop.keep(bh, i, j) ? drop.scale : 0.f;
  }
};

// ---- fp32 attention (T = float; the code is generic) ----

// Forward of row w.i: the online softmax over its visible keys, one key at a time.
template <class G, class T>
FMHA_DEVICE void row_fwd(const fmha_fwd_params& p, const RowId& w) {
  const fmha_problem& pr = p.problem;
  const RowHead<G> hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow<G> q, acc;
  q.template load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  acc.zero();
  float m = -INFINITY, l = 0.f;
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float capped;
    const float s2 =
        hd.scores(q.template dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, w.lane), w.i, j, &capped) * kLog2e;
    const float m_new = fmaxf(m, s2);
    const float r = softmax_rescale(m, m_new);
    const float pj = exp2f(s2 - m_new);
    l = l * r + pj;
#pragma unroll
    for (int c = 0; c < LaneRow<G>::kElems; ++c) acc.v[c] *= r;
    const float wgt = pj * hd.dropout_factor(pr.dropout_p, w.i, j);
    if (wgt != 0.f) acc.template axpy<T>(wgt, p.v.data, hd.seq.k_offset(p.v, j, hd.hk), d, w.lane);
    m = m_new;
  }
  acc.template store<T>(p.out.data, hd.seq.q_offset(p.out, w.i, w.h), d, w.lane, softmax_inv_sum(l));
  if (p.lse != nullptr && w.lane == 0) p.lse[hd.seq.lse_index(pr, w.i, w.h)] = softmax_lse(m, l);
}

// Gradient of q.k at (i, j) and dropout(P)_ij; false when (i, j) contributes nothing.
template <class G, class T>
FMHA_DEVICE bool row_grad(const fmha_bwd_params& p, const RowHead<G>& hd, const LaneRow<G>& q,
                          const LaneRow<G>& dout, float lse, float delta, int i, int j, int lane, float* dqk,
                          float* p_dropped) {
  const int d = p.problem.head_dim;
  float capped;
  const float s = hd.scores(q.template dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, lane), i, j, &capped);
  const float pij = prob_from_lse(s, lse);
  if (pij == 0.f) return false;
  const float z = hd.dropout_factor(p.problem.dropout_p, i, j);
  *p_dropped = pij * z;
  const float dp = dout.template dot<T>(p.v.data, hd.seq.k_offset(p.v, j, hd.hk), d, lane) * z;
  *dqk = pij * (dp - delta) * hd.score.grad_factor(capped);
  return true;
}

// dQ of row w.i, query head w.h.
template <class G, class T>
FMHA_DEVICE void row_bwd_dq(const fmha_bwd_params& p, const float* delta, const RowId& w) {
  const fmha_problem& pr = p.problem;
  const RowHead<G> hd(pr, w.b, w.h);
  if (w.i >= hd.seq.len_q) return;
  const int d = pr.head_dim;
  LaneRow<G> q, dout, dq;
  q.template load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), d, w.lane);
  dout.template load<T>(p.dout.data, hd.seq.q_offset(p.dout, w.i, w.h), d, w.lane);
  dq.zero();
  const int64_t idx = hd.seq.lse_index(pr, w.i, w.h);
  const float lse = p.lse[idx], dl = delta[idx];
  const int je = hd.geom.key_end(w.i + 1);
  for (int j = hd.geom.key_begin(w.i); j < je; ++j) {
    float dqk, pd;
    if (row_grad<G, T>(p, hd, q, dout, lse, dl, w.i, j, w.lane, &dqk, &pd))
      dq.template axpy<T>(dqk, p.k.data, hd.seq.k_offset(p.k, j, hd.hk), d, w.lane);
  }
  dq.template store<T>(p.dq.data, hd.seq.q_offset(p.dq, w.i, w.h), d, w.lane);
}

// dK, dV of key row w.i, KV head w.h, summed over the query heads of its group.
template <class G, class T>
FMHA_DEVICE void row_bwd_dkdv(const fmha_bwd_params& p, const float* delta, const RowId& w) {
  const fmha_problem& pr = p.problem;
  const Sequence seq = Sequence::get(pr, w.b);
  const int j = w.i;
  if (j >= seq.k_rows) return;
  const int d = pr.head_dim, group = pr.num_heads_q / pr.num_heads_k;
  LaneRow<G> dk, dv, q, dout;
  dk.zero();
  dv.zero();
  if (j < seq.len_k) {
    for (int gq = 0; gq < group; ++gq) {
      const int h = w.h * group + gq;
      const RowHead<G> hd(pr, w.b, h);
      const int ie = hd.geom.query_end(j + 1);
      for (int i = hd.geom.query_begin(j); i < ie; ++i) {
        q.template load<T>(p.q.data, seq.q_offset(p.q, i, h), d, w.lane);
        dout.template load<T>(p.dout.data, seq.q_offset(p.dout, i, h), d, w.lane);
        const int64_t idx = seq.lse_index(pr, i, h);
        float dqk, pd;
        if (!row_grad<G, T>(p, hd, q, dout, p.lse[idx], delta[idx], i, j, w.lane, &dqk, &pd)) continue;
        dv.axpy(pd, dout);
        dk.axpy(dqk, q);
      }
    }
  }
  dk.template store<T>(p.dk.data, seq.k_offset(p.dk, j, w.h), d, w.lane);
  dv.template store<T>(p.dv.data, seq.k_offset(p.dv, j, w.h), d, w.lane);
}

// ---- helpers of the matrix-unit path ----

// D_i = dO_i . O_i - dLSE_i, laid out like the LSE (the fp32 path's; 16-bit tensors take
// chunk_bwd_delta below).
template <class G, class T>
FMHA_DEVICE void row_bwd_delta(const fmha_bwd_params& p, float* delta, const RowId& w) {
  const fmha_problem& pr = p.problem;
  const Sequence seq = Sequence::get(pr, w.b);
  if (w.i >= seq.len_q) return;
  LaneRow<G> o;
  o.template load<T>(p.out.data, seq.q_offset(p.out, w.i, w.h), pr.head_dim, w.lane);
  const float dot = o.template dot<T>(p.dout.data, seq.q_offset(p.dout, w.i, w.h), pr.head_dim, w.lane);
  const int64_t idx = seq.lse_index(pr, w.i, w.h);
  if (w.lane == 0) delta[idx] = dot - (p.dlse ? p.dlse[idx] : 0.f);
}

// ---- the 16-bit backward's helpers on 16-byte chunks ----
//
// 16-bit tensors have 16-byte aligned rows and a head_dim that is a multiple of 8 (both
// backends check it), so these move 8 elements per access, a row's chunks spread over a
// power-of-two group of lanes.  (Warp-per-row bodies moving 2-byte elements, four rows per
// CTA, took 118-151 us per backward at 16k tokens x 2048, D = 64, on an H200 against
// about 35 for the bytes: `git show 41107b8:benchmarks/results/2026-12-02-h200-bwd-aux/kernels_before.txt`.)

constexpr int kChunkThreads = 256, kChunkRows = 64;  // chunk_bwd_delta: threads and query rows per CTA

// Lanes per row: its 16-byte chunks rounded up to a power of two (at most 32).
FMHA_HOST_DEVICE int chunk_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < head_dim / 8 && lanes < 32) lanes *= 2;
  return lanes;
}

// 16 bytes, for vector loads and stores (CUDA's and HIP's uint4 and float4 differ).
struct alignas(16) Chunk16 {
  uint32_t w[4];
};
struct alignas(16) Float4 {
  float x, y, z, w;
};

// Elements [i, i + 8) of a 16-bit T tensor (16-byte aligned) as floats, and back.
template <class G, class T>
FMHA_DEVICE void load8(const void* base, int64_t i, float (&x)[8]) {
  const Chunk16 c = *reinterpret_cast<const Chunk16*>(static_cast<const uint16_t*>(base) + i);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    x[2 * e] = G::template from_bits<T>((uint16_t)(c.w[e] & 0xFFFFu));
    x[2 * e + 1] = G::template from_bits<T>((uint16_t)(c.w[e] >> 16));
  }
}
template <class G, class T>
FMHA_DEVICE void store8(void* base, int64_t i, const float (&x)[8]) {
  Chunk16 c;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    c.w[e] = (uint32_t)G::template to_bits<T>(x[2 * e]) | ((uint32_t)G::template to_bits<T>(x[2 * e + 1]) << 16);
  *reinterpret_cast<Chunk16*>(static_cast<uint16_t*>(base) + i) = c;
}

// A C caller may hand the workspace over at any 4-byte offset: the accumulator is then read
// and written a float at a time.
FMHA_DEVICE bool aligned16(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

// CTAs along x of chunk_bwd_delta's grid (x, Hq, batch); `padded`: the padded statistics'
// layout, whose padding rows the grid covers too.
FMHA_HOST_DEVICE int chunk_delta_blocks(const fmha_problem& pr, bool padded) {
  const int rows = padded ? (pr.seqlen_q + kStatBlock - 1) / kStatBlock * kStatBlock : pr.seqlen_q;
  return rows > kChunkRows ? (rows + kChunkRows - 1) / kChunkRows : 1;
}

// CTA (x, h, b) of kChunkThreads threads (this one `tid`): delta = dO . O - dLSE for query
// rows [kChunkRows * x, kChunkRows * (x + 1)) of sequence b, head h, laid out like the LSE,
// or with `lse2` the padded statistics (sequence.h: delta and lse2 their two arrays, LSE in
// log2 units into lse2, the padding rows +inf and 0); and zeros in the CTA's share of the
// fp32 dQ accumulator (`zero`, `zero_count` floats, a multiple of 4, split evenly over the
// grid), which the backward then adds into.
template <class G, class T>
FMHA_DEVICE void chunk_bwd_delta(const fmha_bwd_params& p, float* delta, float* lse2, float* zero, int64_t zero_count,
                                 int b, int h, int x, int tid) {
  const fmha_problem& pr = p.problem;
  const bool padded = lse2 != nullptr;
  if (zero_count > 0) {
    const int64_t gx = chunk_delta_blocks(pr, padded), ctas = gx * pr.num_heads_q * pr.batch;
    const int64_t cta = x + gx * (h + (int64_t)pr.num_heads_q * b);
    const int64_t vecs = zero_count / 4, share = (vecs + ctas - 1) / ctas;
    const int64_t end = vecs < (cta + 1) * share ? vecs : (cta + 1) * share;
    for (int64_t i = cta * share + tid; i < end; i += kChunkThreads) {
      if (aligned16(zero)) {
        reinterpret_cast<Float4*>(zero)[i] = Float4{0.f, 0.f, 0.f, 0.f};
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) zero[4 * i + e] = 0.f;
      }
    }
  }
  const Sequence seq = Sequence::get(pr, b);
  const int lanes = chunk_lanes(pr.head_dim), slots = kChunkThreads / lanes;
  const int slot = tid / lanes, col = tid % lanes * 8;
  const int i0 = x * kChunkRows, i_end = seq.len_q < i0 + kChunkRows ? seq.len_q : i0 + kChunkRows;
  const int pad_end = padded ? (seq.len_q + kStatBlock - 1) / kStatBlock * kStatBlock : seq.len_q;
  // Every lane takes every step: the sum shuffles within its group of lanes.
  for (int r = 0; r < kChunkRows; r += slots) {
    const int i = i0 + r + slot;
    const bool row = r + slot < kChunkRows && i < i_end;
    float dot = 0.f;
    if (row && col < pr.head_dim) {
      float o[8], d[8];
      load8<G, T>(p.out.data, seq.q_offset(p.out, i, h) + col, o);
      load8<G, T>(p.dout.data, seq.q_offset(p.dout, i, h) + col, d);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(o[e], d[e], dot);
    }
    for (int m = lanes / 2; m > 0; m /= 2) dot += G::shfl_xor(dot, m);
    if (row && col == 0) {
      const int64_t idx = seq.lse_index(pr, i, h);
      const float di = dot - (p.dlse ? p.dlse[idx] : 0.f);
      if (padded) {
        const int64_t sidx = seq.stat_index(pr, i, h);
        delta[sidx] = di, lse2[sidx] = lse_log2(p.lse[idx]);
      } else {
        delta[idx] = di;
      }
    } else if (padded && r + slot < kChunkRows && i >= seq.len_q && i < pad_end && col == 0) {
      const int64_t sidx = seq.stat_index(pr, i, h);  // padding: P = 0 in these rows
      delta[sidx] = 0.f, lse2[sidx] = INFINITY;
    }
  }
}

// dQ = scale * accumulator for 8-column chunk `c` of the accumulator, walked in its own
// order: row lse_index (the LSE's), columns swizzled by dq_accum_swizzle within 8-aligned
// chunks; rows outside every sequence get the accumulator's zeros.  rows: q's rows
// (varlen: total_q; else batch * Sq).
template <class G, class T>
FMHA_DEVICE void chunk_dq_convert(const fmha_bwd_params& p, const float* dq_accum, int64_t rows, int head_dim_padded,
                                  int64_t c) {
  const fmha_problem& pr = p.problem;
  const int chunks = head_dim_padded / 8;
  if (c >= rows * pr.num_heads_q * chunks) return;
  const int64_t lse_index = c / chunks;
  const int col = (int)(c % chunks) * 8;
  if (col >= pr.head_dim) return;
  int64_t off;
  if (pr.cu_seqlens_q != nullptr) {
    off = (lse_index % pr.total_q) * p.dq.row_stride + (lse_index / pr.total_q) * p.dq.head_stride;
  } else {
    const int64_t bh = lse_index / pr.seqlen_q;
    off = (bh / pr.num_heads_q) * p.dq.batch_stride + (lse_index % pr.seqlen_q) * p.dq.row_stride +
          (bh % pr.num_heads_q) * p.dq.head_stride;
  }
  const float* src = dq_accum + lse_index * head_dim_padded + (col ^ dq_accum_swizzle(lse_index));
  float x[8];
  if (aligned16(dq_accum)) {
    const Float4 a = reinterpret_cast<const Float4*>(src)[0], b = reinterpret_cast<const Float4*>(src)[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = v[e] * pr.scale;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = src[e] * pr.scale;
  }
  store8<G, T>(p.dq.data, off + col, x);
}

// Varlen row `row` of head h, if outside every sequence ([0, cu[0]) and [cu[B], total)):
// zeros in `t` and -inf in `lse` if given.
template <class G, class T>
FMHA_DEVICE void row_zero_outside(fmha_tensor t, float* lse, const int32_t* cu, int batch, int total, int head_dim,
                                  int row, int h, int lane) {
  if (row >= total) return;
  const int first = min(max(cu[0], 0), total), last = min(max(cu[batch], first), total);
  if (row >= first && row < last) return;
  const int64_t off = (int64_t)row * t.row_stride + (int64_t)h * t.head_stride;
  for (int c = lane; c < head_dim; c += G::kWidth) G::template store<T>(t.data, off + c, 0.f);
  if (lse != nullptr && lane == 0) lse[(int64_t)h * total + row] = -INFINITY;
}

// The debug probability output (flash_attn's return_attn_probs) of row (b, h, i): P with
// dropped entries negated, zero outside each sequence; lanes over keys.
template <class G, class T>
FMHA_DEVICE void row_probs(const fmha_fwd_params& p, const RowId& w) {
  const fmha_problem& pr = p.problem;
  if (w.i >= pr.seqlen_q) return;
  const RowHead<G> hd(pr, w.b, w.h);
  const int64_t row = (int64_t)w.b * p.probs.batch_stride + (int64_t)w.h * p.probs.head_stride +
                      (int64_t)w.i * p.probs.row_stride;
  const bool in_seq = w.i < hd.seq.len_q;
  LaneRow<G> q;
  float lse = -INFINITY;
  if (in_seq) {
    q.template load<T>(p.q.data, hd.seq.q_offset(p.q, w.i, w.h), pr.head_dim, w.lane);
    lse = p.lse[hd.seq.lse_index(pr, w.i, w.h)];
  }
  const int jb = in_seq ? hd.geom.key_begin(w.i) : 0, je = in_seq ? hd.geom.key_end(w.i + 1) : 0;
  for (int j = 0; j < pr.seqlen_k; ++j) {
    float val = 0.f;
    if (j >= jb && j < je) {  // uniform across the group
      float capped;
      const float s =
          hd.scores(q.template dot<T>(p.k.data, hd.seq.k_offset(p.k, j, hd.hk), pr.head_dim, w.lane), w.i, j, &capped);
      val = prob_from_lse(s, lse);
      if (hd.dropout_factor(pr.dropout_p, w.i, j) == 0.f) val = -val;
    }
    if (w.lane == 0) G::template store<T>(p.probs.data, row + j, val);
  }
}

}  // namespace fmha
