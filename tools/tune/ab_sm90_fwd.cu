// Times the sm_90a forward as the library dispatches it (FwdSm90Config, plain scores, the long
// tiles where a tile sees kFwdSm90LongKeys keys) on the benchmark's shapes, so that two trees
// can be compared kernel to kernel: build it against each and run them alternately,
//   nvcc -std=c++17 -O3 --use_fast_math -gencode arch=compute_90a,code=sm_90a -I<tree>/csrc \
//        -Icsrc/include -Itools/tune tools/tune/ab_sm90_fwd.cu <tree>/csrc/cuda_fmha/tma.cu -o /tmp/ab_x
//   for r in 1 2; do /tmp/ab_old old; /tmp/ab_new new; done
// (the first argument labels the lines).  tune_sm90.cu times candidate tiles instead.
#include <vector>

#include "tune_common.h"

using namespace fmha;
using namespace fmha::cuda;
using T = __nv_bfloat16;

struct Buffers {
  T *q, *k, *v, *o;
  float* lse;
};

template <class K>
void fwd(const char* tag, int S, bool causal, Buffers& buf) {
  const int D = K::kHeadDim, B = 16384 / S, H = 2048 / D;
  fmha_fwd_params p{};
  p.struct_size = sizeof(p);
  p.device = FMHA_DEVICE_CUDA;
  fmha_problem& pr = p.problem;
  pr.dtype = FMHA_DTYPE_BFLOAT16;
  pr.batch = B;
  pr.seqlen_q = pr.seqlen_k = S;
  pr.num_heads_q = pr.num_heads_k = H;
  pr.head_dim = D;
  pr.scale = 1.f / sqrtf((float)D);
  pr.window_left = -1;
  pr.window_right = causal ? 0 : -1;
  pr.mask_align = FMHA_ALIGN_BOTTOM_RIGHT;
  auto view = [&](T* x) { return fmha_tensor{x, (int64_t)S * H * D, (int64_t)H * D, D}; };
  p.q = view(buf.q), p.k = view(buf.k), p.v = view(buf.v), p.out = view(buf.o);
  p.lse = buf.lse;
  const float ms = time_ms([&] {
    if (!run_fwd_sm90<K>(p, 0)) std::printf("tensor maps refused\n"), std::exit(1);
  }, 30);
  const double flops = 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
  std::printf("%s D=%-3d S=%-6d %s %8.4f ms %6.1f TFLOP/s\n", tag, D, S, causal ? "causal" : "full  ", ms,
              flops / ms / 1e9);
}

// The tile dispatch.cu picks for this shape (tile_keys: seqlen_k, half of it under a mask).
template <int D>
void dispatched(const char* tag, int S, bool causal, Buffers& buf) {
  if (kFwdSm90HasLong<D> && (causal ? S / 2 : S) >= kFwdSm90LongKeys)
    fwd<FwdSm90Config<T, D, false, true>>(tag, S, causal, buf);
  else
    fwd<FwdSm90Config<T, D, false, false>>(tag, S, causal, buf);
}

int main(int argc, char** argv) {
  const char* tag = argc > 1 ? argv[1] : "-";
  const size_t elems = (size_t)16384 * 2048;
  Buffers buf;
  for (T** x : {&buf.q, &buf.k, &buf.v, &buf.o}) {
    check_cuda(cudaMalloc(x, elems * sizeof(T)), "cudaMalloc");
    fill<<<1024, 256>>>(*x, elems, (uint32_t)(uintptr_t)x);
  }
  check_cuda(cudaMalloc(&buf.lse, (size_t)16384 * 32 * 4), "cudaMalloc");
  for (bool causal : {true, false})
    for (int S : {512, 1024, 2048, 4096, 16384}) {
      dispatched<64>(tag, S, causal, buf);
      dispatched<128>(tag, S, causal, buf);
      dispatched<256>(tag, S, causal, buf);
    }
  return 0;
}
