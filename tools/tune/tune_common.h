// What the tuning harnesses (tune_kernels.cu, tune_sm90.cu, tune_sm90_bwd.cu) share: the
// library's device helpers in their simplest form (the harnesses bypass dispatch.cu), the
// training shapes' problem and tensors, random inputs (bf16, or e4m3), and a CUDA-event
// timer.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_fmha/configs.h"
#include "fmha/fmha.h"

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
int wave_slots(const void* kernel, int threads, int smem_bytes) {
  int device = 0, count = 0, ctas = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem_bytes);
  return count * (ctas > 0 ? ctas : 1);
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
  // Self-attention over s: B x S tokens of H heads, causal (bottom-right) or not.
  fmha_problem problem(fmha_dtype dtype) const {
    fmha_problem pr{};
    pr.dtype = dtype;
    pr.batch = B();
    pr.seqlen_q = pr.seqlen_k = S;
    pr.num_heads_q = pr.num_heads_k = H();
    pr.head_dim = D;
    pr.scale = 1.f / sqrtf((float)D);
    pr.window_left = -1;
    pr.window_right = causal ? 0 : -1;
    pr.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
#if defined(TUNE_SOFTCAP)
    pr.softcap = TUNE_SOFTCAP;  // e.g. -DTUNE_SOFTCAP=50.f: tune_sm90.cu then times the score-mod instances
#endif
    return pr;
  }
  // A (B, S, H, D) tensor of the shape's tokens.
  fmha_tensor view(void* x) const { return fmha_tensor{x, (int64_t)S * H() * D, (int64_t)H() * D, D}; }
};

// Uniform values in [-1.7, 1.7) from a hash of the index, in E (bf16, or e4m3).
template <class E>
__global__ void fill(E* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = E(((h & 0xFFFF) / 65536.f - 0.5f) * 3.4f);
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
