"""Shared fixtures and helpers of the fmha pytest suite.

* `device`: every numerical test takes it.  "cpu" always; "cuda" when torch sees a GPU and
  this build of fmha has GPU kernels (`fmha.available_backends()` has "cuda" or "hip").
  A GPU that fmha cannot use is a skip with the reason, or a failure with
  FMHA_REQUIRE_GPU=1 (for GPU CI, where a silently CPU-only build must not pass).
* FMHA_TEST_FULL=1 turns on the larger sweeps (`FULL`); the default suite is quick.
* Every test starts from a torch seed derived from its own id, so failures reproduce.
* Tolerances and the comparison helpers every test file uses.
"""

import math
import os
import zlib

import pytest
import torch

import fmha

from reference import attention_ref, attention_ref_grads

FULL = os.environ.get("FMHA_TEST_FULL") == "1"
REQUIRE_GPU = os.environ.get("FMHA_REQUIRE_GPU") == "1"

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dtype_id(dtype):
    return DTYPE_IDS[dtype]


# ----------------------------------------------------------------------------------------
# Devices
# ----------------------------------------------------------------------------------------


def _gpu_state():
    """(usable, reason): whether tests run on "cuda", and if not, why."""
    if not torch.cuda.is_available():
        return False, "torch sees no GPU"
    backends = fmha.available_backends()
    if {"cuda", "hip"} & set(backends):
        return True, ""
    return False, (f"torch sees a GPU ({torch.cuda.get_device_name(0)}) but this fmha build has no "
                   f"GPU kernels (available_backends() = {sorted(backends)}); rebuild fmha with "
                   f"nvcc / ROCm present")


GPU_USABLE, GPU_REASON = _gpu_state()


def pytest_configure(config):
    if REQUIRE_GPU and not GPU_USABLE:
        raise pytest.UsageError(f"FMHA_REQUIRE_GPU=1 but the GPU tests cannot run: {GPU_REASON}")


def _device_params():
    params = [pytest.param("cpu", id="cpu")]
    if GPU_USABLE:
        params.append(pytest.param("cuda", id="cuda"))
    elif torch.cuda.is_available():
        # A GPU fmha cannot use is worth a visible skip on every test, not silence.
        params.append(pytest.param("cuda", id="cuda", marks=pytest.mark.skip(reason=GPU_REASON)))
    return params


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", _device_params())


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    # A fixed seed per test id: inputs are fresh for every test, yet a failure reproduces.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def other_device_available():
    """A second device for the device-mismatch checks (the CPU plus a usable GPU)."""
    return GPU_USABLE


# ----------------------------------------------------------------------------------------
# Inputs and memory poison
# ----------------------------------------------------------------------------------------


def kernels_launched(fn, force_mma_sync=False):
    """Output of fn() and the names of the fmha CUDA kernels it launched, with
    FMHA_FORCE_MMA_SYNC set as asked (whatever the suite runs under)."""
    old = os.environ.get("FMHA_FORCE_MMA_SYNC")
    os.environ["FMHA_FORCE_MMA_SYNC"] = "1" if force_mma_sync else "0"
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
    finally:
        if old is None:
            del os.environ["FMHA_FORCE_MMA_SYNC"]
        else:
            os.environ["FMHA_FORCE_MMA_SYNC"] = old
    return out, {e.name for e in prof.events() if "fmha" in e.name}


def randn(*shape, dtype=torch.float16, device="cpu", scale=1.0):
    """Normal random tensor, drawn on the CPU in fp32 and then moved and rounded, so the
    same seed gives the same values on every device (GPU results are compared with the CPU
    backend's)."""
    return (torch.randn(*shape) * scale).to(device=device, dtype=dtype)


def leaf(x):
    """A fresh leaf copy of x that requires grad."""
    return x.detach().clone().requires_grad_(True)


def poison_memory(*likes, extra_bytes=1 << 22, rounds=3):
    """Fill memory that the next allocations are likely to reuse with NaN, then free it.

    The ops allocate their outputs with torch.empty, so a kernel that skips an element
    leaves whatever was there.  NaN-filled blocks of exactly the output shapes (plus one
    big block), allocated and freed, make the allocator hand NaN-filled memory to the next
    op call.  The GPU caching allocator reuses such blocks at once; glibc on the CPU does
    only partly (large blocks come from fresh mmap pages until its threshold adapts, hence
    several rounds), which is why `poisoned_outputs` below poisons the outputs directly.
    """
    for _ in range(rounds):
        blocks = [torch.full_like(t, math.nan) for t in likes]
        if likes:
            blocks.append(torch.full((extra_bytes // 4,), math.nan, device=likes[0].device))
        del blocks


# ----------------------------------------------------------------------------------------
# Tolerances
# ----------------------------------------------------------------------------------------

# Norm-wise relative error ||x - ref|| / ||ref|| of outputs, against the float64 reference
# on the same dtype-rounded inputs.  fp16 rounds with u = 2^-11 = 4.9e-4 and bf16 with
# u = 2^-8 = 3.9e-3: rounding the output alone costs about u / sqrt(3) in this norm, and a
# GPU kernel also rounds P to the input dtype before P.V, so 2e-3 / 1.6e-2 leave about 4x
# headroom over those two roundings.  fp32 accumulates in fp32 (u = 6e-8) over at most
# ~1k keys here: sqrt(1024) * 6e-8 = 2e-6, and 1e-5 leaves 5x.
OUT_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# Gradients pass through more roundings (P and dS in the input dtype, then two products
# accumulated over Sq or Sk), so 3x the output limits.
GRAD_TOL = {dt: 3 * tol for dt, tol in OUT_TOL.items()}

# The LSE is fp32 for every input dtype and computed from the same exactly representable
# inputs, so its error is fp32 math (scores, exp, a sum over Sk): 1e-5 for fp32 like the
# outputs; 1e-4 for fp16/bf16 because GPU tensor cores may accumulate q.k with truncated
# fp32 additions.
LSE_TOL = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-4}


def rel_err(actual, ref, floor=0.0):
    """||actual - ref|| / max(||ref||, floor) in float64; inf when actual has a NaN/inf (NaN
    never passes) or when the denominator is 0 and actual differs from ref."""
    a = actual.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    assert a.shape == r.shape, f"shape {tuple(a.shape)} != reference shape {tuple(r.shape)}"
    if not torch.isfinite(a).all():
        return math.inf
    diff = (a - r).norm().item()
    denom = max(r.norm().item(), floor)
    if denom == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / denom


def assert_close(actual, ref, tol, what, floor=0.0):
    err = rel_err(actual, ref, floor)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


def assert_lse_close(lse, ref, tol, what="lse"):
    """LSE: fp32; -inf exactly where the reference row sees nothing, finite elsewhere,
    norm-wise relative error on the finite entries."""
    assert lse.dtype == torch.float32, f"{what} dtype {lse.dtype}, expected float32"
    lse = lse.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    assert lse.shape == ref.shape, f"{what}: shape {tuple(lse.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(lse).any(), f"{what} has NaN"
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), empty), (
        f"{what}: -inf at {torch.isneginf(lse).sum().item()} entries, expected exactly at the "
        f"{empty.sum().item()} rows that see no key")
    assert torch.isfinite(lse[~empty]).all(), f"{what} has +inf"
    assert_close(lse[~empty], ref[~empty], tol, what)


def assert_all_finite(t, what):
    assert torch.isfinite(t).all(), f"{what} has {(~torch.isfinite(t)).sum().item()} non-finite values"


def assert_zero_where(t, where, what):
    """t must be exactly 0 where `where` (broadcastable) is true: rows that see no key."""
    t = t.detach().cpu()
    sel = t[where.cpu().expand_as(t)]
    assert (sel == 0).all(), f"{what}: {(sel != 0).sum().item()} entries should be exactly 0"


def to_cpu(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def assert_matches_cpu_backend(results, cpu_results, tols, floor=0.0):
    """A GPU result against the CPU backend's on the same inputs: each is within its
    tolerance of the reference, so they must be within twice that of each other."""
    for name, tol in tols.items():
        a, b = results[name], cpu_results[name]
        if name == "lse":
            assert_lse_close(a, b, 2 * tol, f"{name} (GPU vs CPU backend)")
        else:
            assert_close(a, b, 2 * tol, f"{name} (GPU vs CPU backend)", floor=floor if name != "out" else 0.0)


# ----------------------------------------------------------------------------------------
# Every output element written: NaN-filled output buffers
# ----------------------------------------------------------------------------------------


class _PoisonedTorch:
    """Stands in for the `torch` module inside fmha.ops: `torch.empty` of a floating dtype
    returns a NaN-filled tensor, so any element a kernel fails to write stays NaN.  Every
    other attribute is torch's own."""

    def __init__(self):
        self.poisoned = 0

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *args, **kwargs):
        t = torch.empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(math.nan)
        elif t.dtype != torch.bool:
            t.fill_(-1 if t.is_signed() else 255)  # all bits set (workspaces, counters)
        self.poisoned += 1
        return t


class poisoned_outputs:
    """Context manager: the fmha ops called inside it get NaN-filled output buffers.

    Replaces the `torch` name in fmha.ops (test-only; the package is not modified) and
    checks on exit that the ops really allocated through it, so the poison cannot go
    silently missing if the package changes how it allocates.
    """

    def __init__(self, expect_calls=True, module=None):
        self.expect_calls = expect_calls
        self.module = module if module is not None else fmha.ops  # fmha.kvcache for the decode op

    def __enter__(self):
        self._proxy = _PoisonedTorch()
        self._saved = self.module.torch
        self.module.torch = self._proxy
        return self

    def __exit__(self, exc_type, exc, tb):
        self.module.torch = self._saved
        if exc_type is None and self.expect_calls:
            assert self._proxy.poisoned > 0, (
                "poisoned_outputs(): fmha.ops allocated nothing through torch.empty; "
                "the test helper must follow how the ops allocate their outputs now")
        return False


# ----------------------------------------------------------------------------------------
# Harness: run a call on a device, compare with the reference (and the CPU backend)
# ----------------------------------------------------------------------------------------


def empty_query_rows(ref_lse, varlen):
    """Boolean mask broadcastable to `out` of the query rows that see no key."""
    empty = torch.isneginf(ref_lse)
    if varlen:  # lse (H, total) -> out (total, H, D)
        return empty.transpose(0, 1)[..., None]
    return empty.transpose(1, 2)[..., None]  # lse (B, H, S) -> out (B, S, H, D)


def check_forward(device, q, k, v, call, ref_kwargs, out_tol=None, lse_tol=None):
    """Runs `call(q, k, v) -> (out, lse)` on `device` twice -- once plainly, once with
    NaN-filled output buffers after NaN-filling and freeing memory -- requires the two runs
    to agree bitwise (the forward is deterministic and must write every element), then
    compares with the float64 reference on the same inputs.  q, k, v are CPU tensors of the
    tested dtype.  Returns the device results as CPU tensors."""
    dtype = q.dtype
    out_tol = OUT_TOL[dtype] if out_tol is None else out_tol
    lse_tol = LSE_TOL[dtype] if lse_tol is None else lse_tol
    varlen = "cu_seqlens_q" in ref_kwargs and ref_kwargs["cu_seqlens_q"] is not None

    def run(dev):
        args = [t.to(dev) for t in (q, k, v)]
        out, lse = call(*args)
        poison_memory(out, lse)
        with poisoned_outputs():
            out2, lse2 = call(*args)
        assert torch.equal(out, out2), "two identical forward calls differ (or left NaN in out)"
        assert torch.equal(lse, lse2), "two identical forward calls differ (or left NaN in lse)"
        return {"out": to_cpu(out), "lse": to_cpu(lse)}

    res = run(device)
    ref_out, ref_lse = attention_ref(q, k, v, **ref_kwargs)
    assert res["out"].dtype == dtype
    assert_close(res["out"], ref_out, out_tol, "out")
    assert_lse_close(res["lse"], ref_lse, lse_tol)
    assert_zero_where(res["out"], empty_query_rows(ref_lse, varlen), "out of rows that see no key")
    if device != "cpu":
        assert_matches_cpu_backend(res, run("cpu"), {"out": out_tol, "lse": lse_tol})
    return res


def check_backward(device, q, k, v, call, ref_kwargs, dout=None):
    """Gradients of sum(out * dout) through `call` (autograd) on `device`, with
    NaN-filled output buffers, against float64 autograd of the reference.  Also: dq rows of
    queries that see no key are exactly 0.  Returns the device results as CPU tensors."""
    dtype = q.dtype
    if dout is None:
        dout = randn(*q.shape, dtype=dtype)
    varlen = "cu_seqlens_q" in ref_kwargs and ref_kwargs["cu_seqlens_q"] is not None

    def run(dev):
        ql, kl, vl = (leaf(t.to(dev)) for t in (q, k, v))
        with poisoned_outputs():
            out, lse = call(ql, kl, vl)
            out.backward(dout.to(dev))
        return {"out": to_cpu(out), "lse": to_cpu(lse), "dq": to_cpu(ql.grad),
                "dk": to_cpu(kl.grad), "dv": to_cpu(vl.grad)}

    res = run(device)
    ref_out, ref_lse, dq, dk, dv = attention_ref_grads(q, k, v, dout, **ref_kwargs)
    assert_close(res["out"], ref_out, OUT_TOL[dtype], "out")
    # A gradient can be exactly 0 in float64 while rounding leaves a tiny one (one visible
    # key: dS = P (dO.v - dO.o) with o = v).  Its error is then measured against the other
    # gradients' size: rounding errors of dS scale with |dO| |V|, as dV's size does.
    floor = max(g.norm().item() for g in (dq, dk, dv))
    for name, ref in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert res[name].dtype == dtype, f"{name} dtype {res[name].dtype}"
        assert_close(res[name], ref, GRAD_TOL[dtype], name, floor=1e-2 * floor)
    assert_zero_where(res["dq"], empty_query_rows(ref_lse, varlen), "dq of rows that see no key")
    if device != "cpu":
        tols = {"out": OUT_TOL[dtype], "dq": GRAD_TOL[dtype], "dk": GRAD_TOL[dtype],
                "dv": GRAD_TOL[dtype]}
        assert_matches_cpu_backend(res, run("cpu"), tols, floor=1e-2 * floor)
    return res


def flash_call(**opts):
    """call(q, k, v) -> (out, lse) through fmha.flash_attn_func with these keywords;
    tensor keywords (alibi_slopes) are moved to q's device."""
    def call(q, k, v):
        kw = {n: (x.to(q.device) if isinstance(x, torch.Tensor) else x) for n, x in opts.items()}
        out, lse, _ = fmha.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
        return out, lse
    return call


def varlen_call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **opts):
    """call(q, k, v) -> (out, lse) through fmha.flash_attn_varlen_func."""
    def call(q, k, v):
        kw = {n: (x.to(q.device) if isinstance(x, torch.Tensor) else x) for n, x in opts.items()}
        out, lse, _ = fmha.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q.to(q.device), cu_seqlens_k.to(q.device), max_seqlen_q,
            max_seqlen_k, return_attn_probs=True, **kw)
        return out, lse
    return call


def op_call(top_left=False, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
            softmax_scale=None):
    """call(q, k, v) -> (out, lse) through torch.ops.fmha.fwd, the only public way to get
    a top-left aligned window (flash_attn's functions are bottom-right)."""
    def call(q, k, v):
        left, right = window_size[0], 0 if causal else window_size[1]
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        slopes = None if alibi_slopes is None else alibi_slopes.to(q.device)
        out, lse, _, _ = torch.ops.fmha.fwd(q, k, v, None, None, None, q.shape[1], k.shape[1],
                                            scale, softcap, left, right, top_left, slopes, 0.0,
                                            False, False, None)
        return out, lse
    return call
