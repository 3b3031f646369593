// Row-wise kernels: the fp32 attention path (CUDA cores, fp32 throughout, a warp per row)
// and the small helpers around the tensor-core kernels (backward pre/post-processing on
// 16-byte chunks, varlen padding rows, the debug probability output).  The bodies are
// csrc/common/row_kernels.h's, shared with the HIP backend; this file holds the warp as
// their lane group policy and the __global__ wrappers that map the grid to rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <type_traits>

#include "../common/row_kernels.h"
#include "fmha/fmha.h"

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
  template <class T>
  __device__ __forceinline__ static float from_bits(uint16_t b) {
    if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(b));
    else return __uint_as_float((uint32_t)b << 16);
  }
  template <class T>
  __device__ __forceinline__ static uint16_t to_bits(float x) {
    if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(__float2half_rn(x));
    else return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  __device__ __forceinline__ static float shfl_xor(float x, int m) { return __shfl_xor_sync(0xffffffffu, x, m); }
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

// ---- helpers of the tensor-core path (16-bit tensors; bodies in ../common/row_kernels.h) ----

// Grid (chunk_delta_blocks, Hq, batch), kChunkThreads threads; lse2: null, or the padded
// statistics' LSE array (delta then their D array).
template <class T>
__global__ void __launch_bounds__(kChunkThreads) bwd_delta_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                   float* delta, float* lse2, float* zero,
                                                                   int64_t zero_count) {
  chunk_bwd_delta<Warp, T>(p, delta, lse2, zero, zero_count, blockIdx.z, blockIdx.y, blockIdx.x, threadIdx.x);
}

// Grid ceil(rows * Hq * head_dim_padded / 8 / kChunkThreads), kChunkThreads threads.
template <class T>
__global__ void __launch_bounds__(kChunkThreads) dq_convert_kernel(const __grid_constant__ fmha_bwd_params p,
                                                                    const float* dq_accum, int64_t rows,
                                                                    int head_dim_padded) {
  chunk_dq_convert<Warp, T>(p, dq_accum, rows, head_dim_padded, (int64_t)blockIdx.x * kChunkThreads + threadIdx.x);
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
