// CPU forward: each work item is a block of kBlockM query rows of one head, which streams
// over its visible keys in blocks of kBlockN with the online softmax of
// csrc/common/softmax.h (FlashAttention, Algorithm 1), fp32 throughout; the tile kernels
// are in tiles.inc (vectorized, one build per instruction set, see isa.h).
#include <cmath>
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
  const KeyRowsF32 keys(pr, p.k), values(pr, p.v);
  const int64_t row_blocks = ceil_div(pr.seqlen_q, block);
  const int64_t items = (int64_t)pr.batch * pr.num_heads_q * row_blocks;
  parallel_for(items, [&](int64_t item) {
    // Later query blocks see more keys under a causal mask: hand them out first.
    const int32_t rb = (int32_t)(row_blocks - 1 - item % row_blocks);
    const int32_t h = (int32_t)((item / row_blocks) % pr.num_heads_q);
    const int32_t b = (int32_t)(item / (row_blocks * pr.num_heads_q));
    const Head hd(pr, b, h);
    const int32_t i0 = rb * block;
    const int32_t i1 = std::min<int32_t>(i0 + block, pr.seqlen_q);
    const int32_t ie = std::min(i1, hd.seq.len_q);  // rows of this block inside the sequence
    float lse_rows[kMaxTileRows];
    if (i0 < ie) {
      FMHA_CPU_ISA_CALL(
          fwd_block, tile_head(hd), keys.rows(hd.seq, hd.hk), keys.stride(), values.rows(hd.seq, hd.hk),
          values.stride(), 0, D, i0, ie - i0,
          [&](int r, float* dst) { load_row(pr.dtype, p.q.data, hd.seq.q_offset(p.q, i0 + r, h), D, dst); },
          [&](int r, const float* src, float lse) {
            store_row(pr.dtype, p.out.data, hd.seq.q_offset(p.out, i0 + r, h), D, src);
            if (p.lse) p.lse[hd.seq.lse_index(pr, i0 + r, h)] = lse;
            lse_rows[r] = lse;
          });
    }
    if (p.probs.data) {
      std::vector<float> q, row;
      for (int32_t i = i0; i < i1; ++i) probs_row(p, hd, keys, i, i < ie ? lse_rows[i - i0] : -INFINITY, q, row);
    }
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
