"""Invalid input raises TypeError (dtype or type) or ValueError (everything else) before
any kernel runs, with a message that names the offending argument; and a process that has
seen every one of these errors still computes correctly."""

import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import fmha
from conftest import GPU_USABLE, randn

B, SQ, SK, HQ, HK, D = 2, 8, 10, 4, 2, 16


def _qkv(device, dtype=torch.float16):
    return (randn(B, SQ, HQ, D, dtype=dtype, device=device),
            randn(B, SK, HK, D, dtype=dtype, device=device),
            randn(B, SK, HK, D, dtype=dtype, device=device))


def _qkv_dim(device, d):
    """q, k, v with head dimension d."""
    return (randn(B, SQ, HQ, d, device=device), randn(B, SK, HK, d, device=device),
            randn(B, SK, HK, d, device=device))


def _fa(device, q=None, k=None, v=None, **kw):
    """flash_attn_func with the default inputs except those given."""
    dq, dk, dv = _qkv(device)
    return fmha.flash_attn_func(dq if q is None else q, dk if k is None else k,
                                dv if v is None else v, **kw)


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _varlen(device, cu_q=(0, 3, 8), cu_k=(0, 4, 10), max_q=5, max_k=6, total_q=8, total_k=10,
            grad=False, **kw):
    """flash_attn_varlen_func on 2 sequences (q lengths 3, 5; k lengths 4, 6) unless
    arguments replace them; cu_* may be tuples (made int32), tensors (used as given) or
    lists (passed as such); grad: q, k, v require grad."""
    q = randn(total_q, HQ, D, device=device).requires_grad_(grad)
    k, v = (randn(total_k, HK, D, device=device).requires_grad_(grad) for _ in range(2))
    cq = _i32(cu_q, device) if isinstance(cu_q, tuple) else cu_q
    ck = _i32(cu_k, device) if isinstance(cu_k, tuple) else cu_k
    return fmha.flash_attn_varlen_func(q, k, v, cq, ck, max_q, max_k, **kw)


def _sdpa(device, hq=4, hk=4, **kw):
    q = randn(B, hq, SQ, D, device=device)
    k, v = randn(B, hk, SK, D, device=device), randn(B, hk, SK, D, device=device)
    return fmha.scaled_dot_product_attention(q, k, v, **kw)


# name -> (exception, regex the message must match (it names the argument), call(device))
CASES = {
    # dtypes and types
    "q-int32": (TypeError, r"\bq\b", lambda d: _fa(d, q=_qkv(d)[0].int())),
    "q-float64-unsupported": (TypeError, r"\bq\b.*float64|float64.*\bq\b",
                              lambda d: _fa(d, *[t.double() for t in _qkv(d)])),
    "mixed-fp16-bf16": (TypeError, r"\bv\b", lambda d: _fa(d, v=_qkv(d)[2].bfloat16())),
    "k-fp32-with-fp16-q": (TypeError, r"\bk\b", lambda d: _fa(d, k=_qkv(d)[1].float())),
    "q-not-a-tensor": (TypeError, r"\bq\b", lambda d: _fa(d, q=[[1.0]])),
    "alibi-fp16": (TypeError, r"alibi_slopes",
                   lambda d: _fa(d, alibi_slopes=torch.rand(HQ, device=d).half())),
    "alibi-float64": (TypeError, r"alibi_slopes",
                      lambda d: _fa(d, alibi_slopes=torch.rand(HQ, device=d, dtype=torch.float64))),
    "cu_seqlens-int64": (TypeError, r"cu_seqlens_q",
                         lambda d: _varlen(d, cu_q=torch.tensor([0, 3, 8], device=d))),
    "seqused_k-int64": (TypeError, r"seqused_k",
                        lambda d: _varlen(d, seqused_k=torch.tensor([1, 1], device=d))),
    # the same checks on the autograd path (inputs that require grad)
    "cu_seqlens-list-with-grad": (TypeError, r"cu_seqlens_q", lambda d: _varlen(d, cu_q=[0, 3, 8], grad=True)),
    "alibi-fp16-with-grad": (TypeError, r"alibi_slopes",
                             lambda d: _varlen(d, grad=True, alibi_slopes=torch.rand(HQ, device=d).half())),
    # shapes
    "q-3d-fixed": (ValueError, r"\bq\b", lambda d: _fa(d, q=_qkv(d)[0][0])),
    "k-5d": (ValueError, r"\bk\b", lambda d: _fa(d, k=_qkv(d)[1][None])),
    "k-batch-mismatch": (ValueError, r"\bk\b", lambda d: _fa(d, k=randn(B + 1, SK, HK, D, device=d))),
    "v-shape-differs-from-k": (ValueError, r"\bv\b",
                               lambda d: _fa(d, v=randn(B, SK + 1, HK, D, device=d))),
    "k-head-dim-differs": (ValueError, r"head dim", lambda d: _fa(d, k=randn(B, SK, HK, 8, device=d),
                                                                  v=randn(B, SK, HK, 8, device=d))),
    "head-dim-0": (ValueError, r"head dim.*256", lambda d: _fa(d, *_qkv_dim(d, 0))),
    "head-dim-257": (ValueError, r"head dim.*256", lambda d: _fa(d, *_qkv_dim(d, 257))),
    "hq-not-multiple-of-hk": (ValueError, r"heads", lambda d: _fa(d, q=randn(B, SQ, 3, D, device=d))),
    "qkvpacked-wrong-shape": (ValueError, r"qkv",
                              lambda d: fmha.flash_attn_qkvpacked_func(randn(B, SQ, 2, HQ, D, device=d))),
    "kvpacked-wrong-shape": (ValueError, r"kv", lambda d: fmha.flash_attn_kvpacked_func(
        _qkv(d)[0], randn(B, SK, 3, HK, D, device=d))),
    # options
    "window-left-below-minus-1": (ValueError, r"window_size", lambda d: _fa(d, window_size=(-2, 0))),
    "window-right-below-minus-1": (ValueError, r"window_size", lambda d: _fa(d, window_size=(3, -5))),
    "window-three-values": (TypeError, r"window_size", lambda d: _fa(d, window_size=(3, 0, 1))),
    "window-float": (TypeError, r"window_size", lambda d: _fa(d, window_size=(3.0, 0))),
    "window-float-tensor": (TypeError, r"window_size", lambda d: _fa(d, window_size=torch.tensor([3.0, 0.0]))),
    "window-not-a-pair": (TypeError, r"window_size", lambda d: _fa(d, window_size=5)),
    "dropout-negative": (ValueError, r"dropout_p", lambda d: _fa(d, dropout_p=-0.1)),
    "dropout-one": (ValueError, r"dropout_p", lambda d: _fa(d, dropout_p=1.0)),
    "softcap-negative": (ValueError, r"softcap", lambda d: _fa(d, softcap=-1.0)),
    "alibi-wrong-heads": (ValueError, r"alibi_slopes",
                          lambda d: _fa(d, alibi_slopes=torch.rand(HQ + 1, device=d))),
    "alibi-wrong-batch": (ValueError, r"alibi_slopes",
                          lambda d: _fa(d, alibi_slopes=torch.rand(B + 1, HQ, device=d))),
    # varlen metadata
    "varlen-q-4d": (ValueError, r"\bq\b", lambda d: fmha.flash_attn_varlen_func(
        *_qkv(d), _i32([0, 8], d), _i32([0, 10], d), 8, 10)),
    "cu_seqlens-2d": (ValueError, r"cu_seqlens_q", lambda d: _varlen(d, cu_q=_i32([[0, 3, 8]], d))),
    "cu_seqlens_k-length-differs": (ValueError, r"cu_seqlens_k", lambda d: _varlen(d, cu_k=(0, 10))),
    "cu_seqlens-decreasing": (ValueError, r"cu_seqlens_q", lambda d: _varlen(d, cu_q=(0, 6, 5))),
    "cu_seqlens-negative-start": (ValueError, r"cu_seqlens_k", lambda d: _varlen(d, cu_k=(-1, 4, 10))),
    "cu_seqlens_q-past-rows": (ValueError, r"cu_seqlens_q", lambda d: _varlen(d, cu_q=(0, 3, 9))),
    "cu_seqlens_k-past-rows": (ValueError, r"cu_seqlens_k", lambda d: _varlen(d, cu_k=(0, 4, 11), max_k=7)),
    "max_seqlen_q-too-small": (ValueError, r"max_seqlen_q", lambda d: _varlen(d, max_q=4)),
    "max_seqlen_k-too-small": (ValueError, r"max_seqlen_k", lambda d: _varlen(d, max_k=5)),
    "seqused_k-past-sequence": (ValueError, r"seqused_k", lambda d: _varlen(d, seqused_k=_i32([4, 7], d))),
    "seqused_k-negative": (ValueError, r"seqused_k", lambda d: _varlen(d, seqused_k=_i32([-1, 2], d))),
    "seqused_k-wrong-shape": (ValueError, r"seqused_k", lambda d: _varlen(d, seqused_k=_i32([1, 2, 3], d))),
    "block_table-given": (ValueError, r"block_table",
                          lambda d: _varlen(d, block_table=torch.zeros(2, 1, dtype=torch.int32, device=d))),
    "only-cu_seqlens_q": (ValueError, r"cu_seqlens_k", lambda d: torch.ops.fmha.fwd(
        *_qkv(d), _i32([0, 8], d), None, None, 8, 10, 0.25, 0.0, -1, -1, False, None, 0.0, False,
        False, None)),
    # SDPA
    "sdpa-attn_mask": (ValueError, r"attn_mask",
                       lambda d: _sdpa(d, attn_mask=torch.ones(SQ, SK, dtype=torch.bool, device=d))),
    "sdpa-heads-without-enable_gqa": (ValueError, r"enable_gqa", lambda d: _sdpa(d, hq=4, hk=2)),
    "sdpa-gqa-not-multiple": (ValueError, r"heads", lambda d: _sdpa(d, hq=6, hk=4, enable_gqa=True)),
    "sdpa-5d": (ValueError, r"query", lambda d: fmha.scaled_dot_product_attention(
        *(randn(1, B, HQ, SQ, D, device=d) for _ in range(3)))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_input_raises(device, case):
    exc, match, call = CASES[case]
    with pytest.raises(exc, match=match):
        call(device)


@pytest.mark.skipif(not GPU_USABLE, reason="needs a second device (a GPU fmha can use) besides the CPU")
@pytest.mark.parametrize("which", ["k", "v", "cu_seqlens", "alibi_slopes"])
def test_tensors_on_different_devices(which):
    q, k, v = _qkv("cuda")
    if which in ("k", "v"):
        args = dict(k=k.cpu()) if which == "k" else dict(v=v.cpu())
        with pytest.raises(ValueError, match=rf"\b{which}\b"):
            _fa("cuda", **args)
    elif which == "alibi_slopes":
        with pytest.raises(ValueError, match="alibi_slopes"):
            _fa("cuda", alibi_slopes=torch.rand(HQ))
    else:
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            _varlen("cuda", cu_q=_i32([0, 3, 8], "cpu"))


def test_process_survives_every_error():
    # In a child process: every invalid call above, then a valid one whose result must
    # match the reference.  A crash (abort, segfault) in any error path fails this test
    # instead of killing the test session.
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, {tests!r})
        import torch
        from test_errors import CASES, _qkv
        import fmha
        from reference import attention_ref
        for name, (exc, match, call) in CASES.items():
            try:
                call("cpu")
            except (TypeError, ValueError):
                pass
        q, k, v = _qkv("cpu", torch.float32)
        out = fmha.flash_attn_func(q, k, v, causal=True)
        ref, _ = attention_ref(q, k, v, causal=True)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, err
        print("survived")
    """).format(tests=str(pathlib.Path(__file__).parent))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip().splitlines()[-1] == "survived", proc.stdout
