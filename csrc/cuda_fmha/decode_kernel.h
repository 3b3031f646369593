// Decode attention against a KV cache (flash_attn_with_kvcache) on sm80+: flash-decoding.
//
// A CTA owns one (sequence, KV head, query tile, split): the query rows of every query head that shares
// the KV head are packed into one 8-row tile (row r = i * group + head-in-group), so each
// cache row is read once for the whole group.  The products run transposed, S^T = K q^T and
// O^T = V^T P^T: the packed rows are the mma's 8-wide n side (a decode step's 4-8 rows fill
// it; a 16-row m side would be three-quarters padding), the keys and head dims its 16-row
// m side, and P^T's fragments are S^T's two 8x8 halves transposed in registers
// (movmatrix).  The cache range the tile can see is cut into
// 16-row blocks of cache positions; a split takes a contiguous run of blocks, and its
// kNWarps warps take every kNWarps-th block each.  Each warp streams its blocks through its
// own ring of shared-memory stages with cp.async and no block-wide barrier, keeping its own
// online softmax; the warps merge by LSE at the end, and splits are merged by a second kernel
// (decode_combine_kernel) from fp32 partials.
//
// Positions, not keys, are tiled: blocks start at multiples of 16 in the cache, so a block
// never straddles a page (page sizes are multiples of 16) and needs one block-table lookup.
// Key j is position leftpad + j; positions outside [leftpad, filled + seqlen_new) are
// zero-filled by the copy (never read) and masked.
//
// 8-bit caches (fp8 e4m3, int8) are staged as bytes and turned into mma operands in
// registers (tile/cvt8.h; fp8 runs the mma in fp16, int8 in the query type).  The head
// dimension is permuted consistently so each thread reads contiguous bytes: for q.k,
// thread t of a quad owns dims [t D/4, (t + 1) D/4) of every key (4 per k-step, one word,
// paired as the converter's q_dim says) and q is read in the same order; for P V, thread g
// owns output dims [g D/8, (g + 1) D/8) (n-block n is dim g D/8 + n).  Per-token scales
// multiply scores (k_scale) and probabilities (v_scale) per key; per-head scales join the
// score scale and the output factor; never a multiply per element.
#pragma once

#include <math.h>

#include <type_traits>

#include "../common/decode_plan.h"
#include "../common/kv_cache.h"
#include "../common/mask.h"
#include "../common/rotary.h"
#include "../common/softmax.h"
#include "fmha/fmha.h"
#include "rowwise.h"
#include "scores.h"
#include "tile/cvt8.h"
#include "tile/mma.h"
#include "tile/smem.h"

namespace fmha {
namespace cuda {

// Packed q rows per CTA: the products run transposed (S^T = K q^T, O^T = V^T P^T), so the
// rows are the mma's 8-wide n side and the keys and head dims its 16-row m side.
constexpr int kDecodeRows = 8;

// kWide: the 8-bit caches' kernel at D <= 128 for GPUs whose blocks may opt in to about
// 200 KB of shared memory (sm90, sm100): one CTA of 12 warps per SM rather than three of 4.
// The same warps stream the same bytes, but a third as many splits are three times as long,
// so each CTA's fixed costs (q, ring fill, warp merge, partial write) and the split merge
// shrink: on an H200 (two calls), fp8 at B = 1, L = 128k went 78.9 -> 75.5 us and B = 16,
// L = 4k 45.2 -> 40.3 us (docs/tuning.md).
template <class T_, CacheKind kCache_, int kHeadDim_, bool kWide_ = false>
struct DecodeTraits {
  using T = T_;
  static constexpr CacheKind kCache = kCache_;
  static constexpr bool kQuant = kCache != CacheKind::kPlain;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kWide = kWide_;
  static_assert(!kWide || (kQuant && kHeadDim <= 128), "the wide kernel is for 8-bit caches at D <= 128");
  static constexpr int kNWarps = kWide ? 12 : 4, kThreads = 32 * kNWarps;
  static constexpr int kRows = kDecodeRows;
  static constexpr int kMT = kHeadDim / 16;  // 16-dim m-tiles of O^T
  static_assert(kHeadDim % 64 == 0, "decode head dims are 64, 128, 256");
  using TileQ = SmemTile<16, kHeadDim>;
  // One 16-row cache block as stored: T, or 8-bit rows viewed as pairs (kHeadDim / 2 columns).
  using TileKV = SmemTile<16, kQuant ? kHeadDim / 2 : kHeadDim>;
  static constexpr int kScaleBytes = kQuant ? 2 * 16 * 4 : 0;  // per-token k, v scales of the block
  static constexpr int kStageBytes = 2 * TileKV::kBytes + kScaleBytes;
  // CTAs per SM the kernel is built for (registers) and sized for (shared memory): the 8-bit
  // paths spend more instructions per byte, so they want more warps to hide latency.
  static constexpr int kMinBlocks = kWide ? 1 : kQuant && kHeadDim <= 128 ? 3 : 2;
  // About 200 KB of stages per SM on sm80/sm90 (one CTA on 99 KB parts, where the wide
  // kernel does not fit and is not used).
  static constexpr int kStagesRaw = (kWide ? 198 : kMinBlocks == 3 ? 68 : 96) * 1024 / (kNWarps * kStageBytes);
  static constexpr int kStages = kStagesRaw < 2 ? 2 : kStagesRaw > 6 ? 6 : kStagesRaw;
  static constexpr int kRingBytes = kNWarps * kStages * kStageBytes;
  static constexpr int kCombineStride = kHeadDim + 4;  // fp32 row stride of the warp merge
  static constexpr int kCombineBytes = kNWarps * kRows * (kCombineStride + 2) * 4;
  static constexpr int kSmemBytes = kRingBytes > kCombineBytes ? kRingBytes : kCombineBytes;
  // q waits in the last warp's last stage, which is first loaded after the q fragments are built.
  static_assert(TileQ::kBytes <= kStageBytes, "q tile must fit one stage");
};

template <class K>
__device__ __forceinline__ void decode_block(const fmha_decode_params& p, float* o_part, float* lse_part,
                                             int num_splits) {
  using T = typename K::T;
  using TileQ = typename K::TileQ;
  using TileKV = typename K::TileKV;
  using Elem = std::conditional_t<K::kQuant, uint8_t, T>;  // cache element
  constexpr int D = K::kHeadDim, kS = K::kStages;
  constexpr int kUnit = K::kQuant ? 2 : 1;  // cache elements per 16-bit tile column
  using Cvt = Cvt8<T, K::kCache == CacheKind::kInt8>;
  using Tc = std::conditional_t<K::kQuant, typename Cvt::Compute, T>;  // the mma's operand type
  constexpr float kLazyMax = 8.f;

  // Grid (query tiles x splits, Hk, B), splits fastest.  Packed queries (cu_seqlens_q):
  // the tiles cover max_seqlen_q, and those past this sequence's rows have nothing to do.
  const int split = blockIdx.x % num_splits, b = blockIdx.z, hk = blockIdx.y;
  const int group = p.num_heads_q / p.num_heads_k;
  const DecodeQuery dq = DecodeQuery::get(p, b);
  const int rows = dq.len * group;
  const int r0 = (blockIdx.x / num_splits) * K::kRows, r1 = min(r0 + K::kRows, rows);
  if (r0 >= rows) return;  // the whole CTA, before any barrier
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int d = p.head_dim;

  const CacheView cv{&p, b};
  const DecodeSequence seq = DecodeSequence::get(p, b);
  const MaskGeometry geom = MaskGeometry::make(dq.len, seq.len_k, p.window_left, p.window_right, false);
  const int i0 = r0 / group, i1 = (r1 - 1) / group + 1;  // query rows of the tile
  const int kb = geom.key_begin(i0), ke = max(kb, geom.key_end(i1));
  const int blk_begin = (seq.leftpad + kb) / 16, blk_end = (seq.leftpad + ke + 15) / 16;
  const int per_split = (blk_end - blk_begin + num_splits - 1) / num_splits;
  const int my_begin = blk_begin + split * per_split, my_end = min(my_begin + per_split, blk_end);
  const int n_mine = my_end - my_begin > warp ? (my_end - my_begin - warp + K::kNWarps - 1) / K::kNWarps : 0;

  extern __shared__ __align__(128) char smem[];
  char* ring = smem + warp * kS * K::kStageBytes;
  T* sQ = reinterpret_cast<T*>(smem + (K::kNWarps * kS - 1) * K::kStageBytes);

  // 1. Gather the packed q rows (zeros past the tile's rows and the head dim).
  const T* q = static_cast<const T*>(p.q.data);
  for (int idx = tid; idx < 16 * (D / 8); idx += K::kThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8, row = r0 + r;
    const bool ok = row < r1 && c < d;
    const T* src = ok ? q + dq.offset(p.q, row / group, hk * group + row % group) + c : q;
    cp_async_16(sQ + TileQ::offset(r, c), src, ok ? 16 : 0);
  }
  cp_async_commit();

  // 2. Start this warp's cache stream: block it is my_begin + warp + 4 it.  A lane copies
  // chunk column c_l of rows r_l, r_l + kRowStep, ... of every block, so its source offsets
  // are fixed but for the block's cache row; paged caches look the page up one block ahead.
  const Elem* k_cache = static_cast<const Elem*>(p.k_cache.data);
  const Elem* v_cache = static_cast<const Elem*>(p.v_cache.data);
  const bool per_token = K::kQuant && p.scaling == FMHA_SCALE_PER_TOKEN;
  // fp16 operands with per-token scales form P x v_scale in fp16: P must stay <= 1 (an exact
  // running max), or a v_scale above 255 (|V| > ~32k for int8, ~114k for fp8) would overflow it.
  const float lazy_max = std::is_same_v<Tc, __half> && per_token ? 0.f : kLazyMax;
  constexpr int kChunks = TileKV::kChunks, kRowStep = 32 / kChunks;
  const int r_l = lane / kChunks, c_l = (lane % kChunks) * 8;
  // Columns past the head dim are zero-filled: such a lane copies 0 bytes from its row start.
  const int col_bytes = c_l * kUnit < d ? 16 : 0, c_src = col_bytes ? c_l * kUnit : 0;
  const int64_t k_lane = hk * p.k_cache.head_stride + r_l * p.k_cache.row_stride + c_src;
  const int64_t v_lane = hk * p.v_cache.head_stride + r_l * p.v_cache.row_stride + c_src;
  const bool paged = p.block_table != nullptr;
  const int page = p.cache_seqlen;  // paged: rows per page (a multiple of 16)
  const int page_shift = paged && (page & (page - 1)) == 0 ? __ffs(page) - 1 : -1;
  const int32_t seq_outer = paged ? 0 : cv.cache_seq();
  auto block_pos = [&](int it) { return (my_begin + warp + K::kNWarps * it) * 16; };
  // The cache sequence or page holding positions [pos0, pos0 + 16) (as CacheView::outer).
  auto block_outer = [&](int pos0) -> int32_t {
    if (!paged) return seq_outer;
    const int col = page_shift >= 0 ? pos0 >> page_shift : pos0 / page;
    return clamp_index(p.block_table[(int64_t)b * p.block_table_stride + col], 0, p.cache_batch - 1);
  };
  auto load_block = [&](int it, int32_t outer) {
    const int pos0 = block_pos(it);
    const int row0 = !paged ? pos0 : page_shift >= 0 ? pos0 & (page - 1) : pos0 % page;
    char* st = ring + (it % kS) * K::kStageBytes;
    const Elem* k_src = k_cache + outer * p.k_cache.batch_stride + row0 * p.k_cache.row_stride + k_lane;
    const Elem* v_src = v_cache + outer * p.v_cache.batch_stride + row0 * p.v_cache.row_stride + v_lane;
    if (pos0 >= seq.leftpad && pos0 + 16 <= seq.end()) {  // every row valid: no per-row tests
#pragma unroll
      for (int rr = 0; rr < 16 / kRowStep; ++rr) {
        const int r = r_l + rr * kRowStep;
        cp_async_16(reinterpret_cast<Elem*>(st) + TileKV::offset(r, c_l) * kUnit,
                    k_src + rr * kRowStep * p.k_cache.row_stride, col_bytes);
        cp_async_16(reinterpret_cast<Elem*>(st + TileKV::kBytes) + TileKV::offset(r, c_l) * kUnit,
                    v_src + rr * kRowStep * p.v_cache.row_stride, col_bytes);
      }
    } else {  // rows outside [leftpad, end) are zero-filled (never read from the cache)
#pragma unroll
      for (int rr = 0; rr < 16 / kRowStep; ++rr) {
        const int r = r_l + rr * kRowStep, pos = pos0 + r;
        const bool ok = pos >= seq.leftpad && pos < seq.end();
        cp_async_16(reinterpret_cast<Elem*>(st) + TileKV::offset(r, c_l) * kUnit,
                    ok ? k_src + rr * kRowStep * p.k_cache.row_stride : k_cache, ok ? col_bytes : 0);
        cp_async_16(reinterpret_cast<Elem*>(st + TileKV::kBytes) + TileKV::offset(r, c_l) * kUnit,
                    ok ? v_src + rr * kRowStep * p.v_cache.row_stride : v_cache, ok ? col_bytes : 0);
      }
    }
    if (per_token) {  // as CacheView::scale_index
      const int r = lane % 16, pos = pos0 + r;
      const bool ok = pos >= seq.leftpad && pos < seq.end();
      const float* src = lane < 16 ? p.k_scale : p.v_scale;
      const int64_t idx = ((int64_t)outer * p.cache_seqlen + row0 + r) * p.num_heads_k + hk;
      cp_async_4(st + 2 * TileKV::kBytes + lane * 4, ok ? src + idx : src, ok ? 4 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_mine) load_block(s, block_outer(block_pos(s)));
    cp_async_commit();
  }
  int32_t outer_next = kS - 1 < n_mine ? block_outer(block_pos(kS - 1)) : 0;

  // 3. Rotary embedding of q in place, then q fragments into registers.
  cp_async_wait<kS - 1>();
  __syncthreads();
  if (p.rotary_dim > 0) {
    const int half = p.rotary_dim / 2;
    const bool per_row = p.window_left >= 0 || p.window_right >= 0;
    const T* cos_t = static_cast<const T*>(p.rotary_cos);
    const T* sin_t = static_cast<const T*>(p.rotary_sin);
    for (int idx = tid; idx < 16 * half; idx += K::kThreads) {
      const int r = idx / half, k = idx % half, row = r0 + r;
      if (row >= r1) continue;
      const int pos = clamp_index((int64_t)seq.filled + (per_row ? row / group : 0), 0, p.seqlen_ro - 1);
      int a, c;
      rotary_pair(k, p.rotary_dim, p.rotary_interleaved != 0, &a, &c);
      float x = to_float(sQ[TileQ::offset(r, a)]), y = to_float(sQ[TileQ::offset(r, c)]);
      rotate_pair(&x, &y, to_float(cos_t[(int64_t)pos * half + k]), to_float(sin_t[(int64_t)pos * half + k]));
      sQ[TileQ::offset(r, a)] = from_float<T>(x);
      sQ[TileQ::offset(r, c)] = from_float<T>(y);
    }
    __syncthreads();
  }
  // fp8 caches with bf16 queries: the mma runs in fp16 (Cvt8), so q is scaled by 2^q_exp
  // to put max |q| just under 2^15 (exact: a power of two; fp16 keeps bf16's 8 bits for
  // every element within 2^-24 of the largest), and the power is taken back out of the score
  // scale.
  constexpr bool kQToHalf = K::kQuant && !std::is_same_v<T, Tc>;
  int q_exp = 0;
  if constexpr (kQToHalf) {
    uint32_t mx = 0;  // largest |q| bit pattern of the tile (magnitudes order as integers)
    for (int i = lane; i < TileQ::kBytes / 4; i += 32) {
      const uint32_t w = reinterpret_cast<const uint32_t*>(sQ)[i];
      mx = max(mx, max(w & 0x7FFFu, (w >> 16) & 0x7FFFu));
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    q_exp = 15 - ((int)(mx >> 7) - 126);  // max |q| < 2^((mx >> 7) - 126); q_exp in [-114, 141]
  }
  // B fragments of q^T (k = dims, n = the 8 packed rows; sQ's rows 8-15 are zeros).
  uint32_t qf[D / 16][2];
  if constexpr (!K::kQuant) {
    const auto b_q = ldsm_b<TileQ>(sQ, lane);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t x[4];
      ldmatrix_x4(x, b_q(0, kk * 16));
      qf[kk][0] = x[0], qf[kk][1] = x[1];
    }
  } else {
    // Logical k 2t, 2t+1 of a k-step are the K word's dims q_dim(0), q_dim(1); 2t+8, 2t+9
    // are q_dim(2), q_dim(3).  2^q_exp as two normal floats: two exact multiplies.
    const float q_mul0 = __int_as_float((127 + q_exp / 2) << 23);
    const float q_mul1 = __int_as_float((127 + q_exp - q_exp / 2) << 23);
    auto elem = [&](int r, int c) -> uint32_t {
      const T x = sQ[TileQ::offset(r, c)];
      if constexpr (kQToHalf) {
        const __half h = __float2half_rn(to_float(x) * q_mul0 * q_mul1);
        return *reinterpret_cast<const uint16_t*>(&h);
      }
      return *reinterpret_cast<const uint16_t*>(&x);
    };
    auto pair = [&](int r, int c0, int c1) { return elem(r, c0) | (elem(r, c1) << 16); };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = t * (D / 4) + 4 * kk;
      qf[kk][0] = pair(g, c + Cvt::q_dim(0), c + Cvt::q_dim(1));
      qf[kk][1] = pair(g, c + Cvt::q_dim(2), c + Cvt::q_dim(3));
    }
  }
  __syncthreads();  // every warp has its q fragments: the last stage may now be loaded

  // Scores: scale and softcap by ScoreMod; ALiBi (a slope per packed row) and the mask here,
  // for this thread's two rows (g, g + 8) of the tile.
  // 8-bit caches: a per-head k scale, the power of two the conversion left out (2^kExp) and
  // q's 2^-q_exp scale q.k, so they join the score scale; a per-head v scale and 2^kExp
  // scale the output at the end.
  const bool alibi = p.alibi_slopes != nullptr;
  const float head_k = K::kQuant && !per_token ? p.k_scale[hk] : 1.f;
  const float head_v = K::kQuant && !per_token ? p.v_scale[hk] : 1.f;
  const ScoreMod score =
      ScoreMod::make(K::kQuant ? ldexpf(p.scale * head_k, Cvt::kExp - q_exp) : p.scale, p.softcap, alibi, 0.f, geom);
  int qi[2];
  float slope_log2[2];
#pragma unroll
  for (int ci = 0; ci < 2; ++ci) {  // this thread's q columns 2t, 2t + 1 (packed rows)
    const int row = min(r0 + 2 * t + ci, rows - 1);
    qi[ci] = row / group;
    slope_log2[ci] = p.alibi_slopes
                         ? p.alibi_slopes[(int64_t)b * p.alibi_batch_stride + hk * group + row % group] * kLog2e
                         : 0.f;
  }
  const float post_scale = score.post_scale;

  // O^T: m-tile m's rows g and g + 8 are dims dim_of(m, 0) and dim_of(m, 1) (8-bit caches
  // permute them so each thread reads contiguous V bytes), its columns the packed rows.
  auto dim_of = [&](int m, int h) { return K::kQuant ? g * (D / 8) + 2 * m + h : 16 * m + g + 8 * h; };
  float acc_o[K::kMT][4];
#pragma unroll
  for (int m = 0; m < K::kMT; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[m][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // q columns 2t, 2t + 1

  for (int it = 0; it < n_mine; ++it) {
    if (it + kS - 1 < n_mine) load_block(it + kS - 1, outer_next);
    cp_async_commit();
    if (it + kS < n_mine) outer_next = block_outer(block_pos(it + kS));  // used next iteration
    cp_async_wait<kS - 1>();
    __syncwarp();
    const char* st = ring + (it % kS) * K::kStageBytes;
    const int j0 = (my_begin + warp + K::kNWarps * it) * 16 - seq.leftpad;  // key of the block's first row

    // S^T = K q^T for the block's 16 keys: element e is key g + 8 (e / 2), q column 2t + e % 2.
    // The k-steps go round kChains accumulators rather than one chain of D / 16 dependent
    // mmas: with about 3 warps per scheduler, fixed-latency waits were the 8-bit kernel's
    // top stall (Nsight Compute, D = 128).  The benchmark moved within its noise.
    constexpr int kChains = D / 16 >= 8 ? 4 : 2;
    float sc[kChains][4] = {};
    if constexpr (!K::kQuant) {
      const auto a_k = ldsm_a<TileKV>(st, lane);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ak[4];
        ldmatrix_x4(ak, a_k(0, kk * 16));
        mma_16816<T>(sc[kk % kChains], ak, qf[kk][0], qf[kk][1]);
      }
    } else {
      const uint16_t* sK = reinterpret_cast<const uint16_t*>(st);
      uint32_t kw[2][D / 16];  // keys g, g + 8: this thread's word of each k-step
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int ch = 0; ch < D / 64; ++ch) {
          const uint4 v = *reinterpret_cast<const uint4*>(sK + TileKV::offset(g + 8 * r, t * (D / 8) + ch * 8));
          kw[r][4 * ch] = v.x, kw[r][4 * ch + 1] = v.y, kw[r][4 * ch + 2] = v.z, kw[r][4 * ch + 3] = v.w;
        }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t lo[2], hi[2];
        Cvt::k_pairs(kw[0][kk], lo);
        Cvt::k_pairs(kw[1][kk], hi);
        const uint32_t ak[4] = {lo[0], hi[0], lo[1], hi[1]};
        mma_16816<Tc>(sc[kk % kChains], ak, qf[kk][0], qf[kk][1]);
      }
    }
    float s[1][1][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sc[0][e];
#pragma unroll
      for (int c = 1; c < kChains; ++c) x += sc[c][e];
      s[0][0][e] = x;
    }

    // Per-token scales of 8-bit caches: keys g and g + 8.
    float vs[2];
    if (per_token) {
      const float* sc = reinterpret_cast<const float*>(st + 2 * TileKV::kBytes);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][0][e] *= sc[g + 8 * (e / 2)];
      vs[0] = sc[16 + g], vs[1] = sc[16 + g + 8];
    }

    // Scores in log2 units (raw q.k when the scale is folded), masked where needed.
    score.apply(s, 0, 0, 0, lane, false);  // scale / softcap only: slope 0, no mask
    const bool mask = j0 < 0 || j0 + 16 > seq.len_k || !geom.tile_fully_visible(i0, i1, j0, j0 + 16);
    if (alibi || mask) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ci = e % 2, j = j0 + g + 8 * (e / 2);
        if (alibi) s[0][0][e] -= slope_log2[ci] * geom.alibi_distance(qi[ci], j);
        if (mask && !(j >= 0 && j < seq.len_k && geom.visible(qi[ci], j))) s[0][0][e] = -INFINITY;
      }
    }

    // Online softmax of the two q columns over the block's keys (the 8 lanes sharing t).  A
    // column's running max is raised only when a block passes it by more than kLazyMax
    // (log2 units), so probabilities stay below 2^kLazyMax and the warp skips the
    // accumulator rescale unless some column's max moved.
    float rescale[2];
    bool moved = false;
#pragma unroll
    for (int ci = 0; ci < 2; ++ci) {
      const float mx = col_max(fmaxf(s[0][0][ci], s[0][0][ci + 2])) * post_scale;
      const bool up = mx > row_max[ci] + lazy_max;  // never for -inf; always for the first seen key
      rescale[ci] = up ? softmax_rescale(row_max[ci], mx) : 1.f;
      if (up) row_max[ci] = mx;
      moved |= up;
      const float ref = softmax_ref_max(row_max[ci]);
      float sum = 0.f;
#pragma unroll
      for (int e = ci; e < 4; e += 2) {
        const float pe = fast_exp2(fmaf(s[0][0][e], post_scale, -ref));
        sum += pe;
        s[0][0][e] = per_token ? pe * vs[e / 2] : pe;
      }
      row_sum[ci] = row_sum[ci] * rescale[ci] + sum;  // this lane's keys; summed over lanes at the end
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int m = 0; m < K::kMT; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[m][e] *= rescale[e % 2];
    }

    // O^T += V^T P^T.  P^T's B fragments are the transposes of the two 8x8 halves of S^T.
    const uint32_t pb0 = movmatrix_trans(pack2<Tc>(s[0][0][0], s[0][0][1]));  // keys 0-7
    const uint32_t pb1 = movmatrix_trans(pack2<Tc>(s[0][0][2], s[0][0][3]));  // keys 8-15
    if constexpr (!K::kQuant) {
      const auto at_v = ldsm_at<TileKV>(st + TileKV::kBytes, lane);
#pragma unroll
      for (int m = 0; m < K::kMT; ++m) {
        uint32_t av[4];
        ldmatrix_x4_trans(av, at_v(0, m * 16));
        mma_16816<T>(acc_o[m], av, pb0, pb1);
      }
    } else {
      const uint16_t* sV = reinterpret_cast<const uint16_t*>(st + TileKV::kBytes);
      constexpr int kWords = D / 32;  // bytes [g D/8, (g + 1) D/8) of a row, as words
      uint32_t vw[4][kWords];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int key = 2 * t + (k % 2) + 8 * (k / 2);  // keys 2t, 2t+1, 2t+8, 2t+9
        const uint16_t* src = sV + TileKV::offset(key, g * (D / 16));
        if constexpr (kWords == 2) {
          const uint2 v = *reinterpret_cast<const uint2*>(src);
          vw[k][0] = v.x, vw[k][1] = v.y;
        } else {
#pragma unroll
          for (int ch = 0; ch < kWords / 4; ++ch) {
            const uint4 v = *reinterpret_cast<const uint4*>(sV + TileKV::offset(key, g * (D / 16) + ch * 8));
            vw[k][4 * ch] = v.x, vw[k][4 * ch + 1] = v.y, vw[k][4 * ch + 2] = v.z, vw[k][4 * ch + 3] = v.w;
          }
        }
      }
#pragma unroll
      for (int m = 0; m < K::kMT; ++m) {  // dims dim_of(m, 0), dim_of(m, 1): bytes 2m, 2m + 1
        uint32_t lo[2], hi[2];           // keys 2t, 2t+1 and 2t+8, 2t+9
        Cvt::v_pairs(vw[0][m / 2], vw[1][m / 2], 2 * (m % 2), lo);
        Cvt::v_pairs(vw[2][m / 2], vw[3][m / 2], 2 * (m % 2), hi);
        const uint32_t av[4] = {lo[0], lo[1], hi[0], hi[1]};
        mma_16816<Tc>(acc_o[m], av, pb0, pb1);
      }
    }
    __syncwarp();  // every lane is done with this stage before it is loaded again
  }

  // 4. Merge the warps by LSE through shared memory, then write out (or the split's
  // fp32 partial and LSE).
  cp_async_wait<0>();
  __syncthreads();
  constexpr int kStride = K::kCombineStride, kR = K::kRows;
  float* red_o = reinterpret_cast<float*>(smem);
  float* red_m = red_o + K::kNWarps * kR * kStride;
  float* red_l = red_m + K::kNWarps * kR;
#pragma unroll
  for (int ci = 0; ci < 2; ++ci) {
    const float l = col_sum(row_sum[ci]);
    if (g == 0) red_m[warp * kR + 2 * t + ci] = row_max[ci], red_l[warp * kR + 2 * t + ci] = l;
  }
  __syncthreads();
  float f[2];
#pragma unroll
  for (int ci = 0; ci < 2; ++ci) {
    const int c = 2 * t + ci;
    float m_all = -INFINITY, l_all = 0.f;
#pragma unroll
    for (int w = 0; w < K::kNWarps; ++w) m_all = fmaxf(m_all, red_m[w * kR + c]);
#pragma unroll
    for (int w = 0; w < K::kNWarps; ++w) l_all += red_l[w * kR + c] * softmax_rescale(red_m[w * kR + c], m_all);
    f[ci] = softmax_rescale(row_max[ci], m_all) * ldexpf(softmax_inv_sum(l_all), K::kQuant ? Cvt::kExp : 0) * head_v;
    const int row = r0 + c;
    if (warp == 0 && g == 0 && row < r1) {  // the tile row's LSE, once
      const int64_t idx = dq.lse_index(p, hk * group + row % group, row / group);
      if (num_splits > 1)
        lse_part[(int64_t)split * decode_partial_rows(p) + idx] = softmax_lse(m_all, l_all);
      else if (p.lse != nullptr)
        p.lse[idx] = softmax_lse(m_all, l_all);
    }
  }
#pragma unroll
  for (int m = 0; m < K::kMT; ++m)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      red_o[(warp * kR + 2 * t + e % 2) * kStride + dim_of(m, e / 2)] = acc_o[m][e] * f[e % 2];
  __syncthreads();
  const bool split_out = num_splits > 1;
  for (int idx = tid; idx < kR * (D / 8); idx += K::kThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8, row = r0 + r;
    if (row >= r1 || c >= d) continue;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.f;
#pragma unroll
    for (int w = 0; w < K::kNWarps; ++w)
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] += red_o[(w * kR + r) * kStride + c + e];
    const int i = row / group, h = hk * group + row % group;
    if (split_out) {
      float* dst = o_part + ((int64_t)split * decode_partial_rows(p) + dq.lse_index(p, h, i)) * d + c;
      reinterpret_cast<float4*>(dst)[0] = make_float4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(o[4], o[5], o[6], o[7]);
    } else {
      T* dst = static_cast<T*>(p.out.data) + dq.offset(p.out, i, h) + c;
      *reinterpret_cast<uint4*>(dst) =
          make_uint4(pack2<T>(o[0], o[1]), pack2<T>(o[2], o[3]), pack2<T>(o[4], o[5]), pack2<T>(o[6], o[7]));
    }
  }
}

// The wide kernel needs more shared memory than sm80/sm87 (163 KB) and the 99 KB parts
// (sm86, sm89, sm120, sm121) let a block have, so the dispatch never picks it there and its
// body is left out of their machine code (smaller build and wheel).  Any architecture not
// listed compiles it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || \
                               __CUDA_ARCH__ == 890 || __CUDA_ARCH__ == 1200 || __CUDA_ARCH__ == 1210)
#define FMHA_SKIP_WIDE_DECODE 1
#else
#define FMHA_SKIP_WIDE_DECODE 0
#endif

template <class K>
__global__ void __launch_bounds__(K::kThreads, K::kMinBlocks)
    decode_kernel(const __grid_constant__ fmha_decode_params p, float* o_part, float* lse_part, int num_splits) {
  grid_launch_dependents();  // the split combine's blocks may be placed now (decode.cu)
  if constexpr (K::kWide && FMHA_SKIP_WIDE_DECODE)
    __trap();
  else
    decode_block<K>(p, o_part, lse_part, num_splits);
}

}  // namespace cuda
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace cuda {

template <class Traits>
void run_decode(const fmha_decode_params& p, int num_splits, float* o_part, float* lse_part, cudaStream_t stream) {
  const dim3 grid(num_splits * DecodeWork::m_tiles(p, Traits::kRows), p.num_heads_k, p.batch);
  auto kernel = decode_kernel<Traits>;
  set_max_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, o_part, lse_part, num_splits);
  check_cuda(cudaGetLastError(), "decode_kernel launch");
}

}  // namespace cuda
}  // namespace fmha
