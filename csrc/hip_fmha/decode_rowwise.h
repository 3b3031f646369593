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

// kCombineWaves / parts output rows in LSE order per workgroup, `parts` waves
// each (decode_combine_parts, at most kCombineWaves): grid
// ceil(decode_partial_rows * parts / kCombineWaves).
constexpr int kCombineWaves = 4;
template <class T>
__global__ void __launch_bounds__(kCombineWaves * kWaveSize)
    decode_combine_kernel(const fmha_decode_params p, const float* o_part, const float* lse_part, int splits,
                          int parts) {
  __shared__ __attribute__((aligned(16))) float red[kCombineWaves][FMHA_MAX_HEAD_DIM];
  const int wave = wave_id(), lane = lane_id(), part = wave % parts;
  const int64_t row = (int64_t)block_x() * (kCombineWaves / parts) + wave / parts;
  DecodeRow w;  // rows no sequence owns (packed queries) are skipped
  const bool valid = row < decode_partial_rows(p) && w.get(p, row);
  float lse = 0.f;
  if (valid) lse = decode_combine_part<Wave>(p, o_part, lse_part, splits, row, part, parts, lane, red[wave]);
  barrier();
  if (valid && part == 0) decode_combine_store<Wave, T>(p, row, w, &red[wave][0], parts, lse, lane);
}

// fp32 decode, one wave per (b, h, i): grid (ceil(Sq / kRowWaves), Hq, B).
template <class Elem>
__global__ void __launch_bounds__(kRowThreads) decode_rowwise_kernel(const fmha_decode_params p) {
  __shared__ float rows[kRowWaves][FMHA_MAX_HEAD_DIM];
  decode_fp32_row<Wave, Elem>(p, wave_row(), rows[wave_id()]);
}

}  // namespace hip
}  // namespace fmha
