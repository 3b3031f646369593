#!/usr/bin/env python3
"""A representative set of fmha GPU calls for compute-sanitizer (memcheck, racecheck):
tile-unaligned lengths, causal/window/softcap/ALiBi/dropout, GQA, varlen with an empty
sequence, deterministic and atomic backward, each head-dim class once, the sm_90a forward
and backward; decode with paged, 8-bit and split caches, appends, rotary, and metadata out of
range (clamped); prefill chunks over pages (the sm_90a forward reading them).

    compute-sanitizer --tool memcheck --kernel-regex kns=fmha python tools/sanitize_cases.py
"""

import torch

import fmha


def run(b, sq, sk, hq, hk, d, dtype=torch.bfloat16, **kw):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    out = fmha.flash_attn_func(q, k, v, **kw)
    out.backward(torch.randn_like(out))


def run_varlen(d, dtype=torch.float16, **kw):
    lens = [5, 0, 77, 130]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q, k, v = (torch.randn(total, 4, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    out = fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **kw)
    if isinstance(out, tuple):  # return_attn_probs
        out = out[0]
    out.backward(torch.randn_like(out))


def run_decode(d, page=None, quant=None, splits=0, bad=False, dtype=torch.bfloat16, **kw):
    b, cap, hk, hq = 3, 200 if page is None else 4 * page, 2, 8
    kc, vc = (torch.randn(b, cap, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    extra = {}
    if quant is not None:
        kc, ks = fmha.quantize_kv_cache(kc, quant, "token")
        vc, vs = fmha.quantize_kv_cache(vc, quant, "token")
        extra = dict(k_scale=ks, v_scale=vs)
    seqlens = torch.tensor([0, 37, cap - 2], dtype=torch.int32, device="cuda")
    if page is not None:
        kc, vc = kc.view(b * 4, page, hk, d), vc.view(b * 4, page, hk, d)
        if quant is not None:
            extra = {n: x.view(b * 4, page, hk) for n, x in extra.items()}
        table = torch.arange(b * 4, dtype=torch.int32, device="cuda").flip(0).view(b, 4).contiguous()
        if bad:
            table[1, 1] = 10**6
        extra["block_table"] = table
    if bad:
        seqlens = torch.tensor([1 << 30, -7, 5], dtype=torch.int32, device="cuda")
        extra["cache_leftpad"] = torch.tensor([3, 1 << 20, -2], dtype=torch.int32, device="cuda")
    q = torch.randn(b, 2, hq, d, device="cuda", dtype=dtype)
    knew, vnew = (torch.randn(b, 2, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    fmha.flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=seqlens, num_splits=splits, **extra, **kw)


def run_paged_prefill(d, page, bad=False, dtype=torch.bfloat16, lens_k=(333, 40, 16, 70), **kw):
    """flash_attn_varlen_func over pages with prefill chunks (the sm_90a forward reading pages,
    fwd_paged_sm90): most sequences end inside a copy box (their V box by cp.async); with
    bad=True, pages and lengths past the cache (clamped)."""
    lens_q, lens_k, hk, hq = [100, 1, 0, 70], list(lens_k), 2, 4
    width = -(-max(lens_k) // page) + 1
    kc, vc = (torch.randn(4 * width, page, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    table = torch.randperm(4 * width, device="cuda").to(torch.int32).view(4, width)
    seqused = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    if bad:
        table[0, 1], table[3, 0] = 10**6, -3
        seqused[1] = 1 << 30
    cu = torch.tensor([0] + lens_q, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, device="cuda", dtype=dtype)
    fmha.flash_attn_varlen_func(q, kc, vc, cu, None, max(lens_q), None, block_table=table, seqused_k=seqused, **kw)


def main():
    slopes = torch.rand(4, device="cuda")
    run(2, 200, 200, 4, 2, 128, causal=True)
    run(1, 77, 150, 4, 4, 64, window_size=(20, 5), softcap=10.0, dropout_p=0.1, deterministic=True)
    run(1, 130, 61, 4, 1, 256, alibi_slopes=slopes)
    run(1, 65, 65, 2, 2, 96, dtype=torch.float16, causal=True, deterministic=True)
    run(1, 33, 40, 2, 2, 192, dropout_p=0.2)
    run(1, 70, 112, 2, 2, 128, dropout_p=0.1)  # a first key block with 16 of 48 keys live
    run(1, 90, 100, 4, 2, 128, causal=True, softcap=8.0, alibi_slopes=slopes)  # D = 128's score-mod forward
    run(1, 17, 17, 2, 2, 32, causal=True)
    run(1, 40, 50, 2, 1, 40, dtype=torch.float32, causal=True)  # fp32 path, padded head dim
    # sm_90a forward: several tiles per persistent CTA, padded head dims, both epilogues
    # (D <= 64 stores from registers), the 64-byte swizzle (D = 96), rows that see no key.
    run(2, 600, 700, 8, 2, 40, causal=True)
    run(1, 300, 300, 2, 2, 192, dtype=torch.float16)
    run(3, 260, 100, 4, 4, 80, causal=True)
    run(1, 200, 8300, 2, 2, 128)  # D = 128 past 8192 keys
    run(1, 250, 8300, 4, 2, 64, softcap=10.0)  # D = 64's 192-row tiles (three consumers)
    run(1, 200, 1100, 2, 2, 256)  # D = 256's 80-key blocks (at least 1024 keys)
    # Square causal masks: consumers that skip a tile's leading key blocks (D = 64's 192-row
    # tiles, D = 256's 64-key blocks).
    run(1, 4200, 4200, 2, 2, 64, causal=True)
    run(1, 700, 700, 2, 2, 256, causal=True)
    # D = 128's 128-key blocks with O staged in a buffer of its own: more pairs of tiles than
    # multiprocessors, so that a CTA reuses the buffer while the next Q loads.
    with torch.no_grad():
        q = torch.randn(2, 1100, 40, 128, device="cuda", dtype=torch.bfloat16)
        fmha.flash_attn_func(q, q, q, causal=True)
    # sm_90a backward: GQA with a window in deterministic mode (dQ added in turn), score
    # mods at D = 64 (64-row query blocks), the head-dim split at 256 (one stage); the cases
    # above run it at D = 40, 96 (on the 128 kernel), 128, 192 and 256 (ALiBi).
    run(1, 150, 170, 8, 2, 128, causal=True, window_size=(50, -1), deterministic=True)
    run(2, 130, 200, 4, 2, 64, softcap=5.0)
    run(1, 150, 170, 8, 2, 256, causal=True, window_size=(50, -1), deterministic=True)
    run_varlen(64, causal=True)
    run_varlen(256, causal=True)
    run_varlen(128, deterministic=True, return_attn_probs=True, dropout_p=0.1)
    run_varlen(64, causal=True, deterministic=True)
    run(1, 100, 700, 2, 2, 128, deterministic=True)  # six key blocks add each query block's dQ in turn
    run(96, 260, 260, 2, 1, 128, causal=True)  # 288 tiles: more than two per SM
    # D = 64's 192-row tiles under a causal mask: 23 a head over 36 heads, rounds of pairs, then
    # the sorted tail (forward only), plain and with softcap (the score-mod instance)
    q, k, v = (torch.randn(1, 4400, 36, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fmha.flash_attn_func(q, k, v, causal=True)
    fmha.flash_attn_func(q, k, v, causal=True, softcap=20.0)
    # The sm_90a backward's runs by mask (kMaskRuns, D = 64): each key block's masked query
    # blocks first and last, unmasked ones between; D = 128 and 192 in one loop.
    run(1, 700, 1100, 4, 2, 64, window_size=(300, 100))
    run(1, 700, 1100, 4, 2, 128, window_size=(300, 100))
    run(1, 700, 1100, 4, 2, 192, causal=True, window_size=(400, 0))
    cos, sin = (torch.randn(512, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    run_decode(128, causal=True, rotary_cos=cos, rotary_sin=sin, splits=3)
    run_decode(64, page=16, quant=torch.float8_e4m3fn, splits=2, causal=True)
    run_decode(256, page=48, quant=torch.int8, window_size=(30, 0))
    run_decode(128, page=16, bad=True, splits=4, causal=True)
    run_decode(80, bad=True, dtype=torch.float16)
    run_decode(64, quant=torch.int8, dtype=torch.float32, causal=True)  # fp32 row-wise path
    run_paged_prefill(128, 16, causal=True)
    run_paged_prefill(64, 256)
    run_paged_prefill(96, 48, bad=True, causal=True)
    run_paged_prefill(128, 256, dtype=torch.float16, lens_k=(1100, 600, 16, 333))  # D = 128 paged: 3-stage ring
    torch.cuda.synchronize()
    print("sanitize cases done")


if __name__ == "__main__":
    main()
