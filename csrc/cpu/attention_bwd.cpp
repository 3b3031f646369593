// CPU backward, deterministic by construction: one pass per (sequence, KV head) that takes
// D_i = dO_i . O_i (- dLSE_i) of its rows first, then goes over (query block, key block)
// tiles that recompute P from the saved LSE and accumulate, in a fixed order,
//   dV = sum dropout(P)^T dO,  dK = sum dS^T Q  (over the query heads that share the KV
//   head, so no atomics),  dQ = dS K
// with dS = P * (dP - D), dP = dropout(dO V^T), and the softcap chain rule folded into dS.
// The tile kernels are in tiles.inc (vectorized, one build per instruction set, see isa.h)
// and, for bf16 on AMX, amx.inc.
#include <cmath>
#include <vector>

#include "../common/backend.h"
#include "head.h"
#include "isa.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

size_t bwd_workspace_size(const fmha_bwd_params&) { return 0; }

namespace {

// Whether the backward runs on AMX tiles (bf16 where the CPU has them, amx.inc).
bool bwd_amx(const fmha_problem& pr) {
#if FMHA_CPU_X86_SECTIONS
  return pr.dtype == FMHA_DTYPE_BFLOAT16 && pr.head_dim % 32 == 0 && amx_bf16();
#else
  (void)pr;
  return false;
#endif
}

// One part of the backward of KV head hk of sequence b (BwdPart): on AMX tiles with its own
// packs of the keys and values it reads, or on the vector tiles with fp32 copies of them
// (its own keys for dK and dV alone, all of them for dQ).
void bwd_part(const fmha_bwd_params& p, int32_t b, int32_t hk, const BwdPart& part, const float* delta) {
  const fmha_problem& pr = p.problem;
#if FMHA_CPU_X86_SECTIONS
  if (bwd_amx(pr)) {
    avx512::bwd_head_amx(p, b, hk, part, delta);
    ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
    return;
  }
#endif
  const Sequence seq = Sequence::get(pr, b);
  const int32_t k0 = part.dq ? 0 : part.k_begin, k1 = part.dq ? seq.k_rows : part.k_end;
  const float* keys = key_rows_f32(pr, seq, p.k, hk, k0, k1, ThreadScratch::kItemKeys);
  const float* values = key_rows_f32(pr, seq, p.v, hk, k0, k1, ThreadScratch::kItemValues);
  FMHA_CPU_ISA_CALL(bwd_head, p, b, hk, part, keys, pr.head_dim, values, pr.head_dim, k0, delta);
  ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
  ThreadScratch::get(ThreadScratch::kItemValues).trim(KeyRowsF32::kKeepBytes);
}

// The backward where its (sequence, KV head) pairs are fewer than the threads: each pair's
// keys are cut into ranges for dK and dV, and each query head's rows into ranges for dQ
// (which recompute P and dS: 7 tile products per key tile where the pair's one item does
// 5), all parallel work items.  The same tiles and the same orders of summation as the
// pair's item, so the same result bit for bit, whatever the thread count.  (Two threads,
// fp32 forward + backward at B = 1, H = 1, S = 2048, D = 128: 1.2x.)
void bwd_split(const fmha_bwd_params& p, const float* delta, int threads) {
  const fmha_problem& pr = p.problem;
  const int64_t pairs = (int64_t)pr.batch * pr.num_heads_k, heads = (int64_t)pr.batch * pr.num_heads_q;
  // dQ ranges start on the kernel's row blocks, key ranges on its key-tile grid.
  int32_t block = tile_rows(), kTile = generic::kBlockN;
#if FMHA_CPU_X86_SECTIONS
  if (bwd_amx(pr)) block = avx512::kAmxBwdRows, kTile = avx512::kAmxBwdKeys;
#endif
  const int32_t group = pr.num_heads_q / pr.num_heads_k;
  const int64_t kv_parts = std::max<int64_t>(1, std::min<int64_t>(ceil_div(threads, pairs), ceil_div(pr.seqlen_k, kTile)));
  const int64_t dq_parts = std::max<int64_t>(1, std::min<int64_t>(ceil_div(threads, heads), ceil_div(pr.seqlen_q, block)));
  parallel_for(pairs * kv_parts + heads * dq_parts, [&](int64_t item) {
    if (item < pairs * kv_parts) {
      const int32_t b = (int32_t)(item / kv_parts / pr.num_heads_k), hk = (int32_t)(item / kv_parts % pr.num_heads_k);
      const Sequence seq = Sequence::get(pr, b);
      const int32_t r = (int32_t)(item % kv_parts), k_rows = seq.k_rows;
      const int32_t span = (int32_t)(ceil_div(ceil_div(k_rows, kv_parts), kTile) * kTile);
      const int32_t k_begin = std::min(r * span, k_rows), k_end = std::min(k_begin + span, k_rows);
      if (k_begin < k_end) bwd_part(p, b, hk, BwdPart{k_begin, k_end, false, 0, group, 0, seq.len_q}, delta);
      return;
    }
    item -= pairs * kv_parts;
    const int32_t b = (int32_t)(item / dq_parts / pr.num_heads_q), h = (int32_t)(item / dq_parts % pr.num_heads_q);
    const int32_t r = (int32_t)(item % dq_parts), blocks = (int32_t)ceil_div(Sequence::get(pr, b).len_q, block);
    const int32_t per = (int32_t)ceil_div(blocks, dq_parts);
    const int32_t q_begin = std::min(r * per, blocks) * block, q_end = std::min((r + 1) * per, blocks) * block;
    if (q_begin < q_end)
      bwd_part(p, b, h / group, BwdPart{0, 0, true, h % group, h % group + 1, q_begin, q_end}, delta);
  });
}

}  // namespace

void bwd(const fmha_bwd_params& p) {
  const fmha_problem& pr = p.problem;
  const int D = pr.head_dim;
  const bool varlen = pr.cu_seqlens_q != nullptr;

  // D_i = dO_i . O_i - dLSE_i, laid out like the LSE.
  const int64_t lse_size = varlen ? (int64_t)pr.num_heads_q * pr.total_q : (int64_t)pr.batch * pr.num_heads_q * pr.seqlen_q;
  std::vector<float> delta((size_t)lse_size, 0.f);
  const int32_t group = pr.num_heads_q / pr.num_heads_k;
  auto delta_rows = [&](int32_t b, int32_t h) {  // D_i of query head h of sequence b
    const Sequence seq = Sequence::get(pr, b);
    float o[FMHA_MAX_HEAD_DIM], d_o[FMHA_MAX_HEAD_DIM];
    for (int32_t i = 0; i < seq.len_q; ++i) {
      load_row(pr.dtype, p.out.data, seq.q_offset(p.out, i, h), D, o);
      load_row(pr.dtype, p.dout.data, seq.q_offset(p.dout, i, h), D, d_o);
      const int64_t idx = seq.lse_index(pr, i, h);
      // A gradient flowing into the LSE adds P * dlse to dS, i.e. subtracts dlse from D.
      delta[(size_t)idx] = dot(o, d_o, D) - (p.dlse ? p.dlse[idx] : 0.f);
    }
  };

  // dQ, dK, dV: one work item per (sequence, KV head), on its own fp32 copy of K and V, or
  // (bf16 where the CPU has AMX, amx.inc) its own packs of them; the item takes its query
  // heads' D_i first (one parallel call where a pass of its own made two: fp32, B = 8,
  // S = 128, H = 2, D = 128, two threads, 1.26-1.30 -> 1.27 ms, level).  Where those items
  // are fewer than the threads, their work is split further (bwd_split).
  const int64_t pairs = (int64_t)pr.batch * pr.num_heads_k;
  const int threads = num_threads();
  if (pairs < threads) {
    parallel_for((int64_t)pr.batch * pr.num_heads_q, [&](int64_t item) {
      delta_rows((int32_t)(item / pr.num_heads_q), (int32_t)(item % pr.num_heads_q));
    });
    bwd_split(p, delta.data(), threads);
  } else {
    parallel_for(pairs, [&](int64_t item) {
      const int32_t b = (int32_t)(item / pr.num_heads_k), hk = (int32_t)(item % pr.num_heads_k);
      for (int32_t h = hk * group; h < (hk + 1) * group; ++h) delta_rows(b, h);
      const Sequence seq = Sequence::get(pr, b);
      bwd_part(p, b, hk, BwdPart{0, seq.k_rows, true, 0, group, 0, seq.len_q}, delta.data());
    });
  }

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
