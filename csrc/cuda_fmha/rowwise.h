// Warp-per-row kernels: the fp32 attention path (CUDA cores, fp32 throughout) and the small
// helpers around the tensor-core kernels (backward pre/post-processing, varlen padding
// rows, the debug probability output).  The bodies are csrc/common/row_kernels.h's, shared
// with the HIP backend; this file holds the warp as their lane group policy and the
// __global__ wrappers that map the grid to rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "../common/row_kernels.h"
#include "fmha/fmha.h"
#include "tile/ptx.h"

namespace fmha {
namespace cuda {

constexpr int kRowWarps = 4;  // warps per CTA

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

// The lane group of row_kernels.h: a warp of 32; elements float, __half, __nv_bfloat16.
struct Warp {
  static constexpr int kWidth = 32;
  __device__ __forceinline__ static float sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
  __device__ __forceinline__ static float max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
  }
  __device__ __forceinline__ static float broadcast(float x, int lane) { return __shfl_sync(0xffffffffu, x, lane); }
  __device__ __forceinline__ static void sync() { __syncwarp(); }
  template <class T>
  __device__ __forceinline__ static float load(const void* base, int64_t i) {
    return to_float(static_cast<const T*>(base)[i]);
  }
  template <class T>
  __device__ __forceinline__ static void store(void* base, int64_t i, float x) {
    static_cast<T*>(base)[i] = from_float<T>(x);
  }
  __device__ __forceinline__ static float tanh(float x) { return tanhf(x); }
  __device__ __forceinline__ static float exp(float x) { return __expf(x); }
  __device__ __forceinline__ static float log(float x) { return __logf(x); }
};

// (sequence b, head h, row i) of a warp: grid (ceil(rows / kRowWarps), heads, batch).
__device__ __forceinline__ RowId warp_row() {
  return {(int)blockIdx.z, (int)blockIdx.y, (int)(blockIdx.x * kRowWarps + threadIdx.x / 32), (int)(threadIdx.x % 32)};
}

// ---- fp32 attention (T = float; the code is generic) ----

template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_fwd_kernel(const __grid_constant__ fmha_fwd_params p) {
  row_fwd<Warp, T>(p, warp_row());
}

// dQ rows: warp per (row, query head).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_bwd_dq_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                         const float* delta) {
  row_bwd_dq<Warp, T>(p, delta, warp_row());
}

// dK, dV rows: warp per (key row, KV head).  Grid (ceil(max key rows / kRowWarps), Hk, batch).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_bwd_dkdv_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                           const float* delta) {
  row_bwd_dkdv<Warp, T>(p, delta, warp_row());
}

// dO . O for the fp32 path (delta, laid out like the LSE).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) rowwise_bwd_delta_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                            float* delta) {
  row_bwd_delta<Warp, T>(p, delta, warp_row());
}

// ---- helpers of the tensor-core path (16-bit tensors: 16-byte aligned rows, head_dim a
// multiple of 8, which dispatch.cu checks) ----
//
// They move 16-byte vectors, a row's chunks spread over a power-of-two group of lanes: the
// warp-per-row bodies of ../common/row_kernels.h (2-byte loads, 4 rows per CTA) took
// 118-151 us per backward at 16k tokens x 2048 and D = 64 on an H200 (benchmarks/results/
// 2026-12-02-h200-bwd-aux), where the bytes take about 35.

constexpr int kAuxThreads = 256, kAuxRows = 64;  // bwd_delta_kernel: threads and query rows per CTA

// Lanes per row: its 16-byte chunks rounded up to a power of two (at most a warp).
__device__ __forceinline__ int chunk_lanes(int head_dim) {
  const int chunks = head_dim / 8;
  return chunks >= 32 ? 32 : chunks > 16 ? 32 : chunks > 8 ? 16 : chunks > 4 ? 8 : chunks > 2 ? 4 : chunks;
}

// A C caller may hand the workspace over at any 4-byte offset (the accumulator is then read
// and written a float at a time).
__device__ __forceinline__ bool aligned16(const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; }

// delta = dO . O - dLSE per query row (laid out like the LSE), rows [64 x, 64 x + 64) of
// sequence z, head y; and zeros for a share of the fp32 dQ accumulator (`zero`, `zero_count`
// floats, a multiple of 4, split evenly over the CTAs), which the backward then accumulates
// into.  Grid (max(1, ceil(seqlen_q / kAuxRows)), Hq, batch).
template <class T>
__global__ void __launch_bounds__(kAuxThreads) bwd_delta_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                 float* delta, float* zero, int64_t zero_count) {
  const fmha_problem& pr = p.problem;
  if (zero_count > 0) {
    const int64_t ctas = (int64_t)gridDim.x * gridDim.y * gridDim.z, vecs = zero_count / 4;
    const int64_t cta = blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
    const int64_t share = (vecs + ctas - 1) / ctas, end = min(vecs, (cta + 1) * share);
    for (int64_t i = cta * share + threadIdx.x; i < end; i += kAuxThreads) {
      if (aligned16(zero))
        reinterpret_cast<float4*>(zero)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      else
        zero[4 * i] = zero[4 * i + 1] = zero[4 * i + 2] = zero[4 * i + 3] = 0.f;
    }
  }
  const Sequence seq = Sequence::get(pr, blockIdx.z);
  const int h = blockIdx.y, lanes = chunk_lanes(pr.head_dim), slots = kAuxThreads / lanes;
  const int slot = threadIdx.x / lanes, col = threadIdx.x % lanes * 8;
  const int i0 = blockIdx.x * kAuxRows, i_end = min(seq.len_q, i0 + kAuxRows);
  // Every lane takes every step (the sum below shuffles within its group of lanes).
  for (int r = 0; r < kAuxRows; r += slots) {
    const int i = i0 + r + slot;
    const bool row = r + slot < kAuxRows && i < i_end;
    float dot = 0.f;
    if (row && col < pr.head_dim) {
      const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.out.data) + seq.q_offset(p.out, i, h) + col);
      const uint4 d = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout.data) + seq.q_offset(p.dout, i, h) + col);
      const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = unpack2<T>(ow[e]), b = unpack2<T>(dw[e]);
        dot = fmaf(a.x, b.x, fmaf(a.y, b.y, dot));
      }
    }
    for (int o = lanes / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (row && col == 0) {
      const int64_t idx = seq.lse_index(pr, i, h);
      delta[idx] = dot - (p.dlse ? p.dlse[idx] : 0.f);
    }
  }
}

// dQ = scale * accumulator, one 8-column chunk per thread, walking the accumulator in
// its own order (row lse_index = the LSE's, columns swizzled by dq_accum_swizzle within
// 8-aligned chunks); rows outside every sequence get the accumulator's zeros.
// Grid ceil(rows * Hq * head_dim_padded / 8 / kAuxThreads).
template <class T>
__global__ void __launch_bounds__(kAuxThreads) dq_convert_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                  const float* dq_accum, int64_t rows,
                                                                  int head_dim_padded) {
  const fmha_problem& pr = p.problem;
  const int chunks = head_dim_padded / 8;
  const int64_t c = (int64_t)blockIdx.x * kAuxThreads + threadIdx.x;
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
  float4 a, b;
  if (aligned16(dq_accum)) {
    a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
  } else {
    a = make_float4(src[0], src[1], src[2], src[3]), b = make_float4(src[4], src[5], src[6], src[7]);
  }
  const float sc = pr.scale;
  uint4 out;
  out.x = pack2<T>(a.x * sc, a.y * sc), out.y = pack2<T>(a.z * sc, a.w * sc);
  out.z = pack2<T>(b.x * sc, b.y * sc), out.w = pack2<T>(b.z * sc, b.w * sc);
  *reinterpret_cast<uint4*>(static_cast<T*>(p.dq.data) + off + col) = out;
}

// The sm_90a backward's split GQA groups: dK and dV of key row `row` (packed rows when varlen,
// b * seqlen_k + j otherwise) and KV head blockIdx.y, summed over the splits' fp32 shares
// part[split][dK, dV][row][Hk][head_dim_padded] in split order (so deterministic), one warp
// per row.  Grid (ceil(rows / kRowWarps), Hk).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) dkv_reduce_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                     const float* part, int64_t rows, int splits,
                                                                     int head_dim_padded) {
  const int64_t row = (int64_t)blockIdx.x * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const fmha_problem& pr = p.problem;
  const int hk = blockIdx.y, lane = threadIdx.x % 32;
  const int64_t plane = rows * pr.num_heads_k * head_dim_padded, index = (row * pr.num_heads_k + hk) * head_dim_padded;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  for (int w = 0; w < 2; ++w) {
    const fmha_tensor& t = w == 0 ? p.dk : p.dv;
    LaneRow<Warp> acc;
    acc.zero();
    for (int s = 0; s < splits; ++s) acc.template axpy<float>(1.f, part, (2 * s + w) * plane + index, pr.head_dim, lane);
    const int64_t off = varlen ? row * t.row_stride + (int64_t)hk * t.head_stride
                               : (row / pr.seqlen_k) * t.batch_stride + (row % pr.seqlen_k) * t.row_stride +
                                     (int64_t)hk * t.head_stride;
    acc.template store<T>(t.data, off, pr.head_dim, lane);
  }
}

// Grid (ceil(total / kRowWarps), heads).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) zero_outside_kernel(fmha_tensor t, float* lse, const int32_t* cu,
                                                                       int batch, int total, int head_dim) {
  row_zero_outside<Warp, T>(t, lse, cu, batch, total, head_dim, blockIdx.x * kRowWarps + threadIdx.x / 32, blockIdx.y,
                            threadIdx.x % 32);
}

template <class T>
__global__ void __launch_bounds__(32 * kRowWarps) probs_kernel(const __grid_constant__ fmha_fwd_params p) {
  row_probs<Warp, T>(p, warp_row());
}

}  // namespace cuda
}  // namespace fmha
