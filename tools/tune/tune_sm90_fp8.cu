// Times the fp8 (e4m3) forward on the benchmark's shapes (16,384 tokens, width 2048) without
// going through the library's dispatch: the V^T pass (fp8_v_transpose, fwd_fp8.cu) and the
// sm_90a kernel (fwd_sm90_kernel.h) of each candidate tile, together, as a call runs them.
// Build and run on the GPU machine:
//   nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a [-DTUNE_D=128] \
//        -Icsrc -Icsrc/include tools/tune/tune_sm90_fp8.cu csrc/cuda_fmha/tma.cu \
//        csrc/cuda_fmha/fwd_fp8.cu -o /tmp/tune90fp8 && /tmp/tune90fp8
// TUNE_D builds one head dim's candidates only (64, 128 or 256).  -DTUNE_DISPATCHED times,
// instead of the candidates, the tile the library dispatches (FwdSm90Fp8Config), labelled
// by the first argument: built against two trees (-I<tree>/csrc, <tree>/csrc/cuda_fmha/tma.cu
// and fwd_fp8.cu) and run alternately, it compares them call to call, at a few seconds of
// build instead of two wheels.  -DTUNE_CHECKSUM adds a line per shape with a hash of O's bits.
#include <cuda_fp8.h>

#include <vector>

#include "tune_common.h"

#include "cuda_fmha/fwd_fp8.h"
#include "cuda_fmha/fwd_sm90_kernel.h"

using namespace fmha;
using namespace fmha::cuda;
using T = __nv_fp8_e4m3;

struct Buffers {
  T *q, *k, *v;
  __nv_bfloat16* o;
  float* lse;
  void* workspace;
};

// e4m3 values of uniform floats in [-2, 2) from a hash of the index (no NaN encodings).
__global__ void fill8(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = T(((h & 0xFFFF) / 65536.f - 0.5f) * 4.f);
  }
}

template <class K>
void fwd(const char* name, const TrainShape& s, Buffers& buf) {
  if (K::kHeadDim != s.D) return;
  const int B = s.B(), H = s.H();
  fmha_fwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  fmha_problem& pr = p.problem;
  pr.dtype = FMHA_DTYPE_FLOAT8_E4M3;
  pr.batch = B;
  pr.seqlen_q = pr.seqlen_k = s.S;
  pr.num_heads_q = pr.num_heads_k = H;
  pr.head_dim = s.D;
  pr.scale = 1.f / sqrtf((float)s.D);
  pr.window_left = -1;
  pr.window_right = s.causal ? 0 : -1;
  pr.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
  const int64_t row = (int64_t)H * s.D;
  auto view = [&](void* x) { return fmha_tensor{x, (int64_t)s.S * row, row, s.D}; };
  p.q = view(buf.q), p.k = view(buf.k), p.v = view(buf.v), p.out = view(buf.o);
  p.lse = buf.lse;
  p.workspace = buf.workspace;
  p.workspace_size = fwd_fp8_workspace_size(pr);
  const float ms = time_ms([&] {
    fp8_v_transpose(p, 0);
    if (!run_fwd_sm90<K>(p, 0)) std::printf("tensor maps refused\n"), std::exit(1);
  }, 30);
  const double flops = 4.0 * B * H * (double)s.S * s.S * s.D / (s.causal ? 2 : 1);
  std::printf("%-26s S=%-6d D=%-3d %s %8.3f ms %6.1f TFLOP/s\n", name, s.S, s.D, s.causal ? "causal" : "      ", ms,
              flops / ms / 1e9);
#if defined(TUNE_CHECKSUM)
  std::vector<uint16_t> o((size_t)B * s.S * row);
  check_cuda(cudaMemcpy(o.data(), buf.o, o.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  uint64_t h = 1469598103934665603ull;  // FNV-1a over O's 16-bit elements
  for (uint16_t x : o) h = (h ^ x) * 1099511628211ull;
  std::printf("checksum %s S=%d D=%d %s %016llx\n", name, s.S, s.D, s.causal ? "causal" : "full", (unsigned long long)h);
#endif
}

#define FWD(D, M, N) fwd<FwdSm90Traits<T, D, M, N, 2, false>>(#M "x" #N, s, buf)

int main(int argc, char** argv) {
  std::vector<TrainShape> shapes;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true})
      for (int S : {1024, 2048, 4096, 8192, 16384}) shapes.push_back({S, d, causal});
  const size_t elems = (size_t)16384 * 2048;
  Buffers buf;
  uint32_t seed = 1;  // the same inputs in every process (TUNE_CHECKSUM compares two)
  for (T** x : {&buf.q, &buf.k, &buf.v}) {
    check_cuda(cudaMalloc(x, elems), "cudaMalloc");
    fill8<<<1024, 256>>>(*x, elems, 0x9e3779b9u * seed++);
  }
  check_cuda(cudaMalloc(&buf.o, elems * 2), "cudaMalloc");
  check_cuda(cudaMalloc(&buf.lse, (size_t)16384 * 32 * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&buf.workspace, elems + 2048 * 32), "cudaMalloc");  // V^T: >= B x Hk x D x S
  for (const TrainShape& s : shapes) {
#if defined(TUNE_DISPATCHED)
    const char* tag = argc > 1 ? argv[1] : "dispatched";
    if (s.D == 64) fwd<FwdSm90Fp8Config<64, false>>(tag, s, buf);
    if (s.D == 128) fwd<FwdSm90Fp8Config<128, false>>(tag, s, buf);
    if (s.D == 256) fwd<FwdSm90Fp8Config<256, false>>(tag, s, buf);
#else
    (void)argc, (void)argv;
#if !defined(TUNE_D) || TUNE_D == 64
    FWD(64, 128, 128);
    FWD(64, 128, 192);
#endif
#if !defined(TUNE_D) || TUNE_D == 128
    FWD(128, 128, 128);
    FWD(128, 128, 192);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
    FWD(256, 128, 128);
#endif
#endif  // TUNE_DISPATCHED
  }
  return 0;
}
