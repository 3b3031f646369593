// Mask geometry: which keys a query sees.  One definition for every backend and for the
// tile-skipping logic of the GPU kernels.
//
// Key j is visible to query i iff  i + off - left <= j <= i + off + right, i.e. with
// d = j - i:  off - left <= d <= off + right  (-1 = unbounded on that side).
// off = Sk - Sq (bottom-right alignment, flash_attn) or 0 (top-left, torch is_causal).
// Lengths are the sequence's own (varlen and seqused_k included).
#pragma once

#include <stdint.h>

#include "macros.h"

namespace fmha {

struct MaskGeometry {
  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t off;    // alignment offset (also the ALiBi distance origin), clamped to int32
  int32_t d_min;  // smallest visible j - i
  int32_t d_max;  // largest visible j - i

  // d = j - i of valid indices lies in (-2^31, 2^31); bounds are clamped into that range so
  // the per-element test never overflows.
  static constexpr int64_t kUnbounded = 2147483647;

  FMHA_HOST_DEVICE static int32_t clamp32(int64_t x) {
    return x > kUnbounded ? (int32_t)kUnbounded : x < -kUnbounded ? (int32_t)-kUnbounded : (int32_t)x;
  }

  FMHA_HOST_DEVICE static MaskGeometry make(int32_t seqlen_q, int32_t seqlen_k, int32_t window_left,
                                            int32_t window_right, bool top_left) {
    MaskGeometry g;
    g.seqlen_q = seqlen_q;
    g.seqlen_k = seqlen_k;
    const int64_t off = top_left ? 0 : (int64_t)seqlen_k - seqlen_q;
    g.off = clamp32(off);
    g.d_min = window_left < 0 ? (int32_t)-kUnbounded : clamp32(off - window_left);
    g.d_max = window_right < 0 ? (int32_t)kUnbounded : clamp32(off + window_right);
    return g;
  }

  FMHA_HOST_DEVICE bool visible(int32_t i, int32_t j) const {
    const int32_t d = j - i;
    return d >= d_min && d <= d_max;
  }

  // Keys [key_begin, key_end) that any of the queries [i0, i1) can see (i0 < i1).
  FMHA_HOST_DEVICE int32_t key_begin(int32_t i0) const {
    const int64_t b = (int64_t)i0 + d_min;
    return b < 0 ? 0 : b > seqlen_k ? seqlen_k : (int32_t)b;
  }
  FMHA_HOST_DEVICE int32_t key_end(int32_t i1) const {
    const int64_t e = (int64_t)i1 - 1 + d_max + 1;
    return e < 0 ? 0 : e > seqlen_k ? seqlen_k : (int32_t)e;
  }
  // Key blocks of block_n keys, counted down from the one that ends at key n_end * block_n,
  // that none of the queries below i1 sees: under a causal mask the leading blocks of a tile
  // that a warpgroup of its first rows may skip (fwd_sm90_kernel.h, kSkipBlocks).
  FMHA_HOST_DEVICE int32_t blocks_unseen(int32_t i1, int32_t n_end, int32_t block_n) const {
    const int32_t unseen = n_end - (key_end(i1) + block_n - 1) / block_n;
    return unseen > 0 ? unseen : 0;
  }
  // Queries [query_begin, query_end) that see any of the keys [j0, j1) (j0 < j1).
  FMHA_HOST_DEVICE int32_t query_begin(int32_t j0) const {
    const int64_t b = (int64_t)j0 - d_max;
    return b < 0 ? 0 : b > seqlen_q ? seqlen_q : (int32_t)b;
  }
  FMHA_HOST_DEVICE int32_t query_end(int32_t j1) const {
    const int64_t e = (int64_t)j1 - 1 - d_min + 1;
    return e < 0 ? 0 : e > seqlen_q ? seqlen_q : (int32_t)e;
  }

  // What one row of a score tile sees, as an interval of its columns [lo, lo + width)
  // (width 0 for a row past its sequence's end): row i's keys, or with kKeysInRows key row
  // j's queries.  Sequence ends and window bounds fold into it, so a kernel's per-element
  // test is one unsigned compare of the column's offset from lo (visible_in).
  template <bool kKeysInRows>
  FMHA_HOST_DEVICE void row_interval(int32_t row, int32_t& lo, int32_t& width) const {
    int32_t hi;
    if (!kKeysInRows) {
      lo = row < seqlen_q ? key_begin(row) : 0;
      hi = row < seqlen_q ? key_end(row + 1) : 0;
    } else {
      lo = row < seqlen_k ? query_begin(row) : 0;
      hi = row < seqlen_k ? query_end(row + 1) : 0;
    }
    width = hi > lo ? hi - lo : 0;
  }
  // Column col (of a row whose interval is [lo, lo + width)) is visible.  Unsigned: a column
  // left of lo wraps to at least 2^31, beyond any width.
  FMHA_HOST_DEVICE static bool visible_in(uint32_t col_minus_lo, int32_t width) {
    return col_minus_lo < (uint32_t)width;
  }

  // True when every (i, j) of the tile [i0, i1) x [j0, j1) is visible, so a kernel can
  // skip the per-element test.  Only the window bounds matter; sequence bounds are the
  // caller's business.
  FMHA_HOST_DEVICE bool tile_fully_visible(int32_t i0, int32_t i1, int32_t j0, int32_t j1) const {
    const int64_t d_lo = (int64_t)j0 - (i1 - 1);
    const int64_t d_hi = (int64_t)(j1 - 1) - i0;
    return d_lo >= d_min && d_hi <= d_max;
  }

  // |i + off - j| as a float, the ALiBi distance.
  FMHA_HOST_DEVICE float alibi_distance(int32_t i, int32_t j) const {
    const float d = (float)((int64_t)i - j) + (float)off;
    return d < 0.f ? -d : d;
  }
};

// The ALiBi slope of sequence b's query head h, 0 without ALiBi; the bias is -slope times
// alibi_distance.  P: fmha_problem or fmha_decode_params (slopes (Hq), batch stride 0, or
// (B, Hq)).
template <class P>
FMHA_HOST_DEVICE float alibi_slope(const P& p, int b, int h) {
  return p.alibi_slopes ? p.alibi_slopes[(int64_t)b * p.alibi_batch_stride + h] : 0.f;
}

}  // namespace fmha
