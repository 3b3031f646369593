// Where sequence b's cache position `pos` lives in a KV cache: contiguous caches index
// (cache_batch_idx[b] or b, pos); paged caches look the page up in the block table.  Shared
// by every backend's decode path, so paging means the same thing everywhere.
#pragma once

#include <stdint.h>

#include "fmha/fmha.h"
#include "macros.h"

namespace fmha {

struct CacheView {
  const fmha_decode_params* p;
  int32_t b;

  // Cache sequence (contiguous) of batch entry b.
  FMHA_HOST_DEVICE int32_t cache_seq() const { return p->cache_batch_idx ? p->cache_batch_idx[b] : b; }

  // (page or cache sequence, row inside it) of position pos.
  FMHA_HOST_DEVICE void locate(int32_t pos, int32_t* outer, int32_t* row) const {
    if (p->block_table != nullptr) {
      *outer = p->block_table[(int64_t)b * p->block_table_stride + pos / p->cache_seqlen];
      *row = pos % p->cache_seqlen;
    } else {
      *outer = cache_seq();
      *row = pos;
    }
  }

  FMHA_HOST_DEVICE int64_t offset(const fmha_tensor& t, int32_t pos, int32_t h) const {
    int32_t outer, row;
    locate(pos, &outer, &row);
    return (int64_t)outer * t.batch_stride + (int64_t)row * t.row_stride + (int64_t)h * t.head_stride;
  }

  // Index of the scale of (pos, h): per head, or per cache row and head.
  FMHA_HOST_DEVICE int64_t scale_index(int32_t pos, int32_t h) const {
    if (p->scaling == FMHA_SCALE_PER_HEAD) return h;
    int32_t outer, row;
    locate(pos, &outer, &row);
    return ((int64_t)outer * p->cache_seqlen + row) * p->num_heads_k + h;
  }

  // Capacity of sequence b in positions.
  FMHA_HOST_DEVICE int64_t capacity() const {
    return p->block_table ? (int64_t)p->max_pages * p->cache_seqlen : (int64_t)p->cache_seqlen;
  }
};

}  // namespace fmha
