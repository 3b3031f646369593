// The split-KV plan of a GPU decode call (flash-decoding), shared by the CUDA and HIP
// backends: how many splits each (sequence, KV head, query tile) gets, and the workspace
// that their fp32 partial outputs and LSEs take.  Host code; each backend supplies what it
// knows of its hardware: how many CTAs (workgroups) a wave of the cache stream wants
// resident at once, and the fewest 16-row cache blocks a split should keep.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "fmha/fmha.h"
#include "kv_cache.h"
#include "macros.h"

namespace fmha {

constexpr int kMaxDecodeSplits = 128;  // split-KV partials per row, at most

// The cache element a decode kernel instance reads.
enum class CacheKind { kPlain, kFp8, kInt8 };

// The element types of a decode call's kernels: T of the queries (and output), Elem of the
// cache (T, or the 8-bit storage of an fp8 or int8 cache), kCache its kind.
template <class T_, class Elem_, CacheKind kCache_>
struct DecodeTypes {
  using T = T_;
  using Elem = Elem_;
  static constexpr CacheKind kCache = kCache_;
};

// f(DecodeTypes<...>{}) for p's query dtype and cache element; Half and BFloat16 are the
// backend's 16-bit types.
template <class Half, class BFloat16, class F>
void with_decode_types(const fmha_decode_params& p, F&& f) {
  auto with_cache = [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    if (p.cache_dtype == FMHA_DTYPE_FLOAT8_E4M3) return f(DecodeTypes<T, uint8_t, CacheKind::kFp8>{});
    if (p.cache_dtype == FMHA_DTYPE_INT8) return f(DecodeTypes<T, int8_t, CacheKind::kInt8>{});
    return f(DecodeTypes<T, T, CacheKind::kPlain>{});
  };
  if (p.dtype == FMHA_DTYPE_FLOAT16) return with_cache(static_cast<Half*>(nullptr));
  if (p.dtype == FMHA_DTYPE_BFLOAT16) return with_cache(static_cast<BFloat16*>(nullptr));
  return with_cache(static_cast<float*>(nullptr));
}

// The query tile a CTA packs: the rows of every query head sharing a KV head, tile_rows
// at a time (row r = i * group + head-in-group; 16 on HIP, 8 on CUDA, whose products run
// transposed); the cache is walked in 16-row position blocks.
struct DecodeWork {
  static constexpr int kRows = 16, kBlock = 16;
  FMHA_HOST_DEVICE static int m_tiles(const fmha_decode_params& p, int tile_rows = kRows) {
    return (p.seqlen_q * (p.num_heads_q / p.num_heads_k) + tile_rows - 1) / tile_rows;
  }
};

struct DecodePlan {
  int splits = 1;
  size_t o_bytes = 0, lse_bytes = 0;  // workspace: partial outputs, then their LSEs

  // Splits so that tiles x splits CTAs fill whole waves: the smallest count whose wave
  // efficiency is within 95% of the best, each split keeping at least min_blocks blocks
  // (85% left 13% of an 8-bit B = 1 wave idle: 2-4% slower on an H200).  The cache
  // capacity stands in for the lengths, which live on the device.  tiles: B x Hk x query
  // tiles; wave: CTAs resident at once.
  static int choose_splits(const fmha_decode_params& p, int64_t tiles, int64_t wave, int min_blocks) {
    if (p.num_splits > 0) return std::min(p.num_splits, kMaxDecodeSplits);
    const int64_t capacity = p.block_table ? (int64_t)p.max_pages * p.cache_seqlen : p.cache_seqlen;
    const int max_splits = (int)std::max<int64_t>(1, std::min<int64_t>(kMaxDecodeSplits, (capacity + 15) / 16 / min_blocks));
    std::vector<double> eff(max_splits + 1, 0.0);
    double best = 0.0;
    for (int s = 1; s <= max_splits; ++s) {
      const int64_t ctas = tiles * s, waves = (ctas + wave - 1) / wave;
      eff[s] = (double)ctas / (double)(waves * wave);
      best = std::max(best, eff[s]);
    }
    for (int s = 1; s <= max_splits; ++s)
      if (eff[s] >= 0.95 * best) return s;
    return 1;
  }

  // fp32 queries and empty calls run unsplit (the row-wise kernel has no split-KV).
  static DecodePlan make(const fmha_decode_params& p, int64_t tiles, int64_t wave, int min_blocks) {
    DecodePlan pl;
    if (p.dtype == FMHA_DTYPE_FLOAT32 || p.batch == 0 || p.seqlen_q == 0 || (p.cu_seqlens_q && p.total_q == 0))
      return pl;
    pl.splits = choose_splits(p, tiles, wave, min_blocks);
    if (pl.splits > 1) {
      const size_t rows = (size_t)decode_partial_rows(p) * pl.splits;
      pl.o_bytes = align256(rows * p.head_dim * 4);
      pl.lse_bytes = align256(rows * 4);
    }
    return pl;
  }

  static size_t align256(size_t x) { return (x + 255) / 256 * 256; }
};

}  // namespace fmha
