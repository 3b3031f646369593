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

void bwd(const fmha_bwd_params& p) {
  const fmha_problem& pr = p.problem;
  const int D = pr.head_dim;
  const bool varlen = pr.cu_seqlens_q != nullptr;

  // D_i = dO_i . O_i - dLSE_i, laid out like the LSE, computed by the work item that reads
  // the rows (its query heads' rows, just before its kernel reads dO again): one parallel
  // call where a pass of its own made two (fp32, B = 8, S = 128, H = 2, D = 128, two
  // threads: 1.26-1.30 -> 1.27 ms, level).
  const int64_t lse_size = varlen ? (int64_t)pr.num_heads_q * pr.total_q : (int64_t)pr.batch * pr.num_heads_q * pr.seqlen_q;
  std::vector<float> delta((size_t)lse_size, 0.f);
  const int32_t group = pr.num_heads_q / pr.num_heads_k;

  // dQ, dK, dV: one work item per (sequence, KV head), on its own fp32 copy of K and V, or
  // (bf16 where the CPU has AMX, amx.inc) its own packs of them.
#if FMHA_CPU_X86_SECTIONS
  const bool amx = pr.dtype == FMHA_DTYPE_BFLOAT16 && D % 32 == 0 && amx_bf16();
#else
  const bool amx = false;
#endif
  parallel_for((int64_t)pr.batch * pr.num_heads_k, [&](int64_t item) {
    const int32_t b = (int32_t)(item / pr.num_heads_k), hk = (int32_t)(item % pr.num_heads_k);
    const Sequence seq = Sequence::get(pr, b);
    float o[FMHA_MAX_HEAD_DIM], d_o[FMHA_MAX_HEAD_DIM];
    for (int32_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int32_t i = 0; i < seq.len_q; ++i) {
        load_row(pr.dtype, p.out.data, seq.q_offset(p.out, i, h), D, o);
        load_row(pr.dtype, p.dout.data, seq.q_offset(p.dout, i, h), D, d_o);
        const int64_t idx = seq.lse_index(pr, i, h);
        // A gradient flowing into the LSE adds P * dlse to dS, i.e. subtracts dlse from D.
        delta[(size_t)idx] = dot(o, d_o, D) - (p.dlse ? p.dlse[idx] : 0.f);
      }
    }
#if FMHA_CPU_X86_SECTIONS
    if (amx) {
      avx512::bwd_head_amx(p, b, hk, delta.data());
      ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
      return;
    }
#endif
    const float* keys = key_rows_f32(pr, seq, p.k, hk, 0, seq.k_rows, ThreadScratch::kItemKeys);
    const float* values = key_rows_f32(pr, seq, p.v, hk, 0, seq.k_rows, ThreadScratch::kItemValues);
    FMHA_CPU_ISA_CALL(bwd_head, p, b, hk, keys, D, values, D, delta.data());
    ThreadScratch::get(ThreadScratch::kItemKeys).trim(KeyRowsF32::kKeepBytes);
    ThreadScratch::get(ThreadScratch::kItemValues).trim(KeyRowsF32::kKeepBytes);
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
