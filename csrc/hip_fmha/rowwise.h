// Row-wise kernels: the fp32 attention path (vector ALUs, fp32 throughout, a wave per row)
// and the small helpers around the matrix-core kernels (backward pre/post-processing on
// 16-byte chunks, varlen padding rows, the debug probability output).  The bodies are
// csrc/common/row_kernels.h's, shared with the CUDA backend; this file holds the wave as
// their lane group policy and the __global__ wrappers that map the grid to rows (amdgcn
// builtins, not threadIdx: arch.h).
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/row_kernels.h"
#include "fmha/fmha.h"

namespace fmha {
namespace hip {

constexpr int kRowWaves = 4;  // waves per workgroup
constexpr int kRowThreads = kRowWaves * kWaveSize;

// The lane group of row_kernels.h: a wave of 64; elements float, f16, bf16.  tanh, exp and
// log come from arch.h's instructions: ocml's tanhf/expf/logf are device-library calls.
struct Wave {
  static constexpr int kWidth = kWaveSize;
  FMHA_DEVICE static float sum(float x) {
#pragma unroll
    for (int o = kWaveSize / 2; o > 0; o /= 2) x += lane_xor(x, o);
    return x;
  }
  FMHA_DEVICE static float max(float x) {
#pragma unroll
    for (int o = kWaveSize / 2; o > 0; o /= 2) x = fmaxf(x, lane_xor(x, o));
    return x;
  }
  FMHA_DEVICE static float broadcast(float x, int lane) {
    return __builtin_bit_cast(float, __builtin_amdgcn_readlane(__builtin_bit_cast(int, x), lane));
  }
  FMHA_DEVICE static void sync() { wave_barrier(); }
  template <class T>
  FMHA_DEVICE static float load(const void* base, int64_t i) {
    if constexpr (sizeof(T) == 4)
      return static_cast<const float*>(base)[i];
    else
      return to_float<T>(static_cast<const uint16_t*>(base)[i]);
  }
  template <class T>
  FMHA_DEVICE static void store(void* base, int64_t i, float x) {
    if constexpr (sizeof(T) == 4)
      static_cast<float*>(base)[i] = x;
    else
      static_cast<uint16_t*>(base)[i] = to_bits<T>(x);
  }
  template <class T>
  FMHA_DEVICE static float from_bits(uint16_t b) {
    return to_float<T>(b);
  }
  template <class T>
  FMHA_DEVICE static uint16_t to_bits(float x) {
    return ::fmha::hip::to_bits<T>(x);
  }
  FMHA_DEVICE static float shfl_xor(float x, int m) { return lane_xor(x, m); }
  FMHA_DEVICE static float tanh(float x) { return tanh_f32(x); }
  FMHA_DEVICE static float exp(float x) { return fast_exp2(x * kLog2e); }
  FMHA_DEVICE static float log(float x) { return log2f(x) * kLn2; }
};

// (sequence b, head h, row i) of a wave: grid (ceil(rows / kRowWaves), heads, batch).
FMHA_DEVICE RowId wave_row() { return {block_z(), block_y(), block_x() * kRowWaves + wave_id(), lane_id()}; }

// ---- fp32 attention (T = float; the code is generic) ----

template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_fwd_kernel(const fmha_fwd_params p) {
  row_fwd<Wave, T>(p, wave_row());
}

// dQ rows: wave per (row, query head).
template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_bwd_dq_kernel(const fmha_bwd_params p, const float* delta) {
  row_bwd_dq<Wave, T>(p, delta, wave_row());
}

// dK, dV rows: wave per (key row, KV head).  Grid (ceil(max key rows / kRowWaves), Hk, batch).
template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_bwd_dkdv_kernel(const fmha_bwd_params p, const float* delta) {
  row_bwd_dkdv<Wave, T>(p, delta, wave_row());
}

// dO . O for the fp32 path (delta, laid out like the LSE).
template <class T>
__global__ void __launch_bounds__(kRowThreads) rowwise_bwd_delta_kernel(const fmha_bwd_params p, float* delta) {
  row_bwd_delta<Wave, T>(p, delta, wave_row());
}

// ---- helpers of the matrix-core path (16-bit tensors; bodies in ../common/row_kernels.h) ----

// Grid (chunk_delta_blocks, Hq, batch), kChunkThreads threads.
template <class T>
__global__ void __launch_bounds__(kChunkThreads) bwd_delta_kernel(const fmha_bwd_params p, float* delta, float* zero,
                                                                  int64_t zero_count) {
  chunk_bwd_delta<Wave, T>(p, delta, nullptr, zero, zero_count, block_z(), block_y(), block_x(), thread_id());
}

// Grid ceil(rows * Hq * head_dim_padded / 8 / kChunkThreads), kChunkThreads threads.
template <class T>
__global__ void __launch_bounds__(kChunkThreads) dq_convert_kernel(const fmha_bwd_params p, const float* dq_accum,
                                                                   int64_t rows, int head_dim_padded) {
  chunk_dq_convert<Wave, T>(p, dq_accum, rows, head_dim_padded, (int64_t)block_x() * kChunkThreads + thread_id());
}

// Grid (ceil(total / kRowWaves), heads).
template <class T>
__global__ void __launch_bounds__(kRowThreads) zero_outside_kernel(fmha_tensor t, float* lse, const int32_t* cu,
                                                                   int batch, int total, int head_dim) {
  row_zero_outside<Wave, T>(t, lse, cu, batch, total, head_dim, block_x() * kRowWaves + wave_id(), block_y(),
                            lane_id());
}

template <class T>
__global__ void __launch_bounds__(kRowThreads) probs_kernel(const fmha_fwd_params p) {
  row_probs<Wave, T>(p, wave_row());
}

}  // namespace hip
}  // namespace fmha
