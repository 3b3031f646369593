// fp16 and bf16 <-> fp32 on the host, round-to-nearest-even, with inf/NaN/subnormals kept.
#pragma once

#include <stdint.h>

#include <cstring>

#include "fmha/fmha.h"

namespace fmha {
namespace cpu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);  // +-0
  // Subnormal: value = mant * 2^-24.
  const float v = (float)mant * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): round abs * 2^24 to an integer, ties to even.
    const float v = bits_to_float(abs) * 16777216.0f;
    uint32_t m = (uint32_t)v;
    const float rem = v - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return (uint16_t)(sign | m);  // m == 0x400 becomes the smallest normal, as it should
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t r = abs - 0x38000000u;
  r += 0x0FFFu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

inline float bf16_to_float(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// n fp16 values to fp32 and back (RNE), a row at a time: F16C's vector conversions where
// the chosen instruction set has them (convert.cpp), else the functions above, element by
// element.  (Element by element, the conversions took 42% of an fp16 forward at B = 8,
// S = 128, H = 2, D = 128.)
void half_row_to_float(const uint16_t* src, int n, float* dst);
void float_row_to_half(const float* src, int n, uint16_t* dst);

// Row loads and stores between a tensor of `dtype` and an fp32 buffer.
inline void load_row(fmha_dtype dtype, const void* base, int64_t offset, int n, float* dst) {
  switch (dtype) {
    case FMHA_DTYPE_FLOAT32: {
      const float* src = static_cast<const float*>(base) + offset;
      for (int d = 0; d < n; ++d) dst[d] = src[d];
      break;
    }
    case FMHA_DTYPE_FLOAT16:
      half_row_to_float(static_cast<const uint16_t*>(base) + offset, n, dst);
      break;
    case FMHA_DTYPE_BFLOAT16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int d = 0; d < n; ++d) dst[d] = bf16_to_float(src[d]);
      break;
    }
    default: break;  // 8-bit cache types are read by decode.cpp, with their scales
  }
}

inline void store_row(fmha_dtype dtype, void* base, int64_t offset, int n, const float* src) {
  switch (dtype) {
    case FMHA_DTYPE_FLOAT32: {
      float* dst = static_cast<float*>(base) + offset;
      for (int d = 0; d < n; ++d) dst[d] = src[d];
      break;
    }
    case FMHA_DTYPE_FLOAT16:
      float_row_to_half(src, n, static_cast<uint16_t*>(base) + offset);
      break;
    case FMHA_DTYPE_BFLOAT16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int d = 0; d < n; ++d) dst[d] = float_to_bf16(src[d]);
      break;
    }
    default: break;  // 8-bit cache types are written by decode.cpp, with their scales
  }
}

inline void store_zero_row(fmha_dtype dtype, void* base, int64_t offset, int n) {
  const size_t bytes = (dtype == FMHA_DTYPE_FLOAT32 ? 4u : 2u) * (size_t)n;
  std::memset(static_cast<char*>(base) + (dtype == FMHA_DTYPE_FLOAT32 ? 4 : 2) * offset, 0, bytes);
}

}  // namespace cpu
}  // namespace fmha
