// Host side of the copy engine: tensor maps (CUtensorMap) for the sm90a kernels, encoded
// through the driver entry point that the runtime hands out, so libfmha needs no link to
// libcuda.
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "fmha/fmha.h"

namespace fmha {
namespace cuda {

// A 4-d map over one (rows, heads, batch) tensor of 16-bit elements (8-bit for
// FMHA_DTYPE_FLOAT8_E4M3), columns innermost: dims (cols, rows, heads, batches), strides in
// elements for rows, heads and batches, and a box of box_cols x box_rows (x 1 x 1) written
// into shared memory with the 64- or 128-byte swizzle (box_cols elements' bytes).  Elements outside the dims read as zeros.
// Returns false when the driver refuses the layout (the caller then takes another path).
bool encode_tensor_map(CUtensorMap* map, const void* data, fmha_dtype dtype, int64_t cols, int64_t rows,
                       int64_t heads, int64_t batches, int64_t row_stride, int64_t head_stride,
                       int64_t batch_stride, int box_cols, int box_rows);

}  // namespace cuda
}  // namespace fmha
