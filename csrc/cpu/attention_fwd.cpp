// CPU forward: for each query row, stream over its visible keys in blocks of kKeyBlock with
// the online softmax of csrc/common/softmax.h (FlashAttention, Algorithm 1), fp32 throughout.
#include <cmath>
#include <vector>

#include "../common/backend.h"
#include "head.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

namespace {

// Row i of the optional probability output: softmax probabilities, dropped ones negated.
void probs_row(const fmha_fwd_params& p, const Head& hd, const float* q, const std::vector<float>& K,
               int32_t k0, int32_t i, float lse, std::vector<float>& row) {
  const int D = p.problem.head_dim;
  row.assign((size_t)p.problem.seqlen_k, 0.f);
  if (i < hd.seq.len_q) {
    for (int32_t j = hd.key_begin(i); j < hd.key_end(i); ++j) {
      float capped;
      const float s = hd.scores(dot(q, &K[(size_t)(j - k0) * D], D), i, j, &capped);
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
  const int64_t row_blocks = ceil_div(pr.seqlen_q, kRowBlock);
  const int64_t items = (int64_t)pr.batch * pr.num_heads_q * row_blocks;
  parallel_for(items, [&](int64_t item) {
    const int32_t rb = (int32_t)(item % row_blocks);
    const int32_t h = (int32_t)((item / row_blocks) % pr.num_heads_q);
    const int32_t b = (int32_t)(item / (row_blocks * pr.num_heads_q));
    const Head hd(pr, b, h);
    const int32_t i0 = rb * kRowBlock;
    const int32_t i1 = std::min<int32_t>(i0 + kRowBlock, pr.seqlen_q);
    const int32_t ie = std::min(i1, hd.seq.len_q);  // rows of this block inside the sequence
    std::vector<float> K, V, q(D), acc(D), row;
    int32_t k0 = 0;
    if (i0 < ie) {
      k0 = hd.geom.key_begin(i0);
      const int32_t k1 = hd.geom.key_end(ie);
      hd.load_keys(p.k, k0, std::max(k0, k1), K);
      hd.load_keys(p.v, k0, std::max(k0, k1), V);
    }
    for (int32_t i = i0; i < i1; ++i) {
      float lse = -INFINITY;
      if (i < ie) {
        load_row(pr.dtype, p.q.data, hd.seq.q_offset(p.q, i, h), D, q.data());
        attend_row(
            q.data(), K.data(), V.data(), k0, hd.key_begin(i), hd.key_end(i), D,
            [&](float qk, int32_t j) {
              float capped;
              return hd.scores(qk, i, j, &capped);
            },
            [&](int32_t j) { return hd.dropout_factor(i, j); }, acc.data(), &lse);
        store_row(pr.dtype, p.out.data, hd.seq.q_offset(p.out, i, h), D, acc.data());
        if (p.lse) p.lse[hd.seq.lse_index(pr, i, h)] = lse;
      }
      if (p.probs.data) probs_row(p, hd, q.data(), K, k0, i, lse, row);
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
