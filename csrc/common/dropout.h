// Dropout: which attention-matrix elements are kept.  The decision for element
// (b, h, i, j) -- batch (sequence) b, query head h, query row i, key column j, both within
// the sequence -- is a pure function of (seed, offset, b, h, i, j).  Every backend calls the
// functions below, so the CPU backend reproduces a GPU's mask bit for bit.
//
// One Philox4x32-10 call yields 128 bits = eight 16-bit numbers, which serve a group of
// eight elements:  rows {r, r + 8} x columns {c, c + 1, c + 8, c + 9}  with
//   r = 16 * (i / 16) + i % 8,   c = 16 * (j / 16) + 2 * ((j % 8) / 2).
// That group is exactly what one thread holds of a 16x16 block of an m16n8k16 (mma.sync)
// accumulator, so the CUDA kernels spend one Philox call per eight elements; the mapping
// is still defined on (i, j) alone and does not depend on any backend's tiles.
//
//   counter = (column group, row group, b * num_heads + h, low 32 bits of offset)
//   key     = (low 32 bits of seed, high 32 bits of seed + high 32 bits of offset)
//   element k = 4 * ((i % 16) / 8) + 2 * ((j % 16) / 8) + j % 2 of the group takes the
//   16-bit half k % 2 (0 = low) of word k / 2 (x, y, z, w).
//
// An element is kept iff its 16-bit number is below round((1 - p) * 65536); kept values
// are scaled by 1 / (1 - p).  The keep probability is within 2^-17 of 1 - p.
#pragma once

#include <stdint.h>

#include "macros.h"
#include "philox.h"

namespace fmha {

struct DropoutParams {
  uint32_t key0, key1;   // from seed and offset
  uint32_t offset_lo;    // counter word w
  uint32_t threshold;    // keep iff the 16-bit number < threshold (0 .. 65536)
  float scale;           // 1 / (1 - p)

  FMHA_HOST_DEVICE static DropoutParams make(float p, uint64_t seed, uint64_t offset) {
    DropoutParams d;
    d.key0 = (uint32_t)seed;
    d.key1 = (uint32_t)(seed >> 32) + (uint32_t)(offset >> 32);
    d.offset_lo = (uint32_t)offset;
    const float keep = 1.0f - p;
    uint32_t t = (uint32_t)(keep * 65536.0f + 0.5f);
    d.threshold = t > 65536u ? 65536u : t;
    d.scale = p > 0.f ? 1.0f / keep : 1.0f;
    return d;
  }

  // Philox output for the group holding (i, j) of sequence b, head h (bh = b * H + h).
  FMHA_HOST_DEVICE U32x4 group_bits(uint32_t bh, int32_t i, int32_t j) const {
    const uint32_t row_group = (uint32_t)(i / 16) * 8u + (uint32_t)(i % 8);
    const uint32_t col_group = (uint32_t)(j / 16) * 4u + (uint32_t)((j % 8) / 2);
    return philox4x32_10(U32x4{col_group, row_group, bh, offset_lo}, key0, key1);
  }

  // The 16-bit number of (i, j) out of its group's Philox output.
  FMHA_HOST_DEVICE static uint32_t element_bits(const U32x4& r, int32_t i, int32_t j) {
    const int k = 4 * ((i % 16) / 8) + 2 * ((j % 16) / 8) + (j % 2);
    const uint32_t word = k < 2 ? r.x : k < 4 ? r.y : k < 6 ? r.z : r.w;
    return (k % 2) ? (word >> 16) : (word & 0xFFFFu);
  }

  FMHA_HOST_DEVICE bool keep(uint32_t bh, int32_t i, int32_t j) const {
    return element_bits(group_bits(bh, i, j), i, j) < threshold;
  }
};

}  // namespace fmha
