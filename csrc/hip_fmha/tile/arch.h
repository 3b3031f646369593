// The few hardware facts every HIP kernel of fmha needs, from compiler builtins only:
// thread and block ids, the workgroup barrier, lane exchange within a wave of 64, the
// transcendental instructions, 16-bit element types and the fp32 global atomic add.
//
// Why builtins and not HIP's threadIdx/__syncthreads/tanhf: those reach into the ROCm
// device libraries (ockl/ocml), which a real ROCm install links in but the CI machine
// lacks (Debian ships them only up to ROCm 5.2, without gfx942).  Kernels written against
// this header compile to the same machine code under a full ROCm toolchain and under a
// bare clang, so CI can compile every kernel for gfx90a and gfx942 and read its ISA.
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

#include "../../common/macros.h"

namespace fmha {
namespace hip {

constexpr int kWaveSize = 64;  // CDNA (gfx90a, gfx942) runs wave64 only

FMHA_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

FMHA_DEVICE int thread_id() { return (int)__builtin_amdgcn_workitem_id_x(); }
FMHA_DEVICE int block_x() { return (int)__builtin_amdgcn_workgroup_id_x(); }
FMHA_DEVICE int block_y() { return (int)__builtin_amdgcn_workgroup_id_y(); }
FMHA_DEVICE int block_z() { return (int)__builtin_amdgcn_workgroup_id_z(); }
FMHA_DEVICE int lane_id() { return thread_id() % kWaveSize; }
// The wave index is the same for every lane; readfirstlane tells the compiler so, and it
// lands in a scalar register.
FMHA_DEVICE int wave_id() { return __builtin_amdgcn_readfirstlane(thread_id() / kWaveSize); }

// Workgroup barrier that also orders LDS (and global) accesses around it, as HIP's
// __syncthreads does.
FMHA_DEVICE void barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Orders one wave's LDS accesses around it (HIP's __syncwarp): a wave that writes a tile
// only it reads needs no workgroup barrier, only this fence for the compiler.
FMHA_DEVICE void wave_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}

// x itself, fixed in a scalar register by an empty asm the compiler cannot see into.  A
// kernel copies the kernel arguments its main loop reads through this once, up front: the
// compiler merges argument reads into wide scalar loads (up to 16 registers), and a wide
// load of which one field stays live through the loop keeps scalar registers occupied --
// in the decode kernel enough to cause scalar spills and a dead 16-byte stack slot, i.e.
// scratch.  The copy ends the wide load's life where it is made.
template <class V>
FMHA_DEVICE V uniform_copy(V x) {
  asm volatile("" : "+s"(x));
  return x;
}

// Value of x in lane (this lane ^ mask); ds_bpermute moves 32 bits between any lanes
// without allocating LDS.
FMHA_DEVICE float lane_xor(float x, int mask) {
  const int src = (lane_id() ^ mask) * 4;
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, x)));
}

// 2^x on v_exp_f32 (about 1 ulp; exp2(-inf) = 0), the instruction the softmax is built on.
FMHA_DEVICE float fast_exp2(float x) {
#if __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);
#else
  return exp2f(x);
#endif
}

FMHA_DEVICE float fast_rcp(float x) { return __builtin_amdgcn_rcpf(x); }

// tanh without ocml's tanhf, to a few ulp and without branches (it runs on every score
// under softcap): 1 - 2 / (exp(2|x|) + 1) loses no accuracy once |x| >= 0.3 (the result is
// then above 0.29); below that the odd Taylor series to x^13 is exact to 5e-8 relative.
FMHA_DEVICE float tanh_f32(float x) {
  const float a = __builtin_fabsf(x);
  const float e = fast_exp2(fminf(a, 30.f) * 2.8853900817779268f);  // exp(2a) = 2^(2a log2 e)
  const float t_exp = fmaf(-2.f, fast_rcp(e + 1.f), 1.f);
  const float a2 = a * a;
  float poly = 21844.f / 6081075.f;
  poly = fmaf(poly, a2, -1382.f / 155925.f);
  poly = fmaf(poly, a2, 62.f / 2835.f);
  poly = fmaf(poly, a2, -17.f / 315.f);
  poly = fmaf(poly, a2, 2.f / 15.f);
  poly = fmaf(poly, a2, -1.f / 3.f);
  const float t_poly = fmaf(a * a2, poly, a);
  return __builtin_copysignf(a >= 0.3f ? t_exp : t_poly, x);
}

// fp32 atomic add to global memory: global_atomic_add_f32, which gfx90a and gfx942 have
// (HIP's atomicAdd may compile to a compare-and-swap loop without -munsafe-fp-atomics).
FMHA_DEVICE void atomic_add(float* p, float v) {
  __builtin_amdgcn_global_atomic_fadd_f32((__attribute__((address_space(1))) float*)p, v);
}

// ---- 16-bit element types: storage only; the matrix cores read the bits directly ----

struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

template <class T>
FMHA_DEVICE uint16_t to_bits(float x);
template <>
FMHA_DEVICE uint16_t to_bits<f16>(float x) {
  return __builtin_bit_cast(uint16_t, (_Float16)x);  // v_cvt_f16_f32, round to nearest even
}
template <>
FMHA_DEVICE uint16_t to_bits<bf16>(float x) {
  // Round to nearest even on the bits (gfx90a/gfx942 have no bf16 convert); NaN stays NaN.
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <class T>
FMHA_DEVICE float to_float(uint16_t b);
template <>
FMHA_DEVICE float to_float<f16>(uint16_t b) {
  return (float)__builtin_bit_cast(_Float16, b);
}
template <>
FMHA_DEVICE float to_float<bf16>(uint16_t b) {
  return __builtin_bit_cast(float, (uint32_t)b << 16);
}

// Two floats as one 32-bit word of two 16-bit values (x in the low half).
template <class T>
FMHA_DEVICE uint32_t pack2(float x, float y) {
  return (uint32_t)to_bits<T>(x) | ((uint32_t)to_bits<T>(y) << 16);
}

}  // namespace hip
}  // namespace fmha

// csrc/common/philox.h calls __umulhi in device code, which HIP's header implements with
// the device library's __ockl_mul_hi_u32.  The CI compile check (tools/hip_report.py
// defines FMHA_HIP_DEVICE_CHECK) runs without device libraries, so it supplies that one
// function itself; the product's high word is what the library computes (v_mul_hi_u32).
// Weak, so a real device library's definition would win; real builds never define this.
#if defined(FMHA_HIP_DEVICE_CHECK) && defined(__HIP_DEVICE_COMPILE__)
extern "C" __device__ __attribute__((weak)) uint32_t __ockl_mul_hi_u32(uint32_t a, uint32_t b) {
  return (uint32_t)(((uint64_t)a * b) >> 32);
}
#endif
