// Times the sm_90a backward (bwd_sm90_kernel.h) and, for reference, the forward on the
// benchmark's training shapes (16,384 tokens, width 2048; 1920 at D = 192), device time only: the kernels are
// launched back to back without the library's dispatch or Python, so host overhead does not
// enter.  Build and run on the GPU machine:
//   nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a [-DTUNE_D=128] \
//        -Icsrc -Icsrc/include tools/tune/tune_sm90_bwd.cu csrc/cuda_fmha/tma.cu -o /tmp/tune90b && /tmp/tune90b
// The backward's time is the main kernel's alone (its statistics, the dQ accumulator's
// zeroing and conversion are separate short kernels, the same for any main-kernel design).
// The statistics hold the forward's LSE and D = 0, as before they came by bulk copy, so that
// checksums compare with earlier trees.
// -DTUNE_SCOREMOD times the score-modifier instances instead, with a softcap of 30.
// -DTUNE_CHECKSUM adds a line per shape with a hash of dK's and dV's bits, so that two trees
// whose kernels must compute the same values can be compared bitwise.
// TUNE_S=4096 and TUNE_CAUSAL=0|1 in the environment keep one sequence length and mask (for
// a profiler's launch count).
#include <vector>

#include "tune_common.h"

using namespace fmha;
using namespace fmha::cuda;
using T = __nv_bfloat16;

struct Buffers {
  T *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *stats, *dq_accum;
};

template <int D>
void run(const TrainShape& s, Buffers& buf) {
  if (D != s.D) return;
  const int B = s.B(), H = s.H();
  fmha_problem pr = s.problem(FMHA_DTYPE_BFLOAT16);
#ifdef TUNE_SCOREMOD
  constexpr bool kScoreMod = true;
  pr.softcap = 30.f;
#else
  constexpr bool kScoreMod = false;
#endif
  fmha_fwd_params f{};
  f.struct_size = sizeof(f);
  f.device = FMHA_DEVICE_CUDA;
  f.problem = pr;
  f.q = s.view(buf.q), f.k = s.view(buf.k), f.v = s.view(buf.v), f.out = s.view(buf.o);
  f.lse = buf.lse;
  using Fwd = FwdSm90Config<T, D, kScoreMod>;
  const float fwd_ms = time_ms([&] { run_fwd_sm90<Fwd>(f, 0); }, 30);
  fmha_bwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  p.problem = pr;
  p.q = f.q, p.k = f.k, p.v = f.v, p.out = f.out, p.dout = s.view(buf.dout);
  p.dq = s.view(buf.dq), p.dk = s.view(buf.dk), p.dv = s.view(buf.dv);
  p.lse = buf.lse;
  const size_t stat_floats = (size_t)H * padded_stat_rows(pr);
  bwd_delta_kernel<T><<<dim3(chunk_delta_blocks(pr, true), H, B), kChunkThreads>>>(p, buf.stats + stat_floats, buf.stats,
                                                                                 nullptr, 0);
  check_cuda(cudaMemset(buf.stats + stat_floats, 0, stat_floats * 4), "cudaMemset");
  using Bwd = BwdSm90Config<T, D, kScoreMod>;
  const float bwd_ms = time_ms([&] {
    if (!run_bwd_sm90<Bwd>(p, buf.dq_accum, buf.stats, nullptr, 1, nullptr, 0, 0)) std::printf("tensor maps refused\n"), std::exit(1);
  }, 20);
  const double flops = 4.0 * B * H * (double)s.S * s.S * s.D / (s.causal ? 2 : 1);
  std::printf("S=%-6d D=%-3d %s fwd %7.3f ms %6.1f TFLOP/s  bwd %7.3f ms %6.1f TFLOP/s\n", s.S, s.D,
              s.causal ? "causal" : "      ", fwd_ms, flops / fwd_ms / 1e9, bwd_ms, 2.5 * flops / bwd_ms / 1e9);
#if defined(TUNE_CHECKSUM)
  // dK and dV are each CTA's own sums (no atomics), so two builds that compute alike give the
  // same bits; dQ's order of additions varies from run to run.
  uint64_t h = 1469598103934665603ull;  // FNV-1a over dK's, then dV's, 16-bit elements
  std::vector<uint16_t> host((size_t)B * s.S * H * s.D);
  for (T* x : {buf.dk, buf.dv}) {
    check_cuda(cudaMemcpy(host.data(), x, host.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint16_t e : host) h = (h ^ e) * 1099511628211ull;
  }
  std::printf("checksum S=%d D=%d %s %016llx\n", s.S, s.D, s.causal ? "causal" : "full", (unsigned long long)h);
#endif
}

int main() {
  const char* only_s = std::getenv("TUNE_S");
  const char* only_causal = std::getenv("TUNE_CAUSAL");
  const size_t elems = (size_t)16384 * 2048;
  Buffers buf;
  uint32_t seed = 1;  // the same inputs in every process (TUNE_CHECKSUM compares two)
  for (T** x : {&buf.q, &buf.k, &buf.v, &buf.o, &buf.dout, &buf.dq, &buf.dk, &buf.dv}) {
    check_cuda(cudaMalloc(x, elems * sizeof(T)), "cudaMalloc");
    fill<<<1024, 256>>>(*x, elems, 0x9e3779b9u * seed++);
  }
  check_cuda(cudaMalloc(&buf.lse, (size_t)16384 * 32 * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&buf.stats, (size_t)2 * 16384 * 32 * 4), "cudaMalloc");  // S multiples of 128: no padding
  check_cuda(cudaMalloc(&buf.dq_accum, elems * 4), "cudaMalloc");
  for (int d : {64, 128, 192, 256})
    for (bool causal : {false, true})
      for (int S : {512, 1024, 2048, 4096, 16384}) {
        if ((only_s && S != std::atoi(only_s)) || (only_causal && causal != (std::atoi(only_causal) != 0))) continue;
        const TrainShape s{S, d, causal};
#if !defined(TUNE_D) || TUNE_D == 64
        run<64>(s, buf);
#endif
#if !defined(TUNE_D) || TUNE_D == 128
        run<128>(s, buf);
#endif
#if !defined(TUNE_D) || TUNE_D == 192
        run<192>(s, buf);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
        run<256>(s, buf);
#endif
      }
  return 0;
}
