// Times candidate tile configurations of the forward and backward kernels on one GPU, on
// the benchmark's shapes, without going through the library's dispatch.  Build and run on
// the GPU machine:
//   nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90 [-DTUNE_D=128] -Icsrc -Icsrc/include \
//        tools/tune/tune_kernels.cu -o /tmp/tune && [TUNE_FWD_ONLY=1] /tmp/tune
// TUNE_D builds one head dim's candidates (64, 96, 128 or 256); TUNE_FWD_ONLY skips the
// backward.  To compare two trees, build this file against each (-I<tree>/csrc first) in
// the same call and run the binaries one after the other (docs/tuning.md).
// Numbers only compare configurations with each other; the benchmark (python -m fmha.bench)
// is what compares fmha with its peers.
#include <vector>

#include "tune_common.h"

using namespace fmha;
using namespace fmha::cuda;
using T = __nv_bfloat16;

struct Shape {
  int B, S, H, D;
  bool causal;
};

struct Buffers {
  T *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_accum;
};

fmha_problem problem(const Shape& s) {
  fmha_problem pr{};
  pr.window_left = -1;
  pr.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
  pr.dtype = FMHA_DTYPE_BFLOAT16;
  pr.batch = s.B;
  pr.seqlen_q = pr.seqlen_k = s.S;
  pr.num_heads_q = pr.num_heads_k = s.H;
  pr.head_dim = s.D;
  pr.scale = 1.f / sqrtf((float)s.D);
  pr.window_right = s.causal ? 0 : -1;
  return pr;
}

fmha_tensor view(T* x, const Shape& s) {
  return fmha_tensor{x, (int64_t)s.S * s.H * s.D, (int64_t)s.H * s.D, s.D};
}

double flops_fwd(const Shape& s) { return 4.0 * s.B * s.H * (double)s.S * s.S * s.D / (s.causal ? 2 : 1); }

template <class K>
void fwd(const char* name, const Shape& s, Buffers& buf) {
  if (K::kHeadDim != s.D) return;
  fmha_fwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  p.problem = problem(s);
  p.q = view(buf.q, s), p.k = view(buf.k, s), p.v = view(buf.v, s), p.out = view(buf.o, s);
  p.lse = buf.lse;
  const float ms = time_ms([&] { run_fwd<K>(p, 0); }, 20);
  std::printf("fwd     %-28s B=%-3d S=%-6d D=%-3d %s %8.3f ms %6.1f TFLOP/s\n", name, s.B, s.S, s.D,
              s.causal ? "causal" : "      ", ms, flops_fwd(s) / ms / 1e9);
}

template <class K>
void bwd(const char* name, const Shape& s, Buffers& buf) {
  if (K::kHeadDim != s.D || std::getenv("TUNE_FWD_ONLY") != nullptr) return;
  fmha_bwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  p.problem = problem(s);
  p.q = view(buf.q, s), p.k = view(buf.k, s), p.v = view(buf.v, s), p.out = view(buf.o, s);
  p.dout = view(buf.dout, s), p.dq = view(buf.dq, s), p.dk = view(buf.dk, s), p.dv = view(buf.dv, s);
  p.lse = buf.lse;
  const size_t accum = (size_t)s.B * s.S * s.H * s.D * 4;
  const float ms = time_ms([&] {
    cudaMemsetAsync(buf.dq_accum, 0, accum);
    run_bwd<K>(p, buf.dq_accum, buf.delta, true, 0);
  }, 20);
  std::printf("bwd     %-28s B=%-3d S=%-6d D=%-3d %s %8.3f ms %6.1f TFLOP/s (2.5x fwd flops)\n", name, s.B, s.S,
              s.D, s.causal ? "causal" : "      ", ms, 2.5 * flops_fwd(s) / ms / 1e9);
}

// The shapes use neither softcap nor ALiBi: the forward runs the instance the library picks
// for them (plain where kFwdPlain<D>).
#define FWD(D, M, N, W) fwd<FwdTraits<T, D, M, N, W, false, !kFwdPlain<D>>>("fwd " #M "x" #N " " #W "w", s, buf)
#define BWD(D, M, N, ST) bwd<BwdTraits<T, D, M, N, ST, false, false>>("bwd " #M "x" #N " st" #ST, s, buf)

int main() {
  const std::vector<Shape> shapes = {
      {32, 512, 16, 128, false}, {16, 1024, 16, 128, false}, {8, 2048, 16, 128, false}, {4, 4096, 16, 128, false},
      {32, 512, 16, 128, true},  {16, 1024, 16, 128, true},  {4, 4096, 16, 128, true},  {32, 512, 32, 64, false},
      {16, 1024, 32, 64, false}, {8, 2048, 32, 64, false},   {4, 4096, 32, 64, false},  {32, 512, 32, 64, true},
      {4, 4096, 32, 64, true},   {32, 512, 8, 256, false},   {4, 4096, 8, 256, false},  {32, 512, 8, 256, true},
      {16, 1024, 8, 256, true},  {16, 1024, 16, 96, false},  {4, 4096, 16, 96, false},  {4, 4096, 16, 96, true}};
  const size_t max_elems = (size_t)4 * 4096 * 32 * 64;
  Buffers buf;
  for (T** x : {&buf.q, &buf.k, &buf.v, &buf.o, &buf.dout, &buf.dq, &buf.dk, &buf.dv}) {
    check_cuda(cudaMalloc(x, max_elems * sizeof(T)), "cudaMalloc");
    fill<<<1024, 256>>>(*x, max_elems, (uint32_t)(uintptr_t)x);
  }
  check_cuda(cudaMalloc(&buf.lse, max_elems / 64 * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&buf.delta, max_elems / 64 * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&buf.dq_accum, max_elems * 4), "cudaMalloc");
  cudaMemset(buf.delta, 0, max_elems / 64 * 4);
  // TUNE_D (64, 96, 128 or 256) builds one head dim's candidates only, so that several builds
  // can run side by side.
  for (const Shape& s : shapes) {
#if !defined(TUNE_D) || TUNE_D == 128
    FWD(128, 128, 64, 4);
    FWD(128, 128, 48, 4);
    FWD(128, 128, 32, 4);
    // The forward leaves this shape's LSE in buf.lse for the backward.
    BWD(128, 64, 128, 2);
    BWD(128, 64, 128, 1);
    BWD(128, 64, 64, 1);  // the 99 KB tile (BwdSmallTile)
#endif
#if !defined(TUNE_D) || TUNE_D == 64
    FWD(64, 128, 128, 4);
    FWD(64, 128, 96, 4);
    FWD(64, 128, 64, 4);
    BWD(64, 128, 128, 2);
    BWD(64, 128, 128, 1);
    BWD(64, 64, 64, 1);  // the 99 KB tile (BwdSmallTile)
    BWD(64, 64, 128, 2);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
    FWD(256, 64, 64, 4);
    FWD(256, 128, 64, 8);
    FWD(256, 128, 32, 8);
    BWD(256, 32, 64, 2);
    BWD(256, 64, 64, 1);
#endif
#if !defined(TUNE_D) || TUNE_D == 96
    FWD(96, 128, 64, 4);
    FWD(96, 128, 48, 4);
    BWD(96, 64, 128, 2);
    BWD(96, 64, 128, 1);
#endif
  }
  return 0;
}
