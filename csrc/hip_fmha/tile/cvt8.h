// 8-bit KV-cache elements to matrix-core operands: four bytes of one 32-bit word (element e
// in byte e) become a Frag of four f16 or bf16 values, in registers, exactly (every fp8
// e4m3 and int8 value is representable in both 16-bit types).  The scale is not applied
// here: the decode kernel multiplies scores by k_scale and probabilities by v_scale.
//
// fp8 e4m3 is the OCP "fn" format of csrc/common/quant.h (bias 7, no infinities, NaN =
// 0x7F/0xFF).  gfx942's v_cvt_pk_f32_fp8 is not used: it converts MI300's "fnuz" variant
// (bias 8, NaN = 0x80), which gives other values for the same bits.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "arch.h"
#include "mfma.h"

namespace fmha {
namespace hip {

typedef _Float16 f16x2 __attribute__((ext_vector_type(2)));

// Two e4m3 bytes (bits 0-7 and 8-15 of x) as two f16 (low half first).  Placing the seven
// magnitude bits eeeemmm at f16 bits 13..7 gives 2^-8 times the value, normals and
// subnormals alike (f16's exponent bias is 8 more than e4m3's, and both have an implicit-0
// subnormal at exponent field 0); one packed multiply by 256 fixes it exactly.  0x7F
// (480 after the multiply) becomes f16 NaN.
FMHA_DEVICE uint32_t fp8x2_to_f16x2(uint32_t x) {
  const uint32_t bits = ((x & 0x7Fu) << 7) | ((x & 0x80u) << 8) | ((x & 0x7F00u) << 15) | ((x & 0x8000u) << 16);
  const f16x2 v = __builtin_bit_cast(f16x2, bits) * f16x2{(_Float16)256.f, (_Float16)256.f};
  uint32_t h = __builtin_bit_cast(uint32_t, v);
  h = (x & 0x7Fu) == 0x7Fu ? (h | 0x7E00u) : h;
  h = (x & 0x7F00u) == 0x7F00u ? (h | 0x7E000000u) : h;
  return h;
}

// Two f16 (one word) as two bf16: through fp32 (v_cvt_f32_f16 is exact), then the top half
// of each fp32, exact for values with at most 8 significant bits (every fp8 and int8 value).
FMHA_DEVICE uint32_t f16x2_to_bf16x2(uint32_t h) {
  const f16x2 v = __builtin_bit_cast(f16x2, h);
  const uint32_t lo = __builtin_bit_cast(uint32_t, (float)v.x) >> 16;
  const uint32_t hi = __builtin_bit_cast(uint32_t, (float)v.y) & 0xFFFF0000u;
  return lo | hi;
}

// A float that is exactly representable in T, as T's bits (no rounding step).
template <class T>
FMHA_DEVICE uint16_t exact_bits(float x);
template <>
FMHA_DEVICE uint16_t exact_bits<f16>(float x) {
  return to_bits<f16>(x);
}
template <>
FMHA_DEVICE uint16_t exact_bits<bf16>(float x) {
  return (uint16_t)(__builtin_bit_cast(uint32_t, x) >> 16);
}

// Four e4m3 bytes as a Frag of four T.
template <class T>
FMHA_DEVICE Frag fp8x4_frag(uint32_t w) {
  uint32_t lo = fp8x2_to_f16x2(w & 0xFFFFu), hi = fp8x2_to_f16x2(w >> 16);
  if constexpr (std::is_same_v<T, bf16>) lo = f16x2_to_bf16x2(lo), hi = f16x2_to_bf16x2(hi);
  return Frag{(int32_t)lo, (int32_t)hi};
}

// Four int8 bytes as a Frag of four T (v_cvt_f32_i32 of each sign-extended byte).
template <class T>
FMHA_DEVICE Frag int8x4_frag(uint32_t w) {
  const float e0 = (float)(int8_t)w, e1 = (float)(int8_t)(w >> 8), e2 = (float)(int8_t)(w >> 16),
              e3 = (float)(int8_t)(w >> 24);
  const uint32_t lo = (uint32_t)exact_bits<T>(e0) | ((uint32_t)exact_bits<T>(e1) << 16);
  const uint32_t hi = (uint32_t)exact_bits<T>(e2) | ((uint32_t)exact_bits<T>(e3) << 16);
  return Frag{(int32_t)lo, (int32_t)hi};
}

}  // namespace hip
}  // namespace fmha
