// V^T for the fp8 forward (fwd_fp8.h has the layout): one CTA per (128 columns, 128 head-dim
// bytes, KV head, sequence) reads 128 keys' rows of V (16-byte loads along the head dim)
// into shared memory, transposes them there with ldmatrix.trans, two byte permutes and
// stmatrix, and writes the head-dim rows out in 16-byte runs.  A step of one warp moves 16
// keys x 32 head-dim bytes: ldmatrix.trans reads four 8 x 8 matrices of 16-bit pairs (keys
// kb..kb+7 and kb+8..kb+15, head-dim bytes d0..d0+15 and d0+16..d0+31), which leaves lane
// 4j + s holding, for the byte pairs (2j, 2j + 1), keys 2s and 2s + 1 of each 8-key half;
// the permutes make of each pair of halves one head-dim row's four bytes at keys
// kb + {2s, 2s + 1, 2s + 8, 2s + 9}, which are the columns kb + 4s .. kb + 4s + 3 in
// fp8_key_of order, and stmatrix writes them.  Lanes 16-31 swap their two rows of each
// matrix pair, so that the eight rows of one stmatrix matrix are eight consecutive residues
// modulo 8, in different banks (with even rows only, two-way conflicts).  A gather of each
// 16-byte run byte by byte took about 3x the time of its memory traffic (H200, 16k tokens
// of width 2048: 47-52 us a call against 22-30 us).
#include "fwd_fp8.h"

#include "../common/error.h"
#include "../common/sequence.h"
#include "launch.h"
#include "tile/ptx.h"

namespace fmha {
namespace cuda {

namespace {

constexpr int kVtCols = 128, kVtDims = 128, kVtThreads = 256;

__global__ void __launch_bounds__(kVtThreads) fp8_v_transpose_kernel(const __grid_constant__ fmha_fwd_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // stmatrix; the fp8 forward runs on sm_90 only
  constexpr int kPitch = 128 + 16;  // bytes per shared row: eight rows at one column fall in eight bank groups
  __shared__ __align__(16) uint8_t raw[kVtCols][kPitch];  // keys x head-dim bytes
  __shared__ __align__(16) uint8_t vt[kVtDims][kPitch];   // head-dim bytes x columns
  const fmha_problem& pr = p.problem;
  const int parts = (pr.head_dim + kVtDims - 1) / kVtDims;
  const int b = blockIdx.z, hk = blockIdx.y / parts, d_base = blockIdx.y % parts * kVtDims;
  const int d_len = min(pr.head_dim - d_base, kVtDims);  // a multiple of 16 (dispatch)
  const int d_steps = (d_len + 31) / 32;                  // 32-byte column groups the steps cover
  const Sequence seq = Sequence::get(pr, b);
  const int64_t cols = fp8_vt_cols(pr);
  // This sequence's columns [begin, end): its keys, their last group's padding and (varlen)
  // the gap before the next sequence, or for the last one every column to the end, so that
  // every column a tile may read is written (past the end the copy engine reads zeros).
  const int64_t begin = seq.varlen ? fp8_vt_col0(seq.k_row0, b) : 0;
  const int64_t end = seq.varlen && b + 1 < pr.batch ? min(fp8_vt_col0(seq.k_row0 + seq.k_rows, b + 1), cols) : cols;
  const int64_t c0 = begin + (int64_t)blockIdx.x * kVtCols, key0 = c0 - begin;
  if (c0 >= end) return;

  // Rows past the sequence's keys, and the head-dim bytes up to the last step's 32, as 0.
  const uint8_t* src = static_cast<const uint8_t*>(p.v.data) + (seq.varlen ? 0 : (int64_t)b * p.v.batch_stride) +
                       (seq.k_row0 + key0) * p.v.row_stride + (int64_t)hk * p.v.head_stride + d_base;
  const int chunks = d_steps * 2;
  for (int i = threadIdx.x; i < kVtCols * chunks; i += kVtThreads) {
    const int r = i / chunks, c = i % chunks * 16;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + r < seq.k_rows && c < d_len) x = __ldg(reinterpret_cast<const uint4*>(src + r * p.v.row_stride + c));
    *reinterpret_cast<uint4*>(&raw[r][c]) = x;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = lane / 8, r = lane % 8;  // the matrix and row whose address this lane gives
  const bool upper = lane >= 16;         // the lanes that hold rows j >= 4
  const int d_row = 16 * (m >> 1) + 2 * r + ((m & 1) ^ (r >= 4 ? 1 : 0));  // stmatrix's row (m, r)
  for (int step = warp; step < (kVtCols / 16) * d_steps; step += kVtThreads / 32) {
    const int kb = step % (kVtCols / 16) * 16, d0 = step / (kVtCols / 16) * 32;
    uint32_t x[4];
    ldmatrix_x4_trans(x, smem_addr(&raw[kb + 8 * (m & 1) + r][d0 + 16 * (m >> 1)]));
    const uint32_t e0 = __byte_perm(x[0], x[1], 0x6420), o0 = __byte_perm(x[0], x[1], 0x7531);
    const uint32_t e1 = __byte_perm(x[2], x[3], 0x6420), o1 = __byte_perm(x[2], x[3], 0x7531);
    const uint32_t y[4] = {upper ? o0 : e0, upper ? e0 : o0, upper ? o1 : e1, upper ? e1 : o1};
    stmatrix_x4(smem_addr(&vt[d0 + d_row][kb]), y);
  }
  __syncthreads();

  uint8_t* dst = static_cast<uint8_t*>(p.workspace) +
                 ((seq.varlen ? 0 : (int64_t)b) * pr.num_heads_k + hk) * (int64_t)pr.head_dim * cols +
                 (int64_t)d_base * cols + c0;
  constexpr int kRuns = kVtCols / 16;  // 16-byte runs per row
  for (int i = threadIdx.x; i < d_len * kRuns; i += kVtThreads) {
    const int d = i / kRuns, run = i % kRuns * 16;
    if (c0 + run >= end) continue;  // begin, end and runs are multiples of 16: a run is in or out
    *reinterpret_cast<uint4*>(dst + (int64_t)d * cols + run) = *reinterpret_cast<const uint4*>(&vt[d][run]);
  }
#endif
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
  const dim3 grid((unsigned)((span + kVtCols - 1) / kVtCols), pr.num_heads_k * ((pr.head_dim + kVtDims - 1) / kVtDims),
                  pr.batch);
  fp8_v_transpose_kernel<<<grid, kVtThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "fp8_v_transpose_kernel launch");
}

}  // namespace cuda
}  // namespace fmha
