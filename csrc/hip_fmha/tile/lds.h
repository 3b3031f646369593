// Tiles in LDS (shared memory: 64 KB per workgroup on gfx90a and gfx942) and the
// cooperative copy of a global tile into one.
#pragma once

#include <stdint.h>

#include "arch.h"
#include "buffer.h"

namespace fmha {
namespace hip {

// kRows x kCols 16-bit elements, row-major, each row padded by 4 elements (8 bytes).  The
// matrix-core operand reads (mfma.h) fetch 8 bytes from each of 16 or 32 consecutive rows;
// with the padding, a row stride is 2 mod 32 banks (kCols a multiple of 64) or 10 or 18 mod
// 32 (multiples of 16 and 32), and 16 consecutive rows land on 16 distinct bank pairs --
// all 32 banks once, the fewest passes an 8-byte read can take.
template <int kRows_, int kCols_>
struct LdsTile {
  static constexpr int kRows = kRows_, kCols = kCols_;
  static_assert(kCols % 16 == 0, "tile width must be a multiple of 16 elements");
  static constexpr int kStride = kCols + 4;  // elements
  static constexpr int kBytes = kRows * kStride * 2;

  uint16_t* data;

  FMHA_DEVICE static int offset(int r, int c) { return r * kStride + c; }
  FMHA_DEVICE uint16_t load2(int r, int c) const { return data[offset(r, c)]; }
  FMHA_DEVICE i32x2 load8(int r, int c) const { return *reinterpret_cast<const i32x2*>(data + offset(r, c)); }
  FMHA_DEVICE void store8(int r, int c, i32x2 v) const { *reinterpret_cast<i32x2*>(data + offset(r, c)) = v; }
};

// The part of a kRows x kCols tile one of kThreads threads copies: 16-byte chunks, chunk
// idx = tid + it * kThreads at row idx / (kCols / 8).  Loading into registers and storing
// into LDS are separate steps, so a kernel can issue the loads of the next tile before the
// math on the current one and store them after it.
template <class Tile, int kThreads>
struct TileCopy {
  static constexpr int kChunksPerRow = Tile::kCols / 8;
  static constexpr int kChunks = Tile::kRows * kChunksPerRow;
  static constexpr int kIters = (kChunks + kThreads - 1) / kThreads;

  i32x4 regs[kIters];

  // Rows and columns outside `src`'s valid part arrive as zeros.
  FMHA_DEVICE void load(const GlobalTile& src, int tid) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = tid + it * kThreads;
      const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
      regs[it] = (kChunks % kThreads == 0 || idx < kChunks) ? src.load16(r, c) : i32x4{0, 0, 0, 0};
    }
  }

  FMHA_DEVICE void store(const Tile& dst, int tid) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = tid + it * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
      // Rows are 8-byte aligned (the padding), so two 8-byte writes (ds_write2_b64).
      dst.store8(r, c, i32x2{regs[it].x, regs[it].y});
      dst.store8(r, c + 4, i32x2{regs[it].z, regs[it].w});
    }
  }
};

}  // namespace hip
}  // namespace fmha
