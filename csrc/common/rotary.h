// Rotary position embedding (Su et al., RoFormer) of one head-dim row at one position:
// interleaved rotates pairs (2i, 2i + 1) (GPT-J), otherwise (i, i + rotary_dim / 2)
// (GPT-NeoX); x' = x cos - y sin, y' = x sin + y cos with cos/sin[pos][i].
#pragma once

#include <stdint.h>

#include "macros.h"

namespace fmha {

// The two elements that pair i of a row rotates together.
FMHA_HOST_DEVICE void rotary_pair(int i, int rotary_dim, bool interleaved, int* a, int* b) {
  *a = interleaved ? 2 * i : i;
  *b = interleaved ? 2 * i + 1 : i + rotary_dim / 2;
}

// (x, y) rotated by the angle of cosine c and sine s.
FMHA_HOST_DEVICE void rotate_pair(float* x, float* y, float c, float s) {
  const float x0 = *x, y0 = *y;
  *x = x0 * c - y0 * s;
  *y = x0 * s + y0 * c;
}

// row: head-dim values (fp32, in place); cos_row/sin_row: rotary_dim / 2 values.
FMHA_HOST_DEVICE void apply_rotary(float* row, const float* cos_row, const float* sin_row, int rotary_dim,
                                   bool interleaved) {
  for (int i = 0; i < rotary_dim / 2; ++i) {
    int a, b;
    rotary_pair(i, rotary_dim, interleaved, &a, &b);
    rotate_pair(&row[a], &row[b], cos_row[i], sin_row[i]);
  }
}

}  // namespace fmha
