// 8-bit cache elements to fp16/bf16 pairs in a few integer instructions, for operands built
// in registers.  Input: a 32-bit word whose bytes 1 and 3 hold the two elements (bytes 0
// and 2 are ignored), as one prmt puts them; output: a b16x2 register, byte 1's element in
// the low half.  Every conversion is exact: e4m3 values (3 mantissa bits, |x| <= 448,
// smallest 2^-9) and int8 values are representable in both fp16 and bf16.  No scale is
// applied here: the decode kernel scales scores and probabilities instead (one multiply
// per key, not per element).
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

template <class T>
__device__ __forceinline__ uint32_t b16x2_mul(uint32_t x, uint32_t y);
template <>
__device__ __forceinline__ uint32_t b16x2_mul<__half>(uint32_t x, uint32_t y) {
  __half2 r = __hmul2(*reinterpret_cast<__half2*>(&x), *reinterpret_cast<__half2*>(&y));
  return *reinterpret_cast<uint32_t*>(&r);
}
template <>
__device__ __forceinline__ uint32_t b16x2_mul<__nv_bfloat16>(uint32_t x, uint32_t y) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&x), *reinterpret_cast<__nv_bfloat162*>(&y));
  return *reinterpret_cast<uint32_t*>(&r);
}

// e4m3 (s eeee mmm, bias 7) -> fp16: move eeee mmm under fp16's exponent (bias 15), then
// multiply by 2^8 to fix the bias; subnormals come out right through the multiply.
// -> bf16: the same under bf16's exponent (bias 127), times 2^120.
template <class T>
__device__ __forceinline__ uint32_t fp8_pair(uint32_t h);
template <>
__device__ __forceinline__ uint32_t fp8_pair<__half>(uint32_t h) {
  return b16x2_mul<__half>((h & 0x80008000u) | ((h >> 1) & 0x3F803F80u), 0x5C005C00u);  // 256
}
template <>
__device__ __forceinline__ uint32_t fp8_pair<__nv_bfloat16>(uint32_t h) {
  return b16x2_mul<__nv_bfloat16>((h & 0x80008000u) | ((h >> 4) & 0x07F007F0u), 0x7B807B80u);  // 2^120
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

}  // namespace cuda
}  // namespace fmha
