// C API tier: known-answer Philox vectors, exhaustive fp16/bf16 round trips, error codes and
// messages, and forward/backward of the CPU backend against a direct double-precision
// computation.  Prints each failure; exit status is the number of failures.
#include <fmha/fmha.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/decode_plan.h"
#include "common/mask.h"
#include "common/dropout.h"
#include "common/philox.h"
#include "common/quant.h"
#include "common/sequence.h"
#include "cpu/convert.h"
#include "cuda_fmha/tile_order.h"

namespace {

int g_failures = 0;

#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      ++g_failures;                                         \
      std::printf("FAIL %s:%d: %s -- ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                             \
      std::printf("\n");                                    \
    }                                                       \
  } while (0)

void test_philox_known_answers() {
  // Random123's kat_vectors for philox4x32_10.
  struct Kat {
    fmha::U32x4 ctr;
    uint32_t k0, k1;
    fmha::U32x4 expect;
  } kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const fmha::U32x4 r = fmha::philox4x32_10(k.ctr, k.k0, k.k1);
    EXPECT(r.x == k.expect.x && r.y == k.expect.y && r.z == k.expect.z && r.w == k.expect.w,
           "philox(%08x ...) = %08x %08x %08x %08x", k.ctr.x, r.x, r.y, r.z, r.w);
  }
}

void test_dropout_mapping() {
  // Each group of 8 elements consumes all 8 halves of one Philox output exactly once.
  const fmha::DropoutParams d = fmha::DropoutParams::make(0.5f, 0x1234567890abcdefull, 77);
  for (int i0 : {0, 16, 48}) {
    for (int j0 : {0, 32}) {
      int seen[8] = {0};
      for (int i = i0; i < i0 + 16; ++i)
        for (int j = j0; j < j0 + 16; ++j) {
          const fmha::U32x4 g = d.group_bits(3, i, j);
          const fmha::U32x4 anchor = d.group_bits(3, i0 + i % 8, j0 + 2 * ((j % 8) / 2));
          EXPECT(g.x == anchor.x && g.w == anchor.w, "(%d, %d) is not in its group", i, j);
          if (i % 8 == 0 && (j % 8) / 2 == 0) ++seen[4 * ((i % 16) / 8) + 2 * ((j % 16) / 8) + (j % 2)];
        }
      for (int k = 0; k < 8; ++k) EXPECT(seen[k] == 1, "half %d used %d times", k, seen[k]);
    }
  }
  // Keep rate close to 1 - p.
  const fmha::DropoutParams d3 = fmha::DropoutParams::make(0.3f, 42, 0);
  int kept = 0;
  const int n = 256;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) kept += d3.keep(0, i, j);
  const double rate = (double)kept / (n * n);
  EXPECT(std::fabs(rate - 0.7) < 0.01, "keep rate %.4f, expected 0.7", rate);
}

void test_half_bf16_round_trip() {
  using namespace fmha::cpu;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float((uint16_t)h);
    if (std::isnan(f)) {
      EXPECT(std::isnan(half_to_float(float_to_half(f))), "half NaN %04x", h);
      continue;
    }
    EXPECT(float_to_half(f) == h, "half %04x -> %g -> %04x", h, f, float_to_half(f));
    const float b = bf16_to_float((uint16_t)h);
    if (!std::isnan(b)) EXPECT(float_to_bf16(b) == h, "bf16 %04x -> %g", h, b);
  }
  // Rounding to nearest, ties to even.
  EXPECT(float_to_half(1.0f + 1.0f / 2048) == 0x3C00, "1 + 2^-11 rounds to even (1.0)");
  EXPECT(float_to_half(1.0f + 3.0f / 2048) == 0x3C02, "1 + 3 * 2^-11 rounds to even");
  EXPECT(float_to_half(65520.f) == 0x7C00, "65520 overflows to inf");
  EXPECT(float_to_half(65519.f) == 0x7BFF, "65519 rounds to 65504");
  EXPECT(float_to_bf16(1.0f + 1.0f / 256) == 0x3F80, "bf16 tie rounds to even");
}

void test_fp8_int8_codes() {
  // Every e4m3 code but NaN decodes to a value that encodes back to the same code.
  for (int c = 0; c < 256; ++c) {
    const float f = fmha::fp8_e4m3_to_float((uint8_t)c);
    if (std::isnan(f)) continue;
    const uint8_t back = fmha::float_to_fp8_e4m3(f);
    EXPECT(back == c || (f == 0.f && (back & 0x7F) == 0), "e4m3 %02x -> %g -> %02x", c, f, back);
  }
  EXPECT(fmha::fp8_e4m3_to_float(0x7E) == 448.f, "e4m3 max is 448");
  EXPECT(fmha::float_to_fp8_e4m3(1e6f) == 0x7E && fmha::float_to_fp8_e4m3(-1e6f) == 0xFE, "e4m3 saturates");
  EXPECT(fmha::float_to_fp8_e4m3(1.0625f) == fmha::float_to_fp8_e4m3(1.f), "1 + 2^-4 ties to even (1.0)");
  EXPECT(fmha::float_to_int8(127.6f) == 127 && fmha::float_to_int8(-300.f) == -127 && fmha::float_to_int8(2.5f) == 2,
         "int8 rounds to even and saturates");
}

// A paged cache with shuffled pages gives exactly the contiguous cache's result; metadata
// pointing outside the cache is rejected.
void test_decode_paged_equals_contiguous() {
  const int B = 2, S = 64, Hk = 2, Hq = 4, D = 32, page = 16, pages_per_seq = S / page;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> k(B * S * Hk * D), v(k.size()), q(B * Hq * D), out1(q.size()), out2(q.size());
  for (auto* t : {&k, &v, &q})
    for (float& x : *t) x = normal(rng);
  const int num_pages = B * pages_per_seq + 1;
  std::vector<int32_t> table(B * pages_per_seq);
  for (int i = 0; i < (int)table.size(); ++i) table[i] = (i * 5 + 1) % num_pages;  // a permutation
  std::vector<float> kp((size_t)num_pages * page * Hk * D), vp(kp.size());
  for (int b = 0; b < B; ++b)
    for (int pos = 0; pos < S; ++pos) {
      const size_t dst = ((size_t)table[b * pages_per_seq + pos / page] * page + pos % page) * Hk * D;
      std::copy_n(&k[((size_t)b * S + pos) * Hk * D], Hk * D, &kp[dst]);
      std::copy_n(&v[((size_t)b * S + pos) * Hk * D], Hk * D, &vp[dst]);
    }
  const int32_t seqlens[2] = {40, 61};
  fmha_decode_params p;
  fmha_decode_params_init(&p);
  p.dtype = p.cache_dtype = FMHA_DTYPE_FLOAT32;
  p.batch = B, p.seqlen_q = 1, p.num_heads_q = Hq, p.num_heads_k = Hk, p.head_dim = D;
  p.q = {q.data(), Hq * D, Hq * D, D};
  p.out = {out1.data(), Hq * D, Hq * D, D};
  p.k_cache = {k.data(), (int64_t)S * Hk * D, Hk * D, D};
  p.v_cache = {v.data(), (int64_t)S * Hk * D, Hk * D, D};
  p.cache_batch = B, p.cache_seqlen = S;
  p.cache_seqlens = seqlens;
  p.scale = 0.2f;
  p.window_right = 0;
  EXPECT(fmha_decode(&p, nullptr) == FMHA_SUCCESS, "contiguous decode: %s", fmha_last_error());
  p.out.data = out2.data();
  p.k_cache = {kp.data(), (int64_t)page * Hk * D, Hk * D, D};
  p.v_cache = {vp.data(), (int64_t)page * Hk * D, Hk * D, D};
  p.cache_batch = num_pages, p.cache_seqlen = page;
  p.block_table = table.data(), p.block_table_stride = pages_per_seq, p.max_pages = pages_per_seq;
  EXPECT(fmha_decode(&p, nullptr) == FMHA_SUCCESS, "paged decode: %s", fmha_last_error());
  EXPECT(out1 == out2, "paged and contiguous caches disagree");
  table[1] = num_pages;  // sequence 0's second page: out of range
  EXPECT(fmha_decode(&p, nullptr) == FMHA_ERROR_INVALID_VALUE &&
             std::string(fmha_last_error()).find("block_table[0][1]") != std::string::npos,
         "an out-of-range page is rejected: %s", fmha_last_error());
}

// Dense fixed-length fp32 problem with a double-precision reference.
struct Case {
  int B = 2, Sq = 37, Sk = 53, Hq = 4, Hk = 2, D = 40;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool alibi = false;
};

struct Tensors {
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv, slopes;
};

fmha_problem make_problem(const Case& c) {
  fmha_fwd_params p;
  fmha_fwd_params_init(&p);
  fmha_problem pr = p.problem;
  pr.dtype = FMHA_DTYPE_FLOAT32;
  pr.batch = c.B;
  pr.seqlen_q = c.Sq;
  pr.seqlen_k = c.Sk;
  pr.num_heads_q = c.Hq;
  pr.num_heads_k = c.Hk;
  pr.head_dim = c.D;
  pr.scale = 1.0f / std::sqrt((float)c.D);
  pr.softcap = c.softcap;
  pr.window_left = c.wl;
  pr.window_right = c.wr;
  return pr;
}

fmha_tensor view(std::vector<float>& t, int S, int H, int D) {
  return fmha_tensor{t.data(), (int64_t)S * H * D, (int64_t)H * D, D};
}

// out, lse and the gradients of sum(out * dout) in double precision.
void reference(const Case& c, const Tensors& t, std::vector<double>& out, std::vector<double>& lse,
               std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  const int g = c.Hq / c.Hk;
  const double scale = 1.0 / std::sqrt((double)c.D);
  out.assign(t.q.size(), 0.0);
  dq.assign(t.q.size(), 0.0);
  dk.assign(t.k.size(), 0.0);
  dv.assign(t.v.size(), 0.0);
  lse.assign((size_t)c.B * c.Hq * c.Sq, -INFINITY);
  auto Q = [&](int b, int i, int h) { return ((size_t)(b * c.Sq + i) * c.Hq + h) * c.D; };
  auto K = [&](int b, int j, int h) { return ((size_t)(b * c.Sk + j) * c.Hk + h) * c.D; };
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i) {
        const int hk = h / g;
        std::vector<double> s(c.Sk, -INFINITY), raw(c.Sk, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          const long d = (long)j - i, off = c.Sk - c.Sq;
          if ((c.wl >= 0 && d < off - c.wl) || (c.wr >= 0 && d > off + c.wr)) continue;
          double x = 0.0;
          for (int e = 0; e < c.D; ++e) x += (double)t.q[Q(b, i, h) + e] * t.k[K(b, j, hk) + e];
          x *= scale;
          raw[j] = x;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          if (c.alibi) x -= t.slopes[h] * std::fabs((double)(i + off - j));
          s[j] = x;
          mx = std::fmax(mx, x);
        }
        if (mx == -INFINITY) continue;
        double sum = 0.0;
        for (int j = 0; j < c.Sk; ++j) sum += std::exp(s[j] - mx);
        lse[((size_t)b * c.Hq + h) * c.Sq + i] = mx + std::log(sum);
        std::vector<double> p(c.Sk), dp(c.Sk);
        double delta = 0.0;
        for (int j = 0; j < c.Sk; ++j) p[j] = std::exp(s[j] - mx) / sum;
        for (int e = 0; e < c.D; ++e) {
          double o = 0.0;
          for (int j = 0; j < c.Sk; ++j) o += p[j] * t.v[K(b, j, hk) + e];
          out[Q(b, i, h) + e] = o;
          delta += o * t.dout[Q(b, i, h) + e];
        }
        for (int j = 0; j < c.Sk; ++j) {
          if (p[j] == 0.0) continue;
          double x = 0.0;
          for (int e = 0; e < c.D; ++e) x += (double)t.dout[Q(b, i, h) + e] * t.v[K(b, j, hk) + e];
          double ds = p[j] * (x - delta) * scale;
          if (c.softcap > 0) {
            const double th = std::tanh(raw[j] / c.softcap);
            ds *= 1.0 - th * th;
          }
          for (int e = 0; e < c.D; ++e) {
            dq[Q(b, i, h) + e] += ds * t.k[K(b, j, hk) + e];
            dk[K(b, j, hk) + e] += ds * t.q[Q(b, i, h) + e];
            dv[K(b, j, hk) + e] += p[j] * t.dout[Q(b, i, h) + e];
          }
        }
      }
}

double max_rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    num = std::fmax(num, std::fabs(got[i] - want[i]));
    den = std::fmax(den, std::fabs(want[i]));
  }
  return num / (den > 0 ? den : 1.0);
}

void test_against_reference(const Case& c, const char* name) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  Tensors t;
  t.q.resize((size_t)c.B * c.Sq * c.Hq * c.D);
  t.k.resize((size_t)c.B * c.Sk * c.Hk * c.D);
  t.v.resize(t.k.size());
  t.dout.resize(t.q.size());
  for (auto* x : {&t.q, &t.k, &t.v, &t.dout})
    for (float& e : *x) e = normal(rng);
  t.slopes.resize(c.Hq);
  for (int h = 0; h < c.Hq; ++h) t.slopes[h] = std::pow(2.0f, -(h + 1.0f));
  t.out.assign(t.q.size(), NAN);
  t.lse.assign((size_t)c.B * c.Hq * c.Sq, NAN);
  t.dq.assign(t.q.size(), NAN);
  t.dk.assign(t.k.size(), NAN);
  t.dv.assign(t.v.size(), NAN);

  fmha_fwd_params f;
  fmha_fwd_params_init(&f);
  f.problem = make_problem(c);
  if (c.alibi) f.problem.alibi_slopes = t.slopes.data();
  f.q = view(t.q, c.Sq, c.Hq, c.D);
  f.k = view(t.k, c.Sk, c.Hk, c.D);
  f.v = view(t.v, c.Sk, c.Hk, c.D);
  f.out = view(t.out, c.Sq, c.Hq, c.D);
  f.lse = t.lse.data();
  EXPECT(fmha_fwd(&f, nullptr) == FMHA_SUCCESS, "%s: fmha_fwd: %s", name, fmha_last_error());

  fmha_bwd_params bp;
  fmha_bwd_params_init(&bp);
  bp.problem = f.problem;
  bp.q = f.q;
  bp.k = f.k;
  bp.v = f.v;
  bp.out = f.out;
  bp.dout = view(t.dout, c.Sq, c.Hq, c.D);
  bp.lse = t.lse.data();
  bp.dq = view(t.dq, c.Sq, c.Hq, c.D);
  bp.dk = view(t.dk, c.Sk, c.Hk, c.D);
  bp.dv = view(t.dv, c.Sk, c.Hk, c.D);
  size_t ws = 1;
  EXPECT(fmha_bwd_workspace_size(&bp, &ws) == FMHA_SUCCESS && ws == 0, "%s: CPU workspace %zu", name, ws);
  EXPECT(fmha_bwd(&bp, nullptr) == FMHA_SUCCESS, "%s: fmha_bwd: %s", name, fmha_last_error());

  std::vector<double> out, lse, dq, dk, dv;
  reference(c, t, out, lse, dq, dk, dv);
  const double tol = 2e-5;
  EXPECT(max_rel_err(t.out, out) < tol, "%s: out error %.3g", name, max_rel_err(t.out, out));
  EXPECT(max_rel_err(t.lse, lse) < tol, "%s: lse error %.3g", name, max_rel_err(t.lse, lse));
  EXPECT(max_rel_err(t.dq, dq) < tol, "%s: dq error %.3g", name, max_rel_err(t.dq, dq));
  EXPECT(max_rel_err(t.dk, dk) < tol, "%s: dk error %.3g", name, max_rel_err(t.dk, dk));
  EXPECT(max_rel_err(t.dv, dv) < tol, "%s: dv error %.3g", name, max_rel_err(t.dv, dv));
}

// Calls fmha_fwd on a small valid problem after `mutate`, expects `status` and a message
// containing `words`.
void expect_fwd_error(const char* words, fmha_status status, const std::function<void(fmha_fwd_params&)>& mutate) {
  std::vector<float> q(2 * 8 * 2 * 16, 0.5f), out(q.size()), lse(2 * 2 * 8);
  fmha_fwd_params p;
  fmha_fwd_params_init(&p);
  Case c;
  c.B = 2, c.Sq = c.Sk = 8, c.Hq = c.Hk = 2, c.D = 16;
  p.problem = make_problem(c);
  p.q = p.k = p.v = view(q, 8, 2, 16);
  p.out = view(out, 8, 2, 16);
  p.lse = lse.data();
  EXPECT(fmha_fwd(&p, nullptr) == FMHA_SUCCESS, "baseline: %s", fmha_last_error());
  EXPECT(std::string(fmha_last_error()).empty(), "success clears the last error");
  mutate(p);
  const fmha_status got = fmha_fwd(&p, nullptr);
  const std::string msg = fmha_last_error();
  EXPECT(got == status && msg.find(words) != std::string::npos, "expected status %d with '%s', got %d: '%s'",
         (int)status, words, (int)got, msg.c_str());
}

void test_errors() {
  EXPECT(fmha_fwd(nullptr, nullptr) == FMHA_ERROR_INVALID_VALUE, "NULL params");
  expect_fwd_error("struct_size", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.struct_size = 8; });
  expect_fwd_error("head_dim", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.head_dim = 257; });
  expect_fwd_error("head_dim", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.head_dim = 0; });
  expect_fwd_error("multiple of num_heads_k", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.num_heads_q = 3;
  });
  expect_fwd_error("dropout_p", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.dropout_p = 1.f; });
  expect_fwd_error("window_left", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.window_left = -2; });
  expect_fwd_error("softcap", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.softcap = -1.f; });
  expect_fwd_error("scale", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.scale = NAN; });
  expect_fwd_error("dtype", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.dtype = (fmha_dtype)9; });
  expect_fwd_error("q.data", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.q.data = nullptr; });
  expect_fwd_error("strides", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.k.row_stride = -1; });
  expect_fwd_error("together", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    static const int32_t cu[3] = {0, 8, 16};
    p.problem.cu_seqlens_q = cu;
  });
  static const int32_t decreasing[3] = {0, 9, 8};
  static const int32_t good[3] = {0, 8, 16};
  expect_fwd_error("non-decreasing", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.cu_seqlens_q = decreasing;
    p.problem.cu_seqlens_k = good;
    p.problem.total_q = p.problem.total_k = 16;
    p.problem.seqlen_q = p.problem.seqlen_k = 9;
  });
  expect_fwd_error("max_seqlen_q", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.cu_seqlens_q = good;
    p.problem.cu_seqlens_k = good;
    p.problem.total_q = p.problem.total_k = 16;
    p.problem.seqlen_q = 7;
    p.problem.seqlen_k = 8;
  });
  expect_fwd_error("exceeds", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.cu_seqlens_q = good;
    p.problem.cu_seqlens_k = good;
    p.problem.total_q = 15;
    p.problem.total_k = 16;
  });
  static const int32_t used[2] = {3, 9};
  expect_fwd_error("seqused_k[1]", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) { p.problem.seqused_k = used; });
  // The fp8 forward: CUDA only, and without dropout, probs or seqused_k on any device.
  expect_fwd_error("compute capability 9.0", FMHA_ERROR_NOT_SUPPORTED, [](fmha_fwd_params& p) {
    p.problem.dtype = FMHA_DTYPE_FLOAT8_E4M3;
  });
  expect_fwd_error("no dropout", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.dtype = FMHA_DTYPE_FLOAT8_E4M3, p.device = FMHA_DEVICE_CUDA, p.problem.dropout_p = 0.1f;
  });
  expect_fwd_error("seqused_k", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.dtype = FMHA_DTYPE_FLOAT8_E4M3, p.device = FMHA_DEVICE_CUDA, p.problem.seqused_k = used;
  });
  expect_fwd_error("q_descale strides", FMHA_ERROR_INVALID_VALUE, [](fmha_fwd_params& p) {
    p.problem.dtype = FMHA_DTYPE_FLOAT8_E4M3, p.device = FMHA_DEVICE_CUDA, p.q_descale.batch_stride = -1;
  });
  // A caller compiled before the fp8 fields existed passes the shorter struct: accepted.
  expect_fwd_error("", FMHA_SUCCESS, [](fmha_fwd_params& p) {
    p.struct_size = (uint32_t)offsetof(fmha_fwd_params, q_descale);
  });
  {
    std::vector<float> buf(8 * 16);  // never read: the size depends on the problem only
    fmha_fwd_params p;
    fmha_fwd_params_init(&p);
    p.problem.batch = 1, p.problem.seqlen_q = p.problem.seqlen_k = 8, p.problem.num_heads_q = 1;
    p.problem.num_heads_k = 1, p.problem.head_dim = 16, p.problem.scale = 1.f;
    p.q = p.k = p.v = p.out = view(buf, 8, 1, 16);
    size_t bytes = 1;
    EXPECT(fmha_fwd_workspace_size(&p, &bytes) == FMHA_SUCCESS && bytes == 0, "fp16 forward workspace %zu", bytes);
  }
#if !defined(FMHA_WITH_CUDA)
  fmha_capabilities caps{};
  caps.struct_size = sizeof(caps);
  EXPECT(fmha_get_capabilities(FMHA_DEVICE_CUDA, &caps) == FMHA_SUCCESS, "capabilities");
  if (!caps.available)
    expect_fwd_error("without CUDA", FMHA_ERROR_NOT_SUPPORTED, [](fmha_fwd_params& p) { p.device = FMHA_DEVICE_CUDA; });
#endif
  fmha_capabilities cpu{};
  cpu.struct_size = sizeof(cpu);
  EXPECT(fmha_get_capabilities(FMHA_DEVICE_CPU, &cpu) == FMHA_SUCCESS && cpu.available && cpu.max_head_dim == 256,
         "CPU capabilities");
  const std::string header_version = std::to_string(FMHA_VERSION_MAJOR) + "." + std::to_string(FMHA_VERSION_MINOR) +
                                     "." + std::to_string(FMHA_VERSION_PATCH);
  EXPECT(std::string(fmha_version()) == header_version, "version %s, header %s", fmha_version(),
         header_version.c_str());
}

}  // namespace

// The GPU backends' split-KV plan (csrc/common/decode_plan.h) on the benchmark's shape:
// 32 query heads over 8 KV heads, one query row, D = 128, an H200's 132 SMs.
void test_decode_plan() {
  fmha_decode_params p;
  std::memset(&p, 0, sizeof(p));
  p.dtype = FMHA_DTYPE_BFLOAT16;
  p.batch = 1, p.seqlen_q = 1, p.num_heads_q = 32, p.num_heads_k = 8, p.head_dim = 128;
  p.cache_seqlen = 8192;
  const int64_t tiles = (int64_t)p.batch * p.num_heads_k * fmha::DecodeWork::m_tiles(p);
  EXPECT(tiles == 8, "tiles %lld", (long long)tiles);
  // 8 tiles on waves of 132 CTAs: 16 splits (128 CTAs, 97%) is the smallest count within
  // 95% of the best (33 splits fill two waves exactly).
  fmha::DecodePlan pl = fmha::DecodePlan::make(p, tiles, 132, 8);
  EXPECT(pl.splits == 16, "splits %d", pl.splits);
  EXPECT(pl.o_bytes == 32 * 16 * 128 * 4 && pl.lse_bytes == 2048, "workspace %zu + %zu", pl.o_bytes,
         pl.lse_bytes);
  // Each split keeps at least min_blocks 16-row blocks: a 100-row cache is not split.
  p.cache_seqlen = 100;
  EXPECT(fmha::DecodePlan::make(p, tiles, 132, 8).splits == 1, "short cache split");
  // num_splits is taken as asked, up to kMaxDecodeSplits; fp32 never splits.
  p.num_splits = 500;
  EXPECT(fmha::DecodePlan::make(p, tiles, 132, 8).splits == fmha::kMaxDecodeSplits, "num_splits clamp");
  p.dtype = FMHA_DTYPE_FLOAT32;
  pl = fmha::DecodePlan::make(p, tiles, 132, 8);
  EXPECT(pl.splits == 1 && pl.o_bytes == 0 && pl.lse_bytes == 0, "fp32 plan %d", pl.splits);
}

// The backward's fp32 dQ accumulator (csrc/common/sequence.h): the kernels index it by
// (sequence, row, head), the final conversion by packed row; both must be LSE's layout,
// with each (sequence, head) a contiguous run of rows (the sm90 bulk reduction adds one
// query block of them at once), and every element indexed exactly once.
void test_dq_accum_layout() {
  const int H = 3, D = 8;
  const int32_t cu[] = {0, 5, 5, 12};  // sequences of 5, 0 and 7 rows
  for (bool varlen : {false, true}) {
    fmha_problem p;
    std::memset(&p, 0, sizeof(p));
    p.batch = 3, p.num_heads_q = H, p.num_heads_k = 1, p.head_dim = D;
    p.seqlen_q = 7;
    if (varlen) p.cu_seqlens_q = cu, p.cu_seqlens_k = cu, p.total_q = p.total_k = 12;
    const int64_t rows = varlen ? 12 : (int64_t)p.batch * p.seqlen_q;
    std::vector<int> seen(rows * H * D, 0);
    for (int b = 0; b < p.batch; ++b) {
      const fmha::Sequence seq = fmha::Sequence::get(p, b);
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < seq.len_q; ++i) {
          const int64_t idx = fmha::dq_accum_index(p, seq, i, h, D);
          const int64_t row = varlen ? seq.q_row0 + i : (int64_t)b * p.seqlen_q + i;
          EXPECT(idx == fmha::dq_accum_index_of_row(p, row, h, D), "dq_accum %s b=%d h=%d i=%d: %lld vs %lld",
                 varlen ? "varlen" : "fixed", b, h, i, (long long)idx,
                 (long long)fmha::dq_accum_index_of_row(p, row, h, D));
          EXPECT(idx == fmha::dq_accum_index(p, seq, 0, h, D) + (int64_t)i * D, "dq_accum rows not contiguous");
          EXPECT(idx >= 0 && idx + D <= (int64_t)seen.size(), "dq_accum index %lld out of range", (long long)idx);
          if (idx >= 0 && idx + D <= (int64_t)seen.size())
            for (int c = 0; c < D; ++c) ++seen[idx + c];
        }
    }
    EXPECT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }), "dq_accum %s: not a bijection",
           varlen ? "varlen" : "fixed");
  }
}

// The GPU kernels' mask (csrc/common/mask.h): a row's interval from row_interval, tested
// with visible_in, against the element test (both indices inside their sequences and
// visible()), over every row and column of small problems in both alignments, with and
// without windows, rows and columns past the ends, and the first column far left of lo
// (the kernels' unsigned offset wraps there).
void test_mask_row_interval() {
  int cases = 0;
  for (int sq : {1, 5, 17})
    for (int sk : {0, 1, 6, 23})
      for (int wl : {-1, 0, 3})
        for (int wr : {-1, 0, 2, 40})
          for (bool top_left : {false, true}) {
            const fmha::MaskGeometry g = fmha::MaskGeometry::make(sq, sk, wl, wr, top_left);
            for (bool keys_in_rows : {false, true})
              for (int row = 0; row < (keys_in_rows ? sk : sq) + 3; ++row) {
                int32_t lo = 0, width = 0;
                if (keys_in_rows)
                  g.row_interval<true>(row, lo, width);
                else
                  g.row_interval<false>(row, lo, width);
                for (int col = 0; col < (keys_in_rows ? sq : sk) + 3; ++col) {
                  const int i = keys_in_rows ? col : row, j = keys_in_rows ? row : col;
                  const bool want = i < sq && j < sk && g.visible(i, j);
                  const bool got = fmha::MaskGeometry::visible_in(uint32_t(col) - uint32_t(lo), width);
                  ++cases;
                  EXPECT(want == got, "sq=%d sk=%d window=(%d,%d) %s %s row %d col %d: interval [%d, +%d)", sq, sk,
                         wl, wr, top_left ? "top-left" : "bottom-right", keys_in_rows ? "keys in rows" : "queries in rows",
                         row, col, lo, width);
                }
              }
          }
  EXPECT(cases > 10000, "only %d cases", cases);
}

// The leading key blocks a warpgroup of the sm_90a forward skips (MaskGeometry::blocks_unseen,
// fwd_sm90_kernel.h's kSkipBlocks), with the kernel's tiles (FwdTileWork: rows [m0, m1) of
// 128 or 192, key blocks counted down from n_end) and its 64-row warpgroups: no row of the
// warpgroup sees a key of a skipped block, over both alignments, windows, more queries than
// keys and the other way round; and under a plain causal mask the count is exact (the first
// block kept holds a key that one of the rows sees).
void test_mask_blocks_unseen() {
  int skipped = 0, cases = 0;
  for (int sq : {1, 63, 64, 200, 450})
    for (int sk : {1, 70, 200, 450})
      for (int wl : {-1, 0, 100})
        for (int wr : {-1, 0, 30})
          for (bool top_left : {false, true}) {
            const fmha::MaskGeometry g = fmha::MaskGeometry::make(sq, sk, wl, wr, top_left);
            for (int bm : {128, 192})
              for (int bn : {64, 80, 96, 112, 128}) {
                if (bn >= bm) continue;
                for (int m0 = 0; m0 < sq; m0 += bm) {
                  const int m1 = std::min(m0 + bm, sq);
                  const int n_end = (g.key_end(m1) + bn - 1) / bn;
                  const int n_blocks = std::max(n_end - g.key_begin(m0) / bn, 0);
                  if (n_blocks == 0) continue;
                  for (int wm0 = m0; wm0 < m0 + bm; wm0 += 64) {
                    const int wm1 = std::max(std::min(wm0 + 64, m1), wm0 + 1);
                    const int first = std::min(g.blocks_unseen(wm1, n_end, bn), n_blocks - 1);
                    ++cases;
                    for (int i = 0; i < first; ++i, ++skipped)
                      for (int r = wm0; r < std::min(wm0 + 64, m1); ++r)
                        for (int j = (n_end - 1 - i) * bn; j < std::min((n_end - i) * bn, sk); ++j)
                          EXPECT(!g.visible(r, j), "sq=%d sk=%d window=(%d,%d) %s tile %dx%d rows [%d, %d): "
                                 "skipped block %d holds key %d, seen by row %d", sq, sk, wl, wr,
                                 top_left ? "top-left" : "bottom-right", bm, bn, wm0, wm1, i, j, r);
                    if (wl < 0 && wr == 0 && wm0 < m1 && first < n_blocks - 1) {
                      bool seen = false;
                      for (int r = wm0; r < std::min(wm0 + 64, m1); ++r)
                        for (int j = (n_end - 1 - first) * bn; j < std::min((n_end - first) * bn, sk); ++j)
                          seen = seen || g.visible(r, j);
                      EXPECT(seen, "sq=%d sk=%d causal %s tile %dx%d rows [%d, %d): block %d kept but unseen", sq, sk,
                             top_left ? "top-left" : "bottom-right", bm, bn, wm0, wm1, first);
                    }
                  }
                }
              }
          }
  EXPECT(cases > 1000 && skipped > 100, "only %d warpgroup tiles, %d skipped blocks", cases, skipped);
}

// The persistent sm_90a forward's tile order (csrc/cuda_fmha/tile_order.h): CTA c of G takes
// the units of tiles u = c, c + G, ... (pairs, tiles 2u and 2u + 1, or single tiles u;
// t = p + blocks * (h + heads * b), query block p from the outside in), walked by a counter
// without divisions.  Against that definition written with divisions, and every tile
// exactly once over the CTAs; the same from two loops (for_each_two_loops); and pairs wherever a
// mask or varlen needs them.
void test_tile_order() {
  int grids = 0;
  for (int blocks : {1, 2, 3, 11, 16, 22})
    for (int heads : {1, 3, 32})
      for (int batch : {1, 2, 5})
        for (uint32_t ctas : {1u, 7u, 132u, 1000u})
          for (int unit : {1, 2}) {
            const fmha::cuda::TileOrder order(blocks, heads, batch, unit);
            std::vector<int> seen((size_t)blocks * heads * batch, 0);
            for (uint32_t c = 0; c < ctas; ++c) {
              std::vector<int64_t> got, want;
              order.for_each(c, ctas, [&](int m, int h, int b) {
                got.push_back(((int64_t)b * heads + h) * blocks + m);
              });
              for (int64_t u = c; unit * u < order.tiles; u += ctas)
                for (int64_t t = unit * u; t < unit * u + unit && t < order.tiles; ++t) {
                  const int p = (int)(t % blocks);
                  want.push_back(t - p + (p % 2 == 0 ? blocks - 1 - p / 2 : p / 2));
                }
              EXPECT(got == want, "blocks=%d heads=%d batch=%d unit=%d, CTA %u of %u: %zu tiles, %zu expected", blocks,
                     heads, batch, unit, c, ctas, got.size(), want.size());
              std::vector<int64_t> indexed, one_loop;
              order.for_each_two_loops(c, ctas, [&](int m, int h, int b) {
                indexed.push_back(((int64_t)b * heads + h) * blocks + m);
              });
              order.for_each<true>(c, ctas, [&](int m, int h, int b) {
                one_loop.push_back(((int64_t)b * heads + h) * blocks + m);
              });
              EXPECT(one_loop == got, "blocks=%d heads=%d batch=%d unit=%d, CTA %u of %u: one loop %zu tiles, %zu",
                     blocks, heads, batch, unit, c, ctas, one_loop.size(), got.size());
              EXPECT(indexed == got, "blocks=%d heads=%d batch=%d unit=%d, CTA %u of %u: two loops %zu tiles, %zu",
                     blocks, heads, batch, unit, c, ctas, indexed.size(), got.size());
              for (int64_t t : got)
                if (t >= 0 && t < (int64_t)seen.size()) ++seen[t];
            }
            EXPECT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
                   "blocks=%d heads=%d batch=%d unit=%d over %u CTAs: not every tile once", blocks, heads, batch, unit,
                   ctas);
            ++grids;
          }
  EXPECT(grids == 432, "%d grids", grids);
  // The sorted tail (causal, fixed lengths): every tile once; against its definition written
  // out (pairs (last - j, j) of heads < H_t in turn, then the tail's tiles by query block from
  // the last down, the middle block with every head, across the CTAs forward and back); and
  // by the key blocks' count (a 128-key block costs 1, a tile 1 more) the busiest CTA never
  // more than 1% above the pairs' to the end, below it at the training table's shapes.
  auto busiest = [](const fmha::cuda::TileOrder& order, uint32_t ctas, int bm, int sq) {
    double most = 0;
    for (uint32_t c = 0; c < ctas; ++c) {
      double sum = 0;
      order.template for_each<true>(c, ctas, [&](int m, int, int) { sum += 1 + (std::min((m + 1) * bm, sq) + 127) / 128; });
      most = std::max(most, sum);
    }
    return most;
  };
  int tail_grids = 0;
  for (int blocks : {1, 2, 3, 4, 7, 16, 43})
    for (int heads : {1, 3, 32})
      for (int batch : {1, 2, 5})
        for (uint32_t ctas : {1u, 7u, 132u, 1000u}) {
          const int64_t tiles = (int64_t)blocks * heads * batch;
          const uint32_t grid = (uint32_t)std::min<int64_t>(ctas, tiles);
          const fmha::cuda::TileOrder order(blocks, heads, batch, 2, true);
          const int half = blocks / 2, all = heads * batch;
          const int64_t rounds = (tiles + 1) / 2 / grid;
          const int64_t ht = half == 0 || rounds <= 2 ? 0 : std::min<int64_t>(all, (rounds - 2) * grid / half);
          std::vector<std::vector<int64_t>> want(grid);
          for (int64_t u = 0; u < ht * half; ++u) {
            const int64_t head = u / half, j = u % half;
            want[u % grid].push_back(head * blocks + blocks - 1 - j);
            want[u % grid].push_back(head * blocks + j);
          }
          std::vector<int64_t> tail;
          for (int level = blocks - 1; level >= 0; --level)
            for (int64_t head = level == half && blocks % 2 == 1 ? 0 : ht; head < all; ++head)
              tail.push_back(head * blocks + level);
          for (size_t k = 0; k < tail.size(); ++k) {
            const uint32_t r = (uint32_t)(k / grid), pos = (uint32_t)(k % grid);
            want[(ht * half + (r % 2 == 0 ? pos : grid - 1 - pos)) % grid].push_back(tail[k]);
          }
          std::vector<int> seen((size_t)tiles, 0);
          for (uint32_t c = 0; c < grid; ++c) {
            std::vector<int64_t> got;
            order.for_each<true>(c, grid, [&](int m, int h, int b) { got.push_back(((int64_t)b * heads + h) * blocks + m); });
            EXPECT(got == want[c], "sorted tail: blocks=%d heads=%d batch=%d, CTA %u of %u: %zu tiles, %zu expected",
                   blocks, heads, batch, c, grid, got.size(), want[c].size());
            std::vector<int64_t> indexed;
            order.for_each_two_loops(c, grid, [&](int m, int h, int b) { indexed.push_back(((int64_t)b * heads + h) * blocks + m); });
            EXPECT(indexed == got, "sorted tail: blocks=%d heads=%d batch=%d, CTA %u of %u: two loops %zu tiles, %zu",
                   blocks, heads, batch, c, grid, indexed.size(), got.size());
            for (int64_t t : got)
              if (t >= 0 && t < tiles) ++seen[t];
          }
          EXPECT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
                 "sorted tail: blocks=%d heads=%d batch=%d over %u CTAs: not every tile once", blocks, heads, batch, grid);
          ++tail_grids;
        }
  EXPECT(tail_grids == 252, "%d sorted-tail grids", tail_grids);
  for (int sq : {300, 512, 777, 1024, 2048, 4096, 8192, 9000, 16384})
    for (int bm : {128, 192})
      for (int heads : {1, 4, 12, 32, 64, 256, 1024}) {
        const int blocks = (sq + bm - 1) / bm;
        const int64_t tiles = (int64_t)blocks * heads;
        if (tiles > 150000) continue;
        const double pairs = busiest(fmha::cuda::TileOrder(blocks, heads, 1, 2), (uint32_t)std::min<int64_t>((tiles + 1) / 2, 132), bm, sq);
        const double sorted = busiest(fmha::cuda::TileOrder(blocks, heads, 1, 2, true), (uint32_t)std::min<int64_t>(tiles, 132), bm, sq);
        EXPECT(sorted <= 1.01 * pairs, "sq=%d bm=%d heads=%d: sorted tail's busiest CTA %.0f against pairs' %.0f", sq, bm,
               heads, sorted, pairs);
        // D = 64 at 2k, 8k and 16k, D = 128 at 4k and 8k (heads x batch of 16k tokens)
        const bool table = (bm == 128 && ((sq == 2048 && heads == 256) || (sq == 4096 && heads == 64) ||
                                          (sq == 8192 && heads == 32))) ||
                           (bm == 192 && ((sq == 8192 && heads == 64) || (sq == 16384 && heads == 32)));
        if (table)
          EXPECT(sorted < pairs, "sq=%d bm=%d heads=%d: sorted tail %.0f, pairs %.0f", sq, bm, heads, sorted, pairs);
      }
  fmha_problem pr{};
  pr.window_left = pr.window_right = -1;
  // 4096 tiles over 132 CTAs: 32 at most either way, so the kernel's unit; 2752 (D = 64's
  // 192-row tiles at S = 8k, 32 heads, batch 2): 22 in pairs, 21 one at a time.
  EXPECT(fmha::cuda::tile_order_unit(pr, 1, 4096, 132) == 1 && fmha::cuda::tile_order_unit(pr, 2, 4096, 132) == 2,
         "unmasked: the kernel's unit");
  EXPECT(fmha::cuda::tile_order_unit(pr, 2, 2752, 132) == 1, "unmasked, pairs a tile longer: single tiles");
  for (int64_t tiles : {1, 2, 3, 131, 132, 133, 264, 265, 300, 2752, 4096, 100000}) {  // never more on a CTA
    const int unit = fmha::cuda::tile_order_unit(pr, 2, tiles, 132);
    const int64_t units = (tiles + unit - 1) / unit, ctas = std::min<int64_t>(units, 132);
    const int64_t most = unit * ((units + ctas - 1) / ctas), singles = (tiles + std::min<int64_t>(tiles, 132) - 1) / std::min<int64_t>(tiles, 132);
    EXPECT(most <= singles + (tiles % 2 == 1 && unit == 2), "%lld tiles: unit %d, %lld on a CTA against %lld",
           (long long)tiles, unit, (long long)most, (long long)singles);
  }
  int32_t cu[2] = {0, 1};
  for (int w : {0, 1}) {
    pr.window_right = w == 0 ? 0 : -1;  // causal, or a left window
    pr.window_left = w == 0 ? -1 : 4;
    EXPECT(fmha::cuda::tile_order_unit(pr, 1, 2752, 132) == 2, "masked (window %d, %d): pairs", pr.window_left,
           pr.window_right);
  }
  pr.window_left = pr.window_right = -1;
  pr.seqused_k = cu;
  EXPECT(fmha::cuda::tile_order_unit(pr, 2, 2752, 132) == 2, "seqused_k: the kernel's unit");
  pr.seqused_k = nullptr;
  pr.cu_seqlens_q = cu;
  EXPECT(fmha::cuda::tile_order_unit(pr, 1, 2752, 132) == 2, "varlen: pairs");
  pr.cu_seqlens_q = nullptr;
}

// The sm_90a backward's launch order (tile_order.h): every (key block, unit) exactly once;
// within a group of units key block 0 of each before key block 1; order_units = 1 the grid's
// own order (key block fastest); groups only under a causal or right-bounded window, of about
// one wave, at most 8.
void test_wave_block_order() {
  for (int n_blocks : {1, 2, 3, 16, 33})
    for (int units : {1, 2, 5, 16, 40})
      for (int order_units : {1, 2, 4, 8, 66}) {
        std::vector<int> seen((size_t)n_blocks * units, 0);
        bool ascending = true, grid = true;
        int last_group = -1, last_n = 0;
        for (int linear = 0; linear < n_blocks * units; ++linear) {
          int n, u;
          fmha::cuda::wave_block_order(linear, n_blocks, units, order_units, n, u);
          if (n < 0 || n >= n_blocks || u < 0 || u >= units) {
            seen[0] = -1000;
            continue;
          }
          ++seen[(size_t)u * n_blocks + n];
          const int group = u / order_units;
          if (group == last_group && n < last_n) ascending = false;
          last_group = group, last_n = n;
          if (n != linear % n_blocks || u != linear / n_blocks) grid = false;
        }
        EXPECT(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }),
               "n_blocks=%d units=%d order_units=%d: not every CTA once", n_blocks, units, order_units);
        EXPECT(ascending, "n_blocks=%d units=%d order_units=%d: key blocks not ascending in a group", n_blocks, units,
               order_units);
        EXPECT(grid == (order_units == 1 || units == 1 || n_blocks == 1), "n_blocks=%d units=%d order_units=%d: grid order %d",
               n_blocks, units, order_units, (int)grid);
      }
  fmha_problem pr{};
  pr.window_left = pr.window_right = -1;
  EXPECT(fmha::cuda::wave_order_units(pr, 32, 132) == 1, "unmasked: the grid's order");
  pr.window_right = 0;  // causal
  EXPECT(fmha::cuda::wave_order_units(pr, 32, 132) == 4, "causal, 32 key blocks on 132 SMs: groups of 4");
  EXPECT(fmha::cuda::wave_order_units(pr, 4, 132) == 8, "causal, 4 key blocks: at most 8");
  EXPECT(fmha::cuda::wave_order_units(pr, 128, 132) == 1 && fmha::cuda::wave_order_units(pr, 500, 132) == 1,
         "causal, a wave of key blocks or more: the grid's order");
}

int main() {
  test_mask_row_interval();
  test_mask_blocks_unseen();
  test_tile_order();
  test_wave_block_order();
  test_decode_plan();
  test_dq_accum_layout();
  test_philox_known_answers();
  test_dropout_mapping();
  test_half_bf16_round_trip();
  test_fp8_int8_codes();
  test_decode_paged_equals_contiguous();
  test_errors();
  test_against_reference(Case{}, "gqa");
  Case causal;
  causal.wr = 0;
  causal.Sq = 61;
  causal.Sk = 29;
  test_against_reference(causal, "causal, Sq > Sk");
  Case local;
  local.wl = 5;
  local.wr = 3;
  local.softcap = 2.5f;
  local.alibi = true;
  local.Hk = 1;
  test_against_reference(local, "window + softcap + alibi, MQA");
  if (g_failures == 0) std::printf("test_capi: all passed\n");
  return g_failures;
}
