"""Host side for running fmha's HIP kernels on the emulator: the C API's parameter structs
(csrc/include/fmha/fmha.h, as ctypes: the same layout on x86-64 and amdgcn) and launchers
that set up what csrc/hip_fmha/dispatch.hip and the launch templates set up (grid, block,
workspace, the small row-wise kernels around the matrix-core ones)."""

import ctypes as C
import struct

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



def keep_mask(seed, offset, dropout_p, bh, lq, lk):
    """Dropout keep mask (lq, lk) of sequence-local (i, j) for bh = b * Hq + h: the
    Philox4x32-10 function of csrc/common/dropout.h, written again in numpy."""
    key0 = np.uint32(seed & 0xFFFFFFFF)
    key1 = np.uint32(((seed >> 32) + (offset >> 32)) & 0xFFFFFFFF)
    thr = min(int(np.float32(np.float32(1.0) - np.float32(dropout_p)) * np.float32(65536.0) + np.float32(0.5)), 65536)
    i = np.arange(lq, dtype=np.uint64)[:, None] * np.ones((1, lk), np.uint64)
    j = np.arange(lk, dtype=np.uint64)[None, :] * np.ones((lq, 1), np.uint64)
    c0 = ((j // 16) * 4 + (j % 8) // 2).astype(np.uint64)
    c1 = ((i // 16) * 8 + i % 8).astype(np.uint64)
    c2 = np.full(c0.shape, bh, np.uint64)
    c3 = np.full(c0.shape, offset & 0xFFFFFFFF, np.uint64)
    k0, k1 = np.uint64(key0), np.uint64(key1)
    M = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & M
        hi1, lo1 = p1 >> np.uint64(32), p1 & M
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & M, lo1, (hi0 ^ c3 ^ k1) & M, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & M
        k1 = (k1 + np.uint64(0xBB67AE85)) & M
    k = 4 * ((i % 16) // 8) + 2 * ((j % 16) // 8) + (j % 2)
    word = np.where(k < 2, c0, np.where(k < 4, c1, np.where(k < 6, c2, c3)))
    bits = np.where(k % 2 == 1, word >> np.uint64(16), word & np.uint64(0xFFFF))
    return bits < thr


class Case:
    """An attention problem: shapes, features, random inputs rounded to dtype, and the
    float64 reference.  seqs: [(len_q, len_k), ...]; varlen packs them (total, H, D),
    otherwise every sequence must have the same lengths (B, S, H, D)."""

    def __init__(self, dtype, seqs, Hq, Hk, D, *, varlen=False, causal=False, window=(-1, -1), top_left=False,
                 softcap=0.0, alibi=False, dropout_p=0.0, seed=1234, offset=0, seqused_k=None, rng_seed=0,
                 scale=None):
        self.dtype, self.seqs, self.Hq, self.Hk, self.D = dtype, list(seqs), Hq, Hk, D
        self.varlen, self.top_left, self.softcap = varlen, top_left, softcap
        self.window = (window[0], 0) if causal else tuple(window)
        self.dropout_p, self.seed, self.offset = dropout_p, seed, offset
        self.seqused_k = seqused_k
        self.scale = D ** -0.5 if scale is None else scale
        rng = np.random.default_rng(rng_seed)
        self.B = len(seqs)
        if not varlen:
            assert len(set(seqs)) == 1
        self.Sq = max(s[0] for s in seqs)
        self.Sk = max(s[1] for s in seqs)
        rq = sum(s[0] for s in seqs) if varlen else self.B * self.Sq
        rk = sum(s[1] for s in seqs) if varlen else self.B * self.Sk
        rnd = lambda *shape: from_bits(to_bits(rng.standard_normal(shape), dtype), dtype)
        self.q, self.k, self.v = rnd(rq, Hq, D), rnd(rk, Hk, D), rnd(rk, Hk, D)
        self.dout = rnd(rq, Hq, D)
        self.alibi = (rng.uniform(0.05, 0.5, Hq).astype(np.float32) if alibi else None)
        self.q0 = np.concatenate([[0], np.cumsum([s[0] for s in seqs])]) if varlen else np.arange(self.B + 1) * self.Sq
        self.k0 = np.concatenate([[0], np.cumsum([s[1] for s in seqs])]) if varlen else np.arange(self.B + 1) * self.Sk

    # ---------------------------------------------------------------- reference
    def keep(self, b, h, lq, lk):
        return keep_mask(self.seed, self.offset, self.dropout_p, b * self.Hq + h, lq, lk)

    def reference(self, grads=False):
        """out, lse (Hq, rows) and, with grads, dq, dk, dv: float64."""
        out = np.zeros(self.q.shape)
        lse = np.full((self.Hq, self.q.shape[0]), np.nan)
        dq, dk, dv = np.zeros(self.q.shape), np.zeros(self.k.shape), np.zeros(self.v.shape)
        g = self.Hq // self.Hk
        left, right = self.window
        for b, (lq, lk_rows) in enumerate(self.seqs):
            lk = lk_rows if self.seqused_k is None else min(self.seqused_k[b], lk_rows)
            qs, ks = slice(self.q0[b], self.q0[b] + lq), slice(self.k0[b], self.k0[b] + lk)
            off = 0 if self.top_left else lk - lq
            i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
            vis = np.ones((lq, lk), bool)
            if left >= 0:
                vis &= j >= i + off - left
            if right >= 0:
                vis &= j <= i + off + right
            for h in range(self.Hq):
                hk = h // g
                Q, K, V = self.q[qs, h], self.k[ks, hk], self.v[ks, hk]
                s_raw = self.scale * Q @ K.T
                t = np.tanh(s_raw / self.softcap) if self.softcap > 0 else None
                s = self.softcap * t if self.softcap > 0 else s_raw.copy()
                if self.alibi is not None:
                    s = s - self.alibi[h] * np.abs(i + off - j)
                s = np.where(vis, s, -np.inf)
                mx = s.max(axis=1, keepdims=True) if lk else np.full((lq, 1), -np.inf)
                mxf = np.where(np.isfinite(mx), mx, 0)
                e = np.exp(s - mxf)
                l = e.sum(axis=1, keepdims=True)
                P = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
                with np.errstate(divide="ignore"):
                    lse[h, qs] = np.where(l[:, 0] > 0, np.log(np.where(l[:, 0] > 0, l[:, 0], 1)) + mxf[:, 0], -np.inf)
                kp = self.keep(b, h, lq, lk) / (1 - self.dropout_p) if self.dropout_p > 0 else 1.0
                Pd = P * kp
                out[qs, h] = Pd @ V
                if grads:
                    dO = self.dout[qs, h]
                    dv[ks, hk] += Pd.T @ dO
                    dP = (dO @ V.T) * kp
                    delta = (dO * out[qs, h]).sum(axis=1, keepdims=True)
                    dS = P * (dP - delta)
                    if self.softcap > 0:
                        dS = dS * (1 - t * t)
                    dq[qs, h] = self.scale * dS @ K
                    dk[ks, hk] += self.scale * dS.T @ Q
        return (out, lse, dq, dk, dv) if grads else (out, lse)

    # ---------------------------------------------------------------- device side
    def _problem(self, r):
        mem = r.mem
        cu_q = cu_k = used = 0
        if self.varlen:
            cu_q = mem.array(self.q0.astype(np.int32), "cu_seqlens_q")
            cu_k = mem.array(self.k0.astype(np.int32), "cu_seqlens_k")
        if self.seqused_k is not None:
            used = mem.array(np.asarray(self.seqused_k, np.int32), "seqused_k")
        al = mem.array(self.alibi, "alibi") if self.alibi is not None else 0
        return Problem(DTYPE[self.dtype], self.B, self.Sq, self.Sk, self.q.shape[0] if self.varlen else 0,
                       self.k.shape[0] if self.varlen else 0, self.Hq, self.Hk, self.D, cu_q, cu_k, used, self.scale,
                       self.softcap, self.window[0], self.window[1], int(self.top_left), al, 0, self.dropout_p,
                       self.seed, self.offset)

    def tensor(self, addr, rows_per_seq, H):
        # fixed: (B, S, H, D) contiguous; varlen: (total, H, D) (batch stride ignored)
        return Tensor(addr, rows_per_seq * H * self.D, H * self.D, self.D)

    def lse_from_device(self, flat):
        """Device LSE ((B, Hq, Sq) or (Hq, total)) -> (Hq, rows) like reference()."""
        if self.varlen:
            return flat.reshape(self.Hq, -1)
        return flat.reshape(self.B, self.Hq, self.Sq).transpose(1, 0, 2).reshape(self.Hq, -1)

    def row_out(self, x):
        return x.reshape(self.q.shape)


class Run:
    """One problem on the emulator: inputs in emulated memory, launches, outputs back."""

    def __init__(self, arch, order="sequential", seed=0, race_check=True, patch=None):
        self.arch, self.order, self.seed, self.race_check, self.patch = arch, order, seed, race_check, patch
        self.mem = memory.Memory(1 << 22)
        self.machines = []
        self.kernels = []

    def launch(self, source, kernel, grid, block, kernarg, defines=()):
        co = code_object(source, self.arch, defines)
        if self.patch is not None and source in self.patch:
            co = co.patched(self.patch[source])
        m = emu.Machine(co, self.mem)
        name, _, kd = co.kernel(kernel)
        if not 0 <= kd.kernarg_size - len(kernarg) < 8:
            raise emu.EmuError(f"{kernel}: the kernel takes {kd.kernarg_size} bytes of arguments, the host built "
                               f"{len(kernarg)}")
        m.launch(kernel, grid, block, kernarg, order=self.order, seed=self.seed, race_check=self.race_check)
        self.machines.append(m)
        self.kernels.append((source, name, grid))
        return m

    def instructions(self):
        return sum(m.instructions for m in self.machines)


def _upload(r, c, x, name):
    return r.mem.array(to_bits(x, c.dtype), name)


def fwd(arch, c, order="sequential", patch=None):
    """The forward as dispatch.hip runs it for fp16/bf16: fwd_kernel (and, for varlen,
    zero_outside_kernel).  Returns (out, lse (Hq, rows), run)."""
    r = Run(arch, order, patch=patch)
    mem = r.mem
    pq, pk, pv = _upload(r, c, c.q, "q"), _upload(r, c, c.k, "k"), _upload(r, c, c.v, "v")
    po = mem.alloc(c.q.size * 2, "out")
    plse = mem.alloc(c.Hq * c.q.shape[0] * 4, "lse")
    pr = c._problem(r)
    p = FwdParams(C.sizeof(FwdParams), 2, pr, c.tensor(pq, c.Sq, c.Hq), c.tensor(pk, c.Sk, c.Hk),
                  c.tensor(pv, c.Sk, c.Hk), c.tensor(po, c.Sq, c.Hq), plse, Tensor(0, 0, 0, 0))
    hd = padded_head_dim(c.D)
    src = f"fwd_{c.dtype}_hdim{hd}" + ("_dropout" if c.dropout_p > 0 else "")
    block_m = 4 * (32 if hd <= 96 else 16)  # FwdTraits::kBlockM: 4 waves x RowTile<D>::N (configs.h)
    r.launch(src, "fwd_kernel", ((c.Sq + block_m - 1) // block_m, c.Hq, c.B), (256, 1, 1), bytes(p))
    if c.varlen and c.q.shape[0] > 0:
        _zero_outside(r, c, c.tensor(po, c.Sq, c.Hq), plse, pr.cu_seqlens_q, c.q.shape[0], c.Hq)
    out = from_bits(mem.read(po, c.q.size * 2, np.uint16), c.dtype).reshape(c.q.shape)
    lse = c.lse_from_device(mem.read(plse, c.Hq * c.q.shape[0] * 4, np.float32))
    return out, lse, r


def _zero_outside(r, c, t, lse, cu, total, heads):
    args = bytes(t) + struct.pack("<QQiii", lse, cu, c.B, total, c.D)
    r.launch("dispatch", f"zero_outside_kernelIN{_tname(c.dtype)}", ((total + ROW_WAVES - 1) // ROW_WAVES, heads, 1),
             (256, 1, 1), args)


def _tname(dtype):
    return {"fp16": "S0_3f16E", "bf16": "S0_4bf16E"}[dtype]


def bwd(arch, c, deterministic=False, order="sequential", patch=None):
    """The backward as dispatch.hip runs it for fp16/bf16: bwd_delta_kernel, bwd_kernel
    (atomic dQ into the fp32 workspace, then dq_convert_kernel) or, deterministic,
    bwd_kernel + bwd_dq_kernel; zero_outside_kernel for varlen.  Inputs: the reference
    forward's out (rounded to dtype) and LSE.  Returns (dq, dk, dv, run)."""
    out_ref, lse_ref = c.reference()
    r = Run(arch, order, patch=patch)
    mem = r.mem
    pq, pk, pv = _upload(r, c, c.q, "q"), _upload(r, c, c.k, "k"), _upload(r, c, c.v, "v")
    po, pdo = _upload(r, c, out_ref, "out"), _upload(r, c, c.dout, "dout")
    if c.varlen:
        lse_dev = lse_ref
    else:
        lse_dev = lse_ref.reshape(c.Hq, c.B, c.Sq).transpose(1, 0, 2)
    plse = mem.array(np.ascontiguousarray(lse_dev, np.float32), "lse")
    pdq, pdk, pdv = mem.alloc(c.q.size * 2, "dq"), mem.alloc(c.k.size * 2, "dk"), mem.alloc(c.v.size * 2, "dv")
    rows_q = c.q.shape[0]
    hd = padded_head_dim(c.D)
    delta_bytes = (rows_q * c.Hq * 4 + 255) // 256 * 256
    accum_bytes = 0 if deterministic else rows_q * c.Hq * hd * 4
    ws = mem.alloc(delta_bytes + accum_bytes, "workspace")
    pr = c._problem(r)
    p = BwdParams(C.sizeof(BwdParams), 2, pr, c.tensor(pq, c.Sq, c.Hq), c.tensor(pk, c.Sk, c.Hk),
                  c.tensor(pv, c.Sk, c.Hk), c.tensor(po, c.Sq, c.Hq), c.tensor(pdo, c.Sq, c.Hq), plse, 0,
                  c.tensor(pdq, c.Sq, c.Hq), c.tensor(pdk, c.Sk, c.Hk), c.tensor(pdv, c.Sk, c.Hk), int(deterministic),
                  ws, delta_bytes + accum_bytes)
    pb = bytes(p)
    delta, accum = ws, ws + delta_bytes
    tn = _tname(c.dtype)
    rows_grid = lambda rows: (rows + ROW_WAVES - 1) // ROW_WAVES
    if c.Sq > 0:
        r.launch("dispatch", f"bwd_delta_kernelIN{tn}", (rows_grid(c.Sq), c.Hq, c.B), (256, 1, 1),
                 pb + struct.pack("<Q", delta))
    if accum_bytes:
        mem.write(accum, np.zeros(accum_bytes, np.uint8))  # hipMemsetAsync
    drop = c.dropout_p > 0
    mod = c.softcap > 0 or c.alibi is not None
    suffix = ("_dropout" if drop else "") + ("_scoremod" if mod else "")
    src = f"bwd_{c.dtype}_hdim{hd}{suffix}"
    r.launch(src, "bwd_kernel", ((c.Sk + 63) // 64, c.Hk, c.B), (256, 1, 1),
             pb + struct.pack("<QQ?", 0 if deterministic else accum, delta, not deterministic))
    if deterministic:
        block_m = 4 * (32 if hd <= 96 else 16)
        r.launch(f"bwd_dq_{c.dtype}_hdim{hd}{suffix}", "bwd_dq_kernel", ((c.Sq + block_m - 1) // block_m, c.Hq, c.B),
                 (256, 1, 1), pb + struct.pack("<Q", delta))
    elif rows_q > 0:
        r.launch("dispatch", f"dq_convert_kernelIN{tn}", (rows_grid(rows_q), c.Hq, 1), (256, 1, 1),
                 pb + struct.pack("<Qqi", accum, rows_q, hd))
    if c.varlen:
        if deterministic and rows_q > 0:
            _zero_outside(r, c, c.tensor(pdq, c.Sq, c.Hq), 0, pr.cu_seqlens_q, rows_q, c.Hq)
        if c.k.shape[0] > 0:
            for t in (c.tensor(pdk, c.Sk, c.Hk), c.tensor(pdv, c.Sk, c.Hk)):
                args = bytes(t) + struct.pack("<QQiii", 0, pr.cu_seqlens_k, c.B, c.k.shape[0], c.D)
                r.launch("dispatch", f"zero_outside_kernelIN{tn}", (rows_grid(c.k.shape[0]), c.Hk, 1), (256, 1, 1),
                         args)
    rd = lambda a, shape: from_bits(mem.read(a, int(np.prod(shape)) * 2, np.uint16), c.dtype).reshape(shape)
    return rd(pdq, c.q.shape), rd(pdk, c.k.shape), rd(pdv, c.v.shape), r
