"""fmha.distributed: context parallelism on torch.distributed, with ring-flash-attention's
function names and signatures (switching is one import line), computed by fmha's kernels.

    from fmha.distributed import zigzag_ring_flash_attn_func, zigzag_shard
    q_local = zigzag_shard(q, rank, world_size)            # (batch, S / W, nheads, headdim)
    out_local = zigzag_ring_flash_attn_func(q_local, k_local, v_local, causal=True)

Ring attention (K/V passed around the ring, batched isend/irecv on a side stream on GPUs,
merged by LSE) in three layouts, fixed length and varlen; Llama 3's all-gather for packed
documents; Ulysses (all-to-all over heads, fixed length and varlen); Ulysses x ring on a
2-D mesh (usp_*); sharding helpers.  See docs/distributed.md.
"""

from .llama3 import (
    llama3_flash_attn_prepare_cu_seqlens,
    llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func,
    llama3_flash_attn_varlen_qkvpacked_func,
)
from .ring import (
    ring_flash_attn_func,
    ring_flash_attn_kvpacked_func,
    ring_flash_attn_qkvpacked_func,
    stripe_flash_attn_func,
    stripe_flash_attn_kvpacked_func,
    stripe_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_func,
    zigzag_ring_flash_attn_kvpacked_func,
    zigzag_ring_flash_attn_qkvpacked_func,
)
from .sharding import (
    gather_unshard,
    positions,
    shard,
    shard_varlen,
    stripe_shard,
    unshard,
    unshard_varlen,
    varlen_positions,
    zigzag_shard,
    zigzag_unshard,
)
from .ulysses import (
    ulysses_flash_attn_func,
    ulysses_flash_attn_kvpacked_func,
    ulysses_flash_attn_qkvpacked_func,
    ulysses_flash_attn_varlen_func,
    ulysses_flash_attn_varlen_kvpacked_func,
    ulysses_flash_attn_varlen_qkvpacked_func,
)
from .usp import (
    usp_flash_attn_func,
    usp_flash_attn_kvpacked_func,
    usp_flash_attn_qkvpacked_func,
    usp_positions,
    usp_shard,
)
from .varlen import (
    ring_flash_attn_varlen_func,
    ring_flash_attn_varlen_kvpacked_func,
    ring_flash_attn_varlen_qkvpacked_func,
    zigzag_ring_flash_attn_varlen_func,
    zigzag_ring_flash_attn_varlen_kvpacked_func,
    zigzag_ring_flash_attn_varlen_qkvpacked_func,
)

__all__ = [
    "gather_unshard",
    "llama3_flash_attn_prepare_cu_seqlens",
    "llama3_flash_attn_varlen_func",
    "llama3_flash_attn_varlen_kvpacked_func",
    "llama3_flash_attn_varlen_qkvpacked_func",
    "positions",
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func",
    "ring_flash_attn_varlen_kvpacked_func",
    "ring_flash_attn_varlen_qkvpacked_func",
    "shard",
    "shard_varlen",
    "stripe_flash_attn_func",
    "stripe_flash_attn_kvpacked_func",
    "stripe_flash_attn_qkvpacked_func",
    "stripe_shard",
    "ulysses_flash_attn_func",
    "ulysses_flash_attn_kvpacked_func",
    "ulysses_flash_attn_qkvpacked_func",
    "ulysses_flash_attn_varlen_func",
    "ulysses_flash_attn_varlen_kvpacked_func",
    "ulysses_flash_attn_varlen_qkvpacked_func",
    "unshard",
    "unshard_varlen",
    "usp_flash_attn_func",
    "usp_flash_attn_kvpacked_func",
    "usp_flash_attn_qkvpacked_func",
    "usp_positions",
    "usp_shard",
    "varlen_positions",
    "zigzag_ring_flash_attn_func",
    "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func",
    "zigzag_ring_flash_attn_varlen_func",
    "zigzag_ring_flash_attn_varlen_kvpacked_func",
    "zigzag_ring_flash_attn_varlen_qkvpacked_func",
    "zigzag_shard",
]
