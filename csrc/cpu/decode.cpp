// CPU decode (flash_attn_with_kvcache): append the new keys and values to the cache (keys
// rotated, quantized when the cache is), then each query row (fixed length, or packed by
// cu_seqlens_q: DecodeQuery) attends to its sequence's
// cache through csrc/common/ (kv_cache.h for paging, quant.h, rotary.h, mask geometry) and
// the same online-softmax row as the forward.
#include <cmath>
#include <optional>
#include <vector>

#include "../common/backend.h"
#include "../common/kv_cache.h"
#include "../common/quant.h"
#include "../common/rotary.h"
#include "head.h"
#include "isa.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

namespace {

// Cache row (pos, hk) as fp32, scaled back if quantized.
void load_cache_row(const fmha_decode_params& p, const CacheView& cv, const fmha_tensor& t, const float* scales,
                    int32_t pos, int32_t hk, float* dst) {
  const int D = p.head_dim;
  const int64_t off = cv.offset(t, pos, hk);
  if (!quantized_cache(p)) return load_row(p.dtype, t.data, off, D, dst);
  const float s = scales[cv.scale_index(pos, hk)];
  if (p.cache_dtype == FMHA_DTYPE_FLOAT8_E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(t.data) + off;
    for (int d = 0; d < D; ++d) dst[d] = fp8_e4m3_to_float(src[d]) * s;
  } else {
    const int8_t* src = static_cast<const int8_t*>(t.data) + off;
    for (int d = 0; d < D; ++d) dst[d] = int8_to_float(src[d]) * s;
  }
}

// Writes row (pos, hk); a per-token scale is chosen as max|x| / max representable.
void store_cache_row(const fmha_decode_params& p, const CacheView& cv, const fmha_tensor& t, float* scales,
                     int32_t pos, int32_t hk, const float* src) {
  const int D = p.head_dim;
  const int64_t off = cv.offset(t, pos, hk);
  if (!quantized_cache(p)) return store_row(p.dtype, t.data, off, D, src);
  float s;
  if (p.scaling == FMHA_SCALE_PER_TOKEN) {
    float amax = 0.f;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(src[d]));
    s = amax / quant_max(p.cache_dtype);
    scales[cv.scale_index(pos, hk)] = s;
  } else {
    s = scales[hk];
  }
  const float inv = s > 0.f ? 1.f / s : 0.f;
  if (p.cache_dtype == FMHA_DTYPE_FLOAT8_E4M3) {
    uint8_t* dst = static_cast<uint8_t*>(t.data) + off;
    for (int d = 0; d < D; ++d) dst[d] = float_to_fp8_e4m3(src[d] * inv);
  } else {
    int8_t* dst = static_cast<int8_t*>(t.data) + off;
    for (int d = 0; d < D; ++d) dst[d] = float_to_int8(src[d] * inv);
  }
}

// Rotates the first rotary_dim values of row as position pos.
void rotate(const fmha_decode_params& p, float* row, int32_t pos) {
  if (p.rotary_dim == 0) return;
  const int half = p.rotary_dim / 2;
  std::vector<float> cos_row(half), sin_row(half);
  load_row(p.dtype, p.rotary_cos, (int64_t)pos * half, half, cos_row.data());
  load_row(p.dtype, p.rotary_sin, (int64_t)pos * half, half, sin_row.data());
  apply_rotary(row, cos_row.data(), sin_row.data(), p.rotary_dim, p.rotary_interleaved != 0);
}

// Offset of (b, row, head) in a (B, S, H, D) tensor.
int64_t bshd(const fmha_tensor& t, int32_t b, int32_t row, int32_t h) {
  return (int64_t)b * t.batch_stride + (int64_t)row * t.row_stride + (int64_t)h * t.head_stride;
}

}  // namespace

void decode(const fmha_decode_params& p) {
  const int D = p.head_dim;
  const int32_t group = p.num_heads_q / p.num_heads_k;

  // 1. New keys (rotated) and values go into the cache at cache_seqlens[b] + t.
  if (p.seqlen_new > 0) {
    parallel_for((int64_t)p.batch * p.num_heads_k, [&](int64_t item) {
      const int32_t b = (int32_t)(item / p.num_heads_k), hk = (int32_t)(item % p.num_heads_k);
      const CacheView cv{&p, b};
      const DecodeSequence seq = DecodeSequence::get(p, b);
      std::vector<float> row(D);
      for (int32_t t = 0; t < p.seqlen_new; ++t) {
        const int32_t pos = seq.filled + t;
        load_row(p.dtype, p.k_new.data, bshd(p.k_new, b, t, hk), D, row.data());
        rotate(p, row.data(), pos);
        store_cache_row(p, cv, p.k_cache, p.k_scale, pos, hk, row.data());
        load_row(p.dtype, p.v_new.data, bshd(p.v_new, b, t, hk), D, row.data());
        store_cache_row(p, cv, p.v_cache, p.v_scale, pos, hk, row.data());
      }
    });
  }

  // 2. Every query row against its sequence's keys, cache positions leftpad .. filled + new.
  // A work item takes one (sequence, KV head) and a share of its query heads: it converts
  // (or packs, for AMX) that head's keys and values once, in the thread's scratch, and runs
  // every query row of its heads against them.  Items per (sequence, KV head): enough
  // shares of the group to give every thread one.  (One item per query head, each with
  // fresh fp32 copies of the keys, was 6-7x slower than torch's SDPA at B = 1, L = 1024,
  // 8 query over 2 KV heads: the copies were made `group` times and paged in each time.)
  const bool per_row_positions = p.window_left >= 0 || p.window_right >= 0;  // causal or local
  const int64_t kv_items = (int64_t)p.batch * p.num_heads_k;
  const int32_t shares = (int32_t)std::min<int64_t>(group, ceil_div(num_threads(), kv_items));
  const int32_t heads_per_share = (group + shares - 1) / shares;
  parallel_for(kv_items * shares, [&](int64_t item) {
    const int32_t share = (int32_t)(item % shares);
    const int32_t b = (int32_t)(item / shares / p.num_heads_k), hk = (int32_t)(item / shares % p.num_heads_k);
    const int32_t h_begin = hk * group + share * heads_per_share;
    const int32_t h_end = std::min(h_begin + heads_per_share, (hk + 1) * group);
    if (h_begin >= h_end) return;
    const CacheView cv{&p, b};
    const DecodeSequence seq = DecodeSequence::get(p, b);
    const DecodeQuery dq = DecodeQuery::get(p, b);  // this sequence's query rows (packed or not)
    const int32_t filled = seq.filled, leftpad = seq.leftpad, len_k = seq.len_k, len_q = dq.len;
    if (len_q == 0) return;
    const MaskGeometry geom = MaskGeometry::make(len_q, len_k, p.window_left, p.window_right, false);
    const ScoreParams sp = ScoreParams::make(p.scale, p.softcap);
    const int32_t k0 = geom.key_begin(0), k1 = std::max(k0, geom.key_end(len_q));
    const int block = tile_rows();
#if FMHA_CPU_X86_SECTIONS
    // bf16 caches on AMX tiles when the forward uses them (amx.inc), for the same rows.
    // (Not with rotary: the rotated q is not a bf16 number, and the tiles would round it.)
    const bool amx =
        p.dtype == FMHA_DTYPE_BFLOAT16 && !quantized_cache(p) && p.rotary_dim == 0 && D % 32 == 0 && amx_bf16();
#else
    const bool amx = false;
#endif
    // fp32 keys and values of a contiguous cache are read where they are; others are
    // converted (scaled back, gathered from pages) into fp32 rows once per item.
    const bool in_place = p.dtype == FMHA_DTYPE_FLOAT32 && !quantized_cache(p) && p.block_table == nullptr;
    const float* K = nullptr;
    const float* V = nullptr;
    int64_t ks = D, vs = D;
#if FMHA_CPU_X86_SECTIONS
    avx512::AmxKeys packed;
    std::optional<avx512::AmxTiles> tiles;  // for fwd_block_amx, once per item
    if (amx) tiles.emplace();
    if (amx) {  // rows before k0 are never read: any row will do there
      const uint16_t* kc = static_cast<const uint16_t*>(p.k_cache.data);
      const uint16_t* vc = static_cast<const uint16_t*>(p.v_cache.data);
      uint32_t* mem = static_cast<uint32_t*>(ThreadScratch::get(ThreadScratch::kItemKeys)
                                                 .reserve(sizeof(uint32_t) * avx512::AmxKeys::words(k1, D)));
      packed.pack(
          0, k1, D, [&](int32_t j) { return kc + cv.offset(p.k_cache, leftpad + std::max(j, k0), hk); },
          [&](int32_t j) { return vc + cv.offset(p.v_cache, leftpad + std::max(j, k0), hk); }, mem);
    }
#endif
    if (in_place) {
      K = static_cast<const float*>(p.k_cache.data) + cv.offset(p.k_cache, leftpad + k0, hk);
      V = static_cast<const float*>(p.v_cache.data) + cv.offset(p.v_cache, leftpad + k0, hk);
      ks = p.k_cache.row_stride, vs = p.v_cache.row_stride;
    } else if (!amx) {
      const size_t bytes = sizeof(float) * ((size_t)(k1 - k0) * D + 1);
      float* k_rows = static_cast<float*>(ThreadScratch::get(ThreadScratch::kItemKeys).reserve(bytes));
      float* v_rows = static_cast<float*>(ThreadScratch::get(ThreadScratch::kItemValues).reserve(bytes));
      for (int32_t j = k0; j < k1; ++j) {
        load_cache_row(p, cv, p.k_cache, p.k_scale, leftpad + j, hk, k_rows + (size_t)(j - k0) * D);
        load_cache_row(p, cv, p.v_cache, p.v_scale, leftpad + j, hk, v_rows + (size_t)(j - k0) * D);
      }
      K = k_rows, V = v_rows;
    }
    // One query row per head that sees every key (no ALiBi, no left window, nothing cut on
    // the right, as under a causal mask with one new token): the heads' rows go through the
    // tile kernel together, as rows 0, 1, ... of one head (rows below the first see every
    // key too, so nothing is masked), filling the tile's row lanes that one row per call
    // would leave empty.  Each row's result does not depend on the rows beside it
    // (tiles.inc), so rows stay bit-identical.
    const bool pack_heads = len_q == 1 && p.alibi_slopes == nullptr && p.window_left < 0 && k0 == 0 &&
                            geom.key_end(1) == len_k;
    const int32_t rows_per_head = pack_heads ? 1 : len_q;
    const int32_t step = pack_heads ? block : 1;  // heads per tile-kernel call
    for (int32_t hs = h_begin; hs < h_end; hs += step) {
      const int32_t nh = std::min(step, h_end - hs);
      const float slope = alibi_slope(p, b, hs);
      // The forward's tile kernel, so a decode row equals the same row of flash_attn_func
      // bit for bit.
      const TileHead th{geom, sp, slope, nullptr};
      // Row r of a call: query row i0 + r of head hs, or (packed heads) row 0 of head hs + r.
      auto head = [&](int r) { return pack_heads ? hs + r : hs; };
      auto qrow = [&](int32_t i0, int r) { return pack_heads ? 0 : i0 + r; };
      for (int32_t i0 = 0; i0 < rows_per_head; i0 += block) {
        const int rows = pack_heads ? nh : std::min(block, len_q - i0);
#if FMHA_CPU_X86_SECTIONS
        if (amx) {
          avx512::fwd_block_amx(
              th, packed, D, i0, rows,
              [&](int r) { return static_cast<const uint16_t*>(p.q.data) + dq.offset(p.q, qrow(i0, r), head(r)); },
              [&](int r) { return static_cast<uint16_t*>(p.out.data) + dq.offset(p.out, qrow(i0, r), head(r)); },
              [&](int r, float lse) {
                if (p.lse) p.lse[dq.lse_index(p, head(r), qrow(i0, r))] = lse;
              });
          continue;
        }
#endif
        auto load_q = [&](int r, float* dst) {
          load_row(p.dtype, p.q.data, dq.offset(p.q, qrow(i0, r), head(r)), D, dst);
          rotate(p, dst, filled + (per_row_positions ? qrow(i0, r) : 0));
        };
        auto store_out = [&](int r, const float* src, float lse) {
          store_row(p.dtype, p.out.data, dq.offset(p.out, qrow(i0, r), head(r)), D, src);
          if (p.lse) p.lse[dq.lse_index(p, head(r), qrow(i0, r))] = lse;
        };
        FMHA_CPU_ISA_CALL(fwd_block, th, K, ks, V, vs, k0, D, i0, rows, load_q, store_out);
      }
    }
    ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
    ThreadScratch::get(ThreadScratch::kItemValues).trim(KeyRowsF32::kKeepBytes);
  });
}

}  // namespace cpu
}  // namespace fmha
