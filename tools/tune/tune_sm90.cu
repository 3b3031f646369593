// Times candidate tiles of the sm_90a forward (fwd_sm90_kernel.h) on the benchmark's shapes
// (16,384 tokens, width 2048), without going through the library's dispatch.  Build and
// run on the GPU machine:
//   nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a [-DTUNE_D=128] \
//        -Icsrc -Icsrc/include tools/tune/tune_sm90.cu csrc/cuda_fmha/tma.cu -o /tmp/tune90 && /tmp/tune90
// TUNE_D builds and times one head dim only (64, 96, 128, 192 or 256), so that several
// builds can run side by side; TUNE_GRID=pairs launches one CTA per pair of tiles instead
// of the persistent grid.  -DTUNE_DISPATCHED times, instead of the candidates, the tiles
// the library dispatches (FwdSm90Config, its long tiles where a tile sees
// FwdSm90Tile::kLongKeys keys), labelled by the first argument: built against two trees (-I<tree>/csrc,
// <tree>/csrc/cuda_fmha/tma.cu) and run alternately, it compares them kernel to kernel.
// -DTUNE_CHECKSUM adds a line per shape with a hash of O's bits (after the timed runs), so
// that two trees whose kernels must compute the same values can be compared bitwise.
// -DTUNE_SOFTCAP=<v> (with -DTUNE_DISPATCHED) gives the problems that softcap and times the
// score-mod instances the library dispatches for it (with -DTUNE_FP8 too).
// -DTUNE_FP8 times the fp8 (e4m3) forward instead, as a call runs it: the V^T pass
// (fp8_v_transpose; add csrc/cuda_fmha/fwd_fp8.cu to the build) and the kernel together,
// its candidates 128- and 192-key blocks at D = 64/128.
// Numbers compare configurations with each other; the benchmark (python -m fmha.bench)
// compares fmha with its peers.
#include <vector>

#if defined(TUNE_FP8)
#include <cuda_fp8.h>
#endif

#include "tune_common.h"

#if defined(TUNE_FP8)
#include "cuda_fmha/fwd_fp8.h"
#endif

using namespace fmha;
using namespace fmha::cuda;
#if defined(TUNE_FP8)
using T = __nv_fp8_e4m3;
constexpr fmha_dtype kDtype = FMHA_DTYPE_FLOAT8_E4M3;
constexpr int kTuneHeadDims[] = {64, 128, 256};
#else
using T = __nv_bfloat16;
constexpr fmha_dtype kDtype = FMHA_DTYPE_BFLOAT16;
constexpr int kTuneHeadDims[] = {64, 96, 128, 192, 256};
#endif

struct Buffers {
  T *q, *k, *v;
  __nv_bfloat16* o;  // bf16 for fp8 too
  float* lse;
  void* workspace;  // fp8's V^T
};

template <class K>
void fwd(const char* name, const TrainShape& s, Buffers& buf) {
  if (K::kHeadDim != s.D) return;
  const int B = s.B(), H = s.H();
  fmha_fwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  p.problem = s.problem(kDtype);
  p.q = s.view(buf.q), p.k = s.view(buf.k), p.v = s.view(buf.v), p.out = s.view(buf.o);
  p.lse = buf.lse;
#if defined(TUNE_FP8)
  p.workspace = buf.workspace, p.workspace_size = fwd_fp8_workspace_size(p.problem);
#endif
  const float ms = time_ms([&] {
#if defined(TUNE_FP8)
    fp8_v_transpose(p, 0);
#endif
    if (!run_fwd_sm90<K>(p, 0)) std::printf("tensor maps refused\n"), std::exit(1);
  }, 30);
  const double flops = 4.0 * B * H * (double)s.S * s.S * s.D / (s.causal ? 2 : 1);
  std::printf("%-26s S=%-6d D=%-3d %s %8.3f ms %6.1f TFLOP/s\n", name, s.S, s.D, s.causal ? "causal" : "      ", ms,
              flops / ms / 1e9);
#if defined(TUNE_CHECKSUM)
  std::vector<uint16_t> o((size_t)B * s.S * H * s.D);
  check_cuda(cudaMemcpy(o.data(), buf.o, o.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  uint64_t h = 1469598103934665603ull;  // FNV-1a over O's 16-bit elements
  for (uint16_t x : o) h = (h ^ x) * 1099511628211ull;
  std::printf("checksum %s S=%d D=%d %s %016llx\n", name, s.S, s.D, s.causal ? "causal" : "full", (unsigned long long)h);
#endif
}

#define FWD(D, M, N, ST) fwd<FwdSm90Traits<T, D, M, N, ST, false, true>>(#M "x" #N " st" #ST, s, buf)
#define FWD_FP8(D, M, N) fwd<FwdSm90Traits<T, D, M, N, 2, false>>(#M "x" #N " fp8", s, buf)
#define FWD_NOPP(D, M, N, ST) fwd<FwdSm90Traits<T, D, M, N, ST, false, false>>(#M "x" #N " st" #ST " nopp", s, buf)
// O through registers (0), the Q buffer (1) or a buffer of its own (2); FWD uses the rule.
#define FWD_O(D, M, N, ST, O) fwd<FwdSm90Traits<T, D, M, N, ST, false, true, O>>(#M "x" #N " st" #ST " O" #O, s, buf)

// The tile dispatch.cu picks for s (tile_keys: seqlen_k, half of it under a mask).
template <int D>
void dispatched(const char* tag, const TrainShape& s, Buffers& buf) {
#if defined(TUNE_SOFTCAP)
  constexpr bool kScoreMod = true;  // the instances dispatch.cu picks for softcap (or ALiBi)
#else
  constexpr bool kScoreMod = false;
#endif
#if defined(TUNE_FP8)
  if (FwdSm90Fp8Tile<D>::kNLong != FwdSm90Fp8Tile<D>::kN && (s.causal ? s.S / 2 : s.S) >= FwdSm90Fp8Tile<D>::kLongKeys)
    fwd<FwdSm90Fp8Config<D, kScoreMod, true>>(tag, s, buf);
  else
    fwd<FwdSm90Fp8Config<D, kScoreMod>>(tag, s, buf);
#else
  if (kFwdSm90HasLong<D> && (s.causal ? s.S / 2 : s.S) >= FwdSm90Tile<D>::kLongKeys)
    fwd<FwdSm90Config<T, D, kScoreMod, true>>(tag, s, buf);
  else
    fwd<FwdSm90Config<T, D, kScoreMod, false>>(tag, s, buf);
#endif
}

int main(int argc, char** argv) {
  std::vector<TrainShape> shapes;
  for (int d : kTuneHeadDims)
#if defined(TUNE_D)
    if (d == TUNE_D)
#endif
    for (bool causal : {false, true})
      for (int S : {512, 1024, 2048, 4096, 8192, 16384}) shapes.push_back({S, d, causal});
  const size_t elems = (size_t)16384 * 2048;
  Buffers buf;
  uint32_t seed = 1;  // the same inputs in every process (TUNE_CHECKSUM compares two)
  for (T** x : {&buf.q, &buf.k, &buf.v}) {
    check_cuda(cudaMalloc(x, elems * sizeof(T)), "cudaMalloc");
    fill<<<1024, 256>>>(*x, elems, 0x9e3779b9u * seed++);
  }
  check_cuda(cudaMalloc(&buf.o, elems * sizeof(__nv_bfloat16)), "cudaMalloc");
  fill<<<1024, 256>>>(buf.o, elems, 0x9e3779b9u * seed++);
  check_cuda(cudaMalloc(&buf.lse, (size_t)16384 * 32 * 4), "cudaMalloc");
  buf.workspace = nullptr;
#if defined(TUNE_FP8)
  check_cuda(cudaMalloc(&buf.workspace, elems), "cudaMalloc");  // V^T: B x Hk x D x S bytes
#endif
  for (const TrainShape& s : shapes) {
#if defined(TUNE_DISPATCHED)
    const char* tag = argc > 1 ? argv[1] : "dispatched";
#if !defined(TUNE_D) || TUNE_D == 64
    if (s.D == 64) dispatched<64>(tag, s, buf);
#endif
#if !defined(TUNE_D) || TUNE_D == 128
    if (s.D == 128) dispatched<128>(tag, s, buf);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
    if (s.D == 256) dispatched<256>(tag, s, buf);
#endif
#if !defined(TUNE_FP8) && (!defined(TUNE_D) || TUNE_D == 96)
    if (s.D == 96) dispatched<96>(tag, s, buf);
#endif
#if !defined(TUNE_FP8) && (!defined(TUNE_D) || TUNE_D == 192)
    if (s.D == 192) dispatched<192>(tag, s, buf);
#endif
#elif defined(TUNE_FP8)
    (void)argc, (void)argv;
#if !defined(TUNE_D) || TUNE_D == 64
    FWD_FP8(64, 128, 128);
    FWD_FP8(64, 128, 192);
    FWD_FP8(64, 128, 256);
#endif
#if !defined(TUNE_D) || TUNE_D == 128
    FWD_FP8(128, 128, 128);
    FWD_FP8(128, 128, 192);
    FWD_FP8(128, 128, 256);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
    FWD_FP8(256, 128, 128);
#endif
#else
#if !defined(TUNE_D) || TUNE_D == 64
    FWD(64, 128, 128, 2);
    FWD(64, 192, 128, 2);
    FWD_NOPP(64, 192, 128, 2);
#endif
#if !defined(TUNE_D) || TUNE_D == 96
    FWD(96, 128, 128, 2);
    FWD_O(96, 128, 128, 2, 1);
#endif
#if !defined(TUNE_D) || TUNE_D == 128
    FWD(128, 128, 128, 2);
    FWD_O(128, 128, 128, 2, 1);
    FWD_O(128, 128, 128, 2, 0);
    FWD(128, 128, 176, 2);
    FWD_NOPP(128, 128, 128, 2);
#endif
#if !defined(TUNE_D) || TUNE_D == 192
    FWD(192, 128, 96, 2);
    FWD(192, 128, 112, 2);
    FWD_NOPP(192, 128, 96, 2);
    FWD_NOPP(192, 128, 112, 2);
#endif
#if !defined(TUNE_D) || TUNE_D == 256
    FWD(256, 128, 80, 2);
    FWD_O(256, 128, 80, 2, 0);
    FWD(256, 128, 64, 2);
    FWD_NOPP(256, 128, 80, 2);
    FWD_NOPP(256, 128, 64, 2);
#endif
#endif  // TUNE_DISPATCHED
  }
  return 0;
}
