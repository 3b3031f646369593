// Shared-memory tiles of 16-bit elements, swizzled so that ldmatrix (eight 16-byte rows per
// 8x8 matrix) and the 16-byte cp.async writes hit distinct banks; and the cooperative
// copies between such tiles and global memory.
#pragma once

#include <stdint.h>

#include "ptx.h"

namespace fmha {
namespace cuda {

// kRows x kCols elements (kCols a multiple of 32), row-major in 16-byte chunks whose index
// is XORed with a function of the row: rows r..r+7 of one chunk column land in 8 different
// bank groups whether a row is 128-byte aligned (kCols % 64 == 0: XOR with r % 8) or
// alternates halves of a 128-byte line (kCols % 64 == 32: XOR with (r / 2) % 4).
template <int kRows, int kCols>
struct SmemTile {
  static_assert(kCols % 32 == 0, "tile width must be a multiple of 32 elements");
  static constexpr int kRowsC = kRows;
  static constexpr int kColsC = kCols;
  static constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;

  __device__ __forceinline__ static int swizzle(int r) { return (kChunks % 8 == 0) ? (r % 8) : ((r / 2) % 4); }
  __device__ __forceinline__ static int offset(int r, int c) {
    return r * kCols + (((c / 8) ^ swizzle(r)) * 8) + (c % 8);
  }
  // The same for r, c >= 0, in unsigned arithmetic: masks and shifts, where the signed form
  // needs a fix-up per division.  Used off the main loops, whose tuned code the signed form
  // keeps as it is.
  __device__ __forceinline__ static unsigned swizzle_unsigned(unsigned r) {
    return (kChunks % 8 == 0) ? r % 8 : (r / 2) % 4;
  }
  __device__ __forceinline__ static unsigned offset_unsigned(unsigned r, unsigned c) {
    return r * kCols + (((c / 8) ^ swizzle_unsigned(r)) * 8) + (c % 8);
  }
};

// The part of a tile one thread copies.  When kThreads is a multiple of the chunks per row
// (every head dim but 96 and 192), a thread always handles the same chunk column c, in rows
// r0, r0 + kRowStep, ..., so addresses advance by a constant and the copy loops stay cheap
// in registers; otherwise each step recomputes its (row, chunk).
template <class Tile, int kThreads>
struct TileCopy {
  static constexpr bool kFixedColumn = kThreads % Tile::kChunks == 0;
  static constexpr int kTotal = Tile::kRowsC * Tile::kChunks;
  static constexpr int kRowStep = kFixedColumn ? kThreads / Tile::kChunks : 0;
  static constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
  int tid, r0, c;
  __device__ __forceinline__ explicit TileCopy(int tid_)
      : tid(tid_), r0(tid_ / Tile::kChunks), c((tid_ % Tile::kChunks) * 8) {}

  // Rows >= rows_valid and columns >= cols_valid (a multiple of 8) become zeros; `fallback`
  // is any valid global address, used for the zero-byte copies.
  template <class T>
  __device__ __forceinline__ void load_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                             int cols_valid, const T* fallback) const {
    if constexpr (kFixedColumn) {
      const T* src = gmem + r0 * row_stride + c;
      const bool col_ok = c < cols_valid;
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int r = r0 + it * kRowStep;
        const bool ok = col_ok && r < rows_valid;
        cp_async_16(smem + Tile::offset(r, c), ok ? src : fallback, ok ? 16 : 0);
        src += kRowStep * row_stride;
      }
    } else {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int idx = tid + it * kThreads;
        if (idx >= kTotal) break;
        const int r = idx / Tile::kChunks, cc = (idx % Tile::kChunks) * 8;
        const bool ok = r < rows_valid && cc < cols_valid;
        cp_async_16(smem + Tile::offset(r, cc), ok ? gmem + r * row_stride + cc : fallback, ok ? 16 : 0);
      }
    }
  }

  // Rows >= rows_valid and columns >= cols_valid are not written.
  template <class T>
  __device__ __forceinline__ void store(T* gmem, int64_t row_stride, const T* smem, int rows_valid,
                                        int cols_valid) const {
    if constexpr (kFixedColumn && kIters * kRowStep == Tile::kRowsC) {  // every step a whole row step
      // One pointer advanced per row step; the shared-memory read is unconditional (always
      // inside the tile), so the test predicates the global store instead of branching.
      const bool col_ok = c < cols_valid;
      T* dst = gmem + r0 * row_stride + c;
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int r = r0 + it * kRowStep;
        copy_16_if(dst, smem + Tile::offset_unsigned(r, c), col_ok && r < rows_valid);
        dst += kRowStep * row_stride;
      }
    } else {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        int r, cc;
        if constexpr (kFixedColumn) {
          r = r0 + it * kRowStep, cc = c;
        } else {
          const int idx = tid + it * kThreads;
          if (idx >= kTotal) break;
          r = idx / Tile::kChunks, cc = (idx % Tile::kChunks) * 8;
        }
        if (r < rows_valid && cc < cols_valid)
          *reinterpret_cast<uint4*>(gmem + r * row_stride + cc) =
              *reinterpret_cast<const uint4*>(smem + Tile::offset(r, cc));
      }
    }
  }
};

}  // namespace cuda
}  // namespace fmha
