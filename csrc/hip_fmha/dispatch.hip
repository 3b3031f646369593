// The HIP backend's entry points: checks what only this backend needs (layout, offsets),
// then maps runtime values (dtype, head dim, dropout, softcap or ALiBi, determinism) to a compiled
// instance, plus the small kernels around it (rowwise.h).  Same semantics and workspace
// contract as the CUDA backend (csrc/cuda_fmha/dispatch.cu).  The instances are declared in
// instances/instances.h and compiled one per translation unit.
#include <hip/hip_runtime.h>

#include <atomic>
#include <cstdio>
#include <utility>

#include "../common/backend.h"
#include "../common/error.h"
#include "instances/instances.h"
#include "launch.h"
#include "rowwise.h"

namespace fmha {
namespace hip {

void check_hip(hipError_t err, const char* what) {
  if (err != hipSuccess) throw Error(FMHA_ERROR_DEVICE, format("%s: %s", what, hipGetErrorString(err)));
}

int device_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  check_hip(hipGetDevice(&device), "hipGetDevice");
  if (device < kMaxDevices && known[device] > 0) return known[device];
  int value = 0;
  check_hip(hipDeviceGetAttribute(&value, hipDeviceAttributeMultiprocessorCount, device), "hipDeviceGetAttribute");
  if (device < kMaxDevices) known[device] = value;
  return value;
}

// The matrix-core kernels read and write 16-byte rows through buffer instructions whose
// offsets are 32-bit (tile/buffer.h): 16-byte aligned pointers, strides and a head dim in
// multiples of 8 elements, and the rows of one tile (at most 128 of 2 bytes) within 2 GB.
// The Python package pads and copies to get there.
void check_vector_layout(const fmha_tensor& t, const char* name, int head_dim, int elem_bytes) {
  const int64_t max_row_stride = (int64_t{1} << 31) / (128 * elem_bytes);
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || t.row_stride % 8 != 0 || t.head_stride % 8 != 0 ||
      t.batch_stride % 8 != 0)
    FMHA_UNSUPPORTED("the HIP kernels need %s 16-byte aligned with row, head and batch strides multiple of 8 "
                     "elements (got %p, strides %lld, %lld, %lld)",
                     name, t.data, (long long)t.row_stride, (long long)t.head_stride, (long long)t.batch_stride);
  if (t.row_stride >= max_row_stride)
    FMHA_UNSUPPORTED("the HIP kernels need %s's row stride below %lld elements (got %lld); make the tensor "
                     "contiguous",
                     name, (long long)max_row_stride, (long long)t.row_stride);
  if (head_dim % 8 != 0)
    FMHA_UNSUPPORTED("the HIP kernels need head_dim to be a multiple of 8 (got %d); pad the head dimension",
                     head_dim);
}

namespace {

int ceil_div64(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// The matrix-core kernels' head dim for d (the next built one; an error past the largest).
int padded_head_dim(int d) { return require_kernel_head_dim(d, kHeadDims, "HIP"); }

int64_t q_rows(const fmha_problem& p) {
  return p.cu_seqlens_q ? (int64_t)p.total_q : (int64_t)p.batch * p.seqlen_q;
}
int64_t lse_elems(const fmha_problem& p) { return q_rows(p) * p.num_heads_q; }

template <class T, int D>
void fwd_instance(const fmha_fwd_params& p, hipStream_t s) {
  const bool drop = kernel_dropout(p.problem.dropout_p);
  if constexpr (kBuildDropout) {
    if (drop) return run_fwd<FwdConfig<T, D, true>>(p, s);
  }
  run_fwd<FwdConfig<T, D, false>>(p, s);
}

template <class T>
void fwd_matrix_core(const fmha_fwd_params& p, hipStream_t s) {
  with_head_dim<32, 64, 96, 128, 192, 256>(padded_head_dim(p.problem.head_dim),
                                           [&](auto d) { fwd_instance<T, decltype(d)::value>(p, s); });
}

template <class T, int D, bool kDropout, bool kScoreMod>
void bwd_instance(const fmha_bwd_params& p, float* dq_accum, const float* delta, hipStream_t s) {
  run_bwd<BwdConfig<T, D, kDropout, kScoreMod>>(p, dq_accum, delta, !p.deterministic, s);
  if (p.deterministic) run_bwd_dq<BwdDqConfig<T, D, kDropout, kScoreMod>>(p, delta, s);
}

template <class T, int D>
void bwd_features(const fmha_bwd_params& p, float* dq_accum, const float* delta, hipStream_t s) {
  const bool drop = kernel_dropout(p.problem.dropout_p), mod = p.problem.softcap > 0.f || p.problem.alibi_slopes;
  if constexpr (kBuildDropout) {
    if (drop && mod) return bwd_instance<T, D, true, true>(p, dq_accum, delta, s);
    if (drop) return bwd_instance<T, D, true, false>(p, dq_accum, delta, s);
  }
  if (mod) return bwd_instance<T, D, false, true>(p, dq_accum, delta, s);
  return bwd_instance<T, D, false, false>(p, dq_accum, delta, s);
}

template <class T>
void bwd_matrix_core(const fmha_bwd_params& p, float* dq_accum, const float* delta, hipStream_t s) {
  with_head_dim<32, 64, 96, 128, 192, 256>(padded_head_dim(p.problem.head_dim), [&](auto d) {
    bwd_features<T, decltype(d)::value>(p, dq_accum, delta, s);
  });
}

dim3 row_grid(int64_t rows, int heads, int batch) { return dim3(ceil_div64(rows, kRowWaves), heads, batch); }

template <class T>
void fwd_typed(const fmha_fwd_params& p, hipStream_t s) {
  const fmha_problem& pr = p.problem;
  if (pr.batch == 0 || pr.seqlen_q == 0) return;
  if constexpr (sizeof(T) == 4) {
    rowwise_fwd_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kRowThreads, 0, s>>>(p);
    check_hip(hipGetLastError(), "rowwise_fwd_kernel launch");
  } else {
    fwd_matrix_core<T>(p, s);
  }
  if (pr.cu_seqlens_q != nullptr && pr.total_q > 0) {
    zero_outside_kernel<T><<<dim3(ceil_div64(pr.total_q, kRowWaves), pr.num_heads_q), kRowThreads, 0, s>>>(
        p.out, p.lse, pr.cu_seqlens_q, pr.batch, pr.total_q, pr.head_dim);
    check_hip(hipGetLastError(), "zero_outside_kernel launch");
  }
  if (p.probs.data != nullptr) {
    probs_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kRowThreads, 0, s>>>(p);
    check_hip(hipGetLastError(), "probs_kernel launch");
  }
}

// Workspace: delta (LSE layout) then, for the atomic dQ path, the fp32 dQ accumulator.
[[maybe_unused]] size_t delta_bytes(const fmha_problem& p) { return ((size_t)lse_elems(p) * 4 + 255) / 256 * 256; }
[[maybe_unused]] size_t dq_accum_bytes(const fmha_bwd_params& p) {
  if (p.problem.dtype == FMHA_DTYPE_FLOAT32 || p.deterministic) return 0;
  return (size_t)q_rows(p.problem) * p.problem.num_heads_q * padded_head_dim(p.problem.head_dim) * 4;
}

template <class T>
void bwd_typed(const fmha_bwd_params& p, hipStream_t s) {
  const fmha_problem& pr = p.problem;
  if (pr.batch == 0) return;
  float* delta = static_cast<float*>(p.workspace);
  float* dq_accum = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + delta_bytes(pr));
  if constexpr (sizeof(T) == 4) {
    if (pr.seqlen_q > 0) {
      rowwise_bwd_delta_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kRowThreads, 0, s>>>(p, delta);
      check_hip(hipGetLastError(), "rowwise_bwd_delta_kernel launch");
      rowwise_bwd_dq_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kRowThreads, 0, s>>>(p, delta);
      check_hip(hipGetLastError(), "rowwise_bwd_dq_kernel launch");
    }
    if (pr.seqlen_k > 0) {
      rowwise_bwd_dkdv_kernel<T><<<row_grid(pr.seqlen_k, pr.num_heads_k, pr.batch), kRowThreads, 0, s>>>(p, delta);
      check_hip(hipGetLastError(), "rowwise_bwd_dkdv_kernel launch");
    }
  } else {
    // delta, and zeros in the fp32 dQ accumulator, in one pass.
    const size_t accum = dq_accum_bytes(p);
    if (pr.seqlen_q > 0 || accum > 0) {
      const dim3 grid(chunk_delta_blocks(pr, false), pr.num_heads_q, pr.batch);
      bwd_delta_kernel<T><<<grid, kChunkThreads, 0, s>>>(p, delta, dq_accum, (int64_t)(accum / 4));
      check_hip(hipGetLastError(), "bwd_delta_kernel launch");
    }
    bwd_matrix_core<T>(p, dq_accum, delta, s);
    if (accum > 0) {
      const int64_t chunks = q_rows(pr) * pr.num_heads_q * (padded_head_dim(pr.head_dim) / 8);
      dq_convert_kernel<T><<<ceil_div64(chunks, kChunkThreads), kChunkThreads, 0, s>>>(p, dq_accum, q_rows(pr),
                                                                                    padded_head_dim(pr.head_dim));
      check_hip(hipGetLastError(), "dq_convert_kernel launch");
    }
  }
  if (pr.cu_seqlens_q != nullptr) {
    const bool dq_written_everywhere = sizeof(T) != 4 && dq_accum_bytes(p) > 0;
    if (!dq_written_everywhere && pr.total_q > 0) {
      zero_outside_kernel<T><<<dim3(ceil_div64(pr.total_q, kRowWaves), pr.num_heads_q), kRowThreads, 0, s>>>(
          p.dq, nullptr, pr.cu_seqlens_q, pr.batch, pr.total_q, pr.head_dim);
      check_hip(hipGetLastError(), "zero_outside_kernel launch");
    }
    if (pr.total_k > 0) {
      for (const fmha_tensor* t : {&p.dk, &p.dv}) {
        zero_outside_kernel<T><<<dim3(ceil_div64(pr.total_k, kRowWaves), pr.num_heads_k), kRowThreads, 0, s>>>(
            *t, nullptr, pr.cu_seqlens_k, pr.batch, pr.total_k, pr.head_dim);
        check_hip(hipGetLastError(), "zero_outside_kernel launch");
      }
    }
  }
}

}  // namespace

void fwd(const fmha_fwd_params& p, void* stream) {
  const fmha_problem& pr = p.problem;
  if (pr.dtype != FMHA_DTYPE_FLOAT32) {
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}})
      check_vector_layout(*t, name, pr.head_dim);
  }
  // The probability output is computed from the LSE the forward writes.
  if (p.probs.data != nullptr && p.lse == nullptr)
    FMHA_UNSUPPORTED("the HIP backend writes probs from the forward's LSE: pass an lse buffer with probs");
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (pr.dtype) {
    case FMHA_DTYPE_FLOAT16: return fwd_typed<f16>(p, s);
    case FMHA_DTYPE_BFLOAT16: return fwd_typed<bf16>(p, s);
    default: return fwd_typed<float>(p, s);
  }
}

// A build without the backward (FMHA_ENABLE_BACKWARD=OFF) compiles none of its kernels.
#ifdef FMHA_NO_BACKWARD
size_t bwd_workspace_size(const fmha_bwd_params&) {
  FMHA_UNSUPPORTED("this build of fmha has no backward kernels (built with FMHA_ENABLE_BACKWARD=OFF)");
}
void bwd(const fmha_bwd_params& p, void* stream) { (void)bwd_workspace_size(p), (void)stream; }
#else
size_t bwd_workspace_size(const fmha_bwd_params& p) { return delta_bytes(p.problem) + dq_accum_bytes(p); }

void bwd(const fmha_bwd_params& p, void* stream) {
  const fmha_problem& pr = p.problem;
  if (pr.dtype != FMHA_DTYPE_FLOAT32) {
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}, {&p.dout, "dout"},
                           {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}})
      check_vector_layout(*t, name, pr.head_dim);
  }
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (pr.dtype) {
    case FMHA_DTYPE_FLOAT16: return bwd_typed<f16>(p, s);
    case FMHA_DTYPE_BFLOAT16: return bwd_typed<bf16>(p, s);
    default: return bwd_typed<float>(p, s);
  }
}
#endif

void capabilities(fmha_capabilities* caps) {
  caps->available = 1;
  caps->dtypes = (1u << FMHA_DTYPE_FLOAT32) | (1u << FMHA_DTYPE_FLOAT16) | (1u << FMHA_DTYPE_BFLOAT16);
  caps->max_head_dim = max_built_head_dim(kHeadDims);
  caps->features = build_features();
  snprintf(caps->archs, sizeof(caps->archs), "%s", FMHA_HIP_ARCH_LIST);
}

}  // namespace hip
}  // namespace fmha
