// Backward A/B: dlopen N libfmha builds, alternate backward calls per shape (fp32), median per lib.
#include <fmha/fmha.h>
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
typedef void (*finit_t)(fmha_fwd_params*);
typedef fmha_status (*fwd_t)(const fmha_fwd_params*, void*);
typedef void (*binit_t)(fmha_bwd_params*);
typedef fmha_status (*bwd_t)(const fmha_bwd_params*, void*);
typedef fmha_status (*bws_t)(const fmha_bwd_params*, size_t*);
struct Lib { finit_t finit; fwd_t fwd; binit_t binit; bwd_t bwd; bws_t bws; };
int main(int argc, char** argv) {
  int reps = atoi(argv[1]);
  std::vector<Lib> libs;
  for (int i = 2; i < argc; ++i) {
    std::string copy = "/tmp/w28b/" + std::to_string(i) + ".so";
    system(("mkdir -p /tmp/w28b && cp " + std::string(argv[i]) + " " + copy).c_str());
    void* h = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("%s\n", dlerror()); return 1; }
    libs.push_back({(finit_t)dlsym(h, "fmha_fwd_params_init"), (fwd_t)dlsym(h, "fmha_fwd"), (binit_t)dlsym(h, "fmha_bwd_params_init"), (bwd_t)dlsym(h, "fmha_bwd"), (bws_t)dlsym(h, "fmha_bwd_workspace_size")});
  }
  int shapes[][5] = {{1,1024,2,128,0},{1,1024,4,64,0},{2,512,2,128,0},{8,128,2,128,0},{1,1024,2,128,1}};
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  for (auto& s : shapes) {
    int B = s[0], S = s[1], H = s[2], D = s[3], causal = s[4];
    size_t n = (size_t)B * S * H * D;
    std::vector<float> q(n), k(n), v(n), o(n), dout(n), dq(n), dk(n), dv(n), lse((size_t)B * H * S);
    for (auto* x : {&q, &k, &v, &dout}) for (auto& e : *x) e = nd(rng);
    fmha_problem pr; memset(&pr, 0, sizeof pr);
    pr.dtype = FMHA_DTYPE_FLOAT32; pr.batch = B; pr.seqlen_q = pr.seqlen_k = S; pr.num_heads_q = pr.num_heads_k = H;
    pr.head_dim = D; pr.scale = 1.f / std::sqrt((float)D); pr.window_left = -1; pr.window_right = causal ? 0 : -1;
    pr.total_q = pr.total_k = B * S;
    auto T = [&](std::vector<float>& x) { return fmha_tensor{x.data(), (int64_t)S * H * D, (int64_t)H * D, D}; };
    { fmha_fwd_params p; libs[0].finit(&p); p.device = FMHA_DEVICE_CPU; fmha_problem keep = p.problem; (void)keep;
      p.problem = pr; p.q = T(q); p.k = T(k); p.v = T(v); p.out = T(o); p.lse = lse.data();
      if (libs[0].fwd(&p, nullptr) != FMHA_SUCCESS) { printf("fwd fail\n"); return 1; } }
    std::vector<std::vector<double>> ts(libs.size());
    for (int r = 0; r < reps; ++r) for (size_t l = 0; l < libs.size(); ++l) {
      fmha_bwd_params p; libs[l].binit(&p); p.device = FMHA_DEVICE_CPU; p.problem = pr;
      p.q = T(q); p.k = T(k); p.v = T(v); p.out = T(o); p.dout = T(dout); p.lse = lse.data();
      p.dq = T(dq); p.dk = T(dk); p.dv = T(dv);
      size_t ws = 0; libs[l].bws(&p, &ws); std::vector<char> w(ws + 1); p.workspace = w.data(); p.workspace_size = ws;
      auto t0 = std::chrono::steady_clock::now();
      if (libs[l].bwd(&p, nullptr) != FMHA_SUCCESS) { printf("bwd fail\n"); return 1; }
      ts[l].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("B=%d S=%4d H=%d D=%3d c=%d", B, S, H, D, causal);
    for (size_t l = 0; l < libs.size(); ++l) { auto v2 = ts[l]; std::sort(v2.begin(), v2.end()); printf(" | med %7.3f", v2[v2.size() / 2]); }
    for (size_t l = 1; l < libs.size(); ++l) {
      std::vector<double> r2; for (size_t kk = 0; kk < ts[0].size(); ++kk) r2.push_back(ts[0][kk] / ts[l][kk]);
      std::sort(r2.begin(), r2.end()); printf(" | A/%zu x%.3f", l, r2[r2.size() / 2]);
    }
    printf("\n"); fflush(stdout);
  }
}
