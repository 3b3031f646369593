// From raw q.k accumulators to scores in log2 units: scale, softcap, ALiBi and the mask
// geometry of csrc/common/, applied to a warp's accumulator tile.  Shared by the forward
// and backward kernels so both see exactly the same scores.
#pragma once

#include <math.h>

#include "../common/mask.h"
#include "../common/score_mod.h"
#include "../common/softmax.h"
#include "tile/ptx.h"

namespace fmha {
namespace cuda {

// The parameters (common/score_mod.h), applied to a warp's mma accumulators.
struct ScoreMod : ScoreModBase<ScoreMod> {
  // acc[m][n][e] (raw q.k of row i, key j) -> score * log2(e) / post_scale, or -inf where
  // masked.  The
  // warp's 16-row blocks start at rows row0 + m * row_stride; columns at n0.  With
  // kKeepTanh, th receives tanh(s / softcap) for the softcap gradient (0 without softcap,
  // so its factor 1 - th^2 is 1).  kKeysInRows: the tile is transposed, rows are keys j and
  // columns queries i (the sm_90a backward's S^T = K Q^T).  Each option is a
  // separate pass so that the uniform branch sits outside the unrolled loops.
  template <bool kKeepTanh, bool kKeysInRows = false, int MT, int NT>
  __device__ __forceinline__ void apply(float (&acc)[MT][NT][4], float (&th)[MT][NT][4], int row0, int row_stride,
                                        int n0, int lane, bool mask) const {
    const int g = lane / 4, t = lane % 4;
    if (softcap) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float tanh_x = fast_tanh(acc[m][n][e] * softcap_in);
            if (kKeepTanh) th[m][n][e] = tanh_x;
            acc[m][n][e] = tanh_x * softcap_out;
          }
    } else {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (kKeepTanh) th[m][n][e] = 0.f;
            if (!fold_scale) acc[m][n][e] *= scale_log2;
          }
    }
    if (slope_log2 != 0.f) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = row0 + m * row_stride + g + 8 * (e / 2), c = n0 + n * 8 + 2 * t + (e % 2);
            const int i = kKeysInRows ? c : r, j = kKeysInRows ? r : c;
            acc[m][n][e] -= slope_log2 * geom.alibi_distance(i, j);
          }
    }
    if (mask) {
      // Per row the visible columns as one interval (MaskGeometry::row_interval), so that an
      // element costs an add and an unsigned compare rather than tests of both indices against
      // both sequence ends and both window bounds.  The row enters through an opaque copy:
      // hoisted out of a kernel's key loop, the intervals stayed live through it and spilled
      // at D = 256 (sm_90a forward: 13 local accesses became 46).
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int32_t row = row0 + m * row_stride + g + 8 * h, lo, width;
          asm volatile("" : "+r"(row));
          geom.row_interval<kKeysInRows>(row, lo, width);
          const uint32_t c0 = uint32_t(n0) + uint32_t(2 * t) - uint32_t(lo);  // (first column) - lo
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e)
              if (!MaskGeometry::visible_in(c0 + uint32_t(n * 8 + e % 2), width)) acc[m][n][e] = -INFINITY;
        }
    }
  }

  template <int MT, int NT>
  __device__ __forceinline__ void apply(float (&acc)[MT][NT][4], int row0, int row_stride, int n0, int lane,
                                        bool mask) const {
    apply<false>(acc, acc, row0, row_stride, n0, lane, mask);
  }
};

}  // namespace cuda
}  // namespace fmha
