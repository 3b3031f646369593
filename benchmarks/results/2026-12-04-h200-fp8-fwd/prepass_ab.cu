// Times fp8_v_transpose (fwd_fp8.cu) alone on the fp8 benchmark's shapes, and hashes its
// output: built against two trees and run alternately, it compares them.
#include <cstdio>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
#include "cuda_fmha/fwd_fp8.h"
using namespace fmha::cuda;
int main(int argc, char** argv) {
  const char* tag = argc > 1 ? argv[1] : "x";
  for (int D : {64, 128, 256}) for (int S : {1024, 4096, 16384}) {
    const int H = 2048 / D, B = 16384 / S;
    fmha_fwd_params p{};
    p.struct_size = sizeof(p);
    fmha_problem& pr = p.problem;
    pr.dtype = FMHA_DTYPE_FLOAT8_E4M3; pr.batch = B; pr.seqlen_q = pr.seqlen_k = S;
    pr.num_heads_q = pr.num_heads_k = H; pr.head_dim = D; pr.scale = 1.f; pr.window_left = pr.window_right = -1;
    const size_t n = (size_t)B * S * H * D;
    uint8_t* v; cudaMalloc(&v, n);
    std::vector<uint8_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = (uint8_t)((i * 2654435761u) >> 13);
    cudaMemcpy(v, h.data(), n, cudaMemcpyHostToDevice);
    p.v = fmha_tensor{v, (int64_t)S * H * D, (int64_t)H * D, D};
    const size_t ws = fwd_fp8_workspace_size(pr);
    void* w; cudaMalloc(&w, ws); cudaMemset(w, 0, ws);
    p.workspace = w; p.workspace_size = ws;
    for (int i = 0; i < 3; ++i) fp8_v_transpose(p, 0);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(a);
      for (int i = 0; i < 20; ++i) fp8_v_transpose(p, 0);
      cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms / 20);
    }
    std::sort(t.begin(), t.end());
    std::vector<uint8_t> o(ws);
    cudaMemcpy(o.data(), w, ws, cudaMemcpyDeviceToHost);
    unsigned long long hsh = 1469598103934665603ull;
    for (uint8_t x : o) hsh = (hsh ^ x) * 1099511628211ull;
    std::printf("%s D=%d S=%d %8.2f us %7.1f GB/s hash %016llx err %s\n", tag, D, S, t[3] * 1e3, 2.0 * n / (t[3] * 1e-3) / 1e9,
                hsh, cudaGetErrorString(cudaGetLastError()));
    cudaFree(v); cudaFree(w);
  }
}
namespace fmha { namespace cuda {
void check_cuda(cudaError_t err, const char* what) { if (err != cudaSuccess) std::printf("%s: %s\n", what, cudaGetErrorString(err)); }
} }
