// What the tuning harnesses (tune_kernels.cu, tune_sm90.cu) share: the library's device
// helpers in their simplest form (the harnesses bypass dispatch.cu), random bf16 inputs,
// and a CUDA-event timer.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_fmha/configs.h"

namespace fmha {
namespace cuda {
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
int device_cc_major() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}
// TUNE_GRID=pairs makes the sm_90a forward launch one CTA per pair of tiles instead of one
// per multiprocessor.
int device_sm_count() {
  if (const char* g = std::getenv("TUNE_GRID"); g != nullptr && std::string(g) == "pairs") return 1 << 30;
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count;
}
void set_max_smem(const void* kernel, int bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "smem attribute");
}
}  // namespace cuda
}  // namespace fmha

// The benchmark's training shapes for the sm_90a harnesses: 16,384 tokens, width 2048.
struct TrainShape {
  int S, D;
  bool causal;
  int B() const { return 16384 / S; }
  int H() const { return 2048 / D; }
};

// Uniform values in [-1.7, 1.7) from a hash of the index.
__global__ void fill(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = __float2bfloat16(((h & 0xFFFF) / 65536.f - 0.5f) * 3.4f);
  }
}

// Mean time of one call over `reps` back-to-back calls, after three warm-up calls.
template <class F>
float time_ms(F&& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  fmha::cuda::check_cuda(cudaEventSynchronize(b), "run");
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}
