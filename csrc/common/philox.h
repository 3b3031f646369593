// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based generator, so any element's random bits are a pure function of
// (key, counter) and no state is carried between threads, tiles or backends.
#pragma once

#include <stdint.h>

#include "macros.h"

namespace fmha {

struct U32x4 {
  uint32_t x, y, z, w;
};

FMHA_HOST_DEVICE uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
#if FMHA_DEVICE_CODE
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
#endif
}

FMHA_HOST_DEVICE U32x4 philox4x32_10(U32x4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDACC__) || defined(__HIPCC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo32(kMul0, ctr.x, &hi0);
    const uint32_t lo1 = mulhilo32(kMul1, ctr.z, &hi1);
    ctr = U32x4{hi1 ^ ctr.y ^ key0, lo1, hi0 ^ ctr.w ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

}  // namespace fmha
