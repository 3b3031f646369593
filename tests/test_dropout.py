"""Dropout, checked exactly: the keep-mask of every element is regenerated in Python
(Philox4x32-10 and the mapping of docs/dropout.md, tests/reference.py) from the
rng_state [seed, offset], and out, gradients and the returned probabilities are compared
with the float64 reference under that mask.  Plus statistics and seeding behaviour."""

import math

import pytest
import torch

import fmha
from conftest import (GRAD_TOL, LSE_TOL, OUT_TOL, assert_close, assert_lse_close, dtype_id,
                      leaf, poisoned_outputs, randn)
from reference import (attention_ref_grads, dropout_keep_mask,
                       dropout_keep_mask_varlen, keep_threshold, philox4x32_10,
                       softmax_probs_ref, visible_mask)


def test_philox_known_answers():
    # Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors):
    # counter (4 words), key (2 words) -> output (4 words).
    kat = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in kat:
        got = tuple(int(w) for w in philox4x32_10(*ctr, *key))
        assert got == want, f"philox({ctr}, {key}) = {[hex(x) for x in got]}"


def _fwd(q, k, v, p, rng_state, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
         cu_q=None, cu_k=None, seqused=None, max_q=None, max_k=None):
    """torch.ops.fmha.fwd with return_probs=True; q, k, v already on their device."""
    dev = q.device
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    left, right = window[0], 0 if causal else window[1]
    max_q = q.shape[1] if max_q is None else max_q
    max_k = k.shape[1] if max_k is None else max_k
    return torch.ops.fmha.fwd(q, k, v, to(cu_q), to(cu_k), to(seqused), max_q, max_k,
                              q.shape[-1] ** -0.5, softcap, left, right, False, to(alibi), p,
                              False, True, rng_state)


def _check_probs(probs, keep, ref_probs, visible, dtype, what="probs"):
    """probs: softmax probabilities with dropped entries negated, 0 where not visible."""
    probs = probs.detach().cpu()
    assert probs.dtype == dtype and probs.shape == keep.shape, f"{what}: {probs.dtype} {tuple(probs.shape)}"
    assert (probs[~visible] == 0).all(), f"{what}: entries that are not visible must be 0"
    kept_sign = probs[visible] > 0
    assert torch.equal(kept_sign, keep[visible]), (
        f"{what}: sign pattern differs from the Philox mask at "
        f"{(kept_sign != keep[visible]).sum().item()} of {visible.sum().item()} visible elements")
    assert_close(probs.abs(), ref_probs, OUT_TOL[dtype], f"|{what}|")


# (seed, offset) pairs: small ones, offsets whose high 32 bits feed the Philox key, and a
# negative int64 seed (its uint64 bits have the high word set).
RNG_STATES = [(1234, 0), (2**40 + 7, 3 * 2**32 + 17), (-5, 2**63 - 1)]

FIXED_CASES = [
    # sq, sk, hq, hk, dtype, p, options
    (33, 47, 2, 2, torch.float16, 0.17, dict()),
    (65, 40, 4, 2, torch.bfloat16, 0.5, dict(causal=True)),  # empty rows: Sq > Sk
    (17, 100, 4, 1, torch.float32, 0.3, dict(window=(9, 4), softcap=5.0, alibi="h")),
]


@pytest.mark.parametrize("seed,offset", RNG_STATES, ids=["small", "offset_hi", "seed_neg"])
@pytest.mark.parametrize("sq,sk,hq,hk,dtype,p,options", FIXED_CASES,
                         ids=[f"sq{c[0]}-sk{c[1]}-hq{c[2]}-hk{c[3]}-{dtype_id(c[4])}-p{c[5]}"
                              + "".join(f"-{o}" for o in c[6]) for c in FIXED_CASES])
def test_exact_mask_fixed(device, sq, sk, hq, hk, dtype, p, options, seed, offset):
    _check_exact_mask(device, 2, 32, sq, sk, hq, hk, dtype, p, options, seed, offset)


def test_exact_mask_long_keys(device):
    # D = 64 from 1024 keys up under a causal mask runs the CUDA forward's second key block
    # (kFwdLongKeys, csrc/cuda_fmha/configs.h); 1100 keys are off both block sizes.
    _check_exact_mask(device, 1, 64, 40, 1100, 2, 1, torch.bfloat16, 0.2, dict(causal=True), 1234, 5)


@pytest.mark.parametrize("sk", [112, 128])
def test_exact_mask_partial_first_block(device, sk):
    # D = 128's 48-key blocks: the CUDA forward's first block has 16 or 32 live keys and is
    # computed at a third or two thirds of its width (fwd_kernel.h).
    _check_exact_mask(device, 1, 128, 40, sk, 2, 1, torch.bfloat16, 0.2, dict(causal=True), 1234, 5)


def test_exact_mask_score_mods_tensor_core(device):
    # The fixed case with softcap and ALiBi is fp32 (the CUDA row-wise path); this one runs
    # the tensor-core forward's and backward's dropout + score-mod instances at D = 128.
    _check_exact_mask(device, 2, 128, 50, 70, 4, 2, torch.bfloat16, 0.25,
                      dict(causal=True, softcap=5.0, alibi="h"), 77, 3)


def _check_exact_mask(device, B, D, sq, sk, hq, hk, dtype, p, options, seed, offset):
    q, k, v = (randn(B, sq, hq, D, dtype=dtype), randn(B, sk, hk, D, dtype=dtype),
               randn(B, sk, hk, D, dtype=dtype))
    dout = randn(B, sq, hq, D, dtype=dtype)
    options = dict(options)
    if options.get("alibi") == "h":
        options["alibi"] = torch.rand(hq)
    rng_state = torch.tensor([seed, offset], dtype=torch.int64)

    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    with poisoned_outputs():
        out, lse, rng_out, probs = _fwd(ql, kl, vl, p, rng_state, **options)
        out.backward(dout.to(device))
    assert torch.equal(rng_out.cpu(), rng_state), "the rng_state passed in must be returned"

    keep = torch.from_numpy(dropout_keep_mask(seed, offset, p, hq, sq, sk, batch=B))
    ref_opts = dict(causal=options.get("causal", False), window_size=options.get("window", (-1, -1)),
                    softcap=options.get("softcap", 0.0), alibi_slopes=options.get("alibi"))
    ref_out, ref_lse, dq, dk, dv = attention_ref_grads(q, k, v, dout, dropout_p=p, keep_mask=keep,
                                                       **ref_opts)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    # The LSE is that of the undropped scores.
    assert_lse_close(lse, ref_lse, LSE_TOL[dtype])
    for name, got, ref in (("dq", ql.grad, dq), ("dk", kl.grad, dk), ("dv", vl.grad, dv)):
        assert_close(got, ref, GRAD_TOL[dtype], name)

    off_left, off_right = ref_opts["window_size"]
    visible = visible_mask(sq, sk, off_left, 0 if ref_opts["causal"] else off_right)
    visible = visible.expand(B, hq, sq, sk)
    _check_probs(probs, keep, softmax_probs_ref(q, k, **ref_opts), visible, dtype)


@pytest.mark.parametrize("seed,offset", RNG_STATES[1:], ids=["offset_hi", "seed_neg"])
def test_exact_mask_varlen(device, seed, offset):
    # Varlen: sequence b uses b as its batch coordinate and its own lengths (after
    # seqused_k), so the mask of a sequence does not depend on its neighbours.
    dtype, hq, hk, D, p = torch.float16, 4, 2, 32, 0.25
    lens_q, lens_k, used = [20, 0, 33, 7], [25, 8, 40, 0], [25, 8, 17, 0]
    cu_q = torch.tensor([0, 20, 20, 53, 60], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 33, 73, 73], dtype=torch.int32)
    seqused = torch.tensor(used, dtype=torch.int32)
    max_q, max_k = max(lens_q), max(lens_k)
    q, k, v = randn(60, hq, D, dtype=dtype), randn(73, hk, D, dtype=dtype), randn(73, hk, D, dtype=dtype)
    dout = randn(60, hq, D, dtype=dtype)
    rng_state = torch.tensor([seed, offset], dtype=torch.int64)

    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    with poisoned_outputs():
        out, lse, _, probs = _fwd(ql, kl, vl, p, rng_state, causal=True, cu_q=cu_q, cu_k=cu_k,
                                  seqused=seqused, max_q=max_q, max_k=max_k)
        out.backward(dout.to(device))

    keep = torch.from_numpy(dropout_keep_mask_varlen(seed, offset, p, hq, lens_q, used, max_q, max_k))
    ref_out, ref_lse, dq, dk, dv = attention_ref_grads(
        q, k, v, dout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=seqused, causal=True,
        dropout_p=p, keep_mask=keep)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse, ref_lse, LSE_TOL[dtype])
    for name, got, ref in (("dq", ql.grad, dq), ("dk", kl.grad, dk), ("dv", vl.grad, dv)):
        assert_close(got, ref, GRAD_TOL[dtype], name)

    # probs: (B, Hq, max_seqlen_q, max_seqlen_k), zero past each sequence's own lengths.
    B = len(lens_q)
    visible = torch.zeros(B, hq, max_q, max_k, dtype=torch.bool)
    ref_probs = torch.zeros(B, hq, max_q, max_k, dtype=torch.float64)
    for b in range(B):
        sq, sk = lens_q[b], used[b]
        if sq == 0 or sk == 0:
            continue
        visible[b, :, :sq, :sk] = visible_mask(sq, sk, -1, 0)
        qb = q[int(cu_q[b]):int(cu_q[b + 1])][None]
        kb = k[int(cu_k[b]):int(cu_k[b]) + sk][None]
        ref_probs[b, :, :sq, :sk] = softmax_probs_ref(qb, kb, causal=True)[0]
    _check_probs(probs, keep, ref_probs, visible, dtype)


def test_flash_attn_func_attn_probs_exact(device):
    # flash_attn_func draws (seed, offset) from torch's generator as the op does with
    # rng_state=None: after the same torch.manual_seed both draw the same state, which the
    # op reports.  S_dmask's signs must then be that state's Philox mask, and out and the
    # gradients those of the reference under it.
    dtype, p, B, sq, sk, hq, hk = torch.float16, 0.2, 2, 40, 56, 4, 2
    q, k, v = (randn(B, sq, hq, 32, dtype=dtype), randn(B, sk, hk, 32, dtype=dtype),
               randn(B, sk, hk, 32, dtype=dtype))
    dout = randn(B, sq, hq, 32, dtype=dtype)
    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    torch.manual_seed(99)
    _, _, rng_state, _ = _fwd(ql.detach(), kl.detach(), vl.detach(), p, None, causal=True)
    torch.manual_seed(99)
    out, lse, s_dmask = fmha.flash_attn_func(ql, kl, vl, dropout_p=p, causal=True,
                                             return_attn_probs=True)
    out.backward(dout.to(device))

    seed, offset = rng_state.tolist()
    keep = torch.from_numpy(dropout_keep_mask(seed, offset, p, hq, sq, sk, batch=B))
    visible = visible_mask(sq, sk, -1, 0).expand(B, hq, sq, sk)
    _check_probs(s_dmask, keep, softmax_probs_ref(q, k, causal=True), visible, dtype, "S_dmask")
    ref_out, _, dq, dk, dv = attention_ref_grads(q, k, v, dout, causal=True, dropout_p=p,
                                                 keep_mask=keep)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    for name, got, ref in (("dq", ql.grad, dq), ("dk", kl.grad, dk), ("dv", vl.grad, dv)):
        assert_close(got, ref, GRAD_TOL[dtype], name)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.83])
def test_keep_rate_and_unbiased_mean(device, p):
    # Uniform attention (q = 0) over v = 1: each output is (kept keys / Sk) / (1 - p), whose
    # mean is 1.  Both the keep rate and that mean must be within 5 sigma.
    B, S, H, D = 2, 256, 4, 8
    q = torch.zeros(B, S, H, D, dtype=torch.float32, device=device)
    k = randn(B, S, H, D, dtype=torch.float32, device=device)
    v = torch.ones(B, S, H, D, dtype=torch.float32, device=device)
    out, _, s_dmask = fmha.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    n = s_dmask.numel()
    rate = (s_dmask > 0).double().mean().item()
    keep = keep_threshold(p) / 65536  # the realized keep probability (within 2^-17 of 1 - p)
    assert abs(keep - (1 - p)) <= 2**-17
    sigma = math.sqrt(keep * (1 - keep) / n)
    assert abs(rate - keep) < 5 * sigma, f"keep rate {rate:.5f}, expected {keep:.5f} +- {sigma:.1e}"
    rows = out.double().mean(-1)  # one value per (b, i, h): its D columns are equal
    mean_sigma = math.sqrt(keep * (1 - keep) / S) / (1 - p) / math.sqrt(rows.numel())
    assert abs(rows.mean().item() - keep / (1 - p)) < 5 * mean_sigma
    assert abs(rows.mean().item() - 1.0) < 5 * mean_sigma + 2**-16 / (1 - p)


def test_manual_seed_reproduces(device):
    dtype = torch.bfloat16
    q, k, v = (randn(2, 50, 2, 32, dtype=dtype) for _ in range(3))
    dout = randn(2, 50, 2, 32, dtype=dtype)

    def run():
        ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
        out = fmha.flash_attn_func(ql, kl, vl, dropout_p=0.3, causal=True)
        out.backward(dout.to(device))
        return [out.detach().cpu(), ql.grad.cpu(), kl.grad.cpu(), vl.grad.cpu()]

    torch.manual_seed(2024)
    first = run()
    torch.manual_seed(2024)
    second = run()
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, second):
        assert torch.equal(a, b), f"{name} differs after the same torch.manual_seed"

    # The op reports the state it drew, and that state regenerates its mask.
    torch.manual_seed(7)
    _, _, rng_state, probs = _fwd(q.to(device), k.to(device), v.to(device), 0.3, None)
    seed, offset = rng_state.tolist()
    keep = torch.from_numpy(dropout_keep_mask(seed, offset, 0.3, 2, 50, 50, batch=2))
    assert torch.equal(probs.cpu() > 0, keep)
    torch.manual_seed(7)
    _, _, rng_again, _ = _fwd(q.to(device), k.to(device), v.to(device), 0.3, None)
    assert torch.equal(rng_again, rng_state)


def test_unseeded_calls_differ(device):
    q, k, v = (randn(1, 64, 2, 32, dtype=torch.float16, device=device) for _ in range(3))
    a = fmha.flash_attn_func(q, k, v, dropout_p=0.5)
    b = fmha.flash_attn_func(q, k, v, dropout_p=0.5)
    assert not torch.equal(a, b), "two calls without a new seed must use fresh dropout masks"
    # ...and both differ from no dropout at all.
    c = fmha.flash_attn_func(q, k, v)
    assert not torch.equal(a, c) and not torch.equal(b, c)
