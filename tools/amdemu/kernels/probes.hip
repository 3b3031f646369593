// One-instruction probe kernels for the emulator's own tests (tests/amd/): each lane reads
// its operands from global memory, runs one instruction, writes the result.  Lane l reads
// element l of every input array.
#include <hip/hip_runtime.h>

#include <stdint.h>

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef int32_t i32x4 __attribute__((ext_vector_type(4)));
typedef int32_t i32x2 __attribute__((ext_vector_type(2)));

#define LANE ((int)__builtin_amdgcn_workitem_id_x())

// MFMA: A, B as four 16-bit elements per lane (v0.lo, v0.hi, v1.lo, v1.hi), C and D as
// the accumulator registers of the lane.
extern "C" __global__ void mfma_32x32x8_bf16(const i16x4* a, const i16x4* b, const f32x16* c, f32x16* d) {
  d[LANE] = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a[LANE], b[LANE], c[LANE], 0, 0, 0);
}
extern "C" __global__ void mfma_16x16x16_bf16(const i16x4* a, const i16x4* b, const f32x4* c, f32x4* d) {
  d[LANE] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[LANE], b[LANE], c[LANE], 0, 0, 0);
}
extern "C" __global__ void mfma_32x32x8_f16(const f16x4* a, const f16x4* b, const f32x16* c, f32x16* d) {
  d[LANE] = __builtin_amdgcn_mfma_f32_32x32x8f16(a[LANE], b[LANE], c[LANE], 0, 0, 0);
}
extern "C" __global__ void mfma_16x16x16_f16(const f16x4* a, const f16x4* b, const f32x4* c, f32x4* d) {
  d[LANE] = __builtin_amdgcn_mfma_f32_16x16x16f16(a[LANE], b[LANE], c[LANE], 0, 0, 0);
}

// Three-operand VALU probes through inline asm, so the instruction is exactly the one named.
#define PROBE3(name, text)                                                                       \
  extern "C" __global__ void name(const uint32_t* x, const uint32_t* y, const uint32_t* z,      \
                                  uint32_t* out) {                                               \
    uint32_t r;                                                                                  \
    asm volatile(text : "=v"(r) : "v"(x[LANE]), "v"(y[LANE]), "v"(z[LANE]));                    \
    out[LANE] = r;                                                                               \
  }
PROBE3(probe_perm, "v_perm_b32 %0, %1, %2, %3")
PROBE3(probe_bfi, "v_bfi_b32 %0, %1, %2, %3")
PROBE3(probe_bfe_u32, "v_bfe_u32 %0, %1, %2, %3")
PROBE3(probe_bfe_i32, "v_bfe_i32 %0, %1, %2, %3")
PROBE3(probe_fma_mix_f32, "v_fma_mix_f32 %0, %1, %2, %3 op_sel_hi:[0,1,0]")
// Two-instruction probes: the destination first takes z (the bits the instruction keeps).
#define PROBE3_KEEP(name, text)                                                                  \
  extern "C" __global__ void name(const uint32_t* x, const uint32_t* y, const uint32_t* z,      \
                                  uint32_t* out) {                                               \
    uint32_t r = z[LANE];                                                                        \
    asm volatile(text : "+v"(r) : "v"(x[LANE]), "v"(y[LANE]));                                   \
    out[LANE] = r;                                                                               \
  }
PROBE3_KEEP(probe_fma_mixlo_f16, "v_fma_mixlo_f16 %0, %1, %2, 0")
PROBE3(probe_or_sdwa_w1, "v_or_b32_sdwa %0, %1, %2 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_1 src1_sel:DWORD")
PROBE3(probe_and_sdwa_b2, "v_and_b32_sdwa %0, %1, %2 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:BYTE_2 src1_sel:DWORD")
PROBE3(probe_ashr_i16_sdwa, "v_ashrrev_i16_sdwa %0, %1, sext(%2) dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:DWORD src1_sel:BYTE_0")
PROBE3_KEEP(probe_cvt_f16_sdwa, "v_cvt_f16_f32_sdwa %0, %1 dst_sel:WORD_1 dst_unused:UNUSED_PRESERVE src0_sel:DWORD")
PROBE3(probe_pk_mul_f16, "v_pk_mul_f16 %0, %1, %2 op_sel_hi:[1,0]")
PROBE3(probe_xad, "v_xad_u32 %0, %1, %2, %3")
PROBE3(probe_ffbh_i32, "v_ffbh_i32 %0, %1")
PROBE3(probe_exp, "v_exp_f32 %0, %1")
PROBE3(probe_add_u16, "v_add_u16 %0, %1, %2")
#if defined(__gfx942__)  // gfx90a has the unfused v_madmk / v_madak instead
PROBE3(probe_fmamk, "v_fmamk_f32 %0, %1, 0x47800000, %2")  // x * 65536 + y
PROBE3(probe_fmaak, "v_fmaak_f32 %0, %1, %2, 0x3f000000")  // x * y + 0.5
#else
PROBE3(probe_fmamk, "v_madmk_f32 %0, %1, 0x47800000, %2")
PROBE3(probe_fmaak, "v_madak_f32 %0, %1, %2, 0x3f000000")
#endif
// Packed f32 with inline constants, as the softcap code uses it: lo = -2 * x + 1, hi = -2 * y + 1.
extern "C" __global__ void probe_pk_fma_const(const uint32_t* x, const uint32_t* y, const uint32_t* z, uint32_t* out) {
  uint64_t r, a = (uint64_t)x[LANE] | (uint64_t)y[LANE] << 32;
  asm volatile("v_pk_fma_f32 %0, -2.0, %1, 1.0 op_sel_hi:[0,1,0]" : "=v"(r) : "v"(a));
  out[2 * LANE] = (uint32_t)r;
  out[2 * LANE + 1] = (uint32_t)(r >> 32);
}

// ds_bpermute with half the lanes inactive: a lane reading an inactive lane gets 0.
extern "C" __global__ void probe_bpermute(const uint32_t* x, const uint32_t* y, const uint32_t* z, uint32_t* out) {
  uint32_t r = 0xDEADu;
  if (z[LANE] & 1) r = __builtin_amdgcn_ds_bpermute((int)y[LANE], (int)x[LANE]);
  out[LANE] = r;
}

// Buffer loads and stores through the project's own GlobalTile (tile/buffer.h): lane l
// accesses row r = y[l], column c = z[l] of a rows_valid x cols_valid view.
#include "hip_fmha/tile/buffer.h"
extern "C" __global__ void probe_buffer(const uint16_t* base, int64_t stride, int rows_valid, int cols_valid,
                                        const int* rows, const int* cols, i32x4* out16, i32x2* out8,
                                        uint32_t* out2, uint16_t* dst) {
  const fmha::hip::GlobalTile t = fmha::hip::GlobalTile::make(base, stride, rows_valid, cols_valid);
  const int r = rows[LANE], c = cols[LANE];
  out16[LANE] = t.load16(r, c);
  out8[LANE] = t.load8(r, c);
  out2[LANE] = t.load2(r, c);
  const fmha::hip::GlobalTile d = fmha::hip::GlobalTile::make(dst, stride, rows_valid, cols_valid);
  d.store8(r, c, i32x2{LANE, -LANE});
}

// LDS exchange between the four waves of a workgroup, with (kSync) or without a barrier.
template <bool kSync>
__device__ void lds_exchange(const uint32_t* x, uint32_t* out) {
  __shared__ uint32_t s[256];
  const int t = LANE;
  s[t] = x[t];
  if (kSync) fmha::hip::barrier();  // tile/arch.h: fence, s_barrier, fence
  out[t] = s[255 - t];
}
extern "C" __global__ void lds_exchange_sync(const uint32_t* x, uint32_t* out) { lds_exchange<true>(x, out); }
extern "C" __global__ void lds_exchange_nosync(const uint32_t* x, uint32_t* out) { lds_exchange<false>(x, out); }
