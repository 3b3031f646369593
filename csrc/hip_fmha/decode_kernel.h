// Decode attention against a KV cache (flash_attn_with_kvcache) on CDNA matrix cores:
// flash-decoding, the CUDA backend's design (csrc/cuda_fmha/decode_kernel.h) in this
// backend's MFMA vocabulary.
//
// A workgroup owns one (sequence, KV head, query tile, split): the query rows of every query head that
// shares the KV head are packed into one 16-row tile (row r = i * group + head-in-group), so
// each cache row is read once for the whole group.  The cache range the tile can see is cut
// into 16-row blocks of cache positions; a split takes a contiguous run of blocks, and its
// four waves take every fourth block each, with no workgroup barrier in the loop: each wave
// keeps its own online softmax, and the waves merge by LSE at the end.  Splits are merged by
// decode_combine_kernel (decode_rowwise.h) from fp32 partials.
//
// Positions, not keys, are tiled: blocks start at multiples of 16 in the cache, so a block
// never straddles a page (page sizes are multiples of 16) and needs one block-table lookup.
// Key j is position leftpad + j; positions outside [leftpad, filled + seqlen_new) read as
// zeros (CacheRegs::load) and are masked.
//
// One wave, one block, as the forward does it (fwd_kernel.h), with v_mfma_f32_16x16x16:
//   S^T = K Q^T   K straight from global memory into A fragments, Q^T held as B fragments
//                 for the whole loop; each lane then holds one packed row's scores of 4 keys
//   O^T += V^T P^T  V through the wave's own LDS tile (read column-wise), P^T from the
//                 score registers; 16 keys are exactly one k-step.
// For q.k the head dimension is permuted, identically for q and k, so that a lane's 16-byte
// load serves two k-steps: lane l reads columns 32 t + 8 (l / 16) .. + 7 of its key row and
// k-step s uses columns 32 (s / 2) + 8 (l / 16) + 4 (s % 2) .. + 3.
//
// 8-bit caches (fp8 e4m3, int8) are loaded as bytes and converted to f16/bf16 in registers
// (tile/cvt8.h); k_scale multiplies each key's score and v_scale each key's probability
// (after the row sum), never each element.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

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
#include "tile/buffer.h"
#include "tile/cvt8.h"
#include "tile/lds.h"
#include "tile/mfma.h"

namespace fmha {
namespace hip {

template <class T_, CacheKind kCache_, int kHeadDim_>
struct DecodeTraits {
  using T = T_;
  static constexpr CacheKind kCache = kCache_;
  static constexpr bool kQuant = kCache != CacheKind::kPlain;
  static constexpr int kElemBytes = kQuant ? 1 : 2;  // of the cache
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int N = 16;  // v_mfma_f32_16x16x16: 16 packed rows x 16 keys per block
  static constexpr int kWaves = 4, kThreads = kWaves * kWaveSize;
  static_assert(kHeadDim % 32 == 0, "decode head dims are 64, 128, 256");
  using TileQ = LdsTile<16, kHeadDim>;
  using TileV = LdsTile<16, kHeadDim>;  // one per wave
  static constexpr int kReduceStride = kHeadDim + 4;  // fp32 row stride of the wave merge
  static constexpr int kReduceBytes = 2 * 16 * kReduceStride * 4;
  // q, the V tiles and the merge buffer are live one after another and share the LDS.
  static constexpr int kVBytes = kWaves * TileV::kBytes;
  static constexpr int kLdsBytes0 = kVBytes > TileQ::kBytes ? kVBytes : TileQ::kBytes;
  static constexpr int kLdsBytes = kLdsBytes0 > kReduceBytes ? kLdsBytes0 : kReduceBytes;
  static_assert(kLdsBytes <= 65536, "gfx90a and gfx942 have 64 KB of LDS per workgroup");
  // Waves per SIMD the register allocator must allow (amdgpu_waves_per_eu): decode is
  // bound by memory, so occupancy is what hides the cache loads.  Chosen from the resource
  // report (docs/amd.md), not from timings: at head dim 128 asking for 3 (at most 168
  // registers) keeps every variant free of spills except bf16 with a plain cache, which
  // spills two VGPRs there and stays at 2; at 256 nothing below 256 VGPRs fits.
  static constexpr int kMinWaves =
      kHeadDim <= 64 ? 4 : kHeadDim <= 128 ? (std::is_same_v<T, bf16> && !kQuant ? 2 : 3) : 1;
};

// A 16-row cache block in global memory: row 0 at `base` (a position below the cache's
// capacity, so always addressable), rows [row_lo, row_hi) valid (inside the sequence),
// head_dim d.  Plain global loads of an in-bounds address and a select do the bounds
// check here, rather than a buffer descriptor (tile/buffer.h) rebuilt for every block:
// the lower bound (left padding) is per block, and the loop's scalar registers are
// already crowded by the paging and masking state.
struct CacheBlock {
  const char* base;
  uint32_t row_bytes;
  int32_t row_lo, row_hi;
};

// One wave's share of a 16-row cache block in registers: lane l holds row l % 16 and, of
// each 32-column chunk t, columns 32 t + 8 (l / 16) .. + 7 (16 bytes of T, 8 of an 8-bit
// cache).
template <class K>
struct CacheRegs {
  using T = typename K::T;
  static constexpr int kChunks = K::kHeadDim / 32;
  using Chunk = std::conditional_t<K::kQuant, i32x2, i32x4>;
  Chunk c[kChunks];

  FMHA_DEVICE static int col(int t, int lane) { return 32 * t + 8 * (lane / 16); }

  // Rows outside the sequence and columns past head_dim arrive as zeros (their address is
  // row 0, column 0's, which is always in bounds).
  FMHA_DEVICE void load(const CacheBlock& g, int d, int lane) {
    typedef const __attribute__((address_space(1))) Chunk* GlobalChunk;
    const int r = lane % 16;
    const bool row_ok = r >= g.row_lo && r < g.row_hi;
#pragma unroll
    for (int t = 0; t < kChunks; ++t) {
      const bool ok = row_ok && col(t, lane) < d;
      const uint32_t off = ok ? (uint32_t)r * g.row_bytes + (uint32_t)(col(t, lane) * K::kElemBytes) : 0u;
      const Chunk v = *(GlobalChunk)(g.base + off);
      c[t] = ok ? v : Chunk{};
    }
  }

  // Columns 4 h .. 4 h + 3 of chunk t as a Frag of T.
  FMHA_DEVICE Frag frag(int t, int h) const {
    if constexpr (K::kCache == CacheKind::kPlain)
      return h == 0 ? Frag{c[t].x, c[t].y} : Frag{c[t].z, c[t].w};
    else if constexpr (K::kCache == CacheKind::kFp8)
      return fp8x4_frag<T>((uint32_t)(h == 0 ? c[t].x : c[t].y));
    else
      return int8x4_frag<T>((uint32_t)(h == 0 ? c[t].x : c[t].y));
  }

  // The A operand of q.k's k-step s (the permuted head dimension above).
  FMHA_DEVICE Frag frag_k(int s) const { return frag(s / 2, s % 2); }

  // Into an LDS tile as T, in the natural column order.
  FMHA_DEVICE void store(const typename K::TileV& tile, int lane) const {
#pragma unroll
    for (int t = 0; t < kChunks; ++t) {
      tile.store8(lane % 16, col(t, lane), frag(t, 0));
      tile.store8(lane % 16, col(t, lane) + 4, frag(t, 1));
    }
  }
};

template <class K>
__global__ void __launch_bounds__(K::kThreads) __attribute__((amdgpu_waves_per_eu(K::kMinWaves)))
    decode_kernel(const fmha_decode_params p, float* o_part, float* lse_part, int num_splits) {
  using T = typename K::T;
  constexpr int N = K::N, D = K::kHeadDim, kEB = K::kElemBytes;
  using TileQ = typename K::TileQ;
  using TileV = typename K::TileV;

  // Grid (query tiles x splits, Hk, B), splits fastest.  Packed queries (cu_seqlens_q):
  // the tiles cover max_seqlen_q, and those past this sequence's rows have nothing to do.
  // (hk through readfirstlane: the bare workgroup id fed to uniform_copy below makes
  // clang-19 fail with "illegal VGPR to SGPR copy".)
  const int split = block_x() % num_splits, b = block_z(), hk = __builtin_amdgcn_readfirstlane(block_y());
  const int group = p.num_heads_q / p.num_heads_k;
  const DecodeQuery dq = DecodeQuery::get(p, b);
  const int rows = dq.len * group;
  const int r0 = (block_x() / num_splits) * 16, r1 = min(r0 + 16, rows);
  if (r0 >= rows) return;  // the whole workgroup, before any barrier
  const int tid = thread_id(), lane = lane_id(), wave = wave_id();

  // The arguments the cache loop and the epilogue read, copied once (tile/arch.h,
  // uniform_copy); from here on they are read from `pc`.
  fmha_decode_params pc = p;
  pc.batch = uniform_copy(p.batch);
  pc.seqlen_q = uniform_copy(p.seqlen_q);
  pc.num_heads_q = uniform_copy(p.num_heads_q);
  pc.out.data = uniform_copy(p.out.data);
  pc.out.batch_stride = uniform_copy(p.out.batch_stride);
  pc.out.row_stride = uniform_copy(p.out.row_stride);
  pc.out.head_stride = uniform_copy(p.out.head_stride);
  pc.lse = uniform_copy(p.lse);
  pc.block_table = uniform_copy(p.block_table);
  pc.block_table_stride = uniform_copy(p.block_table_stride);
  pc.cache_batch_idx = uniform_copy(p.cache_batch_idx);
  pc.cache_batch = uniform_copy(p.cache_batch);
  pc.cache_seqlen = uniform_copy(p.cache_seqlen);
  pc.num_heads_k = uniform_copy(p.num_heads_k);
  pc.k_scale = uniform_copy(p.k_scale);
  pc.v_scale = uniform_copy(p.v_scale);
  pc.k_cache.batch_stride = uniform_copy(p.k_cache.batch_stride);
  pc.k_cache.row_stride = uniform_copy(p.k_cache.row_stride);
  pc.v_cache.batch_stride = uniform_copy(p.v_cache.batch_stride);
  pc.v_cache.row_stride = uniform_copy(p.v_cache.row_stride);
  const int d = uniform_copy(p.head_dim);

  const CacheView cv{&pc, b};
  const DecodeSequence seq = DecodeSequence::get(p, b);
  const MaskGeometry geom = MaskGeometry::make(dq.len, seq.len_k, p.window_left, p.window_right, false);
  const int i0 = r0 / group, i1 = (r1 - 1) / group + 1;  // query rows of the tile
  const int kb = geom.key_begin(i0), ke = max(kb, geom.key_end(i1));
  const int blk_begin = (seq.leftpad + kb) / 16, blk_end = (seq.leftpad + ke + 15) / 16;
  const int per_split = ceil_div(blk_end - blk_begin, num_splits);
  const int my_begin = blk_begin + split * per_split, my_end = min(my_begin + per_split, blk_end);
  const int n_mine = my_end - my_begin > wave ? ceil_div(my_end - my_begin - wave, K::kWaves) : 0;

  __shared__ __attribute__((aligned(16))) char lds[K::kLdsBytes];
  __shared__ float red_m[K::kWaves][16], red_l[K::kWaves][16];
  const TileQ sQ{reinterpret_cast<uint16_t*>(lds)};
  const TileV sV{reinterpret_cast<uint16_t*>(lds + wave * TileV::kBytes)};

  // 1. Gather the packed q rows into LDS (zeros past the tile's rows and the head dim).
  const uint16_t* q = static_cast<const uint16_t*>(p.q.data);
  for (int idx = tid; idx < 16 * (D / 8); idx += K::kThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
    // An unconditional load from a clamped address, then zeros: no divergent branch.
    const bool ok = r0 + r < r1 && c < d;
    const int row = min(r0 + r, r1 - 1), cc = min(c, d - 8);
    i32x4 v = *reinterpret_cast<const i32x4*>(q + dq.offset(p.q, row / group, hk * group + row % group) + cc);
    v = ok ? v : i32x4{0, 0, 0, 0};
    sQ.store8(r, c, i32x2{v.x, v.y});
    sQ.store8(r, c + 4, i32x2{v.z, v.w});
  }
  barrier();

  // 2. Rotary embedding of q in place (fp32 math, rounded back to T as CUDA does), then the
  // Q^T fragments of every k-step into registers.
  if (p.rotary_dim > 0) {
    const int half = p.rotary_dim / 2;
    const bool per_row = p.window_left >= 0 || p.window_right >= 0;
    const uint16_t* cos_t = static_cast<const uint16_t*>(p.rotary_cos);
    const uint16_t* sin_t = static_cast<const uint16_t*>(p.rotary_sin);
    for (int idx = tid; idx < 16 * half; idx += K::kThreads) {
      const int r = idx / half, k = idx % half, row = r0 + r;
      if (row >= r1) continue;
      const int pos = clamp_index((int64_t)seq.filled + (per_row ? row / group : 0), 0, p.seqlen_ro - 1);
      int a, c;
      rotary_pair(k, p.rotary_dim, p.rotary_interleaved != 0, &a, &c);
      float x = to_float<T>(sQ.load2(r, a)), y = to_float<T>(sQ.load2(r, c));
      rotate_pair(&x, &y, to_float<T>(cos_t[(int64_t)pos * half + k]), to_float<T>(sin_t[(int64_t)pos * half + k]));
      sQ.data[TileQ::offset(r, a)] = to_bits<T>(x);
      sQ.data[TileQ::offset(r, c)] = to_bits<T>(y);
    }
    barrier();
  }
  Frag rQ[D / 16];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) rQ[s] = sQ.load8(lane % 16, 32 * (s / 2) + 8 * (lane / 16) + 4 * (s % 2));
  barrier();  // every wave has its Q^T: the V tiles may overwrite q

  // Scores: scale and softcap by ScoreMod; ALiBi (a slope per packed row) and the mask here,
  // for this lane's packed row r0 + l % 16 (rows past the tile repeat its last row).
  const bool alibi = p.alibi_slopes != nullptr;
  const ScoreMod score = ScoreMod::make(p.scale, p.softcap, alibi, 0.f, geom);
  const int my_row = min(r0 + lane % 16, rows - 1);
  const int qi = my_row / group;
  const float slope_log2 =
      alibi ? p.alibi_slopes[(int64_t)b * p.alibi_batch_stride + hk * group + my_row % group] * kLog2e : 0.f;
  const bool per_token = K::kQuant && p.scaling == FMHA_SCALE_PER_TOKEN;
  const float head_k_scale = K::kQuant && !per_token ? p.k_scale[hk] : 1.f;
  const float head_v_scale = K::kQuant && !per_token ? p.v_scale[hk] : 1.f;

  // The wave's 16-row blocks at cache position pos0 (a multiple of 16): one block-table
  // lookup for K, V and the scales; rows outside [leftpad, end) and columns past head_dim
  // out of range.
  const char* k_head =
      uniform_copy(static_cast<const char*>(p.k_cache.data) + (int64_t)hk * p.k_cache.head_stride * kEB);
  const char* v_head =
      uniform_copy(static_cast<const char*>(p.v_cache.data) + (int64_t)hk * p.v_cache.head_stride * kEB);
  auto block = [&](const char* head, const fmha_tensor& t, int outer, int row0, int pos0) {
    const int64_t off = (int64_t)outer * t.batch_stride + (int64_t)row0 * t.row_stride;
    return CacheBlock{head + off * kEB, (uint32_t)(t.row_stride * kEB), seq.leftpad - pos0, seq.end() - pos0};
  };
  auto block_pos = [&](int it) { return (my_begin + wave + K::kWaves * it) * 16; };

  Acc<N> acc_o[D / N];  // O^T: head-dim rows, the packed query rows in the lanes
  clear<N>(acc_o);
  float row_max = -INFINITY, row_sum = 0.f;  // of packed row r0 + l % 16
  CacheRegs<K> rK, rV;
  int outer = 0, row0 = 0;  // of the block in flight
  if (n_mine > 0) {
    outer = cv.outer(block_pos(0)), row0 = cv.row(block_pos(0));
    rK.load(block(k_head, pc.k_cache, outer, row0, block_pos(0)), d, lane);
    rV.load(block(v_head, pc.v_cache, outer, row0, block_pos(0)), d, lane);
  }

  for (int it = 0; it < n_mine; ++it) {
    const int pos0 = block_pos(it);
    const int j0 = pos0 - seq.leftpad;  // key of the block's first row
    const bool more = it + 1 < n_mine;
    const int outer_it = outer, row0_it = row0;
    if (more) outer = cv.outer(pos0 + 16 * K::kWaves), row0 = cv.row(pos0 + 16 * K::kWaves);

    // V_it into the wave's LDS tile; V_{it+1} in flight from here on.
    wave_barrier();  // the previous block's V reads are done
    rV.store(sV, lane);
    wave_barrier();
    if (more) rV.load(block(v_head, pc.v_cache, outer, row0, pos0 + 16 * K::kWaves), d, lane);

    // Per-key scales of 8-bit caches for this lane's keys j0 + 4 (l / 16) + r; 0 for
    // positions outside the sequence, whose scores are masked and whose V rows are zeros.
    // The loads are unconditional (a branch per lane costs exec-mask registers): the row is
    // clamped into the page or contiguous sequence, so the index is always in bounds.
    float ks[4], vs[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) ks[r] = head_k_scale, vs[r] = head_v_scale;
    if (per_token) {
      const int64_t base = (int64_t)outer_it * pc.cache_seqlen * pc.num_heads_k + hk;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = acc_row<N>(r, lane), pos = pos0 + row;
        const bool ok = pos >= seq.leftpad && pos < seq.end();
        const int64_t idx = base + (int64_t)min(row0_it + row, pc.cache_seqlen - 1) * pc.num_heads_k;
        const float k_s = pc.k_scale[idx], v_s = pc.v_scale[idx];
        ks[r] = ok ? k_s : 0.f;
        vs[r] = ok ? v_s : 0.f;
      }
    }

    // S^T = K Q^T (Algorithm 1, line 9), then K_{it+1} in flight.
    Acc<N> acc_s[1];
    clear<N>(acc_s);
    gemm<T, N, D / 16>(
        acc_s, [&](int, int s) { return rK.frag_k(s); }, [&](int s) { return rQ[s]; });
    if (more) rK.load(block(k_head, pc.k_cache, outer, row0, pos0 + 16 * K::kWaves), d, lane);

    // Scores in log2 units (raw q.k when the scale is folded), masked where needed.
    if constexpr (K::kQuant) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc_s[0][r] *= ks[r];
    }
    score.apply<false>(acc_s, acc_s, ScoreCoords<true, N>{j0, r0, lane}, false);  // scale / softcap only
    const bool mask = j0 < 0 || j0 + 16 > seq.len_k || !geom.tile_fully_visible(i0, i1, j0, j0 + 16);
    if (alibi || mask) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = j0 + acc_row<N>(r, lane);
        float s = acc_s[0][r];
        if (alibi) s -= slope_log2 * geom.alibi_distance(qi, j);
        const bool ok = (j >= 0) & (j < seq.len_k) & geom.visible(qi, j);
        acc_s[0][r] = (!mask || ok) ? s : -INFINITY;
      }
    }

    // Online softmax (lines 10-11): the column's max over its 4 x 4 lanes' keys.
    float mx = fmaxf(fmaxf(acc_s[0][0], acc_s[0][1]), fmaxf(acc_s[0][2], acc_s[0][3]));
    mx = fmaxf(row_max, row_reduce_max<N>(mx) * score.post_scale);
    const float rescale = softmax_rescale(row_max, mx);
    const float ref = softmax_ref_max(mx);
    row_max = mx;
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float pe = fast_exp2(fmaf(acc_s[0][r], score.post_scale, -ref));
      sum += pe;
      acc_s[0][r] = K::kQuant ? pe * vs[r] : pe;
    }
    row_sum = row_sum * rescale + sum;
#pragma unroll
    for (int m = 0; m < D / N; ++m) acc_o[m] *= rescale;

    // O^T += V^T P^T (line 12): one k-step of 16 keys, at most 128 head-dim rows of O^T
    // per call (at head dim 256 the V^T fragments of all 256 rows at once would push the
    // kernel past 256 VGPRs).
    constexpr int kMB = D / N > 8 ? 8 : D / N;
#pragma unroll
    for (int h = 0; h < D / N / kMB; ++h) {
      Acc<N>(&acc_part)[kMB] = *reinterpret_cast<Acc<N>(*)[kMB]>(&acc_o[h * kMB]);
      gemm<T, N, 1>(
          acc_part, [&](int m, int) { return frag_cols<N>(sV, 0, (h * kMB + m) * N, lane); },
          [&](int) { return acc_frag<T, N>(acc_s[0], 0); });
    }
  }

  // 3. Merge the four waves by LSE (lines 14-15 across waves): statistics first, then the
  // rescaled O^T of waves 2, 3 into two fp32 slots, waves 0, 1 added in, a fixed order.
  const float l = row_reduce_sum<N>(row_sum);
  if (lane < 16) red_m[wave][lane] = row_max, red_l[wave][lane] = l;
  barrier();  // also: every wave is done with its V tile, which the slots overwrite
  float m_all = -INFINITY, l_all = 0.f;
#pragma unroll
  for (int w = 0; w < K::kWaves; ++w) m_all = fmaxf(m_all, red_m[w][lane % 16]);
#pragma unroll
  for (int w = 0; w < K::kWaves; ++w) l_all += red_l[w][lane % 16] * softmax_rescale(red_m[w][lane % 16], m_all);
  const float f = softmax_rescale(row_max, m_all) * softmax_inv_sum(l_all);
#pragma unroll
  for (int m = 0; m < D / N; ++m) acc_o[m] *= f;
  const int row_l = r0 + lane % 16;
  if (wave == 0 && lane < 16 && row_l < r1) {  // the tile row's LSE, once
    const int64_t idx = dq.lse_index(pc, hk * group + row_l % group, row_l / group);
    if (num_splits > 1)
      lse_part[(int64_t)split * decode_partial_rows(pc) + idx] = softmax_lse(m_all, l_all);
    else if (pc.lse != nullptr)
      pc.lse[idx] = softmax_lse(m_all, l_all);
  }
  constexpr int kStride = K::kReduceStride;
  float* red = reinterpret_cast<float*>(lds);
  // Register r of block m: packed row l % 16, head-dim column m N + 4 (l / 16) + r.
  auto slot = [&](int k, int m) {
    return reinterpret_cast<f32x4*>(red + (k * 16 + lane % 16) * kStride + m * N + 4 * (lane / 16));
  };
  if (wave >= 2) {
#pragma unroll
    for (int m = 0; m < D / N; ++m) *slot(wave - 2, m) = acc_o[m];
  }
  barrier();
  if (wave < 2) {
#pragma unroll
    for (int m = 0; m < D / N; ++m) *slot(wave, m) = *slot(wave, m) + acc_o[m];
  }
  barrier();

  // 4. Out (or the split's fp32 partial): four columns per thread.
  const bool split_out = num_splits > 1;
  for (int idx = tid; idx < 16 * (D / 4); idx += K::kThreads) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4, row = r0 + r;
    if (row >= r1 || c >= d) continue;
    const f32x4 o = *reinterpret_cast<const f32x4*>(red + r * kStride + c) +
                    *reinterpret_cast<const f32x4*>(red + (16 + r) * kStride + c);
    const int i = row / group, h = hk * group + row % group;
    if (split_out) {
      float* dst = o_part + ((int64_t)split * decode_partial_rows(pc) + dq.lse_index(pc, h, i)) * d + c;
      *reinterpret_cast<f32x4*>(dst) = o;
    } else {
      uint16_t* dst = static_cast<uint16_t*>(pc.out.data) + dq.offset(pc.out, i, h) + c;
      *reinterpret_cast<i32x2*>(dst) = i32x2{(int32_t)pack2<T>(o.x, o.y), (int32_t)pack2<T>(o.z, o.w)};
    }
  }
}

}  // namespace hip
}  // namespace fmha

#include "launch.h"

namespace fmha {
namespace hip {

template <class Traits>
void run_decode(const fmha_decode_params& p, int num_splits, float* o_part, float* lse_part, hipStream_t stream) {
  const dim3 grid(num_splits * DecodeWork::m_tiles(p), p.num_heads_k, p.batch);
  decode_kernel<Traits><<<grid, Traits::kThreads, 0, stream>>>(p, o_part, lse_part, num_splits);
  check_hip(hipGetLastError(), "decode_kernel launch");
}

}  // namespace hip
}  // namespace fmha
