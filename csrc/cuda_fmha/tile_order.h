// The order in which the persistent sm_90a forward (fwd_sm90_kernel.h) takes its tiles.
// Tiles t = 0 .. blocks * heads * batch - 1 run sequence by sequence, head by head, and
// within a head from the outside in (query blocks last, first, second-to-last, second, ...),
// so that a pair (2u, 2u + 1) costs about the same under a causal mask.  CTA c takes units
// u = c, c + gridDim.x, ...: pairs, or single tiles (tile_order_unit); at D = 64's 192-row
// tiles under a causal mask the order ends in a sorted tail (for_each).
// Fixed-length problems launch one CTA per multiprocessor, so that a CTA's next tile starts
// loading while its last one finishes; varlen ones, whose tiles differ, one CTA per unit
// (tile_order_ctas).
// The backwards (sm_90a and mma.sync) keep one CTA per key block (a persistent backward
// measured slower, docs/tuning.md) and order their launch (wave_block_order, below).
#pragma once

#include <stdint.h>

#include <algorithm>

#include "../common/macros.h"
#include "fmha/fmha.h"

namespace fmha {
namespace cuda {

// Tiles a CTA takes as one unit (chosen on the host, FwdSm90Maps::unit): a pair from both
// ends of a head where a mask makes their costs differ, and with varlen, which launches one
// CTA per unit; otherwise the kernel's choice, `unmasked` (FwdSm90Traits::kUnmaskedUnit: one
// tile, so that the CTAs' current tiles span half as many heads, or two), except where the
// tiles cost alike (no mask, fixed lengths, no seqused_k) and pairs would give the busiest of
// the sm_count CTAs more tiles than single ones: 2752 tiles (D = 64, S = 8k, 32 heads, batch
// 2) over 132 CTAs are 22 in pairs, 21 one at a time, and under Nsight Compute the SMs idled
// 6.5% of the pairs' time (docs/tuning.md).
FMHA_HOST_DEVICE int tile_order_unit(const fmha_problem& pr, int unmasked, int64_t tiles, int64_t sm_count) {
  if (pr.window_left >= 0 || pr.window_right >= 0 || pr.cu_seqlens_q != nullptr) return 2;
  if (unmasked == 1 || pr.seqused_k != nullptr || tiles <= 0 || sm_count <= 0) return unmasked;
  const int64_t pairs = (tiles + 1) / 2, ctas2 = pairs < sm_count ? pairs : sm_count,
                ctas1 = tiles < sm_count ? tiles : sm_count;
  return (tiles + ctas1 - 1) / ctas1 < 2 * ((pairs + ctas2 - 1) / ctas2) ? 1 : 2;
}

// Whether the order ends in a sorted tail (TileOrder::for_each): fixed-length calls under a
// causal or right-bounded window, where a tile's cost grows with its query block.
FMHA_HOST_DEVICE bool tile_order_sorted_tail(const fmha_problem& pr) {
  return pr.window_right >= 0 && pr.cu_seqlens_q == nullptr;
}

struct TileOrder {
  int64_t tiles;
  int blocks, heads, unit;
  bool sorted_tail;
  FMHA_HOST_DEVICE TileOrder(int blocks_, int heads_, int batch, int unit_, bool sorted_tail_ = false)
      : tiles((int64_t)blocks_ * heads_ * batch), blocks(blocks_), heads(heads_), unit(unit_),
        sorted_tail(sorted_tail_ && unit_ == 2 && tiles < (int64_t)1 << 32) {}  // the tail counts in 32 bits

  // Calls f(block, head, b) for each tile of CTA `cta` of `ctas` (blockIdx.x, gridDim.x), in
  // order: the units of all tiles, in turn (walk).  With kSorted and the sorted tail (pairs
  // whose costs a causal mask sets), first the pairs (last - j, j) within whole heads, in
  // turn, for all but about the last two rounds of the CTAs' units; then the tail: the other
  // heads' tiles and the middle tile of every head where the blocks are odd, one at a time,
  // by query block from the last down (the longest first), across the CTAs forward and back
  // in turn, so that the CTAs' tails add up to about the same work and end on short tiles.
  // Pairs in turn to the end leave a last round that only some CTAs take, and where the
  // blocks are odd, pairs that cross heads (a middle tile with a last one) land unevenly:
  // D = 64's 192-row tiles at S = 8k, 43 a head, leave the SMs 8.4% of the time idle by the
  // key blocks' count, the tail 1.0% (tests/cpp/test_capi.cpp counts the training table's
  // shapes).  The kernel takes it at D = 64's 192-row tiles (FwdSm90Traits::kSortedTail).
  template <bool kSorted = false, class F>
  FMHA_HOST_DEVICE void for_each(uint32_t cta, uint32_t ctas, F&& f) const {
    if constexpr (!kSorted) {
      walk(cta, ctas, blocks, tiles, f);
    } else {
      // The walk's counter (below) and the tail in one loop, f's body once in the code.  The
      // tail keeps its state in the walk's variables, dead by then (a register more across f
      // spilled): t = end + k, with k = r * ctas + (r even ? pos : ctas - 1 - pos) the tail's
      // position in round r (tail_pos), p the step to the next k (2 * pos + 1 and
      // 2 * (ctas - pos) - 1 in turn, summing to step = 2 * ctas), h the first tail head.  The
      // CTA is t0 = 2 * cta modulo step: before the tail, t = t0 + a multiple of step.
      const int nb = sorted_tail ? blocks / 2 * 2 : blocks;
      const int64_t end = sorted_tail ? (int64_t)tail_first_head(ctas) * nb : tiles;
      const uint32_t step = (uint32_t)unit * ctas, t0 = (uint32_t)unit * cta;
      int step_p = 0, step_h = 0, p = 0, h = 0;
      int64_t step_b = 0, b = 0;
      if (t0 < end) {
        step_p = (int)(step % nb), step_h = (int)(step / nb % heads), step_b = step / nb / heads;
        p = (int)(t0 % nb), h = (int)(t0 / nb % heads), b = t0 / nb / heads;
      }
      int64_t t = t0, bb = b;
      int i = 0, pp = p, hh = h;
      auto enter_tail = [&] {
        if (!sorted_tail) return;
        const uint32_t first = nb == 0 ? 0 : (uint32_t)(end / nb);
        const uint32_t pos = tail_pos((uint32_t)((uint64_t)t % step) / 2, step / 2, first);
        t = end + pos, p = (int)(step - 1 - 2 * pos), h = (int)first;
      };
      if (t >= end) enter_tail();
#if FMHA_DEVICE_CODE
#pragma unroll 1  // f's body once in the code
#endif
      for (;;) {
        int level, head, batch;
        if (t < end) {
          level = block(pp), head = hh, batch = (int)bb;
          if (++i < unit && t + i < end) {  // a pair's second tile
            if (++pp == nb) {
              pp = 0;
              if (++hh == heads) hh = 0, ++bb;
            }
          } else {
            i = 0;
            t += step;
            p += step_p;
            const int carry_p = p >= nb;
            p -= carry_p * nb;
            h += step_h + carry_p;
            const int carry_h = h >= heads;
            h -= carry_h * heads;
            b += step_b + carry_h;
            pp = p, hh = h, bb = b;
            if (t >= end) enter_tail();
          }
        } else {
          if (!sorted_tail || !tail_tile((uint32_t)(t - end), (uint32_t)h, level, head, batch)) break;
          t += p;
          p = (int)step - p;
        }
        f(level, head, batch);
      }
    }
  }

  // for_each<true>'s order with f called from two loops, the walk's and the tail's, each
  // keeping only its own state (f's body twice in the code): for the forward's producer, one
  // thread at 24-32 registers, which the one loop spilled (about 370 B of stores).
  // tests/cpp/test_capi.cpp checks that the two agree.
  template <class F>
  FMHA_HOST_DEVICE void for_each_two_loops(uint32_t cta, uint32_t ctas, F&& f) const {
    const uint32_t first = sorted_tail ? tail_first_head(ctas) : 0;
    walk(cta, ctas, sorted_tail ? blocks / 2 * 2 : blocks, sorted_tail ? (int64_t)first * (blocks / 2 * 2) : tiles, f);
    if (!sorted_tail) return;
    const uint32_t pos = tail_pos(cta, ctas, first);
    int level, head, batch;
#if FMHA_DEVICE_CODE
#pragma unroll 1
#endif
    for (uint32_t r = 0; tail_tile(r * ctas + (r % 2 == 0 ? pos : ctas - 1 - pos), first, level, head, batch); ++r)
      f(level, head, batch);
  }

 private:
  // The units of tiles t < end in turn, t = q + nb * (h + heads * b) with position q < nb of
  // a head (nb: blocks, or before the sorted tail their even part): CTA `cta` takes units
  // cta, cta + ctas, ...; from one unit to the CTA's next, t grows by unit * ctas, which this
  // counter adds digit by digit with carries (the step's digits divided out once per CTA, in
  // 32 bits: unit * ctas < 2^32).  Per tile there is no division; with two 64-bit divisions
  // of t per tile, clock64 stamps on an H200 measured about 1,300 cycles between one tile's
  // end and the next one's start.
  template <class F>
  FMHA_HOST_DEVICE void walk(uint32_t cta, uint32_t ctas, int nb_, int64_t end, F&& f) const {
    const uint32_t step = (uint32_t)unit * ctas, t0 = (uint32_t)unit * cta, nb = nb_, nh = heads;
    if (t0 >= end) return;
    const int step_p = (int)(step % nb), step_h = (int)(step / nb % nh);
    const int64_t step_b = step / nb / nh;
    int p = (int)(t0 % nb), h = (int)(t0 / nb % nh);
    int64_t b = t0 / nb / nh;
    for (int64_t t = t0; t < end; t += step) {
      int pp = p, hh = h;
      int64_t bb = b;
#if FMHA_DEVICE_CODE
#pragma unroll 1  // f's body once in the code
#endif
      for (int64_t tt = t; tt < t + unit && tt < end; ++tt) {  // the unit: t, and t + 1 in a pair
        f(block(pp), hh, (int)bb);
        if (++pp == nb_) {
          pp = 0;
          if (++hh == heads) hh = 0, ++bb;
        }
      }
      p += step_p;
      const int carry_p = p >= nb_;
      p -= carry_p * nb_;
      h += step_h + carry_p;
      const int carry_h = h >= heads;
      h -= carry_h * heads;
      b += step_b + carry_h;
    }
  }
  FMHA_HOST_DEVICE int block(int q) const { return q % 2 == 0 ? blocks - 1 - q / 2 : q / 2; }  // from the outside in
  // Heads (sequence, head) whose pairs come before the sorted tail: whole heads for all but
  // about the last two rounds of the ctas CTAs' pairs.
  FMHA_HOST_DEVICE uint32_t tail_first_head(uint32_t ctas) const {
    const uint32_t all = (uint32_t)tiles, half = (uint32_t)blocks / 2, rounds = (all / 2 + all % 2) / ctas;
    const uint32_t first = half == 0 || rounds <= 2 ? 0 : (rounds - 2) * ctas / half, all_heads = all / (uint32_t)blocks;
    return first < all_heads ? first : all_heads;
  }
  // The CTA's place in the tail's rounds: counted from the CTA after the one with the last pair.
  FMHA_HOST_DEVICE uint32_t tail_pos(uint32_t cta, uint32_t ctas, uint32_t first) const {
    return (cta + ctas - first * ((uint32_t)blocks / 2) % ctas) % ctas;
  }
  // Tail position k's tile, or false past the tail: levels (query blocks) from the last down,
  // each with the heads from head_tail on, the middle one (odd blocks) with every head.
  FMHA_HOST_DEVICE bool tail_tile(uint32_t k, uint32_t head_tail, int& level, int& head, int& batch) const {
    const uint32_t half = (uint32_t)blocks / 2, all_heads = (uint32_t)tiles / (uint32_t)blocks;
    const uint32_t tail_heads = all_heads - head_tail, upper = tail_heads * (blocks - 1 - half);
    const bool odd = blocks % 2 == 1;
    if (k >= tail_heads * blocks + (odd ? head_tail : 0)) return false;
    uint32_t flat;
    if (odd && k >= upper && k < upper + all_heads) {  // every head's middle tile
      level = (int)half;
      flat = k - upper;
    } else {
      if (odd && k >= upper) k -= head_tail;  // the levels below the middle
      level = blocks - 1 - (int)(k / tail_heads);
      flat = head_tail + k % tail_heads;
    }
    head = (int)(flat % (uint32_t)heads), batch = (int)(flat / (uint32_t)heads);
    return true;
  }
};

// CTAs to launch for blocks x heads x batch tiles (0: nothing to do).
inline int64_t tile_order_ctas(int64_t blocks, int64_t heads, int64_t batch, bool varlen, int unit, int sm_count) {
  const int64_t units = (blocks * heads * batch + unit - 1) / unit;
  return std::min<int64_t>(varlen ? units : std::min<int64_t>(units, sm_count), INT32_MAX);
}

// The launch order of the kernels with one CTA per block (the backwards, the sm_90a one's
// outside deterministic mode, which keeps the grid's own, key blocks last first, for its
// turns; the mma.sync forward): CTA `linear` of the (blocks, units) grid, units being
// (batch, head[, split]), takes (n_block, unit) so that units go in groups of `order_units`,
// and within a group block slot 0 of every unit, then slot 1, ...  Slot 0 is a unit's longest
// CTA under a causal mask (the backwards' key block 0, which sees the most query blocks; the
// forward's last query block, which sees the most keys), so the longest CTAs start first and
// the shortest fill the tail, where the grid's order (order_units = 1: each unit's blocks in
// turn) ends on a unit's longest CTAs.
FMHA_HOST_DEVICE void wave_block_order(int linear, int n_blocks, int units, int order_units, int& n_block, int& unit) {
  const int group = linear / (order_units * n_blocks), in_group = linear % (order_units * n_blocks);
  const int first = group * order_units, size = units - first < order_units ? units - first : order_units;
  n_block = in_group / size;
  unit = first + in_group % size;
}

// wave_block_order's group: the grid's order (1) where every key block sees the same query
// blocks; under a causal or right-bounded window, as many units as make about one wave of
// CTAs (SMs / key blocks, at most 8), so that the CTAs running together still share Q, dO
// and the dQ accumulator in L2 (groups of 8 units at every length ran D = 192, S = 16k
// non-causal at 0.59x).  In a model of the launch (tools/tune/bwd_launch_model.py) the groups
// take the causal tail at D = 128 from 5-7% over the even share to within 2% at S = 2k-8k
// (4% at 1k, where 8 is the cap); kernel alone on one H100 (docs/tuning.md), this rule
// against the grid's order ran the sm_90a backward causal at D = 128 1.01-1.05x, D = 64, 192,
// 256 0.99-1.01x, and the mma.sync one at D = 256 1.06-1.11x, D = 128 1.01-1.06x, D = 64
// 0.98-1.03x; the mma.sync forward's tiles (one H200) causal D = 64 1.01-1.06x, D = 128
// 1.01-1.11x (4k keys: 1.10-1.11x), D = 256 1.01-1.04x.  `slots`: the CTAs the GPU runs at
// once (wave_slots, launch.h).
inline int wave_order_units(const fmha_problem& pr, int n_blocks, int slots) {
  const int wave = n_blocks < slots ? slots / n_blocks : 1;
  return pr.window_right >= 0 ? std::min(wave, 8) : 1;
}

}  // namespace cuda
}  // namespace fmha
