// Dropout on a tile of the attention matrix, with csrc/common/dropout.h's mapping bit for
// bit.  One Philox call serves a group of eight elements (rows {r, r + 8} x columns
// {c, c + 1, c + 8, c + 9} of a 16 x 16 block), and no MFMA layout holds such a group in
// one lane.  So the workgroup draws the tile's groups cooperatively -- each thread whole
// groups, one Philox call each, as few calls as the mapping allows -- and writes one keep
// byte per element into LDS, where every lane then reads the bytes of its own elements.
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <stdint.h>

#include "../common/dropout.h"

namespace fmha {
namespace hip {

// Keep bytes (1 = keep) of the tile [i0, i0 + kRows) x [j0, j0 + kCols) (queries x keys),
// stored with keys contiguous (kKeysContiguous: the forward and dQ kernels, whose lanes
// hold four consecutive keys) or queries contiguous (the dK/dV kernel).
template <int kRows, int kCols, bool kKeysContiguous>
struct KeepMask {
  static_assert(kRows % 16 == 0 && kCols % 16 == 0, "Philox groups tile 16 x 16 blocks");
  static constexpr int kBytes = kRows * kCols;
  uint8_t* data;

  FMHA_DEVICE static int index(int i, int j) { return kKeysContiguous ? i * kCols + j : j * kRows + i; }

  // i0 and j0 (positions in the sequence) are multiples of 16, so the tile's groups are
  // whole.  Group g: 16 x 16 block g / 32, row g % 8 of its upper half, column pair
  // (g / 8) % 4 of its left half.
  template <int kThreads>
  FMHA_DEVICE void draw(const DropoutParams& d, uint32_t bh, int i0, int j0, int tid) const {
    constexpr int kGroups = kRows * kCols / 8, kBlocksPerRow = kCols / 16;
#pragma unroll
    for (int it = 0; it < ceil_div(kGroups, kThreads); ++it) {
      const int g = tid + it * kThreads;
      if (kGroups % kThreads != 0 && g >= kGroups) break;
      const int blk = g / 32;
      const int r = 16 * (blk / kBlocksPerRow) + g % 8, c = 16 * (blk % kBlocksPerRow) + 2 * ((g / 8) % 4);
      const U32x4 bits = d.group_bits(bh, i0 + r, j0 + c);
#pragma unroll
      for (int k = 0; k < 8; ++k) {  // k: the element's index in the group (dropout.h)
        const int ii = r + 8 * (k / 4), jj = c + 8 * ((k / 2) % 2) + k % 2;
        data[index(ii, jj)] = DropoutParams::element_bits(bits, i0 + ii, j0 + jj) < d.threshold;
      }
    }
  }

  // The keep bytes of (i, j) and the next three elements along the contiguous dimension
  // (byte e for element + e); the index is a multiple of 4.
  FMHA_DEVICE uint32_t four(int i, int j) const { return *reinterpret_cast<const uint32_t*>(data + index(i, j)); }
};

}  // namespace hip
}  // namespace fmha
