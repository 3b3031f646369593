"""The public surface: flash-attn 2.x signatures and return values, packed variants,
torch-compatible SDPA, bert_padding, available_backends."""

import inspect

import pytest
import torch
import torch.nn.functional as F

import fmha
from conftest import (GRAD_TOL, OUT_TOL, assert_close, check_forward, dtype_id, leaf, randn,
                      varlen_call)
from fmha.bert_padding import pad_input, unpad_input
from reference import torch_sdpa

# ----------------------------------------------------------------------------------------
# Signatures, written from docs/api.md (= flash-attn 2.x, plus keyword-only seqused_k and
# FlashAttention-3's serving keywords)
# ----------------------------------------------------------------------------------------

FA_KEYWORDS = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
               ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
               ("deterministic", False), ("return_attn_probs", False)]
REQUIRED = inspect.Parameter.empty
SINKS = [("s_aux", None), ("learnable_sink", None)]

# name -> (positional-or-keyword parameters with defaults, keyword-only parameters)
SIGNATURES = {
    "flash_attn_func": ([("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED)] + FA_KEYWORDS,
                        [("out", None)] + SINKS + [("q_descale", None), ("k_descale", None), ("v_descale", None)]),
    "flash_attn_qkvpacked_func": ([("qkv", REQUIRED)] + FA_KEYWORDS, SINKS),
    "flash_attn_kvpacked_func": ([("q", REQUIRED), ("kv", REQUIRED)] + FA_KEYWORDS, SINKS),
    "flash_attn_varlen_func": (
        # cu_seqlens_k and the max lengths default to None: a paged call (block_table) may omit
        # cu_seqlens_k and max_seqlen_k, as vLLM does; without block_table they are required.
        [(n, REQUIRED) for n in ("q", "k", "v", "cu_seqlens_q")]
        + [(n, None) for n in ("cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")] + FA_KEYWORDS
        + [("block_table", None)],
        [("seqused_k", None), ("out", None), ("return_softmax_lse", False), ("num_splits", 0),
         ("q_descale", None), ("k_descale", None), ("v_descale", None)] + SINKS
        + [("fa_version", None), ("scheduler_metadata", None)]),
    "flash_attn_varlen_qkvpacked_func": (
        [(n, REQUIRED) for n in ("qkv", "cu_seqlens", "max_seqlen")] + FA_KEYWORDS, SINKS),
    "flash_attn_varlen_kvpacked_func": (
        [(n, REQUIRED) for n in ("q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                 "max_seqlen_k")] + FA_KEYWORDS, SINKS),
    # torch.nn.functional.scaled_dot_product_attention's signature.
    "scaled_dot_product_attention": (
        [("query", REQUIRED), ("key", REQUIRED), ("value", REQUIRED), ("attn_mask", None),
         ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False)], []),
    # flash_attn.bert_padding (2.7+).
    "bert_padding.unpad_input": (
        [("hidden_states", REQUIRED), ("attention_mask", REQUIRED), ("unused_mask", None)], []),
    "bert_padding.pad_input": (
        [(n, REQUIRED) for n in ("hidden_states", "indices", "batch", "seqlen")], []),
}


def _resolve(name):
    obj = fmha
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature(name):
    positional, kwonly = SIGNATURES[name]
    params = list(inspect.signature(_resolve(name)).parameters.values())
    kinds = {p.name: p.kind for p in params}
    assert all(k in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
               for k in kinds.values()), f"{name}: no *args / **kwargs / positional-only: {kinds}"
    got_pos = [(p.name, p.default) for p in params
               if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    got_kw = [(p.name, p.default) for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert got_pos == positional, f"{name}: positional parameters differ from flash-attn/torch"
    assert got_kw == kwonly, f"{name}: keyword-only parameters differ from docs/api.md"


def test_names_exported_for_drop_in_use():
    # `import fmha as flash_attn` must offer what flash_attn does.
    for name in SIGNATURES:
        if "." not in name:
            assert name in fmha.__all__ and callable(getattr(fmha, name))


def test_available_backends():
    backends = fmha.available_backends()
    assert "cpu" in backends
    assert set(backends) <= {"cpu", "cuda", "hip"}


# ----------------------------------------------------------------------------------------
# Return values
# ----------------------------------------------------------------------------------------


def test_return_values_fixed(device):
    q, k, v = (randn(2, 9, 4, 16, device=device) for _ in range(3))
    out = fmha.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    assert out.device == q.device
    res = fmha.flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3
    out2, lse, s_dmask = res
    assert torch.equal(out2, out)
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32 and lse.device == q.device
    assert s_dmask.numel() == 0, "S_dmask is empty when dropout_p == 0, as in flash-attn"
    _, _, s_dmask = fmha.flash_attn_func(q, k[:, :7], v[:, :7], dropout_p=0.1, return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 9, 7) and s_dmask.dtype == q.dtype


def test_return_values_varlen(device):
    cu_q = torch.tensor([0, 3, 10], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 5, 6], dtype=torch.int32, device=device)
    q = randn(10, 4, 16, device=device)
    k, v = randn(6, 2, 16, device=device), randn(6, 2, 16, device=device)
    out = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 5)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    out2, lse, s_dmask = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 5,
                                                     return_attn_probs=True)
    assert torch.equal(out2, out)
    assert lse.shape == (4, 10) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0
    _, _, s_dmask = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 5, dropout_p=0.2,
                                                return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 7, 5)
    assert (s_dmask[0, :, 3:] == 0).all() and (s_dmask[1, :, :, 1:] == 0).all(), \
        "S_dmask is zero past each sequence's lengths"


def test_positional_arguments_follow_flash_attn_order(device):
    # flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, ...)
    q, k, v = (randn(1, 20, 2, 16, dtype=torch.float32, device=device) for _ in range(3))
    slopes = torch.rand(2, device=device)
    by_name = fmha.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, window_size=(4, -1),
                                   softcap=2.0, alibi_slopes=slopes)
    by_position = fmha.flash_attn_func(q, k, v, 0.0, 0.3, True, (4, -1), 2.0, slopes)
    assert torch.equal(by_name, by_position)
    assert not torch.equal(by_name, fmha.flash_attn_func(q, k, v))


@pytest.mark.parametrize("variant", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_packed_forward_equals_unpacked(device, variant):
    B, S, H, D = 2, 21, 4, 32
    hk = H if "qkvpacked" in variant else 2
    q = randn(B, S, H, D, device=device)
    k, v = randn(B, S, hk, D, device=device), randn(B, S, hk, D, device=device)
    opts = dict(causal=True, return_attn_probs=True)
    cu = torch.arange(0, B * S + 1, S, dtype=torch.int32, device=device)
    flat = lambda x: x.reshape(B * S, *x.shape[2:])  # noqa: E731
    if variant == "qkvpacked":
        got = fmha.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), **opts)
        want = fmha.flash_attn_func(q, k, v, **opts)
    elif variant == "kvpacked":
        got = fmha.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **opts)
        want = fmha.flash_attn_func(q, k, v, **opts)
    elif variant == "varlen_qkvpacked":
        qkv = torch.stack([flat(q), flat(k), flat(v)], 1)
        got = fmha.flash_attn_varlen_qkvpacked_func(qkv, cu, S, **opts)
        want = fmha.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, S, S, **opts)
    else:
        kv = torch.stack([flat(k), flat(v)], 1)
        got = fmha.flash_attn_varlen_kvpacked_func(flat(q), kv, cu, cu, S, S, **opts)
        want = fmha.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, S, S, **opts)
    for name, a, b in zip(("out", "lse"), got[:2], want[:2]):
        if device == "cpu":
            assert torch.equal(a, b), f"{variant}: {name} differs from the unpacked function"
        else:  # GPU kernels may pick another tile config by stride/alignment
            assert_close(a, b, OUT_TOL[q.dtype], name)


# ----------------------------------------------------------------------------------------
# SDPA: against torch's own function in float64 on the same rounded inputs
# ----------------------------------------------------------------------------------------

SDPA_CASES = {
    "plain": dict(shape_q=(2, 4, 33, 32), shape_k=(2, 4, 47, 32)),
    "causal-sq<sk": dict(shape_q=(2, 4, 33, 32), shape_k=(2, 4, 47, 32), is_causal=True),
    # Top-left: with Sq > Sk every row still sees key 0 (bottom-right would empty rows).
    "causal-sq>sk": dict(shape_q=(2, 4, 47, 32), shape_k=(2, 4, 33, 32), is_causal=True),
    "gqa": dict(shape_q=(2, 8, 30, 64), shape_k=(2, 2, 30, 64), is_causal=True, enable_gqa=True),
    "scale": dict(shape_q=(1, 2, 25, 16), shape_k=(1, 2, 40, 16), scale=0.61),
    "3d": dict(shape_q=(4, 19, 32), shape_k=(4, 23, 32), is_causal=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_matches_torch(device, case, dtype):
    c = dict(SDPA_CASES[case])
    shape_q, shape_k = c.pop("shape_q"), c.pop("shape_k")
    q, k, v = randn(*shape_q, dtype=dtype), randn(*shape_k, dtype=dtype), randn(*shape_k, dtype=dtype)
    dout = randn(*shape_q, dtype=dtype)
    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    out = fmha.scaled_dot_product_attention(ql, kl, vl, **c)
    out.backward(dout.to(device))
    refs = [leaf(t.double()) for t in (q, k, v)]
    want = torch_sdpa(*refs, **c)
    want.backward(dout.double())
    assert out.shape == want.shape and out.dtype == dtype
    assert_close(out, want, OUT_TOL[dtype], "out")
    for name, got, ref in zip(("dq", "dk", "dv"), (ql.grad, kl.grad, vl.grad), refs):
        assert_close(got, ref.grad, GRAD_TOL[dtype], name)


def test_sdpa_dropout(device):
    q, k, v = (randn(2, 2, 64, 32, device=device) for _ in range(3))
    a = fmha.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = fmha.scaled_dot_product_attention(q, k, v)
    assert a.shape == b.shape and torch.isfinite(a).all() and not torch.equal(a, b)


# ----------------------------------------------------------------------------------------
# bert_padding
# ----------------------------------------------------------------------------------------


def _mask(lengths, seqlen, device="cpu"):
    return torch.arange(seqlen, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


def test_unpad_pad_round_trip(device):
    B, S, H, D = 4, 13, 2, 8
    lengths = [13, 5, 0, 9]
    x = randn(B, S, H, D, dtype=torch.float32, device=device)
    mask = _mask(lengths, S, device)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    assert packed.shape == (sum(lengths), H, D)
    assert torch.equal(packed, x[mask])
    assert torch.equal(indices, torch.nonzero(mask.flatten()).flatten())
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 13, 18, 18, 27]
    assert isinstance(max_seqlen, int) and max_seqlen == 13
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths
    back = pad_input(packed, indices, B, S)
    assert torch.equal(back, x * mask[..., None, None])


def test_unpad_with_unused_mask(device):
    # unused_mask marks tokens that are packed (counted in cu_seqlens) but not attended
    # to: seqused counts only attention_mask's tokens.
    B, S = 3, 10
    x = randn(B, S, 4, dtype=torch.float32, device=device)
    used = _mask([4, 0, 7], S, device)
    unused = _mask([6, 3, 7], S, device) & ~used
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, used, unused)
    assert cu_seqlens.tolist() == [0, 6, 9, 16]
    assert seqused.tolist() == [4, 0, 7]
    assert max_seqlen == 7
    assert torch.equal(packed, x[used | unused])


def test_padding_gradients(device):
    B, S = 3, 11
    mask = _mask([11, 4, 7], S, device)
    x = leaf(randn(B, S, 2, 8, dtype=torch.float32, device=device))
    g = randn(B, S, 2, 8, dtype=torch.float32, device=device)
    packed, indices, *_ = unpad_input(x, mask)
    pad_input(packed * 3.0, indices, B, S).backward(g)
    assert torch.equal(x.grad, 3.0 * g * mask[..., None, None])


def test_unpadded_attention_end_to_end(device):
    # The bert_padding flow: unpad q/k/v, varlen attention, pad back; padded rows are 0.
    B, S, H, D = 3, 20, 2, 32
    mask = _mask([20, 6, 13], S)
    x = [randn(B, S, H, D) for _ in range(3)]
    (q, indices, cu, max_s, _), (k, *_), (v, *_) = (unpad_input(t, mask) for t in x)
    res = check_forward(device, q, k, v, varlen_call(cu, cu, max_s, max_s, causal=True),
                        dict(cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True))
    padded = pad_input(res["out"], indices, B, S)
    assert padded.shape == (B, S, H, D)
    assert (padded[~mask] == 0).all()


@pytest.mark.parametrize("name", ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                                  "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                                  "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
                                  "scaled_dot_product_attention", "quantize_kv_cache", "merge_attentions"])
def test_public_functions_are_annotated(name):
    import typing
    fn = getattr(fmha, name)
    hints = typing.get_type_hints(fn)
    missing = [p for p in inspect.signature(fn).parameters if p not in hints]
    assert not missing and "return" in hints, f"{name}: no type hints for {missing or ['return']}"
