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

}  // namespace fmha
