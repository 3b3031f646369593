// Tile configuration of every kernel, by head dimension: the one place tile sizes are
// chosen.  No AMD GPU was available to time them, so they were chosen by resource
// arithmetic and the compiler's resource report (docs/amd.md): no scratch on gfx90a and
// gfx942, LDS within 64 KB, and the higher reported occupancy where two shapes both fit
// (v_mfma 16x16x16 at head dim 128: two waves per SIMD, where 32x32x8 gets one).  Tuning
// them on MI200/MI300 hardware is future work.
#pragma once

#include "../common/build_options.h"
#include "bwd_dq_kernel.h"
#include "bwd_kernel.h"
#include "decode_kernel.h"
#include "fwd_kernel.h"

namespace fmha {
namespace hip {

// Head dimensions with kernels: kHeadDims (common/build_options.h); others run padded to the
// next one (multiple of 8 first), as do head dims a reduced build leaves out.

// Forward and deterministic dQ: N (MFMA shape = queries per wave) and kBlockN (keys per
// LDS block).  Large head dims take the 16x16 shape: 16 queries per wave halve the
// registers that hold Q and O^T, which at 32 queries would not fit without scratch.
template <int D>
struct RowTile;
template <> struct RowTile<32> { static constexpr int N = 32, kBlockN = 64; };
template <> struct RowTile<64> { static constexpr int N = 32, kBlockN = 64; };
template <> struct RowTile<96> { static constexpr int N = 32, kBlockN = 32; };
template <> struct RowTile<128> { static constexpr int N = 16, kBlockN = 32; };
template <> struct RowTile<192> { static constexpr int N = 16, kBlockN = 32; };
template <> struct RowTile<256> { static constexpr int N = 16, kBlockN = 32; };

// dK/dV kernel: query rows per step (its keys are fixed: 64, 16 per wave); fewer rows for
// large head dims keep K, V and dK^T, dV^T in registers without scratch.
template <int D>
struct ColTile;
template <> struct ColTile<32> { static constexpr int kBlockM = 64; };
template <> struct ColTile<64> { static constexpr int kBlockM = 64; };
template <> struct ColTile<96> { static constexpr int kBlockM = 32; };
template <> struct ColTile<128> { static constexpr int kBlockM = 32; };
template <> struct ColTile<192> { static constexpr int kBlockM = 16; };
template <> struct ColTile<256> { static constexpr int kBlockM = 16; };

template <class T, int D, bool kDropout>
using FwdConfig = FwdTraits<T, D, RowTile<D>::N, RowTile<D>::kBlockN, kDropout>;

template <class T, int D, bool kDropout, bool kScoreMod>
using BwdConfig = BwdTraits<T, D, ColTile<D>::kBlockM, kDropout, kScoreMod>;

template <class T, int D, bool kDropout, bool kScoreMod>
using BwdDqConfig = BwdDqTraits<T, D, RowTile<D>::N, RowTile<D>::kBlockN, kDropout, kScoreMod>;

// Decode: 16 packed query rows and 16-key blocks per wave (v_mfma_f32_16x16x16), four
// waves; instances for head dims 64, 128, 256 (others run padded to the next, as on CUDA).
template <class T, CacheKind kCache, int D>
using DecodeConfig = DecodeTraits<T, kCache, D>;

}  // namespace hip
}  // namespace fmha
