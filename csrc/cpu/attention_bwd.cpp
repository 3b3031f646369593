// CPU backward, deterministic by construction: D_i = dO_i . O_i (- dLSE_i) first, then two passes that
// each recompute P from the saved LSE --
//   keys pass   (sequence, KV head, block of keys):   dV = sum_i dropout(P)^T dO,
//                                                      dK = sum_i dS^T Q  (over the query heads
//                                                      that share the KV head, so no atomics)
//   queries pass (sequence, query head, block of rows): dQ = dS K
// with dS = P * (dP - D), dP = dropout(dO V^T), and the softcap chain rule folded into dS.
#include <cmath>
#include <vector>

#include "../common/backend.h"
#include "head.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

namespace {

// Row-wise inputs of query row i of one head, in fp32.
struct QueryRow {
  std::vector<float> q, dout;
  float lse = -INFINITY, delta = 0.f;
};

// Gradient of the pre-scale dot product q_i . k_j, and dropout(P)_ij for dV.  Returns false
// when (i, j) contributes nothing.
inline bool grad_entry(const Head& hd, const QueryRow& row, const float* k, const float* v, int32_t i,
                       int32_t j, float* dqk, float* p_dropped) {
  const int D = hd.p.head_dim;
  float capped;
  const float s = hd.scores(dot(row.q.data(), k, D), i, j, &capped);
  const float pij = prob_from_lse(s, row.lse);
  if (pij == 0.f) return false;
  const float z = hd.dropout_factor(i, j);
  *p_dropped = pij * z;
  const float dp = dot(row.dout.data(), v, D) * z;
  *dqk = pij * (dp - row.delta) * hd.score.grad_factor(capped);
  return true;
}

void load_query_row(const fmha_bwd_params& p, const Head& hd, const std::vector<float>& delta, int32_t i,
                    QueryRow& row) {
  const int D = p.problem.head_dim;
  row.q.resize(D);
  row.dout.resize(D);
  load_row(p.problem.dtype, p.q.data, hd.seq.q_offset(p.q, i, hd.h), D, row.q.data());
  load_row(p.problem.dtype, p.dout.data, hd.seq.q_offset(p.dout, i, hd.h), D, row.dout.data());
  const int64_t idx = hd.seq.lse_index(p.problem, i, hd.h);
  row.lse = p.lse[idx];
  row.delta = delta[idx];
}

}  // namespace

size_t bwd_workspace_size(const fmha_bwd_params&) { return 0; }

void bwd(const fmha_bwd_params& p) {
  const fmha_problem& pr = p.problem;
  const int D = pr.head_dim;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  const int32_t group = pr.num_heads_q / pr.num_heads_k;

  // D_i = dO_i . O_i, laid out like the LSE.
  const int64_t lse_size = varlen ? (int64_t)pr.num_heads_q * pr.total_q : (int64_t)pr.batch * pr.num_heads_q * pr.seqlen_q;
  std::vector<float> delta((size_t)lse_size, 0.f);
  parallel_for((int64_t)pr.batch * pr.num_heads_q, [&](int64_t item) {
    const int32_t b = (int32_t)(item / pr.num_heads_q), h = (int32_t)(item % pr.num_heads_q);
    const Sequence seq = Sequence::get(pr, b);
    std::vector<float> o(D), d_o(D);
    for (int32_t i = 0; i < seq.len_q; ++i) {
      load_row(pr.dtype, p.out.data, seq.q_offset(p.out, i, h), D, o.data());
      load_row(pr.dtype, p.dout.data, seq.q_offset(p.dout, i, h), D, d_o.data());
      const int64_t idx = seq.lse_index(pr, i, h);
      // A gradient flowing into the LSE adds P * dlse to dS, i.e. subtracts dlse from D.
      delta[(size_t)idx] = dot(o.data(), d_o.data(), D) - (p.dlse ? p.dlse[idx] : 0.f);
    }
  });

  // Keys pass: dK and dV for a block of keys of one KV head.
  const int64_t key_blocks = ceil_div(pr.seqlen_k, kRowBlock);
  parallel_for((int64_t)pr.batch * pr.num_heads_k * key_blocks, [&](int64_t item) {
    const int32_t kb = (int32_t)(item % key_blocks);
    const int32_t hk = (int32_t)((item / key_blocks) % pr.num_heads_k);
    const int32_t b = (int32_t)(item / (key_blocks * pr.num_heads_k));
    const Sequence seq = Sequence::get(pr, b);
    const int32_t j0 = kb * kRowBlock;
    const int32_t j_rows = std::min<int32_t>(j0 + kRowBlock, seq.k_rows);  // rows of k owned here
    if (j0 >= j_rows) return;
    const int32_t j1 = std::min(j_rows, seq.len_k);  // keys that are attended to
    std::vector<float> dk((size_t)(j_rows - j0) * D, 0.f), dv((size_t)(j_rows - j0) * D, 0.f);
    if (j0 < j1) {
      QueryRow row;
      std::vector<float> K, V;
      for (int32_t g = 0; g < group; ++g) {
        const Head hd(pr, b, hk * group + g);
        if (K.empty()) {
          hd.load_keys(p.k, j0, j1, K);
          hd.load_keys(p.v, j0, j1, V);
        }
        for (int32_t i = hd.geom.query_begin(j0); i < hd.geom.query_end(j1) && i < seq.len_q; ++i) {
          load_query_row(p, hd, delta, i, row);
          const int32_t jb = std::max(j0, hd.key_begin(i)), je = std::min(j1, hd.key_end(i));
          for (int32_t j = jb; j < je; ++j) {
            float dqk, pd;
            const float* k = &K[(size_t)(j - j0) * D];
            const float* v = &V[(size_t)(j - j0) * D];
            if (!grad_entry(hd, row, k, v, i, j, &dqk, &pd)) continue;
            axpy(pd, row.dout.data(), &dv[(size_t)(j - j0) * D], D);
            axpy(dqk, row.q.data(), &dk[(size_t)(j - j0) * D], D);
          }
        }
      }
    }
    for (int32_t j = j0; j < j_rows; ++j) {
      store_row(pr.dtype, p.dk.data, seq.k_offset(p.dk, j, hk), D, &dk[(size_t)(j - j0) * D]);
      store_row(pr.dtype, p.dv.data, seq.k_offset(p.dv, j, hk), D, &dv[(size_t)(j - j0) * D]);
    }
  });

  // Queries pass: dQ for a block of rows of one query head.
  const int64_t row_blocks = ceil_div(pr.seqlen_q, kRowBlock);
  parallel_for((int64_t)pr.batch * pr.num_heads_q * row_blocks, [&](int64_t item) {
    const int32_t rb = (int32_t)(item % row_blocks);
    const int32_t h = (int32_t)((item / row_blocks) % pr.num_heads_q);
    const int32_t b = (int32_t)(item / (row_blocks * pr.num_heads_q));
    const Head hd(pr, b, h);
    const int32_t i0 = rb * kRowBlock, i1 = std::min<int32_t>(i0 + kRowBlock, hd.seq.len_q);
    if (i0 >= i1) return;
    std::vector<float> K, V, dq(D);
    const int32_t k0 = hd.geom.key_begin(i0), k1 = std::max(k0, hd.geom.key_end(i1));
    hd.load_keys(p.k, k0, k1, K);
    hd.load_keys(p.v, k0, k1, V);
    QueryRow row;
    for (int32_t i = i0; i < i1; ++i) {
      load_query_row(p, hd, delta, i, row);
      for (int d = 0; d < D; ++d) dq[d] = 0.f;
      for (int32_t j = hd.key_begin(i); j < hd.key_end(i); ++j) {
        float dqk, pd;
        const float* k = &K[(size_t)(j - k0) * D];
        if (!grad_entry(hd, row, k, &V[(size_t)(j - k0) * D], i, j, &dqk, &pd)) continue;
        axpy(dqk, k, dq.data(), D);
      }
      store_row(pr.dtype, p.dq.data, hd.seq.q_offset(p.dq, i, h), D, dq.data());
    }
  });

  // Varlen rows outside every sequence get zero gradients.
  if (varlen && pr.batch > 0) {
    for (int32_t r : rows_outside_sequences(pr.cu_seqlens_q, pr.batch, pr.total_q))
      for (int32_t h = 0; h < pr.num_heads_q; ++h)
        store_zero_row(pr.dtype, p.dq.data, (int64_t)r * p.dq.row_stride + (int64_t)h * p.dq.head_stride, D);
    for (int32_t r : rows_outside_sequences(pr.cu_seqlens_k, pr.batch, pr.total_k))
      for (int32_t h = 0; h < pr.num_heads_k; ++h) {
        store_zero_row(pr.dtype, p.dk.data, (int64_t)r * p.dk.row_stride + (int64_t)h * p.dk.head_stride, D);
        store_zero_row(pr.dtype, p.dv.data, (int64_t)r * p.dv.row_stride + (int64_t)h * p.dv.head_stride, D);
      }
  }
}

}  // namespace cpu
}  // namespace fmha
