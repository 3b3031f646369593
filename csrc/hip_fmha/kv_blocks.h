// A head's K and V blocks on their way to LDS, as the forward and the dQ backward stream them
// (fwd_kernel.h, bwd_dq_kernel.h): load() brings block n_block's kBlockN keys into registers,
// issued a block ahead of their use, and store() writes them to the two LDS tiles.  Rows past
// the sequence's keys and columns past head_dim arrive as zeros (TileCopy).
#pragma once

#include "tile/arch.h"  // first: HIP's __host__/__device__, which csrc/common/ uses

#include <stdint.h>

#include "../common/sequence.h"
#include "fmha/fmha.h"
#include "tile/buffer.h"
#include "tile/lds.h"

namespace fmha {
namespace hip {

template <class TileKV, int kThreads, int kBlockN>
struct KvBlocks {
  TileCopy<TileKV, kThreads> k, v;
  // Row 0 of this head's K and V, computed once: fewer live scalar registers in the loop.
  const uint16_t* k_head;
  const uint16_t* v_head;
  int64_t k_stride, v_stride;
  int len_k, head_dim;

  FMHA_DEVICE KvBlocks(const fmha_tensor& tk, const fmha_tensor& tv, const Sequence& seq, int hk, int d)
      : k_head(static_cast<const uint16_t*>(tk.data) + seq.k_offset(tk, 0, hk)),
        v_head(static_cast<const uint16_t*>(tv.data) + seq.k_offset(tv, 0, hk)),
        k_stride(tk.row_stride),
        v_stride(tv.row_stride),
        len_k(seq.len_k),
        head_dim(d) {}

  FMHA_DEVICE void load(int n_block, int tid) {
    const int n0 = n_block * kBlockN;
    k.load(GlobalTile::make(k_head + n0 * k_stride, k_stride, len_k - n0, head_dim), tid);
    v.load(GlobalTile::make(v_head + n0 * v_stride, v_stride, len_k - n0, head_dim), tid);
  }

  FMHA_DEVICE void store(const TileKV& sK, const TileKV& sV, int tid) const {
    k.store(sK, tid);
    v.store(sV, tid);
  }
};

}  // namespace hip
}  // namespace fmha
