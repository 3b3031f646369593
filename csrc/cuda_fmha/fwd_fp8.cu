// V^T for the fp8 forward (fwd_fp8.h has the layout): one CTA per (128 columns, KV head,
// sequence) reads 128 keys' rows of V (16-byte loads along the head dim) into shared
// memory and writes the columns out in 16-byte runs, each 32-key group in fp8_key_of
// order.  One pass over V: about 1/8 of the forward's time at S = 4k, D = 128 on an H200.
#include "fwd_fp8.h"

#include "../common/error.h"
#include "../common/sequence.h"
#include "launch.h"

namespace fmha {
namespace cuda {

namespace {

constexpr int kVtCols = 128, kVtThreads = 256;

__global__ void __launch_bounds__(kVtThreads) fp8_v_transpose_kernel(const __grid_constant__ fmha_fwd_params p) {
  __shared__ __align__(16) uint8_t tile[kVtCols][FMHA_MAX_HEAD_DIM + 16];  // keys x head dim, rows padded
  const fmha_problem& pr = p.problem;
  const int b = blockIdx.z, hk = blockIdx.y, d_len = pr.head_dim;  // d_len: a multiple of 16 (dispatch)
  const Sequence seq = Sequence::get(pr, b);
  const int64_t cols = fp8_vt_cols(pr);
  // This sequence's columns [begin, end): its keys, their last group's padding and (varlen)
  // the gap before the next sequence, or for the last one every column to the end, so that
  // every column a tile may read is written (past the end the copy engine reads zeros).
  const int64_t begin = seq.varlen ? fp8_vt_col0(seq.k_row0, b) : 0;
  const int64_t end = seq.varlen && b + 1 < pr.batch ? min(fp8_vt_col0(seq.k_row0 + seq.k_rows, b + 1), cols) : cols;
  const int64_t c0 = begin + (int64_t)blockIdx.x * kVtCols, key0 = c0 - begin;
  if (c0 >= end) return;

  const uint8_t* src = static_cast<const uint8_t*>(p.v.data) + (seq.varlen ? 0 : (int64_t)b * p.v.batch_stride) +
                       (seq.k_row0 + key0) * p.v.row_stride + (int64_t)hk * p.v.head_stride;
  const int chunks = d_len / 16;
  for (int i = threadIdx.x; i < kVtCols * chunks; i += kVtThreads) {
    const int r = i / chunks, c = i % chunks * 16;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + r < seq.k_rows) x = __ldg(reinterpret_cast<const uint4*>(src + r * p.v.row_stride + c));
    *reinterpret_cast<uint4*>(&tile[r][c]) = x;
  }
  __syncthreads();

  uint8_t* dst = static_cast<uint8_t*>(p.workspace) +
                 ((seq.varlen ? 0 : (int64_t)b) * pr.num_heads_k + hk) * (int64_t)d_len * cols + c0;
  constexpr int kRuns = kVtCols / 16;  // 16-byte runs per row
  for (int i = threadIdx.x; i < d_len * kRuns; i += kVtThreads) {
    const int d = i / kRuns, run = i % kRuns * 16;
    if (c0 + run >= end) continue;  // begin, end and runs are multiples of 16: a run is in or out
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t x = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = run + 4 * q + e;
        x |= (uint32_t)tile[c / 32 * 32 + fp8_key_of(c % 32)][d] << (8 * e);
      }
      w[q] = x;
    }
    *reinterpret_cast<uint4*>(dst + (int64_t)d * cols + run) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace

size_t fwd_fp8_workspace_size(const fmha_problem& pr) {
  if (pr.dtype != FMHA_DTYPE_FLOAT8_E4M3) return 0;
  const int64_t rows = (pr.cu_seqlens_k != nullptr ? 1 : (int64_t)pr.batch) * pr.num_heads_k * pr.head_dim;
  return (size_t)(rows * fp8_vt_cols(pr));
}

void fp8_v_transpose(const fmha_fwd_params& p, cudaStream_t stream) {
  const fmha_problem& pr = p.problem;
  const bool varlen = pr.cu_seqlens_k != nullptr;
  // Varlen: a sequence spans at most its keys + 95 columns (fp8_vt_col0; the last one runs
  // to the end), and tiles read columns below its first one + seqlen_k rounded up to a block.
  const int64_t span = varlen ? (int64_t)pr.seqlen_k + 96 : fp8_vt_cols(pr);
  if (pr.batch == 0 || (varlen ? pr.total_k : pr.seqlen_k) == 0) return;
  const dim3 grid((unsigned)((span + kVtCols - 1) / kVtCols), pr.num_heads_k, pr.batch);
  fp8_v_transpose_kernel<<<grid, kVtThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "fp8_v_transpose_kernel launch");
}

}  // namespace cuda
}  // namespace fmha
