// Causal attention on the CPU backend through the C API, checked against a direct
// computation in double precision.  Exit status 0 means the results agree.
#include <fmha/fmha.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  const int B = 2, S = 77, H = 4, D = 64;
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  // (B, S, H, D), contiguous.
  std::vector<float> q(B * S * H * D), k(q.size()), v(q.size()), out(q.size(), NAN), lse(B * H * S);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);

  fmha_fwd_params p;
  fmha_fwd_params_init(&p);
  p.device = FMHA_DEVICE_CPU;
  p.problem.dtype = FMHA_DTYPE_FLOAT32;
  p.problem.batch = B;
  p.problem.seqlen_q = p.problem.seqlen_k = S;
  p.problem.num_heads_q = p.problem.num_heads_k = H;
  p.problem.head_dim = D;
  p.problem.scale = 1.0f / std::sqrt((float)D);
  p.problem.window_right = 0;  // causal
  const int64_t strides[3] = {(int64_t)S * H * D, (int64_t)H * D, D};  // batch, row, head
  p.q = {q.data(), strides[0], strides[1], strides[2]};
  p.k = {k.data(), strides[0], strides[1], strides[2]};
  p.v = {v.data(), strides[0], strides[1], strides[2]};
  p.out = {out.data(), strides[0], strides[1], strides[2]};
  p.lse = lse.data();

  if (fmha_fwd(&p, nullptr) != FMHA_SUCCESS) {
    std::fprintf(stderr, "fmha_fwd failed: %s\n", fmha_last_error());
    return 1;
  }

  double max_err = 0.0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i) {
        auto at = [&](const std::vector<float>& t, int s, int d) { return (double)t[((b * S + s) * H + h) * D + d]; };
        std::vector<double> w(i + 1);
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += at(q, i, d) * at(k, j, d);
          w[j] = s / std::sqrt((double)D);
          mx = std::fmax(mx, w[j]);
        }
        for (int j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int j = 0; j <= i; ++j) o += w[j] / sum * at(v, j, d);
          max_err = std::fmax(max_err, std::fabs(o - at(out, i, d)));
        }
        max_err = std::fmax(max_err, std::fabs(mx + std::log(sum) - lse[(b * H + h) * S + i]));
      }
  std::printf("fmha %s: causal attention B=%d S=%d H=%d D=%d on the CPU, max |error| = %.2e\n",
              fmha_version(), B, S, H, D, max_err);
  return max_err < 1e-4 ? 0 : 1;
}
