// Warp-per-row kernels of the decode path: cache append (rotary, 8-bit quantization), the
// split-KV combine and the fp32 decode.  The bodies are csrc/common/decode_rows.h's,
// shared with the HIP backend; these are their __global__ wrappers on rowwise.h's Warp.
#pragma once

#include "../common/decode_rows.h"
#include "rowwise.h"

namespace fmha {
namespace cuda {

// One warp per (b, t, hk) of the new tokens: grid ceil(B * seqlen_new * Hk / kRowWarps).
template <class T, class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_append_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  const int warp = threadIdx.x / 32;
  decode_append_row<Warp, T, Elem>(p, (int64_t)blockIdx.x * kRowWarps + warp, threadIdx.x % 32, rows[warp]);
}

// One warp per output row (b, h, i) in LSE order: grid ceil(B * Hq * Sq / kRowWarps).
template <class T>
__global__ void __launch_bounds__(32 * kRowWarps)
    decode_combine_kernel(const __grid_constant__ fmha_decode_params p, const float* o_part, const float* lse_part,
                          int splits) {
  decode_combine_row<Warp, T>(p, o_part, lse_part, splits, (int64_t)blockIdx.x * kRowWarps + threadIdx.x / 32,
                              threadIdx.x % 32);
}

// fp32 decode, one warp per (b, h, i): grid (ceil(Sq / kRowWarps), Hq, B).
template <class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_rowwise_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  decode_fp32_row<Warp, Elem>(p, warp_row(), rows[threadIdx.x / 32]);
}

}  // namespace cuda
}  // namespace fmha
