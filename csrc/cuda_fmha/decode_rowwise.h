// Warp-per-row kernels of the decode path: cache append (rotary, 8-bit quantization), the
// split-KV combine and the fp32 decode.  The bodies are csrc/common/decode_rows.h's,
// shared with the HIP backend; these are their __global__ wrappers on rowwise.h's Warp.
#pragma once

#include "../common/decode_rows.h"
#include "rowwise.h"
#include "tile/ptx.h"

namespace fmha {
namespace cuda {

// One warp per (b, t, hk) of the new tokens: grid ceil(B * seqlen_new * Hk / kRowWarps).
template <class T, class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_append_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  const int warp = threadIdx.x / 32;
  decode_append_row<Warp, T, Elem>(p, (int64_t)blockIdx.x * kRowWarps + warp, threadIdx.x % 32, rows[warp]);
}

// kCombineWarps / parts output rows in LSE order per block, `parts` warps each
// (decode_combine_parts): grid ceil(decode_partial_rows * parts / kCombineWarps).
constexpr int kCombineWarps = 8;
template <class T>
__global__ void __launch_bounds__(32 * kCombineWarps)
    decode_combine_kernel(const __grid_constant__ fmha_decode_params p, const float* o_part, const float* lse_part,
                          int splits, int parts) {
  __shared__ __align__(16) float red[kCombineWarps][FMHA_MAX_HEAD_DIM];
  grid_dependency_wait();  // the decode kernel's partials, when launched as its dependent
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % parts;
  const int64_t row = (int64_t)blockIdx.x * (kCombineWarps / parts) + warp / parts;
  DecodeRow w;  // rows no sequence owns (packed queries) are skipped
  const bool valid = row < decode_partial_rows(p) && w.get(p, row);
  float lse = 0.f;
  if (valid) lse = decode_combine_part<Warp>(p, o_part, lse_part, splits, row, part, parts, lane, red[warp]);
  __syncthreads();
  if (valid && part == 0) decode_combine_store<Warp, T>(p, row, w, &red[warp][0], parts, lse, lane);
}

// fp32 decode, one warp per (b, h, i): grid (ceil(Sq / kRowWarps), Hq, B).
template <class Elem>
__global__ void __launch_bounds__(32 * kRowWarps) decode_rowwise_kernel(const __grid_constant__ fmha_decode_params p) {
  __shared__ float rows[kRowWarps][FMHA_MAX_HEAD_DIM];
  decode_fp32_row<Warp, Elem>(p, warp_row(), rows[threadIdx.x / 32]);
}

}  // namespace cuda
}  // namespace fmha
