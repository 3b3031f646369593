// Wave-per-row kernels of the decode path: cache append (rotary, 8-bit quantization), the
// split-KV combine and the fp32 decode.  The bodies are csrc/common/decode_rows.h's,
// shared with the CUDA backend; these are their __global__ wrappers on rowwise.h's Wave.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include "../common/decode_rows.h"
#include "rowwise.h"

namespace fmha {
namespace hip {

// One wave per (b, t, hk) of the new tokens: grid ceil(B * seqlen_new * Hk / kRowWaves).
template <class T, class Elem>
__global__ void __launch_bounds__(kRowThreads) decode_append_kernel(const fmha_decode_params p) {
  __shared__ float rows[kRowWaves][FMHA_MAX_HEAD_DIM];
  const int wave = wave_id();
  decode_append_row<Wave, T, Elem>(p, (int64_t)block_x() * kRowWaves + wave, lane_id(), rows[wave]);
}

// One wave per output row (b, h, i) in LSE order: grid ceil(B * Hq * Sq / kRowWaves).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    decode_combine_kernel(const fmha_decode_params p, const float* o_part, const float* lse_part, int splits) {
  decode_combine_row<Wave, T>(p, o_part, lse_part, splits, (int64_t)block_x() * kRowWaves + wave_id(), lane_id());
}

// fp32 decode, one wave per (b, h, i): grid (ceil(Sq / kRowWaves), Hq, B).
template <class Elem>
__global__ void __launch_bounds__(kRowThreads) decode_rowwise_kernel(const fmha_decode_params p) {
  __shared__ float rows[kRowWaves][FMHA_MAX_HEAD_DIM];
  decode_fp32_row<Wave, Elem>(p, wave_row(), rows[wave_id()]);
}

}  // namespace hip
}  // namespace fmha
