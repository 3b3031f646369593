// The parameters of a score modifier, one definition for every GPU backend: the scale in
// log2 units (folded into the softmax's exp2 where nothing else touches the scores),
// softcap, the ALiBi slope and the mask geometry.  Each backend's ScoreMod
// (cuda_fmha/scores.h, hip_fmha/scores.h) derives from it and applies them to its own
// accumulator layout, so that every kernel sees exactly the same scores.
#pragma once

#include "fmha/fmha.h"
#include "mask.h"
#include "softmax.h"

namespace fmha {

template <class Derived>
struct ScoreModBase {
  float scale_log2;   // scale * log2(e)
  float softcap_in;   // scale / softcap
  float softcap_out;  // softcap * log2(e)
  float slope_log2;   // ALiBi slope * log2(e), 0 without ALiBi
  bool softcap;
  // Plain scores (no softcap, no ALiBi, scale > 0) stay raw q.k after apply(): the softmax
  // folds scale * log2(e) into its exp2 as one FMA (exp2(x * post_scale - max)), and the
  // row max of raw scores is the row max of scaled ones.  Otherwise post_scale is 1.
  bool fold_scale;
  float post_scale;
  MaskGeometry geom;

  // `alibi`: some bias follows apply() (then the scale cannot be folded); slope_log2 is the
  // one apply() subtracts itself (0: none, e.g. in decode, whose slopes vary per packed
  // query row and which subtracts them itself).
  FMHA_HOST_DEVICE static Derived make(float scale, float softcap_, bool alibi, float slope_log2,
                                       const MaskGeometry& geom) {
    Derived s;
    s.scale_log2 = scale * kLog2e;
    s.softcap = softcap_ > 0.f;
    s.softcap_in = s.softcap ? scale / softcap_ : 0.f;
    s.softcap_out = softcap_ * kLog2e;
    s.slope_log2 = slope_log2;
    s.fold_scale = !s.softcap && !alibi && scale > 0.f;
    s.post_scale = s.fold_scale ? s.scale_log2 : 1.f;
    s.geom = geom;
    return s;
  }

  // kMods = false: the caller was compiled for problems without softcap and ALiBi (the
  // backward's plain instances), so neither pass is emitted and no slope is loaded.
  // kPositiveScale (with kMods = false): the dispatch never sends this instance a scale <= 0,
  // so the scale folds into the exp2s by construction, not by a test at run time.
  // `descale` multiplies the scale (the fp8 forward's q_descale * k_descale).
  template <bool kMods = true, bool kPositiveScale = false>
  FMHA_HOST_DEVICE static Derived make(const fmha_problem& p, const MaskGeometry& geom, int b, int h,
                                       float descale = 1.f) {
    static_assert(!(kMods && kPositiveScale), "a positive scale is promised by plain instances only");
    if (kPositiveScale) {
      Derived s = make(p.scale * descale, 0.f, false, 0.f, geom);
      s.fold_scale = true;
      s.post_scale = s.scale_log2;
      return s;
    }
    if (!kMods) return make(p.scale * descale, 0.f, false, 0.f, geom);
    // The pointer is tested here too (alibi_slope tests it again): with the multiply outside
    // the test, ptxas scheduled the sm_90a forward differently (8 more instructions).
    const float slope = p.alibi_slopes ? alibi_slope(p, b, h) * kLog2e : 0.f;
    return make(p.scale * descale, p.softcap, slope != 0.f, slope, geom);
  }

  // Whether the tile [m0, m1) x [n0, n0 + kN) needs per-element masking: it crosses the
  // window band, the end of the keys or the end of the queries.
  FMHA_HOST_DEVICE bool needs_mask(int m0, int m1, int n0, int kN) const {
    return n0 + kN > geom.seqlen_k || m1 > geom.seqlen_q || !geom.tile_fully_visible(m0, m1, n0, n0 + kN);
  }
};

}  // namespace fmha
