"""A greedy-decoding loop's attention over a paged KV cache: each step appends the new
token's key and value in place and attends to everything so far (flash_attn_with_kvcache).

    python examples/python/paged_decode.py [--device cuda] [--steps 20]
"""

import argparse

import torch

import fmha


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    dev, dtype = args.device, torch.bfloat16
    batch, heads, kv_heads, head_dim, page = 3, 8, 2, 64, 16
    pages_per_seq = 4  # room for 64 tokens per sequence
    # The pool of pages, and each sequence's pages in a shuffled order (any page can hold
    # any sequence's positions).
    k_cache = torch.zeros(batch * pages_per_seq, page, kv_heads, head_dim, device=dev, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    block_table = torch.randperm(batch * pages_per_seq, device=dev).to(torch.int32).view(batch, pages_per_seq)
    lengths = torch.tensor([5, 0, 12], dtype=torch.int32, device=dev)  # tokens already cached
    for step in range(args.steps):
        q = torch.randn(batch, 1, heads, head_dim, device=dev, dtype=dtype)
        k_new = torch.randn(batch, 1, kv_heads, head_dim, device=dev, dtype=dtype)
        v_new = torch.randn(batch, 1, kv_heads, head_dim, device=dev, dtype=dtype)
        with torch.no_grad():  # inference: flash_attn_with_kvcache has no backward
            out = fmha.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths,
                                               block_table=block_table, causal=True)
        lengths += 1  # the call wrote the new token at position `lengths`
        assert out.shape == q.shape and torch.isfinite(out).all()
    print(f"{args.steps} steps; cached tokens per sequence now {lengths.tolist()}")
    return lengths.tolist()


if __name__ == "__main__":
    main()
