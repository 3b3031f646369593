// The fp8 forward's V^T: how fp8_v_transpose_kernel (fwd_fp8.cu) lays V out in the workspace
// and where the sm_90a forward (fwd_sm90_kernel.h) finds a key block of it.  wgmma reads
// 8-bit operands K-major only, so O += P V needs V as (head dim x keys), keys contiguous.
//
// Layout: rows of fp8_vt_cols() bytes, one per (batch, KV head, head-dim index) in that
// order (fixed length), or per (KV head, head-dim index) with every sequence's keys from
// column fp8_vt_col0() (varlen).  Within each 32-key group counted from a sequence's first
// key, column c holds key fp8_key_of(c) of the group; columns past a sequence's keys hold 0.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "fmha/fmha.h"

namespace fmha {
namespace cuda {

// Column c of a 32-key group holds the group's key fp8_key_of(c): the P fragment packed
// from accumulators in place (acc_to_a8, tile/mma.h) has in column 4t + i (+16) the key
// 2t + (i & 1) + 8 (i >> 1) (+16).
__host__ __device__ constexpr int fp8_key_of(int c) {
  return (c & 16) + 2 * ((c % 16) / 4) + (c & 1) + 8 * ((c >> 1) & 1);
}

// Varlen: sequence b's first column, for its first row k_row0 of k and v.  A multiple of 32
// (groups start at the sequence's first key), and sequence b + 1's starts at least 32 past
// sequence b's keys rounded up to 32, so every padded group fits before it.
__host__ __device__ inline int64_t fp8_vt_col0(int64_t k_row0, int b) {
  return (k_row0 + 31) / 32 * 32 + 32 * (int64_t)b;
}

// Bytes per V^T row (a multiple of 32, so rows stay 16-byte aligned for the copy engine).
__host__ __device__ inline int64_t fp8_vt_cols(const fmha_problem& pr) {
  if (pr.cu_seqlens_k != nullptr) return ((int64_t)pr.total_k + 31) / 32 * 32 + 32 * ((int64_t)pr.batch + 1);
  return ((int64_t)pr.seqlen_k + 31) / 32 * 32;
}

// Bytes of the workspace (V^T), 0 for non-fp8 calls.
size_t fwd_fp8_workspace_size(const fmha_problem& pr);

// Writes V^T into p.workspace (launches nothing without keys).
void fp8_v_transpose(const fmha_fwd_params& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace fmha
