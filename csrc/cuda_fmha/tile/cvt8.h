// 8-bit cache elements to fp16/bf16 pairs in a few integer instructions, for operands built
// in registers.  Input: a 32-bit word whose bytes 1 and 3 hold the two elements (bytes 0
// and 2 are ignored), as one prmt puts them; output: a b16x2 register, byte 1's element in
// the low half.  Every conversion is exact: e4m3 values (3 mantissa bits, |x| <= 448,
// smallest 2^-9) and int8 values are representable in both fp16 and bf16.  No scale is
// applied here, not even fp8's exponent fix: the decode kernel folds them into its score
// scale, its probabilities and its output factor (per key or per row, never per element).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fmha {
namespace cuda {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// e4m3 (s eeee mmm, bias 7) -> fp16 / bf16 without the exponent fix: moving eeee mmm under
// fp16's exponent (bias 15) gives the value times 2^-8, under bf16's (bias 127) the value
// times 2^-120, exactly, subnormals included (they stay subnormal).  The caller applies the
// 2^8 or 2^120 through its scales (Cvt8Pair::kExp).
__device__ __forceinline__ uint32_t fp8_pair_half_unscaled(uint32_t h) {
  return (h & 0x80008000u) | ((h >> 1) & 0x3F803F80u);
}
__device__ __forceinline__ uint32_t fp8_pair_bf16_unscaled(uint32_t h) {
  return (h & 0x80008000u) | ((h >> 4) & 0x07F007F0u);
}

// int8 x -> fp16 by the magic number 1024 + 128: bits 0x6400 | (x ^ 0x80) are 1152 + x.
__device__ __forceinline__ __half2 int8_pair_half(uint32_t h) {
  const uint32_t r = ((h >> 8) & 0x00FF00FFu) ^ 0x64806480u;
  return __hsub2(*reinterpret_cast<const __half2*>(&r), __half2(__half(1152.f), __half(1152.f)));
}
template <class T>
__device__ __forceinline__ uint32_t int8_pair(uint32_t h);
template <>
__device__ __forceinline__ uint32_t int8_pair<__half>(uint32_t h) {
  __half2 r = int8_pair_half(h);
  return *reinterpret_cast<uint32_t*>(&r);
}
template <>
__device__ __forceinline__ uint32_t int8_pair<__nv_bfloat16>(uint32_t h) {
  __nv_bfloat162 r = __float22bfloat162_rn(__half22float2(int8_pair_half(h)));
  return *reinterpret_cast<uint32_t*>(&r);
}

// The pair conversion the decode kernel uses for a cache kind and compute type: the power
// of two it leaves out (kExp, applied through the score and output scales, never per
// element), and whether q and P must be prescaled to keep products of the 2^-120-scaled
// bf16 values clear of fp32 subnormals (kPrescale).
template <class T, bool kInt8>
struct Cvt8Pair {
  static constexpr int kExp = 0;
  static constexpr bool kPrescale = false;
  __device__ __forceinline__ static uint32_t pair(uint32_t h) { return int8_pair<T>(h); }
};
template <>
struct Cvt8Pair<__half, false> {
  static constexpr int kExp = 8;
  static constexpr bool kPrescale = false;
  __device__ __forceinline__ static uint32_t pair(uint32_t h) { return fp8_pair_half_unscaled(h); }
};
template <>
struct Cvt8Pair<__nv_bfloat16, false> {
  static constexpr int kExp = 120;
  static constexpr bool kPrescale = true;
  __device__ __forceinline__ static uint32_t pair(uint32_t h) { return fp8_pair_bf16_unscaled(h); }
};

}  // namespace cuda
}  // namespace fmha
