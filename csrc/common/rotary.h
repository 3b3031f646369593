// Rotary position embedding (Su et al., RoFormer) of one head-dim row at one position:
// interleaved rotates pairs (2i, 2i + 1) (GPT-J), otherwise (i, i + rotary_dim / 2)
// (GPT-NeoX); x' = x cos - y sin, y' = x sin + y cos with cos/sin[pos][i].
#pragma once

#include <stdint.h>

#include "macros.h"

namespace fmha {

// row: head-dim values (fp32, in place); cos_row/sin_row: rotary_dim / 2 values.
FMHA_HOST_DEVICE void apply_rotary(float* row, const float* cos_row, const float* sin_row, int rotary_dim,
                                   bool interleaved) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x = row[a], y = row[b], c = cos_row[i], s = sin_row[i];
    row[a] = x * c - y * s;
    row[b] = x * s + y * c;
  }
}

}  // namespace fmha
