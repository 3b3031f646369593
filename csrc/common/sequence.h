// Where sequence b lives in the tensors, for fixed-length and varlen batches alike.
// Every length is clamped to the bounds the caller declared (total_q/total_k, the maximum
// lengths), so a kernel that uses these numbers never reads or writes out of bounds even
// when device-resident cu_seqlens/seqused_k are inconsistent; the CPU backend validates
// them strictly beforehand, so there the clamps never change anything.
#pragma once

#include <stdint.h>

#include "fmha/fmha.h"
#include "macros.h"
#include "mask.h"

namespace fmha {

struct Sequence {
  int64_t q_row0;  // first row of this sequence in q/out (0 in fixed-length mode)
  int64_t k_row0;  // first row in k/v
  int32_t len_q;   // queries of this sequence
  int32_t len_k;   // keys it attends to (seqused_k applied)
  int32_t k_rows;  // rows of k/v the sequence owns (>= len_k; the rest only get zero gradients)
  int32_t batch;   // b, used for batch strides in fixed-length mode
  bool varlen;

  FMHA_HOST_DEVICE static int32_t clamp(int64_t x, int64_t lo, int64_t hi) {
    return (int32_t)(x < lo ? lo : x > hi ? hi : x);
  }

  FMHA_HOST_DEVICE static Sequence get(const fmha_problem& p, int32_t b) {
    Sequence s;
    s.batch = b;
    s.varlen = p.cu_seqlens_q != nullptr;
    if (s.varlen) {
      const int32_t q0 = clamp(p.cu_seqlens_q[b], 0, p.total_q);
      const int32_t q1 = clamp(p.cu_seqlens_q[b + 1], q0, p.total_q);
      s.q_row0 = q0;
      s.len_q = clamp(q1 - q0, 0, p.seqlen_q);
      if (p.cu_seqlens_k != nullptr) {
        const int32_t k0 = clamp(p.cu_seqlens_k[b], 0, p.total_k);
        const int32_t k1 = clamp(p.cu_seqlens_k[b + 1], k0, p.total_k);
        s.k_row0 = k0;
        s.k_rows = k1 - k0;
      } else {  // keys in a view of their own per sequence (a paged cache: fwd_paged_sm90)
        s.k_row0 = 0;
        s.k_rows = p.seqlen_k;
      }
      s.len_k = clamp(s.k_rows, 0, p.seqlen_k);
    } else {
      s.q_row0 = 0;
      s.k_row0 = 0;
      s.len_q = p.seqlen_q;
      s.k_rows = p.seqlen_k;
      s.len_k = p.seqlen_k;
    }
    if (p.seqused_k != nullptr) s.len_k = clamp(p.seqused_k[b], 0, s.len_k);
    return s;
  }

  // Element offset of (row i of this sequence, head h) in t (q-side or k-side rows).
  FMHA_HOST_DEVICE int64_t q_offset(const fmha_tensor& t, int64_t i, int32_t h) const {
    return (varlen ? 0 : (int64_t)batch * t.batch_stride) + (q_row0 + i) * t.row_stride +
           (int64_t)h * t.head_stride;
  }
  FMHA_HOST_DEVICE int64_t k_offset(const fmha_tensor& t, int64_t j, int32_t h) const {
    return (varlen ? 0 : (int64_t)batch * t.batch_stride) + (k_row0 + j) * t.row_stride +
           (int64_t)h * t.head_stride;
  }
  // Index of LSE (and of other per-row fp32 arrays of the same layout) for row i, head h:
  // (B, Hq, Sq) fixed length, (Hq, total_q) varlen.
  FMHA_HOST_DEVICE int64_t lse_index(const fmha_problem& p, int64_t i, int32_t h) const {
    return varlen ? (int64_t)h * p.total_q + q_row0 + i
                  : ((int64_t)batch * p.num_heads_q + h) * p.seqlen_q + i;
  }
  // Index of row i, head h in the padded statistics (padded_stat_rows below).
  FMHA_HOST_DEVICE int64_t stat_index(const fmha_problem& p, int64_t i, int32_t h) const;
};

// The sm_90a backward's per-row statistics, LSE in log2 units and D = dO . O - dLSE: two
// arrays of (Hq, padded_stat_rows) floats, a sequence's rows starting on a multiple of
// kStatBlock and padded to whole kStatBlocks (+inf and 0 past its end), so that a query
// block of up to kStatBlock rows arrives by one bulk copy per array, whole 16-byte units
// from a 16-byte boundary, with nothing to bound.  Varlen sequence b starts at
// floor((q_row0 + kStatBlock * b) / kStatBlock) * kStatBlock: at or past the previous
// one's padded end, and its own end below total_q + kStatBlock * batch.
constexpr int kStatBlock = 128;
FMHA_HOST_DEVICE int64_t padded_stat_rows(const fmha_problem& p) {
  const int64_t rows = p.cu_seqlens_q != nullptr
                           ? (int64_t)p.total_q + (int64_t)kStatBlock * p.batch
                           : (int64_t)p.batch * ((p.seqlen_q + kStatBlock - 1) / kStatBlock * kStatBlock);
  return (rows + kStatBlock - 1) / kStatBlock * kStatBlock;
}
FMHA_HOST_DEVICE int64_t Sequence::stat_index(const fmha_problem& p, int64_t i, int32_t h) const {
  const int64_t row0 = varlen ? (q_row0 + (int64_t)kStatBlock * batch) / kStatBlock * kStatBlock
                              : (int64_t)batch * ((p.seqlen_q + kStatBlock - 1) / kStatBlock * kStatBlock);
  return (int64_t)h * padded_stat_rows(p) + row0 + i;
}

// The fp32 dQ accumulator of the atomic backward: rows in LSE's layout, head_dim floats
// each, so that one query block of one head is a single contiguous span (the sm90 kernel
// adds it with one bulk reduction).
FMHA_HOST_DEVICE int64_t dq_accum_index(const fmha_problem& p, const Sequence& s, int64_t i, int32_t h,
                                        int head_dim) {
  return s.lse_index(p, i, h) * head_dim;
}
// Column c of accumulator row `lse_index` lies at c ^ dq_accum_swizzle(lse_index): four
// consecutive rows hold their 8-float chunks in four different orders.  The sm90 kernel
// stages a query block's dQ in shared memory in this layout, which the bulk reduction
// copies out unchanged; a warp's fragment store covers four rows at the same columns, and
// with a row stride of head_dim floats (a multiple of 128 bytes) those would share their
// banks (a 4-way conflict).  Needs the padded head_dim to be a multiple of 32.
FMHA_HOST_DEVICE int dq_accum_swizzle(int64_t lse_index) { return ((int)lse_index & 3) << 3; }
// The same for packed row `row` of q (varlen: the row of the packed tensor; fixed length:
// b * Sq + i), for kernels that walk rows without their sequence.
FMHA_HOST_DEVICE int64_t dq_accum_index_of_row(const fmha_problem& p, int64_t row, int32_t h, int head_dim) {
  const int64_t lse_index = p.cu_seqlens_q ? (int64_t)h * p.total_q + row
                                           : ((row / p.seqlen_q) * p.num_heads_q + h) * p.seqlen_q + row % p.seqlen_q;
  return lse_index * head_dim;
}

// The mask geometry of one sequence of a problem.
FMHA_HOST_DEVICE MaskGeometry sequence_mask(const fmha_problem& p, const Sequence& s) {
  return MaskGeometry::make(s.len_q, s.len_k, p.window_left, p.window_right, p.mask_align == FMHA_ALIGN_TOP_LEFT);
}

}  // namespace fmha
