// The order in which the persistent sm_90a forward (fwd_sm90_kernel.h) takes its tiles.
// Tiles t = 0 .. blocks * heads * batch - 1 run sequence by sequence, head by head, and
// within a head from the outside in (query blocks last, first, second-to-last, second, ...),
// so that a pair (2u, 2u + 1) costs about the same under a causal mask.  CTA c takes units
// u = c, c + gridDim.x, ...: pairs, or single tiles (tile_order_unit).  Fixed-length
// problems launch one CTA per multiprocessor, so that a CTA's next tile starts loading while
// its last one finishes; varlen ones, whose tiles differ, one CTA per unit (tile_order_ctas).
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

struct TileOrder {
  int64_t tiles;
  int blocks, heads, unit;
  FMHA_HOST_DEVICE TileOrder(int blocks_, int heads_, int batch, int unit_)
      : tiles((int64_t)blocks_ * heads_ * batch), blocks(blocks_), heads(heads_), unit(unit_) {}
  // Calls f(block, head, b) for each tile of CTA `cta` of `ctas` (blockIdx.x, gridDim.x), in
  // order.  Tile t sits at (p, h, b) with t = p + blocks * (h + heads * b); from one unit to
  // the CTA's next, t grows by unit * ctas, which this counter adds digit by digit with carries
  // (the step's digits divided out once per CTA, in 32 bits: unit * ctas < 2^32).  Per tile
  // there is no division; with two 64-bit divisions of t per tile, clock64 stamps on an
  // H200 measured about 1,300 cycles between one tile's end and the next one's start.
  template <class F>
  FMHA_HOST_DEVICE void for_each(uint32_t cta, uint32_t ctas, F&& f) const {
    const uint32_t step = (uint32_t)unit * ctas, t0 = (uint32_t)unit * cta, nb = blocks, nh = heads;
    if (t0 >= tiles) return;
    const int step_p = (int)(step % nb), step_h = (int)(step / nb % nh);
    const int64_t step_b = step / nb / nh;
    int p = (int)(t0 % nb), h = (int)(t0 / nb % nh);
    int64_t b = t0 / nb / nh;
    auto block = [&](int q) { return q % 2 == 0 ? blocks - 1 - q / 2 : q / 2; };
    for (int64_t t = t0; t < tiles; t += step) {
      int pp = p, hh = h;
      int64_t bb = b;
#if FMHA_DEVICE_CODE
#pragma unroll 1  // f's body once in the code
#endif
      for (int64_t tt = t; tt < t + unit && tt < tiles; ++tt) {  // the unit: t, and t + 1 in a pair
        f(block(pp), hh, (int)bb);
        if (++pp == blocks) {
          pp = 0;
          if (++hh == heads) hh = 0, ++bb;
        }
      }
      p += step_p;
      const int carry_p = p >= blocks;
      p -= carry_p * blocks;
      h += step_h + carry_p;
      const int carry_h = h >= heads;
      h -= carry_h * heads;
      b += step_b + carry_h;
    }
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
