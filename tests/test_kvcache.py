"""flash_attn_with_kvcache against a float64 reference built from the cache's own contents:
contiguous and paged caches (several page sizes), in-place append with rotary embeddings
(both styles), GQA, windows, softcap, ALiBi, leftpad and cache_batch_idx, fp8/int8 caches
with per-head and per-token scales; split-KV on the GPU; merge_attentions; quantize_kv_cache;
bad input.  Inputs are built on the CPU, the call runs on `device` with NaN-filled outputs
and workspace, and the caches come back to the CPU to be checked."""

import math

import pytest
import torch

import fmha
from conftest import OUT_TOL, assert_close, assert_lse_close, dtype_id, poisoned_outputs, randn


def on(device, *xs):
    """xs moved to device (None stays None)."""
    return [None if x is None else x.to(device) for x in xs]


def kvcache_call(device, q, kc, vc, *, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                 cache_batch_idx=None, cache_leftpad=None, block_table=None, alibi_slopes=None, k_scale=None,
                 v_scale=None, **kw):
    """flash_attn_with_kvcache on `device` from CPU tensors, outputs and workspace poisoned;
    returns (out, lse) and the caches (and scales) after the call, all on the CPU."""
    args = on(device, q, kc, vc, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, alibi_slopes, k_scale, v_scale)
    (q_, kc_, vc_, k_, v_, cos_, sin_, seqlens_, idx_, leftpad_, table_, slopes_, ks_, vs_) = args
    with poisoned_outputs(module=fmha.kvcache):
        out, lse = fmha.flash_attn_with_kvcache(
            q_, kc_, vc_, k_, v_, rotary_cos=cos_, rotary_sin=sin_, cache_seqlens=seqlens_, cache_batch_idx=idx_,
            cache_leftpad=leftpad_, block_table=table_, alibi_slopes=slopes_, k_scale=ks_, v_scale=vs_,
            return_softmax_lse=True, **kw)
    assert torch.isfinite(out).all() and not torch.isnan(lse).any(), "NaN/inf in the outputs"
    back = [None if x is None else x.cpu() for x in (kc_, vc_, ks_, vs_)]
    return out.cpu(), lse.cpu(), back


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------


def rotary_ref(x, cos, sin, positions, interleaved):
    """x (..., n, D) rotated at positions (n,), float64."""
    half = cos.shape[1]
    c, s = cos.double()[positions], sin.double()[positions]  # (n, half)
    x = x.double().clone()
    if interleaved:
        a, b = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, a * s + b * c
    return x


class Cache:
    """A contiguous or paged cache and how sequence b's positions map into it."""

    def __init__(self, k, v, block_table=None, batch_idx=None, k_scale=None, v_scale=None):
        self.k, self.v, self.block_table, self.batch_idx = k, v, block_table, batch_idx
        self.k_scale, self.v_scale = k_scale, v_scale

    def where(self, b, pos):
        if self.block_table is not None:
            page = self.k.shape[1]
            return int(self.block_table[b, pos // page]), pos % page
        return (int(self.batch_idx[b]) if self.batch_idx is not None else b), pos

    def rows(self, t, scale, b, positions):
        """(n, Hk, D) float64 values of positions of sequence b, scaled back."""
        out = []
        for pos in positions:
            o, r = self.where(b, pos)
            row = t[o, r].double()
            if scale is not None:  # per head (Hk,) or per token (.., .., Hk)
                row = row * (scale.double() if scale.dim() == 1 else scale[o, r].double())[:, None]
            out.append(row)
        return torch.stack(out) if out else t.new_zeros((0,) + tuple(t.shape[2:]), dtype=torch.float64)


def attention_ref(q, keys, values, scale, causal, window, softcap, slopes):
    """q (Sq, Hq, D), keys/values (Sk, Hk, D) float64 -> out (Sq, Hq, D), lse (Hq, Sq)."""
    sq, hq, _ = q.shape
    sk, hk, _ = keys.shape
    g = hq // hk
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, keys) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    off = sk - sq
    if slopes is not None:
        s = s - slopes.double()[:, None, None] * (i + off - j).abs()
    left, right = window[0], 0 if causal else window[1]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i + off - left
    if right >= 0:
        visible &= j <= i + off + right
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isneginf(lse)[..., None], 0.0, torch.exp(s - lse[..., None].clamp(min=-1e300)))
    out = torch.einsum("hij,jhd->ihd", p, values)
    return out, lse


def expected_outputs(q, cache, cache_seqlens, seqlen_new, leftpad, rotary, causal, window, softcap, slopes,
                     scale, round_rotated_q=False):
    """Reference out (B, Sq, Hq, D) and lse (B, Hq, Sq) from the cache as it is now.
    round_rotated_q: the rotated q is rounded to q's dtype, as the GPU tensor-core kernel
    (and flash-attn) rounds it before q.k; the CPU keeps it in fp32."""
    B, sq, hq, d = q.shape
    outs, lses = [], []
    for b in range(B):
        filled = int(cache_seqlens[b])
        start = int(leftpad[b]) if leftpad is not None else 0
        positions = range(start, filled + seqlen_new)
        keys = cache.rows(cache.k, cache.k_scale, b, positions)
        values = cache.rows(cache.v, cache.v_scale, b, positions)
        qb = q[b].double()
        if rotary is not None:
            cos, sin, interleaved = rotary
            per_row = causal or window != (-1, -1)
            pos = torch.arange(sq) + filled if per_row else torch.full((sq,), filled)
            qb = rotary_ref(qb.transpose(0, 1), cos, sin, pos, interleaved).transpose(0, 1)
            if round_rotated_q:
                qb = qb.to(q.dtype).double()
        sl = None if slopes is None else (slopes[b] if slopes.dim() == 2 else slopes)
        o, l = attention_ref(qb, keys, values, scale, causal, window, softcap, sl)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


# ---------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------


def make_paged(k, v, page, batch, capacity, generator_seed=0):
    """Scatter contiguous (B, capacity, Hk, D) caches into shuffled pages of `page` rows."""
    pages_per_seq = capacity // page
    num_pages = batch * pages_per_seq + 3  # spare pages nobody uses
    g = torch.Generator().manual_seed(generator_seed)
    order = torch.randperm(num_pages, generator=g)[: batch * pages_per_seq].to(torch.int32)
    table = order.reshape(batch, pages_per_seq)
    kp = torch.zeros((num_pages, page) + tuple(k.shape[2:]), dtype=k.dtype)
    vp = torch.zeros_like(kp)
    for b in range(batch):
        for i in range(pages_per_seq):
            kp[table[b, i]] = k[b, i * page:(i + 1) * page]
            vp[table[b, i]] = v[b, i * page:(i + 1) * page]
    return kp, vp, table


CASES = [
    # name, dtype, Hq, Hk, D, Sq, S_new, capacity, page, kwargs
    ("decode-gqa", torch.bfloat16, 8, 2, 64, 1, 0, 96, None, {}),
    ("append-causal-rotary", torch.float16, 4, 4, 64, 3, 3, 80, None, dict(causal=True, rotary="interleaved")),
    ("append-neox-gqa", torch.bfloat16, 8, 2, 128, 2, 2, 64, None, dict(causal=True, rotary="neox")),
    ("paged16-append", torch.bfloat16, 4, 1, 64, 4, 4, 128, 16, dict(causal=True, rotary="neox")),
    ("paged48-window", torch.float16, 4, 2, 32, 5, 5, 96, 48, dict(window_size=(7, 0))),
    ("paged256-long", torch.bfloat16, 4, 4, 64, 1, 1, 512, 256, dict(causal=True)),
    ("softcap-alibi", torch.float32, 4, 2, 40, 3, 0, 64, None, dict(softcap=8.0, alibi=True, causal=True)),
    ("batch-idx-leftpad", torch.float16, 4, 2, 64, 2, 2, 70, None, dict(batch_idx=True, leftpad=True,
                                                                          rotary="interleaved")),
    ("noncausal-rotary", torch.bfloat16, 4, 4, 64, 4, 0, 50, None, dict(rotary="interleaved")),
    # Split-KV, several query tiles per KV head, every head-dim instance (64, 128, 256; 80 pads).
    ("split-gqa-long", torch.bfloat16, 32, 8, 128, 1, 1, 1200, None, dict(num_splits=5, causal=True)),
    ("chunked-prefill", torch.bfloat16, 16, 2, 128, 9, 9, 300, None, dict(causal=True, rotary="neox")),
    ("paged16-split-d256", torch.float16, 8, 2, 256, 2, 1, 512, 16, dict(num_splits=7, causal=True)),
    ("d80-window-leftpad", torch.float16, 4, 1, 80, 3, 2, 200, None, dict(window_size=(40, 0), leftpad=True,
                                                                          num_splits=3)),
]


@pytest.mark.parametrize("name,dtype,hq,hk,d,sq,snew,capacity,page,kw", CASES, ids=[c[0] for c in CASES])
def test_kvcache(device, name, dtype, hq, hk, d, sq, snew, capacity, page, kw):
    B = 3
    causal, window = kw.get("causal", False), kw.get("window_size", (-1, -1))
    k0, v0 = randn(B, capacity, hk, d, dtype=dtype), randn(B, capacity, hk, d, dtype=dtype)
    q = randn(B, sq, hq, d, dtype=dtype)
    cache_seqlens = torch.tensor([0, 17, capacity - snew][:B], dtype=torch.int32)
    knew = randn(B, snew, hk, d, dtype=dtype) if snew else None
    vnew = randn(B, snew, hk, d, dtype=dtype) if snew else None
    rotary = None
    if "rotary" in kw:
        rot_dim = d // 2 if kw["rotary"] == "neox" else d
        theta = torch.arange(capacity + 4)[:, None] / (10000 ** (torch.arange(rot_dim // 2) * 2 / rot_dim))
        rotary = (theta.cos().to(dtype), theta.sin().to(dtype), kw["rotary"] == "interleaved")
    slopes = torch.rand(B, hq) if kw.get("alibi") else None
    leftpad = torch.tensor([0, 5, 2][:B], dtype=torch.int32) if kw.get("leftpad") else None
    batch_idx = None
    kc, vc = k0.clone(), v0.clone()
    if kw.get("batch_idx"):
        batch_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
        kc, vc = torch.empty_like(k0), torch.empty_like(v0)
        kc[batch_idx.long()], vc[batch_idx.long()] = k0, v0
    block_table = None
    if page is not None:
        kc, vc, block_table = make_paged(k0, v0, page, B, capacity)
    before_k, before_v = kc.clone(), vc.clone()

    out, lse, (kc, vc, _, _) = kvcache_call(
        device, q, kc, vc, k=knew, v=vnew, rotary_cos=None if rotary is None else rotary[0],
        rotary_sin=None if rotary is None else rotary[1], cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx,
        cache_leftpad=leftpad, block_table=block_table, causal=causal, window_size=window,
        softcap=kw.get("softcap", 0.0), rotary_interleaved=rotary[2] if rotary else True, alibi_slopes=slopes,
        num_splits=kw.get("num_splits", 0))
    cache = Cache(kc, vc, block_table, batch_idx)

    # The append: new rows hold the (rotated) new keys and values; nothing else changed.
    changed = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for b in range(B):
        for t in range(snew):
            pos = int(cache_seqlens[b]) + t
            o, r = cache.where(b, pos)
            changed[o, r] = True
            want_k = knew[b, t].double()
            if rotary is not None:
                want_k = rotary_ref(want_k[None].transpose(0, 1), rotary[0], rotary[1], torch.tensor([pos]),
                                    rotary[2])[:, 0]
            assert_close(kc[o, r], want_k, OUT_TOL[dtype], f"appended key (b={b}, t={t})")
            assert torch.equal(vc[o, r], vnew[b, t]), f"appended value (b={b}, t={t})"
    assert torch.equal(kc[~changed], before_k[~changed]) and torch.equal(vc[~changed], before_v[~changed])

    scale = d ** -0.5
    ref_out, ref_lse = expected_outputs(q, cache, cache_seqlens, snew, leftpad, rotary, causal, window,
                                        kw.get("softcap", 0.0), slopes, scale,
                                        round_rotated_q=device != "cpu" and dtype != torch.float32)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse, ref_lse, 1e-5 if dtype == torch.float32 else 1e-4)
    # The empty cache (batch 0, no new tokens) sees nothing: out 0, lse -inf.
    if snew == 0:
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8], ids=["fp8", "int8"])
@pytest.mark.parametrize("scaling", ["head", "token"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_quantized_cache(device, qdtype, scaling, paged, num_splits, dtype):
    B, hq, hk, d, capacity, snew = 2, 8, 2, 64, 64, 2
    k0, v0 = randn(B, capacity, hk, d, dtype=dtype), randn(B, capacity, hk, d, dtype=dtype)
    kq, ks = fmha.quantize_kv_cache(k0, qdtype, scaling)
    vq, vs = fmha.quantize_kv_cache(v0, qdtype, scaling)
    # Round trip: int8 is off by at most half a step (0.5 * scale) per element; fp8 e4m3 keeps
    # 3 mantissa bits, a relative error of at most 2^-4 per element (6% norm-wise bound).
    s = ks[None, None, :, None] if scaling == "head" else ks[..., None]
    deq = kq.float() * s
    if qdtype == torch.int8:
        assert ((deq - k0.float()).abs() <= 0.5 * s + 1e-6).all()  # + fp32 rounding of q * s
    # Norm-wise: fp8 within 2^-4; int8 per-head steps are amax / 127 with amax up to ~5 sigma,
    # a uniform rounding error of step / sqrt(12) ~ 0.011 sigma (0.015 leaves room).
    assert_close(deq, k0, 0.0625 if qdtype == torch.float8_e4m3fn else 0.015, "quantize_kv_cache round trip")

    block_table = None
    if paged:
        kq, vq, block_table = make_paged(kq.view(torch.uint8) if qdtype != torch.int8 else kq,
                                         vq.view(torch.uint8) if qdtype != torch.int8 else vq, 16, B, capacity)
        if qdtype != torch.int8:
            kq, vq = kq.view(qdtype), vq.view(qdtype)
        if scaling == "token":  # per-token scales follow the rows into the pages
            ks_p = torch.zeros(kq.shape[:3])
            vs_p = torch.zeros(kq.shape[:3])
            for b in range(B):
                for i in range(capacity // 16):
                    ks_p[block_table[b, i]] = ks[b, i * 16:(i + 1) * 16]
                    vs_p[block_table[b, i]] = vs[b, i * 16:(i + 1) * 16]
            ks, vs = ks_p, vs_p
    q = randn(B, snew, hq, d, dtype=dtype)
    knew, vnew = randn(B, snew, hk, d, dtype=dtype), randn(B, snew, hk, d, dtype=dtype)
    cache_seqlens = torch.tensor([30, 62], dtype=torch.int32)
    out, lse, (kq, vq, ks, vs) = kvcache_call(device, q, kq, vq, k=knew, v=vnew, cache_seqlens=cache_seqlens,
                                              block_table=block_table, causal=True, k_scale=ks, v_scale=vs,
                                              num_splits=num_splits)
    cache = Cache(kq, vq, block_table, None, ks, vs)
    # Appended tokens were quantized in place: within a quantization step of the new values.
    for b in range(B):
        for t in range(snew):
            pos = int(cache_seqlens[b]) + t
            got = cache.rows(kq, ks, b, [pos])[0]
            assert_close(got, knew[b, t], 0.05 if qdtype == torch.float8_e4m3fn else 0.02, "appended quantized key")
    ref_out, ref_lse = expected_outputs(q, cache, cache_seqlens, snew, None, None, True, (-1, -1), 0.0, None,
                                        d ** -0.5)
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse, ref_lse, 1e-4)


@pytest.mark.parametrize("q_mul", [1e5, 1e-6], ids=["q_past_fp16_max", "q_under_fp16_normal"])
def test_fp8_cache_bf16_query_range(device, q_mul):
    """fp8 caches run their mma in fp16, bf16 queries included: q outside fp16's range (past
    65504, or under 2^-14 where fp16 loses bits) must be scaled into it first.  The softmax
    scale brings the scores back to O(1), so q's precision shows in the output."""
    B, hq, hk, d, n = 2, 8, 2, 128, 300
    q = (randn(B, 1, hq, d, dtype=torch.float32) * q_mul).to(torch.bfloat16)
    k, ks = fmha.quantize_kv_cache(randn(B, n, hk, d, dtype=torch.bfloat16))
    v, vs = fmha.quantize_kv_cache(randn(B, n, hk, d, dtype=torch.bfloat16))
    scale = d ** -0.5 / q_mul
    cache_seqlens = torch.tensor([n, 77], dtype=torch.int32)
    out, lse, _ = kvcache_call(device, q, k, v, cache_seqlens=cache_seqlens, k_scale=ks, v_scale=vs,
                               softmax_scale=scale)
    ref_out, ref_lse = expected_outputs(q, Cache(k, v, None, None, ks, vs), cache_seqlens, 0, None, None, False,
                                        (-1, -1), 0.0, None, scale)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_lse_close(lse, ref_lse, 1e-4)


@pytest.mark.parametrize("qdtype,scaling", [(torch.float8_e4m3fn, "token"), (torch.int8, "head")],
                         ids=["fp8_token", "int8_head"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mods", ["plain", "softcap_alibi"])
@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_quantized_cache_block_counts(device, qdtype, scaling, d, mods, num_splits):
    """8-bit caches: the GPU kernel deals a split's 16-row cache blocks round its warps (12
    in the wide kernel of sm90/sm100, 4 otherwise), so in short splits most warps get none
    and the rest uneven counts; idle warps must merge as empty, also with softcap and ALiBi.
    The lengths give every block count from 1 to 9; split counts 2 and 7 cut them unevenly."""
    hq, hk = 4, 2
    lengths = [1, 16, 17, 33, 49, 80, 96, 112, 113, 130]
    B, capacity = len(lengths), 144
    q = randn(B, 1, hq, d, dtype=torch.bfloat16)
    k, ks = fmha.quantize_kv_cache(randn(B, capacity, hk, d, dtype=torch.bfloat16), qdtype, scaling)
    v, vs = fmha.quantize_kv_cache(randn(B, capacity, hk, d, dtype=torch.bfloat16), qdtype, scaling)
    softcap, slopes = (5.0, torch.rand(hq) * 0.2) if mods == "softcap_alibi" else (0.0, None)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse, _ = kvcache_call(device, q, k, v, cache_seqlens=cache_seqlens, k_scale=ks, v_scale=vs,
                               softcap=softcap, alibi_slopes=slopes, num_splits=num_splits)
    ref_out, ref_lse = expected_outputs(q, Cache(k, v, None, None, ks, vs), cache_seqlens, 0, None, None, False,
                                        (-1, -1), softcap, slopes, d ** -0.5)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_lse_close(lse, ref_lse, 1e-4)


@pytest.mark.parametrize("cache_kind", ["plain", "fp8", "int8_token_large", "fp8_token_large"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_rising_scores(device, cache_kind, num_splits, dtype):
    """Scores that keep rising along the cache, by jumps both under and over 2^8 in
    probability: the GPU kernel raises its running max only on jumps past 2^8 (kLazyMax) and
    otherwise keeps a stale max with probabilities up to 2^8; both must give the exact softmax.
    int8_token_large: values near fp16's limit, so per-token v_scale passes 255 and a
    probability of 2^8 times it would overflow fp16.  fp8_token_large: the same for fp8
    with bf16 queries (values past fp16's range), whose mma runs in fp16 too."""
    B, hq, hk, d, n = 1, 4, 1, 64, 700
    q = randn(B, 1, hq, d, dtype=dtype)
    k = randn(B, n, hk, d, dtype=torch.float32)
    # Key j carries ramp[j] of q's mean direction: every head's score rises steadily along
    # the cache (about 0.3 per 16-key block in log2 units) and jumps twice (about 9 and 17).
    direction = q[0, 0].float().mean(0)
    ramp = torch.linspace(0.0, 1.0, n) * 10.0
    ramp[300:] += 6.0
    ramp[500:] += 12.0
    k = (k + ramp[None, :, None, None] * direction / direction.norm() * 2.0).to(dtype)
    v = randn(B, n, hk, d, dtype=dtype)
    extra, block_table = {}, None
    if cache_kind == "fp8":
        k, ks = fmha.quantize_kv_cache(k)
        v, vs = fmha.quantize_kv_cache(v)
        extra = dict(k_scale=ks, v_scale=vs)
    elif cache_kind == "int8_token_large":
        # Most values clamp at +-65000: v_scale near 512, so any probability above 2^7
        # (every stale stretch of the ramp reaches one) would overflow fp16 times it.
        v = (v.float() * 40000.0).clamp(-65000.0, 65000.0).to(dtype)
        k, ks = fmha.quantize_kv_cache(k, torch.int8, "token")
        v, vs = fmha.quantize_kv_cache(v, torch.int8, "token")
        assert vs.min() > 255.0, "every v_scale must pass 255"
        extra = dict(k_scale=ks, v_scale=vs)
    elif cache_kind == "fp8_token_large":
        if dtype != torch.bfloat16:
            pytest.skip("fp16 values cannot take an fp8 v_scale past 255 (65504 / 448 = 146)")
        v = (v.float() * 1e6).clamp(-1.3e6, 1.3e6).to(dtype)  # past fp16's range
        k, ks = fmha.quantize_kv_cache(k, torch.float8_e4m3fn, "token")
        v, vs = fmha.quantize_kv_cache(v, torch.float8_e4m3fn, "token")
        assert vs.min() > 255.0, "every v_scale must pass 255"
        extra = dict(k_scale=ks, v_scale=vs)
    else:
        ks = vs = None
    cache_seqlens = torch.tensor([n], dtype=torch.int32)
    out, lse, _ = kvcache_call(device, q, k, v, cache_seqlens=cache_seqlens, num_splits=num_splits, **extra)
    cache = Cache(k, v, block_table, None, ks, vs)
    ref_out, ref_lse = expected_outputs(q, cache, cache_seqlens, 0, None, None, False, (-1, -1), 0.0, None,
                                        d ** -0.5)
    assert ref_lse.max() > 20.0, "the ramp should dominate the scores"
    assert_close(out, ref_out, OUT_TOL[dtype], "out")
    assert_lse_close(lse, ref_lse, 1e-4)


def test_merge_attentions_equals_full_attention(device):
    q = randn(2, 7, 4, 32, dtype=torch.float32, device=device)
    k, v = (randn(2, 50, 2, 32, dtype=torch.float32, device=device) for _ in range(2))
    full, full_lse, _ = fmha.flash_attn_func(q, k, v, return_attn_probs=True)
    parts = [fmha.flash_attn_func(q, k[:, a:b], v[:, a:b], return_attn_probs=True) for a, b in
             [(0, 13), (13, 40), (40, 50)]]
    out, lse = fmha.merge_attentions([p[0] for p in parts], [p[1] for p in parts])
    assert_close(out, full, 1e-5, "merged out")
    assert_close(lse, full_lse, 1e-6, "merged lse")


def test_merge_attentions_empty_parts_and_gradients(device):
    outs = torch.randn(3, 2, 5, 4, 8, dtype=torch.float64, device=device, requires_grad=True)
    lses = torch.randn(3, 2, 4, 5, dtype=torch.float64, device=device)
    lses[1, :, :, 0] = -math.inf          # one empty part
    lses[:, 0, 1, 2] = -math.inf          # a row empty in every part
    lses.requires_grad_(True)
    out, lse = fmha.merge_attentions(outs, lses)
    assert torch.isneginf(lse[0, 1, 2]) and (out[0, 2, 1] == 0).all()
    assert torch.isfinite(out).all()
    (out.sum() + torch.where(torch.isneginf(lse), 0.0, lse).sum()).backward()
    assert torch.isfinite(outs.grad).all() and torch.isfinite(lses.grad).all()
    # Gradients against finite differences on rows without -inf.
    o2 = torch.randn(2, 1, 3, 2, 4, dtype=torch.float64, device=device, requires_grad=True)
    l2 = torch.randn(2, 1, 2, 3, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fmha.merge_attentions(a, b), (o2, l2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_kvcache_matches_flash_attn_func(device, dtype):
    # Without the cache machinery the answer is the plain forward over each cache prefix.
    # The CPU runs one code path for both (bitwise equal); on the GPU they are different
    # kernels (split-KV decode and the training forward), equal up to rounding.
    k, v = randn(2, 40, 2, 64, dtype=dtype, device=device), randn(2, 40, 2, 64, dtype=dtype, device=device)
    q = randn(2, 3, 4, 64, dtype=dtype, device=device)
    out = fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor([40, 25], dtype=torch.int32,
                                                                           device=device), causal=True)
    for b, n in enumerate((40, 25)):
        ref = fmha.flash_attn_func(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
        if device == "cpu":
            assert torch.equal(out[b:b + 1], ref)
        else:
            assert_close(out[b:b + 1], ref, OUT_TOL[dtype], "decode vs forward")


# One new token per sequence with GQA: the CPU decode runs a KV head's query heads through the
# forward's tile kernel as rows of one call (shared among threads when there are fewer KV heads
# than threads: B = 1, one KV head); each row must still equal flash_attn_func's bit for bit.
# 12 heads per KV head are one call of under kLanes rows on AVX-512, more than kLanes on AVX2,
# and two calls on the generic ISA (FMHA_CPU_ISA).
@pytest.mark.parametrize("heads", [(24, 2), (6, 1)], ids=["group12", "one_kv_head"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_kvcache_one_token_matches_flash_attn_func(device, dtype, causal, heads):
    hq, hk = heads
    batch, lens = (3, (70, 33, 1)) if hk == 2 else (1, (70,))
    k, v = (randn(batch, 70, hk, 64, dtype=dtype, device=device) for _ in range(2))
    q = randn(batch, 1, hq, 64, dtype=dtype, device=device)
    out = fmha.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=device),
                                       causal=causal)
    for b, n in enumerate(lens):
        ref = fmha.flash_attn_func(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=causal)
        if device == "cpu":
            assert torch.equal(out[b:b + 1], ref), f"sequence {b}: decode row differs from the forward's"
        else:
            assert_close(out[b:b + 1], ref, OUT_TOL[dtype], "decode vs forward")


def _call_args():
    return dict(q=torch.randn(2, 1, 4, 32, dtype=torch.float16), k_cache=torch.randn(2, 32, 2, 32, dtype=torch.float16),
                v_cache=torch.randn(2, 32, 2, 32, dtype=torch.float16),
                cache_seqlens=torch.tensor([3, 4], dtype=torch.int32))


def _call(**args):
    return fmha.flash_attn_with_kvcache(**{**_call_args(), **args})


ERRORS = [
    ("missing cache_seqlens", dict(cache_seqlens=None), ValueError, "cache_seqlens"),
    ("cache_seqlens dtype", dict(cache_seqlens=torch.tensor([3, 4])), TypeError, "cache_seqlens"),
    ("capacity", dict(cache_seqlens=torch.tensor([3, 33], dtype=torch.int32)), ValueError, "capacity"),
    ("negative seqlen", dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "cache_seqlens"),
    ("k without v", dict(k=torch.randn(2, 1, 2, 32, dtype=torch.float16)), ValueError, "k and v"),
    ("cache dtype", dict(k_cache=torch.randn(2, 32, 2, 32), v_cache=torch.randn(2, 32, 2, 32)), TypeError, "k_cache"),
    ("head dim", dict(k_cache=torch.randn(2, 32, 2, 16, dtype=torch.float16),
                      v_cache=torch.randn(2, 32, 2, 16, dtype=torch.float16)), ValueError, "head dimension"),
    ("heads", dict(k_cache=torch.randn(2, 32, 3, 32, dtype=torch.float16),
                   v_cache=torch.randn(2, 32, 3, 32, dtype=torch.float16)), ValueError, "multiple"),
    ("page size", dict(block_table=torch.zeros(2, 2, dtype=torch.int32),
                       k_cache=torch.randn(4, 24, 2, 32, dtype=torch.float16),
                       v_cache=torch.randn(4, 24, 2, 32, dtype=torch.float16)), ValueError, "multiple of 16"),
    ("block table range", dict(block_table=torch.tensor([[0], [7]], dtype=torch.int32),
                               k_cache=torch.randn(4, 16, 2, 32, dtype=torch.float16),
                               v_cache=torch.randn(4, 16, 2, 32, dtype=torch.float16)), ValueError, "block_table"),
    ("batch idx range", dict(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)), ValueError, "cache_batch_idx"),
    ("leftpad", dict(cache_leftpad=torch.tensor([0, 5], dtype=torch.int32)), ValueError, "cache_leftpad"),
    ("quantized without scales", dict(k_cache=torch.zeros(2, 32, 2, 32, dtype=torch.int8),
                                      v_cache=torch.zeros(2, 32, 2, 32, dtype=torch.int8)), ValueError, "k_scale"),
    ("rotary length", dict(rotary_cos=torch.ones(3, 16, dtype=torch.float16),
                           rotary_sin=torch.ones(3, 16, dtype=torch.float16)), ValueError, "rotary"),
    ("num_splits", dict(num_splits=-1), ValueError, "num_splits"),
]


# Checked on the host from device-resident metadata: the CPU backend only (GPU kernels clamp).
HOST_METADATA = {"capacity", "negative seqlen", "block table range", "batch idx range", "leftpad", "rotary length"}


@pytest.mark.parametrize("what,over,exc,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_kvcache_errors(device, what, over, exc, match):
    if device != "cpu" and what in HOST_METADATA:
        pytest.skip("device-resident metadata is clamped on the GPU, not read (test_gpu_metadata_is_clamped)")
    over = {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in over.items()}
    with pytest.raises(exc, match=match):
        _call(**{**{n: x.to(device) for n, x in _call_args().items() if n not in over}, **over})


def test_gpu_metadata_is_clamped(device):
    """Lengths past the capacity, pages past num_blocks, leftpad past the length and cache
    rows past the batch cannot make a GPU kernel read or write outside the cache: every
    index is clamped (compute-sanitizer runs this under tools/sanitize_cases.py)."""
    if device == "cpu":
        pytest.skip("the CPU backend rejects bad metadata instead (test_kvcache_errors)")
    kc, vc = randn(4, 32, 2, 64, dtype=torch.bfloat16, device=device), randn(4, 32, 2, 64, dtype=torch.bfloat16,
                                                                            device=device)
    q = randn(2, 1, 4, 64, dtype=torch.bfloat16, device=device)
    knew, vnew = (randn(2, 1, 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2))
    i32 = dict(dtype=torch.int32, device=device)
    cases = [dict(cache_seqlens=torch.tensor([1 << 30, -5], **i32)),
             dict(cache_seqlens=torch.tensor([3, 4], **i32), cache_leftpad=torch.tensor([9, -1], **i32)),
             dict(cache_seqlens=torch.tensor([3, 4], **i32), cache_batch_idx=torch.tensor([7, -3], **i32)),
             dict(cache_seqlens=torch.tensor([20, 31], **i32), block_table=torch.tensor([[0, 99], [-4, 3]], **i32),
                  k_cache=kc.view(8, 16, 2, 64), v_cache=vc.view(8, 16, 2, 64))]
    for case in cases:
        args = {"k_cache": kc, "v_cache": vc, **case}
        out = fmha.flash_attn_with_kvcache(q, k=knew, v=vnew, causal=True, num_splits=2, **args)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()


def test_kvcache_under_torch_compile(device):
    kc, vc = torch.randn(2, 64, 2, 32, device=device), torch.randn(2, 64, 2, 32, device=device)
    q, k, v = (torch.randn(2, 1, h, 32, device=device) for h in (4, 2, 2))
    seqlens = torch.tensor([5, 9], dtype=torch.int32, device=device)
    step = torch.compile(lambda q, kc, vc, k, v: fmha.flash_attn_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=seqlens, causal=True), fullgraph=True)
    kc2, vc2 = kc.clone(), vc.clone()
    out = step(q, kc, vc, k, v)
    ref = fmha.flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=seqlens, causal=True)
    assert torch.equal(out, ref) and torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_kvcache_is_forward_only(device):
    # An input that requires grad makes the output require grad, and a backward through it
    # raises (it would otherwise lose attention's share of the gradient without a word);
    # under no_grad, and without such inputs, nothing is tied to autograd.
    q = randn(2, 3, 4, 32, dtype=torch.float16, device=device)
    kc, vc = (randn(2, 40, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    lengths = torch.tensor([17, 40], dtype=torch.int32, device=device)
    plain = fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=True)
    assert not plain.requires_grad
    q.requires_grad_()
    with torch.no_grad():
        assert not fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=True).requires_grad
    out = fmha.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=True)
    assert out.requires_grad and torch.equal(out.detach(), plain)
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()
