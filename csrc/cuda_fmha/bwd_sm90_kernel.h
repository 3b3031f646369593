// Attention backward on sm_90a (the math of bwd_kernel.h, FlashAttention-3's layout of it)
// on our tile layer (tile/sm90.h).  A CTA owns kBlockN keys of one KV head and walks over
// every query block that sees them, for every query head of the group (dK and dV sum over
// the group in registers) or, when that leaves too few CTAs, for its share of the group
// (fp32 shares summed by dkv_reduce_kernel).  Its threads split into warpgroups by role:
//
//   producer (warpgroup 0): one thread brings K and V once, then each query block's Q and
//     dO, by TMA into a ring of kStages stages, and a thread of warp 1 the block's LSE (log2
//     units) and D = rowsum(dO * O) - dLSE from the padded statistics (sequence.h, written
//     by bwd_delta_kernel) by bulk copies; warp 2 hands each block's dQ to the copy engine,
//     which adds it into the fp32 accumulator (one bulk reduction per block).
//   consumers (warpgroups 1, 2, 64 keys each): per query block
//       S^T = K Q^T and dP^T = V dO^T                 (wgmma, both operands from shared)
//       P^T = exp2(S^T - LSE), dS^T = P^T (dP^T - D)   (registers)
//       dV += P^T dO                                   (wgmma, P^T from registers)
//       dQ = dS K, each consumer half of dQ           (wgmma, dS^T through shared memory)
//       dK += dS^T Q, running while dQ is stored       (wgmma, dS^T from registers; kDkAfterDq)
//
// Keys in rows (S^T rather than S) puts P^T and dS^T in the accumulator layout that is
// wgmma's A operand, so dV and dK take them from registers; only dQ needs dS in shared
// memory, read transposed.  Above D = 128 (kSplitD) the consumers share 64 keys and split
// the queries of S^T and the columns of dK, dV, dQ instead, with P^T and dS^T through
// shared memory.
//
// Deterministic mode (dq_locks): the key blocks that reach a query block add their dQ into
// it in a fixed order, highest key block first, each waiting on a counter per (sequence,
// head, query block) that the one before it increments once its addition has landed.
// Under a causal mask or a window a key block's first query block is the last that sees
// the key blocks above it, so the order follows the CTAs' own progress; the grid runs
// the key blocks in the same order (highest first), so that every CTA waited on was
// launched before the waiting one.
#pragma once

#include <math.h>

#include <cstddef>
#include <type_traits>

#include "../common/sequence.h"
#include "../common/softmax.h"
#include "bwd_kernel.h"
#include "fmha/fmha.h"
#include "scores.h"
#include "tile/mma.h"
#include "tile/sm90.h"
#include "tile_order.h"

namespace fmha {
namespace cuda {

struct BwdSm90Maps {
  CUtensorMap q, k, v, dout;
};

// Keys per CTA: 64 per consumer warpgroup up to D = 128, 64 shared above (kSplitD).
constexpr int bwd_sm90_block_n(int head_dim) { return head_dim > 128 ? 64 : 128; }

template <class T_, int kHeadDim_, int kBlockM_, int kStages_, bool kScoreMod_>
struct BwdSm90Traits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kStages = kStages_;
  static constexpr bool kScoreMod = kScoreMod_;
  // Up to D = 128 each consumer owns 64 keys and all of dK's and dV's columns (D fp32
  // registers per thread for the two).  Above, that no longer fits 240 registers: the
  // consumers share kBlockN = 64 keys and split the head dim instead (kSplitD), each
  // computing S^T and dP^T for half the queries and dK, dV, dQ for half the columns, with
  // P^T and dS^T exchanged through shared memory.
  static constexpr bool kSplitD = kHeadDim > 128;
  static constexpr int kConsumers = 2, kBlockN = bwd_sm90_block_n(kHeadDim);
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kQCols = kSplitD ? kBlockM / kConsumers : kBlockM;  // queries of a consumer's S^T
  static constexpr int kDCols = kSplitD ? kHeadDim / kConsumers : kHeadDim;  // its columns of dK, dV
  static constexpr int kNT = kQCols / 8;   // 8-column (query) blocks of S^T per thread
  static constexpr int kDT = kDCols / 8;   // 8-column blocks of dK, dV
  // dQ = dS K splits between the consumers by rows where the block has two 64-row halves
  // (kBlockM = 128, D = 64: each consumer its half, every column, m64n64 products), else by
  // columns (each consumer all 64 rows, half of D).  Split by columns at D = 64, the m64n32
  // products read 3 KB of shared memory per 16 cycles of tensor work, 1.5x what the shared
  // memory delivers; m64n64 reads 4 KB per 32 cycles.
  static constexpr bool kDqRows = kBlockM == 128;
  static constexpr int kDqCols = kDqRows ? kHeadDim : kHeadDim / kConsumers;  // per consumer
  // wgmma reads an MN-major operand from the start of a slab, so the tiles read in column
  // ranges (K for dQ = dS K, and with kSplitD Q and dO for dK = dS^T Q, dV = P^T dO) use
  // slabs that divide those ranges.
  static constexpr int kSlab = kDqCols % 64 == 0 ? 64 : 32;
  static_assert(kDqCols % 32 == 0, "head dims 64, 128, 192, 256");
  static_assert(kBlockM % 64 == 0 && kBlockM <= 128 && (!kSplitD || kBlockM == 64),
                "query block: one or two 64-row halves");
  // Issue order of a block's products: S^T, dP^T, dV, dQ and then dK, so that dK runs while
  // dQ goes to shared memory (FlashAttention-4's sm_90 backward's order).  With kSplitD, dK
  // goes with dV (both read P^T and dS^T from shared memory) and the store waits for all three.
  static constexpr bool kDkAfterDq = !kSplitD;
  // K and V held in registers as the A operands of S^T and dP^T (D / 16 x 4 registers each),
  // so that those products read only Q and dO from shared memory, where registers allow:
  // D = 64 on 64-row query blocks (the score-mod instance).  On 128-row blocks K alone made
  // ptxas serialize the wgmmas (C7512, too few registers).
  static constexpr bool kKVInRegs = !kSplitD && kHeadDim <= 64 && kBlockM == 64;
  // Roles from a warp-uniform warpgroup index (warpgroup_index, tile/sm90.h): the wgmma
  // descriptors then stay in uniform registers instead of being copied there before every
  // wgmma (the main loop's instructions 918 -> 860 at D = 64, 605 -> 406 at D = 256, 695 -> 586
  // at D = 128; 1.00-1.03x at D = 64, 1.00-1.02x at 128 and 1.02-1.05x with a score mod there,
  // docs/tuning.md; at D = 128 it needs the consumers' 240 registers, at 232 ptxas serialized
  // the wgmmas, C7512).  Not with K and V in registers (0.98-0.99x, measured beside an
  // mbarrier change).
  static constexpr bool kUniformRoles = !kKVInRegs;
  // The query blocks that see all of a CTA's keys run in a loop of their own, with the mask
  // compiled out (bwd_sm90_kernel's runs): at D = 64 (128-row blocks) that loop has 661
  // instructions a block against one loop's 914 and the kernel runs 1.00-1.07x (H100,
  // docs/tuning.md).  Not at D = 128 and 192, 0.94-1.00x and 0.95-1.00x though their
  // unmasked loops shrink too (695 -> 514, 490 -> 423; at 192 again 0.94-0.99x with 240
  // registers and the uniform roles), nor at 256 (ptxas rebuilds the
  // descriptors' high words in the later loops, 485 -> 550), nor with a score mod.
  static constexpr bool kMaskRuns = !kScoreMod && kHeadDim == 64;
  using TileQ = Sm90Tile<kBlockM, kHeadDim, kSplitD ? kSlab : (kHeadDim % 64 == 0 ? 64 : 32)>;  // Q and dO stages
  using TileK = Sm90Tile<kBlockN, kHeadDim, kSlab>;
  using TileV = Sm90Tile<kBlockN, kHeadDim>;
  using TileDS = Sm90Tile<kBlockN, kBlockM>;             // dS^T (and with kSplitD P^T), keys in rows
  static_assert(TileK::kBytes == TileV::kBytes, "one transaction count for K and V");
  // Registers per thread after setmaxnreg, launched at 168 (65536 / 384 rounded down to 8):
  // what the producer gives up, (168 - 24) x 128, is what the consumers take, (240 - 168) x
  // 256.  The producer's threads hold no data (the copy engine brings LSE and D too).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  // Shared memory: K | V | Q ring | dO ring | dS^T (two buffers) | P^T (two, kSplitD) |
  // dQ (fp32) | LSE, D rings | mbarriers.  Tiles start on 1024-byte lines (the 128-byte
  // swizzle's period).
  static constexpr int kOffV = TileK::kBytes;
  static constexpr int kOffQ = kOffV + TileV::kBytes;
  static constexpr int kOffDO = kOffQ + kStages * TileQ::kBytes;
  static constexpr int kOffDS = kOffDO + kStages * TileQ::kBytes;
  static constexpr int kOffP = kOffDS + 2 * TileDS::kBytes;
  static constexpr int kOffDQ = kOffP + (kSplitD ? 2 * TileDS::kBytes : 0);
  static constexpr int kOffLse = kOffDQ + kBlockM * kHeadDim * 4;
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffBar = kOffDelta + kStages * kBlockM * 4;
  static constexpr int kBars = 1 + 2 * kStages;
  static constexpr int kSmemBytes = kOffBar + kBars * 8 + 1024;  // + slack to align the base
  static_assert(TileQ::kBytes % 1024 == 0 && TileK::kBytes % 1024 == 0 && TileDS::kBytes % 1024 == 0,
                "tiles on 1024-byte lines");
  // The epilogue stages dK and dV (in TileV's layout) in the Q and dO rings.
  static_assert(2 * TileV::kBytes <= kOffDS - kOffQ, "dK and dV fit the Q/dO rings");
  static_assert(kBlockN * kHeadDim / 8 % (128 * kConsumers) == 0, "whole 16-byte chunks per consumer thread");
};

// Named barriers (0 is __syncthreads): dS^T complete (the consumers), the dQ buffer handed
// between the consumers and the dQ warp, and the consumers' epilogue.
constexpr int kBarDs = 1, kBarDqEmpty = 2, kBarDqFull = 3, kBarDkv = 4;

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ fmha_bwd_params p, const __grid_constant__ BwdSm90Maps maps,
                    float* dq_accum, const float* stats, float* dkv_part, int splits, int* dq_locks,
                    int lock_blocks, int order_units) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename K::T;
  using TileQ = typename K::TileQ;
  using TileK = typename K::TileK;
  using TileV = typename K::TileV;
  using TileDS = typename K::TileDS;
  constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages, D = K::kHeadDim;
  constexpr int kNT = K::kNT, kDT = K::kDT;
  constexpr int kDqThreads = 128 * K::kConsumers + 32;  // the consumers and the dQ warp

  const fmha_problem& pr = p.problem;
  // Unit y = hk * splits + split, b: KV head hk and, with the GQA group split over `splits`
  // CTAs (dkv_part), which share of its query heads this CTA walks.  Deterministic: the
  // grid's order with key blocks last first (a CTA waits for the key blocks above its own).
  int n_block = gridDim.x - 1 - blockIdx.x, y = blockIdx.y, b = blockIdx.z;
  if (dq_locks == nullptr) {
    const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int unit;
    wave_block_order(linear, gridDim.x, gridDim.y * gridDim.z, order_units, n_block, unit);
    y = unit % gridDim.y, b = unit / gridDim.y;
  }
  const int hk = y / splits, split = y % splits;
  const Sequence seq = Sequence::get(pr, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.k_rows) return;
  const int group = pr.num_heads_q / pr.num_heads_k;

  const MaskGeometry geom = MaskGeometry::make(seq.len_q, seq.len_k, pr.window_left, pr.window_right,
                                               pr.mask_align == FMHA_ALIGN_TOP_LEFT);
  // Query blocks [first_m(n), end_m(n)) see key block n (below seq.len_k); both grow with n.
  auto first_m = [&](int n) { return geom.query_begin(n * kBlockN) / kBlockM; };
  auto end_m = [&](int n) {
    return (geom.query_end(min(n * kBlockN + kBlockN, seq.len_k)) + kBlockM - 1) / kBlockM;
  };
  int m_begin = 0, n_m = 0;
  if (n0 < seq.len_k) {
    m_begin = first_m(n_block);
    n_m = max(0, end_m(n_block) - m_begin);
  }
  const int heads = group / splits;  // query heads this CTA walks
  const int n_iters = heads * n_m;
  // Iteration it covers head hk * group + it / n_m, query block m_begin + it % n_m; every
  // role advances the pair by one step.
  struct Step {
    int h, m0;
  };
  auto next = [&](Step s) {
    s.m0 += kBlockM;
    if (s.m0 == (m_begin + n_m) * kBlockM) s.m0 = m_begin * kBlockM, ++s.h;
    return s;
  };
  const Step first{hk * group + split * heads, m_begin * kBlockM};

  extern __shared__ char smem_raw[];
  char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = reinterpret_cast<T*>(smem + K::kOffV);
  T* sQ = reinterpret_cast<T*>(smem + K::kOffQ);
  T* sdO = reinterpret_cast<T*>(smem + K::kOffDO);
  T* sdS = reinterpret_cast<T*>(smem + K::kOffDS);
  float* sdQ = reinterpret_cast<float*>(smem + K::kOffDQ);
  float* sLse = reinterpret_cast<float*>(smem + K::kOffLse);
  float* sDelta = reinterpret_cast<float*>(smem + K::kOffDelta);
  uint64_t* full_kv = reinterpret_cast<uint64_t*>(smem + K::kOffBar);
  uint64_t* full = full_kv + 1;
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, wg = K::kUniformRoles ? warpgroup_index() : tid / 128, lane = tid % 32;
  if (tid == 0) {
    mbar_init(full_kv, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + s, 2);  // the two copying threads' (and the copies' bytes)
      // Every consumer thread arrives once done with the stage: its reads of LSE and D are
      // then ordered before the copy engine's next writes (one arrival per warpgroup after
      // the products would order them only through wgmma's warpgroup-wide issue).
      mbar_init(empty + s, 128 * K::kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();

  // ---------------------------------------------------------------- producer
  if (wg == 0) {
    setmaxnreg_dec<K::kProducerRegs>();
    const int warp = tid / 32;
    if (n_iters == 0) return;
    const int batch = seq.varlen ? 0 : b;  // varlen maps span the packed rows of one "batch"
    if (warp == 0) {
      if (lane != 0) return;
      prefetch_tensormap(&maps.q);
      prefetch_tensormap(&maps.dout);
      mbar_arrive_expect_tx(full_kv, TileK::kBytes + TileV::kBytes);
      const int k_row = (int)seq.k_row0 + n0;
#pragma unroll
      for (int s = 0; s < TileK::kSlabs; ++s)
        tma_load_4d(sK + s * (TileK::kSlabBytes / 2), &maps.k, full_kv, s * TileK::kSlab, k_row, hk, batch);
#pragma unroll
      for (int s = 0; s < TileV::kSlabs; ++s)
        tma_load_4d(sV + s * (TileV::kSlabBytes / 2), &maps.v, full_kv, s * TileV::kSlab, k_row, hk, batch);
      Step cur = first;
#pragma unroll 1
      for (int it = 0; it < n_iters; ++it, cur = next(cur)) {
        const int st = it % kStages;
        mbar_wait(empty + st, ((it / kStages) & 1) ^ 1);  // the first pass finds the stages free
        mbar_arrive_expect_tx(full + st, 2 * TileQ::kBytes);
        const int q_row = (int)seq.q_row0 + cur.m0;
        T* q_st = sQ + st * (TileQ::kBytes / 2);
        T* do_st = sdO + st * (TileQ::kBytes / 2);
#pragma unroll
        for (int s = 0; s < TileQ::kSlabs; ++s) {
          tma_load_4d(q_st + s * (TileQ::kSlabBytes / 2), &maps.q, full + st, s * TileQ::kSlab, q_row, cur.h, batch);
          tma_load_4d(do_st + s * (TileQ::kSlabBytes / 2), &maps.dout, full + st, s * TileQ::kSlab, q_row, cur.h,
                      batch);
        }
      }
    } else if (warp == 1) {
      // LSE and D, whole padded blocks (+inf and 0 past the sequence: P = 0 there), from a
      // thread of their own: in the thread that issues Q and dO, 24 registers spilled.
      if (lane != 0) return;
      static_assert(kBlockM <= kStatBlock && kBlockM * 4 % 16 == 0, "a query block's statistics in one copy");
      const float* stat_lse = stats;
      const float* stat_delta = stats + pr.num_heads_q * padded_stat_rows(pr);
      Step cur = first;
#pragma unroll 1
      for (int it = 0; it < n_iters; ++it, cur = next(cur)) {
        const int st = it % kStages;
        mbar_wait(empty + st, ((it / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(full + st, 2 * kBlockM * 4);
        const int64_t si = seq.stat_index(pr, cur.m0, cur.h);
        bulk_load(sLse + st * kBlockM, stat_lse + si, kBlockM * 4, full + st);
        bulk_load(sDelta + st * kBlockM, stat_delta + si, kBlockM * 4, full + st);
      }
    } else if (warp == 2) {
      // Each block's dQ, once both consumers have written it, goes out as one bulk
      // reduction; the buffer is handed back once the copy engine has read it.
      // Deterministic: query block m's turn counter counts the key blocks above this one
      // that see m (they run from the highest, last_n, down; all between see m, as the
      // ranges of query blocks grow with n) before this CTA adds, and counts this one once
      // its sum is in global memory.
      const int n_last = (seq.len_k + kBlockN - 1) / kBlockN - 1;
      auto last_n = [&](int m) {  // the highest key block that sees query block m
        int lo = n_block, hi = n_last;
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (first_m(mid) <= m) lo = mid;
          else hi = mid - 1;
        }
        return lo;
      };
      named_barrier_arrive(kBarDqEmpty, kDqThreads);
      Step cur = first;
#pragma unroll 1
      for (int it = 0; it < n_iters; ++it, cur = next(cur)) {
        int* lock = nullptr;
        named_barrier_sync(kBarDqFull, kDqThreads);
        if (lane == 0) {
          const int rows = min(kBlockM, seq.len_q - cur.m0), m = cur.m0 / kBlockM;
          if (dq_locks != nullptr) {
            lock = dq_locks + ((int64_t)b * pr.num_heads_q + cur.h) * lock_blocks + m;
            const int turn = last_n(m) - n_block;
            // A turn that never comes would be an ordering bug: an error after 10 s, not a hang.
            const uint64_t t0 = global_timer_ns();
            while (ld_acquire_gpu(lock) != turn)
              if (global_timer_ns() - t0 > 10000000000ull) __trap();
            fence_proxy_async_global();  // the earlier sums, before the copy engine adds
          }
          bulk_reduce_add_f32(dq_accum + dq_accum_index(pr, seq, cur.m0, cur.h, D), sdQ, (uint32_t)(rows * D * 4));
          bulk_commit();
          bulk_wait_read();
        }
        __syncwarp();
        if (it + 1 < n_iters) named_barrier_arrive(kBarDqEmpty, kDqThreads);
        if (lock != nullptr) {
          bulk_wait();
          fence_proxy_async_global();
          red_release_gpu_add(lock, 1);
        }
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  setmaxnreg_inc<K::kConsumerRegs>();
  const int cw = wg - 1;  // consumer index
  const int tid_wg = tid % 128, warp_wg = tid_wg / 32;
  const int g = lane / 4, t = lane % 4;
  constexpr bool kSplitD = K::kSplitD;
  constexpr int kQCols = K::kQCols, kDCols = K::kDCols;
  const int key_wg = kSplitD ? 0 : cw * 64;          // this consumer's first key row in the block
  const int q_wg = kSplitD ? cw * kQCols : 0;        // its first query column of S^T
  const int d_wg = kSplitD ? cw * kDCols : 0;        // its first column of dK and dV
  const int key0 = n0 + key_wg + warp_wg * 16;       // this warp's first key
  // Where a consumer's column range starts in a tile of slabs.
  auto cols = [](const T* tile, auto tile_tag, int c) {
    using Tile = decltype(tile_tag);
    return tile + (c / Tile::kSlab) * (Tile::kSlabBytes / 2);
  };
  const KMajorDesc<TileK> desc_k(sK, key_wg);        // A of S^T = K Q^T
  const KMajorDesc<TileV> desc_v(sV, key_wg);        // A of dP^T = V dO^T
  const int dq_row0 = K::kDqRows ? cw * 64 : 0, dq_col0 = K::kDqRows ? 0 : cw * K::kDqCols;  // this consumer's part of dQ
  const MnMajorDesc<TileK> desc_kt(cols(sK, TileK{}, dq_col0));  // B of dQ = dS K

  float acc_dk[kDT][4], acc_dv[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[n][e] = acc_dv[n][e] = 0.f;

  // A fragments (rows g, g + 8, columns 2t, 8 + 2t of each 16-column step) into a keys-in-
  // rows tile, at this warp's rows and columns from c0 (a multiple of 32): one stmatrix per
  // step, its four 8x8 matrices the fragment's four registers, lane l addressing row l % 8
  // of matrix l / 8, chunk (l / 16) of the step.  The row's swizzle and that chunk bit XOR
  // into one base (row starts are 128-byte aligned), the step's chunk pair into that.
  static_assert(TileDS::kSpan == 128, "dS^T rows of 128-byte spans");
  const uint32_t st_base = (smem_addr(sdS) + (key_wg + warp_wg * 16 + (lane / 8 % 2) * 8 + lane % 8) * TileDS::kSpan) ^
                           (((lane / 16) ^ (lane % 8)) * 16);
  auto store_t = [&](T* tile, const uint32_t (&a)[1][kNT / 2][4], int c0) {
    // Opaque to the compiler, so that it XORs in the loop rather than hoist kNT / 2
    // addresses into registers (with a score mod at D = 128 they spilled).
    uint32_t base = st_base + (uint32_t)((tile - sdS) * sizeof(T));
    asm volatile("" : "+r"(base));
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
      const int chunk = c0 / 8 + 2 * kk;  // even: the chunk pair of the step
      stmatrix_x4((base + (chunk / 8) * TileDS::kSlabBytes) ^ ((chunk % 8) * 16), a[0][kk]);
    }
  };

  // This thread's first dQ element in the fp32 buffer: row dq_row0 + warp_wg * 16 + g,
  // column dq_col0 + 2t.
  static_assert(K::kDqCols % 32 == 0, "whole groups of four chunks per consumer");
  const uint32_t dq_row = smem_addr(sdQ) + ((dq_row0 + warp_wg * 16 + g) * D + dq_col0 + 2 * t) * 4;

  if (n_iters > 0) mbar_wait(full_kv, 0);
  uint32_t k_frag[K::kKVInRegs ? D / 16 : 1][4], v_frag[K::kKVInRegs ? D / 16 : 1][4];
  if constexpr (K::kKVInRegs) {
    // ldmatrix: lane l addresses row l % 8 of matrix l / 8 (rows +8 for matrices 1, 3; the
    // second 8-column chunk for 2, 3), the order of an A fragment's registers.
    const unsigned r = unsigned(key_wg + warp_wg * 16 + (lane / 8 % 2) * 8 + lane % 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned c = unsigned(16 * kk + lane / 16 * 8);
      ldmatrix_x4(k_frag[kk], smem_addr(sK + TileK::offset(r, c)));
      ldmatrix_x4(v_frag[kk], smem_addr(sV + TileV::offset(r, c)));
    }
  }
  // One (head, query block) step.  `mask_run`: std::true_type or std::false_type in the runs
  // below (kMaskRuns), so that the blocks that need no mask run without a branch on it;
  // nullptr where one loop tests every block.
  Step cur = first;
  int it = 0;
  auto step = [&](auto mask_run) {
    const int st = it % kStages, h = cur.h, m0 = cur.m0;
    const T* sQs = sQ + st * (TileQ::kBytes / 2);
    const T* sdOs = sdO + st * (TileQ::kBytes / 2);
    T* sdSs = sdS + (it % 2) * (TileDS::kBytes / 2);
    const ScoreMod score = ScoreMod::make<K::kScoreMod>(pr, geom, b, h);
    mbar_wait(full + st, (it / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T, two groups (this consumer's queries).
    float acc_s[1][kNT][4], acc_dp[1][kNT][4], th[1][kNT][4];
    {
      const KMajorDesc<TileQ> desc_q(sQs, q_wg), desc_do(sdOs, q_wg);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        if constexpr (K::kKVInRegs)
          Wgmma<T, kQCols>::template rs<0>(acc_s[0], k_frag[kk], desc_q.k_desc(kk), kk > 0);
        else
          Wgmma<T, kQCols>::template ss<0, 0>(acc_s[0], desc_k.k_desc(kk), desc_q.k_desc(kk), kk > 0);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        if constexpr (K::kKVInRegs)
          Wgmma<T, kQCols>::template rs<0>(acc_dp[0], v_frag[kk], desc_do.k_desc(kk), kk > 0);
        else
          Wgmma<T, kQCols>::template ss<0, 0>(acc_dp[0], desc_v.k_desc(kk), desc_do.k_desc(kk), kk > 0);
      wgmma_commit();
    }
    wgmma_wait<1>();
    fence_operand(acc_s[0]);

    // P^T = exp2(S^T - LSE): this thread's columns are queries q_wg + n * 8 + 2t (+1).
    bool mask;
    if constexpr (std::is_same_v<decltype(mask_run), std::nullptr_t>)  // one loop: each block tests
      mask = score.needs_mask(m0 + q_wg, m0 + q_wg + kQCols, n0 + key_wg, 64);
    else
      mask = decltype(mask_run)::value;
    score.template apply<K::kScoreMod, true>(acc_s, th, key0, 16, m0 + q_wg, lane, mask);
    const float* lse_st = sLse + st * kBlockM + q_wg;
    const float* delta_st = sDelta + st * kBlockM + q_wg;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float2 l = *reinterpret_cast<const float2*>(lse_st + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) exp2_row(acc_s[0], n, e, score.post_scale, e % 2 ? l.y : l.x);
    }
    wgmma_wait<0>();
    fence_operand(acc_dp[0]);
    // dS^T = P^T (dP^T - D) (* softcap').
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float2 dl = *reinterpret_cast<const float2*>(delta_st + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float ds = acc_s[0][n][e] * (acc_dp[0][n][e] - (e % 2 ? dl.y : dl.x));
        if (K::kScoreMod) ds *= 1.f - th[0][n][e] * th[0][n][e];
        acc_dp[0][n][e] = ds;
      }
    }
    uint32_t a_p[1][kNT / 2][4], a_ds[1][kNT / 2][4];
    acc_to_a<T>(a_p, acc_s);
    acc_to_a<T>(a_ds, acc_dp);

    // dV += P^T dO, dK += dS^T Q (dO and Q are MN-major B operands: K = queries).  Keys
    // split: P^T and dS^T are this consumer's registers; head dim split: each consumer holds
    // half of them, so both go through shared memory and every consumer reads them whole.
    if constexpr (kSplitD) {
      T* sPs = reinterpret_cast<T*>(smem + K::kOffP) + (it % 2) * (TileDS::kBytes / 2);
      store_t(sPs, a_p, q_wg);
      store_t(sdSs, a_ds, q_wg);
      fence_proxy_async_shared();  // visible to wgmma after the barrier
      named_barrier_sync(kBarDs, 128 * K::kConsumers);
      const KMajorDesc<TileDS> desc_p(sPs, 0), desc_ds(sdSs, 0);
      const MnMajorDesc<TileQ> desc_dot(cols(sdOs, TileQ{}, d_wg)), desc_qt(cols(sQs, TileQ{}, d_wg));
      fence_operand(acc_dv);
      fence_operand(acc_dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Wgmma<T, kDCols>::template ss<0, 1>(acc_dv, desc_p.k_desc(kk), desc_dot.k_desc(kk), 1);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Wgmma<T, kDCols>::template ss<0, 1>(acc_dk, desc_ds.k_desc(kk), desc_qt.k_desc(kk), 1);
      wgmma_commit();
    } else {
      // kDkAfterDq: dV now, dK after dQ (below).
      const MnMajorDesc<TileQ> desc_dot(sdOs), desc_qt(sQs);
      fence_operand(acc_dv);
      fence_operand(acc_dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) Wgmma<T, D>::template rs<1>(acc_dv, a_p[0][kk], desc_dot.k_desc(kk), 1);
      if constexpr (!K::kDkAfterDq) {
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          Wgmma<T, D>::template rs<1>(acc_dk, a_ds[0][kk], desc_qt.k_desc(kk), 1);
      }
      wgmma_commit();
    }

    // dS^T into its buffer (keys split: each consumer its rows), then dQ = dS K over all
    // keys, this consumer's half (kDqRows).
    if constexpr (!kSplitD) {
      store_t(sdSs, a_ds, 0);
      fence_proxy_async_shared();  // visible to wgmma after the barrier
      named_barrier_sync(kBarDs, 128 * K::kConsumers);
    }
    float acc_dq[K::kDqCols / 8][4];
    {
      const MnMajorDesc<TileDS> desc_dst(cols(sdSs, TileDS{}, dq_row0));  // dS: queries dq_row0 ..
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        Wgmma<T, K::kDqCols>::template ss<1, 1>(acc_dq, desc_dst.k_desc(kk), desc_kt.k_desc(kk), kk > 0);
    }
    wgmma_commit();
    if constexpr (K::kDkAfterDq) {
      const MnMajorDesc<TileQ> desc_qt(sQs);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) Wgmma<T, D>::template rs<1>(acc_dk, a_ds[0][kk], desc_qt.k_desc(kk), 1);
      wgmma_commit();
      wgmma_wait<1>();  // dV and dQ are done; dK runs on while dQ is stored
      fence_operand(acc_dv);
    } else {
      wgmma_wait<1>();  // dV and dK are done with this stage's Q and dO
      fence_operand(acc_dv);
      fence_operand(acc_dk);
      mbar_arrive(empty + st);
      wgmma_wait<0>();
    }
    fence_operand(acc_dq);

    // dQ into the fp32 buffer in the accumulator's layout (swizzle included), for the dQ
    // warp's bulk reduction, in 8-byte stores.  dq_accum_swizzle depends on the row mod 4, so
    // rows g and g + 8 of every 16-row slab share it, and it flips the low two bits of an
    // 8-column chunk index (this consumer's first chunk is a multiple of 4): four chunk
    // addresses per thread, the rest immediates.
    named_barrier_sync(kBarDqEmpty, kDqThreads);
    const int zq = dq_accum_swizzle(seq.lse_index(pr, m0, h) + g) / 8;
    uint32_t dq_addr[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) dq_addr[k] = dq_row + ((k ^ zq) * 8) * 4;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int n = 0; n < K::kDqCols / 8; ++n)
        st_shared_v2(dq_addr[n % 4] + (8 * rr * D + n / 4 * 32) * 4, acc_dq[n][2 * rr], acc_dq[n][2 * rr + 1]);
    fence_proxy_async_shared();
    named_barrier_arrive(kBarDqFull, kDqThreads);
    if constexpr (K::kDkAfterDq) {
      wgmma_wait<0>();  // dK is done with this stage's Q
      fence_operand(acc_dk);
      mbar_arrive(empty + st);
    }
    ++it;
    cur = next(cur);
  };
  if constexpr (K::kMaskRuns) {
    // Query blocks [j_begin, j_end) of every head see all of this CTA's keys: a run with no
    // mask between the masked blocks of the diagonal (first) and of a window's far edge or
    // the end of the queries (last).  Decided for the whole tile, so the bounds are
    // warp-uniform; a block outside the middle run is masked, which is always exact.
    const ScoreMod tile_score = ScoreMod::make<false>(pr, geom, b, 0);  // needs_mask reads geom alone
    auto tile_needs_mask = [&](int j) {
      const int m0 = (m_begin + j) * kBlockM;
      return tile_score.needs_mask(m0, m0 + kBlockM, n0, kBlockN);
    };
    int j_begin = 0;
    while (j_begin < n_m && tile_needs_mask(j_begin)) ++j_begin;
    int j_end = j_begin;
    while (j_end < n_m && !tile_needs_mask(j_end)) ++j_end;
    const int tail = n_m - j_end;
    while (it < n_iters) {  // one head a pass
      for (const int end = it + j_begin; it < end;) step(std::true_type{});
      for (const int end = it + j_end - j_begin; it < end;) step(std::false_type{});
      for (const int end = it + tail; it < end;) step(std::true_type{});
    }
  } else {
    while (it < n_iters) step(nullptr);
  }

  // Epilogue: dK = scale * acc_dk and dV, from registers, rows inside the sequence's keys.
  // Group split: this CTA's share into its fp32 plane of dkv_part ([split][dK, dV][row][Hk]
  // [D], every column), for dkv_reduce_kernel; otherwise into dK and dV, columns inside
  // head_dim only.
  if (dkv_part != nullptr) {
    const int64_t rows = seq.varlen ? pr.total_k : (int64_t)pr.batch * pr.seqlen_k;
    const int64_t plane = rows * pr.num_heads_k * D;
    const int64_t row0 = (seq.varlen ? seq.k_row0 : (int64_t)b * pr.seqlen_k) + n0;
    float* part_dk = dkv_part + 2 * split * plane;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int j = key_wg + warp_wg * 16 + g + 8 * rr;
      if (n0 + j < seq.k_rows) {
        float* dst = part_dk + ((row0 + j) * pr.num_heads_k + hk) * D;
#pragma unroll
        for (int n = 0; n < kDT; ++n) {
          const int c = d_wg + n * 8 + 2 * t;
          *reinterpret_cast<float2*>(dst + c) = make_float2(acc_dk[n][2 * rr] * pr.scale, acc_dk[n][2 * rr + 1] * pr.scale);
          *reinterpret_cast<float2*>(dst + plane + c) = make_float2(acc_dv[n][2 * rr], acc_dv[n][2 * rr + 1]);
        }
      }
    }
    return;
  }
  // dK and dV through shared memory, out in 16-byte rows: the fragments' 4-byte stores
  // straight to global memory took 32% of the consumers' stall samples at D = 128, S = 512
  // causal (Nsight Compute).  The Q and dO rings are free once both consumers are past
  // their last products (the producer has no copy left in flight).
  using TileO = TileV;
  T* sdK = reinterpret_cast<T*>(smem + K::kOffQ);
  T* sdV = sdK + TileO::kBytes / 2;
  named_barrier_sync(kBarDkv, 128 * K::kConsumers);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const unsigned j = unsigned(key_wg + warp_wg * 16 + g + 8 * rr);
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      const unsigned c = unsigned(d_wg + n * 8 + 2 * t);
      *reinterpret_cast<uint32_t*>(sdK + TileO::offset(j, c)) =
          pack2<T>(acc_dk[n][2 * rr] * pr.scale, acc_dk[n][2 * rr + 1] * pr.scale);
      *reinterpret_cast<uint32_t*>(sdV + TileO::offset(j, c)) = pack2<T>(acc_dv[n][2 * rr], acc_dv[n][2 * rr + 1]);
    }
  }
  named_barrier_sync(kBarDkv, 128 * K::kConsumers);
  T* gdk = static_cast<T*>(p.dk.data) + seq.k_offset(p.dk, n0, hk);
  T* gdv = static_cast<T*>(p.dv.data) + seq.k_offset(p.dv, n0, hk);
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < kBlockN * kChunks / (128 * K::kConsumers); ++i) {
    const unsigned idx = unsigned(tid - 128) + i * 128 * K::kConsumers;
    const int r = int(idx / kChunks), c = int(idx % kChunks) * 8;
    const bool ok = n0 + r < seq.k_rows && c < pr.head_dim;
    copy_16_if(gdk + r * p.dk.row_stride + c, sdK + TileO::offset(r, c), ok);
    copy_16_if(gdv + r * p.dv.row_stride + c, sdV + TileO::offset(r, c), ok);
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace cuda
}  // namespace fmha

#include "launch.h"
#include "rowwise.h"
#include "tma.h"

namespace fmha {
namespace cuda {

// The CTAs launch in wave_block_order (tile_order.h) outside deterministic mode.  Returns
// false, launching nothing, when the copy engine cannot describe the tensors or the
// dQ accumulator is not 16-byte aligned (the caller then runs the mma.sync kernels).
// stats: the padded statistics (sequence.h), 16-byte aligned.  splits > 1 (bwd_sm90_splits, dispatch.cu): the GQA group shared by that many CTAs, dkv_part
// the room for their fp32 shares of dK and dV (bwd_sm90_dkv_part_bytes).  dq_locks (zeros,
// deterministic mode): a turn counter per (sequence, query head, query block of 64 rows or
// more), lock_blocks per (sequence, head).
template <class K>
bool run_bwd_sm90(const fmha_bwd_params& p, float* dq_accum, const float* stats, float* dkv_part, int splits,
                  int* dq_locks, int lock_blocks, cudaStream_t stream) {
  const fmha_problem& pr = p.problem;
  if (reinterpret_cast<uintptr_t>(dq_accum) % 16 != 0 || reinterpret_cast<uintptr_t>(stats) % 16 != 0) return false;
  const bool varlen = pr.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? pr.total_q : pr.seqlen_q, rows_k = varlen ? pr.total_k : pr.seqlen_k;
  const int64_t batches = varlen ? 1 : pr.batch;
  BwdSm90Maps maps;
  auto encode = [&](CUtensorMap* map, const fmha_tensor& t, int64_t rows, int heads, int slab, int box_rows) {
    return encode_tensor_map(map, t.data, pr.dtype, pr.head_dim, rows, heads, batches, t.row_stride, t.head_stride,
                             t.batch_stride, slab, box_rows);
  };
  if (!encode(&maps.q, p.q, rows_q, pr.num_heads_q, K::TileQ::kSlab, K::kBlockM) ||
      !encode(&maps.dout, p.dout, rows_q, pr.num_heads_q, K::TileQ::kSlab, K::kBlockM) ||
      !encode(&maps.k, p.k, rows_k, pr.num_heads_k, K::TileK::kSlab, K::kBlockN) ||
      !encode(&maps.v, p.v, rows_k, pr.num_heads_k, K::TileV::kSlab, K::kBlockN))
    return false;
  const int n_blocks = (pr.seqlen_k + K::kBlockN - 1) / K::kBlockN;
  if (n_blocks == 0 || pr.batch == 0) return true;
  if (splits < 1 || dkv_part == nullptr) splits = 1;
  const dim3 grid(n_blocks, pr.num_heads_k * splits, pr.batch);
  auto kernel = bwd_sm90_kernel<K>;
  set_max_smem(reinterpret_cast<const void*>(kernel), K::kSmemBytes);
  kernel<<<grid, K::kThreads, K::kSmemBytes, stream>>>(p, maps, dq_accum, stats, splits > 1 ? dkv_part : nullptr,
                                                        splits, dq_locks, lock_blocks,
                                                        wave_order_units(pr, n_blocks, device_sm_count()));
  check_cuda(cudaGetLastError(), "bwd_sm90_kernel launch");
  if (splits > 1) {
    const int64_t rows = varlen ? pr.total_k : (int64_t)pr.batch * pr.seqlen_k;
    if (rows > 0) {
      dkv_reduce_kernel<typename K::T><<<dim3((unsigned)((rows + kRowWarps - 1) / kRowWarps), pr.num_heads_k),
                                   32 * kRowWarps, 0, stream>>>(p, dkv_part, rows, splits, K::kHeadDim);
      check_cuda(cudaGetLastError(), "dkv_reduce_kernel launch");
    }
  }
  return true;
}

}  // namespace cuda
}  // namespace fmha
