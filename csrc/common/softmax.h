// Scores and the online softmax (Milakov & Gimelshein 2018; FlashAttention, Algorithm 1),
// shared by every backend.
//
// The running statistics live in the base-2 domain: a score s (natural units) enters as
// s * log2(e), so the inner loop needs exp2 only, which is one instruction on GPUs.  With
// m the running row maximum and l the running row sum (both base 2):
//   m_new = max(m_old, max_j s2_j);  p_j = exp2(s2_j - m_new);
//   l_new = l_old * exp2(m_old - m_new) + sum_j p_j;  acc = acc * exp2(m_old - m_new) + P V
// and at the end  out = acc / l,  lse = (m + log2(l)) * ln(2).
#pragma once

#include <math.h>
#include <stdint.h>

#include "macros.h"

namespace fmha {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// scale * q.k with optional softcap and ALiBi, in natural units.
struct ScoreParams {
  float scale;
  float softcap;      // 0 disables
  float softcap_inv;  // 1 / softcap (0 when disabled)

  FMHA_HOST_DEVICE static ScoreParams make(float scale, float softcap) {
    ScoreParams p;
    p.scale = scale;
    p.softcap = softcap;
    p.softcap_inv = softcap > 0.f ? 1.0f / softcap : 0.f;
    return p;
  }

  // s from the raw dot product q.k (before the alibi bias).
  FMHA_HOST_DEVICE float apply(float qk) const {
    const float s = qk * scale;
    return softcap > 0.f ? softcap * tanhf(s * softcap_inv) : s;
  }

  // d s / d (q.k) given the score s returned by apply (before the alibi bias).
  FMHA_HOST_DEVICE float grad_factor(float s) const {
    if (softcap > 0.f) {
      const float t = s * softcap_inv;
      return scale * (1.0f - t * t);
    }
    return scale;
  }
};

// Reference point for exp2 so that a row whose maximum is still -inf (it has seen no
// visible key) produces exp2(-inf - 0) = 0 instead of NaN.
FMHA_HOST_DEVICE float softmax_ref_max(float m) { return m == -INFINITY ? 0.f : m; }

// Factor by which to rescale the accumulator and sum when the row max moves m_old -> m_new.
// While a row has seen no visible key its accumulator and sum are 0; the factor is then 0
// rather than exp2(0 - m_new), which can overflow to inf and turn 0 * inf into NaN.
FMHA_HOST_DEVICE float softmax_rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
}

// Algorithm 1's running statistics of one row (lines 10-11): its maximum m, in the scores'
// log2 units, and l, the sum of exp2(s - m) over the keys seen so far.  A forward keeps one
// per row it owns; the passes over the row's elements are each backend's tile ops of the
// same names (row_max, exp2_row, mul_row: cuda_fmha/tile/mma.h, hip_fmha/tile/mfma.h).
struct SoftmaxRow {
  float max, sum;
  // Before any key.  (Set in the kernel's own loop over its rows, not by default member
  // initializers: with those, nvcc scheduled the sm80 forward differently, +56 instructions.)
  FMHA_HOST_DEVICE static SoftmaxRow empty() { return {-INFINITY, 0.f}; }

  // A block of keys whose maximum over the row (all lanes, in max's units) is block_max:
  // moves max, returns the factor that rescales O and l, and in ref what exp2 subtracts.
  FMHA_HOST_DEVICE float update(float block_max, float& ref) {
    const float mx = fmaxf(max, block_max);
    const float rescale = softmax_rescale(max, mx);
    ref = softmax_ref_max(mx);
    max = mx;
    return rescale;
  }
  // As update, but max stays put while the block's maximum exceeds it by `slack` or less
  // (log2 units; FlashAttention-4's conditional rescaling): the block's exp2(s - max) are then
  // below 2^slack, and the factor is exactly 1, so that O and l need no rescale.
  FMHA_HOST_DEVICE float update_lazy(float block_max, float slack, float& ref) {
    const float mx = block_max <= max + slack ? max : block_max;
    const float rescale = softmax_rescale(max, mx);
    ref = softmax_ref_max(mx);
    max = mx;
    return rescale;
  }
  // l = l * rescale + the block's sum of exp2(s - m).
  FMHA_HOST_DEVICE void add(float rescale, float block_sum) { sum = sum * rescale + block_sum; }
};

// Natural-log LSE from the base-2 statistics; -inf for a row that saw no key.
FMHA_HOST_DEVICE float softmax_lse(float m, float l) {
  return (l > 0.f) ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// 1 / l, or 0 for an empty row so its output is 0 (never 0 * inf).
FMHA_HOST_DEVICE float softmax_inv_sum(float l) { return l > 0.f ? 1.0f / l : 0.f; }

// LSE of a row in log2 units for the backward's P = exp2(S - LSE): +inf for a row that saw
// no key (its scores are all -inf, and exp2(-inf - inf) = 0 where -inf - (-inf) would be NaN).
FMHA_HOST_DEVICE float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// Probability of a score (natural units) from the saved LSE; 0 for an empty row.
FMHA_HOST_DEVICE float prob_from_lse(float s, float lse) {
  return lse == -INFINITY ? 0.f : exp2f((s - lse) * kLog2e);
}

}  // namespace fmha
