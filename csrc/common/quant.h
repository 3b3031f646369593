// 8-bit KV-cache elements: fp8 e4m3 (the "fn" variant: no infinities, max 448, NaN =
// 0x7F/0xFF) and int8, scaled back by value = stored * scale.  Bit-level code, identical on
// the host and the device.
#pragma once

#include <math.h>
#include <stdint.h>

#include "fmha/fmha.h"
#include "macros.h"

namespace fmha {

constexpr float kFp8E4M3Max = 448.f;
constexpr float kInt8Max = 127.f;

// Whether a decode call's KV cache holds 8-bit elements (fp8 e4m3 or int8, with scales).
FMHA_HOST_DEVICE bool quantized_cache(const fmha_decode_params& p) {
  return p.cache_dtype == FMHA_DTYPE_FLOAT8_E4M3 || p.cache_dtype == FMHA_DTYPE_INT8;
}

FMHA_HOST_DEVICE float fp8_e4m3_to_float(uint8_t x) {
  const int sign = x >> 7, exp = (x >> 3) & 0xF, mant = x & 0x7;
  if (exp == 0xF && mant == 0x7) return NAN;
  const float mag = exp == 0 ? ldexpf((float)mant, -9)                     // subnormal: m * 2^-9
                             : ldexpf(1.f + (float)mant / 8.f, exp - 7);  // bias 7
  return sign ? -mag : mag;
}

// Round to nearest even, saturating to +-448 (the e4m3fn convention for scaled caches).
FMHA_HOST_DEVICE uint8_t float_to_fp8_e4m3(float f) {
  if (f != f) return 0x7F;
  const uint8_t sign = f < 0.f ? 0x80 : 0x00;
  float a = fabsf(f);
  if (a >= kFp8E4M3Max) return sign | 0x7E;  // 448
  if (a < ldexpf(1.f, -6)) {                 // subnormal range: multiples of 2^-9
    const float q = a * 512.f;
    float r = rintf(q);  // ties to even
    return sign | (uint8_t)r;  // r == 8 is the smallest normal (exp 1, mant 0): same bits
  }
  int e;
  const float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // a = (1 + f/8) * 2^(e - 1): scale the fraction to 3 bits, round to even.
  float frac = rintf((m * 2.f - 1.f) * 8.f);
  int exp = e - 1 + 7;
  if (frac >= 8.f) {
    frac = 0.f;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && frac > 6.f)) return sign | 0x7E;
  return sign | (uint8_t)(exp << 3) | (uint8_t)frac;
}

FMHA_HOST_DEVICE float int8_to_float(int8_t x) { return (float)x; }

FMHA_HOST_DEVICE int8_t float_to_int8(float f) {
  const float r = rintf(f);
  return (int8_t)(r > kInt8Max ? kInt8Max : r < -kInt8Max ? -kInt8Max : r);
}

// Largest representable magnitude of a quantized cache type (for per-token scales).
FMHA_HOST_DEVICE float quant_max(fmha_dtype t) { return t == FMHA_DTYPE_INT8 ? kInt8Max : kFp8E4M3Max; }

}  // namespace fmha
