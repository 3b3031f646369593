// The CUDA backend's entry points: checks what only this backend needs (layout, shared
// memory), then maps runtime values (dtype, head dim, dropout, softcap or ALiBi, determinism) to a
// compiled instance, plus the small kernels around it.  The instances are declared in
// instances/instances.h and compiled one per translation unit.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "../common/backend.h"
#include "../common/error.h"
#include "fwd_fp8.h"
#include "instances/instances.h"
#include "launch.h"
#include "rowwise.h"

namespace fmha {
namespace cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(FMHA_ERROR_DEVICE, format("%s: %s", what, cudaGetErrorString(err)));
}

// An attribute of the current device, read once per device (those used here are positive).
template <cudaDeviceAttr kAttr>
int device_attribute() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device < kMaxDevices && known[device] > 0) return known[device];
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, kAttr, device), "cudaDeviceGetAttribute");
  if (device < kMaxDevices) known[device] = value;
  return value;
}

int device_cc_major() { return device_attribute<cudaDevAttrComputeCapabilityMajor>(); }
int device_smem_optin() { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }
int device_sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

void set_max_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device})) return;
  const int limit = device_smem_optin();
  if (bytes > limit)
    FMHA_UNSUPPORTED("this kernel needs %d KB of shared memory per block, but the GPU allows %d KB (on 99 KB "
                     "GPUs the backward runs head dims up to 192, decode with 16-bit caches up to 128)",
                     bytes / 1024, limit / 1024);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  done.insert({kernel, device});
}

int wave_slots(const void* kernel, int threads, int smem_bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> ctas;  // (kernel, device) -> CTAs per SM
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  auto it = ctas.find({kernel, device});
  if (it == ctas.end()) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes) != cudaSuccess || n < 1) {
      (void)cudaGetLastError();
      n = 1;
    }
    it = ctas.emplace(std::make_pair(kernel, device), n).first;
  }
  return device_sm_count() * it->second;
}

void check_vector_layout(const fmha_tensor& t, const char* name, int head_dim, int elem_bytes) {
  const int vec = 16 / elem_bytes;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || t.row_stride % vec != 0 || t.head_stride % vec != 0 ||
      t.batch_stride % vec != 0)
    FMHA_UNSUPPORTED("the CUDA kernels need %s 16-byte aligned with row, head and batch strides multiple of %d "
                     "elements (got %p, strides %lld, %lld, %lld)",
                     name, vec, t.data, (long long)t.row_stride, (long long)t.head_stride, (long long)t.batch_stride);
  if (head_dim % vec != 0)
    FMHA_UNSUPPORTED("the CUDA kernels need head_dim to be a multiple of %d (got %d); pad the head dimension",
                     vec, head_dim);
}

namespace {

constexpr int kThreadsRow = 32 * kRowWarps;

int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// The mma.sync kernels' head dim for d (the next built one; an error past the largest).
int padded_head_dim(int d) { return require_kernel_head_dim(d, kHeadDims, "CUDA"); }

// The sm_90a forward's and backward's head dims (65-96 run the backward's 128 kernel), and
// the fp8 forward's (unused in builds without sm_90a or the backward).
[[maybe_unused]] constexpr int kSm90FwdHeadDims[] = {64, 96, 128, 192, 256};
[[maybe_unused]] constexpr int kSm90BwdHeadDims[] = {64, 128, 192, 256};
[[maybe_unused]] constexpr int kFp8HeadDims[] = {64, 128, 256};

int64_t q_rows(const fmha_problem& p) {
  return p.cu_seqlens_q ? (int64_t)p.total_q : (int64_t)p.batch * p.seqlen_q;
}
int64_t lse_elems(const fmha_problem& p) { return q_rows(p) * p.num_heads_q; }

// Softcap or ALiBi: the problems the plain instances (compiled without both) cannot run.
bool score_mods(const fmha_problem& p) { return p.softcap > 0.f || p.alibi_slopes != nullptr; }

template <class T, int D, bool kLong>
void fwd_instance(const fmha_fwd_params& p, cudaStream_t s) {
  const bool drop = kernel_dropout(p.problem.dropout_p);
  if constexpr (kFwdPlain<D>) {
    if (!score_mods(p.problem)) {
      if constexpr (kBuildDropout) {
        if (drop) return run_fwd<FwdConfig<T, D, true, kLong, false>>(p, s);
      }
      return run_fwd<FwdConfig<T, D, false, kLong, false>>(p, s);
    }
  }
  if constexpr (kBuildDropout) {
    if (drop) return run_fwd<FwdConfig<T, D, true, kLong>>(p, s);
  }
  run_fwd<FwdConfig<T, D, false, kLong>>(p, s);
}

// Keys a query tile sees, roughly: seqlen_k (max_seqlen_k for varlen) without a mask, half
// of it (the causal average) under a causal or windowed one.  Both forwards take longer key
// blocks above a threshold of it (kFwdLongKeys, FwdSm90Tile::kLongKeys).
int tile_keys(const fmha_problem& pr) {
  const bool masked = pr.window_left >= 0 || pr.window_right >= 0;
  return masked ? pr.seqlen_k / 2 : pr.seqlen_k;
}

template <class T, int D>
void fwd_instance(const fmha_fwd_params& p, cudaStream_t s) {
  if constexpr (FwdTile<D>::kNLong != FwdTile<D>::kN) {
    if (tile_keys(p.problem) >= kFwdLongKeys) return fwd_instance<T, D, true>(p, s);
  }
  fwd_instance<T, D, false>(p, s);
}

// The sm_90a forward (wgmma, TMA) runs on compute capability 9.0 GPUs for every call it
// supports: no dropout, no seqused_k, head dims from 33 up, tensors the copy engine can
// describe.  FMHA_FORCE_MMA_SYNC=1 in the environment sends every call to the mma.sync
// kernels instead (the GPU suite runs both paths; the benchmark compares them).
bool mma_sync_forced() {
  const char* v = std::getenv("FMHA_FORCE_MMA_SYNC");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// The plain sm_90a forward folds the scale into its exp2s without a test (ScoreMod::make's
// kPositiveScale): a scale <= 0 (or NaN) takes the score-mod instance.
template <class T, int D, bool kLong>
bool fwd_sm90_instance(const fmha_fwd_params& p, cudaStream_t s, const FwdSm90Pages* pages) {
  if (score_mods(p.problem) || !(p.problem.scale > 0.f))
    return run_fwd_sm90<FwdSm90Config<T, D, true, kLong>>(p, s, pages);
  return run_fwd_sm90<FwdSm90Config<T, D, false, kLong>>(p, s, pages);
}

// A paged cache keeps the regular tiles: a long tile's key blocks that a page of 256 does not
// divide would be read in boxes of 16 rows from any page (load_pages); D = 128's former
// 176-key blocks ran 1.14x their contiguous time that way at 18k keys (H200) against one box
// of 128 rows per block.  D = 64's 192-row tiles and D = 256's 80-key blocks (also 16-row
// boxes) were not timed on pages.  A paged call without score mods takes the deeper ring
// where its head dim has one (FwdSm90Tile::kPagedStages).
template <class T, int D>
bool fwd_sm90_instance(const fmha_fwd_params& p, cudaStream_t s, const FwdSm90Pages* pages) {
  if constexpr (kFwdSm90HasPaged<D>) {
    if (pages != nullptr && !score_mods(p.problem) && p.problem.scale > 0.f)
      return run_fwd_sm90<FwdSm90PagedConfig<T, D>>(p, s, pages);
  }
  if constexpr (kFwdSm90HasLong<D>) {
    if (pages == nullptr && tile_keys(p.problem) >= FwdSm90Tile<D>::kLongKeys) return fwd_sm90_instance<T, D, true>(p, s, pages);
  }
  return fwd_sm90_instance<T, D, false>(p, s, pages);
}

// True when the sm_90a forward ran the call.  seqused_k only comes with a paged cache, whose
// loads zero the values past each sequence's end (load_pages): the contiguous loads read
// whatever rows follow, and a NaN there would meet P's zeros.
template <class T>
bool fwd_sm90(const fmha_fwd_params& p, cudaStream_t s, const FwdSm90Pages* pages = nullptr) {
#ifdef FMHA_WITH_SM90A
  const fmha_problem& pr = p.problem;
  if (pr.dropout_p > 0.f || (pr.seqused_k != nullptr && pages == nullptr) || pr.head_dim <= 32 ||
      device_cc_major() != 9 || mma_sync_forced())
    return false;
  bool ran = false;
  with_head_dim<64, 96, 128, 192, 256>(kernel_head_dim(pr.head_dim, kSm90FwdHeadDims), [&](auto d) {
    ran = fwd_sm90_instance<T, decltype(d)::value>(p, s, pages);
  });
  return ran;
#else
  (void)p, (void)s, (void)pages;
  return false;
#endif
}

template <class T>
void fwd_tensor_core(const fmha_fwd_params& p, cudaStream_t s) {
  if (fwd_sm90<T>(p, s)) return;
  with_head_dim<32, 64, 96, 128, 192, 256>(padded_head_dim(p.problem.head_dim),
                                           [&](auto d) { fwd_instance<T, decltype(d)::value>(p, s); });
}

// The 99 KB tiles where the device cannot hold the regular ones (or everywhere, in a build
// with FMHA_SMALL_SMEM_BWD_EVERYWHERE, which is how they are tested on an H200).
template <class Big>
bool use_small_bwd() {
#ifdef FMHA_SMALL_SMEM_BWD_EVERYWHERE
  return true;
#else
  return device_smem_optin() < Big::kSmemBytes + (device_cc_major() >= 9 ? Big::kDqSmemBytes : 0);
#endif
}

template <class T, int D, bool kDropout, bool kScoreMod>
void bwd_instance(const fmha_bwd_params& p, float* dq_accum, const float* delta, cudaStream_t s) {
  using Big = BwdConfig<T, D, kDropout, kScoreMod>;
  bool small = false;
  if constexpr (kHasSmallBwd<D>) {
    small = use_small_bwd<Big>();
    if (small) run_bwd<BwdSmallConfig<T, D, kDropout, kScoreMod>>(p, dq_accum, delta, !p.deterministic, s);
  }
  if (!small) run_bwd<Big>(p, dq_accum, delta, !p.deterministic, s);
  if (p.deterministic) run_bwd_dq<BwdDqConfig<T, D, kDropout, kScoreMod>>(p, delta, s);
}

template <class T, int D>
void bwd_features(const fmha_bwd_params& p, float* dq_accum, const float* delta, cudaStream_t s) {
  const bool drop = kernel_dropout(p.problem.dropout_p), mod = score_mods(p.problem);
  if constexpr (kBuildDropout) {
    if (drop && mod) return bwd_instance<T, D, true, true>(p, dq_accum, delta, s);
    if (drop) return bwd_instance<T, D, true, false>(p, dq_accum, delta, s);
  }
  if (mod) return bwd_instance<T, D, false, true>(p, dq_accum, delta, s);
  return bwd_instance<T, D, false, false>(p, dq_accum, delta, s);
}

// The head dim of the sm_90a backward kernel a call runs (0: none built): the padded one,
// but 128 for 65-96 (there is no 96 instance: columns 96-127 of Q, dO, K and V come in as
// zeros from the copy engine and dK, dV, dQ are stored inside head_dim).
int bwd_sm90_head_dim(const fmha_problem& pr) { return kernel_head_dim(pr.head_dim, kSm90BwdHeadDims); }

// Whether the sm_90a backward (wgmma, TMA) takes the call: compute capability 9.0, fp16/bf16,
// head dims 33-256, no dropout or seqused_k, FMHA_FORCE_MMA_SYNC unset.  It runs dK and dV,
// and dQ through the fp32 accumulator, in deterministic mode in a fixed order (dq_locks).
bool bwd_sm90_takes(const fmha_problem& pr) {
#ifdef FMHA_WITH_SM90A
  return pr.dtype != FMHA_DTYPE_FLOAT32 && pr.dropout_p == 0.f && pr.seqused_k == nullptr &&
         padded_head_dim(pr.head_dim) != 32 && bwd_sm90_head_dim(pr) != 0 && device_cc_major() == 9 &&
         !mma_sync_forced();
#else
  (void)pr;
  return false;
#endif
}

// How many CTAs share a KV head's GQA group: 1 (one CTA walks every query head of the
// group, dK and dV summed in registers) unless that leaves fewer than two CTAs per SM, as
// with few KV heads (Llama-style 8:1 groups at batch 1: 4 heads x 32 key blocks = 128 CTAs,
// the causal first blocks walking 8 x 32 query blocks each).  Then the smallest divisor of
// the group that reaches two per SM (or the whole group): each CTA walks its share of the
// query heads and dkv_reduce_kernel sums the shares in a fixed order.
int bwd_sm90_splits(const fmha_problem& pr, int sm_count) {
  const int group = pr.num_heads_q / pr.num_heads_k, block_n = bwd_sm90_block_n(bwd_sm90_head_dim(pr));
  const int64_t ctas = (int64_t)((pr.seqlen_k + block_n - 1) / block_n) * pr.num_heads_k * pr.batch;
  const int64_t target = 2 * (int64_t)sm_count;
  if (group == 1 || ctas == 0 || ctas >= target) return 1;
  for (int s = 2; s < group; ++s)
    if (group % s == 0 && ctas * s >= target) return s;
  return group;
}

// The fp32 dK/dV shares of a split group: [splits][dK, dV][rows][Hk][kernel head dim].
size_t bwd_sm90_dkv_part_bytes(const fmha_problem& pr, int splits) {
  if (splits <= 1) return 0;
  const int64_t rows = pr.cu_seqlens_q != nullptr ? pr.total_k : (int64_t)pr.batch * pr.seqlen_k;
  return (size_t)2 * splits * rows * pr.num_heads_k * bwd_sm90_head_dim(pr) * 4;
}

// Floats per row of the fp32 dQ accumulator: the head dim of the kernel that adds into it.
int dq_accum_cols(const fmha_problem& pr) {
  return bwd_sm90_takes(pr) ? bwd_sm90_head_dim(pr) : padded_head_dim(pr.head_dim);
}

// Deterministic mode's turn counters, after the fp32 dQ accumulator (and zeroed with it): one
// per (sequence, query head, query block of 64 rows; the kernels' blocks are 64 or 128).
int dq_lock_blocks(const fmha_problem& pr) { return (int)ceil_div(pr.seqlen_q, 64); }
size_t dq_lock_bytes(const fmha_problem& pr) {
  return ((size_t)pr.batch * pr.num_heads_q * dq_lock_blocks(pr) * 4 + 15) / 16 * 16;
}
[[maybe_unused]] int* dq_locks(const fmha_problem& pr, float* dq_accum) {
  return reinterpret_cast<int*>(dq_accum + q_rows(pr) * pr.num_heads_q * dq_accum_cols(pr));
}

template <class T, int D>
bool bwd_sm90_instance(const fmha_bwd_params& p, float* dq_accum, const float* stats, float* dkv_part,
                       cudaStream_t s) {
  const fmha_problem& pr = p.problem;
  const int splits = bwd_sm90_splits(pr, device_sm_count());
  int* locks = p.deterministic ? dq_locks(pr, dq_accum) : nullptr;
  if (score_mods(pr))
    return run_bwd_sm90<BwdSm90Config<T, D, true>>(p, dq_accum, stats, dkv_part, splits, locks, dq_lock_blocks(pr), s);
  return run_bwd_sm90<BwdSm90Config<T, D, false>>(p, dq_accum, stats, dkv_part, splits, locks, dq_lock_blocks(pr), s);
}

// True when the sm_90a backward ran the call (stats: its padded statistics).
template <class T>
bool bwd_sm90(const fmha_bwd_params& p, float* dq_accum, const float* stats, float* dkv_part, cudaStream_t s) {
#ifdef FMHA_WITH_SM90A
  if (!bwd_sm90_takes(p.problem)) return false;
  bool ran = false;
  with_head_dim<64, 128, 192, 256>(bwd_sm90_head_dim(p.problem), [&](auto d) {
    ran = bwd_sm90_instance<T, decltype(d)::value>(p, dq_accum, stats, dkv_part, s);
  });
  return ran;
#else
  (void)p, (void)dq_accum, (void)stats, (void)dkv_part, (void)s;
  return false;
#endif
}

// D = dO . O - dLSE (bwd_delta_kernel) into the workspace's first part: in the LSE's layout,
// or `padded`, the sm_90a backward's padded statistics (LSE in log2 units, then D); and the
// accumulator's zeros (`zero_bytes` from `zero`) in the same pass.
template <class T>
void bwd_delta(const fmha_bwd_params& p, float* delta, bool padded, float* zero, size_t zero_bytes, cudaStream_t s) {
  const fmha_problem& pr = p.problem;
  if (pr.seqlen_q == 0 && zero_bytes == 0) return;
  float* lse2 = padded ? delta : nullptr;
  float* d = padded ? delta + pr.num_heads_q * padded_stat_rows(pr) : delta;
  const dim3 grid(chunk_delta_blocks(pr, padded), pr.num_heads_q, pr.batch);
  bwd_delta_kernel<T><<<grid, kChunkThreads, 0, s>>>(p, d, lse2, zero, (int64_t)(zero_bytes / 4));
  check_cuda(cudaGetLastError(), "bwd_delta_kernel launch");
}

// The accumulator's floats per row when dQ is left there (for dq_convert_kernel), else 0:
// always from the sm_90a kernel, from the mma.sync ones unless deterministic (then
// bwd_dq_kernel writes dQ).  `delta` holds the padded statistics where the sm_90a kernel
// takes the call, else D in the LSE's layout.
template <class T>
int bwd_tensor_core(const fmha_bwd_params& p, float* dq_accum, float* delta, float* dkv_part, cudaStream_t s) {
  if (bwd_sm90<T>(p, dq_accum, delta, dkv_part, s)) return bwd_sm90_head_dim(p.problem);
  // Declined after all (tensors the copy engine cannot describe): D again, in the layout the
  // mma.sync kernels read.
  if (bwd_sm90_takes(p.problem)) bwd_delta<T>(p, delta, false, nullptr, 0, s);
  with_head_dim<32, 64, 96, 128, 192, 256>(padded_head_dim(p.problem.head_dim), [&](auto d) {
    bwd_features<T, decltype(d)::value>(p, dq_accum, delta, s);
  });
  return p.deterministic ? 0 : padded_head_dim(p.problem.head_dim);
}

dim3 row_grid(int64_t rows, int heads, int batch) { return dim3(ceil_div(rows, kRowWarps), heads, batch); }

template <class T>
void fwd_typed(const fmha_fwd_params& p, cudaStream_t s) {
  const fmha_problem& pr = p.problem;
  if (pr.batch == 0 || pr.seqlen_q == 0) return;
  if constexpr (sizeof(T) == 4) {
    rowwise_fwd_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kThreadsRow, 0, s>>>(p);
    check_cuda(cudaGetLastError(), "rowwise_fwd_kernel launch");
  } else {
    fwd_tensor_core<T>(p, s);
  }
  if (pr.cu_seqlens_q != nullptr && pr.total_q > 0) {
    zero_outside_kernel<T><<<dim3(ceil_div(pr.total_q, kRowWarps), pr.num_heads_q), kThreadsRow, 0, s>>>(
        p.out, p.lse, pr.cu_seqlens_q, pr.batch, pr.total_q, pr.head_dim);
    check_cuda(cudaGetLastError(), "zero_outside_kernel launch");
  }
  if (p.probs.data != nullptr) {
    probs_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kThreadsRow, 0, s>>>(p);
    check_cuda(cudaGetLastError(), "probs_kernel launch");
  }
}

// Workspace: delta (LSE layout, or the sm_90a backward's padded statistics, which leave room
// for it) then the fp32 dQ accumulator, for the 16-bit kernels but the mma.sync ones in
// deterministic mode, followed there by the turn counters of the sm_90a kernel's
// deterministic dQ.
[[maybe_unused]] size_t delta_bytes(const fmha_problem& p) {
  const size_t floats = bwd_sm90_takes(p) ? 2 * (size_t)p.num_heads_q * padded_stat_rows(p) : (size_t)lse_elems(p);
  return (floats * 4 + 255) / 256 * 256;
}
[[maybe_unused]] size_t dq_accum_bytes(const fmha_bwd_params& p) {
  const fmha_problem& pr = p.problem;
  if (pr.dtype == FMHA_DTYPE_FLOAT32 || (p.deterministic && !bwd_sm90_takes(pr))) return 0;
  return (size_t)q_rows(pr) * pr.num_heads_q * dq_accum_cols(pr) * 4 + (p.deterministic ? dq_lock_bytes(pr) : 0);
}
// After it, for the sm_90a backward with a split GQA group, the fp32 shares of dK and dV.
[[maybe_unused]] size_t dkv_part_bytes(const fmha_bwd_params& p) {
  if (!bwd_sm90_takes(p.problem)) return 0;
  return bwd_sm90_dkv_part_bytes(p.problem, bwd_sm90_splits(p.problem, device_sm_count()));
}

template <class T>
void bwd_typed(const fmha_bwd_params& p, cudaStream_t s) {
  const fmha_problem& pr = p.problem;
  if (pr.batch == 0) return;
  float* delta = static_cast<float*>(p.workspace);
  float* dq_accum = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + delta_bytes(pr));
  bool dq_from_accum = false;  // dQ converted from the accumulator, so written at every row
  if constexpr (sizeof(T) == 4) {
    if (pr.seqlen_q > 0) {
      rowwise_bwd_delta_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kThreadsRow, 0, s>>>(p, delta);
      check_cuda(cudaGetLastError(), "rowwise_bwd_delta_kernel launch");
      rowwise_bwd_dq_kernel<T><<<row_grid(pr.seqlen_q, pr.num_heads_q, pr.batch), kThreadsRow, 0, s>>>(p, delta);
      check_cuda(cudaGetLastError(), "rowwise_bwd_dq_kernel launch");
    }
    if (pr.seqlen_k > 0) {
      rowwise_bwd_dkdv_kernel<T><<<row_grid(pr.seqlen_k, pr.num_heads_k, pr.batch), kThreadsRow, 0, s>>>(p, delta);
      check_cuda(cudaGetLastError(), "rowwise_bwd_dkdv_kernel launch");
    }
  } else {
    // delta, and zeros in the fp32 dQ accumulator (and the turn counters after it), in one pass.
    const size_t accum = dq_accum_bytes(p);
    bwd_delta<T>(p, delta, bwd_sm90_takes(pr), dq_accum, accum, s);
    float* dkv_part = reinterpret_cast<float*>(reinterpret_cast<char*>(dq_accum) + accum);
    const int dq_cols = bwd_tensor_core<T>(p, dq_accum, delta, dkv_part, s);
    dq_from_accum = dq_cols > 0 && accum > 0;
    if (dq_from_accum) {
      const int64_t chunks = q_rows(pr) * pr.num_heads_q * (dq_cols / 8);
      dq_convert_kernel<T><<<ceil_div(chunks, kChunkThreads), kChunkThreads, 0, s>>>(p, dq_accum, q_rows(pr), dq_cols);
      check_cuda(cudaGetLastError(), "dq_convert_kernel launch");
    }
  }
  if (pr.cu_seqlens_q != nullptr) {
    if (!dq_from_accum && pr.total_q > 0) {
      zero_outside_kernel<T><<<dim3(ceil_div(pr.total_q, kRowWarps), pr.num_heads_q), kThreadsRow, 0, s>>>(
          p.dq, nullptr, pr.cu_seqlens_q, pr.batch, pr.total_q, pr.head_dim);
      check_cuda(cudaGetLastError(), "zero_outside_kernel launch");
    }
    if (pr.total_k > 0) {
      for (const fmha_tensor* t : {&p.dk, &p.dv}) {
        zero_outside_kernel<T><<<dim3(ceil_div(pr.total_k, kRowWarps), pr.num_heads_k), kThreadsRow, 0, s>>>(
            *t, nullptr, pr.cu_seqlens_k, pr.batch, pr.total_k, pr.head_dim);
        check_cuda(cudaGetLastError(), "zero_outside_kernel launch");
      }
    }
  }
}

int elem_bytes(fmha_dtype t) { return t == FMHA_DTYPE_FLOAT32 ? 4 : t == FMHA_DTYPE_FLOAT8_E4M3 ? 1 : 2; }

// The fp8 forward: V^T into the workspace, then the sm_90a kernel on e4m3 (head dims up to
// 64, 128 and 256 run the 64, 128 and 256 instances; long key ranges take the long tile,
// FwdSm90Fp8Tile).  It has no mma.sync twin, so FMHA_FORCE_MMA_SYNC does not apply, and
// other GPUs are told so.
template <int D, bool kLong>
bool fwd_fp8_instance(const fmha_fwd_params& p, cudaStream_t s) {
  return score_mods(p.problem) ? run_fwd_sm90<FwdSm90Fp8Config<D, true, kLong>>(p, s)
                               : run_fwd_sm90<FwdSm90Fp8Config<D, false, kLong>>(p, s);
}

template <int D>
void fwd_fp8_instance(const fmha_fwd_params& p, cudaStream_t s) {
  bool ran;
  if constexpr (FwdSm90Fp8Tile<D>::kNLong != FwdSm90Fp8Tile<D>::kN)
    ran = tile_keys(p.problem) >= FwdSm90Fp8Tile<D>::kLongKeys ? fwd_fp8_instance<D, true>(p, s)
                                                                : fwd_fp8_instance<D, false>(p, s);
  else
    ran = fwd_fp8_instance<D, false>(p, s);
  if (!ran)
    FMHA_UNSUPPORTED("the copy engine cannot describe q, k or v of this fp8 call (every stride must be positive "
                     "and below 2^40 bytes)");
}

void fwd_fp8(const fmha_fwd_params& p, cudaStream_t s) {
#ifdef FMHA_WITH_SM90A
  const fmha_problem& pr = p.problem;
  if (device_cc_major() != 9)
    FMHA_UNSUPPORTED("the fp8 forward runs on compute capability 9.0 GPUs (Hopper) only; this one is %d.x",
                     device_cc_major());
  const size_t need = fwd_fp8_workspace_size(pr);
  FMHA_REQUIRE(p.workspace_size >= need && (need == 0 || p.workspace != nullptr),
               "workspace of %zu bytes at %p is too small: fmha_fwd_workspace_size() asks for %zu", p.workspace_size,
               p.workspace, need);
  FMHA_REQUIRE(reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0, "workspace must be 16-byte aligned (got %p)",
               p.workspace);
  if (pr.batch == 0 || pr.seqlen_q == 0 || (pr.cu_seqlens_q != nullptr && pr.total_q == 0)) return;
  const int d = require_kernel_head_dim(pr.head_dim, kFp8HeadDims, "fp8 forward");
  fp8_v_transpose(p, s);
  with_head_dim<64, 128, 256>(d, [&](auto dd) { fwd_fp8_instance<decltype(dd)::value>(p, s); });
  if (pr.cu_seqlens_q != nullptr && pr.total_q > 0) {
    zero_outside_kernel<__nv_bfloat16><<<dim3(ceil_div(pr.total_q, kRowWarps), pr.num_heads_q), kThreadsRow, 0, s>>>(
        p.out, p.lse, pr.cu_seqlens_q, pr.batch, pr.total_q, pr.head_dim);
    check_cuda(cudaGetLastError(), "zero_outside_kernel launch");
  }
#else
  (void)p, (void)s;
  FMHA_UNSUPPORTED("the fp8 forward needs the sm_90a kernels, which this build lacks (FMHA_CUDA_ARCHS without 90)");
#endif
}

}  // namespace

size_t fwd_workspace_size(const fmha_fwd_params& p) { return fwd_fp8_workspace_size(p.problem); }

void fwd(const fmha_fwd_params& p, void* stream) {
  const fmha_problem& pr = p.problem;
  if (pr.dtype == FMHA_DTYPE_FLOAT8_E4M3) {  // e4m3 in, bf16 out
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}})
      check_vector_layout(*t, name, pr.head_dim, 1);
    check_vector_layout(p.out, "out", pr.head_dim, 2);
    return fwd_fp8(p, static_cast<cudaStream_t>(stream));
  }
  if (pr.dtype != FMHA_DTYPE_FLOAT32) {
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}})
      check_vector_layout(*t, name, pr.head_dim, elem_bytes(pr.dtype));
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (pr.dtype) {
    case FMHA_DTYPE_FLOAT16: return fwd_typed<__half>(p, s);
    case FMHA_DTYPE_BFLOAT16: return fwd_typed<__nv_bfloat16>(p, s);
    default: return fwd_typed<float>(p, s);
  }
}

// The packed-query call over a paged cache (flash_attn_varlen_func with block_table: chunked
// prefill, vLLM's one call) as a varlen forward whose sequence b has cache_seqlens[b] keys
// in its pages: the decode kernels split each sequence's keys over CTAs for few query rows,
// which prefill chunks of hundreds of rows waste (5.4-6.9x the contiguous varlen time on an
// H200).  Taken from 64 query rows in some sequence (p.seqlen_q is the longest; a threshold
// not tuned yet) for 16-bit
// caches of q's dtype, head dims from 33 that are multiples of 8, without append, rotary or
// leftpad; the mask aligns bottom-right per sequence as in the decode kernels, and packed
// rows no sequence owns are left as they are.
bool fwd_paged_sm90(const fmha_decode_params& d, cudaStream_t s) {
  if (d.block_table == nullptr || d.cu_seqlens_q == nullptr || d.cache_dtype != d.dtype ||
      d.dtype == FMHA_DTYPE_FLOAT32 || d.seqlen_q < 64 || d.seqlen_new > 0 || d.rotary_dim > 0 ||
      d.cache_leftpad != nullptr || d.head_dim % 8 != 0)
    return false;
  fmha_fwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  fmha_problem& pr = p.problem;
  pr.dtype = d.dtype;
  pr.batch = d.batch;
  pr.seqlen_q = d.seqlen_q;
  pr.seqlen_k = (int32_t)std::min<int64_t>((int64_t)d.max_pages * d.cache_seqlen, INT32_MAX);
  pr.total_q = d.total_q;
  pr.num_heads_q = d.num_heads_q, pr.num_heads_k = d.num_heads_k, pr.head_dim = d.head_dim;
  pr.cu_seqlens_q = d.cu_seqlens_q;
  pr.seqused_k = d.cache_seqlens;  // clamped to seqlen_k, the block table's reach
  pr.scale = d.scale, pr.softcap = d.softcap;
  pr.window_left = d.window_left, pr.window_right = d.window_right;
  pr.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
  pr.alibi_slopes = d.alibi_slopes, pr.alibi_batch_stride = d.alibi_batch_stride;
  p.q = d.q, p.k = d.k_cache, p.v = d.v_cache, p.out = d.out;
  p.lse = d.lse;
  const FwdSm90Pages pages{d.block_table, d.block_table_stride, d.cache_seqlen, d.cache_batch};
  return d.dtype == FMHA_DTYPE_FLOAT16 ? fwd_sm90<__half>(p, s, &pages) : fwd_sm90<__nv_bfloat16>(p, s, &pages);
}

// A build without the backward (FMHA_ENABLE_BACKWARD=OFF) compiles none of its kernels.
#ifdef FMHA_NO_BACKWARD
size_t bwd_workspace_size(const fmha_bwd_params&) {
  FMHA_UNSUPPORTED("this build of fmha has no backward kernels (built with FMHA_ENABLE_BACKWARD=OFF)");
}
void bwd(const fmha_bwd_params& p, void* stream) { (void)bwd_workspace_size(p), (void)stream; }
#else
size_t bwd_workspace_size(const fmha_bwd_params& p) {
  return delta_bytes(p.problem) + dq_accum_bytes(p) + dkv_part_bytes(p);
}

void bwd(const fmha_bwd_params& p, void* stream) {
  const fmha_problem& pr = p.problem;
  if (pr.dtype != FMHA_DTYPE_FLOAT32) {
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}, {&p.dout, "dout"},
                           {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}})
      check_vector_layout(*t, name, pr.head_dim, elem_bytes(pr.dtype));
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (pr.dtype) {
    case FMHA_DTYPE_FLOAT16: return bwd_typed<__half>(p, s);
    case FMHA_DTYPE_BFLOAT16: return bwd_typed<__nv_bfloat16>(p, s);
    default: return bwd_typed<float>(p, s);
  }
}
#endif

void capabilities(fmha_capabilities* caps) {
  caps->available = 1;
  caps->dtypes = (1u << FMHA_DTYPE_FLOAT32) | (1u << FMHA_DTYPE_FLOAT16) | (1u << FMHA_DTYPE_BFLOAT16);
  caps->max_head_dim = max_built_head_dim(kHeadDims);
  caps->features = build_features();
  snprintf(caps->archs, sizeof(caps->archs), "%s", FMHA_CUDA_ARCH_LIST);
}

}  // namespace cuda
}  // namespace fmha
