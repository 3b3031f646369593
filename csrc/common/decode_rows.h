// Row-wise bodies of the decode path (row_kernels.h's layout and lane group policy G: a
// group owns one row, lane l the head-dim elements l, l + G::kWidth, ...):
//  - decode_append_row: new keys (rotated) and values into the cache at filled + t,
//    quantized in place for 8-bit caches (per-token scales written), as csrc/cpu/decode.cpp;
//  - decode_combine_part / _store: the split-KV partials merged by LSE (merge_attentions'
//    rule), a row spread over the lane groups of a block;
//  - decode_fp32_row: the fp32 decode without matrix units, every cache kind, following the
//    CPU backend's loop with the same csrc/common/ helpers.
// Every cache index goes through CacheView / DecodeSequence, which clamp device metadata.
// Device-only, like row_kernels.h; each backend's decode_rowwise.h holds the __global__
// wrappers and the group's shared-memory row.
#pragma once

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "decode_plan.h"
#include "fmha/fmha.h"
#include "kv_cache.h"
#include "macros.h"
#include "mask.h"
#include "quant.h"
#include "rotary.h"
#include "row_kernels.h"
#include "softmax.h"

namespace fmha {


// A cache element as a float (before its scale): T (the policy's dtypes) or 8-bit.
template <class G, class Elem, class T>
FMHA_DEVICE float cache_elem(const void* base, int64_t i) {
  if constexpr (std::is_same_v<Elem, uint8_t>)
    return fp8_e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  else if constexpr (std::is_same_v<Elem, int8_t>)
    return int8_to_float(static_cast<const int8_t*>(base)[i]);
  else
    return G::template load<T>(base, i);
}

// Rotates row[0 .. rotary_dim) (fp32, the group's shared-memory row) as position pos.
template <class G, class T>
FMHA_DEVICE void rotate_shared_row(const fmha_decode_params& p, float* row, int64_t pos, int lane) {
  const int half = p.rotary_dim / 2;
  const int64_t at = (int64_t)clamp_index(pos, 0, p.seqlen_ro - 1) * half;
  for (int k = lane; k < half; k += G::kWidth) {
    int a, c;
    rotary_pair(k, p.rotary_dim, p.rotary_interleaved != 0, &a, &c);
    rotate_pair(&row[a], &row[c], G::template load<T>(p.rotary_cos, at + k), G::template load<T>(p.rotary_sin, at + k));
  }
  G::sync();
}

// New token `item` = (b, t, hk) in (B, seqlen_new, Hk) order.  T: the dtype of k_new/v_new;
// Elem: the cache element (T, or uint8_t fp8 / int8_t int8); row: the group's fp32 row of
// FMHA_MAX_HEAD_DIM in shared memory.
template <class G, class T, class Elem>
FMHA_DEVICE void decode_append_row(const fmha_decode_params& p, int64_t item, int lane, float* row) {
  if (item >= (int64_t)p.batch * p.seqlen_new * p.num_heads_k) return;
  const int hk = (int)(item % p.num_heads_k), tn = (int)(item / p.num_heads_k % p.seqlen_new);
  const int b = (int)(item / ((int64_t)p.num_heads_k * p.seqlen_new));
  const CacheView cv{&p, b};
  const int pos = DecodeSequence::get(p, b).filled + tn;
  const int d = p.head_dim;
  for (int which = 0; which < 2; ++which) {
    const fmha_tensor& src_t = which ? p.v_new : p.k_new;
    const int64_t src = (int64_t)b * src_t.batch_stride + (int64_t)tn * src_t.row_stride +
                        (int64_t)hk * src_t.head_stride;
    for (int e = lane; e < d; e += G::kWidth) row[e] = G::template load<T>(src_t.data, src + e);
    G::sync();
    if (which == 0 && p.rotary_dim > 0) rotate_shared_row<G, T>(p, row, pos, lane);
    const fmha_tensor& dst_t = which ? p.v_cache : p.k_cache;
    const int64_t dst = cv.offset(dst_t, pos, hk);
    if constexpr (std::is_same_v<Elem, T>) {
      for (int e = lane; e < d; e += G::kWidth) G::template store<T>(dst_t.data, dst + e, row[e]);
    } else {
      float* scales = which ? p.v_scale : p.k_scale;
      float s;
      if (p.scaling == FMHA_SCALE_PER_TOKEN) {
        float amax = 0.f;
        for (int e = lane; e < d; e += G::kWidth) amax = fmaxf(amax, fabsf(row[e]));
        s = G::max(amax) / quant_max(p.cache_dtype);
        if (lane == 0) scales[cv.scale_index(pos, hk)] = s;
      } else {
        s = scales[hk];
      }
      const float inv = s > 0.f ? 1.f / s : 0.f;
      Elem* out = static_cast<Elem*>(dst_t.data) + dst;
      for (int e = lane; e < d; e += G::kWidth) {
        if constexpr (std::is_same_v<Elem, uint8_t>)
          out[e] = float_to_fp8_e4m3(row[e] * inv);
        else
          out[e] = float_to_int8(row[e] * inv);
      }
    }
    G::sync();  // row is reused for the value
  }
}

// Lane groups per output row of the split combine: up to 8, about two splits each (one
// group per row when there are two, so that a block then combines several rows).
FMHA_HOST_DEVICE int decode_combine_parts(int splits) {
  int parts = 1;
  while (parts < 8 && 2 * parts < splits) parts *= 2;
  return parts;
}

// The split-KV combine of output row `row` in LSE order ((B, Hq, Sq), or (Hq, total_q)
// with packed queries: decode_partial_rows), by `parts` lane groups of one block: o_part is
// (splits, rows, head_dim) fp32, each row normalized over its split; lse_part is
// (splits, rows).  Group `part` adds splits
// part, part + parts, ... weighted by their share of the row's softmax sum into red
// (head_dim floats in shared memory) and returns the row's LSE; after a block barrier,
// decode_combine_store adds the parts' rows and writes the output.  A lane owns dims
// [4l, 4l + 4) + 4 kWidth c, as 16-byte loads (head_dim is a multiple of 8 on the
// matrix-unit paths, the only ones that split).  Spread over parts because the compiler
// keeps about two of one lane's row loads in flight, whatever the unrolling: one group per
// row took 0.3 us per split on an H200 (16 us at 43 splits).
template <class G>
FMHA_DEVICE float decode_combine_part(const fmha_decode_params& p, const float* o_part, const float* lse_part,
                                      int splits, int64_t row, int part, int parts, int lane, float* red) {
  const int64_t rows = decode_partial_rows(p);
  constexpr int kVec = (FMHA_MAX_HEAD_DIM + 4 * G::kWidth - 1) / (4 * G::kWidth);
  const int d = p.head_dim;
  // The group's first kAhead splits (all of them at up to 2 x parts splits, B = 1's 16
  // among them) are read with the LSEs below rather than after their reduction: one
  // dependent trip to L2 instead of two.
  constexpr int kAhead = 2;
  Float4 ahead[kAhead][kVec];
  float lse_ahead[kAhead];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    const int s = part + parts * j;
    lse_ahead[j] = s < splits ? lse_part[s * rows + row] : -INFINITY;
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      const int e = 4 * (lane + G::kWidth * c);
      ahead[j][c] = s < splits && e < d ? *reinterpret_cast<const Float4*>(o_part + (s * rows + row) * d + e)
                                        : Float4{0.f, 0.f, 0.f, 0.f};
    }
  }
  // Every split's LSE at once (lane l holds splits l, l + kWidth, ...): the max and the sum.
  constexpr int kPerLane = kMaxDecodeSplits / G::kWidth;
  float w[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int s = lane + G::kWidth * j;
    w[j] = s < splits ? lse_part[s * rows + row] : -INFINITY;
    m = fmaxf(m, w[j]);
  }
  m = G::max(m);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) sum += m == -INFINITY ? 0.f : G::exp(w[j] - m);  // 0: a split saw no key
  sum = G::sum(sum);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;

  Float4 acc[kVec];
#pragma unroll
  for (int c = 0; c < kVec; ++c) acc[c] = Float4{0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    const float ws = m == -INFINITY ? 0.f : G::exp(lse_ahead[j] - m) * inv;  // 0 past the splits
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      const Float4 x = ahead[j][c];
      acc[c].x += ws * x.x, acc[c].y += ws * x.y, acc[c].z += ws * x.z, acc[c].w += ws * x.w;
    }
  }
  for (int s = part + parts * kAhead; s < splits; s += parts) {
    const float ws = m == -INFINITY ? 0.f : G::exp(lse_part[s * rows + row] - m) * inv;
#pragma unroll
    for (int c = 0; c < kVec; ++c) {
      const int e = 4 * (lane + G::kWidth * c);
      if (e >= d) continue;
      const Float4 x = *reinterpret_cast<const Float4*>(o_part + (s * rows + row) * d + e);
      acc[c].x += ws * x.x, acc[c].y += ws * x.y, acc[c].z += ws * x.z, acc[c].w += ws * x.w;
    }
  }
#pragma unroll
  for (int c = 0; c < kVec; ++c) {
    const int e = 4 * (lane + G::kWidth * c);
    if (e < d) *reinterpret_cast<Float4*>(red + e) = acc[c];
  }
  return m == -INFINITY ? -INFINITY : m + G::log(sum);
}

// The output row and its LSE from the parts' rows (red: parts rows of FMHA_MAX_HEAD_DIM
// floats), after the barrier that follows decode_combine_part; w: the row as DecodeRow
// found it (a row it rejects is never combined).
template <class G, class T>
FMHA_DEVICE void decode_combine_store(const fmha_decode_params& p, int64_t row, const DecodeRow& w,
                                      const float* red, int parts, float lse, int lane) {
  const int64_t out = w.q.offset(p.out, w.i, w.h);
  for (int e = lane; e < p.head_dim; e += G::kWidth) {
    float o = 0.f;
    for (int k = 0; k < parts; ++k) o += red[k * FMHA_MAX_HEAD_DIM + e];
    G::template store<T>(p.out.data, out + e, o);
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = lse;
}

// fp32 decode of row (b, h, i): the CPU's attend_row on a lane group.  Elem is the cache
// element (float, or 8-bit with scales); qrow: the group's fp32 row in shared memory.
template <class G, class Elem>
FMHA_DEVICE void decode_fp32_row(const fmha_decode_params& p, const RowId& w, float* qrow) {
  const DecodeQuery dq = DecodeQuery::get(p, w.b);
  if (w.i >= dq.len) return;
  const int d = p.head_dim, hk = w.h / (p.num_heads_q / p.num_heads_k);
  const CacheView cv{&p, w.b};
  const DecodeSequence seq = DecodeSequence::get(p, w.b);
  const int64_t q_off = dq.offset(p.q, w.i, w.h);
  for (int e = w.lane; e < d; e += G::kWidth) qrow[e] = G::template load<float>(p.q.data, q_off + e);
  G::sync();
  const bool per_row = p.window_left >= 0 || p.window_right >= 0;
  if (p.rotary_dim > 0) rotate_shared_row<G, float>(p, qrow, (int64_t)seq.filled + (per_row ? w.i : 0), w.lane);
  constexpr int kElems = LaneRow<G>::kElems;
  LaneRow<G> qv, acc;
#pragma unroll
  for (int c = 0; c < kElems; ++c) qv.v[c] = w.lane + G::kWidth * c < d ? qrow[w.lane + G::kWidth * c] : 0.f;
  acc.zero();

  constexpr bool kQuant = !std::is_same_v<Elem, float>;
  const MaskGeometry geom = MaskGeometry::make(dq.len, seq.len_k, p.window_left, p.window_right, false);
  const ScoreParams sp = ScoreParams::make(p.scale, p.softcap);
  const float slope = alibi_slope(p, w.b, w.h);
  float m = -INFINITY, l = 0.f;
  const int je = geom.key_end(w.i + 1);
  for (int j = geom.key_begin(w.i); j < je; ++j) {
    const int pos = seq.leftpad + j;
    const int64_t krow = cv.offset(p.k_cache, pos, hk), vrow = cv.offset(p.v_cache, pos, hk);
    const float ks = kQuant ? p.k_scale[cv.scale_index(pos, hk)] : 1.f;
    const float vs = kQuant ? p.v_scale[cv.scale_index(pos, hk)] : 1.f;
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = w.lane + G::kWidth * c;
      if (e < d) part += qv.v[c] * (cache_elem<G, Elem, float>(p.k_cache.data, krow + e) * ks);
    }
    float s = row_score<G>(sp, G::sum(part));
    if (slope != 0.f) s -= slope * geom.alibi_distance(w.i, j);
    const float s2 = s * kLog2e, m_new = fmaxf(m, s2);
    const float r = softmax_rescale(m, m_new), pj = exp2f(s2 - m_new);
    l = l * r + pj;
    m = m_new;
#pragma unroll
    for (int c = 0; c < kElems; ++c) {
      const int e = w.lane + G::kWidth * c;
      acc.v[c] = acc.v[c] * r + (e < d ? pj * (cache_elem<G, Elem, float>(p.v_cache.data, vrow + e) * vs) : 0.f);
    }
  }
  acc.template store<float>(p.out.data, dq.offset(p.out, w.i, w.h), d, w.lane, softmax_inv_sum(l));
  if (p.lse != nullptr && w.lane == 0) p.lse[dq.lse_index(p, w.h, w.i)] = softmax_lse(m, l);
}

}  // namespace fmha
