// The order in which the persistent sm_90a forward (fwd_sm90_kernel.h) takes its tiles.
// Tiles t = 0 .. blocks * heads * batch - 1 run sequence by sequence, head by head, and
// within a head from the outside in (query blocks last, first, second-to-last, second, ...),
// so that a pair (2u, 2u + 1) costs about the same under a causal mask.  CTA c takes pairs
// u = c, c + gridDim.x, ...  Fixed-length problems launch one CTA per multiprocessor, so
// that a CTA's next tile starts loading while its last one finishes; varlen ones, whose
// tiles differ, one CTA per pair (tile_order_ctas).  (The backward keeps one CTA per tile:
// a persistent backward measured slower, docs/tuning.md.)
#pragma once

#include <stdint.h>

#include <algorithm>

namespace fmha {
namespace cuda {

struct TileOrder {
  int64_t tiles;
  int blocks, heads;
  __device__ __forceinline__ TileOrder(int blocks_, int heads_, int batch)
      : tiles((int64_t)blocks_ * heads_ * batch), blocks(blocks_), heads(heads_) {}
  // Calls f(block, head, b) for each tile of this CTA, in order.
  template <class F>
  __device__ __forceinline__ void for_each(F&& f) const {
    for (int64_t u = blockIdx.x; 2 * u < tiles; u += gridDim.x)
      for (int64_t t = 2 * u; t < 2 * u + 2 && t < tiles; ++t) {
        const int p = (int)(t % blocks);
        const int64_t bh = t / blocks;
        f(p % 2 == 0 ? blocks - 1 - p / 2 : p / 2, (int)(bh % heads), (int)(bh / heads));
      }
  }
};

// CTAs to launch for blocks x heads x batch tiles (0: nothing to do).
inline int64_t tile_order_ctas(int64_t blocks, int64_t heads, int64_t batch, bool varlen, int sm_count) {
  const int64_t pairs = (blocks * heads * batch + 1) / 2;
  return std::min<int64_t>(varlen ? pairs : std::min<int64_t>(pairs, sm_count), INT32_MAX);
}

}  // namespace cuda
}  // namespace fmha
