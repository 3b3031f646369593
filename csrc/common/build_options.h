// What a reduced GPU build leaves out, for the CUDA and HIP dispatch (CMake: FMHA_HEAD_DIMS,
// FMHA_ENABLE_BACKWARD, FMHA_ENABLE_DROPOUT; the full build defines none of
// FMHA_HEAD_DIM_MASK, FMHA_NO_BACKWARD, FMHA_NO_DROPOUT).  A head dim whose kernels are not
// compiled runs on the next larger one that is, as head dims between the kernels' always
// have (a kernel takes any head dim up to its own); a call above the largest built one, a
// backward, or a 16-bit call with dropout in a build without them raises
// FMHA_ERROR_NOT_SUPPORTED.  The CPU backend has no per-head-dim kernels and keeps everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "error.h"

// Bit i set: kHeadDims[i]'s kernels are built (CMake writes it from FMHA_HEAD_DIMS; a mask,
// since nvcc splits a -D value at its commas).
#ifndef FMHA_HEAD_DIM_MASK
#define FMHA_HEAD_DIM_MASK 63
#endif

namespace fmha {

// The head dims with compiled GPU kernels (instances), ascending; the padding rule above picks
// among them.
constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};

constexpr bool head_dim_built(int d) {
  for (int i = 0; i < (int)(sizeof(kHeadDims) / sizeof(kHeadDims[0])); ++i)
    if (kHeadDims[i] == d) return (FMHA_HEAD_DIM_MASK >> i) & 1;
  return false;
}

#ifdef FMHA_NO_BACKWARD
constexpr bool kBuildBackward = false;
#else
constexpr bool kBuildBackward = true;
#endif
#ifdef FMHA_NO_DROPOUT
constexpr bool kBuildDropout = false;
#else
constexpr bool kBuildDropout = true;
#endif

// Whether a tensor-core call takes the dropout kernels; raises for dropout in a build without
// them (the fp32 path keeps its own dropout).
inline bool kernel_dropout(float dropout_p) {
  if (dropout_p > 0.f && !kBuildDropout)
    FMHA_UNSUPPORTED("dropout_p %g: this build of fmha has no dropout kernels for fp16/bf16 (built with "
                     "FMHA_ENABLE_DROPOUT=OFF)",
                     (double)dropout_p);
  return dropout_p > 0.f;
}

// fmha_capabilities.features of a GPU backend in this build.
constexpr uint32_t build_features() {
  return (FMHA_FEATURES_TRAINING | FMHA_FEATURE_DECODE) &
         ~(kBuildBackward ? 0u : FMHA_FEATURE_BACKWARD | FMHA_FEATURE_DETERMINISTIC) &
         ~(kBuildDropout ? 0u : FMHA_FEATURE_DROPOUT);
}

// The kernel head dim a call of head dim d runs on among `dims` (one kernel family's head
// dims, ascending): the smallest built one at least d, or 0 where none is.
template <size_t N>
constexpr int kernel_head_dim(int d, const int (&dims)[N]) {
  for (int hd : dims)
    if (d <= hd && head_dim_built(hd)) return hd;
  return 0;
}

// The largest built head dim of `dims`, for messages (0 if none).
template <size_t N>
constexpr int max_built_head_dim(const int (&dims)[N]) {
  int m = 0;
  for (int hd : dims)
    if (head_dim_built(hd)) m = hd;
  return m;
}

// kernel_head_dim(d, dims), or an error naming the reduced build when it has no kernel.
template <size_t N>
int require_kernel_head_dim(int d, const int (&dims)[N], const char* what) {
  const int hd = kernel_head_dim(d, dims);
  if (hd == 0 && max_built_head_dim(dims) == 0)
    FMHA_UNSUPPORTED("head_dim %d: this build of fmha has no %s kernels (FMHA_HEAD_DIMS leaves out all of their "
                     "head dims)",
                     d, what);
  if (hd == 0)
    FMHA_UNSUPPORTED("head_dim %d: this build's %s kernels stop at head dim %d (FMHA_HEAD_DIMS leaves out the "
                     "larger ones)",
                     d, what, max_built_head_dim(dims));
  return hd;
}

// The decode kernels' head dims (both GPU backends), and the one a call runs on.
constexpr int kDecodeHeadDims[] = {64, 128, 256};
inline int decode_head_dim(int d) { return require_kernel_head_dim(d, kDecodeHeadDims, "decode"); }

namespace detail {
template <int D, class F>
bool call_if_built(F& f) {
  if constexpr (head_dim_built(D)) {
    f(std::integral_constant<int, D>{});
    return true;
  } else {
    return false;
  }
}
}  // namespace detail

// f(std::integral_constant<int, D>{}) for the D of Ds equal to d, if that head dim is built;
// f is never instantiated for the others, whose instances a reduced build does not compile.
// True when f ran.
template <int... Ds, class F>
bool with_head_dim(int d, F&& f) {
  return ((d == Ds && detail::call_if_built<Ds>(f)) || ...);
}

}  // namespace fmha
