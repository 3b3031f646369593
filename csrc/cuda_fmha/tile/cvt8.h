// 8-bit cache elements to fp16/bf16 pairs in registers, for mma operands built from bytes.
// A converter (Cvt8<T, kInt8>) says which 16-bit type the mma runs in (Compute), how the
// four bytes of a 32-bit word pair up (q_dim(i): the word's dims behind logical k 2t, 2t+1,
// 2t+8, 2t+9 of an m16n8k16 k-step, so that q is read in the same order), the power of
// two its conversion leaves out (kExp, folded into the score and output scales, never a
// multiply per element), and:
//   k_pairs(w, b)        the two B registers of a k-step from one K word
//   v_pairs(a, b, j, o)  the pairs of bytes j and j + 1 (j even) of V words a (key 2t) and
//                        b (key 2t + 1): the B registers of n-blocks j and j + 1
// Every conversion is exact: e4m3 values (3 mantissa bits, |x| <= 448, smallest 2^-9) and
// int8 values are representable in fp16, and int8 in bf16.
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

// int8 x -> fp16 by the magic number 1024 + 128: bits 0x6400 | (x ^ 0x80) are 1152 + x.
// Input: bytes 1 and 3 of h (as one prmt or shift puts them); byte 1's value in the low half.
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

// e4m3 bytes 0, 1 (lo) or 2, 3 (hi) of w -> an fp16 pair, the lower byte in the low half.
// sm_89 and newer: one cvt (SASS F2FP.F16.E4M3.UNPACK_B, which reads either half of a
// register), exact.  Older GPUs have no fp8 instructions: the bytes go to positions 1 and 3
// and eeee mmm moves under fp16's exponent (bias 15 against e4m3's 7), which gives the value
// times 2^-8 exactly, subnormals included (kFp8Exp).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr int kFp8Exp = 8;
__device__ __forceinline__ uint32_t fp8_bytes13_half(uint32_t h) {
  return (h & 0x80008000u) | ((h >> 1) & 0x3F803F80u);
}
__device__ __forceinline__ uint32_t fp8_lo_half(uint32_t w) { return fp8_bytes13_half(prmt(w, w, 0x1000)); }
__device__ __forceinline__ uint32_t fp8_hi_half(uint32_t w) { return fp8_bytes13_half(prmt(w, w, 0x3020)); }
#else
constexpr int kFp8Exp = 0;
__device__ __forceinline__ uint32_t fp8_lo_half(uint32_t w) {
  uint32_t r;
  asm("{ .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(w));
  return r;
}
__device__ __forceinline__ uint32_t fp8_hi_half(uint32_t w) {
  uint32_t r;
  asm("{ .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(w));
  return r;
}
#endif

// int8: the mma runs in the query type; a word's bytes 1, 3 and 0, 2 (shifted up by one
// byte) are the pairs, so K needs one shift per word and no prmt.
template <class T, bool kInt8>
struct Cvt8 {
  using Compute = T;
  __host__ __device__ static constexpr int q_dim(int i) { return i == 0 ? 1 : i == 1 ? 3 : i == 2 ? 0 : 2; }
  static constexpr int kExp = 0;
  __device__ __forceinline__ static void k_pairs(uint32_t w, uint32_t (&b)[2]) {
    b[0] = int8_pair<T>(w), b[1] = int8_pair<T>(w << 8);
  }
  __device__ __forceinline__ static void v_pairs(uint32_t a, uint32_t b, int j, uint32_t (&o)[2]) {
    o[0] = int8_pair<T>(prmt(a, b, ((4u + j) << 12) | ((uint32_t)j << 4)));
    o[1] = int8_pair<T>(prmt(a, b, ((5u + j) << 12) | ((uint32_t)(j + 1) << 4)));
  }
};

// fp8 e4m3: the mma runs in fp16 whatever the query type (the decode kernel converts bf16
// queries to fp16 with a power-of-two scale); adjacent bytes pair up.
template <class T>
struct Cvt8<T, false> {
  using Compute = __half;
  __host__ __device__ static constexpr int q_dim(int i) { return i; }
  static constexpr int kExp = kFp8Exp;
  __device__ __forceinline__ static void k_pairs(uint32_t w, uint32_t (&b)[2]) {
    b[0] = fp8_lo_half(w), b[1] = fp8_hi_half(w);
  }
  __device__ __forceinline__ static void v_pairs(uint32_t a, uint32_t b, int j, uint32_t (&o)[2]) {
    // bytes a.j, b.j, a.(j + 1), b.(j + 1): one prmt for both pairs
    const uint32_t x = prmt(a, b, (uint32_t)j | ((4u + j) << 4) | ((j + 1u) << 8) | ((5u + j) << 12));
    o[0] = fp8_lo_half(x), o[1] = fp8_hi_half(x);
  }
};

}  // namespace cuda
}  // namespace fmha
