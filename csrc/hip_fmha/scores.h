// From raw q.k accumulators to scores in log2 units: scale, softcap, ALiBi and the mask
// geometry of csrc/common/, applied to a wave's score tile.  Shared by the forward and both
// backward kernels so all of them see exactly the same scores.
//
// A score tile is Acc<N> s[B]: B accumulator blocks stacked along the register dimension.
// Element (b, r) of lane l sits at register index x = reg0 + b N + acc_row(r, l) and lane
// index y = lane0 + l % N.  The forward and the deterministic dQ kernel hold S^T (queries
// in lanes: i = y, j = x); the dK/dV kernel holds S (keys in lanes: i = x, j = y).
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <math.h>

#include "../common/mask.h"
#include "../common/score_mod.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"
#include "tile/mfma.h"

namespace fmha {
namespace hip {

template <bool kQueryInLanes, int N>
struct ScoreCoords {
  int reg0, lane0, lane;
  FMHA_DEVICE int i(int b, int r) const { return kQueryInLanes ? lane0 + lane_index<N>(lane) : x(b, r); }
  FMHA_DEVICE int j(int b, int r) const { return kQueryInLanes ? x(b, r) : lane0 + lane_index<N>(lane); }
  FMHA_DEVICE int x(int b, int r) const { return reg0 + b * N + acc_row<N>(r, lane); }
};

// The parameters (common/score_mod.h), applied to a wave's score tile.
struct ScoreMod : ScoreModBase<ScoreMod> {
  // s (raw q.k) -> score * log2(e) / post_scale, or -inf where masked.  With kKeepTanh, th
  // receives tanh(s / softcap) for the softcap gradient (0 without softcap, so its factor
  // 1 - th^2 is 1).  Each option is a separate pass so
  // the uniform branch sits outside the unrolled loops.
  template <bool kKeepTanh, bool kQueryInLanes, int N, int B>
  FMHA_DEVICE void apply(Acc<N> (&s)[B], Acc<N> (&th)[B], const ScoreCoords<kQueryInLanes, N>& at, bool mask) const {
    constexpr int R = Mfma<N>::kRegs;
    if (softcap) {
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float t = tanh_f32(s[b][r] * softcap_in);
          if (kKeepTanh) th[b][r] = t;
          s[b][r] = t * softcap_out;
        }
    } else {
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (kKeepTanh) th[b][r] = 0.f;
          if (!fold_scale) s[b][r] *= scale_log2;
        }
    }
    if (slope_log2 != 0.f) {
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r) s[b][r] -= slope_log2 * geom.alibi_distance(at.i(b, r), at.j(b, r));
    }
    if (mask) {
      // The lane's row (its query, or its key where keys are in lanes) sees one interval of
      // the register dimension (MaskGeometry::row_interval): an element is a subtract and an
      // unsigned compare, as in the CUDA kernels.
      int32_t lo, width;
      geom.row_interval<!kQueryInLanes>(at.lane0 + lane_index<N>(at.lane), lo, width);
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          // A select, not a branch: a branch around one vector element makes the compiler
          // copy the whole accumulator block on both paths.
          const bool ok = MaskGeometry::visible_in(uint32_t(at.x(b, r)) - uint32_t(lo), width);
          s[b][r] = ok ? s[b][r] : -INFINITY;
        }
    }
  }
};

}  // namespace hip
}  // namespace fmha
