// Warp-per-row kernels of the decode path (rowwise.h's layout: a warp owns one row, lane l
// the head-dim elements l, l + 32, ...):
//  - decode_append_kernel: new keys (rotated) and values into the cache at filled + t,
//    quantized in place for 8-bit caches (per-token scales written), as csrc/cpu/decode.cpp;
//  - decode_combine_kernel: the split-KV partials merged by LSE (merge_attentions' rule);
//  - decode_rowwise_kernel: the fp32 decode on CUDA cores, every cache kind, following the
//    CPU backend's loop with the same csrc/common/ helpers.
// Every cache index goes through CacheView / DecodeSequence, which clamp device metadata.
#pragma once

#include <math.h>

#include <type_traits>

#include "../common/kv_cache.h"
#include "../common/mask.h"
#include "../common/quant.h"
#include "../common/rotary.h"
#include "../common/softmax.h"
#include "rowwise.h"

namespace fmha {
namespace cuda {

constexpr int kMaxDecodeSplits = 128;  // split-KV partials per row, at most (decode.cu)

__device__ __forceinline__ float cache_value(float x) { return x; }
__device__ __forceinline__ float cache_value(__half x) { return __half2float(x); }
__device__ __forceinline__ float cache_value(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float cache_value(uint8_t x) { return fp8_e4m3_to_float(x); }
__device__ __forceinline__ float cache_value(int8_t x) { return int8_to_float(x); }

template <class Elem>
__device__ __forceinline__ Elem quantize(float x);
template <>
__device__ __forceinline__ uint8_t quantize<uint8_t>(float x) { return float_to_fp8_e4m3(x); }
template <>
__device__ __forceinline__ int8_t quantize<int8_t>(float x) { return float_to_int8(x); }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Rotates row[0 .. rotary_dim) (fp32, shared memory, one warp) as position pos.
template <class T>
__device__ __forceinline__ void rotate_row(const fmha_decode_params& p, float* row, int64_t pos, int lane) {
  const int half = p.rotary_dim / 2;
  const int64_t at = (int64_t)clamp_index(pos, 0, p.seqlen_ro - 1) * half;
  for (int k = lane; k < half; k += 32) {
    int a, c;
    rotary_pair(k, p.rotary_dim, p.rotary_interleaved != 0, &a, &c);
    rotate_pair(&row[a], &row[c], to_float(static_cast<const T*>(p.rotary_cos)[at + k]),
                to_float(static_cast<const T*>(p.rotary_sin)[at + k]));
  }
  __syncwarp();
}

// One warp per (b, t, hk) of the new tokens: grid ceil(B * seqlen_new * Hk / kRowWarps).
template <class T, class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_append_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t item = (int64_t)blockIdx.x * kRowWarps + warp;
  if (item >= (int64_t)p.batch * p.seqlen_new * p.num_heads_k) return;
  const int hk = (int)(item % p.num_heads_k), tn = (int)(item / p.num_heads_k % p.seqlen_new);
  const int b = (int)(item / ((int64_t)p.num_heads_k * p.seqlen_new));
  const CacheView cv{&p, b};
  const int pos = DecodeSequence::get(p, b).filled + tn;
  const int d = p.head_dim;
  float* row = rows[warp];
  for (int which = 0; which < 2; ++which) {
    const fmha_tensor& src_t = which ? p.v_new : p.k_new;
    const T* src = static_cast<const T*>(src_t.data) + (int64_t)b * src_t.batch_stride +
                   (int64_t)tn * src_t.row_stride + (int64_t)hk * src_t.head_stride;
    for (int e = lane; e < d; e += 32) row[e] = to_float(src[e]);
    __syncwarp();
    if (which == 0 && p.rotary_dim > 0) rotate_row<T>(p, row, pos, lane);
    const fmha_tensor& dst_t = which ? p.v_cache : p.k_cache;
    Elem* dst = static_cast<Elem*>(dst_t.data) + cv.offset(dst_t, pos, hk);
    if constexpr (std::is_same_v<Elem, T>) {
      for (int e = lane; e < d; e += 32) dst[e] = from_float<T>(row[e]);
    } else {
      float* scales = which ? p.v_scale : p.k_scale;
      float s;
      if (p.scaling == FMHA_SCALE_PER_TOKEN) {
        float amax = 0.f;
        for (int e = lane; e < d; e += 32) amax = fmaxf(amax, fabsf(row[e]));
        s = warp_max(amax) / quant_max(p.cache_dtype);
        if (lane == 0) scales[cv.scale_index(pos, hk)] = s;
      } else {
        s = scales[hk];
      }
      const float inv = s > 0.f ? 1.f / s : 0.f;
      for (int e = lane; e < d; e += 32) dst[e] = quantize<Elem>(row[e] * inv);
    }
    __syncwarp();  // row is reused for the value
  }
}

// One warp per output row (b, h, i) in LSE order: grid ceil(B * Hq * Sq / kRowWarps).
// o_part: (splits, B, Hq, Sq, head_dim) fp32, each normalized over its split; lse_part:
// (splits, B, Hq, Sq).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps)
    decode_combine_kernel(const __grid_constant__ fmha_decode_params p, const float* o_part, const float* lse_part,
                          int splits) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = (int64_t)p.batch * p.num_heads_q * p.seqlen_q;
  const int64_t row = (int64_t)blockIdx.x * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int i = (int)(row % p.seqlen_q), h = (int)(row / p.seqlen_q % p.num_heads_q);
  const int b = (int)(row / ((int64_t)p.seqlen_q * p.num_heads_q));
  // Every split's LSE is loaded at once (lane l holds splits l, l + 32, ...), so the weights
  // need no global load inside the loop and the partial rows' loads are all independent:
  // a loop that loaded each LSE before its row waited two memory latencies per split.
  constexpr int kPerLane = kMaxDecodeSplits / 32;
  float w[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int s = lane + 32 * j;
    w[j] = s < splits ? lse_part[s * rows + row] : -INFINITY;
    m = fmaxf(m, w[j]);
  }
  m = warp_max(m);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    w[j] = m == -INFINITY ? 0.f : __expf(w[j] - m);  // 0 for splits that saw no key
    sum += w[j];
  }
  sum = warp_sum(sum);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  LaneRow acc;
  acc.zero();
  const int d = p.head_dim;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
#pragma unroll 4
    for (int t = 0; t < 32 && 32 * j + t < splits; ++t)
      acc.axpy(__shfl_sync(0xffffffffu, w[j], t) * inv, o_part + ((32 * j + t) * rows + row) * d, d, lane);
  }
  acc.store(static_cast<T*>(p.out.data) + (int64_t)b * p.out.batch_stride + (int64_t)i * p.out.row_stride +
                (int64_t)h * p.out.head_stride,
            d, lane);
  if (p.lse != nullptr && lane == 0) p.lse[row] = m == -INFINITY ? -INFINITY : m + __logf(sum);
}

// fp32 decode, one warp per (b, h, i): grid (ceil(Sq / kRowWarps), Hq, B).  The CPU's
// attend_row on a warp; Elem is the cache element (float, or 8-bit with scales).
template <class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_rowwise_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  const WarpRow w;
  if (w.i >= p.seqlen_q) return;
  const int d = p.head_dim, hk = w.h / (p.num_heads_q / p.num_heads_k);
  const CacheView cv{&p, w.b};
  const DecodeSequence seq = DecodeSequence::get(p, w.b);
  float* qrow = rows[threadIdx.x / 32];
  const float* q = static_cast<const float*>(p.q.data) + (int64_t)w.b * p.q.batch_stride +
                   (int64_t)w.i * p.q.row_stride + (int64_t)w.h * p.q.head_stride;
  for (int e = w.lane; e < d; e += 32) qrow[e] = q[e];
  __syncwarp();
  const bool per_row = p.window_left >= 0 || p.window_right >= 0;
  if (p.rotary_dim > 0) rotate_row<float>(p, qrow, (int64_t)seq.filled + (per_row ? w.i : 0), w.lane);
  LaneRow qv, acc;
#pragma unroll
  for (int c = 0; c < kLaneElems; ++c) qv.v[c] = w.lane + 32 * c < d ? qrow[w.lane + 32 * c] : 0.f;
  acc.zero();

  constexpr bool kQuant = !std::is_same_v<Elem, float>;
  const MaskGeometry geom = MaskGeometry::make(p.seqlen_q, seq.len_k, p.window_left, p.window_right, false);
  const ScoreParams sp = ScoreParams::make(p.scale, p.softcap);
  const float slope = p.alibi_slopes ? p.alibi_slopes[(int64_t)w.b * p.alibi_batch_stride + w.h] : 0.f;
  const Elem* kc = static_cast<const Elem*>(p.k_cache.data);
  const Elem* vc = static_cast<const Elem*>(p.v_cache.data);
  float m = -INFINITY, l = 0.f;
  const int je = geom.key_end(w.i + 1);
  for (int j = geom.key_begin(w.i); j < je; ++j) {
    const int pos = seq.leftpad + j;
    const Elem* krow = kc + cv.offset(p.k_cache, pos, hk);
    const Elem* vrow = vc + cv.offset(p.v_cache, pos, hk);
    const float ks = kQuant ? p.k_scale[cv.scale_index(pos, hk)] : 1.f;
    const float vs = kQuant ? p.v_scale[cv.scale_index(pos, hk)] : 1.f;
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c)
      if (w.lane + 32 * c < d) part += qv.v[c] * (cache_value(krow[w.lane + 32 * c]) * ks);
    float s = sp.apply(warp_sum(part));
    if (slope != 0.f) s -= slope * geom.alibi_distance(w.i, j);
    const float s2 = s * kLog2e, m_new = fmaxf(m, s2);
    const float r = softmax_rescale(m, m_new), pj = exp2f(s2 - m_new);
    l = l * r + pj;
    m = m_new;
#pragma unroll
    for (int c = 0; c < kLaneElems; ++c)
      acc.v[c] = acc.v[c] * r + (w.lane + 32 * c < d ? pj * (cache_value(vrow[w.lane + 32 * c]) * vs) : 0.f);
  }
  float* out = static_cast<float*>(p.out.data) + (int64_t)w.b * p.out.batch_stride +
               (int64_t)w.i * p.out.row_stride + (int64_t)w.h * p.out.head_stride;
  acc.store(out, d, w.lane, softmax_inv_sum(l));
  if (p.lse != nullptr && w.lane == 0)
    p.lse[((int64_t)w.b * p.num_heads_q + w.h) * p.seqlen_q + w.i] = softmax_lse(m, l);
}

}  // namespace cuda
}  // namespace fmha
