"""The fp8 (e4m3) forward, FlashAttention-3's: float8_e4m3fn q, k, v with float32
q/k/v_descale factors (None, one value, or per (batch, kv head)), bfloat16 out, on sm_90.

* Everywhere (CI has no GPU): every refusal that the Python package makes before a kernel
  runs, each naming its argument (CPU tensors, mixed or e5m2 dtypes, bad descales, dropout,
  sinks, seqused_k, block_table, strides and alignment, out=, a device that is not sm_90),
  the fake implementation (torch.compile's view of the op), and that a call reaches the
  library through the bindings (descales and the workspace allocator included).
* On an sm_90 GPU (`test_cuda_*`): results against the float64 reference of the
  DEQUANTIZED inputs (tests/reference.py), LSE included, over head dims, sequence lengths,
  masks, softcap, ALiBi, GQA/MQA, varlen with empty sequences and both kinds of descale;
  NaN-filled outputs (out= and the allocations), rows that see no key exactly 0, finite
  results, determinism, torch.compile, CUDA graphs, and the backward refusal.
"""

import math

import pytest
import torch

import fmha
from fmha import _C, _checks, ops
from conftest import (GPU_USABLE, assert_lse_close, assert_zero_where, empty_query_rows, kernels_launched,
                      poison_memory, poisoned_outputs)
from reference import attention_ref

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0

# The fp8 kernels round P (the probabilities, in [0, 1]) to e4m3 before P.V: a relative error
# of up to 2^-4 per probability (3 mantissa bits, round to nearest), and small
# probabilities fall into e4m3's subnormals (absolute steps of 2^-9).  An output is a
# P-weighted mean of values, so its error is at most 2^-4 * max|v| = 0.0625 * max|v|;
# rows with few visible keys come nearest (two keys, p = 1 and 0.9: 0.9's rounding moves
# the mean by up to 0.016 * |v|), and over many keys the roundings average out, so the mean
# error is far smaller.  A CPU emulation of exactly that rounding (exact scores, fp32 row
# sums, P rounded to e4m3) gave at most 0.0148 * max|v| (mean 0.0013 * max|v|) over 84
# cases of these tests' shapes, both masks and both descale kinds: max_abs 0.025 leaves
# 1.7x for what the emulation leaves out (the tensor cores' reduced-precision fp32 sums of
# q.k and P.V, the bf16 output), mean_abs 0.004 about 3x.  The LSE sees only the q.k sums
# (about 1e-4 relative).  Inputs are compared after dequantization, so the inputs' own
# quantization costs nothing here.  Every case passes on an H200 with it
# (benchmarks/results/2026-12-04-h200-fp8-fwd/gpu_tests_fp8.txt).
FP8_TOL = dict(max_abs=0.025, mean_abs=0.004, abs_floor=1e-3, lse=1e-3)


def _hopper():
    return GPU_USABLE and not torch.version.hip and torch.cuda.get_device_capability(0) == (9, 0)


hopper = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 (Hopper) GPU and an fmha build with CUDA kernels")


# ----------------------------------------------------------------------------------------
# Inputs: float randn, quantized to e4m3 with descale = scale
# ----------------------------------------------------------------------------------------


def _row_sequence(cu, total):
    """Sequence index of each of `total` rows of a varlen tensor (-1: outside every sequence)."""
    seq = torch.full((total,), -1, dtype=torch.long)
    cu = [int(x) for x in cu]
    for b in range(len(cu) - 1):
        seq[cu[b]:cu[b + 1]] = b
    return seq


def _per_head(factor, heads, seq=None):
    """(B, Hk) factors broadcast to x's layout: (B, 1, H, 1) fixed, (T, H, 1) varlen rows."""
    f = factor.double().repeat_interleave(heads // factor.shape[1], dim=1)  # (B, H): head h -> h // group
    if seq is None:
        return f[:, None, :, None]
    rows = f[seq.clamp(min=0).to(f.device)]
    return torch.where((seq >= 0).to(f.device)[:, None], rows, torch.ones_like(rows))[..., None]


def quantize(x, mode, heads_k, cu=None):
    """(x8, descale) with x8 = (x / scale).to(e4m3) and descale = scale: per tensor (shape
    ()), per (batch or sequence, kv head) ((B, Hk); q's heads grouped as GQA reads them), or
    "none" (x cast as it is; descale None).  x: (B, S, H, D) or varlen (T, H, D) with cu."""
    if mode == "none":
        return x.to(FP8), None
    if mode == "tensor":
        scale = (x.abs().amax().float() / E4M3_MAX).clamp(min=1e-12)
        return (x / scale).to(FP8), scale
    heads = x.shape[-2]
    g = heads // heads_k
    if cu is None:
        amax = x.abs().unflatten(2, (heads_k, g)).amax(dim=(1, 3, 4))  # (B, Hk)
    else:
        seq = _row_sequence(cu, x.shape[0]).to(x.device)
        amax = torch.stack([x[seq == b].abs().unflatten(1, (heads_k, g)).amax(dim=(0, 2, 3))
                            if (seq == b).any() else x.new_ones(heads_k) for b in range(len(cu) - 1)])
    scale = (amax.float() / E4M3_MAX).clamp(min=1e-12)
    return (x / _per_head(scale, heads, None if cu is None else _row_sequence(cu, x.shape[0])).to(x.dtype)).to(FP8), scale


def dequantize(x8, descale, cu=None):
    x = x8.double()
    if descale is None:
        return x
    if descale.numel() == 1:
        return x * descale.double().reshape(())
    return x * _per_head(descale, x.shape[-2], None if cu is None else _row_sequence(cu, x.shape[0]))


def _amplitudes(shape, device):
    """x ~ N(0, 1) times a factor per (batch or row, head) in [1/2, 2]: descales that differ
    from head to head."""
    amp = 2.0 ** (torch.rand(shape[0], *([1] * (len(shape) - 3)), shape[-2], 1) * 2 - 1)
    return (torch.randn(*shape) * amp).to(device)


def fp8_inputs(b, sq, sk, hq, hk, d, mode="head", device="cuda", cu_q=None, cu_k=None):
    """q8, k8, v8 and their descales (float32 on device)."""
    if cu_q is None:
        shapes = ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d))
        cus = (None, None, None)
    else:
        shapes = ((int(cu_q[-1]), hq, d), (int(cu_k[-1]), hk, d), (int(cu_k[-1]), hk, d))
        cus = (cu_q, cu_k, cu_k)
    out = []
    for shape, cu in zip(shapes, cus):
        x8, ds = quantize(_amplitudes(shape, device), mode, hk, cu)
        out.append((x8, None if ds is None else ds.to(device)))
    (q8, qd), (k8, kd), (v8, vd) = out
    return q8, k8, v8, qd, kd, vd


def check_fp8(out, lse, q8, k8, v8, descales, cu_q=None, cu_k=None, **ref_kwargs):
    """out (bfloat16) and lse against the float64 reference of the dequantized inputs (on
    the GPU: the long sequences' reference is S x S per head), with FP8_TOL; rows that see
    no key exactly 0; nothing non-finite."""
    qd, kd, vd = descales
    q, k, v = dequantize(q8, qd, cu_q), dequantize(k8, kd, cu_k), dequantize(v8, vd, cu_k)
    if cu_q is not None:
        ref_kwargs.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ref_out, ref_lse = attention_ref(q, k, v, **ref_kwargs)
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    assert torch.isfinite(out).all(), f"out has {(~torch.isfinite(out)).sum().item()} non-finite values"
    vmax = v.abs().max().item() if v.numel() else 0.0
    err = (out.double() - ref_out).abs()
    if err.numel():
        max_err, mean_err = err.max().item(), err.mean().item()
        assert max_err <= FP8_TOL["max_abs"] * vmax + FP8_TOL["abs_floor"], (
            f"max |out - ref| = {max_err:.3g} > {FP8_TOL['max_abs']} * max|v| ({vmax:.3g}) + {FP8_TOL['abs_floor']}")
        assert mean_err <= FP8_TOL["mean_abs"] * vmax + 1e-6, (
            f"mean |out - ref| = {mean_err:.3g} > {FP8_TOL['mean_abs']} * max|v| ({vmax:.3g})")
    assert_lse_close(lse, ref_lse, FP8_TOL["lse"])
    assert_zero_where(out, empty_query_rows(ref_lse.cpu(), cu_q is not None).to(out.device), "out of rows that see no key")
    return ref_out, ref_lse


# ----------------------------------------------------------------------------------------
# Refusals (no GPU needed): each names the argument
# ----------------------------------------------------------------------------------------

B, SQ, SK, HQ, HK, D = 2, 24, 40, 4, 2, 64


def _cpu_fp8(d=D, hq=HQ, hk=HK):
    return (torch.randn(B, SQ, hq, d).to(FP8), torch.randn(B, SK, hk, d).to(FP8), torch.randn(B, SK, hk, d).to(FP8))


def _cpu_varlen():
    q, k, v = (torch.randn(n, h, D).to(FP8) for n, h in ((30, HQ), (50, HK), (50, HK)))
    return q, k, v, torch.tensor([0, 10, 30], dtype=torch.int32), torch.tensor([0, 20, 50], dtype=torch.int32)


CPU_ERROR = "fp8 attention runs on CUDA GPUs with sm_90 \\(Hopper\\)"


def test_cpu_tensors_are_refused():
    q, k, v = _cpu_fp8()
    with pytest.raises(ValueError, match=CPU_ERROR):
        fmha.flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match=CPU_ERROR):
        fmha.flash_attn_func(q, k, v, causal=True, q_descale=torch.ones(()), k_descale=torch.ones(B, HK),
                             v_descale=torch.ones(1), return_attn_probs=True)
    vq, vk, vv, cu_q, cu_k = _cpu_varlen()
    with pytest.raises(ValueError, match=CPU_ERROR):
        fmha.flash_attn_varlen_func(vq, vk, vv, cu_q, cu_k, 20, 30)
    with pytest.raises(ValueError, match=CPU_ERROR):
        torch.ops.fmha.fwd_fp8(q, k, v, None, None, SQ, SK, 0.125, 0.0, -1, -1, False, None, None, None, None)
    qkv = torch.randn(B, SQ, 3, HQ, D).to(FP8)
    with pytest.raises(ValueError, match=CPU_ERROR):
        fmha.flash_attn_qkvpacked_func(qkv)


@pytest.mark.parametrize("odd", ["q", "k", "v"])
@pytest.mark.parametrize("other", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_mixed_dtypes_are_refused(odd, other):
    q, k, v = _cpu_fp8()
    args = {"q": q, "k": k, "v": v}
    args[odd] = args[odd].to(other)
    with pytest.raises(TypeError, match="q, k and v must all be torch.float8_e4m3fn"):
        fmha.flash_attn_func(**args)
    # One fp8 tensor among 16-bit ones names fp8 too (not "must share a dtype").
    rest = {n: x.to(other) for n, x in (("q", q), ("k", k), ("v", v))}
    rest[odd] = args[odd].to(FP8) if args[odd].dtype != FP8 else args[odd]
    with pytest.raises(TypeError, match="q, k and v must all be torch.float8_e4m3fn"):
        fmha.flash_attn_func(**rest)


@pytest.mark.parametrize("which", ["q", "k", "all"])
def test_e5m2_is_refused(which):
    q, k, v = _cpu_fp8()
    if which == "all":
        q, k, v = (x.to(torch.float8_e5m2) for x in (q, k, v))
    elif which == "q":
        q = q.to(torch.float8_e5m2)
    else:
        k = k.to(torch.float8_e5m2)
    with pytest.raises(TypeError, match=r"float8_e5m2: fp8 attention takes torch.float8_e4m3fn \(e4m3\) inputs only"):
        fmha.flash_attn_func(q, k, v)
    vq, vk, vv, cu_q, cu_k = _cpu_varlen()
    with pytest.raises(TypeError, match="e4m3"):
        fmha.flash_attn_varlen_func(vq, vk.to(torch.float8_e5m2), vv, cu_q, cu_k, 20, 30)


def _fixed_fp8(**kw):
    q, k, v = _cpu_fp8()
    return fmha.flash_attn_func(q, k, v, **kw)


def _varlen_fp8(**kw):
    q, k, v, cu_q, cu_k = _cpu_varlen()
    return fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 30, **kw)


def _misaligned_q():
    flat = torch.randn(B * SQ * HQ * D + 1).to(FP8)
    return flat[1:].view(B, SQ, HQ, D)


# name -> (exception, message regex, call): everything here is checked before the device.
FP8_ERRORS = {
    "q_descale dtype": (TypeError, "q_descale must be torch.float32",
                        lambda: _fixed_fp8(q_descale=torch.ones((), dtype=torch.float16))),
    "k_descale dtype": (TypeError, "k_descale must be torch.float32",
                        lambda: _fixed_fp8(k_descale=torch.ones(B, HK, dtype=torch.float64))),
    "v_descale shape": (ValueError, r"v_descale must be a scalar or have shape \(2, 2\) \(batch, nheads_k\)",
                        lambda: _fixed_fp8(v_descale=torch.ones(B, HQ))),
    "q_descale shape 1-D": (ValueError, r"q_descale must be a scalar or have shape \(2, 2\)",
                            lambda: _fixed_fp8(q_descale=torch.ones(HK))),
    "k_descale device": (ValueError, "k_descale is on meta but q is on cpu",
                         lambda: _fixed_fp8(k_descale=torch.ones((), device="meta"))),
    "k_descale not a tensor": (TypeError, "k_descale must be a torch.Tensor", lambda: _fixed_fp8(k_descale=1.0)),
    "varlen v_descale shape": (ValueError, r"v_descale must be a scalar or have shape \(2, 2\)",
                               lambda: _varlen_fp8(v_descale=torch.ones(3, HK))),
    "varlen q_descale dtype": (TypeError, "q_descale must be torch.float32",
                               lambda: _varlen_fp8(q_descale=torch.ones(B, HK).half())),
    "dropout": (ValueError, "dropout_p must be 0 with fp8 inputs", lambda: _fixed_fp8(dropout_p=0.1)),
    "varlen dropout": (ValueError, "dropout_p must be 0 with fp8 inputs", lambda: _varlen_fp8(dropout_p=0.5)),
    "s_aux": (ValueError, r"s_aux \(attention sinks\) is not supported with fp8",
              lambda: _fixed_fp8(s_aux=torch.zeros(HQ))),
    "learnable_sink": (ValueError, r"learnable_sink \(attention sinks\) is not supported with fp8",
                       lambda: _varlen_fp8(learnable_sink=torch.zeros(HQ))),
    "seqused_k": (ValueError, "seqused_k is not supported with fp8",
                  lambda: _varlen_fp8(seqused_k=torch.tensor([5, 7], dtype=torch.int32))),
    "block_table": (ValueError, r"block_table \(a paged KV cache\) is not supported with fp8 q",
                    lambda: fmha.flash_attn_varlen_func(
                        torch.randn(30, HQ, D).to(FP8), torch.randn(4, 16, HK, D).to(FP8),
                        torch.randn(4, 16, HK, D).to(FP8), torch.tensor([0, 10, 30], dtype=torch.int32), None, 20,
                        block_table=torch.zeros(2, 2, dtype=torch.int32),
                        seqused_k=torch.tensor([5, 7], dtype=torch.int32))),
    "q head stride": (ValueError, r"q has stride 72 in dimension 2 .* multiple of 16 elements",
                      lambda: fmha.flash_attn_func(_cpu_fp8(d=72)[0][..., :64], *_cpu_fp8()[1:])),
    "k row stride": (ValueError, r"k has stride 72 in dimension 1",
                     lambda: fmha.flash_attn_func(_cpu_fp8()[0], *(torch.randn(B, SK, 1, 72).to(FP8)[..., :64]
                                                                   for _ in range(2)))),
    "v batch stride": (ValueError, r"v has stride 5128 in dimension 0",
                       lambda: fmha.flash_attn_func(*_cpu_fp8()[:2], torch.randn(B * SK * HK * D + 8).to(FP8).as_strided(
                           (B, SK, HK, D), (SK * HK * D + 8, HK * D, D, 1)))),
    "q misaligned": (ValueError, "q's data is not 16-byte aligned",
                     lambda: fmha.flash_attn_func(_misaligned_q(), *_cpu_fp8()[1:])),
    "out dtype": (TypeError, r"out must be torch.bfloat16 \(the fp8 forward's output dtype\)",
                  lambda: _fixed_fp8(out=torch.empty(B, SQ, HQ, D, dtype=torch.float16))),
    "out shape": (ValueError, "out must have shape",
                  lambda: _fixed_fp8(out=torch.empty(B, SQ, HQ, D + 1, dtype=torch.bfloat16))),
    "v head dim": (ValueError, "v must have k's head dim 64 with fp8 inputs",
                   lambda: fmha.flash_attn_func(*_cpu_fp8()[:2], torch.randn(B, SK, HK, 32).to(FP8))),
    "heads": (ValueError, r"query heads \(4\) must be a positive multiple",
              lambda: fmha.flash_attn_func(*_cpu_fp8(hk=3))),
    "head dim": (ValueError, "head dimension .* between 1 and 256", lambda: fmha.flash_attn_func(*_cpu_fp8(d=272))),
    "op with bf16": (TypeError, "q must be torch.float8_e4m3fn for the fp8 forward",
                     lambda: torch.ops.fmha.fwd_fp8(*(torch.randn(1, 8, 2, 16, dtype=torch.bfloat16) for _ in range(3)),
                                                    None, None, 8, 8, 0.25, 0.0, -1, -1, False, None, None, None, None)),
}


@pytest.mark.parametrize("name", list(FP8_ERRORS))
def test_fp8_argument_errors(name):
    exc, match, call = FP8_ERRORS[name]
    with pytest.raises(exc, match=match):
        call()


def test_layouts_that_pass_the_checks():
    # Accepted (the CPU then refuses the device, the last check): head dims that are not a
    # multiple of 16 at any strides (they are zero-padded to one, a copy), contiguous or not
    # and misaligned; size-1 dimensions' strides, which address nothing.
    for q, k, v in ([x[..., :40] for x in _cpu_fp8(d=48)], _cpu_fp8(d=72), _cpu_fp8(d=1),
                    [_misaligned_q()[..., :40], *_cpu_fp8(d=40)[1:]],
                    [x[:, :, :, None, 16:32].squeeze(3) for x in _cpu_fp8(d=64)],
                    [torch.randn(1, 1, 1, 32).to(FP8).as_strided((1, 1, 1, 32), (3, 5, 7, 1)) for _ in range(3)]):
        with pytest.raises(ValueError, match=CPU_ERROR):
            fmha.flash_attn_func(q, k, v)


def test_descales_of_16bit_inputs_are_checked_and_unused():
    # As FlashAttention-3 (and flash_attn_varlen_func already): float16/bfloat16/float32
    # inputs ignore valid descales, and bad ones raise the same errors as with fp8.
    q, k, v = (x.to(torch.bfloat16) for x in (torch.randn(B, SQ, HQ, D), torch.randn(B, SK, HK, D),
                                               torch.randn(B, SK, HK, D)))
    want = fmha.flash_attn_func(q, k, v, causal=True)
    for ds in (torch.full((), 3.0), torch.rand(B, HK), torch.ones(1).expand(B, HK)):
        got = fmha.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds, v_descale=ds)
        assert torch.equal(got, want)
    with pytest.raises(TypeError, match="v_descale must be torch.float32"):
        fmha.flash_attn_func(q, k, v, v_descale=torch.ones((), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"q_descale must be a scalar or have shape \(2, 2\)"):
        fmha.flash_attn_func(q, k, v, q_descale=torch.ones(B, HQ))


def test_fp8_device_needs_sm90(monkeypatch):
    # fp8_device is what a CUDA tensor meets first in the op; the capability is faked here.
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    for cap in ((8, 0), (8, 9), (10, 0), (12, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        with pytest.raises(ValueError, match=rf"sm_90 \(Hopper\); q is on cuda:0, .* compute capability {cap[0]}\.{cap[1]}"):
            ops.fp8_device(dev)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ops.fp8_device(dev)  # accepted
    with pytest.raises(ValueError, match=CPU_ERROR + "; q, k and v are on cpu"):
        ops.fp8_device(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    with pytest.raises(ValueError, match="a ROCm GPU"):
        ops.fp8_device(dev)


def test_fake_implementation():
    # torch.compile traces the op through its fake implementation: shapes and dtypes on
    # fake CUDA tensors (no GPU needed), the layout checks included.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(B, SQ, HQ, 80, dtype=FP8, device="cuda")
        k = torch.empty(B, SK, HK, 80, dtype=FP8, device="cuda")
        ds = torch.empty(B, HK, device="cuda")
        one = torch.empty((), device="cuda")
        out, lse, s = fmha.flash_attn_func(q, k, k, causal=True, q_descale=ds, k_descale=ds, v_descale=one,
                                           return_attn_probs=True)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        assert lse.shape == (B, HQ, SQ) and lse.dtype == torch.float32 and s.numel() == 0
        vq, vk = torch.empty(30, HQ, 64, dtype=FP8, device="cuda"), torch.empty(50, HK, 64, dtype=FP8, device="cuda")
        cu = torch.empty(3, dtype=torch.int32, device="cuda")
        out, lse = fmha.flash_attn_varlen_func(vq, vk, vk, cu, cu, 20, 30, return_softmax_lse=True)
        assert out.shape == vq.shape and out.dtype == torch.bfloat16 and lse.shape == (HQ, 30)
        bad = torch.empty_strided((B, SQ, HQ, 64), (SQ * HQ * 72, HQ * 72, 72, 1), dtype=FP8, device="cuda")
        with pytest.raises(ValueError, match="q has stride 72"):
            fmha.flash_attn_func(bad, *(torch.empty(B, SQ, HQ, 64, dtype=FP8, device="cuda") for _ in range(2)))
        out = fmha.flash_attn_func(*(torch.empty(B, SQ, HQ, 72, dtype=FP8, device="cuda") for _ in range(3)))
        assert out.shape == (B, SQ, HQ, 72) and out.dtype == torch.bfloat16  # padded for the kernels, sliced back


def test_call_reaches_the_library(monkeypatch):
    # With the device checks out of the way, a CPU call goes through the bindings (views,
    # descale triples, the workspace allocator) to libfmha, whose CPU backend answers
    # NOT_SUPPORTED (RuntimeError; the package's own refusals are ValueError).
    monkeypatch.setattr(ops, "_fp8_on_cuda", lambda device: None)
    monkeypatch.setattr(ops, "fp8_device", lambda device: None)
    q, k, v = _cpu_fp8()
    with pytest.raises(RuntimeError, match="fp8"):
        fmha.flash_attn_func(q, k, v, causal=True, q_descale=torch.full((), 0.5), k_descale=torch.rand(B, HK),
                             v_descale=torch.rand(HK, B).t(), out=torch.empty(B, SQ, HQ, D, dtype=torch.bfloat16))
    vq, vk, vv, cu_q, cu_k = _cpu_varlen()
    with pytest.raises(RuntimeError, match="fp8"):
        fmha.flash_attn_varlen_func(vq, vk, vv, cu_q, cu_k, 20, 30, k_descale=torch.ones(B, HK))


def test_forward_workspace_binding():
    # _C.fwd's alloc: asked for fmha_fwd_workspace_size() bytes, never for a 16-bit forward
    # (0 bytes), whose result is unchanged.
    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    d = _checks.Dims(1, 8, 8, 8, 8, 2, 2, 16, False)
    problem = ops._problem(d, q.dtype, None, None, None, 0.25, 0.0, -1, -1, False, None, 0.0, None)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 8)
    asked = []
    view = fmha._backend.view
    _C.fwd(_C.Device.cpu, 0, problem, view(q, False), view(q, False), view(q, False), view(out, False),
           lse.data_ptr(), None, alloc=lambda n: asked.append(n) or torch.empty(n, dtype=torch.uint8))
    assert asked == []
    assert torch.equal(out, fmha.flash_attn_func(q, q, q, softmax_scale=0.25))


def test_bench_suite_without_hopper(tmp_path):
    # python -m fmha.bench --suites fp8 off an sm_90 GPU: a note, no rows, exit 0.
    import json
    from fmha.bench import __main__ as bench

    out = tmp_path / "bench"
    assert bench.main(["--device", "cpu", "--quick", "--suites", "fp8", "--budget", "0.01", "--out", str(out)]) == 0
    payload = json.loads((out / "results.json").read_text())
    assert not [r for r in payload["results"] if r["suite"] == "fp8"]
    assert any("fp8 suite skipped" in n and "sm_90" in n for n in payload["meta"]["notes"])


def test_bench_fp8_tables():
    # The fp8 rows' tables: fp8 TFLOP/s and each peer's time over the fp8 time.
    from fmha.bench import fp8 as bench_fp8

    row = {"suite": "fp8", "mode": "fwd", "case": "B=4 S=4096 H=16 D=128 causal", "ms": {"fmha-fp8": 1.0, "fmha": 1.5},
           "tflops": {"fmha-fp8": 600.0, "fmha": 400.0}, "skipped": {"torch-cudnn": "no cuDNN"}, "fp8_vs_bf16": 1.5}
    payload = {"meta": {}, "results": [row, {"suite": "training"}]}
    md = bench_fp8.markdown(payload)
    assert "fmha-fp8 TFLOP/s" in md and "fp8 vs fmha" in md and "| 600 | 400 | - | 1.50x | - |" in md
    term = bench_fp8.terminal(payload)
    assert "1.50x" in term and "torch-cudnn: no cuDNN" in term
    assert bench_fp8.markdown({"meta": {}, "results": []}) == ""
    assert [c.seqlen for c in bench_fp8.cases(quick=False) if c.head_dim == 256 and not c.causal] == [
        1024, 2048, 4096, 8192, 16384]
    assert all(c.batch * c.seqlen == 16384 for c in bench_fp8.cases(quick=False))


# ----------------------------------------------------------------------------------------
# Results on an sm_90 GPU
# ----------------------------------------------------------------------------------------


def _run(q8, k8, v8, qd, kd, vd, **kw):
    out, lse, s = fmha.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                       return_attn_probs=True, **kw)
    assert s.numel() == 0
    return out, lse


SEQLENS = [(1, 1), (17, 17), (127, 127), (128, 128), (129, 129), (1000, 1000), (4096, 4096),
           (1, 1000), (17, 129), (129, 17), (127, 4096), (1000, 128), (4096, 1000)]


@hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
def test_cuda_fp8_seqlens(sq, sk, causal):
    b = 2 if sq * sk <= 1 << 20 else 1
    q8, k8, v8, qd, kd, vd = fp8_inputs(b, sq, sk, 8, 2, 128, "head")
    out, lse = _run(q8, k8, v8, qd, kd, vd, causal=causal)
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), causal=causal)


# The tile by the keys a tile sees (seqlen_k, half of it under a mask; FwdSm90Fp8Tile's
# kLongKeys and kNLong): 256-key blocks from 1024 at D = 64 (1100 % 256 = 76 live keys in
# the last block), 192-key blocks from 4096 at D = 128 (4200 % 192 = 168), 128 below, with
# and without softcap (the score-mod instance), and under a window (masked: twice the keys).
FP8_TILES = {"d64": (64, {}, 1100, "64, 128, 256"), "d64_softcap": (64, dict(softcap=20.0), 1100, "64, 128, 256"),
             "d64_short": (64, {}, 1000, "64, 128, 128"), "d128": (128, {}, 4200, "128, 128, 192"),
             "d128_softcap": (128, dict(softcap=20.0), 4200, "128, 128, 192"),
             "d128_window": (128, dict(window_size=(3000, 500)), 4200, "128, 128, 192"),
             "d128_short": (128, {}, 4000, "128, 128, 128")}


@hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(FP8_TILES))
def test_cuda_fp8_long_tiles(causal, case):
    d, kw, keys, tile = FP8_TILES[case]
    if causal and "window_size" in kw:
        kw = dict(window_size=(kw["window_size"][0], 0))
    sk = 2 * keys if causal or "window_size" in kw else keys
    q8, k8, v8, qd, kd, vd = fp8_inputs(1, 300, sk, 4, 2, d, "head")
    (out, lse), names = kernels_launched(lambda: _run(q8, k8, v8, qd, kd, vd, causal=causal, **kw))
    assert any("fwd_sm90_kernel" in n and "__nv_fp8_e4m3, " + tile in n for n in names), sorted(names)
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), causal=causal, **kw)


HEAD_DIMS = [40, 64, 72, 80, 96, 128, 192, 256]


@hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(129, 1000), (1000, 129)], ids=["129x1000", "1000x129"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_cuda_fp8_head_dims(d, sq, sk, causal):
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, sq, sk, 4, 2, d, "tensor")
    if d == 40:  # a [..., :d] view of a wider allocation (72: contiguous); both are padded for the kernels
        q8, k8, v8 = (torch.nn.functional.pad(x.view(torch.uint8), (0, 24)).view(FP8)[..., :d] for x in (q8, k8, v8))
    out, lse = _run(q8, k8, v8, qd, kd, vd, causal=causal)
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), causal=causal)


FEATURES = {
    "window": dict(window_size=(64, 0)),
    "window_both": dict(window_size=(32, 48)),
    "window_causal_left": dict(window_size=(100, -1), causal=True),
    "softcap": dict(softcap=5.0),
    "softcap_causal": dict(softcap=30.0, causal=True),
    "alibi": dict(alibi=(8,)),
    "alibi_batch_causal": dict(alibi=(2, 8), causal=True),
    "scale": dict(softmax_scale=0.3),
    "everything": dict(window_size=(200, 10), softcap=20.0, alibi=(8,)),
}


@hopper
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_cuda_fp8_features(feature, d):
    kw = dict(FEATURES[feature])
    if "alibi" in kw:
        kw["alibi_slopes"] = torch.rand(kw.pop("alibi"), device="cuda") * 0.3
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 333, 517, 8, 2, d, "head")
    out, lse = _run(q8, k8, v8, qd, kd, vd, **kw)
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), **kw)


@hopper
@pytest.mark.parametrize("mode", ["none", "tensor", "head"])
@pytest.mark.parametrize("hq,hk", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
def test_cuda_fp8_heads_and_descales(hq, hk, mode):
    q8, k8, v8, qd, kd, vd = fp8_inputs(3, 200, 300, hq, hk, 128, mode)
    out, lse = _run(q8, k8, v8, qd, kd, vd, causal=True)
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), causal=True)


@hopper
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cuda_fp8_scale_signs(d):
    # The scores' factor is softmax_scale x q_descale x k_descale, per (batch, kv head),
    # whatever its sign: where it is positive the kernels fold it into the exp2s, elsewhere
    # (negative, zero) they scale the scores first; at D = 256 the two are separate copies
    # of the key loop, picked per tile.  One call mixes all three signs across its tiles.
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 300, 517, 8, 2, d, "head")
    qd = qd * torch.tensor([[1.0, -1.0], [0.0, 1.0]], device="cuda")
    for kw in (dict(), dict(causal=True), dict(softmax_scale=-0.05)):
        out, lse = _run(q8, k8, v8, qd, kd, vd, **kw)
        check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), **kw)


@hopper
def test_cuda_fp8_descale_forms_agree():
    # One scale as (), (1,), (B, Hk) expanded (zero strides) and (B, Hk) with a layout of its
    # own (a transposed view) give bitwise the same result; descales are applied, not ignored.
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 300, 300, 8, 2, 128, "tensor")
    want = _run(q8, k8, v8, qd, kd, vd, causal=True)
    for form in (lambda s: s.reshape(1), lambda s: s.reshape(1, 1).expand(2, 2),
                 lambda s: s.reshape(1, 1).repeat(2, 2).t().contiguous().t()):
        got = _run(q8, k8, v8, form(qd), form(kd), form(vd), causal=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    per_head = torch.rand(2, 2, device="cuda") + 0.5
    a = _run(q8, k8, v8, per_head, kd, vd)[0]
    b = _run(q8, k8, v8, per_head.t().contiguous().t(), kd, vd)[0]
    assert torch.equal(a, b)
    assert not torch.equal(_run(q8, k8, v8, None, None, None)[0], _run(q8, k8, v8, qd, kd, None)[0])
    check_fp8(*_run(q8, k8, v8, per_head, kd, vd), q8, k8, v8, (per_head, kd, vd))


@hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["tensor", "head"])
@pytest.mark.parametrize("keys", ["short", "long"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cuda_fp8_varlen(d, keys, mode, causal):
    # Sequences of q and k lengths with an empty one on each side (no queries; no keys: its
    # rows are 0 with LSE -inf), lengths around the tile sizes, and more queries than keys;
    # "long": a max_seqlen_k that takes the long tiles (FwdSm90Fp8Tile: D = 64 both ways,
    # D = 128 without the mask) for every sequence of the batch.
    lens_q = [17, 0, 129, 1000, 5, 300]
    lens_k = [33, 7, 0, 1000, 128, 129] if keys == "short" else [33, 7, 0, 4300, 128, 2129]
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0).to(torch.int32)
    q8, k8, v8, qd, kd, vd = fp8_inputs(len(lens_q), 0, 0, 8, 2, d, mode, cu_q=cu_q, cu_k=cu_k)
    out = torch.full(q8.shape, math.nan, dtype=torch.bfloat16, device="cuda")
    got, lse = fmha.flash_attn_varlen_func(q8, k8, v8, cu_q.cuda(), cu_k.cuda(), max(lens_q), max(lens_k),
                                           causal=causal, q_descale=qd, k_descale=kd, v_descale=vd, out=out,
                                           return_softmax_lse=True)
    assert got is out
    check_fp8(out, lse, q8, k8, v8, (qd, kd, vd), cu_q=cu_q, cu_k=cu_k, causal=causal)


@hopper
def test_cuda_fp8_poisoned_outputs():
    # out= filled with NaN (written in the kernel), and every allocation of the op (out, LSE,
    # the workspace, all bits set) poisoned: bitwise what a plain call gives, twice.  Causal
    # with more queries than keys: the first rows see no key and must be exactly 0.
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 700, 300, 8, 2, 128, "head")
    want = _run(q8, k8, v8, qd, kd, vd, causal=True)
    check_fp8(*want, q8, k8, v8, (qd, kd, vd), causal=True)
    poison_memory(*want)
    out = torch.full(q8.shape, math.nan, dtype=torch.bfloat16, device="cuda")
    got = fmha.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, out=out)
    assert got is out and torch.equal(out, want[0])
    assert (out[:, :400] == 0).all()
    with poisoned_outputs():
        again = _run(q8, k8, v8, qd, kd, vd, causal=True)
    assert torch.equal(again[0], want[0]) and torch.equal(again[1], want[1])
    # An out= the kernel cannot address with 16-byte rows (an odd storage offset) is computed
    # into a buffer and copied.
    buf = torch.full((out.numel() + 1,), math.nan, dtype=torch.bfloat16, device="cuda")
    odd = buf[1:].view(out.shape)
    assert fmha.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, out=odd) is odd
    assert torch.equal(odd, want[0])


@hopper
def test_cuda_fp8_finite_at_the_range_limits():
    # Inputs at e4m3's largest magnitudes (+-448) with large descales: scores of about 1e7,
    # far beyond exp's range in fp32 before the row max is subtracted.  Results stay finite,
    # within the values' range (give or take P's rounding: e4m3 probabilities over an fp32
    # row sum may add up to 1 + 2^-4), and the LSE (the row max, robust to which of two nearly
    # equal scores wins) matches; the output itself is one-hot and so not compared (a near
    # tie, decided by the tensor cores' rounding, picks a different value row).
    sign = lambda *s: torch.randint(0, 2, s).float() * 2 - 1
    q8 = (sign(1, 256, 4, 128) * E4M3_MAX).to(FP8).cuda()
    k8 = (sign(1, 256, 4, 128) * E4M3_MAX * torch.rand(1, 256, 4, 1)).to(FP8).cuda()
    v8 = (sign(1, 256, 4, 128) * E4M3_MAX).to(FP8).cuda()
    big = torch.full((), 4.0, device="cuda")
    out, lse = _run(q8, k8, v8, big, big, big, causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert out.float().abs().max().item() <= 4.0 * E4M3_MAX * (1 + 2**-4) * (1 + 2**-8)
    ref_out, ref_lse = attention_ref(*(x.double() * 4.0 for x in (q8, k8, v8)), causal=True)
    assert_lse_close(lse, ref_lse, FP8_TOL["lse"])


@hopper
def test_cuda_fp8_packed_and_return_values():
    qkv = (torch.randn(2, 300, 3, 4, 64, device="cuda")).to(FP8)
    out, lse, s = fmha.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and lse.shape == (2, 4, 300) and s.numel() == 0
    q8, k8, v8 = qkv.unbind(2)
    check_fp8(out, lse, q8, k8, v8, (None, None, None), causal=True)
    assert torch.equal(fmha.flash_attn_func(q8, k8, v8, causal=True), out)


@hopper
def test_cuda_fp8_backward_raises():
    q8, k8, v8, qd, kd, vd = fp8_inputs(1, 64, 64, 2, 2, 64, "tensor")
    q = (q8.float() * 1.0).requires_grad_(True)
    q8g = q.to(FP8)  # requires grad through the cast
    out = fmha.flash_attn_func(q8g, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="fp8 attention is forward-only"):
        out.float().sum().backward()
    with torch.no_grad():
        assert not fmha.flash_attn_func(q8g, k8, v8).requires_grad


@hopper
def test_cuda_fp8_compile():
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 200, 300, 8, 2, 128, "head")

    def f(q, k, v, qd, kd, vd):
        return fmha.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q8, k8, v8, qd, kd, vd), f(q8, k8, v8, qd, kd, vd))


@hopper
def test_cuda_fp8_cuda_graph():
    # The workspace comes from torch's allocator, so a captured call replays on new data.
    q8, k8, v8, qd, kd, vd = fp8_inputs(2, 256, 384, 8, 2, 128, "head")
    static = [x.clone() for x in (q8, k8, v8, qd, kd, vd)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _run(*static, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = _run(*static, causal=True)
    fresh = fp8_inputs(2, 256, 384, 8, 2, 128, "head")
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    want = _run(*fresh, causal=True)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
