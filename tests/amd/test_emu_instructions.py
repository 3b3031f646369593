"""The emulator checked as a second implementation: one-instruction HIP kernels
(tools/amdemu/kernels/probes.hip) compiled by clang-19 for gfx942 and gfx90a, run on the
emulator, and compared with models written here from AMD's Matrix Instruction Calculator
tables (the MFMAs) and the ISA's definitions (the rest)."""

import csv
import re
import struct

import pytest

from amd_helpers import ARCHS, MFMA_DIR, ROOT, np, requires_toolchain

pytestmark = requires_toolchain

from amdemu import build, codeobj, emu, memory  # noqa: E402

PROBES = ROOT / "tools" / "amdemu" / "kernels" / "probes.hip"
_CO = {}


def probes(arch):
    if arch not in _CO:
        _CO[arch] = codeobj.CodeObject(build.build(PROBES, arch), arch)
    return _CO[arch]


def run_probe(arch, kernel, arrays, out_bytes, block=64, order="sequential", co=None):
    """Runs kernel(ptr, ptr, ..., out) with the given arrays; returns the out bytes."""
    mem = memory.Memory()
    ptrs = [mem.array(a) for a in arrays]
    out = mem.alloc(out_bytes, "out")
    m = emu.Machine(co or probes(arch), mem)
    m.launch(kernel, (1, 1, 1), (block, 1, 1), struct.pack(f"<{len(ptrs) + 1}Q", *ptrs, out), order=order)
    return mem.read(out, out_bytes)


# ------------------------------------------------------------------------------- MFMA

def calculator_table(arch, name, which):
    """{(lane, slot): (row, col)} from the calculator's CSV (slot: 16-bit half or register)."""
    gen = "CDNA3" if arch == "gfx942" else "CDNA2"
    path = MFMA_DIR / f"{gen}_{name}_{which}.csv"
    rows = list(csv.reader(path.read_text().splitlines()))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "lane")
    out = {}
    for r in rows[header + 1:]:
        if not r:
            continue
        for slot, cell in enumerate(r[1:]):
            m = re.fullmatch(r"[ABD]\[(\d+)\]\[(\d+)\]", cell.strip())
            assert m, cell
            out[(int(r[0]), slot)] = (int(m.group(1)), int(m.group(2)))
    return out


MFMAS = [  # kernel, calculator name per arch, n, k, dtype
    ("mfma_32x32x8_bf16", {"gfx942": "v_mfma_f32_32x32x8_bf16", "gfx90a": "v_mfma_f32_32x32x8bf16_1k"}, 32, 8, "bf16"),
    ("mfma_16x16x16_bf16", {"gfx942": "v_mfma_f32_16x16x16_bf16", "gfx90a": "v_mfma_f32_16x16x16bf16_1k"}, 16, 16,
     "bf16"),
    ("mfma_32x32x8_f16", {"gfx942": "v_mfma_f32_32x32x8_f16", "gfx90a": "v_mfma_f32_32x32x8f16"}, 32, 8, "f16"),
    ("mfma_16x16x16_f16", {"gfx942": "v_mfma_f32_16x16x16_f16", "gfx90a": "v_mfma_f32_16x16x16f16"}, 16, 16, "f16"),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel,names,n,k,dt", MFMAS, ids=[m[0] for m in MFMAS])
def test_mfma_matches_calculator_layout(arch, kernel, names, n, k, dt):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((n, k)).astype(np.float32)
    B = rng.standard_normal((k, n)).astype(np.float32)
    Cm = rng.standard_normal((n, n)).astype(np.float32)
    if dt == "bf16":
        A = (A.view(np.uint32) & 0xFFFF0000).view(np.float32)
        B = (B.view(np.uint32) & 0xFFFF0000).view(np.float32)
        enc = lambda x: (np.float32(x).view(np.uint32) >> 16).astype(np.uint16)  # exact: low bits are 0
    else:
        A, B = A.astype(np.float16).astype(np.float32), B.astype(np.float16).astype(np.float32)
        enc = lambda x: np.float16(x).view(np.uint16)
    ta = calculator_table(arch, names[arch], "A")
    tb = calculator_table(arch, names[arch], "B")
    td = calculator_table(arch, names[arch], "D")
    regs = n * n // 64
    a_in = np.zeros((64, 4), np.uint16)
    b_in = np.zeros((64, 4), np.uint16)
    c_in = np.zeros((64, regs), np.float32)
    for (lane, slot), (i, kk) in ta.items():
        a_in[lane, slot] = enc(A[i, kk])
    for (lane, slot), (kk, j) in tb.items():
        b_in[lane, slot] = enc(B[kk, j])
    for (lane, slot), (i, j) in td.items():
        c_in[lane, slot] = Cm[i, j]
    D = A.astype(np.float64) @ B.astype(np.float64) + Cm
    want = np.zeros((64, regs))
    for (lane, slot), (i, j) in td.items():
        want[lane, slot] = D[i, j]
    got = run_probe(arch, kernel, [a_in, b_in, c_in], 64 * regs * 4).view(np.float32).reshape(64, regs)
    assert len(ta) == 256 and len(td) == 64 * regs
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_emulator_layout_formulas_equal_calculator_tables():
    """The emulator's closed-form layouts (emu.mfma_layout) against every table entry."""
    for kernel, names, n, k, dt in MFMAS:
        (a_i, a_k), (b_k, b_j), (d_i, d_j) = emu.mfma_layout(n, k)
        for arch in ARCHS:
            ta = calculator_table(arch, names[arch], "A")
            tb = calculator_table(arch, names[arch], "B")
            td = calculator_table(arch, names[arch], "D")
            assert all(ta[(l, s)] == (a_i[l, s], a_k[l, s]) for l in range(64) for s in range(4))
            assert all(tb[(l, s)] == (b_k[l, s], b_j[l, s]) for l in range(64) for s in range(4))
            assert all(td[(l, s)] == (d_i[l, s], d_j[l, s]) for l in range(64) for s in range(n * n // 64))


def test_mfma_opcode_per_arch_is_decoded_as_that_arch():
    """gfx90a encodes the bf16 MFMAs as VOP3P 0x66/0x67, gfx942 as 0x60/0x61: the decoder
    must give the right instruction on each (a decoder for one misreads the other)."""
    for arch, want in (("gfx942", "v_mfma_f32_32x32x8_bf16"), ("gfx90a", "v_mfma_f32_32x32x8bf16_1k")):
        names = {i.mnem for i in probes(arch).instrs.values() if i.mnem.startswith("v_mfma")}
        assert want in names, (arch, names)


# ------------------------------------------------------------------------------- VALU

def u32(x):
    return np.asarray(x, np.uint64).astype(np.uint32) if np.asarray(x).dtype != np.uint32 else x


def f32b(x):
    return np.asarray(x, np.float32).view(np.uint32)


def f16b(x):
    return np.asarray(x, np.float16).view(np.uint16).astype(np.uint32)


def perm_model(s0, s1, sel):
    out = np.zeros(64, np.uint32)
    for l in range(64):
        comb = (int(s0[l]) << 32) | int(s1[l])
        r = 0
        for b in range(4):
            c = (int(sel[l]) >> (8 * b)) & 0xFF
            if c < 8:
                byte = (comb >> (8 * c)) & 0xFF
            elif c < 12:
                bit = {8: (int(s1[l]) >> 15) & 1, 9: (int(s1[l]) >> 31) & 1, 10: (int(s0[l]) >> 15) & 1,
                       11: (int(s0[l]) >> 31) & 1}[c]
                byte = 0xFF * bit
            elif c == 12:
                byte = 0
            else:
                byte = 0xFF
            r |= byte << (8 * b)
        out[l] = r
    return out


def sext(v, bits):
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _rand(rng):
    return rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)


def valu_cases(rng):
    x, y, z = _rand(rng), _rand(rng), _rand(rng)
    sel = np.array([rng.choice([rng.integers(0, 14), 12, 13, 8, 9, 10, 11]) | rng.integers(0, 14) << 8 |
                    rng.integers(0, 16) << 16 | rng.integers(0, 14) << 24 for _ in range(64)], np.uint32)
    fx = rng.standard_normal(64).astype(np.float32)
    fz = rng.standard_normal(64).astype(np.float32)
    hy = rng.standard_normal(64).astype(np.float16)
    small = rng.integers(0, 32, 64).astype(np.uint32)
    yield "probe_perm", (x, y, sel), perm_model(x, y, sel)
    yield "probe_bfi", (x, y, z), (x & y) | (~x & z)
    wid = rng.integers(0, 33, 64).astype(np.uint32)
    yield "probe_bfe_u32", (x, small, wid), np.array(
        [(int(a) >> (int(o) & 31)) & ((1 << (int(w) & 31)) - 1) for a, o, w in zip(x, small, wid)], np.uint32)
    yield "probe_bfe_i32", (x, small, wid), np.array(
        [sext((int(a) >> (int(o) & 31)) & ((1 << (int(w) & 31)) - 1), int(w) & 31) & 0xFFFFFFFF if int(w) & 31 else 0
         for a, o, w in zip(x, small, wid)], np.uint32)
    # f32 * f16 (low half of y) + f32
    yield "probe_fma_mix_f32", (f32b(fx), f16b(hy) | 0xABCD0000, f32b(fz)), f32b(
        (fx.astype(np.float64) * hy.astype(np.float64) + fz).astype(np.float32))
    # f32 * f32 -> f16 in the low half, high half kept
    yield "probe_fma_mixlo_f16", (f32b(fx), f32b(fz), z), (z & 0xFFFF0000) | f16b(
        (fx.astype(np.float64) * fz.astype(np.float64)).astype(np.float32).astype(np.float16))
    yield "probe_or_sdwa_w1", (x, y, z), (x >> 16) | y
    yield "probe_and_sdwa_b2", (x, y, z), (((x >> 16) & 0xFF) & y & 0xFFFF) << 16
    sh = rng.integers(0, 16, 64).astype(np.uint32)
    yield "probe_ashr_i16_sdwa", (sh, y, z), np.array(
        [(sext(int(b) & 0xFF, 8) >> (int(s) & 15)) & 0xFFFF for s, b in zip(sh, y)], np.uint32)
    yield "probe_cvt_f16_sdwa", (f32b(fx), y, z), (z & 0xFFFF) | (f16b(fx.astype(np.float16)) << 16)
    hx = rng.standard_normal(128).astype(np.float16)
    px = hx.view(np.uint32)
    yield "probe_pk_mul_f16", (px, f16b(hy), z), np.array(
        [int(np.float16(hx[2 * l] * hy[l]).view(np.uint16)) | int(np.float16(hx[2 * l + 1] * hy[l]).view(np.uint16))
         << 16 for l in range(64)], np.uint32)
    yield "probe_xad", (x, y, z), ((x ^ y).astype(np.uint64) + z).astype(np.uint32)
    ff = np.concatenate([x[:60], np.array([0, 0xFFFFFFFF, 1, 0x80000000], np.uint32)])

    def ffbh(v):
        v = int(v)
        if v in (0, 0xFFFFFFFF):
            return 0xFFFFFFFF
        s = v >> 31
        for i in range(31, -1, -1):
            if (v >> i) & 1 != s:
                return 31 - i
    yield "probe_ffbh_i32", (ff, y, z), np.array([ffbh(v) for v in ff], np.uint32)
    yield "probe_add_u16", (x, y, z), ((x + y) & 0xFFFF).astype(np.uint32)
    fy = rng.standard_normal(64).astype(np.float32)
    # exact either way: x * 65536 is exact, and the fused and unfused (gfx90a v_madak) forms
    # of x * y + 0.5 differ only in rounding, so y is a power of two here
    yield "probe_fmamk", (f32b(fx), f32b(fy), z), f32b((fx.astype(np.float64) * 65536 + fy).astype(np.float32))
    p2 = np.float32(2.0) ** rng.integers(-4, 4, 64).astype(np.float32)
    yield "probe_fmaak", (f32b(fx), f32b(p2), z), f32b((fx.astype(np.float64) * p2 + 0.5).astype(np.float32))


@pytest.mark.parametrize("arch", ARCHS)
def test_pk_fma_f32_with_inline_constants(arch):
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    got = run_probe(arch, "probe_pk_fma_const", [f32b(x), f32b(y), f32b(y)], 512).view(np.float32).reshape(64, 2)
    np.testing.assert_array_equal(got[:, 0], (np.float32(-2) * x + np.float32(1)).astype(np.float32))
    np.testing.assert_array_equal(got[:, 1], (np.float32(-2) * y + np.float32(1)).astype(np.float32))


@pytest.mark.parametrize("arch", ARCHS)
def test_valu_probes(arch):
    rng = np.random.default_rng(7)
    for kernel, ins, want in valu_cases(rng):
        got = run_probe(arch, kernel, [np.asarray(a, np.uint32) for a in ins], 256).view(np.uint32)
        np.testing.assert_array_equal(got, np.asarray(want, np.uint32), err_msg=f"{arch} {kernel}")


@pytest.mark.parametrize("arch", ARCHS)
def test_exp2_within_one_ulp(arch):
    x = np.linspace(-30, 30, 64).astype(np.float32)
    x[0] = -np.inf
    got = run_probe(arch, "probe_exp", [f32b(x), x.view(np.uint32), x.view(np.uint32)], 256).view(np.float32)
    want = np.exp2(x.astype(np.float64))
    assert got[0] == 0
    np.testing.assert_allclose(got[1:], want[1:], rtol=2.0**-23)


@pytest.mark.parametrize("arch", ARCHS)
def test_bpermute_reads_zero_from_inactive_lanes(arch):
    rng = np.random.default_rng(3)
    data = _rand(rng)
    src = rng.integers(0, 64, 64).astype(np.uint32)
    active = rng.integers(0, 2, 64).astype(np.uint32)
    got = run_probe(arch, "probe_bpermute", [data, src * 4, active], 256).view(np.uint32)
    want = np.where(active == 1, np.where(active[src] == 1, data[src], 0), 0xDEAD).astype(np.uint32)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------- buffers

@pytest.mark.parametrize("arch", ARCHS)
def test_buffer_range_checks(arch):
    """GlobalTile (tile/buffer.h) over raw buffers: rows past rows_valid and columns past
    cols_valid read zeros and drop stores; the rest is exact."""
    rows_valid, cols_valid, stride = 5, 24, 40
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2**16, (8, stride), dtype=np.uint64).astype(np.uint16)
    r = rng.integers(-1, 8, 64).astype(np.int32)
    c = (rng.integers(0, 5, 64) * 8).astype(np.int32)
    r[:3], c[:3] = [4, 0, 5], [16, 24, 0]  # last valid element block, first invalid column, first invalid row
    mem = memory.Memory()
    pb = mem.array(base)
    dst = mem.array(np.zeros((8, stride), np.uint16))
    pr, pc = mem.array(r), mem.array(c)
    o16, o8, o2 = mem.alloc(64 * 16), mem.alloc(64 * 8), mem.alloc(64 * 4)
    m = emu.Machine(probes(arch), mem)
    args = struct.pack("<QqiiQQQQQQ", pb, stride, rows_valid, cols_valid, pr, pc, o16, o8, o2, dst)
    # Distinct lanes may hit the same element; the model takes the highest lane (ours scatters in order).
    m.launch("probe_buffer", (1, 1, 1), (64, 1, 1), args)
    ok = (r >= 0) & (r < rows_valid) & (c < cols_valid)
    g16 = mem.read(o16, 64 * 16, np.uint16).reshape(64, 8)
    g8 = mem.read(o8, 64 * 8, np.uint16).reshape(64, 4)
    g2 = mem.read(o2, 64 * 4, np.uint32)
    for l in range(64):
        want = base[r[l], c[l]:c[l] + 8] if ok[l] else np.zeros(8, np.uint16)
        np.testing.assert_array_equal(g16[l], want)
        np.testing.assert_array_equal(g8[l], want[:4])
        assert g2[l] == want[0]
    d = mem.read(dst, 8 * stride * 2, np.uint16).reshape(8, stride)
    want = np.zeros((8, stride), np.uint16)
    for l in range(64):
        if ok[l]:
            want[r[l], c[l]:c[l] + 4] = np.array([l, -l], np.int32).view(np.uint16)
    np.testing.assert_array_equal(d, want)
    assert m.partial_buffer_accesses == 0


# ------------------------------------------------------------------------------- LDS, races

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", emu.Machine.ORDERS)
def test_lds_exchange_with_barrier(arch, order):
    x = np.arange(256, dtype=np.uint32) * 7 + 1
    got = run_probe(arch, "lds_exchange_sync", [x], 1024, block=256, order=order).view(np.uint32)
    np.testing.assert_array_equal(got, x[::-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_race_without_barrier_is_reported(arch):
    x = np.arange(256, dtype=np.uint32)
    with pytest.raises(emu.RaceError):
        run_probe(arch, "lds_exchange_nosync", [x], 1024, block=256)


@pytest.mark.parametrize("arch", ARCHS)
def test_missing_waitcnt_is_reported(arch):
    """The vector add of a probe with its s_waitcnt vmcnt removed reads a register whose
    load is still outstanding."""
    co = probes(arch)

    def drop_vm_wait(ins):
        if ins.mnem == "s_waitcnt" and "vmcnt" in ins.mods:
            ins.mnem, ins.ops, ins.mods = "s_nop", ["0"], {}
    broken = co.patched(drop_vm_wait)
    x = np.arange(64, dtype=np.uint32)
    with pytest.raises(emu.WaitcntError):
        run_probe(arch, "probe_xad", [x, x, x], 256, co=broken)
