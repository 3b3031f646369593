// Tile configuration of every kernel, by head dimension: the one place tile sizes are
// chosen.  Start points were FlashAttention-2's sm80 choices; the ones kept won on an H200
// in tools/tune/tune_kernels.cu (docs/tuning.md).  All fit sm80/sm90 shared memory.
#pragma once

#include "../common/build_options.h"
#include "bwd_kernel.h"
#include "bwd_sm90_kernel.h"
#include "decode_kernel.h"
#include "fwd_kernel.h"
#include "fwd_sm90_kernel.h"

namespace fmha {
namespace cuda {

// Head dimensions with kernels: kHeadDims (common/build_options.h); others run padded to the
// next one (multiple of 8 first), as do head dims a reduced build leaves out.

// kNLong is the key block for query tiles that see kFwdLongKeys keys or more (dispatch.cu
// counts seqlen_k without a mask, half of it with one).  It differs only at D = 64: blocks of
// 96 are 4-12% faster from 512 unmasked keys up (their last block's padding is skipped,
// fwd_kernel.h), but under a causal mask at 512 keys, where tiles see 128-512 keys, 64 wins
// by 8-10% (tune_kernels, docs/tuning.md).  tools/gen_instances.py reads this table and
// FwdSm90Tile's (one specialization per line) to list the long tiles' instances.
template <int D>
struct FwdTile;  // kBlockM, kBlockN, kNWarps, kNLong
template <> struct FwdTile<32> { static constexpr int kM = 128, kN = 128, kWarps = 4, kNLong = kN; };
template <> struct FwdTile<64> { static constexpr int kM = 128, kN = 64, kWarps = 4, kNLong = 96; };
template <> struct FwdTile<96> { static constexpr int kM = 128, kN = 48, kWarps = 4, kNLong = kN; };
template <> struct FwdTile<128> { static constexpr int kM = 128, kN = 48, kWarps = 4, kNLong = kN; };
template <> struct FwdTile<192> { static constexpr int kM = 128, kN = 64, kWarps = 8, kNLong = kN; };
template <> struct FwdTile<256> { static constexpr int kM = 64, kN = 64, kWarps = 4, kNLong = kN; };
constexpr int kFwdLongKeys = 512;
// Head dims whose forward also has instances without the softcap and ALiBi passes, for
// problems that use neither (tools/gen_instances.py reads the dims off the line below).
// The plain kernel runs 1.4-2.2% faster at D = 128 (40 B of spills instead of 88) and
// 2.4-3.9% at D = 96; at D = 64 it ran up to 1.3% slower on the tiles the dispatch picks
// and at D = 256 within +-1%, so those keep one instance for every problem; D = 32 and 192
// were not measured (tune_kernels, docs/tuning.md).
template <int D>
constexpr bool kFwdPlain = D == 96 || D == 128;

// The sm_90a forward (fwd_sm90_kernel.h): query rows per CTA (64 per consumer warpgroup),
// keys per block and ring depth, and the tile (kMLong x kNLong) where a tile sees kLongKeys
// keys or more (seqlen_k, half of it under a mask; dispatch.cu).  Measured with
// tools/tune/tune_sm90.cu on an H200 (docs/tuning.md, "The sm_90a forward"): 128 x 128 at
// D = 64-128; long, D = 64 takes 192 x 128 from 2048 keys (three consumers in turns,
// FlashAttention-3's tile; with the key loop in runs by mask, 1.11-1.22x at 2-4k keys, O
// bitwise equal, and level at 1k: H100); D = 128 keeps 128 keys at every length (176-key
// blocks from 8192, chosen before the key loop ran by mask, ran 0.96-0.99x at 8-16k keys
// since: H100); 96 keys at D = 192, and 112 from 4096 keys
// (FlashAttention-4's block there: 2-5% faster from 4k as dispatched, 2-4% slower at 1-2k);
// at D = 256 64 keys below 1024 keys a tile (6-10% faster than 80 there, whose
// last block is mostly empty at S = 512) and 80 from 1024, what fits 227 KB (equal at
// 1024, 15% faster than 64 at S = 2k, 6-16% from S = 4k).  kPagedStages: the ring's depth
// for a paged cache without softcap or ALiBi: three at D = 128 (O then leaves through the Q
// buffer), B = 1 with 16k keys of context in pages of 16 1.03-1.04x faster than two, the
// other paged-prefill shapes 0.98-1.02x (H100, docs/tuning.md "Paged caches"); the other
// head dims were not measured.
template <int D>
struct FwdSm90Tile {
  static constexpr int kM = 128, kN = 128, kStages = 2, kMLong = kM, kNLong = kN, kLongKeys = 8192, kPagedStages = kStages;
};
template <> struct FwdSm90Tile<64> {
  static constexpr int kM = 128, kN = 128, kStages = 2, kMLong = 192, kNLong = kN, kLongKeys = 2048, kPagedStages = kStages;
};
template <> struct FwdSm90Tile<128> {
  static constexpr int kM = 128, kN = 128, kStages = 2, kMLong = kM, kNLong = kN, kLongKeys = 8192, kPagedStages = 3;
};
template <> struct FwdSm90Tile<192> {
  static constexpr int kM = 128, kN = 96, kStages = 2, kMLong = kM, kNLong = 112, kLongKeys = 4096, kPagedStages = kStages;
};
template <> struct FwdSm90Tile<256> {
  static constexpr int kM = 128, kN = 64, kStages = 2, kMLong = kM, kNLong = 80, kLongKeys = 1024, kPagedStages = kStages;
};
template <int D>
constexpr bool kFwdSm90HasLong = FwdSm90Tile<D>::kMLong != FwdSm90Tile<D>::kM || FwdSm90Tile<D>::kNLong != FwdSm90Tile<D>::kN;
template <int D>
constexpr bool kFwdSm90HasPaged = FwdSm90Tile<D>::kPagedStages != FwdSm90Tile<D>::kStages;

template <int D>
struct BwdTile;  // kBlockM, kBlockN, Q/dO stages
template <> struct BwdTile<32> { static constexpr int kM = 128, kN = 128, kStages = 2; };
template <> struct BwdTile<64> { static constexpr int kM = 128, kN = 128, kStages = 2; };
template <> struct BwdTile<96> { static constexpr int kM = 64, kN = 128, kStages = 2; };
template <> struct BwdTile<128> { static constexpr int kM = 64, kN = 128, kStages = 1; };
template <> struct BwdTile<192> { static constexpr int kM = 64, kN = 64, kStages = 1; };
template <> struct BwdTile<256> { static constexpr int kM = 64, kN = 64, kStages = 1; };

// Backward tiles for GPUs with 99 KB of shared memory per block (sm86/89/120), where the
// tiles above do not fit: one Q/dO stage and smaller blocks, 80 KB at most.  D = 256 has
// none (32 x 64 would need 104 KB); its backward needs sm80/sm90-class shared memory.
template <int D>
struct BwdSmallTile { static constexpr int kM = 64, kN = 64, kStages = 1; };
template <> struct BwdSmallTile<192> { static constexpr int kM = 32, kN = 64, kStages = 1; };
template <int D>
constexpr bool kHasSmallBwd = D <= 192;

template <class T, int D, bool kDropout, bool kLong = false, bool kScoreMod = true>
using FwdConfig = FwdTraits<T, D, FwdTile<D>::kM, kLong ? FwdTile<D>::kNLong : FwdTile<D>::kN, FwdTile<D>::kWarps,
                            kDropout, kScoreMod>;

template <class T, int D, bool kScoreMod, bool kLong = false>
using FwdSm90Config = FwdSm90Traits<T, D, kLong ? FwdSm90Tile<D>::kMLong : FwdSm90Tile<D>::kM,
                                    kLong ? FwdSm90Tile<D>::kNLong : FwdSm90Tile<D>::kN, FwdSm90Tile<D>::kStages, kScoreMod>;
// A paged cache's plain instance where its ring is deeper (kFwdSm90HasPaged).
template <class T, int D>
using FwdSm90PagedConfig = FwdSm90Traits<T, D, FwdSm90Tile<D>::kM, FwdSm90Tile<D>::kN, FwdSm90Tile<D>::kPagedStages, false>;
// The fp8 forward (e4m3 in, bf16 out; k-steps of 32 keys): 128 x 128 tiles at head dims 64,
// 128 and 256, and longer key blocks where a tile sees kLongKeys keys or more (as above).
// The V^T pass and the kernel together (tools/tune/tune_sm90.cu -DTUNE_FP8 on an H200,
// docs/tuning.md): at D = 64 256 keys, +8-9% at S = 512-1k and +12-17% from 2k unmasked,
// under a causal mask 2-7% slower at 512-1k and +4-16% from 2k (192 keys: 1-5 points
// behind 256 everywhere); at D = 128 192 keys, level at 2-4k, +3-6% at 8-16k, 8-12% slower
// at 512-1k (256 keys spill 144 B and ran 0.86-1.01x).  K/V rings of two stages, three at
// D = 64 (one H100, kernel and pass against two, O bitwise equal: S = 512 1.08-1.09x, causal
// 1k 1.04x, from 2k 1.00-1.02x, with softcap level; four 0.99-1.05x against two; three at
// D = 128 0.98-1.03x, mean 1.00; D = 256 has no room for a third).
template <int D>
struct FwdSm90Fp8Tile {
  static constexpr int kM = 128, kN = 128, kNLong = kN, kLongKeys = 0, kStages = 2;
};
template <> struct FwdSm90Fp8Tile<64> {
  static constexpr int kM = 128, kN = 128, kNLong = 256, kLongKeys = 1024, kStages = 3;
};
template <> struct FwdSm90Fp8Tile<128> {
  static constexpr int kM = 128, kN = 128, kNLong = 192, kLongKeys = 4096, kStages = 2;
};
template <int D, bool kScoreMod, bool kLong = false>
using FwdSm90Fp8Config =
    FwdSm90Traits<__nv_fp8_e4m3, D, FwdSm90Fp8Tile<D>::kM, kLong ? FwdSm90Fp8Tile<D>::kNLong : FwdSm90Fp8Tile<D>::kN,
                  FwdSm90Fp8Tile<D>::kStages, kScoreMod>;
static_assert(FwdSm90Config<__half, 256, true>::kSmemBytes <= 232448 &&
                  FwdSm90Fp8Config<256, true>::kSmemBytes <= 232448 &&
                  FwdSm90Fp8Config<128, true, true>::kSmemBytes <= 232448 &&
                  FwdSm90Config<__half, 128, true, true>::kSmemBytes <= 232448 &&
                  FwdSm90PagedConfig<__half, 128>::kSmemBytes <= 232448,
              "the sm90 forward's tiles must fit 227 KB");

// The sm_90a backward (bwd_sm90_kernel.h): at head dims 64 and 128, 128 keys per CTA (64
// per consumer warpgroup) and query blocks in a ring of two stages; at 192 and 256, 64 keys
// shared by both consumers (the head dim split between them), 64-row query blocks, two
// stages at 192 and one at 256, where the fp32 dQ block (64 KB) leaves room for one
// (others, dropout and seqused_k run on the mma.sync backward).  Query blocks of 128 rows
// at D = 64 (4-8% faster than 64 in the benchmark, docs/tuning.md), 64 with softcap/ALiBi
// there (the tanh kept for the gradient would spill 436 B at 128) and at D = 128 (dK, dV
// take 128 registers).
template <class T, int D, bool kScoreMod>
using BwdSm90Config = BwdSm90Traits<T, D, D == 64 && !kScoreMod ? 128 : 64, D == 256 ? 1 : 2, kScoreMod>;
static_assert(BwdSm90Config<__half, 128, true>::kSmemBytes <= 232448 &&
                  BwdSm90Config<__half, 192, true>::kSmemBytes <= 232448 &&
                  BwdSm90Config<__half, 256, true>::kSmemBytes <= 232448,
              "the sm90 backward's tiles must fit 227 KB");

template <class T, int D, bool kDropout, bool kScoreMod>
using BwdConfig = BwdTraits<T, D, BwdTile<D>::kM, BwdTile<D>::kN, BwdTile<D>::kStages, kDropout, kScoreMod>;

template <class T, int D, bool kDropout, bool kScoreMod>
using BwdSmallConfig = BwdTraits<T, D, BwdSmallTile<D>::kM, BwdSmallTile<D>::kN, BwdSmallTile<D>::kStages, kDropout,
                                 kScoreMod, true>;

// Decode: head dims 64, 128, 256 (others run with zero-filled columns); the tile and ring
// depth follow from the head dim and cache kind (decode_kernel.h).
template <class T, CacheKind kCache, int D>
using DecodeConfig = DecodeTraits<T, kCache, D>;

// 8-bit caches at D <= 128 on GPUs with about 200 KB of shared memory per block (sm90, sm100).
template <class T, CacheKind kCache, int D>
using DecodeWideConfig = DecodeTraits<T, kCache, D, true>;
template <int D>
constexpr bool kHasDecodeWide = D <= 128;

template <class T, int D, bool kDropout, bool kScoreMod>
using BwdDqConfig = BwdDqTraits<T, D, 64, (D <= 128 ? 64 : 32), kDropout, kScoreMod>;

// sm86/89/120 let a block opt in to 101376 bytes (99 KB); the sm90-only dQ block is not
// added there.  The deterministic dQ kernel's tiles fit as they are.
constexpr int kSmallSmemLimit = 101376;
static_assert(BwdSmallConfig<__half, 32, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdSmallConfig<__half, 64, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdSmallConfig<__half, 96, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdSmallConfig<__half, 128, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdSmallConfig<__half, 192, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdDqConfig<__half, 128, true, true>::kSmemBytes <= kSmallSmemLimit &&
                  BwdDqConfig<__half, 192, true, true>::kSmemBytes <= kSmallSmemLimit,
              "the backward's 99 KB tiles must fit 99 KB");

}  // namespace cuda
}  // namespace fmha
