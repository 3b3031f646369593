"""Host side for running fmha's HIP kernels on the emulator: the C API's parameter structs
(csrc/include/fmha/fmha.h, as ctypes: the same layout on x86-64 and amdgcn) and launchers
that set up what csrc/hip_fmha/dispatch.hip and the launch templates set up (grid, block,
workspace, the small row-wise kernels around the matrix-core ones)."""

import ctypes as C

import numpy as np

from . import build, codeobj, emu, memory

DTYPE = {"fp16": 1, "bf16": 2}
ROW_WAVES = 4  # rowwise.h kRowWaves (checked against the code in tests: grid sizes)
HEAD_DIMS = (32, 64, 96, 128, 192, 256)


class Tensor(C.Structure):
    _fields_ = [("data", C.c_uint64), ("batch_stride", C.c_int64), ("row_stride", C.c_int64),
                ("head_stride", C.c_int64)]


class Problem(C.Structure):
    _fields_ = [("dtype", C.c_int32), ("batch", C.c_int32), ("seqlen_q", C.c_int32), ("seqlen_k", C.c_int32),
                ("total_q", C.c_int32), ("total_k", C.c_int32), ("num_heads_q", C.c_int32),
                ("num_heads_k", C.c_int32), ("head_dim", C.c_int32), ("cu_seqlens_q", C.c_uint64),
                ("cu_seqlens_k", C.c_uint64), ("seqused_k", C.c_uint64), ("scale", C.c_float),
                ("softcap", C.c_float), ("window_left", C.c_int32), ("window_right", C.c_int32),
                ("mask_align", C.c_int32), ("alibi_slopes", C.c_uint64), ("alibi_batch_stride", C.c_int64),
                ("dropout_p", C.c_float), ("seed", C.c_uint64), ("offset", C.c_uint64)]


class FwdParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("device", C.c_int32), ("problem", Problem), ("q", Tensor),
                ("k", Tensor), ("v", Tensor), ("out", Tensor), ("lse", C.c_uint64), ("probs", Tensor)]


class BwdParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("device", C.c_int32), ("problem", Problem), ("q", Tensor),
                ("k", Tensor), ("v", Tensor), ("out", Tensor), ("dout", Tensor), ("lse", C.c_uint64),
                ("dlse", C.c_uint64), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor), ("deterministic", C.c_int32),
                ("workspace", C.c_uint64), ("workspace_size", C.c_uint64)]


def to_bits(x, dtype):
    """float array -> uint16 bits of fp16 or bf16 (round to nearest even)."""
    x = np.asarray(x, np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def from_bits(b, dtype):
    b = np.asarray(b, np.uint16)
    if dtype == "fp16":
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def padded_head_dim(d):
    return next(h for h in HEAD_DIMS if d <= h)


_CO = {}


def code_object(source, arch, defines=()):
    key = (source, arch, tuple(defines))
    if key not in _CO:
        _CO[key] = codeobj.CodeObject(build.instance(source, arch, defines), arch)
    return _CO[key]


def _tensor(addr, shape_bshd):
    B, S, H, D = shape_bshd
    return Tensor(addr, S * H * D, H * D, D)


def problem(dtype, B, Sq, Sk, Hq, Hk, D, *, scale=None, softcap=0.0, window=(-1, -1), top_left=False,
            alibi=0, dropout_p=0.0, seed=0, offset=0, cu_q=0, cu_k=0, seqused_k=0, total_q=0, total_k=0,
            alibi_batch_stride=0):
    return Problem(DTYPE[dtype], B, Sq, Sk, total_q, total_k, Hq, Hk, D, cu_q, cu_k, seqused_k,
                   D ** -0.5 if scale is None else scale, softcap, window[0], window[1], int(top_left), alibi,
                   alibi_batch_stride, dropout_p, seed, offset)


class Run:
    """One problem on the emulator: inputs in emulated memory, launches, outputs back."""

    def __init__(self, arch, order="sequential", seed=0, race_check=True):
        self.arch, self.order, self.seed, self.race_check = arch, order, seed, race_check
        self.mem = memory.Memory(1 << 22)
        self.machines = []

    def launch(self, source, kernel, grid, block, kernarg, defines=()):
        co = code_object(source, self.arch, defines)
        m = emu.Machine(co, self.mem)
        _, _, kd = co.kernel(kernel)
        if kd.kernarg_size != len(kernarg):
            raise emu.EmuError(f"{kernel}: kernel takes {kd.kernarg_size} bytes of arguments, host built "
                               f"{len(kernarg)}")
        m.launch(kernel, grid, block, kernarg, order=self.order, seed=self.seed, race_check=self.race_check)
        self.machines.append(m)
        return m


def fwd(arch, q, k, v, dtype, *, causal=False, window=(-1, -1), top_left=False, softcap=0.0, alibi=None,
        dropout_p=0.0, seed=0, offset=0, lse=True, order="sequential", defines=(), scale=None):
    """Forward pass of the HIP matrix-core kernel on the emulator.  q (B, Sq, Hq, D), k and
    v (B, Sk, Hk, D) float arrays (rounded to dtype here).  Returns (out, lse, run)."""
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if causal:
        window = (window[0], 0)
    r = Run(arch, order)
    mem = r.mem
    pq, pk, pv = (mem.array(to_bits(x, dtype), n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    po = mem.alloc(B * Sq * Hq * D * 2, "out")
    plse = mem.alloc(B * Hq * Sq * 4, "lse") if lse else 0
    pal = 0
    if alibi is not None:
        pal = mem.array(np.asarray(alibi, np.float32), "alibi")
    pr = problem(dtype, B, Sq, Sk, Hq, Hk, D, scale=scale, softcap=softcap, window=window, top_left=top_left,
                 alibi=pal, dropout_p=dropout_p, seed=seed, offset=offset)
    p = FwdParams(C.sizeof(FwdParams), 2, pr, _tensor(pq, q.shape), _tensor(pk, k.shape), _tensor(pv, v.shape),
                  _tensor(po, q.shape), plse, Tensor(0, 0, 0, 0))
    hd = padded_head_dim(D)
    src = f"fwd_{dtype}_hdim{hd}" + ("_dropout" if dropout_p > 0 else "")
    n_rows = 4 * (32 if hd <= 96 else 16)  # FwdTraits::kBlockM = 4 waves x RowTile<D>::N (configs.h)
    grid = ((Sq + n_rows - 1) // n_rows, Hq, B)
    r.launch(src, "fwd_kernel", grid, (256, 1, 1), bytes(p), defines)
    out = from_bits(mem.read(po, B * Sq * Hq * D * 2, np.uint16), dtype).reshape(B, Sq, Hq, D)
    lse_out = mem.read(plse, B * Hq * Sq * 4, np.float32).reshape(B, Hq, Sq) if lse else None
    return out, lse_out, r


# ---------------------------------------------------------------------------------------
# float64 reference (docs/api.md semantics)
# ---------------------------------------------------------------------------------------

def reference(q, k, v, *, causal=False, window=(-1, -1), top_left=False, softcap=0.0, alibi=None, scale=None,
              keep=None, dropout_p=0.0):
    """(out, lse) in float64; q (B, Sq, Hq, D), k, v (B, Sk, Hk, D).  keep: optional bool
    (B, Hq, Sq, Sk) dropout mask."""
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    left, right = window
    if causal:
        right = 0
    off = 0 if top_left else Sk - Sq
    out = np.zeros(q.shape)
    lse = np.zeros((B, Hq, Sq))
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    vis = np.ones((Sq, Sk), bool)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hk)
            s = scale * q[b, :, h].astype(np.float64) @ k[b, :, hk].astype(np.float64).T
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if alibi is not None:
                s = s - alibi[h] * np.abs(i + off - j)
            s = np.where(vis, s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            mx = np.where(np.isfinite(mx), mx, 0)
            e = np.exp(s - mx)
            l = e.sum(axis=1, keepdims=True)
            p = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
            with np.errstate(divide="ignore"):
                lse[b, h] = np.where(l[:, 0] > 0, np.log(np.where(l[:, 0] > 0, l[:, 0], 1)) + mx[:, 0], -np.inf)
            if keep is not None:
                p = np.where(keep[b, h], p / (1 - dropout_p), 0)
            out[b, :, h] = p @ v[b, :, hk].astype(np.float64)
    return out, lse
