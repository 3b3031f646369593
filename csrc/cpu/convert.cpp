// fp16 rows to fp32 and back (convert.h): F16C's conversions in the AVX2 and AVX-512
// sections, the element-by-element functions elsewhere.  Both round to nearest even and
// keep inf, NaN and subnormals; the vector forms quiet a NaN keeping its upper payload bits,
// where the element form writes the canonical quiet NaN.
#include "convert.h"

#include "isa.h"

namespace fmha {
namespace cpu {

#if FMHA_CPU_X86_SECTIONS
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
namespace {

void half_row_to_float_f16c(const uint16_t* src, int n, float* dst) {
  int d = 0;
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
  for (; d < n; ++d) dst[d] = half_to_float(src[d]);
}

void float_row_to_half_f16c(const float* src, int n, uint16_t* dst) {
  int d = 0;
  for (; d + 8 <= n; d += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + d),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; d < n; ++d) dst[d] = float_to_half(src[d]);
}

}  // namespace
#pragma GCC pop_options
#endif

void half_row_to_float(const uint16_t* src, int n, float* dst) {
#if FMHA_CPU_X86_SECTIONS
  if (isa() != Isa::kGeneric) return half_row_to_float_f16c(src, n, dst);
#endif
  for (int d = 0; d < n; ++d) dst[d] = half_to_float(src[d]);
}

void float_row_to_half(const float* src, int n, uint16_t* dst) {
#if FMHA_CPU_X86_SECTIONS
  if (isa() != Isa::kGeneric) return float_row_to_half_f16c(src, n, dst);
#endif
  for (int d = 0; d < n; ++d) dst[d] = float_to_half(src[d]);
}

}  // namespace cpu
}  // namespace fmha
