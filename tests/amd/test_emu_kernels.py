"""fmha's HIP attention kernels, compiled by clang-19 for gfx942 and gfx90a, executed on the
emulator (tools/amdemu) and compared with a float64 reference at the dtype's tolerance.

The host side mimics csrc/hip_fmha/dispatch.hip (tools/amdemu/fmha_launch.py).  The quick
set runs by default; FMHA_TEST_FULL=1 adds the rest."""

import pytest

from amd_helpers import ARCHS, FULL, np, requires_toolchain

pytestmark = requires_toolchain

from amdemu import emu  # noqa: E402
from amdemu import fmha_launch as L  # noqa: E402

TOL = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 2e-5}

# name: (Case arguments, quick?).  Lengths are chosen against the tiles: forward blocks of
# 128 (D <= 96) or 64 query rows and 64- or 32-key blocks; backward blocks of 64 keys.
CASES = {
    # causal (bottom-right) with Sq > Sk: rows 0..19 see no key (output 0, LSE -inf), GQA 2:1
    "causal_masked_rows_gqa": (dict(dtype="bf16", seqs=[(70, 50)], Hq=2, Hk=1, D=64, causal=True), True),
    # 16x16 MFMA path (D = 128): two 64-row query blocks, lengths off the tile
    "d128_fp16": (dict(dtype="fp16", seqs=[(70, 45)], Hq=1, Hk=1, D=128), True),
    # sliding window, top-left, two sequences
    "window_top_left": (dict(dtype="fp16", seqs=[(33, 70)] * 2, Hq=2, Hk=2, D=32, window=(5, 3), top_left=True),
                        True),
    "softcap_alibi": (dict(dtype="bf16", seqs=[(40, 70)], Hq=2, Hk=1, D=64, softcap=3.0, alibi=True), True),
    "dropout": (dict(dtype="bf16", seqs=[(40, 70)], Hq=2, Hk=1, D=64, dropout_p=0.3, seed=99, offset=7), True),
    # varlen: an empty sequence, seqused_k, a padded head dim (40 -> the 64 kernel), and 3
    # rows before and 5 after the sequences that zero_outside_kernel must clear
    "varlen_seqused": (dict(dtype="fp16", seqs=[(17, 30), (0, 5), (40, 66)], Hq=2, Hk=1, D=40, varlen=True,
                            seqused_k=[25, 5, 60], causal=True, pad=(3, 5)), True),
    # fp32: the vector-ALU row-wise kernels of dispatch.hip (rowwise_fwd, rowwise_bwd_dq/dkdv)
    "fp32_rowwise_features": (dict(dtype="fp32", seqs=[(9, 13)], Hq=2, Hk=1, D=24, causal=True, softcap=3.0,
                                   alibi=True, dropout_p=0.2), True),
    "fp32_varlen": (dict(dtype="fp32", seqs=[(5, 9), (12, 7)], Hq=2, Hk=2, D=40, varlen=True, window=(4, 4),
                         pad=(2, 3)), False),
    # lengths exactly on the tiles, several query and key blocks, causal
    "multi_block_exact": (dict(dtype="bf16", seqs=[(256, 192)], Hq=1, Hk=1, D=64, causal=True), False),
    "d96_mqa": (dict(dtype="bf16", seqs=[(50, 90)], Hq=4, Hk=1, D=96), False),
    "d192_window": (dict(dtype="fp16", seqs=[(30, 40)], Hq=1, Hk=1, D=192, window=(10, -1)), False),
    "d256_dropout_softcap": (dict(dtype="bf16", seqs=[(20, 36)], Hq=1, Hk=1, D=256, dropout_p=0.2, softcap=5.0),
                             False),
    "varlen_dropout_alibi": (dict(dtype="bf16", seqs=[(20, 9), (33, 40)], Hq=2, Hk=2, D=64, varlen=True,
                                  dropout_p=0.15, alibi=True), False),
}


def selected(quick_only=True):
    return [n for n, (_, q) in CASES.items() if q or FULL]


def case(name):
    kw = dict(CASES[name][0])
    seqs = kw.pop("seqs")
    return L.Case(kw.pop("dtype"), seqs, kw.pop("Hq"), kw.pop("Hk"), kw.pop("D"), **kw)


def close(name, got, want, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(got, want, atol=tol * max(1.0, float(np.abs(want).max(initial=0))), rtol=tol,
                               err_msg=name)


def check_fwd(c, out, lse):
    ro, rl = c.reference()
    close("out", out, ro, c.dtype)
    fin = np.isfinite(rl)
    assert (np.isneginf(lse) == np.isneginf(rl)).all(), "LSE of fully masked rows"
    np.testing.assert_allclose(lse[fin], rl[fin], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", selected())
def test_forward(arch, name):
    c = case(name)
    out, lse, run = L.fwd(arch, c)
    check_fwd(c, out, lse)
    assert all(m.partial_buffer_accesses == 0 for m in run.machines)


def backward_params():
    """(name, deterministic): every case both ways with FMHA_TEST_FULL=1, else each case
    on one dQ path (the deterministic one for three of them)."""
    out = []
    for n in selected():
        for det in (False, True):
            if FULL or det == (n in ("d128_fp16", "window_top_left", "varlen_seqused")):
                out.append(pytest.param(n, det, id=f"{n}-{'deterministic' if det else 'atomic_dq'}"))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name,deterministic", backward_params())
def test_backward(arch, name, deterministic):
    c = case(name)
    dq, dk, dv, run = L.bwd(arch, c, deterministic=deterministic)
    _, _, rdq, rdk, rdv = c.reference(grads=True)
    for n, g, w in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        close(n, g, w, c.dtype)


@pytest.mark.parametrize("order", emu.Machine.ORDERS)
def test_forward_and_backward_under_every_wave_order(order):
    """Same results whichever wave of a workgroup runs first, with the LDS race check on."""
    c = case("causal_masked_rows_gqa")
    out, lse, _ = L.fwd("gfx942", c, order=order)
    check_fwd(c, out, lse)
    dq, dk, dv, _ = L.bwd("gfx942", c, order=order)
    _, _, rdq, rdk, rdv = c.reference(grads=True)
    for g, w in ((dq, rdq), (dk, rdk), (dv, rdv)):
        close("grad", g, w, c.dtype)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["dropout", "fp32_rowwise_features"] + (["varlen_seqused"] if FULL else []))
def test_probs_output(arch, name):
    """return_attn_probs: probs_kernel (dispatch.hip) after the forward, from its LSE."""
    c = case(name)
    out, lse, run = L.fwd(arch, c, probs=True)
    check_fwd(c, out, lse)
    close("probs", run.probs, c.reference(probs=True), c.dtype)


@pytest.mark.parametrize("arch", ARCHS)
def test_bitwise_reproducible_across_schedules(arch):
    """The forward always, and the backward with deterministic=True, give the same bits
    whatever order the workgroups and their waves run in (DESIGN.md: deterministic)."""
    c = case("window_top_left")  # 2 sequences x 2 heads, 2 key blocks: several workgroups per output
    schedules = [("sequential", "forward", 0), ("random", "random", 1), ("roundrobin", "reverse", 2)]
    fwds = [L.fwd(arch, c, order=o, wg_order=g, seed=s)[:2] for o, g, s in schedules]
    for out, lse in fwds[1:]:
        np.testing.assert_array_equal(out, fwds[0][0])
        np.testing.assert_array_equal(lse, fwds[0][1])
    bwds = [L.bwd(arch, c, deterministic=True, order=o, wg_order=g, seed=s)[:3] for o, g, s in schedules]
    for grads in bwds[1:]:
        for g, g0 in zip(grads, bwds[0]):
            np.testing.assert_array_equal(g, g0)


# ------------------------------------------------------------------------ broken variants

def _drop_barriers(ins):
    if ins.mnem == "s_barrier":
        ins.mnem, ins.ops, ins.mods = "s_nop", ["0"], {}


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_missing_barrier_is_caught(kernel):
    c = case("causal_masked_rows_gqa")
    with pytest.raises(emu.RaceError):
        if kernel == "fwd":
            L.fwd("gfx942", c, order="roundrobin", patch={"fwd_bf16_hdim64": _drop_barriers})
        else:
            L.bwd("gfx942", c, order="roundrobin", patch={"bwd_bf16_hdim64": _drop_barriers})


@pytest.mark.parametrize("arch", ARCHS)
def test_wrong_lane_exchange_in_source_is_caught(arch):
    """A source-level broken variant: row_reduce_sum (tile/mfma.h) starting its lane
    exchanges at lane offset 2N instead of N, so each query's row sum misses half its
    lanes.  Compiled from a patched copy of csrc/; the comparison must fail."""
    edit = {"hip_fmha/tile/mfma.h": ("for (int o = N; o < kWaveSize; o *= 2) x += lane_xor(x, o);",
                                     "for (int o = 2 * N; o < kWaveSize; o *= 2) x += lane_xor(x, o);")}
    c = case("causal_masked_rows_gqa")
    out, lse, _ = L.fwd(arch, c, patch={"fwd_bf16_hdim64": edit})
    with pytest.raises(AssertionError):
        check_fwd(c, out, lse)


def test_wrong_lds_offset_is_caught():
    """The forward with one K-tile read shifted by 8 bytes (4 elements) in its LDS offset:
    the comparison with the reference must fail."""
    state = {"done": False}

    def shift_read(ins):
        if not state["done"] and ins.mnem == "ds_read2_b64" and "offset1" in ins.mods:
            ins.mods["offset1"] = str(int(ins.mods["offset1"]) + 1)
            state["done"] = True
    c = case("causal_masked_rows_gqa")
    out, lse, _ = L.fwd("gfx942", c, patch={"fwd_bf16_hdim64": shift_read})
    assert state["done"]
    with pytest.raises(AssertionError):
        check_fwd(c, out, lse)


# ------------------------------------------------------------------------ decode

DECODE_CASES = {
    # contiguous bf16 cache, GQA 4:1 packed into one 16-row tile
    "plain_gqa": (dict(dtype="bf16", cache="plain", B=2, Sq=1, Hq=4, Hk=1, D=64, cache_seqlens=[37, 80]), True),
    # paged fp8 with per-token scales, 3 splits + combine, two query rows
    "paged_fp8_token_splits": (dict(dtype="fp16", cache="fp8", B=2, Sq=2, Hq=4, Hk=2, D=128, cache_seqlens=[40, 70],
                                    page_size=16, scaling="token", num_splits=3), True),
    # int8 per-head, left padding, softcap and ALiBi, 2 splits
    "int8_leftpad_softcap_alibi": (dict(dtype="bf16", cache="int8", B=1, Sq=3, Hq=2, Hk=2, D=64, cache_seqlens=[50],
                                        leftpad=[7], softcap=4.0, alibi=True, num_splits=2), True),
    # append two tokens with rotary (GPT-NeoX pairs) under a causal mask
    "append_rotary_causal": (dict(dtype="bf16", cache="plain", B=2, Sq=2, Hq=4, Hk=2, D=64, cache_seqlens=[37, 20],
                                  seqlen_new=2, rotary_dim=32, window=(-1, 0)), True),
    # append into a paged fp8 cache, per-token scales written, interleaved rotary, 3 splits
    "append_paged_fp8_interleaved": (dict(dtype="fp16", cache="fp8", B=2, Sq=1, Hq=2, Hk=1, D=128,
                                          cache_seqlens=[40, 70], page_size=16, scaling="token", num_splits=3,
                                          seqlen_new=1, rotary_dim=64, interleaved=True), True),
    # fp32 queries: decode.hip's row-wise kernels (decode_append, decode_rowwise)
    "fp32_rowwise_append_rotary": (dict(dtype="fp32", cache="plain", B=2, Sq=2, Hq=4, Hk=2, D=24,
                                        cache_seqlens=[37, 20], seqlen_new=2, rotary_dim=8, window=(-1, 0)), True),
    "fp32_rowwise_paged_fp8": (dict(dtype="fp32", cache="fp8", B=2, Sq=1, Hq=2, Hk=1, D=40, cache_seqlens=[40, 70],
                                    page_size=16, scaling="token", seqlen_new=1), False),
    "fp32_rowwise_int8_append": (dict(dtype="fp32", cache="int8", B=1, Sq=2, Hq=2, Hk=1, D=32, cache_seqlens=[21],
                                      scaling="token", seqlen_new=2, window=(-1, 0)), True),
    "append_int8_head_scale": (dict(dtype="bf16", cache="int8", B=1, Sq=3, Hq=2, Hk=2, D=64, cache_seqlens=[50],
                                    scaling="head", seqlen_new=3, num_splits=2), False),
    "d256_plain_window": (dict(dtype="fp16", cache="plain", B=1, Sq=4, Hq=8, Hk=2, D=256, cache_seqlens=[45],
                               window=(20, 0), num_splits=2), False),
    "paged_int8_token_page32": (dict(dtype="fp16", cache="int8", B=3, Sq=1, Hq=2, Hk=2, D=64,
                                     cache_seqlens=[1, 64, 90], page_size=32, scaling="token", num_splits=4), False),
}


def check_append(c, cache):
    kv, vv, ks, vs = cache
    for (b, t, hk), rows in c.appended().items():
        o, r = c._pos(b, c.seqlens[b] + t)
        for want, got, sc in ((rows[0], kv[o, r, hk], ks), (rows[1], vv[o, r, hk], vs)):
            if c.cache == "plain":
                np.testing.assert_allclose(got, want, atol=TOL[c.dtype] * np.abs(want).max(), rtol=0)
                continue
            s = sc[hk] if c.scaling == "head" else sc[o, r, hk]
            if c.scaling == "token":
                amax = np.abs(want).max()
                np.testing.assert_allclose(s, amax / (448.0 if c.cache == "fp8" else 127.0), rtol=1e-6)
            step = np.abs(want) * 2.0**-4 + s * 2.0**-9 if c.cache == "fp8" else 0.5 * s
            assert (np.abs(got * s - want) <= step * 1.001 + 1e-7).all(), (b, t, hk)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", [n for n, (_, q) in DECODE_CASES.items() if q or FULL])
def test_decode(arch, name):
    c = L.DecodeCase(**DECODE_CASES[name][0])
    out, lse, run = L.decode(arch, c)
    if c.seqlen_new:
        check_append(c, run.cache)
    ro, rl = c.reference(*run.cache)
    close("out", out, ro, c.dtype)
    np.testing.assert_allclose(lse, rl, atol=1e-4, rtol=1e-5)


PACKED_CASES = {
    # prefill chunk, decode step and an empty sequence in one call; GQA 4:1, causal, 2 splits
    "packed_causal_splits": (dict(dtype="bf16", cache="plain", B=3, Sq=5, Hq=8, Hk=2, D=64, cache_seqlens=[40, 23, 9],
                                  window=(-1, 0), num_splits=2), [5, 1, 0]),
    # paged fp8, per-token scales, a window, 3 splits
    "packed_paged_fp8_window": (dict(dtype="fp16", cache="fp8", B=2, Sq=4, Hq=4, Hk=2, D=128, cache_seqlens=[50, 33],
                                     page_size=16, scaling="token", window=(7, 0), num_splits=3), [4, 1]),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(PACKED_CASES))
def test_decode_packed_queries(arch, name):
    """cu_seqlens_q (flash_attn_varlen_func's paged call): each sequence's packed rows equal
    the last rows of the fixed-length problem (bottom-right masks), its LSE likewise."""
    kw, lens = PACKED_CASES[name]
    c = L.DecodeCase(**kw)
    out, lse, _ = L.decode(arch, c, packed=lens)
    ro, rl = c.reference()
    want_o = np.concatenate([ro[b, c.Sq - n:] for b, n in enumerate(lens)])
    want_l = np.concatenate([rl[b, :, c.Sq - n:] for b, n in enumerate(lens)], axis=1)
    close("out", out, want_o, c.dtype)
    np.testing.assert_allclose(lse, want_l, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("order", ["reverse", "roundrobin", "random"])
def test_decode_under_other_wave_orders(order):
    c = L.DecodeCase(**DECODE_CASES["paged_fp8_token_splits"][0])
    out, lse, run = L.decode("gfx942", c, order=order)
    ro, rl = c.reference(*run.cache)
    close("out", out, ro, c.dtype)


# ------------------------------------------------------------------------ every instance (full set)

HEAD_DIMS = (32, 64, 96, 128, 192, 256)


def sweep_case(dtype, hd, dropout, scoremod, seed):
    """A small problem that lands on the instance (dtype, head dim hd, dropout, score mod):
    a head dim just below hd where one exists (the padding), lengths off the tiles."""
    D = hd - 8 if hd > 32 else hd
    kw = dict(causal=bool(seed % 2))
    if dropout:
        kw["dropout_p"] = 0.25
    if scoremod:
        kw.update(softcap=4.0, alibi=True)
    return L.Case(dtype, [(37, 41)], 2, 1, D, rng_seed=seed, seed=seed, **kw)


SWEEP = [(dt, hd, dr, sm) for dt in ("bf16", "fp16") for hd in HEAD_DIMS for dr in (False, True) for sm in (False, True)]


@pytest.mark.skipif(not FULL, reason="full set: FMHA_TEST_FULL=1")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype,hd,dropout,scoremod", SWEEP, ids=[f"{a}-d{b}-{'drop' if c else 'nodrop'}-{'mod' if d else 'plain'}"
                                                                 for a, b, c, d in SWEEP])
def test_every_forward_and_backward_instance(arch, dtype, hd, dropout, scoremod):
    c = sweep_case(dtype, hd, dropout, scoremod, hd + dropout * 2 + scoremod)
    out, lse, _ = L.fwd(arch, c)
    check_fwd(c, out, lse)
    _, _, rdq, rdk, rdv = c.reference(grads=True)
    for det in (False, True):
        dq, dk, dv, run = L.bwd(arch, c, deterministic=det)
        assert any(f"hdim{hd}" in src for src, _, _ in run.kernels)
        for n, g, w in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
            close(n, g, w, c.dtype)


DECODE_SWEEP = [(dt, cache, hd) for dt in ("bf16", "fp16") for cache in ("plain", "fp8", "int8") for hd in (64, 128, 256)]


@pytest.mark.skipif(not FULL, reason="full set: FMHA_TEST_FULL=1")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype,cache,hd", DECODE_SWEEP, ids=[f"{a}-{b}-d{c}" for a, b, c in DECODE_SWEEP])
def test_every_decode_instance(arch, dtype, cache, hd):
    c = L.DecodeCase(dtype, cache, 2, 2, 4, 2, hd - 8, [33, 50], page_size=16 if hd != 128 else None,
                     scaling="token" if hd == 64 else "head", num_splits=2, seqlen_new=1, rotary_dim=16,
                     rng_seed=hd)
    out, lse, run = L.decode(arch, c)
    check_append(c, run.cache)
    ro, rl = c.reference(*run.cache)
    close("out", out, ro, c.dtype)
    np.testing.assert_allclose(lse, rl, atol=1e-4, rtol=1e-5)


# ------------------------------------------------------------------------ against the CPU backend

from amdemu import cpu_backend  # noqa: E402

_LIB = cpu_backend.find_library()
requires_libfmha = pytest.mark.skipif(_LIB is None, reason="no libfmha built (.ci/run builds build-ctest/, "
                                                           ".ci/amd_emu.sh build-amdemu/; or set FMHA_LIBFMHA)")


@pytest.fixture(scope="module")
def cpu_lib():
    return cpu_backend.Lib(_LIB)


@requires_libfmha
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["causal_masked_rows_gqa", "dropout", "varlen_seqused", "fp32_rowwise_features"] +
                         (["softcap_alibi", "window_top_left", "d128_fp16", "d256_dropout_softcap"] if FULL else []))
def test_matches_cpu_backend(arch, name, cpu_lib):
    """The emulated HIP kernels against fmha's CPU backend (libfmha through its C API) on the
    same inputs, at the dtype's tolerance: forward, then the backward from the same out and
    LSE."""
    c = case(name)
    tol = TOL[c.dtype]
    cpu_out, cpu_lse = cpu_backend.fwd(cpu_lib, c)
    out, lse, _ = L.fwd(arch, c)
    close("out", out, cpu_out, c.dtype)
    assert (np.isneginf(lse) == np.isneginf(cpu_lse)).all()
    fin = np.isfinite(cpu_lse)
    np.testing.assert_allclose(lse[fin], cpu_lse[fin], atol=tol, rtol=0)
    ro, rl = c.reference()
    cpu_grads = cpu_backend.bwd(cpu_lib, c, ro, rl)
    grads = L.bwd(arch, c, deterministic=name == "varlen_seqused")[:3]
    for n, g, w in zip(("dq", "dk", "dv"), grads, cpu_grads):
        close(n, g, w, c.dtype)


@requires_libfmha
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["paged_fp8_token_splits", "append_rotary_causal", "int8_leftpad_softcap_alibi",
                                  "fp32_rowwise_int8_append"] + (["append_paged_fp8_interleaved", "d256_plain_window"]
                                                                if FULL else []))
def test_decode_matches_cpu_backend(arch, name, cpu_lib):
    c = L.DecodeCase(**DECODE_CASES[name][0])
    cpu_out, cpu_lse = cpu_backend.decode(cpu_lib, c)
    out, lse, _ = L.decode(arch, c)
    close("out", out, cpu_out, c.dtype)
    np.testing.assert_allclose(lse, cpu_lse, atol=TOL[c.dtype], rtol=0)
