// What the CPU forward and backward share for one (sequence, query head): the sequence's
// bounds, mask geometry, score transform, ALiBi slope and dropout, all from csrc/common/.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "../common/dropout.h"
#include "../common/mask.h"
#include "../common/sequence.h"
#include "../common/softmax.h"
#include "convert.h"
#include "fmha/fmha.h"
#include "parallel.h"

namespace fmha {
namespace cpu {

// Rows per work item, and keys per online-softmax step.
constexpr int kRowBlock = 32;
constexpr int kKeyBlock = 64;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Memory that a thread keeps from call to call, 64-byte aligned and not cleared: a profile at
// B = 8, S = 128 spent 14% of the forward clearing fresh pages and buffers on every call.
// One per use that may be alive at the same time on one thread (the calling thread both
// holds the fp32 K and V copies and runs work items).
class ThreadScratch {
 public:
  enum Slot { kKeys, kValues, kItemKeys, kItemValues, kTile, kGrads, kStates, kSlots };
  static ThreadScratch& get(Slot slot) {
    static thread_local ThreadScratch scratch[kSlots];
    return scratch[slot];
  }
  // At least `bytes` bytes; the contents are undefined.
  void* reserve(size_t bytes) {
    if (bytes > size_) {
      release();
      p_ = ::operator new(bytes, std::align_val_t(64));
      size_ = bytes;
    }
    return p_;
  }
  // Gives the memory back if it holds more than `keep` bytes (one large call should not
  // pin its copies for the life of the thread).
  void trim(size_t keep) {
    if (size_ > keep) release();
  }
  ~ThreadScratch() { release(); }

 private:
  void release() {
    if (p_) ::operator delete(p_, std::align_val_t(64));
    p_ = nullptr;
    size_ = 0;
  }
  void* p_ = nullptr;
  size_t size_ = 0;
};

// Dot product with eight independent partial sums, which the compiler vectorizes without
// -ffast-math; the summation order is fixed, so results do not depend on threads.
inline float dot(const float* a, const float* b, int n) {
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int d = 0;
  for (; d + 8 <= n; d += 8)
    for (int u = 0; u < 8; ++u) s[u] += a[d + u] * b[d + u];
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

inline void axpy(float alpha, const float* x, float* y, int n) {
  for (int d = 0; d < n; ++d) y[d] += alpha * x[d];
}

struct Head {
  const fmha_problem& p;
  Sequence seq;
  MaskGeometry geom;
  ScoreParams score;
  DropoutParams drop;
  bool dropout;
  float slope;  // ALiBi slope, 0 without ALiBi
  uint32_t bh;  // b * Hq + h, the dropout stream of this head
  int32_t h, hk;

  Head(const fmha_problem& prob, int32_t b, int32_t h_q)
      : p(prob),
        seq(Sequence::get(prob, b)),
        geom(sequence_mask(prob, seq)),
        score(ScoreParams::make(prob.scale, prob.softcap)),
        drop(DropoutParams::make(prob.dropout_p, prob.seed, prob.offset)),
        dropout(prob.dropout_p > 0.f),
        slope(alibi_slope(prob, b, h_q)),
        bh((uint32_t)b * (uint32_t)prob.num_heads_q + (uint32_t)h_q),
        h(h_q),
        hk(h_q / (prob.num_heads_q / prob.num_heads_k)) {}

  // Visible keys of row i: [key_begin(i), key_end(i)), contiguous because the mask is a band.
  int32_t key_begin(int32_t i) const { return geom.key_begin(i); }
  int32_t key_end(int32_t i) const { return geom.key_end(i + 1); }

  // Score (natural units, ALiBi included) of visible (i, j) from the raw dot product; *capped
  // receives the score before ALiBi, which the softcap gradient needs.
  float scores(float qk, int32_t i, int32_t j, float* capped) const {
    const float s = score.apply(qk);
    *capped = s;
    return slope != 0.f ? s - slope * geom.alibi_distance(i, j) : s;
  }

  // Dropout multiplier of (i, j): 0 if dropped, 1 / (1 - p) if kept, 1 without dropout.
  float dropout_factor(int32_t i, int32_t j) const {
    if (!dropout) return 1.f;
    return drop.keep(bh, i, j) ? drop.scale : 0.f;
  }

  // Loads rows [j0, j1) of head hk of a key-side tensor into dst (fp32, (j1 - j0) x D).
  void load_keys(const fmha_tensor& t, int32_t j0, int32_t j1, std::vector<float>& dst) const {
    const int D = p.head_dim;
    dst.resize((size_t)(j1 - j0) * D);
    for (int32_t j = j0; j < j1; ++j) load_row(p.dtype, t.data, seq.k_offset(t, j, hk), D, &dst[(size_t)(j - j0) * D]);
  }
};

// What a tile kernel needs of a head: the mask, the score transform, the ALiBi slope, and
// the head whose dropout applies (null without dropout).  The forward's Head and decode's
// per-sequence geometry both make one.
struct TileHead {
  MaskGeometry geom;
  ScoreParams score;
  float slope;
  const Head* dropout;

  float scores(float qk, int32_t i, int32_t j, float* capped) const {
    const float s = score.apply(qk);
    *capped = s;
    return slope != 0.f ? s - slope * geom.alibi_distance(i, j) : s;
  }
  bool general() const { return score.softcap > 0.f || slope != 0.f; }
};

inline TileHead tile_head(const Head& hd) { return TileHead{hd.geom, hd.score, hd.slope, hd.dropout ? &hd : nullptr}; }

// One query row with the online softmax over keys [jb, je) (FlashAttention, Algorithm 1, in
// blocks of kKeyBlock): acc <- softmax(scores) V, *lse <- log-sum-exp.  K and V hold fp32
// rows from key k0 on; score(qk, j) gives the score of key j in natural units;
// dropout(j) its dropout multiplier (0, 1 / (1 - p), or 1).
template <class Score, class Dropout>
void attend_row(const float* q, const float* K, const float* V, int32_t k0, int32_t jb, int32_t je, int D,
                Score&& score, Dropout&& dropout, float* acc, float* lse) {
  float s2[kKeyBlock];
  float m = -INFINITY, l = 0.f;
  for (int d = 0; d < D; ++d) acc[d] = 0.f;
  for (int32_t j0 = jb; j0 < je; j0 += kKeyBlock) {
    const int32_t j1 = std::min(je, j0 + kKeyBlock);
    // S = Q K^T for this block, and its row max (lines 9-10).
    float block_max = -INFINITY;
    for (int32_t j = j0; j < j1; ++j) {
      s2[j - j0] = score(dot(q, &K[(size_t)(j - k0) * D], D), j) * kLog2e;
      block_max = std::max(block_max, s2[j - j0]);
    }
    // Rescale what was accumulated under the old max (line 11).
    const float m_new = std::max(m, block_max);
    const float r = softmax_rescale(m, m_new);
    l *= r;
    for (int d = 0; d < D; ++d) acc[d] *= r;
    // P = exp(S - m); the row sum is taken before dropout; acc += dropout(P) V (line 12).
    for (int32_t j = j0; j < j1; ++j) {
      const float pj = exp2f(s2[j - j0] - m_new);
      l += pj;
      const float w = pj * dropout(j);
      if (w != 0.f) axpy(w, &V[(size_t)(j - k0) * D], acc, D);
    }
    m = m_new;
  }
  const float inv = softmax_inv_sum(l);
  for (int d = 0; d < D; ++d) acc[d] *= inv;
  *lse = softmax_lse(m, l);
}

// A key-side tensor (k or v) as fp32 rows, copied (and converted from bf16/fp16) once per
// call into a head-major layout: the rows of one (sequence, KV head) are contiguous, D
// floats apart.  In the caller's layout (rows H * D floats apart) the rows of a key block
// fall into a few L1 sets and evict each other; the copy costs one pass over k and v
// against the S / kBlockM passes of the kernels.
struct KeyRowsF32 {
  float* storage;
  ThreadScratch& scratch;
  int64_t head_rows;  // rows per KV head: seqlen_k, or total_k in varlen mode
  int D, heads;
  bool varlen;

  // The rows live in the calling thread's scratch `slot`, kept for the next call up to
  // kKeepBytes.  Rows outside every sequence are left unwritten: no kernel reads them.
  static constexpr size_t kKeepBytes = size_t(64) << 20;

  KeyRowsF32(const fmha_problem& p, const fmha_tensor& t, ThreadScratch::Slot slot)
      : scratch(ThreadScratch::get(slot)),
        head_rows(p.cu_seqlens_k != nullptr ? p.total_k : p.seqlen_k),
        D(p.head_dim),
        heads(p.num_heads_k),
        varlen(p.cu_seqlens_k != nullptr) {
    storage = static_cast<float*>(scratch.reserve(sizeof(float) * (size_t)((varlen ? 1 : p.batch) * heads * head_rows * D)));
    parallel_for((int64_t)p.batch * heads, [&](int64_t item) {
      const int32_t b = (int32_t)(item / heads), hk = (int32_t)(item % heads);
      const Sequence seq = Sequence::get(p, b);
      float* dst = const_cast<float*>(rows(seq, hk));
      for (int32_t j = 0; j < seq.k_rows; ++j) load_row(p.dtype, t.data, seq.k_offset(t, j, hk), D, dst + (int64_t)j * D);
    });
  }
  ~KeyRowsF32() { scratch.trim(kKeepBytes); }
  KeyRowsF32(const KeyRowsF32&) = delete;
  KeyRowsF32& operator=(const KeyRowsF32&) = delete;
  // Row 0 of (sequence, KV head); row j is j * stride() floats from it.
  const float* rows(const Sequence& seq, int32_t hk) const {
    const int64_t row0 = varlen ? (int64_t)hk * head_rows + seq.k_row0 : ((int64_t)seq.batch * heads + hk) * head_rows;
    return storage + row0 * D;
  }
  int64_t stride() const { return D; }
};

// Rows of keys and values for the tile kernels: key j0 + j at kbase + j * ks, its value at
// vbase + j * vs.
struct KeyRowsView {
  const float* kbase;
  int64_t ks;
  const float* vbase;
  int64_t vs;
};

// Keys [j0, j1) of KV head hk of a sequence as fp32 rows, D floats apart, in the calling
// thread's scratch `slot`: a work item's own copy of the keys it reads, made just before it
// reads them.  In the caller's layout (rows H * D floats apart) the rows of a key block fall
// into a few L1 sets and evict each other; a copy for the whole call (a first version) went
// out to L3 and came back, while this one stays in L1/L2 (1.1-1.2x on the forward at
// S = 128, one thread).
inline const float* key_rows_f32(const fmha_problem& p, const Sequence& seq, const fmha_tensor& t, int32_t hk,
                                 int32_t j0, int32_t j1, ThreadScratch::Slot slot) {
  const int D = p.head_dim;
  const int32_t n = std::max(j1 - j0, 0);
  float* dst = static_cast<float*>(ThreadScratch::get(slot).reserve(sizeof(float) * ((size_t)n * D + 1)));
  for (int32_t j = 0; j < n; ++j) load_row(p.dtype, t.data, seq.k_offset(t, j0 + j, hk), D, dst + (int64_t)j * D);
  return dst;
}

// What one call of the backward's tile kernel (bwd_head, tiles.inc) computes for KV head hk
// of sequence b: dK and dV of keys [k_begin, k_end) (none when empty) and, with dq, dQ of
// query rows [q_begin, q_end) (q_begin a multiple of the kernel's block rows) of the
// group's query heads [g_begin, g_end).
struct BwdPart {
  int32_t k_begin, k_end;
  bool dq;
  int32_t g_begin, g_end, q_begin, q_end;
};

// Varlen rows of the packed q (or k) that belong to no sequence: [0, cu[0]) and [cu[B], total).
// Outputs there are written too (zeros, LSE -inf), so every output element is defined.
inline std::vector<int32_t> rows_outside_sequences(const int32_t* cu, int32_t batch, int32_t total) {
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < cu[0] && r < total; ++r) rows.push_back(r);
  for (int32_t r = cu[batch]; r < total; ++r) rows.push_back(r);
  return rows;
}

}  // namespace cpu
}  // namespace fmha
