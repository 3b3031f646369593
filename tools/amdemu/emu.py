"""A wave64 CDNA2/CDNA3 (gfx90a / gfx942) emulator for the code objects fmha builds.

Instructions come decoded from LLVM's disassembler (codeobj.py); each is compiled once
into a Python closure over numpy arrays of 64 lanes.  The semantics are written here from
AMD's CDNA3 ISA reference; anything not modelled raises Unsupported rather than guessing.

What the run checks besides computing:
  * memory: every global, flat and scalar access must lie inside one allocation
    (MemoryFault); buffer accesses are range-checked against their descriptor as the
    hardware does (out of range: loads read 0, stores are dropped);
  * s_waitcnt: a register that an outstanding load will write may not be read or written
    before an s_waitcnt covers that load (WaitcntError);
  * LDS races: a wave may not read or overwrite LDS bytes another wave of the workgroup
    wrote, or overwrite bytes another wave read, since the last s_barrier (RaceError);
  * uninitialized state: LDS, VGPRs and SGPRs start as a NaN pattern, not zeros.
Waves of a workgroup run in a chosen order (`order`): sequential to each barrier, reversed,
one instruction each in turn, or randomly interleaved.
"""

import random
import re

import numpy as np

from .memory import EmuError, MemoryFault

LANES = np.arange(64, dtype=np.uint64)
POISON = 0x7FC0DEAD  # a quiet NaN: uninitialized registers and LDS


class Unsupported(EmuError):
    pass


class WaitcntError(EmuError):
    pass


class RaceError(EmuError):
    pass


class BarrierError(EmuError):
    pass


# ---------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------

SPECIAL = {"vcc": (106, 2), "vcc_lo": (106, 1), "vcc_hi": (107, 1), "exec": (126, 2), "exec_lo": (126, 1),
           "exec_hi": (127, 1), "m0": (124, 1)}
OPERAND = re.compile(r"^(?P<neg>-)?(?P<abs>\|)?(?P<sext>sext\()?(?:(?P<f>[sva])(?P<i>\d+)|(?P<rf>[sva])\[(?P<lo>\d+):"
                     r"(?P<hi>\d+)\]|(?P<sp>vcc_lo|vcc_hi|exec_lo|exec_hi|vcc|exec|m0|off|scc)|(?P<k>-?0x[0-9a-fA-F]+|"
                     r"-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+))\|?\)?$")


class Op:
    __slots__ = ("kind", "idx", "n", "neg", "abs", "sext", "k", "text")

    def __init__(self, text):
        m = OPERAND.match(text)
        if not m:
            raise Unsupported(f"operand {text!r}")
        self.text, self.neg, self.abs, self.sext = text, bool(m["neg"]), bool(m["abs"]), bool(m["sext"])
        self.k = None
        if m["f"]:
            self.kind, self.idx, self.n = m["f"], int(m["i"]), 1
        elif m["rf"]:
            self.kind, self.idx = m["rf"], int(m["lo"])
            self.n = int(m["hi"]) - self.idx + 1
        elif m["sp"]:
            if m["sp"] in ("off", "scc"):
                self.kind, self.idx, self.n = m["sp"], 0, 0
            else:
                self.kind = "s"
                self.idx, self.n = SPECIAL[m["sp"]]
        else:
            self.kind, self.idx, self.n = "k", 0, 1
            self.k = m["k"]
            if self.neg and not self.abs:  # "-1", "-0.5": the constant itself is negative
                self.k = self.k[1:] if self.k.startswith("-") else "-" + self.k
                self.neg = False

    def regs(self):
        if self.kind in "sva" and len(self.kind) == 1:
            return [(self.kind, self.idx + j) for j in range(self.n)]
        return []


def f32_bits(x):
    return int(np.array(x, np.float32).view(np.uint32))


def f64_bits(x):
    return int(np.array(x, np.float64).view(np.uint64))


def f16_bits(x):
    return int(np.array(x, np.float16).view(np.uint16))


def const_value(text, width, is_float):
    """Bits of a constant operand for an operand of `width` bits (16, 32, 64)."""
    if "." in text:  # an inline float constant: encoded in the operand's own format
        v = float(text)
        return {16: f16_bits, 32: f32_bits, 64: f64_bits}[width](v)
    v = int(text, 0)
    if width == 64:
        if text.lstrip("-").startswith("0x"):  # a 32-bit literal
            return (v & 0xFFFFFFFF) << 32 if is_float else v & 0xFFFFFFFF
        return v & 0xFFFFFFFFFFFFFFFF
    return v & ((1 << width) - 1)


# Kinds of VALU operands: (width, numpy dtype of the value).
KINDS = {"b32": (32, np.uint32), "u32": (32, np.uint32), "i32": (32, np.int32), "f32": (32, np.float32),
         "b64": (64, np.uint64), "u64": (64, np.uint64), "i64": (64, np.int64), "f64": (64, np.float64),
         "b16": (16, np.uint16), "u16": (16, np.uint16), "i16": (16, np.int16), "f16": (16, np.float16)}
FLOAT = {"f16", "f32", "f64"}


def vsrc(op, kind, sel=None):
    """Closure: wave -> value of operand op as numpy (64,) array (or numpy scalar) of kind."""
    width, dt = KINDS[kind]
    isf = kind in FLOAT
    if op.kind == "k":
        bits = const_value(op.k, width, isf)
        val = np.array(bits, {16: np.uint16, 32: np.uint32, 64: np.uint64}[width]).view(dt)[()]
        if op.neg or op.abs:
            raise Unsupported(f"modifier on constant {op.text}")
        return lambda w, val=val: val
    if op.kind == "s":
        i, n = op.idx, op.n
        if width == 64:
            def rd(w):
                return np.uint64(w.s[i] | w.s[i + 1] << 32)
        else:
            def rd(w):
                return np.uint32(w.s[i])
    elif op.kind in ("v", "a"):
        i = op.idx
        if width == 64:
            def rd(w, f=op.kind):
                r = w.v if f == "v" else w.a
                return r[i].astype(np.uint64) | (r[i + 1].astype(np.uint64) << np.uint64(32))
        elif op.kind == "v":
            def rd(w):
                return w.v[i]
        else:
            def rd(w):
                return w.a[i]
    else:
        raise Unsupported(f"operand {op.text} as a VALU source")
    if sel is not None and sel != "DWORD":
        shift, bits = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
                       "WORD_0": (0, 16), "WORD_1": (16, 16)}[sel]
        base, sx = rd, op.sext

        def rd(w):
            x = (np.asarray(base(w), np.uint32) >> np.uint32(shift)) & np.uint32((1 << bits) - 1)
            if sx:
                x = ((x ^ np.uint32(1 << (bits - 1))) - np.uint32(1 << (bits - 1))).astype(np.uint32)
            return x
    elif op.sext:
        raise Unsupported(f"sext without SDWA select: {op.text}")
    if width == 16:
        base16 = rd

        def rd(w):
            return (np.asarray(base16(w), np.uint32) & np.uint32(0xFFFF)).astype(np.uint16)
    conv = {32: np.uint32, 64: np.uint64, 16: np.uint16}[width]
    raw = rd
    if dt != conv:
        def rd(w):
            return np.asarray(raw(w), conv).view(dt)
    if op.abs or op.neg:
        inner, ab, ng = rd, op.abs, op.neg
        if not isf:  # bit-typed operands (v_cndmask_b32, moves): the modifiers act on the sign bit
            if width != 32:
                raise Unsupported(f"abs/neg on operand {op.text}")

            def rd(w):
                x = np.asarray(inner(w), np.uint32)
                if ab:
                    x = x & np.uint32(0x7FFFFFFF)
                return x ^ np.uint32(0x80000000) if ng else x
            return rd

        def rd(w):
            x = inner(w)
            if ab:
                x = np.abs(x)
            return -x if ng else x
    return rd


def bits_of(x, width):
    x = np.asarray(x)
    if width == 32:
        if x.dtype == np.float32 or x.dtype == np.int32:
            return x.view(np.uint32)
        if x.dtype == np.uint32:
            return x
        if x.dtype.kind == "f":
            return x.astype(np.float32).view(np.uint32)
        return x.astype(np.int64).astype(np.uint32) if x.dtype.kind == "i" else x.astype(np.uint32)
    if width == 64:
        if x.dtype in (np.float64, np.int64):
            return x.view(np.uint64)
        return x.astype(np.uint64)
    if x.dtype == np.float16 or x.dtype == np.int16:
        x = x.view(np.uint16)
    elif x.dtype.kind == "f":
        x = x.astype(np.float16).view(np.uint16)
    return x.astype(np.uint32) & np.uint32(0xFFFF)


def vdst(op, width):
    """Closure: (wave, value array, mask) -> writes op's registers in the lanes of mask."""
    if op.kind not in ("v", "a"):
        raise Unsupported(f"VALU destination {op.text}")
    i = op.idx
    a = op.kind == "a"
    if width == 64:
        def wr(w, val, m):
            r = w.a if a else w.v
            b = np.broadcast_to(bits_of(val, 64), (64,))
            r[i][m] = (b & np.uint64(0xFFFFFFFF)).astype(np.uint32)[m]
            r[i + 1][m] = (b >> np.uint64(32)).astype(np.uint32)[m]
    else:
        def wr(w, val, m):
            r = w.a if a else w.v
            b = np.broadcast_to(bits_of(val, 32), (64,))
            r[i][m] = b[m]
    return wr


def mask_bits(bools):
    """64-bit int of a (64,) bool array."""
    return int(np.packbits(bools.astype(np.uint8), bitorder="little").view(np.uint64)[0])


def bits_mask(x):
    return ((np.uint64(x) >> LANES) & np.uint64(1)).astype(bool)


# ---------------------------------------------------------------------------------------
# VALU semantics
# ---------------------------------------------------------------------------------------

def _f32(x):
    return np.asarray(x, np.float32)


def _mac(fused, a, b, c):
    """a * b + c per lane: fused (one rounding, from float64) or the product rounded first."""
    if fused:
        return (np.float64(1) * a * b + c).astype(np.float32)
    return _f32(a * b) + c


def _sat_cvt(x, lo, hi, dt):
    x = np.asarray(x, np.float64)
    r = np.where(np.isnan(x), 0, np.clip(np.trunc(x), lo, hi))
    return r.astype(np.int64).astype(dt)


def _ffbh_u(x):
    x = np.asarray(x, np.uint32)
    r = np.full(x.shape, 0xFFFFFFFF, np.uint32)
    nz = x != 0
    r[nz] = (31 - np.floor(np.log2(x[nz].astype(np.float64)))).astype(np.uint32)
    # log2 of 32-bit ints is exact enough in float64 except just below powers of two
    fix = nz & ((x >> (np.uint32(31) - r)) == 0)
    r[fix] += 1
    return r


def _ffbh_i(x):
    x = np.asarray(x, np.uint32)
    y = np.where(x >> np.uint32(31) != 0, ~x, x).astype(np.uint32)
    r = _ffbh_u(y)
    return np.where((x == 0) | (x == 0xFFFFFFFF), np.uint32(0xFFFFFFFF), r).astype(np.uint32)


def _bfe_u(x, off, wid):
    off = np.asarray(off, np.uint32) & np.uint32(31)
    wid = np.asarray(wid, np.uint32) & np.uint32(31)
    m = ((np.uint64(1) << wid.astype(np.uint64)) - np.uint64(1)).astype(np.uint32)
    return ((np.asarray(x, np.uint32) >> off) & m).astype(np.uint32)


def _bfe_i(x, off, wid):
    wid = np.asarray(wid, np.uint32) & np.uint32(31)
    u = _bfe_u(x, off, wid).astype(np.int64)
    sign = np.where(wid == 0, 0, np.int64(1) << (wid.astype(np.int64) - 1).clip(0))
    return np.where(wid == 0, 0, (u ^ sign) - sign).astype(np.int32)


def _perm(s0, s1, sel):
    s0, s1, sel = (np.broadcast_to(np.asarray(x, np.uint32), (64,)) for x in (s0, s1, sel))
    comb = (s0.astype(np.uint64) << np.uint64(32)) | s1.astype(np.uint64)
    out = np.zeros(64, np.uint32)
    for b in range(4):
        c = (sel >> np.uint32(8 * b)) & np.uint32(0xFF)
        byte = ((comb >> (np.minimum(c, 7).astype(np.uint64) * np.uint64(8))) & np.uint64(0xFF)).astype(np.uint32)
        sgn = {8: (s1 >> 15) & 1, 9: (s1 >> 31) & 1, 10: (s0 >> 15) & 1, 11: (s0 >> 31) & 1}
        for code, bit in sgn.items():
            byte = np.where(c == code, bit.astype(np.uint32) * np.uint32(0xFF), byte)
        byte = np.where(c == 12, 0, byte)
        byte = np.where(c >= 13, 0xFF, byte)
        out |= byte.astype(np.uint32) << np.uint32(8 * b)
    return out


U32 = np.uint32
# name: (dst kind, src kinds, fn).  Shifts take the shift amount as written in the ISA.
VOP = {
    "v_mov_b32": ("b32", ["b32"], lambda a: a),
    "v_mov_b64": ("b64", ["b64"], lambda a: a),
    "v_not_b32": ("b32", ["b32"], lambda a: ~a),
    "v_bfrev_b32": ("b32", ["b32"], lambda a: np.array([int(f"{int(x):032b}"[::-1], 2) for x in np.broadcast_to(a, (64,))], U32)),
    "v_ffbh_i32": ("b32", ["b32"], _ffbh_i),
    "v_ffbh_u32": ("b32", ["b32"], _ffbh_u),
    "v_add_f32": ("f32", ["f32", "f32"], lambda a, b: a + b),
    "v_sub_f32": ("f32", ["f32", "f32"], lambda a, b: a - b),
    "v_subrev_f32": ("f32", ["f32", "f32"], lambda a, b: b - a),
    "v_mul_f32": ("f32", ["f32", "f32"], lambda a, b: a * b),
    "v_max_f32": ("f32", ["f32", "f32"], lambda a, b: np.fmax(a, b)),
    "v_min_f32": ("f32", ["f32", "f32"], lambda a, b: np.fmin(a, b)),
    "v_max3_f32": ("f32", ["f32", "f32", "f32"], lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f32": ("f32", ["f32", "f32", "f32"], lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_fma_f32": ("f32", ["f32", "f32", "f32"],
                  lambda a, b, c: (np.float64(1) * a * b + c).astype(np.float32)),
    "v_fmac_f32": None,  # special: reads its destination (and v_fmaak/v_fmamk/v_madak/v_madmk below)
    "v_mac_f32": None,
    "v_exp_f32": ("f32", ["f32"], lambda a: np.exp2(a.astype(np.float64)).astype(np.float32)),
    "v_log_f32": ("f32", ["f32"], lambda a: np.log2(a.astype(np.float64)).astype(np.float32)),
    "v_rcp_f32": ("f32", ["f32"], lambda a: (1.0 / a.astype(np.float64)).astype(np.float32)),
    "v_rcp_iflag_f32": ("f32", ["f32"], lambda a: (1.0 / a.astype(np.float64)).astype(np.float32)),
    "v_sqrt_f32": ("f32", ["f32"], lambda a: np.sqrt(a.astype(np.float64)).astype(np.float32)),
    "v_rsq_f32": ("f32", ["f32"], lambda a: (1.0 / np.sqrt(a.astype(np.float64))).astype(np.float32)),
    "v_rndne_f32": ("f32", ["f32"], np.rint),
    "v_trunc_f32": ("f32", ["f32"], np.trunc),
    "v_floor_f32": ("f32", ["f32"], np.floor),
    "v_ceil_f32": ("f32", ["f32"], np.ceil),
    "v_fract_f32": ("f32", ["f32"], lambda a: a - np.floor(a)),
    "v_ldexp_f32": ("f32", ["f32", "i32"], lambda a, e: np.ldexp(a, np.clip(e, -400, 400)).astype(np.float32)),
    "v_frexp_mant_f32": ("f32", ["f32"], lambda a: np.where(np.isfinite(a), np.frexp(a)[0], a).astype(np.float32)),
    "v_frexp_exp_i32_f32": ("i32", ["f32"], lambda a: np.where(np.isfinite(a), np.frexp(a)[1], 0).astype(np.int32)),
    "v_cvt_f32_i32": ("f32", ["i32"], lambda a: a.astype(np.float32)),
    "v_cvt_f32_u32": ("f32", ["u32"], lambda a: a.astype(np.float32)),
    "v_cvt_u32_f32": ("u32", ["f32"], lambda a: _sat_cvt(a, 0, 4294967295, np.uint32)),
    "v_cvt_i32_f32": ("i32", ["f32"], lambda a: _sat_cvt(a, -2147483648, 2147483647, np.int32)),
    "v_cvt_f32_ubyte0": ("f32", ["u32"], lambda a: (a & U32(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte1": ("f32", ["u32"], lambda a: ((a >> U32(8)) & U32(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte2": ("f32", ["u32"], lambda a: ((a >> U32(16)) & U32(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte3": ("f32", ["u32"], lambda a: (a >> U32(24)).astype(np.float32)),
    "v_cvt_f16_f32": ("f16", ["f32"], lambda a: a.astype(np.float16)),
    "v_cvt_f32_f16": ("f32", ["f16"], lambda a: a.astype(np.float32)),
    "v_add_u32": ("u32", ["u32", "u32"], lambda a, b: a + b),
    "v_sub_u32": ("u32", ["u32", "u32"], lambda a, b: a - b),
    "v_subrev_u32": ("u32", ["u32", "u32"], lambda a, b: b - a),
    "v_add3_u32": ("u32", ["u32", "u32", "u32"], lambda a, b, c: a + b + c),
    "v_xad_u32": ("u32", ["u32", "u32", "u32"], lambda a, b, c: (a ^ b) + c),
    "v_lshl_add_u32": ("u32", ["u32", "u32", "u32"], lambda a, b, c: (a << (b & U32(31))) + c),
    "v_add_lshl_u32": ("u32", ["u32", "u32", "u32"], lambda a, b, c: (a + b) << (c & U32(31))),
    "v_lshl_or_b32": ("b32", ["b32", "b32", "b32"], lambda a, b, c: (a << (b & U32(31))) | c),
    "v_and_or_b32": ("b32", ["b32", "b32", "b32"], lambda a, b, c: (a & b) | c),
    "v_or3_b32": ("b32", ["b32", "b32", "b32"], lambda a, b, c: a | b | c),
    "v_and_b32": ("b32", ["b32", "b32"], lambda a, b: a & b),
    "v_or_b32": ("b32", ["b32", "b32"], lambda a, b: a | b),
    "v_xor_b32": ("b32", ["b32", "b32"], lambda a, b: a ^ b),
    "v_bfi_b32": ("b32", ["b32", "b32", "b32"], lambda a, b, c: (a & b) | (~a & c)),
    "v_bfe_u32": ("u32", ["u32", "u32", "u32"], _bfe_u),
    "v_bfe_i32": ("i32", ["u32", "u32", "u32"], _bfe_i),
    "v_perm_b32": ("b32", ["b32", "b32", "b32"], _perm),
    "v_alignbit_b32": ("b32", ["b32", "b32", "b32"], lambda a, b, c: (((a.astype(np.uint64) << np.uint64(32)) | b) >> (c & U32(31)).astype(np.uint64)).astype(np.uint32)),
    "v_lshlrev_b32": ("b32", ["u32", "b32"], lambda s, a: a << (s & U32(31))),
    "v_lshrrev_b32": ("b32", ["u32", "b32"], lambda s, a: a >> (s & U32(31))),
    "v_ashrrev_i32": ("i32", ["u32", "i32"], lambda s, a: a >> (s & U32(31)).astype(np.int32)),
    "v_lshlrev_b64": ("b64", ["u32", "b64"], lambda s, a: a << (s & U32(63)).astype(np.uint64)),
    "v_lshrrev_b64": ("b64", ["u32", "b64"], lambda s, a: a >> (s & U32(63)).astype(np.uint64)),
    "v_lshl_add_u64": ("u64", ["u64", "u32", "u64"], lambda a, s, c: (a << (s & U32(7)).astype(np.uint64)) + c),
    "v_min_u32": ("u32", ["u32", "u32"], np.minimum),
    "v_max_u32": ("u32", ["u32", "u32"], np.maximum),
    "v_min_i32": ("i32", ["i32", "i32"], np.minimum),
    "v_max_i32": ("i32", ["i32", "i32"], np.maximum),
    "v_mul_lo_u32": ("u32", ["u32", "u32"], lambda a, b: a * b),
    "v_mul_hi_u32": ("u32", ["u32", "u32"], lambda a, b: ((a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)).astype(np.uint32)),
    "v_mul_hi_i32": ("i32", ["i32", "i32"], lambda a, b: ((a.astype(np.int64) * b.astype(np.int64)) >> np.int64(32)).astype(np.int32)),
    "v_mul_u32_u24": ("u32", ["u32", "u32"], lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
    "v_mad_u32_u24": ("u32", ["u32", "u32", "u32"], lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c),
    "v_add_u16": ("u16", ["u16", "u16"], lambda a, b: a + b),
    "v_mul_lo_u16": ("u16", ["u16", "u16"], lambda a, b: a * b),
    "v_cvt_f16_i16": ("f16", ["i16"], lambda a: a.astype(np.float16)),
    "v_cvt_f16_u16": ("f16", ["u16"], lambda a: a.astype(np.float16)),
    "v_sub_u16": ("u16", ["u16", "u16"], lambda a, b: a - b),
    "v_lshlrev_b16": ("b16", ["u16", "b16"], lambda s, a: a << (s & np.uint16(15))),
    "v_lshrrev_b16": ("b16", ["u16", "b16"], lambda s, a: a >> (s & np.uint16(15))),
    "v_ashrrev_i16": ("i16", ["u16", "i16"], lambda s, a: a >> (s & np.uint16(15)).astype(np.int16)),
    "v_pack_b32_f16": ("b32", ["b16", "b16"], lambda a, b: a.astype(np.uint32) | (b.astype(np.uint32) << U32(16))),
    "v_cvt_pkrtz_f16_f32": None,
}

CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
       "ge": np.greater_equal, "lg": lambda a, b: (a < b) | (a > b),
       "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)), "u": lambda a, b: np.isnan(a) | np.isnan(b),
       "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b), "nle": lambda a, b: ~(a <= b),
       "ngt": lambda a, b: ~(a > b), "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)),
       "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "t": lambda a, b: np.ones(np.broadcast(a, b).shape, bool)}


def _pos(mods, key, n, default):
    v = mods.get(key)
    if v is None:
        return [default] * n
    return [int(x) for x in v.strip("[]").split(",")]


# ---------------------------------------------------------------------------------------
# MFMA
# ---------------------------------------------------------------------------------------

# (M, N, K, operand dtype) of the MFMAs; both spellings (CDNA2 "_1k", CDNA3 "_bf16").
MFMA = {"v_mfma_f32_32x32x8_bf16": (32, 8, "bf16"), "v_mfma_f32_32x32x8bf16_1k": (32, 8, "bf16"),
        "v_mfma_f32_16x16x16_bf16": (16, 16, "bf16"), "v_mfma_f32_16x16x16bf16_1k": (16, 16, "bf16"),
        "v_mfma_f32_32x32x8_f16": (32, 8, "f16"), "v_mfma_f32_32x32x8f16": (32, 8, "f16"),
        "v_mfma_f32_16x16x16_f16": (16, 16, "f16"), "v_mfma_f32_16x16x16f16": (16, 16, "f16")}


def mfma_layout(n, k):
    """Lane layout of the single-block MFMAs v_mfma_f32_{n}x{n}x{k}: for A (n x k) and B
    (k x n), arrays (64, 4) of (row, col) per lane and 16-bit element; for D (n x n),
    arrays (64, n*n/64) of (row, col) per lane and register.  A's row i and B's column j
    live in lane i % n (j % n); the k index advances 4 per group of n lanes."""
    lane = np.arange(64)[:, None]
    e = np.arange(4)[None, :]
    a_i = np.broadcast_to(lane % n, (64, 4))
    a_k = (lane // n) * 4 + e
    regs = n * n // 64
    r = np.arange(regs)[None, :]
    d_j = np.broadcast_to(lane % n, (64, regs))
    if n == 32:
        d_i = 8 * (r // 4) + 4 * (lane // 32) + r % 4
    else:
        d_i = 4 * (lane // 16) + r
    return (a_i, a_k), (a_k.copy(), a_i.copy()), (d_i, d_j)


def unpack16(u32pair, dtype):
    """(64, 2) uint32 -> (64, 4) float64 of four 16-bit elements, low half first."""
    h = np.ascontiguousarray(u32pair, dtype=np.uint32).view(np.uint16).reshape(64, 4)
    if dtype == "bf16":
        return (h.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return h.view(np.float16).astype(np.float64)


# ---------------------------------------------------------------------------------------
# The wave and the compiler of instructions
# ---------------------------------------------------------------------------------------

class Wave:
    def __init__(self, wg, wid):
        self.wg, self.wid = wg, wid
        self.s = [POISON] * 128
        self.v = np.full((256, 64), POISON, np.uint32)
        self.a = np.full((256, 64), POISON, np.uint32)
        self.scc = 0
        self.pc = 0
        self.done = False
        self.waiting = False
        self.count = 0
        self._ek = None
        self._em = None
        self.vm = []    # outstanding vector memory ops: sets of registers they write
        self.lgkm = []  # outstanding LDS / scalar memory ops: (is_smem, set of registers)
        self.pending = {}

    def exec_mask(self):
        key = (self.s[126], self.s[127])
        if key != self._ek:
            self._ek = key
            self._em = bits_mask(key[0] | key[1] << 32)
        return self._em

    def exec64(self):
        return self.s[126] | self.s[127] << 32

    def set_exec(self, x):
        self.s[126], self.s[127] = x & 0xFFFFFFFF, x >> 32 & 0xFFFFFFFF

    def vcc(self):
        return self.s[106] | self.s[107] << 32

    # outstanding-load bookkeeping (s_waitcnt checker)
    def issue(self, counter, regs, smem=False):
        regs = frozenset(regs)
        for r in regs:
            self.pending[r] = self.pending.get(r, 0) + 1
        (self.vm if counter == "vm" else self.lgkm).append((smem, regs))

    def _retire(self, entry):
        for r in entry[1]:
            c = self.pending[r] - 1
            if c:
                self.pending[r] = c
            else:
                del self.pending[r]

    def waitcnt(self, vm, lgkm):
        while len(self.vm) > vm:
            self._retire(self.vm.pop(0))
        if lgkm == 0:
            while self.lgkm:
                self._retire(self.lgkm.pop(0))
        else:  # LDS returns in order; scalar loads may not: only lgkmcnt(0) covers them
            while len(self.lgkm) > lgkm:
                k = next((j for j, e in enumerate(self.lgkm) if not e[0]), None)
                if k is None:
                    break
                self._retire(self.lgkm.pop(k))


def sreg_read(op, width):
    """Closure: wave -> int (scalar operand)."""
    if op.kind == "k":
        v = const_value(op.k, width, False)
        return lambda w: v
    if op.kind == "s":
        i = op.idx
        if width == 64:
            return lambda w: w.s[i] | w.s[i + 1] << 32
        return lambda w: w.s[i]
    if op.kind == "scc":
        return lambda w: w.scc
    raise Unsupported(f"scalar operand {op.text}")


def sreg_write(op, width):
    if op.kind != "s":
        raise Unsupported(f"scalar destination {op.text}")
    i = op.idx
    if width == 64:
        def wr(w, x):
            w.s[i] = x & 0xFFFFFFFF
            w.s[i + 1] = (x >> 32) & 0xFFFFFFFF
    else:
        def wr(w, x):
            w.s[i] = x & 0xFFFFFFFF
    return wr


def sx(x, bits=32):
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


SALU2 = {  # name: (width, fn(a, b) -> (result, scc or None))
    "s_add_u32": (32, lambda a, b: ((a + b) & 0xFFFFFFFF, int(a + b > 0xFFFFFFFF))),
    "s_sub_u32": (32, lambda a, b: ((a - b) & 0xFFFFFFFF, int(b > a))),
    "s_add_i32": (32, lambda a, b: ((a + b) & 0xFFFFFFFF, int(not -2**31 <= sx(a) + sx(b) < 2**31))),
    "s_sub_i32": (32, lambda a, b: ((a - b) & 0xFFFFFFFF, int(not -2**31 <= sx(a) - sx(b) < 2**31))),
    "s_mul_i32": (32, lambda a, b: ((sx(a) * sx(b)) & 0xFFFFFFFF, None)),
    "s_mul_hi_u32": (32, lambda a, b: ((a * b) >> 32, None)),
    "s_mul_hi_i32": (32, lambda a, b: (((sx(a) * sx(b)) >> 32) & 0xFFFFFFFF, None)),
    "s_min_i32": (32, lambda a, b: (a if sx(a) < sx(b) else b, int(sx(a) < sx(b)))),
    "s_max_i32": (32, lambda a, b: (a if sx(a) > sx(b) else b, int(sx(a) > sx(b)))),
    "s_min_u32": (32, lambda a, b: (min(a, b), int(a < b))),
    "s_max_u32": (32, lambda a, b: (max(a, b), int(a > b))),
    "s_lshl_b32": (32, lambda a, b: ((a << (b & 31)) & 0xFFFFFFFF, None)),
    "s_lshr_b32": (32, lambda a, b: (a >> (b & 31), None)),
    "s_ashr_i32": (32, lambda a, b: ((sx(a) >> (b & 31)) & 0xFFFFFFFF, None)),
    "s_lshl_b64": (64, lambda a, b: ((a << (b & 63)) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_lshr_b64": (64, lambda a, b: (a >> (b & 63), None)),
    "s_ashr_i64": (64, lambda a, b: ((sx(a, 64) >> (b & 63)) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_and_b32": (32, lambda a, b: (a & b, None)), "s_or_b32": (32, lambda a, b: (a | b, None)),
    "s_xor_b32": (32, lambda a, b: (a ^ b, None)), "s_andn2_b32": (32, lambda a, b: (a & ~b & 0xFFFFFFFF, None)),
    "s_orn2_b32": (32, lambda a, b: ((a | ~b) & 0xFFFFFFFF, None)),
    "s_and_b64": (64, lambda a, b: (a & b, None)), "s_or_b64": (64, lambda a, b: (a | b, None)),
    "s_xor_b64": (64, lambda a, b: (a ^ b, None)),
    "s_andn2_b64": (64, lambda a, b: (a & ~b & 0xFFFFFFFFFFFFFFFF, None)),
    "s_orn2_b64": (64, lambda a, b: ((a | ~b) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_nand_b64": (64, lambda a, b: (~(a & b) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_nor_b64": (64, lambda a, b: (~(a | b) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_xnor_b64": (64, lambda a, b: (~(a ^ b) & 0xFFFFFFFFFFFFFFFF, None)),
    "s_bfe_u32": (32, lambda a, b: ((a >> (b & 31)) & ((1 << ((b >> 16) & 0x7F)) - 1) & 0xFFFFFFFF, None)),
    "s_bfe_i32": (32, lambda a, b: (_sbfe(a, b & 31, (b >> 16) & 0x7F, 32), None)),
    "s_bfe_u64": (64, lambda a, b: ((a >> (b & 63)) & ((1 << ((b >> 16) & 0x7F)) - 1), None)),
    "s_bfe_i64": (64, lambda a, b: (_sbfe(a, b & 63, (b >> 16) & 0x7F, 64), None)),
    "s_cselect_b32": (32, None), "s_cselect_b64": (64, None),
    "s_addc_u32": (32, None), "s_subb_u32": (32, None),
}
# ops whose SCC is "result != 0"
SCC_NZ = {"s_lshl_b32", "s_lshr_b32", "s_ashr_i32", "s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_and_b32", "s_or_b32",
          "s_xor_b32", "s_andn2_b32", "s_orn2_b32", "s_and_b64", "s_or_b64", "s_xor_b64", "s_andn2_b64", "s_orn2_b64",
          "s_nand_b64", "s_nor_b64", "s_xnor_b64", "s_bfe_u32", "s_bfe_i32", "s_bfe_u64", "s_bfe_i64"}


def _sbfe(a, off, wid, bits):
    if wid == 0:
        return 0
    v = (a >> off) & ((1 << wid) - 1)
    if v >> (wid - 1):
        v -= 1 << wid
    return v & ((1 << bits) - 1)


def _brev(x, bits):
    return int(f"{x:0{bits}b}"[::-1], 2)


def _flbit_u(x, bits=32):
    return 0xFFFFFFFF if x == 0 else bits - x.bit_length()


SALU1 = {  # name: (dst width, src width, fn(a) -> result, scc rule: None, "nz")
    "s_mov_b32": (32, 32, lambda a: a, None), "s_mov_b64": (64, 64, lambda a: a, None),
    "s_not_b32": (32, 32, lambda a: ~a & 0xFFFFFFFF, "nz"), "s_not_b64": (64, 64, lambda a: ~a & (2**64 - 1), "nz"),
    "s_brev_b32": (32, 32, lambda a: _brev(a, 32), None), "s_brev_b64": (64, 64, lambda a: _brev(a, 64), None),
    "s_abs_i32": (32, 32, lambda a: abs(sx(a)) & 0xFFFFFFFF, "nz"),
    "s_sext_i32_i8": (32, 32, lambda a: sx(a, 8) & 0xFFFFFFFF, None),
    "s_sext_i32_i16": (32, 32, lambda a: sx(a, 16) & 0xFFFFFFFF, None),
    "s_flbit_i32_b32": (32, 32, _flbit_u, None),
    "s_flbit_i32": (32, 32, lambda a: 0xFFFFFFFF if a in (0, 0xFFFFFFFF) else _flbit_u(a if not a >> 31 else ~a & 0xFFFFFFFF), None),
    "s_ff1_i32_b32": (32, 32, lambda a: 0xFFFFFFFF if a == 0 else (a & -a).bit_length() - 1, None),
    "s_ff1_i32_b64": (32, 64, lambda a: 0xFFFFFFFF if a == 0 else (a & -a).bit_length() - 1, None),
    "s_bcnt1_i32_b32": (32, 32, lambda a: bin(a).count("1"), "nz"),
    "s_bcnt1_i32_b64": (32, 64, lambda a: bin(a).count("1"), "nz"),
}

SCMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
        "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}

SDWA_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8), "WORD_0": (0, 16),
            "WORD_1": (16, 16), "DWORD": (0, 32)}


def reg_list(ops):
    out = []
    for o in ops:
        out += o.regs()
    return out


class Compiler:
    """Turns a decoded instruction into fn(wave) -> next pc or None."""

    def __init__(self, arch):
        self.arch = arch

    def compile(self, ins):
        name = ins.mnem
        ops = [Op(t) for t in ins.ops]
        for key in ("clamp", "mul", "div", "dpp8", "row_shl", "row_shr", "row_ror", "row_mirror", "quad_perm",
                    "row_bcast", "wave_shl", "wave_shr", "wave_rol", "wave_ror", "row_half_mirror"):
            if key in ins.mods and not name.startswith(("ds_", "buffer_", "global_", "flat_", "s_")):
                raise Unsupported(f"modifier {key} in {ins.text}")
        if name.startswith("s_") and not name.startswith(("s_load", "s_buffer")):
            fn, dst, src = self.salu(name, ops, ins)
        elif name.startswith(("v_mfma", "v_smfmac")):
            fn, dst, src = self.mfma(name, ops, ins)
        elif name.startswith("v_"):
            fn, dst, src = self.valu(name, ops, ins)
        else:
            fn, dst, src = self.mem(name, ops, ins)
        reads = frozenset(reg_list(src))
        writes = frozenset(reg_list(dst))
        rw = reads | writes
        text = ins.text

        def run(w):
            if w.pending and not rw.isdisjoint(w.pending):
                bad = sorted(rw & set(w.pending))
                raise WaitcntError(f"wave {w.wid}: {text!r} uses {bad} before an s_waitcnt covers the load that "
                                   f"writes them")
            return fn(w)
        return run

    # ----------------------------------------------------------------- scalar
    def salu(self, name, ops, ins):
        pc_next = ins.addr + ins.size
        if name in ("s_nop", "s_waitcnt", "s_barrier", "s_endpgm", "s_setprio", "s_sleep", "s_sched_barrier",
                    "s_dcache_wb", "s_icache_inv", "s_dcache_inv", "s_trap"):
            if name == "s_waitcnt":
                vm = int(ins.mods.get("vmcnt", 63))
                lg = int(ins.mods.get("lgkmcnt", 15))
                if "expcnt" in ins.mods and len(ins.mods) == 1:
                    return (lambda w: None), [], []
                return (lambda w: w.waitcnt(vm, lg)), [], []
            if name == "s_barrier":
                def f(w):
                    w.waiting = True
                return f, [], []
            if name == "s_endpgm":
                def f(w):
                    w.done = True
                    return ins.addr
                return f, [], []
            if name == "s_trap":
                def f(w):
                    raise EmuError(f"wave {w.wid}: s_trap (the kernel trapped)")
                return f, [], []
            return (lambda w: None), [], []
        if name.startswith("s_cbranch") or name == "s_branch":
            target = pc_next + 4 * sx(int(ops[0].k, 0), 16)
            cond = name[len("s_cbranch_"):] if name != "s_branch" else "always"
            test = {"always": lambda w: True, "scc0": lambda w: w.scc == 0, "scc1": lambda w: w.scc == 1,
                    "vccz": lambda w: w.vcc() == 0, "vccnz": lambda w: w.vcc() != 0,
                    "execz": lambda w: w.exec64() == 0, "execnz": lambda w: w.exec64() != 0}[cond]

            def f(w):
                return target if test(w) else None
            return f, [], []
        if name == "s_movk_i32":
            wr = sreg_write(ops[0], 32)
            v = sx(int(ops[1].k, 0) & 0xFFFF, 16) & 0xFFFFFFFF
            return (lambda w: wr(w, v)), ops[:1], []
        if name == "s_addk_i32":  # D = D + the sign-extended 16-bit constant
            rd, wr = sreg_read(ops[0], 32), sreg_write(ops[0], 32)
            k = sx(int(ops[1].k, 0) & 0xFFFF, 16)

            def f(w):
                r = sx(rd(w)) + k
                wr(w, r & 0xFFFFFFFF)
                w.scc = int(not -2**31 <= r < 2**31)  # signed overflow, as s_add_i32
            return f, ops[:1], ops[:1]
        if name == "s_setreg_imm32_b32" or name.startswith(("s_getreg", "s_setreg")):
            raise Unsupported(ins.text)
        if name in SALU1:
            dw, sw, fn, rule = SALU1[name]
            rd, wr = sreg_read(ops[1], sw), sreg_write(ops[0], dw)
            if rule == "nz":
                def f(w):
                    r = fn(rd(w))
                    wr(w, r)
                    w.scc = int(r != 0)
            else:
                def f(w):
                    wr(w, fn(rd(w)))
            return f, ops[:1], ops[1:]
        m = re.match(r"s_(and|or|xor|andn2|orn2|nand|nor|xnor)_saveexec_b64$", name)
        if m:
            op = {"and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e,
                  "andn2": lambda s, e: s & ~e, "orn2": lambda s, e: s | ~e, "nand": lambda s, e: ~(s & e),
                  "nor": lambda s, e: ~(s | e), "xnor": lambda s, e: ~(s ^ e)}[m.group(1)]
            rd, wr = sreg_read(ops[1], 64), sreg_write(ops[0], 64)

            def f(w):
                e = w.exec64()
                s = rd(w)
                wr(w, e)
                n = op(s, e) & 0xFFFFFFFFFFFFFFFF
                w.set_exec(n)
                w.scc = int(n != 0)
            return f, ops[:1], ops[1:]
        m = re.match(r"s_cmp_(eq|lg|gt|ge|lt|le)_(i32|u32|u64)$", name)
        if m:
            t = m.group(2)
            width = 64 if t == "u64" else 32
            a, b = sreg_read(ops[0], width), sreg_read(ops[1], width)
            cmp = SCMP[m.group(1)]
            if t == "i32":
                def f(w):
                    w.scc = int(cmp(sx(a(w)), sx(b(w))))
            else:
                def f(w):
                    w.scc = int(cmp(a(w), b(w)))
            return f, [], ops
        m = re.match(r"s_bitcmp([01])_b(32|64)$", name)
        if m:
            want, width = int(m.group(1)), int(m.group(2))
            a, b = sreg_read(ops[0], width), sreg_read(ops[1], 32)

            def f(w):
                w.scc = int((a(w) >> (b(w) & (width - 1)) & 1) == want)
            return f, [], ops
        if name in SALU2:
            width, fn = SALU2[name]
            swidth = 32 if name in ("s_lshl_b64", "s_lshr_b64", "s_ashr_i64") else width
            a = sreg_read(ops[1], width)
            b = sreg_read(ops[2], 32 if name.startswith("s_bfe") else swidth)
            wr = sreg_write(ops[0], width)
            if name.startswith("s_cselect"):
                def f(w):
                    wr(w, a(w) if w.scc else b(w))
            elif name == "s_addc_u32":
                def f(w):
                    r = a(w) + b(w) + w.scc
                    wr(w, r)
                    w.scc = int(r > 0xFFFFFFFF)
            elif name == "s_subb_u32":
                def f(w):
                    x, y = a(w), b(w) + w.scc
                    wr(w, x - y)
                    w.scc = int(y > x)
            elif name in SCC_NZ:
                def f(w):
                    r, _ = fn(a(w), b(w))
                    wr(w, r)
                    w.scc = int(r != 0)
            else:
                def f(w):
                    r, c = fn(a(w), b(w))
                    wr(w, r)
                    if c is not None:
                        w.scc = c
            return f, ops[:1], ops[1:]
        raise Unsupported(f"scalar instruction {ins.text}")

    # ----------------------------------------------------------------- vector
    def valu(self, name, ops, ins):
        mods = ins.mods
        enc = ""
        for suf in ("_e32", "_e64", "_sdwa", "_dpp"):
            if name.endswith(suf):
                name, enc = name[: -len(suf)], suf[1:]
        if enc == "dpp":
            raise Unsupported(f"DPP is not modelled: {ins.text}")
        sdwa = enc == "sdwa"
        sels = [mods.get("src0_sel", "DWORD"), mods.get("src1_sel", "DWORD")] if sdwa else [None, None]
        if "op_sel" in mods and not name.startswith(("v_pk_", "v_fma_mix", "v_pack_b32")):
            raise Unsupported(f"op_sel: {ins.text}")

        if name == "v_readfirstlane_b32":
            wr, src = sreg_write(ops[0], 32), ops[1]
            if src.kind != "v":
                raise Unsupported(ins.text)
            i = src.idx

            def f(w):
                m = w.exec_mask()
                lane = int(np.argmax(m)) if m.any() else 0
                wr(w, int(w.v[i][lane]))
            return f, ops[:1], ops[1:]
        if name == "v_readlane_b32":
            wr, i, ln = sreg_write(ops[0], 32), ops[1].idx, sreg_read(ops[2], 32)

            def f(w):
                wr(w, int(w.v[i][ln(w) & 63]))
            return f, ops[:1], ops[1:]
        if name == "v_writelane_b32":
            i, val, ln = ops[0].idx, sreg_read(ops[1], 32), sreg_read(ops[2], 32)

            def f(w):
                w.v[i][ln(w) & 63] = val(w)
            return f, ops[:1], ops[1:]
        if name in ("v_accvgpr_read_b32", "v_accvgpr_write_b32", "v_accvgpr_mov_b32"):
            rd, wr = vsrc(ops[1], "b32"), vdst(ops[0], 32)

            def f(w):
                wr(w, rd(w), w.exec_mask())
            return f, ops[:1], ops[1:]

        m = re.match(r"v_cmpx?_(\w+?)_([iuf])(16|32|64)$", name)
        if m:
            if name.startswith("v_cmpx"):
                raise Unsupported(ins.text)
            cond, t, bits = m.group(1), m.group(2), int(m.group(3))
            kind = {"i": "i", "u": "u", "f": "f"}[t] + str(bits)
            cmp = CMP[cond]
            a = vsrc(ops[1], kind, sels[0])
            b = vsrc(ops[2], kind, sels[1])
            dst = ops[0]
            wr = sreg_write(dst, 64)

            def f(w):
                m_ = w.exec_mask()
                r = np.broadcast_to(cmp(a(w), b(w)), (64,)) & m_
                wr(w, mask_bits(r))
            return f, ops[:1], ops[1:]

        if name == "v_cndmask_b32":
            a, b = vsrc(ops[1], "b32", sels[0]), vsrc(ops[2], "b32", sels[1])
            if len(ops) > 3:
                c = sreg_read(ops[3], 64)
            else:
                c = lambda w: w.vcc()
            wr = vdst(ops[0], 32)

            def f(w):
                sel = bits_mask(c(w))
                wr(w, np.where(sel, b(w), a(w)), w.exec_mask())
            return f, ops[:1], ops[1:]

        m = re.match(r"v_(add|sub|subrev|addc|subb|subbrev)_co_u32$", name)
        if m:
            kind = m.group(1)
            a, b = vsrc(ops[2], "u32"), vsrc(ops[3], "u32")
            cin = sreg_read(ops[4], 64) if kind in ("addc", "subb", "subbrev") else None
            wr, wc = vdst(ops[0], 32), sreg_write(ops[1], 64)

            def f(w):
                x = np.asarray(a(w), np.int64)
                y = np.asarray(b(w), np.int64)
                ci = bits_mask(cin(w)).astype(np.int64) if cin else 0
                if kind in ("add", "addc"):
                    r = x + y + ci
                    co = r > 0xFFFFFFFF
                elif kind in ("sub", "subb"):
                    r = x - y - ci
                    co = r < 0
                else:
                    r = y - x - ci
                    co = r < 0
                mm = w.exec_mask()
                wr(w, (np.broadcast_to(r, (64,)) & 0xFFFFFFFF).astype(np.uint32), mm)
                wc(w, mask_bits(np.broadcast_to(co, (64,)) & mm))
            return f, ops[:2], ops[2:]

        if name in ("v_mad_u64_u32", "v_mad_i64_i32"):
            signed = name == "v_mad_i64_i32"
            a, b = vsrc(ops[2], "i32" if signed else "u32"), vsrc(ops[3], "i32" if signed else "u32")
            c = vsrc(ops[4], "u64")
            wr, wc = vdst(ops[0], 64), sreg_write(ops[1], 64)

            def f(w):
                x, y = np.asarray(a(w)), np.asarray(b(w))
                cc = np.broadcast_to(np.asarray(c(w), np.uint64), (64,))
                if signed:
                    p = [int(u) * int(v) for u, v in zip(np.broadcast_to(x, (64,)), np.broadcast_to(y, (64,)))]
                else:
                    p = (np.broadcast_to(x, (64,)).astype(object) * np.broadcast_to(y, (64,)).astype(object))
                full = [int(pi) + (sx(int(ci), 64) if signed else int(ci)) for pi, ci in zip(p, cc)]
                res = np.array([v & (2**64 - 1) for v in full], np.uint64)
                carry = np.array([not (-2**63 <= v < 2**63) if signed else v >= 2**64 for v in full])
                mm = w.exec_mask()
                wr(w, res, mm)
                wc(w, mask_bits(carry & mm))
            return f, ops[:2], ops[2:]

        if name == "v_div_scale_f32":
            s0, s1, s2 = (vsrc(o, "f32") for o in ops[2:5])
            wr, wc = vdst(ops[0], 32), sreg_write(ops[1], 64)

            def f(w):
                x, den, num = (np.broadcast_to(np.asarray(g(w), np.float64), (64,)) for g in (s0, s1, s2))
                mm = w.exec_mask()
                # The scaling cases (operands near the denormal or overflow range) are
                # not modelled: with them the result would be silently wrong.
                tiny = np.float64(np.finfo(np.float32).tiny)
                with np.errstate(all="ignore"):
                    q = num / den
                    risky = mm & np.isfinite(num) & np.isfinite(den) & (num != 0) & (den != 0) & (
                        (np.abs(den) < tiny) | (np.abs(1 / den) < tiny) | (np.abs(q) < tiny) |
                        (np.abs(q) > 2.0**96) | (np.abs(num) < 2.0**-102))
                if risky.any():
                    raise Unsupported(f"v_div_scale_f32 scaling path (operands {x[risky][0]}, {den[risky][0]}, "
                                      f"{num[risky][0]})")
                r = np.where((num == 0) | (den == 0), np.nan, x).astype(np.float32)
                wr(w, r, mm)
                wc(w, 0)
            return f, ops[:2], ops[2:]
        if name == "v_div_fmas_f32":
            a, b, c = (vsrc(o, "f32") for o in ops[1:4])
            wr = vdst(ops[0], 32)

            def f(w):
                if w.vcc() & w.exec64():
                    raise Unsupported("v_div_fmas_f32 with VCC set (scaled division)")
                wr(w, (np.float64(1) * a(w) * b(w) + c(w)).astype(np.float32), w.exec_mask())
            return f, ops[:1], ops[1:]
        if name == "v_div_fixup_f32":
            a, b, c = (vsrc(o, "f32") for o in ops[1:4])
            wr = vdst(ops[0], 32)

            def f(w):
                q, den, num = (np.broadcast_to(np.asarray(g(w), np.float32), (64,)) for g in (a, b, c))
                with np.errstate(all="ignore"):
                    exact = num / den
                sign = np.signbit(den) ^ np.signbit(num)
                special = np.isnan(q) | np.isnan(den) | np.isnan(num) | (den == 0) | np.isinf(den) | np.isinf(num)
                r = np.where(special, exact, np.where(sign, -np.abs(q), np.abs(q))).astype(np.float32)
                wr(w, r, w.exec_mask())
            return f, ops[:1], ops[1:]

        if name in ("v_fmac_f32", "v_mac_f32"):
            a, b, c = vsrc(ops[1], "f32"), vsrc(ops[2], "f32"), vsrc(ops[0], "f32")
            wr = vdst(ops[0], 32)
            fused = name == "v_fmac_f32"

            def f(w):
                wr(w, _mac(fused, a(w), b(w), c(w)), w.exec_mask())
            return f, ops[:1], ops
        if name in ("v_fmaak_f32", "v_fmamk_f32", "v_madmk_f32", "v_madak_f32"):
            # printed in evaluation order: fmamk "D, S0, K, S1" (S0 * K + S1), fmaak "D, S0, S1, K"
            a, b, c = (vsrc(o, "f32") for o in ops[1:4])
            wr = vdst(ops[0], 32)
            fused = name.startswith("v_fma")

            def f(w):
                wr(w, _mac(fused, a(w), b(w), c(w)), w.exec_mask())
            return f, ops[:1], ops[1:]

        if name in ("v_pk_fma_f32", "v_pk_mul_f32", "v_pk_add_f32", "v_pk_mov_b32"):
            n = {"v_pk_fma_f32": 3, "v_pk_mul_f32": 2, "v_pk_add_f32": 2, "v_pk_mov_b32": 2}[name]
            osel = _pos(mods, "op_sel", n, 0)
            ohi = _pos(mods, "op_sel_hi", n, 1)
            srcs = []
            for j, o in enumerate(ops[1:1 + n]):
                if o.kind == "k":
                    # An inline constant or literal of a packed-f32 operand is a 32-bit
                    # value in the low dword; code selects it for both halves (op_sel_hi 0).
                    # Zero reads as zero from either dword (v_pk_mov_b32 v[6:7], 0, 0).
                    if (osel[j] or ohi[j]) and const_value(o.k, 32, False) != 0:
                        raise Unsupported(f"the high dword of a constant operand: {ins.text}")
                    srcs.append(vsrc(o, "b32"))
                else:
                    srcs.append(vsrc(o, "b64"))
            nlo, nhi = _pos(mods, "neg_lo", n, 0), _pos(mods, "neg_hi", n, 0)
            wr = vdst(ops[0], 64)
            for o in ops[1:1 + n]:
                if o.abs or o.neg:
                    raise Unsupported(ins.text)
            if name == "v_pk_mov_b32":
                def f(w):
                    x, y = (np.broadcast_to(np.asarray(g(w), np.uint64), (64,)) for g in srcs)
                    lo = (x >> np.uint64(32 * osel[0])) & np.uint64(0xFFFFFFFF)
                    hi = (y >> np.uint64(32 * osel[1])) & np.uint64(0xFFFFFFFF)
                    wr(w, lo | (hi << np.uint64(32)), w.exec_mask())
                return f, ops[:1], ops[1:]
            kindop = {"v_pk_fma_f32": lambda a, b, c: (np.float64(1) * a * b + c).astype(np.float32),
                      "v_pk_mul_f32": lambda a, b: a * b, "v_pk_add_f32": lambda a, b: a + b}[name]

            def half(x, sel, neg):
                v = ((x >> np.uint64(32 * sel)) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
                return -v if neg else v

            def f(w):
                xs = [np.broadcast_to(np.asarray(g(w), np.uint64), (64,)) for g in srcs]
                lo = kindop(*[half(x, osel[j], nlo[j]) for j, x in enumerate(xs)])
                hi = kindop(*[half(x, ohi[j], nhi[j]) for j, x in enumerate(xs)])
                r = lo.astype(np.float32).view(np.uint32).astype(np.uint64) | (
                    hi.astype(np.float32).view(np.uint32).astype(np.uint64) << np.uint64(32))
                wr(w, r, w.exec_mask())
            return f, ops[:1], ops[1:]
        if name == "v_pk_mul_f16" or name == "v_pk_add_f16" or name == "v_pk_fma_f16":
            n = 3 if name == "v_pk_fma_f16" else 2
            srcs = [vsrc(Op(o.text), "b32") for o in ops[1:1 + n]]
            osel, ohi = _pos(mods, "op_sel", n, 0), _pos(mods, "op_sel_hi", n, 1)
            nlo, nhi = _pos(mods, "neg_lo", n, 0), _pos(mods, "neg_hi", n, 0)
            fn = {"v_pk_mul_f16": lambda a, b: a * b, "v_pk_add_f16": lambda a, b: a + b,
                  "v_pk_fma_f16": lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float16)}[name]
            const = [o.kind == "k" for o in ops[1:1 + n]]

            def part(x, sel, neg, isconst):
                if isconst:  # an inline constant or literal feeds both halves with its low 16 bits
                    sel = 0
                v = ((x >> np.uint32(16 * sel)) & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
                return -v if neg else v

            def f(w):
                xs = [np.broadcast_to(np.asarray(g(w), np.uint32), (64,)) for g in srcs]
                lo = fn(*[part(x, osel[j], nlo[j], const[j]) for j, x in enumerate(xs)]).astype(np.float16)
                hi = fn(*[part(x, ohi[j], nhi[j], const[j]) for j, x in enumerate(xs)]).astype(np.float16)
                r = lo.view(np.uint16).astype(np.uint32) | (hi.view(np.uint16).astype(np.uint32) << np.uint32(16))
                w_ = vdst(ops[0], 32)
                w_(w, r, w.exec_mask())
            return f, ops[:1], ops[1:]
        if name in ("v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16"):
            osel, ohi = _pos(mods, "op_sel", 3, 0), _pos(mods, "op_sel_hi", 3, 0)
            raws = [vsrc(Op(o.text.lstrip("-").strip("|")), "b32") for o in ops[1:4]]
            negs = [o.neg for o in ops[1:4]]
            abss = [o.abs for o in ops[1:4]]
            wr = vdst(ops[0], 32)
            dst_i = ops[0].idx
            consts = [o for o in ops[1:4]]

            def val(j, w):
                x = np.broadcast_to(np.asarray(raws[j](w), np.uint32), (64,))
                if ohi[j]:  # a 16-bit operand, from the half op_sel picks
                    if consts[j].kind == "k" and "." in consts[j].k:
                        v = np.full(64, float(consts[j].k))
                    else:
                        v = ((x >> np.uint32(16 * osel[j])) & np.uint32(0xFFFF)).astype(np.uint16).view(
                            np.float16).astype(np.float64)
                else:
                    v = x.view(np.float32).astype(np.float64)
                if abss[j]:
                    v = np.abs(v)
                return -v if negs[j] else v

            def f(w):
                r = (val(0, w) * val(1, w) + val(2, w))
                mm = w.exec_mask()
                if name == "v_fma_mix_f32":
                    wr(w, r.astype(np.float32), mm)
                else:
                    h = r.astype(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
                    old = w.v[dst_i]
                    if name == "v_fma_mixlo_f16":
                        new = (old & np.uint32(0xFFFF0000)) | h
                    else:
                        new = (old & np.uint32(0xFFFF)) | (h << np.uint32(16))
                    wr(w, new, mm)
            return f, ops[:1], ops[1:]

        if name not in VOP or VOP[name] is None:
            raise Unsupported(f"vector instruction {ins.text}")
        dkind, skinds, fn = VOP[name]
        n = len(skinds)
        if len(ops) != n + 1:
            raise Unsupported(f"operand count of {ins.text}")
        if name == "v_pack_b32_f16":
            osel = _pos(mods, "op_sel", 3, 0)
            if any(osel):
                raise Unsupported(ins.text)
        srcs = [vsrc(o, k, sels[j] if j < 2 else None) for j, (o, k) in enumerate(zip(ops[1:], skinds))]
        dwidth = KINDS[dkind][0]
        wr = vdst(ops[0], 64 if dwidth == 64 else 32)
        if sdwa:
            dsel = mods.get("dst_sel", "DWORD")
            unused = mods.get("dst_unused", "UNUSED_PAD")
            shift, bits = SDWA_SEL[dsel]
            di = ops[0].idx

            def f(w):
                with np.errstate(all="ignore"):
                    r = np.broadcast_to(fn(*[s(w) for s in srcs]), (64,))
                b = bits_of(r, 16 if dwidth == 16 else 32).astype(np.uint32)
                b = (b & np.uint32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)) << np.uint32(shift)
                if bits < 32:
                    if unused == "UNUSED_PRESERVE":
                        keep = ~np.uint32(((1 << bits) - 1) << shift)
                        b = b | (w.v[di] & keep)
                    elif unused == "UNUSED_SEXT":
                        raise Unsupported(ins.text)
                wr(w, b, w.exec_mask())
            return f, ops[:1], ops[1:]
        if dwidth == 16:  # gfx9: 16-bit VALU results zero the upper half
            def f(w):
                with np.errstate(all="ignore"):
                    r = np.broadcast_to(fn(*[s(w) for s in srcs]), (64,))
                wr(w, bits_of(r, 16), w.exec_mask())
        else:
            def f(w):
                with np.errstate(all="ignore"):
                    r = fn(*[s(w) for s in srcs])
                wr(w, r, w.exec_mask())
        return f, ops[:1], ops[1:]

    # ----------------------------------------------------------------- MFMA
    def mfma(self, name, ops, ins):
        if name not in MFMA:
            raise Unsupported(f"MFMA {ins.text}")
        n, k, dt = MFMA[name]
        if self.arch == "gfx942" and name.endswith("_1k") or self.arch == "gfx90a" and name.endswith("_bf16"):
            raise Unsupported(f"{name} does not exist on {self.arch}")
        for key in ("cbsz", "abid", "blgp"):
            if int(ins.mods.get(key, 0)):
                raise Unsupported(f"{key} in {ins.text}")
        (a_i, a_k), (b_k, b_j), (d_i, d_j) = mfma_layout(n, k)
        regs = n * n // 64
        dst, A, B, C = ops
        if dst.n != regs or A.n != 2 or B.n != 2:
            raise Unsupported(f"register counts of {ins.text}")

        def rd(op, count):
            if op.kind == "k":
                v = np.array(const_value(op.k, 32, False), np.uint32).view(np.float32)
                return lambda w: np.full((64, count), v, np.float32)
            i, a = op.idx, op.kind == "a"
            return lambda w: (w.a if a else w.v)[i:i + count].T
        ra, rb, rc = rd(A, 2), rd(B, 2), rd(C, regs)
        di, da = dst.idx, dst.kind == "a"

        def f(w):
            if not w.exec_mask().all():
                raise Unsupported("MFMA with a partial EXEC mask")
            av, bv = unpack16(ra(w), dt), unpack16(rb(w), dt)
            mA = np.zeros((n, k))
            mA[a_i, a_k] = av
            mB = np.zeros((k, n))
            mB[b_k, b_j] = bv
            cv = np.asarray(rc(w), np.uint32).view(np.float32).astype(np.float64)
            d = (mA @ mB)[d_i, d_j] + cv
            out = d.astype(np.float32).view(np.uint32).T
            (w.a if da else w.v)[di:di + regs] = out
        return f, [dst], [A, B, C]

    # ----------------------------------------------------------------- memory
    def mem(self, name, ops, ins):
        mods = ins.mods
        if name.startswith("s_load_dword"):
            nd = {"s_load_dword": 1, "s_load_dwordx2": 2, "s_load_dwordx4": 4, "s_load_dwordx8": 8,
                  "s_load_dwordx16": 16}[name]
            dst, base, off = ops
            bi = base.idx
            offr = sreg_read(off, 32)
            di = dst.idx
            regs = dst.regs()

            def f(w):
                addr = (w.s[bi] | (w.s[bi + 1] & 0xFFFF) << 32) + offr(w)
                addr &= ~3
                data = w.wg.m.mem.gather(np.array([addr], np.uint64), 4 * nd, ins.text)[0].view(np.uint32)
                w.s[di:di + nd] = [int(x) for x in data]
                w.issue("lgkm", regs, smem=True)
            return f, [dst], [base, off]

        offset = int(mods.get("offset", 0))
        if name.startswith("buffer_"):
            return self.buffer(name, ops, ins, offset)
        if name.startswith(("global_", "flat_")):
            return self.global_(name, ops, ins, offset)
        if name.startswith("ds_"):
            return self.ds(name, ops, ins)
        raise Unsupported(f"instruction {ins.text}")

    WIDTH = {"dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "ushort": 2, "short": 2, "sshort": 2,
             "ubyte": 1, "sbyte": 1, "byte": 1}

    def _load_result(self, kind, raw):
        """(n, width) uint8 -> (n, dwords) uint32 as a load of `kind` writes registers."""
        if kind in ("ubyte", "ushort"):
            return raw.astype(np.uint32)[:, :1] if kind == "ubyte" else raw.copy().view(np.uint16).astype(np.uint32)
        if kind == "sbyte":
            return raw.view(np.int8).astype(np.int32).view(np.uint32)
        if kind == "sshort":
            return raw.copy().view(np.int16).astype(np.int32).view(np.uint32)
        return raw.copy().view(np.uint32)

    def buffer(self, name, ops, ins, inst_off):
        mods = ins.mods
        mm = re.match(r"buffer_(load|store)_(\w+)$", name)
        if not mm or "idxen" in mods or "lds" in mods:
            raise Unsupported(ins.text)
        store = mm.group(1) == "store"
        kind = mm.group(2)
        width = self.WIDTH[kind]
        data, vaddr, rsrc, soff = ops
        offen = "offen" in mods
        vi = vaddr.idx
        ri = rsrc.idx
        sread = sreg_read(soff, 32)
        dreg = data.kind
        di = data.idx
        ndw = max(1, width // 4)
        text = ins.text

        def f(w):
            mask = w.exec_mask()
            d0, d1, nrec, d3 = w.s[ri:ri + 4]
            base = d0 | (d1 & 0xFFFF) << 32
            stride = (d1 >> 16) & 0x3FFF
            if stride:
                raise Unsupported(f"{text}: strided buffer (stride {stride})")
            # gfx9: DATA_FORMAT 0 ("invalid") makes every access out of range.
            fmt_ok = ((d3 >> 15) & 0xF) != 0
            off = (w.v[vi].astype(np.uint64) if offen else np.zeros(64, np.uint64)) + np.uint64(inst_off)
            lanes = np.nonzero(mask)[0]
            # Range check per dword (per element for sub-dword accesses), as gfx9 does for
            # raw buffers: bytes [off, off + size) of each element must lie below num_records.
            elem = min(width, 4)
            nel = max(1, width // 4)
            eoff = off[lanes][:, None] + np.arange(nel, dtype=np.uint64)[None, :] * np.uint64(elem)
            inr = (eoff + np.uint64(elem) <= np.uint64(nrec)) & fmt_ok
            partial = inr.any(axis=1) & ~inr.all(axis=1)
            if partial.any():
                w.wg.m.partial_buffer_accesses += int(partial.sum())
            addr = np.uint64(base) + np.uint64(sread(w)) + eoff
            if store:
                if dreg == "v":
                    src = w.v[di:di + ndw][:, lanes].T
                else:
                    src = w.a[di:di + ndw][:, lanes].T
                b = np.ascontiguousarray(src).view(np.uint8).reshape(len(lanes), ndw * 4)[:, :width]
                sel = inr.reshape(-1)
                if sel.any():
                    w.wg.m.mem.scatter(addr.reshape(-1)[sel], b.reshape(len(lanes) * nel, elem)[sel], text)
            else:
                out = np.zeros((len(lanes) * nel, elem), np.uint8)
                sel = inr.reshape(-1)
                if sel.any():
                    out[sel] = w.wg.m.mem.gather(addr.reshape(-1)[sel], elem, text)
                res = self._load_result(kind, out.reshape(len(lanes), width))
                r = w.v if dreg == "v" else w.a
                r[di:di + res.shape[1], lanes] = res.T
                w.issue("vm", data.regs())
            if store:
                w.issue("vm", ())
        srcs = [vaddr, rsrc, soff] + ([data] if store else [])
        return f, ([] if store else [data]), srcs

    def global_(self, name, ops, ins, inst_off):
        mods = ins.mods
        mm = re.match(r"(global|flat)_(load|store|atomic)_(\w+)$", name)
        if not mm:
            raise Unsupported(ins.text)
        op = mm.group(2)
        kind = mm.group(3)
        text = ins.text
        returns = op == "load" or (op == "atomic" and ("glc" in mods or "sc0" in mods))
        if op == "load":
            dst, vaddr = ops[0], ops[1]
            saddr = ops[2] if len(ops) > 2 else None
            data = None
        else:
            if returns:
                dst, vaddr, data = ops[0], ops[1], ops[2]
                saddr = ops[3] if len(ops) > 3 else None
            else:
                dst = None
                vaddr, data = ops[0], ops[1]
                saddr = ops[2] if len(ops) > 2 else None
        if saddr is not None and saddr.kind == "off":
            saddr = None
        vi = vaddr.idx
        si = saddr.idx if saddr is not None else None
        if op == "atomic":
            if kind not in ("add_f32", "add", "add_x2"):
                raise Unsupported(text)
            width = 8 if kind.endswith("x2") else 4
        else:
            width = self.WIDTH[kind]
        ndw = max(1, width // 4)

        def addresses(w, lanes):
            if si is None:
                a = w.v[vi][lanes].astype(np.uint64) | (w.v[vi + 1][lanes].astype(np.uint64) << np.uint64(32))
            else:
                a = np.uint64(w.s[si] | w.s[si + 1] << 32) + w.v[vi][lanes].astype(np.uint64)
            return a + np.uint64(inst_off & 0xFFFFFFFFFFFFFFFF) if inst_off >= 0 else a - np.uint64(-inst_off)

        def src_bytes(w, lanes):
            r = w.v if data.kind == "v" else w.a
            return np.ascontiguousarray(r[data.idx:data.idx + ndw][:, lanes].T).view(np.uint8).reshape(
                len(lanes), ndw * 4)[:, :width]

        def f(w):
            lanes = np.nonzero(w.exec_mask())[0]
            if len(lanes) == 0:
                w.issue("vm", dst.regs() if returns else ())
                return
            addr = addresses(w, lanes)
            if op == "load":
                raw = w.wg.m.mem.gather(addr, width, text)
                res = self._load_result(kind, raw)
                r = w.v if dst.kind == "v" else w.a
                r[dst.idx:dst.idx + res.shape[1], lanes] = res.T
                w.issue("vm", dst.regs())
            elif op == "store":
                w.wg.m.mem.scatter(addr, src_bytes(w, lanes), text)
                w.issue("vm", ())
            else:
                # atomics: lanes in order, each a read-modify-write of memory
                vals = src_bytes(w, lanes)
                olds = []
                for j, a in enumerate(addr):
                    old = w.wg.m.mem.gather(np.array([a], np.uint64), width, text)[0]
                    if kind == "add_f32":
                        new = np.array([old.view(np.float32)[0] + vals[j].view(np.float32)[0]], np.float32)
                    elif kind == "add":
                        new = np.array([old.view(np.uint32)[0] + vals[j].view(np.uint32)[0]], np.uint32)
                    else:
                        new = np.array([old.view(np.uint64)[0] + vals[j].view(np.uint64)[0]], np.uint64)
                    w.wg.m.mem.scatter(np.array([a], np.uint64), new.view(np.uint8).reshape(1, width), text)
                    olds.append(old)
                w.wg.m.atomics += len(lanes)
                if returns:
                    res = np.array(olds).view(np.uint32).reshape(len(lanes), -1)
                    w.v[dst.idx:dst.idx + res.shape[1], lanes] = res.T
                w.issue("vm", dst.regs() if returns else ())
        srcs = [vaddr] + ([saddr] if saddr is not None else []) + ([data] if data is not None else [])
        return f, ([dst] if returns else []), srcs

    def ds(self, name, ops, ins):
        mods = ins.mods
        text = ins.text
        if name == "ds_bpermute_b32" or name == "ds_permute_b32":
            dst, addr, data = ops
            off = int(mods.get("offset", 0))
            back = name == "ds_bpermute_b32"

            def f(w):
                mask = w.exec_mask()
                sel = ((w.v[addr.idx].astype(np.int64) + off) // 4) % 64
                src = w.v[data.idx]
                if back:
                    # lanes read the source lane's value; an inactive source lane gives 0
                    val = np.where(mask[sel], src[sel], 0).astype(np.uint32)
                    w.v[dst.idx][mask] = val[mask]
                else:
                    out = np.zeros(64, np.uint32)
                    for ln in np.nonzero(mask)[0]:
                        out[sel[ln]] = src[ln]
                    w.v[dst.idx][mask] = out[mask]
                w.issue("lgkm", dst.regs())
            return f, [dst], [addr, data]
        if name.startswith("ds_swizzle") or name.startswith("ds_append") or name.startswith("ds_consume"):
            raise Unsupported(text)
        mm = re.match(r"ds_(read|write)(2st64|2)?_(b8|b16|u8|u16|i8|i16|b32|b64|b96|b128)$", name)
        if not mm:
            raise Unsupported(text)
        write = mm.group(1) == "write"
        two = mm.group(2)
        t = mm.group(3)
        width = {"b8": 1, "u8": 1, "i8": 1, "b16": 2, "u16": 2, "i16": 2, "b32": 4, "b64": 8, "b96": 12, "b128": 16}[t]
        if two:
            scale = width * (64 if two == "2st64" else 1)
            offs = [int(mods.get("offset0", 0)) * scale, int(mods.get("offset1", 0)) * scale]
        else:
            offs = [int(mods.get("offset", 0))]
        ndw = max(1, width // 4)
        if write:
            addr = ops[0]
            datas = ops[1:]
            dst = None
        else:
            dst, addr = ops[0], ops[1]
            datas = []

        def f(w):
            lanes = np.nonzero(w.exec_mask())[0]
            base = w.v[addr.idx][lanes].astype(np.int64)
            wg = w.wg
            for j, o in enumerate(offs):
                a = (base + o) & 0xFFFFFFFF  # 32-bit LDS address arithmetic
                if write:
                    d = datas[j]
                    r = w.v if d.kind == "v" else w.a
                    b = np.ascontiguousarray(r[d.idx:d.idx + ndw][:, lanes].T).view(np.uint8).reshape(
                        len(lanes), ndw * 4)[:, :width]
                    wg.lds_access(w, a, width, b, text)
                else:
                    raw = wg.lds_access(w, a, width, None, text)
                    if t in ("u8", "b8"):
                        res = raw.astype(np.uint32)
                    elif t in ("u16", "b16"):
                        res = raw.copy().view(np.uint16).astype(np.uint32)
                    elif t == "i8":
                        res = raw.view(np.int8).astype(np.int32).view(np.uint32)
                    elif t == "i16":
                        res = raw.copy().view(np.int16).astype(np.int32).view(np.uint32)
                    else:
                        res = raw.copy().view(np.uint32)
                    r = w.v if dst.kind == "v" else w.a
                    r[dst.idx + j * ndw:dst.idx + j * ndw + res.shape[1], lanes] = res.T
            w.issue("lgkm", dst.regs() if dst is not None else ())
        return f, ([dst] if dst is not None else []), [addr] + datas


# ---------------------------------------------------------------------------------------
# Workgroups, dispatch
# ---------------------------------------------------------------------------------------

class Workgroup:
    def __init__(self, machine, lds_bytes, nwaves, race_check):
        self.m = machine
        self.lds = np.full(max(lds_bytes, 4), 0xFF, np.uint8)  # 0xFFFFFFFF: a NaN in every format
        self.lds_size = lds_bytes
        self.epoch = 0
        self.race = race_check
        if race_check:
            self.writer = np.full(self.lds.size, -1, np.int16)
            self.wepoch = np.full(self.lds.size, -1, np.int32)
            self.readers = np.zeros(self.lds.size, np.uint64)
            self.repoch = np.full(self.lds.size, -1, np.int32)

    def lds_access(self, w, addrs, width, data, what):
        if len(addrs) == 0:
            return np.zeros((0, width), np.uint8)
        if (addrs < 0).any() or (addrs + width > self.lds_size).any():
            bad = int(addrs[(addrs < 0) | (addrs + width > self.lds_size)][0])
            raise MemoryFault(f"wave {w.wid}: {what}: LDS address {bad} (+{width}) outside the {self.lds_size} bytes "
                              f"the kernel allocates")
        idx = (addrs[:, None] + np.arange(width)[None, :]).reshape(-1)
        if self.race:
            cur = self.epoch
            other_w = (self.writer[idx] != w.wid) & (self.writer[idx] >= 0) & (self.wepoch[idx] == cur)
            if other_w.any():
                b = int(idx[other_w][0])
                raise RaceError(f"wave {w.wid}: {what}: LDS byte {b} was written by wave {int(self.writer[b])} "
                                f"since the last barrier")
            if data is not None:
                mine = np.uint64(1) << np.uint64(w.wid)
                rd = (self.repoch[idx] == cur) & ((self.readers[idx] & ~mine) != 0)
                if rd.any():
                    b = int(idx[rd][0])
                    raise RaceError(f"wave {w.wid}: {what}: overwrites LDS byte {b} that another wave read since the "
                                    f"last barrier")
                self.writer[idx] = w.wid
                self.wepoch[idx] = cur
            else:
                stale = self.repoch[idx] != cur
                self.readers[idx[stale]] = 0
                self.repoch[idx] = cur
                self.readers[idx] |= np.uint64(1) << np.uint64(w.wid)
        if data is not None:
            self.lds[idx] = data.reshape(-1)
            return None
        return self.lds[idx].reshape(len(addrs), width)


class Machine:
    """Runs kernels of one code object over one Memory."""

    ORDERS = ("sequential", "reverse", "roundrobin", "random")

    def __init__(self, codeobj, memory):
        self.co = codeobj
        self.arch = codeobj.arch
        self.mem = memory
        self.compiler = Compiler(self.arch)
        self.partial_buffer_accesses = 0
        self.atomics = 0
        self.instructions = 0
        self.coverage = set()  # addresses of the instructions executed

    def _fn(self, pc):
        ins = self.co.instrs.get(pc)
        if ins is None:
            raise EmuError(f"jump to {pc:#x}, which is not an instruction")
        if ins.fn is None:
            ins.fn = self.compiler.compile(ins)
        return ins

    def launch(self, kernel, grid, block, kernarg, order="sequential", seed=0, race_check=True,
               workgroups=None, wg_order="forward"):
        """Runs kernel (a name fragment) over grid (x, y, z) of block (x, y, z) threads with
        kernarg (bytes).  workgroups: optional list of (x, y, z) to run (default: all), in
        wg_order ("forward", "reverse" or "random"): workgroups run one after another."""
        name, entry, kd = self.co.kernel(kernel)
        if kd.wave32:
            raise Unsupported("wave32 kernel")
        if len(kernarg) > kd.kernarg_size:
            raise EmuError(f"kernarg of {len(kernarg)} bytes for a kernel that takes {kd.kernarg_size}")
        # The runtime's kernarg buffer is padded (to 64 bytes here): the compiler widens
        # argument loads past the last argument (s_load_dwordx4 at 0x30 of a 60-byte segment).
        ka = bytes(kernarg) + bytes(-len(kernarg) % 64 if len(kernarg) % 64 else 0)
        ka_addr = self.mem.alloc(max(len(ka), 4), "kernarg", np.frombuffer(ka, np.uint8) if ka else None)
        threads = block[0] * block[1] * block[2]
        nwaves = (threads + 63) // 64
        rng = random.Random(seed)
        wgs = workgroups if workgroups is not None else [(x, y, z) for z in range(grid[2]) for y in range(grid[1])
                                                           for x in range(grid[0])]
        if wg_order == "reverse":
            wgs = wgs[::-1]
        elif wg_order == "random":
            wgs = list(wgs)
            rng.shuffle(wgs)
        elif wg_order != "forward":
            raise ValueError(wg_order)
        for g in wgs:
            wg = Workgroup(self, kd.group_segment_size, nwaves, race_check)
            waves = []
            for wi in range(nwaves):
                w = Wave(wg, wi)
                sg = 0
                for u in kd.user_sgprs:
                    if u == "kernarg_segment_ptr":
                        w.s[sg], w.s[sg + 1] = ka_addr & 0xFFFFFFFF, ka_addr >> 32
                        sg += 2
                    elif u == "private_segment_buffer":
                        w.s[sg:sg + 4] = [0, 0, 0, 0]  # no scratch: any use faults on the 0 address
                        sg += 4
                    elif u == "private_segment_size":
                        w.s[sg] = 0
                        sg += 1
                    else:
                        raise Unsupported(f"user SGPR {u}")
                if sg != kd.user_sgpr_count:
                    raise EmuError(f"user SGPR count {kd.user_sgpr_count} but {sg} laid out")
                for d in range(3):
                    if kd.workgroup_id[d]:
                        w.s[sg] = g[d]
                        sg += 1
                if kd.workgroup_info:
                    raise Unsupported("workgroup info SGPR")
                if kd.private_segment_wave_offset:
                    w.s[sg] = 0
                    sg += 1
                t = np.arange(wi * 64, wi * 64 + 64)
                tx, ty, tz = t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1])
                # gfx90a and gfx942 pack the work-item ids into v0 (x, y << 10, z << 20)
                w.v[0] = (tx | ty << 10 | tz << 20).astype(np.uint32)
                live = t < threads
                w.set_exec(mask_bits(live))
                w.pc = entry
                waves.append(w)
            self._run_group(wg, waves, order, rng)

    def _run_group(self, wg, waves, order, rng):
        cov = self.coverage

        def step(w):
            cov.add(w.pc)
            ins = self._fn(w.pc)
            r = ins.fn(w)
            w.count += 1
            w.pc = r if r is not None else w.pc + ins.size

        def runnable():
            return [w for w in waves if not w.done and not w.waiting]

        budget = 50_000_000
        while True:
            ready = runnable()
            if not ready:
                live = [w for w in waves if not w.done]
                if not live:
                    break
                # every live wave waits at the barrier: release it
                for w in live:
                    w.waiting = False
                wg.epoch += 1
                continue
            if order == "sequential" or order == "reverse":
                seq = ready if order == "sequential" else ready[::-1]
                for w in seq:
                    while not w.done and not w.waiting:
                        step(w)
            elif order == "roundrobin":
                for w in ready:
                    if not w.done and not w.waiting:
                        step(w)
            elif order == "random":
                w = rng.choice(ready)
                for _ in range(rng.randint(1, 8)):
                    if w.done or w.waiting:
                        break
                    step(w)
            else:
                raise ValueError(order)
            budget -= 1
            if budget == 0:
                raise EmuError("instruction budget exhausted (an endless loop?)")
        for w in waves:
            self.instructions += w.count
            if w.vm or w.lgkm:
                # stores still counted are fine; loads never waited on are not an error either
                pass
