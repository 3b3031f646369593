// CPU forward: each work item is a block of kBlockM query rows of one head, which streams
// over its visible keys in blocks of kBlockN with the online softmax of
// csrc/common/softmax.h (FlashAttention, Algorithm 1), fp32 throughout; the tile kernels
// are in tiles.inc (vectorized, one build per instruction set, see isa.h).
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "../common/backend.h"
#include "head.h"
#include "isa.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

namespace {

// Row i of the optional probability output: softmax probabilities, dropped ones negated.
void probs_row(const fmha_fwd_params& p, const Head& hd, const KeyRowsF32& keys, int32_t i, float lse,
               std::vector<float>& q, std::vector<float>& row) {
  const int D = p.problem.head_dim;
  row.assign((size_t)p.problem.seqlen_k, 0.f);
  if (i < hd.seq.len_q) {
    q.resize(D);
    load_row(p.problem.dtype, p.q.data, hd.seq.q_offset(p.q, i, hd.h), D, q.data());
    const float* k = keys.rows(hd.seq, hd.hk);
    for (int32_t j = hd.key_begin(i); j < hd.key_end(i); ++j) {
      float capped;
      const float s = hd.scores(dot(q.data(), k + j * keys.stride(), D), i, j, &capped);
      const float pr = prob_from_lse(s, lse);
      row[j] = hd.dropout_factor(i, j) == 0.f ? -pr : pr;
    }
  }
  const int64_t off = (int64_t)hd.seq.batch * p.probs.batch_stride + (int64_t)hd.h * p.probs.head_stride +
                      (int64_t)i * p.probs.row_stride;
  store_row(p.problem.dtype, p.probs.data, off, p.problem.seqlen_k, row.data());
}

}  // namespace

void fwd(const fmha_fwd_params& p) {
  const fmha_problem& pr = p.problem;
  const int D = pr.head_dim;
  const int block = tile_rows();
#if FMHA_CPU_X86_SECTIONS
  // bf16 on AMX tiles where the CPU has them (amx.inc), K and V packed by each work item.
  const bool amx = pr.dtype == FMHA_DTYPE_BFLOAT16 && D % 32 == 0 && amx_bf16();
#else
  const bool amx = false;
#endif
  // fp32 rows of K and V for the probability output (the kernels copy their own).
  const fmha_problem none{};
  const KeyRowsF32 keys(p.probs.data ? pr : none, p.k, ThreadScratch::kKeys);
  // A work item is a run of up to kChunk query blocks of one head, which copies the values
  // they see to fp32 once (key_rows_f32); fewer blocks per item where that leaves fewer
  // than two items per thread.  (32 blocks: 1.03-1.04x over 8 at S = 1024, one thread.)
  // fp32 keys are read in place: the score tile reads 8 rows at a time, too few to evict
  // each other, while P V's sweep over 64 value rows does (1.02-1.05x; values in place as
  // well lost 7-12% at S = 1024).
  // Where a block sees more keys than key_chunk (their K and V rows in 256 KB: 256 keys at
  // D = 128), the item's blocks take them a chunk at a time (fwd_blocks_chunked), their
  // states kept between chunks: items of at most 16 blocks then, whose states (32 KB a block
  // at D = 128) stay in L2 as well.  A block's pass over every key at once outgrew L2 (two
  // threads, fp32, D = 128: S = 1024 3.17 -> 3.0 ms, S = 4096 62.7 -> 45.6 ms; chunks of
  // 512 KB gave the same, of 1 MB 48.8 ms at S = 4096 and nothing at 1024).  Not with the
  // probability output, which is for checking.
  // The AMX kernel (fwd_blocks_amx_chunked) takes its keys packed, 4 bytes per key and
  // head-dim element for K and V together, in chunks of 1 MB (2048 keys at D = 128) that
  // start on a whole key tile, where an item sees more.  One thread, bf16, paired runs
  // against packing and sweeping them all: S = 8192, D = 128 1.24-1.27x (causal 1.15-1.17x),
  // S = 4096 at D = 256 1.31-1.32x (1.14-1.17x) and at D = 128 1.04x; chunks of 256 and 512 KB
  // gained as much there but lost 2-8% at S = 2048, whose keys fit 1 MB.
  const int32_t key_chunk =
      amx ? std::max<int32_t>(128, (int32_t)((size_t(1) << 20) / (4 * (size_t)D)) / 128 * 128)
          : std::max<int32_t>(generic::kBlockN, (int32_t)((size_t(256) << 10) / (8 * (size_t)D)) /
                                                    generic::kBlockN * generic::kBlockN);
  const bool long_keys = p.probs.data == nullptr && pr.seqlen_k > key_chunk;
  const int64_t kChunk = long_keys ? 16 : 32;
  const int64_t row_blocks = ceil_div(pr.seqlen_q, block);
  const int64_t heads = (int64_t)pr.batch * pr.num_heads_q;
  int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(kChunk, row_blocks));
  while (chunk > 1 && heads * ceil_div(row_blocks, chunk) < 2 * (int64_t)num_threads()) chunk = (chunk + 1) / 2;
  const int64_t chunks = ceil_div(row_blocks, chunk);
  parallel_for(heads * chunks, [&](int64_t item) {
    // Later query blocks see more keys under a causal mask: a head's chunks go heaviest,
    // lightest, second heaviest, second lightest, ..., so that any run of consecutive items
    // (a thread's share, parallel.cpp) holds about as much work as any other of its length.
    const int64_t turn = item % chunks;
    const int32_t cb = (int32_t)(turn % 2 == 0 ? chunks - 1 - turn / 2 : turn / 2);
    const int32_t h = (int32_t)((item / chunks) % pr.num_heads_q);
    const int32_t b = (int32_t)(item / (chunks * pr.num_heads_q));
    const Head hd(pr, b, h);
    const int32_t rb0 = (int32_t)(cb * chunk), rb1 = (int32_t)std::min<int64_t>(rb0 + chunk, row_blocks);
    // Keys [kb, ke) that the chunk's rows inside the sequence see, as fp32 rows.
    const int32_t ib = rb0 * block, iend = std::min<int32_t>(rb1 * block, hd.seq.len_q);
    const int32_t kb = ib < iend ? hd.geom.key_begin(ib) : 0, ke = ib < iend ? std::max(kb, hd.geom.key_end(iend)) : 0;
    const float* krows = nullptr;
    const float* vrows = nullptr;
    int64_t ks = D, vs = D;
    // Blocks with rows inside the sequence, for the chunked kernels below.
    const int blocks = std::max<int32_t>(0, std::min<int32_t>(rb1, (int32_t)ceil_div(hd.seq.len_q, block)) - rb0);
    auto block_rows = [&](int bl) {
      const int32_t i0 = (rb0 + bl) * block;
      return std::pair<int32_t, int>(i0, std::min<int32_t>(i0 + block, hd.seq.len_q) - i0);
    };
#if FMHA_CPU_X86_SECTIONS
    // The AMX kernel's packs of the keys an item sees (all of [0, ke), or a chunk at a time),
    // made here so that they stay in L2 (packed once per call up front, they took 17% of the
    // bf16 forward at S = 128 and went out to L3 and back).
    avx512::AmxKeys packed;
    const uint16_t* k16 = static_cast<const uint16_t*>(p.k.data);
    const uint16_t* v16 = static_cast<const uint16_t*>(p.v.data);
    // Keys [c0, c1) packed into the item's memory.
    auto pack_keys = [&](int32_t c0, int32_t c1) -> const avx512::AmxKeys& {
      uint32_t* mem = static_cast<uint32_t*>(ThreadScratch::get(ThreadScratch::kItemKeys)
                                                 .reserve(sizeof(uint32_t) * avx512::AmxKeys::words(c1 - c0, D)));
      packed.pack(
          c0, c1 - c0, D, [&](int32_t j) { return k16 + hd.seq.k_offset(p.k, c0 + j, hd.hk); },
          [&](int32_t j) { return v16 + hd.seq.k_offset(p.v, c0 + j, hd.hk); }, mem);
      return packed;
    };
    if (amx && long_keys && ke - kb > key_chunk) {
      avx512::AmxTiles tiles;
      avx512::fwd_blocks_amx_chunked(
          tile_head(hd), D, blocks, block_rows, kb, ke, key_chunk, pack_keys,
          [&](int bl, int r) {
            return static_cast<const uint16_t*>(p.q.data) + hd.seq.q_offset(p.q, block_rows(bl).first + r, h);
          },
          [&](int bl, int r) {
            return static_cast<uint16_t*>(p.out.data) + hd.seq.q_offset(p.out, block_rows(bl).first + r, h);
          },
          [&](int bl, int r, float lse) {
            if (p.lse) p.lse[hd.seq.lse_index(pr, block_rows(bl).first + r, h)] = lse;
          });
      ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
      return;
    }
    if (amx && kb < ke) pack_keys(0, ke);
#endif
    if (!amx && long_keys && ke - kb > key_chunk) {
      // Each block's state (block / 2 lanes a vector).
      float* state = static_cast<float*>(ThreadScratch::get(ThreadScratch::kStates)
                                             .reserve(sizeof(float) * (size_t)blocks * (4 * D + 4) * (block / 2)));
      auto keys_of = [&](int32_t c0, int32_t c1) {
        KeyRowsView kv{nullptr, D, nullptr, D};
        if (pr.dtype == FMHA_DTYPE_FLOAT32) {
          kv.kbase = static_cast<const float*>(p.k.data) + hd.seq.k_offset(p.k, c0, hd.hk);
          kv.ks = p.k.row_stride;
        } else {
          kv.kbase = key_rows_f32(pr, hd.seq, p.k, hd.hk, c0, c1, ThreadScratch::kItemKeys);
        }
        kv.vbase = key_rows_f32(pr, hd.seq, p.v, hd.hk, c0, c1, ThreadScratch::kItemValues);
        return kv;
      };
      auto load_q = [&](int bl, int r, float* dst) {
        load_row(pr.dtype, p.q.data, hd.seq.q_offset(p.q, block_rows(bl).first + r, h), D, dst);
      };
      auto store_out = [&](int bl, int r, const float* src, float lse) {
        const int32_t i = block_rows(bl).first + r;
        store_row(pr.dtype, p.out.data, hd.seq.q_offset(p.out, i, h), D, src);
        if (p.lse) p.lse[hd.seq.lse_index(pr, i, h)] = lse;
      };
      FMHA_CPU_ISA_CALL(fwd_blocks_chunked, tile_head(hd), D, blocks, block_rows, kb, ke, key_chunk, keys_of, state,
                        load_q, store_out);
      ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
      ThreadScratch::get(ThreadScratch::kItemValues).trim(KeyRowsF32::kKeepBytes);
      return;
    }
    if (!amx && kb < ke) {
      if (pr.dtype == FMHA_DTYPE_FLOAT32) {
        krows = static_cast<const float*>(p.k.data) + hd.seq.k_offset(p.k, kb, hd.hk);
        ks = p.k.row_stride;
      } else {
        krows = key_rows_f32(pr, hd.seq, p.k, hd.hk, kb, ke, ThreadScratch::kItemKeys);
      }
      // fp32 values are read in place too where the item sees at most two key tiles (too few
      // sweeps for the rows to evict each other; 1.02-1.05x at S = 128, equal at 256, one
      // thread, paired runs), copied otherwise.
      if (pr.dtype == FMHA_DTYPE_FLOAT32 && ke - kb <= 2 * generic::kBlockN) {
        vrows = static_cast<const float*>(p.v.data) + hd.seq.k_offset(p.v, kb, hd.hk);
        vs = p.v.row_stride;
      } else {
        vrows = key_rows_f32(pr, hd.seq, p.v, hd.hk, kb, ke, ThreadScratch::kItemValues);
      }
    }
#if FMHA_CPU_X86_SECTIONS
    std::optional<avx512::AmxTiles> tiles;  // for fwd_block_amx, once per item
    if (amx) tiles.emplace();
#endif
    // Two blocks a call to fwd_block, which lets them share the key tiles they both see
    // (tiles.inc), one to fwd_block_amx.
    const int32_t step = amx ? 1 : 2;
    for (int32_t rb = rb0; rb < rb1; rb += step) {
      const int32_t i0 = rb * block;
      const int32_t i1 = std::min<int32_t>(std::min(rb + step, rb1) * block, pr.seqlen_q);
      const int32_t ie = std::min(i1, hd.seq.len_q);  // rows of these blocks inside the sequence
      float lse_rows[2 * kMaxTileRows];
      if (i0 < ie) {
        auto load_q = [&](int r, float* dst) { load_row(pr.dtype, p.q.data, hd.seq.q_offset(p.q, i0 + r, h), D, dst); };
        auto store_out = [&](int r, const float* src, float lse) {
          store_row(pr.dtype, p.out.data, hd.seq.q_offset(p.out, i0 + r, h), D, src);
          if (p.lse) p.lse[hd.seq.lse_index(pr, i0 + r, h)] = lse;
          lse_rows[r] = lse;
        };
#if FMHA_CPU_X86_SECTIONS
        if (amx) {
          avx512::fwd_block_amx(
              tile_head(hd), packed, D, i0, ie - i0,
              [&](int r) { return static_cast<const uint16_t*>(p.q.data) + hd.seq.q_offset(p.q, i0 + r, h); },
              [&](int r) { return static_cast<uint16_t*>(p.out.data) + hd.seq.q_offset(p.out, i0 + r, h); },
              [&](int r, float lse) {
                if (p.lse) p.lse[hd.seq.lse_index(pr, i0 + r, h)] = lse;
                lse_rows[r] = lse;
              });
        } else
#endif
        {
          FMHA_CPU_ISA_CALL(fwd_block, tile_head(hd), krows, ks, vrows, vs, kb, D, i0, ie - i0, load_q, store_out);
        }
      }
      if (p.probs.data) {
        std::vector<float> q, row;
        for (int32_t i = i0; i < i1; ++i) probs_row(p, hd, keys, i, i < ie ? lse_rows[i - i0] : -INFINITY, q, row);
      }
    }
    ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
    ThreadScratch::get(ThreadScratch::kItemValues).trim(KeyRowsF32::kKeepBytes);
  });
  if (pr.cu_seqlens_q != nullptr && pr.batch > 0) {
    for (int32_t r : rows_outside_sequences(pr.cu_seqlens_q, pr.batch, pr.total_q)) {
      for (int32_t h = 0; h < pr.num_heads_q; ++h) {
        store_zero_row(pr.dtype, p.out.data, (int64_t)r * p.out.row_stride + (int64_t)h * p.out.head_stride, D);
        if (p.lse) p.lse[(int64_t)h * pr.total_q + r] = -INFINITY;
      }
    }
  }
}

void capabilities(fmha_capabilities* caps) {
  caps->available = 1;
  caps->dtypes = (1u << FMHA_DTYPE_FLOAT32) | (1u << FMHA_DTYPE_FLOAT16) | (1u << FMHA_DTYPE_BFLOAT16);
  caps->max_head_dim = FMHA_MAX_HEAD_DIM;
  caps->features = FMHA_FEATURES_TRAINING | FMHA_FEATURE_DECODE;
  caps->archs[0] = '\0';
}

}  // namespace cpu
}  // namespace fmha
