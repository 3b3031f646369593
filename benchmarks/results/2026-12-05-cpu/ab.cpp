// A/B harness: dlopen N libfmha builds, alternate forward calls per shape, min and median per lib.
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
typedef void (*init_t)(fmha_fwd_params*);
typedef fmha_status (*fwd_t)(const fmha_fwd_params*, void*);
struct Lib { init_t init; fwd_t fwd; const char* name; };
static uint16_t bf(float x){ uint32_t u; memcpy(&u,&x,4); return (uint16_t)((u + 0x7fff + ((u>>16)&1))>>16); }
int main(int argc, char** argv) {
  // usage: ab dtype(bf16|f32) reps shapes(S/D/c,...|all) lib1 [lib2 ...]
  bool f32 = !strcmp(argv[1], "f32");
  int reps = atoi(argv[2]);
  std::string sel = argv[3];
  std::vector<Lib> libs;
  for (int i = 4; i < argc; ++i) {
    std::string arg = argv[i], path = arg.substr(0, arg.find(':'));
    std::string copy = "/tmp/w28/copies/" + std::to_string(i) + ".so";
    system(("mkdir -p /tmp/w28/copies && cp " + path + " " + copy).c_str());
    void* h = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h && arg.find(':') != std::string::npos) {
      int* x = (int*)dlsym(h, "fmha_x");
      std::string vals = arg.substr(arg.find(':') + 1); int k = 0;
      for (size_t pos = 0; pos <= vals.size() && k < 8; ) { size_t e = vals.find(',', pos); if (e == std::string::npos) e = vals.size(); x[k++] = atoi(vals.substr(pos, e - pos).c_str()); pos = e + 1; }
    }
    if (!h) { printf("%s\n", dlerror()); return 1; }
    libs.push_back({(init_t)dlsym(h, "fmha_fwd_params_init"), (fwd_t)dlsym(h, "fmha_fwd"), argv[i]});
  }
  int shapes[8][4] = {{8,128,4,64},{4,256,4,64},{2,512,4,64},{1,1024,4,64},{8,128,2,128},{4,256,2,128},{2,512,2,128},{1,1024,2,128}};
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  std::vector<double> tot(libs.size(), 0);
  for (int causal = 0; causal < 2; ++causal)
  for (auto& s : shapes) {
    int B = s[0], S = s[1], H = s[2], D = s[3];
    char key[64]; snprintf(key, sizeof key, "%d/%d/%d", S, D, causal);
    if (sel != "all" && ("," + sel + ",").find("," + std::string(key) + ",") == std::string::npos) continue;
    size_t n = (size_t)B * S * H * D, es = f32 ? 4 : 2;
    const int kSets = 3;
    std::vector<std::vector<char>> buf(kSets * 3);
    for (auto& b : buf) { b.resize(n * es); for (size_t i = 0; i < n; ++i) { float x = nd(rng); if (f32) memcpy(&b[i*4], &x, 4); else { uint16_t h = bf(x); memcpy(&b[i*2], &h, 2);} } }
    std::vector<char> out(n * es); std::vector<float> lse((size_t)B * H * S);
    std::vector<std::vector<double>> ts(libs.size());
    for (int r = 0; r < reps; ++r) for (size_t l = 0; l < libs.size(); ++l) {
      { std::string e = "AB_T" + std::to_string(l); if (getenv(e.c_str())) setenv("FMHA_NUM_THREADS", getenv(e.c_str()), 1); }
      fmha_fwd_params p; libs[l].init(&p);
      p.device = FMHA_DEVICE_CPU;
      fmha_problem& pr = p.problem;
      pr.dtype = f32 ? FMHA_DTYPE_FLOAT32 : FMHA_DTYPE_BFLOAT16; pr.batch = B; pr.seqlen_q = pr.seqlen_k = S;
      pr.num_heads_q = pr.num_heads_k = H; pr.head_dim = D; pr.scale = 1.f / std::sqrt((float)D);
      pr.window_left = -1; pr.window_right = causal ? 0 : -1;
      int set = r % kSets;
      fmha_tensor* ts3[3] = {&p.q, &p.k, &p.v};
      for (int t = 0; t < 3; ++t) *ts3[t] = {buf[set * 3 + t].data(), (int64_t)S * H * D, (int64_t)H * D, D};
      p.out = {out.data(), (int64_t)S * H * D, (int64_t)H * D, D};
      p.lse = lse.data();
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 3; ++k) if (libs[l].fwd(&p, nullptr) != FMHA_SUCCESS) { printf("fail\n"); return 1; }
      ts[l].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 3);
    }
    printf("B=%d S=%4d H=%d D=%3d c=%d", B, S, H, D, causal);
    for (size_t l = 0; l < libs.size(); ++l) {
      auto v = ts[l]; std::sort(v.begin() + 0, v.end());
      printf(" | min %7.3f med %7.3f", v[0], v[v.size() / 2]);
      tot[l] += v[v.size() / 2];
    }
    for (size_t l = 1; l < libs.size(); ++l) {
      std::vector<double> r; for (size_t k = 0; k < ts[0].size(); ++k) r.push_back(ts[0][k] / ts[l][k]);
      std::sort(r.begin(), r.end()); printf(" | A/%zu x%.3f", l, r[r.size() / 2]);
    }
    printf("\n"); fflush(stdout);
  }
  printf("total med:"); for (double t : tot) printf(" %.3f", t); printf("\n");
}
