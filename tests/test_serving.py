"""The serving surface of issue 22 that needs no new kernel: `out=` on flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache (written in place, nothing allocated for
the output, autograd through it), any head dim 1-256 at any stride (padded or copied where
the GPU kernels need 16-byte rows, gradients included), and FlashAttention-3's names
(return_softmax_lse and num_splits on varlen, k/v_descale for 8-bit caches, q_descale of
the cache function and fp8 inputs refused, the descales of 16-bit varlen inputs accepted
without effect, as in FA3).  Fresh random inputs, float64 references (tests/reference.py), NaN-filled
outputs; CPU always, CUDA where present (conftest's `device`)."""

import math

import pytest
import torch

import fmha
from conftest import (GRAD_TOL, LSE_TOL, OUT_TOL, assert_close, assert_lse_close, check_backward,
                      check_forward, dtype_id, leaf, other_device_available, poisoned_outputs, randn)
from reference import attention_ref, attention_ref_grads

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def nan_out(shape, dtype, device, layout="contiguous"):
    """A NaN-filled out tensor of `shape` in a layout a caller might hand over: contiguous,
    "strided" (the first columns of a wider buffer, head dim not the innermost extent), or
    "heads-major" ((B, H, S, D) memory seen as (B, S, H, D)).  Returns (out, buffer)."""
    if layout == "contiguous":
        buf = torch.full(shape, math.nan, dtype=dtype, device=device)
        return buf, buf
    if layout == "strided":
        buf = torch.full(tuple(shape[:-1]) + (shape[-1] + 5,), math.nan, dtype=dtype, device=device)
        return buf[..., 2:2 + shape[-1]], buf
    assert layout == "heads-major" and len(shape) == 4
    b, s, h, d = shape
    buf = torch.full((b, h, s, d), math.nan, dtype=dtype, device=device)
    return buf.transpose(1, 2), buf


@pytest.fixture(params=["native", "16-byte-rows"])
def rows(request, device, monkeypatch):
    """"16-byte-rows" runs the CPU backend behind the layout rules of the GPU tensor-core
    kernels (fmha.ops._vector_rows), so the padding and copying that serves any head dim
    and stride on a GPU (and the copy back into appended caches) is checked in CI too; on a
    GPU it is the native case."""
    if request.param == "16-byte-rows":
        if device != "cpu":
            pytest.skip("on a GPU the native case has these layout rules")
        monkeypatch.setattr(fmha.ops, "_vector_rows", lambda dev, dtype: dtype != torch.float32)
    return request.param


class count_allocations:
    """Records the shapes of every torch.empty a module of fmha makes (as poisoned_outputs
    does, test-only), so a test can require that no output-sized buffer was allocated."""

    def __init__(self, module):
        self.module, self.shapes = module, []

    def __enter__(self):
        shapes, real = self.shapes, torch

        class Proxy:
            def __getattr__(self, name):
                return getattr(real, name)

            def empty(self, *args, **kwargs):
                t = real.empty(*args, **kwargs)
                shapes.append(tuple(t.shape))
                return t

        self._saved, self.module.torch = self.module.torch, Proxy()
        return self

    def __exit__(self, *exc):
        self.module.torch = self._saved
        return False


# ---------------------------------------------------------------------------------------
# out= on flash_attn_func and flash_attn_varlen_func
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "strided", "heads-major"])
@pytest.mark.parametrize("d", [64, 59])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_out_fixed(device, rows, dtype, d, layout):
    B, Sq, Sk, Hq, Hk = 2, 37, 50, 4, 2

    def call(q, k, v):
        out, buf = nan_out((B, Sq, Hq, d), dtype, q.device, layout)
        before = buf.clone()
        res, lse, _ = fmha.flash_attn_func(q, k, v, causal=True, window_size=(20, -1), return_attn_probs=True,
                                           out=out)
        assert res is out, "out= must return the caller's tensor"
        # Only out's own elements were written: the rest of the buffer keeps its NaNs.
        rest = torch.ones_like(buf, dtype=torch.bool)
        if layout == "strided":
            rest[..., 2:2 + d] = False
            assert torch.isnan(buf[rest]).all() and torch.equal(buf[rest].isnan(), before[rest].isnan())
        return out, lse

    q = randn(B, Sq, Hq, d, dtype=dtype)
    k, v = randn(B, Sk, Hk, d, dtype=dtype), randn(B, Sk, Hk, d, dtype=dtype)
    res = check_forward(device, q, k, v, call, dict(causal=True, window_size=(20, -1)))
    plain = fmha.flash_attn_func(*(t.to(device) for t in (q, k, v)), causal=True, window_size=(20, -1))
    assert torch.equal(res["out"], plain.cpu()), "out= differs from the allocating call"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_out_varlen(device, rows, dtype):
    # Rows before cu_seqlens_q[0] and after cu_seqlens_q[-1] belong to no sequence: written 0.
    cu_q = torch.tensor([2, 9, 9, 30, 31], dtype=torch.int32)
    cu_k = torch.tensor([0, 15, 40, 40, 62], dtype=torch.int32)
    total_q, total_k, H, d = 34, 62, 4, 72
    q = randn(total_q, H, d, dtype=dtype)
    k, v = randn(total_k, 1, d, dtype=dtype), randn(total_k, 1, d, dtype=dtype)

    def call(q, k, v):
        out, _ = nan_out((total_q, H, d), dtype, q.device, "strided")
        res, lse = fmha.flash_attn_varlen_func(q, k, v, cu_q.to(q.device), cu_k.to(q.device), 21, 25,
                                               causal=True, return_softmax_lse=True, out=out)
        assert res is out
        return out, lse

    check_forward(device, q, k, v, call, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True))


def test_out_allocates_no_output(device, rows):
    # Inference with out=: the kernel writes the caller's tensor; the only buffer allocated
    # is the LSE (B * H * S floats).  A head dim the GPU kernels address directly (64).
    B, S, H, d = 2, 33, 4, 64
    q, k, v = (randn(B, S, H, d, dtype=torch.bfloat16, device=device) for _ in range(3))
    out = torch.full((B, S, H, d), math.nan, dtype=torch.bfloat16, device=device)
    with count_allocations(fmha.ops) as allocs:
        fmha.flash_attn_func(q, k, v, causal=True, out=out)
    assert (B, S, H, d) not in allocs.shapes, f"an output-sized buffer was allocated: {allocs.shapes}"
    assert torch.equal(out, fmha.flash_attn_func(q, k, v, causal=True))

    cu = torch.tensor([0, 5, 40, 66], dtype=torch.int32, device=device)
    qv, kv, vv = (x.reshape(B * S, H, d) for x in (q, k, v))
    out = torch.full((B * S, H, d), math.nan, dtype=torch.bfloat16, device=device)
    with count_allocations(fmha.ops) as allocs:
        fmha.flash_attn_varlen_func(qv, kv, vv, cu, cu, 35, 35, out=out)
    assert (B * S, H, d) not in allocs.shapes, f"an output-sized buffer was allocated: {allocs.shapes}"
    assert torch.equal(out, fmha.flash_attn_varlen_func(qv, kv, vv, cu, cu, 35, 35))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_out_with_gradients(device, rows, dtype):
    # An input that requires grad: out receives the result through an in-place copy that
    # autograd differentiates, so the loss on the caller's tensor has exact gradients.
    B, Sq, Sk, Hq, Hk, d = 2, 29, 41, 4, 2, 48
    q = randn(B, Sq, Hq, d, dtype=dtype)
    k, v = randn(B, Sk, Hk, d, dtype=dtype), randn(B, Sk, Hk, d, dtype=dtype)

    def call(q, k, v):
        out, _ = nan_out((B, Sq, Hq, d), dtype, q.device, "heads-major")
        res, lse, _ = fmha.flash_attn_func(q, k, v, causal=True, softcap=5.0, return_attn_probs=True, out=out)
        assert res is out and out.requires_grad
        return out, lse

    check_backward(device, q, k, v, call, dict(causal=True, softcap=5.0))

    # Without grad mode the same inputs take the in-place path, with no autograd node.
    ql, kl, vl = (leaf(t.to(device)) for t in (q, k, v))
    out = torch.empty(B, Sq, Hq, d, dtype=dtype, device=device)
    with torch.no_grad():
        fmha.flash_attn_func(ql, kl, vl, causal=True, softcap=5.0, out=out)
    assert not out.requires_grad
    # A leaf that requires grad cannot receive a differentiable result in place: torch says so.
    leaf_out = torch.zeros(B, Sq, Hq, d, dtype=dtype, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fmha.flash_attn_func(ql, kl, vl, out=leaf_out)


def test_out_varlen_gradients(device):
    dtype = torch.float16
    cu_q = torch.tensor([0, 12, 12, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 27, 45], dtype=torch.int32)
    q = randn(30, 4, 40, dtype=dtype)
    k, v = randn(45, 2, 40, dtype=dtype), randn(45, 2, 40, dtype=dtype)

    def call(q, k, v):
        out = torch.full((30, 4, 40), math.nan, dtype=dtype, device=q.device)
        res, lse = fmha.flash_attn_varlen_func(q, k, v, cu_q.to(q.device), cu_k.to(q.device), 18, 20,
                                               causal=True, return_softmax_lse=True, out=out)
        return res, lse

    check_backward(device, q, k, v, call, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True))


def test_out_under_torch_compile(device):
    q, k, v = (randn(2, 24, 4, 32, dtype=torch.float32, device=device) for _ in range(3))

    def step(q, k, v, out):
        return fmha.flash_attn_func(q, k, v, causal=True, out=out)

    compiled = torch.compile(step, fullgraph=True)
    out = torch.full((2, 24, 4, 32), math.nan, device=device)
    compiled(q, k, v, out)
    assert torch.equal(out, fmha.flash_attn_func(q, k, v, causal=True))


# ---------------------------------------------------------------------------------------
# out= on flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------


def paged(caches, page):
    """Contiguous (B, S, Hk, D) caches -> shuffled pages (num_pages, page, Hk, D) each, and
    the block table they share (two spare pages nobody uses)."""
    B, S = caches[0].shape[:2]
    n = B * S // page
    table = torch.randperm(n + 2)[:n].to(torch.int32).reshape(B, S // page)
    out = []
    for cache in caches:
        pages = torch.zeros((n + 2, page) + tuple(cache.shape[2:]), dtype=cache.dtype)
        for b in range(B):
            for i in range(S // page):
                pages[table[b, i]] = cache[b, i * page:(i + 1) * page]
        out.append(pages)
    return out, table


def unpaged(pages, table):
    """The contiguous view of a paged cache: (B, max_blocks * page, Hk, D)."""
    return pages[table.long()].reshape(table.shape[0], -1, *pages.shape[2:])


def dequant(cache, scale):
    return cache.double() if scale is None else cache.double() * scale.double()[None, None, :, None]


def kvcache_reference(q, kc, vc, lengths, causal, window=(-1, -1), k_scale=None, v_scale=None):
    """out (B, Sq, Hq, D), lse (B, Hq, Sq) of q against the first lengths[b] rows of the
    (contiguous, after-append) caches, bottom-right aligned: flash_attn_func's semantics with
    seqused_k, in float64."""
    return attention_ref(q, dequant(kc, k_scale), dequant(vc, v_scale), seqused_k=lengths, causal=causal,
                         window_size=window)


@pytest.mark.parametrize("paged_cache", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("d", [64, 59])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_kvcache_out(device, rows, dtype, d, paged_cache):
    B, Sq, Hq, Hk, S = 3, 2, 8, 2, 64
    kc, vc = randn(B, S, Hk, d, dtype=dtype), randn(B, S, Hk, d, dtype=dtype)
    q, knew, vnew = randn(B, Sq, Hq, d, dtype=dtype), randn(B, Sq, Hk, d, dtype=dtype), randn(B, Sq, Hk, d,
                                                                                               dtype=dtype)
    lengths = torch.tensor([0, 17, S - Sq], dtype=torch.int32)
    table = None
    if paged_cache:
        (kc, vc), table = paged((kc, vc), 16)
    kc_d, vc_d = kc.to(device), vc.to(device)
    out, _ = nan_out((B, Sq, Hq, d), dtype, device, "strided")
    with poisoned_outputs(module=fmha.kvcache):
        res, lse = fmha.flash_attn_with_kvcache(q.to(device), kc_d, vc_d, knew.to(device), vnew.to(device),
                                                cache_seqlens=lengths.to(device), causal=True,
                                                block_table=None if table is None else table.to(device),
                                                return_softmax_lse=True, out=out)
    assert res is out
    kc_after, vc_after = kc_d.cpu(), vc_d.cpu()
    if table is not None:
        kc_after, vc_after = unpaged(kc_after, table), unpaged(vc_after, table)
    for b in range(B):
        pos = int(lengths[b])
        assert torch.equal(kc_after[b, pos:pos + Sq], knew[b]) and torch.equal(vc_after[b, pos:pos + Sq], vnew[b])
    ref_out, ref_lse = kvcache_reference(q, kc_after, vc_after, lengths + Sq, causal=True)
    assert_close(out.cpu(), ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse.cpu(), ref_lse, LSE_TOL[dtype])


def test_kvcache_out_allocates_no_output(device, rows):
    B, Sq, Hq, Hk, S, d = 2, 1, 8, 2, 48, 64
    q = randn(B, Sq, Hq, d, dtype=torch.float16, device=device)
    kc, vc = (randn(B, S, Hk, d, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([30, 48], dtype=torch.int32, device=device)
    out = torch.full((B, Sq, Hq, d), math.nan, dtype=torch.float16, device=device)
    with count_allocations(fmha.kvcache) as allocs:
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=out)
    assert (B, Sq, Hq, d) not in allocs.shapes, f"an output-sized buffer was allocated: {allocs.shapes}"
    assert torch.equal(out, fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths))


def test_kvcache_out_is_forward_only(device):
    q = randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    kc, vc = (randn(2, 40, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([17, 40], dtype=torch.int32, device=device)
    plain = fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths)
    q.requires_grad_()
    out = torch.empty(2, 1, 4, 32, dtype=torch.float16, device=device)
    res = fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=out)
    assert res is out and out.requires_grad and torch.equal(out.detach(), plain)
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()


def test_kvcache_out_cuda_graph(device):
    # out= in a captured graph: each replay writes the static out from the current q.
    if device == "cpu":
        pytest.skip("CUDA graphs need a GPU")
    q = randn(2, 1, 8, 128, dtype=torch.bfloat16, device=device)
    kc, vc = (randn(2, 256, 2, 128, dtype=torch.bfloat16, device=device) for _ in range(2))
    lengths = torch.tensor([100, 256], dtype=torch.int32, device=device)
    out = torch.empty(2, 1, 8, 128, dtype=torch.bfloat16, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=out)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=out)
    for _ in range(2):
        q.copy_(randn(2, 1, 8, 128, dtype=torch.bfloat16, device=device))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths))


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "paged16"])
def test_kvcache_split_calls_cuda_graph(device, page):
    # Split-KV calls back to back in one graph (B = 1, long cache: the most splits, so each
    # call's partials go through the combine, and the graph's pool may hand a call the
    # workspace the previous call's combine reads): every replayed output equals its call
    # run alone.
    if device == "cpu":
        pytest.skip("CUDA graphs need a GPU")
    cap, n = 4096, 3
    qs = [randn(1, 1, 32, 128, dtype=torch.bfloat16, device=device) for _ in range(n)]
    kc, vc = (randn(1, cap, 8, 128, dtype=torch.bfloat16, device=device) for _ in range(2))
    extra = {}
    if page:
        kc, vc = kc.view(cap // page, page, 8, 128), vc.view(cap // page, page, 8, 128)
        extra["block_table"] = torch.arange(cap // page, dtype=torch.int32, device=device).flip(0).view(1, -1)
    lengths = torch.tensor([cap - 5], dtype=torch.int32, device=device)
    outs = [torch.empty_like(q) for q in qs]

    def calls():
        for q, o in zip(qs, outs):
            fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=o, **extra)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls()  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for o in outs:
        o.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    for q, o in zip(qs, outs):
        assert torch.equal(o, fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, **extra))


# ---------------------------------------------------------------------------------------
# Any head dim at any stride
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 3, 59, 111, 250])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_packed_qkv_any_head_dim(device, rows, dtype, d):
    # qkv (B, S, 3, H, D): q, k, v are strided views whose rows are 3 * H * D apart, not
    # 16-byte aligned for odd D.  Forward and gradients (into the packed tensor).
    B, S, H = 2, 45, 3
    qkv = randn(B, S, 3, H, d, dtype=dtype)
    dout = randn(B, S, H, d, dtype=dtype)
    x = leaf(qkv.to(device))
    out, lse, _ = fmha.flash_attn_qkvpacked_func(x, causal=True, return_attn_probs=True)
    out.backward(dout.to(device))
    q, k, v = qkv.unbind(2)
    ref_out, ref_lse, dq, dk, dv = attention_ref_grads(q, k, v, dout, causal=True)
    assert_close(out.cpu(), ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse.cpu(), ref_lse, LSE_TOL[dtype])
    floor = max(g.norm().item() for g in (dq, dk, dv))
    for name, got, ref in (("dq", x.grad[:, :, 0], dq), ("dk", x.grad[:, :, 1], dk), ("dv", x.grad[:, :, 2], dv)):
        assert_close(got.cpu(), ref, GRAD_TOL[dtype], name, floor=1e-2 * floor)


def misaligned(x):
    """A copy of x whose data starts 2 bytes past a 16-byte boundary (differentiable)."""
    buf = torch.zeros(x.numel() + 1, dtype=x.dtype, device=x.device)
    view = buf[1:].view(x.shape)
    view.copy_(x)
    return view


@pytest.mark.parametrize("d", [40, 59])
def test_misaligned_views_any_head_dim(device, rows, d):
    # Varlen kv-packed views that start 2 bytes into their buffers: data not 16-byte
    # aligned, whatever the head dim.  Forward and gradients.
    dtype = torch.bfloat16
    cu = torch.tensor([0, 13, 40], dtype=torch.int32)
    q, k, v = randn(40, 4, d, dtype=dtype), randn(40, 2, d, dtype=dtype), randn(40, 2, d, dtype=dtype)

    def call(q, k, v):
        kv = misaligned(torch.stack((k, v), dim=1))
        out, lse, _ = fmha.flash_attn_varlen_kvpacked_func(misaligned(q), kv, cu.to(q.device), cu.to(q.device), 27,
                                                           27, causal=True, return_attn_probs=True)
        return out, lse

    check_forward(device, q, k, v, call, dict(cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True))
    check_backward(device, q, k, v, call, dict(cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True))


@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn, torch.int8], ids=["16bit", "fp8", "int8"])
@pytest.mark.parametrize("d", [59, 40, 8])
def test_kvcache_any_head_dim_at_any_stride(device, rows, d, cache_dtype):
    # Caches as views of one packed (B, S, 2, Hk, D) tensor, new keys/values and q as
    # views of packed tensors: head dims not a multiple of 8 (16 for 8-bit caches) and
    # rows the kernels cannot load as 16-byte vectors.  The append must reach the caller's
    # caches (the kernels work on padded copies), per-token scales included.
    dtype = torch.bfloat16
    B, Sq, Hq, Hk, S = 2, 3, 4, 2, 48
    kv = randn(B, S, 2, Hk, d, dtype=dtype)
    qkv = randn(B, Sq, Hq + 2 * Hk, d, dtype=dtype)
    lengths = torch.tensor([9, 45], dtype=torch.int32)
    scales = {}
    if cache_dtype is not None:
        kq, ks = fmha.quantize_kv_cache(kv[:, :, 0].contiguous(), cache_dtype, "token")
        vq, vs = fmha.quantize_kv_cache(kv[:, :, 1].contiguous(), cache_dtype, "token")
        # Stacked as bytes: torch 2.4 has no CPU stack/cat for float8 types.
        kv = torch.stack((kq.view(torch.uint8), vq.view(torch.uint8)), dim=2).view(cache_dtype)
        scales = dict(k_scale=ks.to(device), v_scale=vs.to(device))
    kv_d, qkv_d = kv.to(device), qkv.to(device)
    kc, vc = kv_d[:, :, 0], kv_d[:, :, 1]
    q, knew, vnew = qkv_d[:, :, :Hq], qkv_d[:, :, Hq:Hq + Hk], qkv_d[:, :, Hq + Hk:]
    with poisoned_outputs(module=fmha.kvcache):
        out, lse = fmha.flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=lengths.to(device),
                                                causal=True, return_softmax_lse=True, **scales)
    kv_after = kv_d.cpu()
    new = qkv[:, :, Hq:]
    k_scale = v_scale = None
    if cache_dtype is None:
        for b in range(B):
            pos = int(lengths[b])
            assert torch.equal(kv_after[b, pos:pos + Sq, 0], new[b, :, :Hk])
            assert torch.equal(kv_after[b, pos:pos + Sq, 1], new[b, :, Hk:])
        keys, values = kv_after[:, :, 0].double(), kv_after[:, :, 1].double()
    else:
        ks, vs = scales["k_scale"].cpu(), scales["v_scale"].cpu()
        keys = kv_after[:, :, 0].double() * ks.double()[..., None]
        values = kv_after[:, :, 1].double() * vs.double()[..., None]
        for b in range(B):  # appended rows dequantize to the new values (8-bit rounding)
            pos = int(lengths[b])
            assert_close(keys[b, pos:pos + Sq], new[b, :, :Hk], 0.07, "appended keys")
            assert_close(values[b, pos:pos + Sq], new[b, :, Hk:], 0.07, "appended values")
    # Untouched rows of the packed cache are unchanged, bit for bit.
    bits = (lambda x: x.view(torch.uint8)) if kv.dtype == torch.float8_e4m3fn else (lambda x: x)
    for b in range(B):
        pos = int(lengths[b])
        rows = torch.ones(S, dtype=torch.bool)
        rows[pos:pos + Sq] = False
        assert torch.equal(bits(kv_after[b])[rows], bits(kv[b])[rows]), f"cache rows of sequence {b} changed"
    ref_out, ref_lse = attention_ref(qkv[:, :, :Hq], keys, values, seqused_k=lengths + Sq, causal=True)
    tol = OUT_TOL[dtype] if cache_dtype is None else 2 * OUT_TOL[dtype]
    assert_close(out.cpu(), ref_out, tol, "out")
    assert_lse_close(lse.cpu(), ref_lse, LSE_TOL[dtype])


# ---------------------------------------------------------------------------------------
# FlashAttention-3's names: return_softmax_lse, num_splits, q/k/v_descale
# ---------------------------------------------------------------------------------------


def _varlen_inputs(device, dtype=torch.float16):
    cu_q = torch.tensor([0, 7, 8, 30], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 30, 60, 100], dtype=torch.int32, device=device)
    q = randn(30, 4, 64, dtype=dtype, device=device)
    k, v = randn(100, 2, 64, dtype=dtype, device=device), randn(100, 2, 64, dtype=dtype, device=device)
    return q, k, v, cu_q, cu_k


def test_varlen_return_softmax_lse(device):
    q, k, v, cu_q, cu_k = _varlen_inputs(device)
    res = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True, return_softmax_lse=True)
    assert isinstance(res, tuple) and len(res) == 2
    out, lse = res
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu(),
                                     causal=True)
    assert lse.shape == (4, 30) and lse.dtype == torch.float32
    assert_close(out.cpu(), ref_out, OUT_TOL[q.dtype], "out")
    assert_lse_close(lse.cpu(), ref_lse, LSE_TOL[q.dtype])
    assert torch.equal(out, fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True))


@pytest.mark.parametrize("num_splits", [0, 1, 2, 32])
def test_varlen_num_splits_changes_nothing(device, num_splits):
    q, k, v, cu_q, cu_k = _varlen_inputs(device)
    ref = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True, return_softmax_lse=True)
    got = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True, return_softmax_lse=True,
                                      num_splits=num_splits)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_varlen_num_splits_1_is_batch_invariant(device):
    # num_splits=1: a sequence's rows are bitwise the same whatever else is in the batch,
    # here alone (max_seqlen_k 300) and next to a 900-key sequence (max_seqlen_k 900).
    if device != "cpu":
        pytest.skip("the CUDA forward picks its key-block length from max_seqlen_k (kFwdLongKeys = 512), so a "
                    "sequence's last bits may change with the batch; bitwise batch invariance there needs a "
                    "flag through the C API (issue 22)")
    dtype = torch.bfloat16
    q, k, v = randn(40, 4, 64, dtype=dtype), randn(300, 2, 64, dtype=dtype), randn(300, 2, 64, dtype=dtype)
    q2, k2, v2 = randn(25, 4, 64, dtype=dtype), randn(900, 2, 64, dtype=dtype), randn(900, 2, 64, dtype=dtype)
    alone = fmha.flash_attn_varlen_func(q, k, v, torch.tensor([0, 40], dtype=torch.int32),
                                        torch.tensor([0, 300], dtype=torch.int32), 40, 300, causal=True,
                                        num_splits=1, return_softmax_lse=True)
    cu_q = torch.tensor([0, 25, 65], dtype=torch.int32)
    cu_k = torch.tensor([0, 900, 1200], dtype=torch.int32)
    both = fmha.flash_attn_varlen_func(torch.cat((q2, q)), torch.cat((k2, k)), torch.cat((v2, v)), cu_q, cu_k, 40,
                                       900, causal=True, num_splits=1, return_softmax_lse=True)
    assert torch.equal(both[0][25:], alone[0]) and torch.equal(both[1][:, 25:], alone[1])


def test_kvcache_descales(device):
    # k_descale / v_descale as FlashAttention-3 takes them map exactly onto per-head scales:
    # a scalar, (1, Hk), and (B, Hk) expanded from one row give what k_scale/v_scale give.
    B, Hq, Hk, S, d = 3, 8, 2, 64, 64
    q = randn(B, 1, Hq, d, dtype=torch.bfloat16, device=device)
    k0, v0 = randn(B, S, Hk, d, dtype=torch.bfloat16), randn(B, S, Hk, d, dtype=torch.bfloat16)
    kq, ks = fmha.quantize_kv_cache(k0, torch.float8_e4m3fn)
    vq, vs = fmha.quantize_kv_cache(v0, torch.float8_e4m3fn)
    kq, ks, vq, vs = (x.to(device) for x in (kq, ks, vq, vs))
    lengths = torch.tensor([5, 40, 64], dtype=torch.int32, device=device)
    ref = fmha.flash_attn_with_kvcache(q, kq, vq, cache_seqlens=lengths, k_scale=ks, v_scale=vs)
    for k_descale, v_descale in ((ks[None], vs[None]), (ks.expand(B, Hk), vs.expand(B, Hk))):
        got = fmha.flash_attn_with_kvcache(q, kq, vq, cache_seqlens=lengths, k_descale=k_descale,
                                           v_descale=v_descale)
        assert torch.equal(got, ref)
    # A scalar descale is that scale for every head.
    scalar_k, scalar_v = ks.max(), vs.max()
    got = fmha.flash_attn_with_kvcache(q, kq, vq, cache_seqlens=lengths, k_descale=scalar_k, v_descale=scalar_v)
    want = fmha.flash_attn_with_kvcache(q, kq, vq, cache_seqlens=lengths, k_scale=scalar_k.expand(Hk).contiguous(),
                                        v_scale=scalar_v.expand(Hk).contiguous())
    assert torch.equal(got, want)
    ref_out, _ = kvcache_reference(q.cpu(), kq.cpu(), vq.cpu(), lengths.cpu(), causal=False,
                                   k_scale=scalar_k.expand(Hk).cpu(), v_scale=scalar_v.expand(Hk).cpu())
    assert_close(got.cpu(), ref_out, OUT_TOL[torch.bfloat16], "out with scalar descales")


# ---------------------------------------------------------------------------------------
# Bad input: each error names the argument
# ---------------------------------------------------------------------------------------


def _fixed_args(device):
    q, k, v = (randn(2, 8, 4, 32, dtype=torch.float16, device=device) for _ in range(3))
    return q, k, v


# (what, make(shape, q) -> bad out, exception, message)
OUT_ERRORS = [
    ("shape", lambda shape, q: torch.empty(shape[:-1] + (16,), dtype=q.dtype, device=q.device), ValueError,
     "out must have shape"),
    ("dtype", lambda shape, q: torch.empty(shape, dtype=torch.float32, device=q.device), TypeError,
     "out must have q's dtype"),
    ("type", lambda shape, q: q.cpu().numpy(), TypeError, "out must be a torch.Tensor"),
    ("last stride", lambda shape, q: torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=q.dtype,
                                                 device=q.device).transpose(-1, -2), ValueError,
     "out must have a contiguous last dimension"),
    ("zero stride", lambda shape, q: torch.empty((1,) + shape[1:], dtype=q.dtype, device=q.device).expand(shape),
     ValueError, "out must not have overlapping elements"),
    ("aliases q", lambda shape, q: q, ValueError, "out must not share memory with q"),
]


@pytest.mark.parametrize("what,make,exc,match", OUT_ERRORS, ids=[e[0] for e in OUT_ERRORS])
def test_out_errors(device, what, make, exc, match):
    q, k, v = _fixed_args(device)
    with pytest.raises(exc, match=match):
        fmha.flash_attn_func(q, k, v, out=make(tuple(q.shape), q))
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    qv, kv, vv = (x.reshape(16, 4, 32) for x in (q, k, v))
    with pytest.raises(exc, match=match):
        fmha.flash_attn_varlen_func(qv, kv, vv, cu, cu, 16, 16, out=make(tuple(qv.shape), qv))
    kc, vc = (randn(2, 32, 4, 32, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([3, 4], dtype=torch.int32, device=device)
    with pytest.raises(exc, match=match):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=make(tuple(q.shape), q))


def test_out_aliasing_k_v_and_caches(device):
    q, k, v = _fixed_args(device)
    with pytest.raises(ValueError, match="out must not share memory with k"):
        fmha.flash_attn_func(q, k, v, out=k)
    with pytest.raises(ValueError, match="out must not share memory with v"):
        fmha.flash_attn_func(q, k, v, out=v)
    kc, vc = (randn(2, 8, 4, 32, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([3, 4], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="out must not share memory with v_cache"):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, out=vc)
    # Disjoint parts of one buffer are fine: out in the first half, q in the second.
    buf = randn(2, 2, 8, 4, 32, dtype=torch.float16, device=device)
    out = fmha.flash_attn_func(buf[1], k, v, out=buf[0])
    assert out is not None and torch.equal(buf[0], fmha.flash_attn_func(buf[1], k, v))


def test_out_device_mismatch(device):
    if not other_device_available():
        pytest.skip("needs a second device")
    q, k, v = _fixed_args(device)
    other = "cpu" if device != "cpu" else "cuda"
    with pytest.raises(ValueError, match="out is on"):
        fmha.flash_attn_func(q, k, v, out=torch.empty(q.shape, dtype=q.dtype, device=other))


def test_varlen_descales_of_16bit_inputs(device):
    # FA3 reads q/k/v_descale only for fp8 inputs; vLLM passes them on every call (ones
    # expanded to (batch, nheads_k) for 16-bit caches).  Checked, and without effect.
    q, k, v, cu_q, cu_k = _varlen_inputs(device)
    want = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True)
    for scale in (torch.ones((), device=device), torch.full((1,), 3.0, device=device),
                  torch.ones((), device=device).expand(3, 2), torch.rand(3, 2, device=device)):
        got = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, causal=True, q_descale=scale,
                                          k_descale=scale, v_descale=scale)
        assert torch.equal(got, want)


def test_varlen_fa3_keyword_errors(device):
    q, k, v, cu_q, cu_k = _varlen_inputs(device)
    for name in ("q_descale", "k_descale", "v_descale"):
        with pytest.raises(TypeError, match=f"{name} must be torch.float32"):
            fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, **{name: torch.ones((), device=device).half()})
        with pytest.raises(ValueError, match=rf"{name} must be a scalar or have shape \(3, 2\)"):
            fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, **{name: torch.ones(3, 4, device=device)})
    with pytest.raises(ValueError, match="return_softmax_lse and return_attn_probs"):
        fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, return_softmax_lse=True, return_attn_probs=True)
    with pytest.raises(TypeError, match="return_softmax_lse"):
        fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, return_softmax_lse="yes")
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="num_splits"):
            fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 22, 40, num_splits=bad)


def _fp8_cache(device, B=2, Hk=2):
    kq, ks = fmha.quantize_kv_cache(randn(B, 32, Hk, 32, dtype=torch.float16), torch.float8_e4m3fn)
    return kq.to(device), ks.to(device)


DESCALE_ERRORS = [
    ("q_descale", lambda d, ks: dict(q_descale=torch.ones((), device=d)), ValueError, "q_descale is not supported"),
    ("one of two", lambda d, ks: dict(k_descale=ks[None]), ValueError, "k_descale and v_descale must be given"),
    ("with k_scale", lambda d, ks: dict(k_descale=ks[None], v_descale=ks[None], k_scale=ks, v_scale=ks), ValueError,
     "not both"),
    ("dtype", lambda d, ks: dict(k_descale=ks[None].double(), v_descale=ks[None]), TypeError,
     "k_descale must be torch.float32"),
    ("shape", lambda d, ks: dict(k_descale=ks[None].expand(3, 2), v_descale=ks[None]), ValueError,
     r"k_descale must be a scalar or have shape \(2, 2\)"),
    ("rows per sequence", lambda d, ks: dict(k_descale=ks[None].repeat(2, 1), v_descale=ks[None]), ValueError,
     "own row per sequence"),
    ("v shape", lambda d, ks: dict(k_descale=ks[None], v_descale=ks.repeat(2)), ValueError, "v_descale must be"),
]


@pytest.mark.parametrize("what,make,exc,match", DESCALE_ERRORS, ids=[e[0] for e in DESCALE_ERRORS])
def test_kvcache_descale_errors(device, what, make, exc, match):
    kq, ks = _fp8_cache(device)
    q = randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    lengths = torch.tensor([3, 4], dtype=torch.int32, device=device)
    with pytest.raises(exc, match=match):
        fmha.flash_attn_with_kvcache(q, kq, kq.clone(), cache_seqlens=lengths, **make(device, ks))


def test_kvcache_descale_needs_8bit_cache(device):
    q = randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    kc, vc = (randn(2, 32, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    one = torch.ones((), device=device)
    with pytest.raises(ValueError, match="k_descale/v_descale apply to float8_e4m3fn and int8 caches"):
        fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([3, 4], dtype=torch.int32, device=device),
                                     k_descale=one, v_descale=one)


def test_fp8_query_is_refused(device):
    kq, ks = _fp8_cache(device)
    q = randn(2, 1, 4, 32, dtype=torch.float16, device=device).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="fp8 queries are not supported"):
        fmha.flash_attn_with_kvcache(q, kq, kq.clone(), cache_seqlens=torch.tensor([3, 4], dtype=torch.int32,
                                                                                   device=device),
                                     k_descale=ks[None], v_descale=ks[None])
