// Where sequence b's cache position `pos` lives in a KV cache: contiguous caches index
// (cache_batch_idx[b] or b, pos); paged caches look the page up in the block table.  Shared
// by every backend's decode path, so paging means the same thing everywhere.
//
// GPU kernels cannot read device-resident metadata (cache_seqlens, leftpad, block table,
// cache_batch_idx) on the host without a sync, so every index taken from it is clamped to
// the tensor bounds the caller declared: a kernel that goes through these helpers never
// reads or writes outside the cache, whatever the metadata holds.  The CPU backend
// validates the metadata first (validate_host_metadata), so there the clamps change nothing.
#pragma once

#include <stdint.h>

#include "fmha/fmha.h"
#include "macros.h"

namespace fmha {

FMHA_HOST_DEVICE int32_t clamp_index(int64_t x, int64_t lo, int64_t hi) {
  return (int32_t)(x < lo ? lo : x > hi ? hi : x);
}

struct CacheView {
  const fmha_decode_params* p;
  int32_t b;

  // Cache sequence (contiguous) of batch entry b.
  FMHA_HOST_DEVICE int32_t cache_seq() const {
    return p->cache_batch_idx ? clamp_index(p->cache_batch_idx[b], 0, p->cache_batch - 1)
                              : clamp_index(b, 0, p->cache_batch - 1);
  }

  // Page holding positions [16 k, 16 k + 16) (page sizes are multiples of 16), or the cache
  // sequence of a contiguous cache.  pos < capacity() keeps the block-table column in range.
  FMHA_HOST_DEVICE int32_t outer(int32_t pos) const {
    if (p->block_table == nullptr) return cache_seq();
    return clamp_index(p->block_table[(int64_t)b * p->block_table_stride + pos / p->cache_seqlen], 0,
                       p->cache_batch - 1);
  }
  FMHA_HOST_DEVICE int32_t row(int32_t pos) const {
    return p->block_table != nullptr ? pos % p->cache_seqlen : pos;
  }

  FMHA_HOST_DEVICE int64_t offset(const fmha_tensor& t, int32_t pos, int32_t h) const {
    return (int64_t)outer(pos) * t.batch_stride + (int64_t)row(pos) * t.row_stride + (int64_t)h * t.head_stride;
  }

  // Index of the scale of (pos, h): per head, or per cache row and head.
  FMHA_HOST_DEVICE int64_t scale_index(int32_t pos, int32_t h) const {
    if (p->scaling == FMHA_SCALE_PER_HEAD) return h;
    return ((int64_t)outer(pos) * p->cache_seqlen + row(pos)) * p->num_heads_k + h;
  }

  // Capacity of sequence b in positions.
  FMHA_HOST_DEVICE int64_t capacity() const {
    return p->block_table ? (int64_t)p->max_pages * p->cache_seqlen : (int64_t)p->cache_seqlen;
  }
};

// The lengths of batch entry b: `filled` cache positions before the append, the first valid
// position `leftpad`, and len_k = filled + seqlen_new - leftpad keys (key j is cache position
// leftpad + j).  Clamped so that positions [leftpad, filled + seqlen_new) lie in the cache
// (validate() guarantees seqlen_new <= capacity).
struct DecodeSequence {
  int32_t filled, leftpad, len_k;

  FMHA_HOST_DEVICE static DecodeSequence get(const fmha_decode_params& p, int32_t b) {
    const CacheView cv{&p, b};
    DecodeSequence s;
    s.filled = clamp_index(p.cache_seqlens[b], 0, cv.capacity() - p.seqlen_new);
    s.leftpad = p.cache_leftpad ? clamp_index(p.cache_leftpad[b], 0, s.filled) : 0;
    s.len_k = s.filled + p.seqlen_new - s.leftpad;
    return s;
  }
  FMHA_HOST_DEVICE int32_t end() const { return leftpad + len_k; }  // one past the last position
};

// The query rows of batch entry b: fixed length (seqlen_q rows of q and out at b's batch
// stride) or packed (cu_seqlens_q: rows start .. start + len - 1 of the (total_q, Hq, D) q
// and out).  Device-resident cu_seqlens_q is clamped: start to [0, total_q], the end to
// [start, total_q] and len to [0, seqlen_q], so rows [start, start + len) always exist
// and tiles sized by seqlen_q cover them.
struct DecodeQuery {
  int64_t start;  // packed: first row of the sequence; fixed: 0
  int32_t b, len;
  bool packed;

  FMHA_HOST_DEVICE static DecodeQuery get(const fmha_decode_params& p, int32_t b) {
    DecodeQuery q;
    q.b = b;
    q.packed = p.cu_seqlens_q != nullptr;
    if (!q.packed) {
      q.start = 0, q.len = p.seqlen_q;
      return q;
    }
    q.start = clamp_index(p.cu_seqlens_q[b], 0, p.total_q);
    const int64_t end = clamp_index(p.cu_seqlens_q[b + 1], q.start, p.total_q);
    q.len = clamp_index(end - q.start, 0, p.seqlen_q);
    return q;
  }

  // Offset of (row i, head h) in q or out.
  FMHA_HOST_DEVICE int64_t offset(const fmha_tensor& t, int32_t i, int32_t h) const {
    const int64_t outer = packed ? (start + i) * t.row_stride : (int64_t)b * t.batch_stride + (int64_t)i * t.row_stride;
    return outer + (int64_t)h * t.head_stride;
  }

  // Index of (h, i) in the LSE, (B, Hq, Sq) or packed (Hq, total_q); also the row of the
  // split-KV partials (decode_partial_rows of them per split).
  FMHA_HOST_DEVICE int64_t lse_index(const fmha_decode_params& p, int32_t h, int32_t i) const {
    return packed ? (int64_t)h * p.total_q + start + i : ((int64_t)b * p.num_heads_q + h) * p.seqlen_q + i;
  }
};

// Rows of the LSE and of each split's partial outputs: B x Hq x Sq, or Hq x total_q packed.
FMHA_HOST_DEVICE int64_t decode_partial_rows(const fmha_decode_params& p) {
  return p.cu_seqlens_q ? (int64_t)p.num_heads_q * p.total_q : (int64_t)p.batch * p.num_heads_q * p.seqlen_q;
}

// Output row `row` of decode_partial_rows' order as (sequence, head, row in sequence):
// false for packed rows that no sequence owns (gaps between or after the sequences), which
// are left as they are.  Packed rows find their sequence by binary search of cu_seqlens_q
// (any metadata: every index stays in [0, B]), checked against DecodeQuery's clamps.
struct DecodeRow {
  int32_t b, h, i;
  DecodeQuery q;

  FMHA_HOST_DEVICE bool get(const fmha_decode_params& p, int64_t row) {
    if (p.cu_seqlens_q == nullptr) {
      i = (int32_t)(row % p.seqlen_q), h = (int32_t)(row / p.seqlen_q % p.num_heads_q);
      b = (int32_t)(row / ((int64_t)p.seqlen_q * p.num_heads_q));
      q = DecodeQuery::get(p, b);
      return true;
    }
    if (p.batch <= 0 || p.total_q <= 0) return false;
    const int32_t t = (int32_t)(row % p.total_q);
    h = (int32_t)(row / p.total_q);
    int32_t lo = 0, hi = p.batch - 1;  // the last b with cu_seqlens_q[b] <= t
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (p.cu_seqlens_q[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    b = lo;
    q = DecodeQuery::get(p, b);
    i = (int32_t)(t - q.start);
    return t >= q.start && i < q.len;
  }
};

}  // namespace fmha
