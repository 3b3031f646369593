// Global memory through buffer instructions: a buffer resource (V#) describes a byte range,
// and the hardware range-checks every access against it -- a load outside reads zeros, a
// store outside is dropped.  Tiles use that as their bounds check: rows past a sequence's
// end and head-dim columns past head_dim get an offset beyond the range, so they read as
// zeros (the padding the matrix products need) and are never written, with no branch.
#pragma once

#include <stdint.h>

#include "arch.h"

namespace fmha {
namespace hip {

typedef int32_t i32x2 __attribute__((ext_vector_type(2)));
typedef int32_t i32x4 __attribute__((ext_vector_type(4)));

// The LLVM buffer intrinsics by name: they exist in every clang that targets gfx90a, where
// the matching __builtin_amdgcn_raw_buffer_* spellings appeared only in clang 20.
__device__ i32x4 llvm_raw_buffer_load_v4i32(i32x4 rsrc, int32_t voffset, int32_t soffset, int32_t aux)
    __asm("llvm.amdgcn.raw.buffer.load.v4i32");
__device__ i32x2 llvm_raw_buffer_load_v2i32(i32x4 rsrc, int32_t voffset, int32_t soffset, int32_t aux)
    __asm("llvm.amdgcn.raw.buffer.load.v2i32");
__device__ int16_t llvm_raw_buffer_load_i16(i32x4 rsrc, int32_t voffset, int32_t soffset, int32_t aux)
    __asm("llvm.amdgcn.raw.buffer.load.i16");
__device__ void llvm_raw_buffer_store_v2i32(i32x2 data, i32x4 rsrc, int32_t voffset, int32_t soffset, int32_t aux)
    __asm("llvm.amdgcn.raw.buffer.store.v2i32");
__device__ void llvm_raw_buffer_store_i16(int16_t data, i32x4 rsrc, int32_t voffset, int32_t soffset, int32_t aux)
    __asm("llvm.amdgcn.raw.buffer.store.i16");

// An offset no valid access uses: views never span 2^31 bytes (dispatch checks the
// strides), so the range check rejects it.
constexpr uint32_t kOutOfRange = 0x80000000u;

// A 2-D view (rows x cols of 16-bit elements, row stride in elements) of global memory,
// valid for rows < rows_valid and cols < cols_valid.  Everything in it is wave-uniform, so
// the descriptor lives in scalar registers.
struct GlobalTile {
  i32x4 rsrc;
  uint32_t row_bytes;   // row stride in bytes
  int32_t rows_valid;
  int32_t cols_valid;

  // base: element (0, 0).  The range covers exactly the valid rows, so even a wrong offset
  // cannot leave them.
  FMHA_DEVICE static GlobalTile make(const void* base, int64_t row_stride, int rows_valid, int cols_valid) {
    GlobalTile t;
    t.row_bytes = (uint32_t)(row_stride * 2);
    t.rows_valid = rows_valid < 0 ? 0 : rows_valid;
    t.cols_valid = cols_valid;
    const uint64_t extent =
        t.rows_valid > 0 ? (uint64_t)(t.rows_valid - 1) * t.row_bytes + (uint64_t)cols_valid * 2 : 0;
    const uint64_t addr = (uint64_t)base;
    t.rsrc.x = (int32_t)(uint32_t)addr;
    t.rsrc.y = (int32_t)(uint32_t)(addr >> 32);  // base[47:32]; stride 0: a raw byte buffer
    t.rsrc.z = (int32_t)(extent < kOutOfRange ? extent : kOutOfRange);
    // Word 3 on gfx9 (MI200, MI300): DATA_FORMAT = 32 bits (bits 18:15 = 4).  A zero format
    // is "invalid", and the hardware then treats every access as out of range.
    t.rsrc.w = 0x00020000;
    return t;
  }

  // Byte offset of (r, c), or kOutOfRange if (r, c) .. (r, c + n - 1) is outside the valid
  // part (n elements, c a multiple of n, cols_valid a multiple of n).
  FMHA_DEVICE uint32_t offset(int r, int c) const {
    const bool ok = r >= 0 && r < rows_valid && c < cols_valid;
    return ok ? (uint32_t)r * row_bytes + (uint32_t)c * 2 : kOutOfRange;
  }

  // 8 elements (16 bytes), 4 elements (8 bytes) or 1 element at (r, c).
  FMHA_DEVICE i32x4 load16(int r, int c) const { return llvm_raw_buffer_load_v4i32(rsrc, (int32_t)offset(r, c), 0, 0); }
  FMHA_DEVICE i32x2 load8(int r, int c) const { return llvm_raw_buffer_load_v2i32(rsrc, (int32_t)offset(r, c), 0, 0); }
  FMHA_DEVICE uint16_t load2(int r, int c) const {
    return (uint16_t)llvm_raw_buffer_load_i16(rsrc, (int32_t)offset(r, c), 0, 0);
  }
  FMHA_DEVICE void store8(int r, int c, i32x2 v) const { llvm_raw_buffer_store_v2i32(v, rsrc, (int32_t)offset(r, c), 0, 0); }
};

}  // namespace hip
}  // namespace fmha
