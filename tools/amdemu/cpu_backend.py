"""The same problems on fmha's CPU backend, through the C API of a built libfmha (ctypes,
host pointers): the second reference the emulated HIP kernels are compared with.

libfmha is looked for in $FMHA_LIBFMHA, then build-ctest/ and build-amdemu/ of the
repository (.ci/run builds the first, .ci/amd_emu.sh the second when neither exists)."""

import ctypes as C
import os
import pathlib

import numpy as np

from . import fmha_launch as L

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def find_library():
    cands = [os.environ.get("FMHA_LIBFMHA")] + [str(ROOT / d / "libfmha.so") for d in ("build-ctest", "build-amdemu")]
    return next((c for c in cands if c and pathlib.Path(c).exists()), None)


class Lib:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        self.lib.fmha_last_error.restype = C.c_char_p
        for name, struct in (("fwd", L.FwdParams), ("bwd", L.BwdParams), ("decode", L.DecodeParams)):
            # the library's own sizeof, written by its _init, against this module's layout
            buf = (C.c_uint8 * 4096)()
            getattr(self.lib, f"fmha_{name}_params_init")(buf)
            size = int.from_bytes(bytes(buf[:4]), "little")
            if size != C.sizeof(struct):
                raise RuntimeError(f"fmha_{name}_params: libfmha says {size} bytes, amdemu's ctypes layout "
                                   f"{C.sizeof(struct)}")

    def call(self, name, params):
        st = getattr(self.lib, f"fmha_{name}")(C.byref(params), None)
        if st != 0:
            raise RuntimeError(f"fmha_{name}: status {st}: {self.lib.fmha_last_error().decode()}")


def _ptr(a):
    return a.ctypes.data


def fwd(lib, c):
    """out (rows, Hq, D) and lse (Hq, rows) of Case c from the CPU backend."""
    keep = []
    bits = lambda x: keep.append(np.ascontiguousarray(L.to_bits(x, c.dtype))) or keep[-1]
    q, k, v = bits(c.q), bits(c.k), bits(c.v)
    out = np.zeros_like(q)
    lse = np.zeros(c.Hq * c.q.shape[0], np.float32)
    pr = _problem(c, keep)
    p = L.FwdParams(C.sizeof(L.FwdParams), 0, pr, c.tensor(_ptr(q), c.Sq, c.Hq), c.tensor(_ptr(k), c.Sk, c.Hk),
                    c.tensor(_ptr(v), c.Sk, c.Hk), c.tensor(_ptr(out), c.Sq, c.Hq), _ptr(lse), L.Tensor(0, 0, 0, 0))
    lib.call("fwd", p)
    return L.from_bits(out, c.dtype).reshape(c.q.shape), c.lse_from_device(lse)


def bwd(lib, c, out, lse):
    """dq, dk, dv of Case c from the CPU backend, given the forward's out and lse (Hq, rows)."""
    keep = []
    bits = lambda x: keep.append(np.ascontiguousarray(L.to_bits(x, c.dtype))) or keep[-1]
    q, k, v, o, do = bits(c.q), bits(c.k), bits(c.v), bits(out), bits(c.dout)
    if c.varlen:
        lse_dev = np.ascontiguousarray(lse, np.float32)
    else:
        lse_dev = np.ascontiguousarray(lse.reshape(c.Hq, c.B, c.Sq).transpose(1, 0, 2), np.float32)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    pr = _problem(c, keep)
    p = L.BwdParams(C.sizeof(L.BwdParams), 0, pr, c.tensor(_ptr(q), c.Sq, c.Hq), c.tensor(_ptr(k), c.Sk, c.Hk),
                    c.tensor(_ptr(v), c.Sk, c.Hk), c.tensor(_ptr(o), c.Sq, c.Hq), c.tensor(_ptr(do), c.Sq, c.Hq),
                    _ptr(lse_dev), 0, c.tensor(_ptr(dq), c.Sq, c.Hq), c.tensor(_ptr(dk), c.Sk, c.Hk),
                    c.tensor(_ptr(dv), c.Sk, c.Hk), 1, 0, 0)
    size = C.c_size_t(0)
    st = lib.lib.fmha_bwd_workspace_size(C.byref(p), C.byref(size))
    if st != 0:
        raise RuntimeError(lib.lib.fmha_last_error().decode())
    ws = np.zeros(max(size.value, 1), np.uint8)
    p.workspace, p.workspace_size = _ptr(ws), size.value
    lib.call("bwd", p)
    f = lambda a, shape: L.from_bits(a, c.dtype).reshape(shape)
    return f(dq, c.q.shape), f(dk, c.k.shape), f(dv, c.v.shape)


def _problem(c, keep):
    cu_q = cu_k = used = al = 0
    if c.varlen:
        keep += [c.q0.astype(np.int32), c.k0.astype(np.int32)]
        cu_q, cu_k = _ptr(keep[-2]), _ptr(keep[-1])
    if c.seqused_k is not None:
        keep.append(np.asarray(c.seqused_k, np.int32))
        used = _ptr(keep[-1])
    if c.alibi is not None:
        keep.append(np.ascontiguousarray(c.alibi))
        al = _ptr(keep[-1])
    return L.Problem(L.DTYPE[c.dtype], c.B, c.Sq, c.Sk, c.q.shape[0] if c.varlen else 0,
                     c.k.shape[0] if c.varlen else 0, c.Hq, c.Hk, c.D, cu_q, cu_k, used, c.scale, c.softcap,
                     c.window[0], c.window[1], int(c.top_left), al, 0, c.dropout_p, c.seed, c.offset)


def decode(lib, c):
    """out (B, Sq, Hq, D) and lse (B, Hq, Sq) of DecodeCase c from the CPU backend (on
    copies of the cache, which an append modifies)."""
    B, Sq, Hq, Hk, D = c.B, c.Sq, c.Hq, c.Hk, c.D
    keep = []

    def arr(a):
        keep.append(np.ascontiguousarray(a))
        return _ptr(keep[-1])
    q = np.ascontiguousarray(L.to_bits(c.q, c.dtype))
    out = np.zeros_like(q)
    lse = np.zeros(B * Hq * Sq, np.float32)
    kc, vc = c.kc.copy(), c.vc.copy()
    outer, rows = kc.shape[0], kc.shape[1]
    ct = lambda a: L.Tensor(_ptr(a), rows * Hk * D, Hk * D, D)
    qt = lambda a: L.Tensor(_ptr(a), Sq * Hq * D, Hq * D, D)
    quant = c.cache != "plain"
    ks = c.ks.copy() if quant else None
    vs = c.vs.copy() if quant else None
    Sn = c.seqlen_new
    nt = lambda p: L.Tensor(p, Sn * Hk * D, Hk * D, D)
    p = L.DecodeParams(
        C.sizeof(L.DecodeParams), 0, L.DTYPE[c.dtype], B, Sq, Hq, Hk, D, qt(q), qt(out), _ptr(lse),
        {"plain": L.DTYPE[c.dtype], "fp8": 3, "int8": 4}[c.cache], ct(kc), ct(vc), outer, rows,
        arr(c.block_table) if c.block_table is not None else 0, c.max_pages, c.max_pages,
        arr(np.asarray(c.seqlens, np.int32)), 0, arr(np.asarray(c.leftpad, np.int32)) if c.leftpad else 0,
        0 if not quant else (1 if c.scaling == "head" else 2), _ptr(ks) if quant else 0, _ptr(vs) if quant else 0,
        nt(arr(L.to_bits(c.knew, c.dtype))) if Sn else L.Tensor(0, 0, 0, 0),
        nt(arr(L.to_bits(c.vnew, c.dtype))) if Sn else L.Tensor(0, 0, 0, 0), Sn,
        arr(L.to_bits(c.cos, c.dtype)) if c.rotary_dim else 0, arr(L.to_bits(c.sin, c.dtype)) if c.rotary_dim else 0,
        c.rotary_dim, c.seqlen_ro if c.rotary_dim else 0, int(c.interleaved), c.scale, c.softcap, c.window[0],
        c.window[1], arr(c.alibi) if c.alibi is not None else 0, 0, c.num_splits, 0, 0)
    size = C.c_size_t(0)
    if lib.lib.fmha_decode_workspace_size(C.byref(p), C.byref(size)) != 0:
        raise RuntimeError(lib.lib.fmha_last_error().decode())
    ws = np.zeros(max(size.value, 1), np.uint8)
    p.workspace, p.workspace_size = _ptr(ws), size.value
    lib.call("decode", p)
    return L.from_bits(out, c.dtype).reshape(c.q.shape), lse.reshape(B, Hq, Sq)
