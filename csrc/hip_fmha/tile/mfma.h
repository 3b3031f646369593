// Wave-level matrix products on the CDNA matrix cores (MFMA), fp32 accumulators:
// v_mfma_f32_32x32x8 (N = 32) and v_mfma_f32_16x16x16 (N = 16) for f16 and bf16.
//
// One instruction computes C (N x N) += A (N x kK) * B (kK x N) for the whole wave, with
// kK = 256 / N.  Lane l holds:
//   A: row l % N,    elements k = 4 (l / N) + 0..3   (a Frag: four 16-bit values)
//   B: column l % N, elements k = 4 (l / N) + 0..3
//   C: column l % N, rows (r / 4) kK + 4 (l / N) + r % 4 for its registers r = 0 .. N*N/64 - 1
// So an operand's "lane index" (A's row, B's column) runs over N lanes and its k over four
// consecutive elements per lane.  The C layout has a consequence the kernels rely on:
// registers 4g .. 4g + 3 of C hold, per column, rows g kK + 4 (l / N) + 0..3 -- exactly a B
// fragment of k-block g.  An accumulator therefore feeds a following product directly as
// its B operand (C itself, k = C's rows), after rounding to 16 bits, with no data movement.
#pragma once

#include <stdint.h>

#include "arch.h"
#include "buffer.h"

namespace fmha {
namespace hip {

typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef int16_t i16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x16 __attribute__((ext_vector_type(16)));

// Four consecutive k elements of one operand row/column (two 32-bit registers).
using Frag = i32x2;

template <int N>
struct Mfma;

template <>
struct Mfma<32> {
  static constexpr int kN = 32, kK = 8, kRegs = 16;
  using Acc = f32x16;
};
template <>
struct Mfma<16> {
  static constexpr int kN = 16, kK = 16, kRegs = 4;
  using Acc = f32x4;
};

template <int N>
using Acc = typename Mfma<N>::Acc;

// Where lane l's operand elements and accumulator registers sit in the N x N block.
template <int N>
FMHA_DEVICE int lane_index(int lane) {  // A's row, B's column, C's column
  return lane % N;
}
template <int N>
FMHA_DEVICE int lane_k(int lane) {  // first of the operand's four k
  return 4 * (lane / N);
}
template <int N>
FMHA_DEVICE constexpr int acc_row(int r, int lane) {  // C's row of register r
  return (r / 4) * Mfma<N>::kK + 4 * (lane / N) + r % 4;
}

// c += a * b.
template <class T, int N>
FMHA_DEVICE void mfma(Acc<N>& c, Frag a, Frag b);

template <>
FMHA_DEVICE void mfma<f16, 32>(f32x16& c, Frag a, Frag b) {
  c = __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0, 0);
}
template <>
FMHA_DEVICE void mfma<bf16, 32>(f32x16& c, Frag a, Frag b) {
  c = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c, 0, 0,
                                               0);
}
template <>
FMHA_DEVICE void mfma<f16, 16>(f32x4& c, Frag a, Frag b) {
  c = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0, 0);
}
template <>
FMHA_DEVICE void mfma<bf16, 16>(f32x4& c, Frag a, Frag b) {
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c, 0, 0,
                                                0);
}

// Max and sum of x over the lanes that share an accumulator column (l, l ^ N, ...): the
// row statistics of a transposed score tile, S^T, whose columns are queries.
template <int N>
FMHA_DEVICE float row_reduce_max(float x) {
#pragma unroll
  for (int o = N; o < kWaveSize; o *= 2) x = fmaxf(x, lane_xor(x, o));
  return x;
}
template <int N>
FMHA_DEVICE float row_reduce_sum(float x) {
#pragma unroll
  for (int o = N; o < kWaveSize; o *= 2) x += lane_xor(x, o);
  return x;
}

// The online softmax's passes over a lane's row of a transposed score tile (its query's
// keys, down the registers): the row's maximum in this lane, P = exp2(s * scale - ref) in
// place with this lane's sum, and the rescaling of O^T's column.  The same names over the
// CUDA tile layer's fragments (cuda_fmha/tile/mma.h).
template <int N, int B>
FMHA_DEVICE float row_max(const Acc<N> (&s)[B]) {
  float mx = -INFINITY;
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int r = 0; r < Mfma<N>::kRegs; ++r) mx = fmaxf(mx, s[b][r]);
  return mx;
}
template <int N, int B>
FMHA_DEVICE float exp2_row(Acc<N> (&s)[B], float scale, float ref) {
  float sum = 0.f;
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int r = 0; r < Mfma<N>::kRegs; ++r) {
      s[b][r] = fast_exp2(fmaf(s[b][r], scale, -ref));
      sum += s[b][r];
    }
  return sum;
}
template <int N, int B>
FMHA_DEVICE void mul_row(Acc<N> (&s)[B], float f) {
#pragma unroll
  for (int b = 0; b < B; ++b) s[b] *= f;
}
// exp2_row over a score tile whose query rows run down the registers (the backward's S):
// its element r in this lane, whose row's reference the caller gives, P = exp2(s * scale -
// ref) in place; returns that P.
template <int N>
FMHA_DEVICE float exp2_row(Acc<N>& s, int r, float scale, float ref) {
  return s[r] = fast_exp2(fmaf(s[r], scale, -ref));
}

template <int N, int B>
FMHA_DEVICE void clear(Acc<N> (&c)[B]) {
#pragma unroll
  for (int b = 0; b < B; ++b) c[b] = Acc<N>{};
}
template <int N, int B0, int B1>
FMHA_DEVICE void clear(Acc<N> (&c)[B0][B1]) {
#pragma unroll
  for (int b = 0; b < B0; ++b) clear<N>(c[b]);
}

// c[m][n] += sum over kSteps k-steps of a(m, s) * b(n, s): the fragment sources are
// callables, so one loop serves operands from LDS, from global memory, from registers and
// from earlier accumulators.  The fragments of step s + 1 are fetched before the MFMAs of
// step s are issued, and a scheduling barrier keeps the compiler from hoisting every
// step's reads to the top of the fully unrolled loop: that hoisting is what pushes the
// large-head-dim kernels past 512 registers into scratch.
template <class T, int N, int kSteps, int MB, int NB, class FA, class FB>
FMHA_DEVICE void gemm(Acc<N> (&c)[MB][NB], const FA& a, const FB& b) {
  Frag fa[2][MB], fb[2][NB];
#pragma unroll
  for (int m = 0; m < MB; ++m) fa[0][m] = a(m, 0);
#pragma unroll
  for (int n = 0; n < NB; ++n) fb[0][n] = b(n, 0);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int cur = s % 2, nxt = 1 - cur;
    if (s + 1 < kSteps) {
#pragma unroll
      for (int m = 0; m < MB; ++m) fa[nxt][m] = a(m, s + 1);
#pragma unroll
      for (int n = 0; n < NB; ++n) fb[nxt][n] = b(n, s + 1);
    }
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int n = 0; n < NB; ++n) mfma<T, N>(c[m][n], fa[cur][m], fb[cur][n]);
    __builtin_amdgcn_sched_barrier(0);
  }
}

// The same with one block column: c[m] += sum_s a(m, s) * b(s).
template <class T, int N, int kSteps, int MB, class FA, class FB>
FMHA_DEVICE void gemm(Acc<N> (&c)[MB], const FA& a, const FB& b) {
  Frag fa[2][MB], fb[2];
#pragma unroll
  for (int m = 0; m < MB; ++m) fa[0][m] = a(m, 0);
  fb[0] = b(0);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int cur = s % 2, nxt = 1 - cur;
    if (s + 1 < kSteps) {
#pragma unroll
      for (int m = 0; m < MB; ++m) fa[nxt][m] = a(m, s + 1);
      fb[nxt] = b(s + 1);
    }
#pragma unroll
    for (int m = 0; m < MB; ++m) mfma<T, N>(c[m], fa[cur][m], fb[cur]);
    __builtin_amdgcn_sched_barrier(0);
  }
}

// ---- operand fragments from memory (an LdsTile or a GlobalTile: both have load8/load2) ----

// The operand's lane index runs down the tile's rows and its k along the row: rows
// row0 + l % N, columns k0 + 4 (l / N) .. + 3.  One 8-byte read.
template <int N, class Tile>
FMHA_DEVICE Frag frag_rows(const Tile& t, int row0, int k0, int lane) {
  return t.load8(row0 + lane_index<N>(lane), k0 + lane_k<N>(lane));
}

// The transpose: k runs down the tile's rows and the lane index along them: rows
// k0 + 4 (l / N) .. + 3, column col0 + l % N.  Four 2-byte reads; this is how a tile stored
// [k][n] (V for P V, Q for dK, K for dQ) serves as an operand without a transposed copy.
template <int N, class Tile>
FMHA_DEVICE Frag frag_cols(const Tile& t, int k0, int col0, int lane) {
  const int r = k0 + lane_k<N>(lane), c = col0 + lane_index<N>(lane);
  const uint32_t lo = (uint32_t)t.load2(r, c) | ((uint32_t)t.load2(r + 1, c) << 16);
  const uint32_t hi = (uint32_t)t.load2(r + 2, c) | ((uint32_t)t.load2(r + 3, c) << 16);
  return Frag{(int32_t)lo, (int32_t)hi};
}

// ---- accumulators as operands and as output ----

// k-block g of an accumulator as a B operand (see the top of this file), rounded to T.
template <class T, int N>
FMHA_DEVICE Frag acc_frag(const Acc<N>& c, int g) {
  return Frag{(int32_t)pack2<T>(c[4 * g], c[4 * g + 1]), (int32_t)pack2<T>(c[4 * g + 2], c[4 * g + 3])};
}

// Writes accumulator blocks c[b] (stacked down the rows: block b covers rows b N ..) as T
// into a memory tile whose row is the accumulator's column: element (row, col) of C goes
// to t[col0 + col][row0 + row], four consecutive rows per 8-byte store.  That transposing
// store is what turns O^T, dK^T, dV^T, dQ^T accumulators into row-major outputs.
template <class T, int N, int B, class Tile>
FMHA_DEVICE void store_acc_t(const Tile& t, const Acc<N> (&c)[B], int col0, int row0, int lane) {
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int g = 0; g < Mfma<N>::kRegs / 4; ++g)
      t.store8(col0 + lane_index<N>(lane), row0 + b * N + acc_row<N>(4 * g, lane), acc_frag<T, N>(c[b], g));
}

}  // namespace hip
}  // namespace fmha
