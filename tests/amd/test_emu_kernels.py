"""fmha's HIP attention kernels, compiled by clang-19 for gfx942 and gfx90a, executed on the
emulator (tools/amdemu) and compared with a float64 reference at the dtype's tolerance.

The host side mimics csrc/hip_fmha/dispatch.hip (tools/amdemu/fmha_launch.py).  The quick
set runs by default; FMHA_TEST_FULL=1 adds the rest."""

import pytest

from amd_helpers import ARCHS, FULL, np, requires_toolchain

pytestmark = requires_toolchain

from amdemu import emu  # noqa: E402
from amdemu import fmha_launch as L  # noqa: E402

TOL = {"bf16": 2e-2, "fp16": 4e-3}

# name: (Case arguments, quick?).  Lengths are chosen against the tiles: forward blocks of
# 128 (D <= 96) or 64 query rows and 64- or 32-key blocks; backward blocks of 64 keys.
CASES = {
    # causal (bottom-right) with Sq > Sk: rows 0..19 see no key (output 0, LSE -inf), GQA 2:1
    "causal_masked_rows_gqa": (dict(dtype="bf16", seqs=[(70, 50)], Hq=2, Hk=1, D=64, causal=True), True),
    # 16x16 MFMA path (D = 128), lengths off the tile
    "d128_fp16": (dict(dtype="fp16", seqs=[(40, 45)], Hq=1, Hk=1, D=128), True),
    # sliding window, top-left, two sequences
    "window_top_left": (dict(dtype="fp16", seqs=[(33, 70)] * 2, Hq=2, Hk=2, D=32, window=(5, 3), top_left=True),
                        True),
    "softcap_alibi": (dict(dtype="bf16", seqs=[(40, 70)], Hq=2, Hk=1, D=64, softcap=3.0, alibi=True), True),
    "dropout": (dict(dtype="bf16", seqs=[(40, 70)], Hq=2, Hk=1, D=64, dropout_p=0.3, seed=99, offset=7), True),
    # varlen: an empty sequence, seqused_k, a padded head dim (40 -> the 64 kernel)
    "varlen_seqused": (dict(dtype="fp16", seqs=[(17, 30), (0, 5), (40, 66)], Hq=2, Hk=1, D=40, varlen=True,
                            seqused_k=[25, 5, 60], causal=True), True),
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
