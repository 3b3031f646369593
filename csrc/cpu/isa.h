// The CPU tile kernels (tiles.inc, on the vector layer of simd.inc), compiled once per
// instruction set and chosen at run time, so one portable build (no -march flag) runs
// AVX-512 code where the CPU has it:
//   avx512   16 fp32 lanes   x86-64 with AVX-512 F/BW/DQ/VL and FMA
//   avx2      8 lanes        x86-64 with AVX2, FMA and F16C
//   generic   4 lanes        anything (plain vector extensions: SSE2 on x86, NEON on Arm)
// FMHA_CPU_ISA=generic|avx2|avx512 forces one (never one the CPU lacks), for tests.
// GCC compiles the x86 sections with `#pragma GCC target`; other compilers build the
// generic section only.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "head.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FMHA_CPU_X86_SECTIONS 1
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define FMHA_CPU_X86_SECTIONS 0
#endif

namespace fmha {
namespace cpu {

// Scratch memory aligned for the widest vector, released on scope exit.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : p_(::operator new(std::max<size_t>(bytes, 64), std::align_val_t(64))) {
    std::memset(p_, 0, std::max<size_t>(bytes, 64));
  }
  ~AlignedBuffer() { ::operator delete(p_, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  template <class T>
  T* as(size_t byte_offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(p_) + byte_offset);
  }

 private:
  void* p_;
};

enum class Isa { kGeneric, kAvx2, kAvx512 };

// The widest instruction set both the CPU and this build have (or FMHA_CPU_ISA's).
inline Isa detect_isa() {
  Isa best = Isa::kGeneric;
#if FMHA_CPU_X86_SECTIONS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    best = Isa::kAvx512;
#endif
  if (const char* env = std::getenv("FMHA_CPU_ISA")) {
    const Isa want = std::strcmp(env, "generic") == 0 ? Isa::kGeneric
                     : std::strcmp(env, "avx2") == 0  ? Isa::kAvx2
                                                      : Isa::kAvx512;
    if (want < best) best = want;
  }
  return best;
}

inline Isa isa() {
  static const Isa chosen = detect_isa();
  return chosen;
}

// Whether the bf16 forward and backward may use AMX tiles (amx.inc): the AVX-512 section
// is in use, the CPU has AMX-BF16 (and AVX512-BF16), and Linux granted this process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM).  FMHA_CPU_AMX=0 turns it off.
inline bool amx_bf16() {
  static const bool ok = [] {
#if FMHA_CPU_X86_SECTIONS && defined(__linux__)
    if (isa() != Isa::kAvx512) return false;
    if (const char* env = std::getenv("FMHA_CPU_AMX"))
      if (std::strcmp(env, "0") == 0) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;  // AMX-BF16, AMX-TILE
    if (!__builtin_cpu_supports("avx512bf16")) return false;     // P's conversion
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

#define FMHA_CPU_LANES 4
namespace generic {
#include "simd.inc"
#include "tiles.inc"
}  // namespace generic
#undef FMHA_CPU_LANES

#if FMHA_CPU_X86_SECTIONS
// GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized (and, where a reduction
// sits in a function of its own, -Wuninitialized) on their own undefined pass-through
// operands (_mm512_cvtepi32_epi16, _mm512_reduce_*): not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#define FMHA_CPU_LANES 8
namespace avx2 {
#include "simd.inc"
#include "tiles.inc"
}  // namespace avx2
#undef FMHA_CPU_LANES
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,avx512bf16,amx-tile,amx-bf16")
#define FMHA_CPU_LANES 16
namespace avx512 {
#include "simd.inc"
#include "tiles.inc"
#include "amx.inc"
}  // namespace avx512
#undef FMHA_CPU_LANES
#pragma GCC pop_options
#pragma GCC diagnostic pop

// Calls the chosen section's fn(args...).
#define FMHA_CPU_ISA_CALL(fn, ...)                                      \
  do {                                                                  \
    switch (::fmha::cpu::isa()) {                                       \
      case ::fmha::cpu::Isa::kAvx512: avx512::fn(__VA_ARGS__); break;   \
      case ::fmha::cpu::Isa::kAvx2: avx2::fn(__VA_ARGS__); break;       \
      default: generic::fn(__VA_ARGS__); break;                         \
    }                                                                   \
  } while (0)
#else
#define FMHA_CPU_ISA_CALL(fn, ...) generic::fn(__VA_ARGS__)
#endif

// Query rows per tile (kBlockM) of the chosen section.
inline int tile_rows() {
#if FMHA_CPU_X86_SECTIONS
  if (isa() == Isa::kAvx512) return avx512::kBlockM;
  if (isa() == Isa::kAvx2) return avx2::kBlockM;
#endif
  return generic::kBlockM;
}
constexpr int kMaxTileRows = 32;

}  // namespace cpu
}  // namespace fmha
