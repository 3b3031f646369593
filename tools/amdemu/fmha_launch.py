"""Host side for running fmha's HIP kernels on the emulator: the C API's parameter structs
(csrc/include/fmha/fmha.h, as ctypes: the same layout on x86-64 and amdgcn) and launchers
that set up what csrc/hip_fmha/dispatch.hip and the launch templates set up (grid, block,
workspace, the small row-wise kernels around the matrix-core ones)."""

import atexit
import ctypes as C
import json
import os
import struct

import numpy as np

from . import build, codeobj, emu, memory

DTYPE = {"fp32": 0, "fp16": 1, "bf16": 2}
ESIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
BITS = {"fp32": np.uint32, "fp16": np.uint16, "bf16": np.uint16}
ROW_WAVES = 4  # csrc/hip_fmha/rowwise.h kRowWaves (and decode_rowwise.h kCombineWaves)
CHUNK_ROWS, CHUNK_THREADS = 64, 256  # csrc/common/row_kernels.h kChunkRows, kChunkThreads (16-bit backward helpers)
HEAD_DIMS = (32, 64, 96, 128, 192, 256)


class Tensor(C.Structure):
    _fields_ = [("data", C.c_uint64), ("batch_stride", C.c_int64), ("row_stride", C.c_int64),
                ("head_stride", C.c_int64)]


class Descale(C.Structure):  # fmha_descale (the fp8 forward's; never set here)
    _fields_ = [("data", C.c_uint64), ("batch_stride", C.c_int64), ("head_stride", C.c_int64)]


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
                ("k", Tensor), ("v", Tensor), ("out", Tensor), ("lse", C.c_uint64), ("probs", Tensor),
                ("q_descale", Descale), ("k_descale", Descale), ("v_descale", Descale), ("workspace", C.c_uint64),
                ("workspace_size", C.c_uint64)]


class BwdParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("device", C.c_int32), ("problem", Problem), ("q", Tensor),
                ("k", Tensor), ("v", Tensor), ("out", Tensor), ("dout", Tensor), ("lse", C.c_uint64),
                ("dlse", C.c_uint64), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor), ("deterministic", C.c_int32),
                ("workspace", C.c_uint64), ("workspace_size", C.c_uint64)]


def to_bits(x, dtype):
    """float array -> uint16 bits of fp16 or bf16 (round to nearest even)."""
    x = np.asarray(x, np.float32)
    if dtype == "fp32":
        return x.view(np.uint32)
    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def from_bits(b, dtype):
    if dtype == "fp32":
        return np.asarray(b, np.uint32).view(np.float32).astype(np.float64)
    b = np.asarray(b, np.uint16)
    if dtype == "fp16":
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def padded_head_dim(d):
    return next(h for h in HEAD_DIMS if d <= h)


_CO = {}

# FMHA_AMDEMU_COVERAGE=path: at exit, write per kernel and architecture how many of its
# instructions the launches of this process executed (the kernels' s_nop padding excluded).
_COVERAGE = {}


def _dump_coverage(path):
    out = {}
    for (arch, src, name), (co, seen) in sorted(_COVERAGE.items()):
        _, entry, _ = co.kernel(name)
        addrs = sorted(co.instrs)
        # the kernel's instructions: from its entry to the next kernel's entry (or the end)
        starts = sorted(e for _, (kd_addr, kd) in co.kernels.items() for e in [kd_addr + kd.entry_offset])
        nxt = next((e for e in starts if e > entry), None)
        body = [a for a in addrs if a >= entry and (nxt is None or a < nxt) and co.instrs[a].mnem != "s_nop"]
        hit = sum(1 for a in body if a in seen)
        out[f"{arch} {src} {name}"] = {"executed": hit, "instructions": len(body)}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if os.environ.get("FMHA_AMDEMU_COVERAGE"):
    atexit.register(_dump_coverage, os.environ["FMHA_AMDEMU_COVERAGE"])


def code_object(source, arch, defines=(), edits=None):
    """Decoded code object of an instance (edits: a broken variant, build.variant())."""
    key = (source, arch, tuple(defines), repr(sorted(edits.items())) if edits else None)
    if key not in _CO:
        path = build.variant(source, arch, edits) if edits else build.instance(source, arch, defines)
        _CO[key] = codeobj.CodeObject(path, arch)
    return _CO[key]


def _tensor(addr, shape_bshd):
    B, S, H, D = shape_bshd
    return Tensor(addr, S * H * D, H * D, D)



def visible(lq, lk, off, left, right):
    """(lq, lk) mask of the keys query i sees: j in [i + off - left, i + off + right], a
    negative bound unbounded (docs/api.md's window with the alignment offset off)."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    vis = np.ones((lq, lk), bool)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


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
                 scale=None, pad=(0, 0)):
        # pad (varlen): rows before the first and after the last sequence in q, k and v,
        # which belong to no sequence (outputs and gradients 0 there, LSE -inf)
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
        rq = sum(s[0] for s in seqs) + sum(pad) if varlen else self.B * self.Sq
        rk = sum(s[1] for s in seqs) + sum(pad) if varlen else self.B * self.Sk
        rnd = lambda *shape: from_bits(to_bits(rng.standard_normal(shape), dtype), dtype)
        self.q, self.k, self.v = rnd(rq, Hq, D), rnd(rk, Hk, D), rnd(rk, Hk, D)
        self.dout = rnd(rq, Hq, D)
        self.alibi = (rng.uniform(0.05, 0.5, Hq).astype(np.float32) if alibi else None)
        self.q0 = pad[0] + np.concatenate([[0], np.cumsum([s[0] for s in seqs])]) if varlen else np.arange(
            self.B + 1) * self.Sq
        self.k0 = pad[0] + np.concatenate([[0], np.cumsum([s[1] for s in seqs])]) if varlen else np.arange(
            self.B + 1) * self.Sk

    # ---------------------------------------------------------------- reference
    def keep(self, b, h, lq, lk):
        return keep_mask(self.seed, self.offset, self.dropout_p, b * self.Hq + h, lq, lk)

    def reference(self, grads=False, probs=False):
        """out, lse (Hq, rows) and, with grads, dq, dk, dv: float64.  probs: return only
        the debug probabilities (B, Hq, Sq, Sk) instead: P, dropped entries negated, 0
        outside each sequence."""
        P_all = np.zeros((self.B, self.Hq, self.Sq, self.Sk))
        out = np.zeros(self.q.shape)
        lse = np.full((self.Hq, self.q.shape[0]), -np.inf)  # rows of no sequence keep -inf
        dq, dk, dv = np.zeros(self.q.shape), np.zeros(self.k.shape), np.zeros(self.v.shape)
        g = self.Hq // self.Hk
        left, right = self.window
        for b, (lq, lk_rows) in enumerate(self.seqs):
            lk = lk_rows if self.seqused_k is None else min(self.seqused_k[b], lk_rows)
            qs, ks = slice(self.q0[b], self.q0[b] + lq), slice(self.k0[b], self.k0[b] + lk)
            off = 0 if self.top_left else lk - lq
            i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]  # ALiBi's distance
            vis = visible(lq, lk, off, left, right)
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
                P_all[b, h, :lq, :lk] = np.where(self.keep(b, h, lq, lk), P, -P) if self.dropout_p > 0 else P
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
        if probs:
            return P_all
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

    def __init__(self, arch, order="sequential", seed=0, race_check=True, patch=None, wg_order="forward"):
        self.arch, self.order, self.seed, self.race_check, self.patch = arch, order, seed, race_check, patch
        self.wg_order = wg_order
        self.mem = memory.Memory(1 << 22)
        self.machines = []
        self.kernels = []

    def launch(self, source, kernel, grid, block, kernarg, defines=()):
        co = code_object(source, self.arch, defines)
        if self.patch is not None and source in self.patch:
            # a broken variant: a function editing instructions, or source edits for build.variant()
            edit = self.patch[source]
            co = code_object(source, self.arch, defines, edit) if isinstance(edit, dict) else co.patched(edit)
        m = emu.Machine(co, self.mem)
        name, _, kd = co.kernel(kernel)
        if not 0 <= kd.kernarg_size - len(kernarg) < 8:
            raise emu.EmuError(f"{kernel}: the kernel takes {kd.kernarg_size} bytes of arguments, the host built "
                               f"{len(kernarg)}")
        m.launch(kernel, grid, block, kernarg, order=self.order, seed=self.seed, race_check=self.race_check,
                 wg_order=self.wg_order)
        if m.partial_buffer_accesses:
            # partly in range: where the hardware's per-dword check is least documented
            raise emu.EmuError(f"{name}: {m.partial_buffer_accesses} buffer accesses only partly in range")
        self.machines.append(m)
        self.kernels.append((source, name, grid))
        if os.environ.get("FMHA_AMDEMU_COVERAGE") and self.patch is None:
            base = code_object(source, self.arch, defines)
            _COVERAGE.setdefault((self.arch, source, name), (base, set()))[1].update(m.coverage)
        return m

    def instructions(self):
        return sum(m.instructions for m in self.machines)


def _upload(r, c, x, name):
    return r.mem.array(to_bits(x, c.dtype), name)


def fwd(arch, c, order="sequential", patch=None, wg_order="forward", seed=0, probs=False):
    """The forward as dispatch.hip runs it for fp16/bf16: fwd_kernel (and, for varlen,
    zero_outside_kernel).  Returns (out, lse (Hq, rows), run)."""
    r = Run(arch, order, seed=seed, patch=patch, wg_order=wg_order)
    mem = r.mem
    pq, pk, pv = _upload(r, c, c.q, "q"), _upload(r, c, c.k, "k"), _upload(r, c, c.v, "v")
    es = ESIZE[c.dtype]
    po = mem.alloc(c.q.size * es, "out")
    plse = mem.alloc(c.Hq * c.q.shape[0] * 4, "lse")
    pr = c._problem(r)
    pprobs = mem.alloc(c.B * c.Hq * c.Sq * c.Sk * es, "probs") if probs else 0
    pt = Tensor(pprobs, c.Hq * c.Sq * c.Sk, c.Sk, c.Sq * c.Sk) if probs else Tensor(0, 0, 0, 0)
    p = FwdParams(C.sizeof(FwdParams), 2, pr, c.tensor(pq, c.Sq, c.Hq), c.tensor(pk, c.Sk, c.Hk),
                  c.tensor(pv, c.Sk, c.Hk), c.tensor(po, c.Sq, c.Hq), plse, pt)
    hd = padded_head_dim(c.D)
    if c.dtype == "fp32":  # the vector-ALU path: one wave per row
        r.launch("dispatch", "rowwise_fwd_kernelIf", ((c.Sq + ROW_WAVES - 1) // ROW_WAVES, c.Hq, c.B), (256, 1, 1),
                 bytes(p))
    else:
        src = f"fwd_{c.dtype}_hdim{hd}" + ("_dropout" if c.dropout_p > 0 else "")
        block_m = 4 * (32 if hd <= 96 else 16)  # FwdTraits::kBlockM: 4 waves x RowTile<D>::N (configs.h)
        r.launch(src, "fwd_kernel", ((c.Sq + block_m - 1) // block_m, c.Hq, c.B), (256, 1, 1), bytes(p))
    if c.varlen and c.q.shape[0] > 0:
        _zero_outside(r, c, c.tensor(po, c.Sq, c.Hq), plse, pr.cu_seqlens_q, c.q.shape[0], c.Hq)
    if probs:
        tq = ("N" if c.dtype != "fp32" else "") + _tname(c.dtype)
        r.launch("dispatch", f"probs_kernelI{tq}", ((c.Sq + ROW_WAVES - 1) // ROW_WAVES, c.Hq, c.B), (256, 1, 1),
                 bytes(p))
        r.probs = from_bits(mem.read(pprobs, c.B * c.Hq * c.Sq * c.Sk * es, BITS[c.dtype]), c.dtype).reshape(
            c.B, c.Hq, c.Sq, c.Sk)
    out = from_bits(mem.read(po, c.q.size * es, BITS[c.dtype]), c.dtype).reshape(c.q.shape)
    lse = c.lse_from_device(mem.read(plse, c.Hq * c.q.shape[0] * 4, np.float32))
    return out, lse, r


def _zero_outside(r, c, t, lse, cu, total, heads):
    args = bytes(t) + struct.pack("<QQiii", lse, cu, c.B, total, c.D)
    r.launch("dispatch", f"zero_outside_kernelI{'N' if c.dtype != 'fp32' else ''}{_tname(c.dtype)}", ((total + ROW_WAVES - 1) // ROW_WAVES, heads, 1),
             (256, 1, 1), args)


def _tname(dtype):
    return {"fp16": "S0_3f16E", "bf16": "S0_4bf16E", "fp32": "fE"}[dtype]


def bwd(arch, c, deterministic=False, order="sequential", patch=None, wg_order="forward", seed=0):
    """The backward as dispatch.hip runs it for fp16/bf16: bwd_delta_kernel (which also
    zeros the fp32 dQ accumulator: the workspace starts as NaNs here, as uninitialized
    memory may), bwd_kernel (atomic dQ into the accumulator, then dq_convert_kernel) or,
    deterministic, bwd_kernel + bwd_dq_kernel; zero_outside_kernel for varlen.  Inputs: the
    reference forward's out (rounded to dtype) and LSE.  Returns (dq, dk, dv, run)."""
    out_ref, lse_ref = c.reference()
    r = Run(arch, order, seed=seed, patch=patch, wg_order=wg_order)
    mem = r.mem
    pq, pk, pv = _upload(r, c, c.q, "q"), _upload(r, c, c.k, "k"), _upload(r, c, c.v, "v")
    po, pdo = _upload(r, c, out_ref, "out"), _upload(r, c, c.dout, "dout")
    if c.varlen:
        lse_dev = lse_ref
    else:
        lse_dev = lse_ref.reshape(c.Hq, c.B, c.Sq).transpose(1, 0, 2)
    plse = mem.array(np.ascontiguousarray(lse_dev, np.float32), "lse")
    es = ESIZE[c.dtype]
    pdq, pdk, pdv = mem.alloc(c.q.size * es, "dq"), mem.alloc(c.k.size * es, "dk"), mem.alloc(c.v.size * es, "dv")
    rows_q = c.q.shape[0]
    hd = padded_head_dim(c.D)
    delta_bytes = (rows_q * c.Hq * 4 + 255) // 256 * 256
    accum_bytes = 0 if deterministic or c.dtype == "fp32" else rows_q * c.Hq * hd * 4
    ws = mem.alloc(delta_bytes + accum_bytes, "workspace")
    mem.write(ws, np.full(delta_bytes + accum_bytes, 0xFF, np.uint8))  # NaN in every float
    pr = c._problem(r)
    p = BwdParams(C.sizeof(BwdParams), 2, pr, c.tensor(pq, c.Sq, c.Hq), c.tensor(pk, c.Sk, c.Hk),
                  c.tensor(pv, c.Sk, c.Hk), c.tensor(po, c.Sq, c.Hq), c.tensor(pdo, c.Sq, c.Hq), plse, 0,
                  c.tensor(pdq, c.Sq, c.Hq), c.tensor(pdk, c.Sk, c.Hk), c.tensor(pdv, c.Sk, c.Hk), int(deterministic),
                  ws, delta_bytes + accum_bytes)
    pb = bytes(p)
    delta, accum = ws, ws + delta_bytes
    tn = ("N" if c.dtype != "fp32" else "") + _tname(c.dtype)
    rows_grid = lambda rows: (rows + ROW_WAVES - 1) // ROW_WAVES
    if c.dtype == "fp32":  # the vector-ALU path: a wave per query row, then per key row
        if c.Sq > 0:
            r.launch("dispatch", "rowwise_bwd_delta_kernelIf", (rows_grid(c.Sq), c.Hq, c.B), (256, 1, 1),
                     pb + struct.pack("<Q", delta))
            r.launch("dispatch", "rowwise_bwd_dq_kernelIf", (rows_grid(c.Sq), c.Hq, c.B), (256, 1, 1),
                     pb + struct.pack("<Q", delta))
        if c.Sk > 0:
            r.launch("dispatch", "rowwise_bwd_dkdv_kernelIf", (rows_grid(c.Sk), c.Hk, c.B), (256, 1, 1),
                     pb + struct.pack("<Q", delta))
    else:
        if c.Sq > 0 or accum_bytes:  # delta, and the accumulator's zeros (chunk_delta_blocks)
            r.launch("dispatch", f"bwd_delta_kernelI{tn}", (max(1, -(-c.Sq // CHUNK_ROWS)), c.Hq, c.B),
                     (CHUNK_THREADS, 1, 1), pb + struct.pack("<QQq", delta, accum, accum_bytes // 4))
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
            chunks = rows_q * c.Hq * hd // 8
            r.launch("dispatch", f"dq_convert_kernelI{tn}", (-(-chunks // CHUNK_THREADS), 1, 1), (CHUNK_THREADS, 1, 1),
                     pb + struct.pack("<Qqi", accum, rows_q, hd))
    if c.varlen:
        if (deterministic or c.dtype == "fp32") and rows_q > 0:
            _zero_outside(r, c, c.tensor(pdq, c.Sq, c.Hq), 0, pr.cu_seqlens_q, rows_q, c.Hq)
        if c.k.shape[0] > 0:
            for t in (c.tensor(pdk, c.Sk, c.Hk), c.tensor(pdv, c.Sk, c.Hk)):
                args = bytes(t) + struct.pack("<QQiii", 0, pr.cu_seqlens_k, c.B, c.k.shape[0], c.D)
                r.launch("dispatch", f"zero_outside_kernelI{tn}", (rows_grid(c.k.shape[0]), c.Hk, 1), (256, 1, 1),
                         args)
    rd = lambda a, shape: from_bits(mem.read(a, int(np.prod(shape)) * es, BITS[c.dtype]), c.dtype).reshape(shape)
    return rd(pdq, c.q.shape), rd(pdk, c.k.shape), rd(pdv, c.v.shape), r


# ---------------------------------------------------------------------------------------
# Decode (flash_attn_with_kvcache)
# ---------------------------------------------------------------------------------------

class DecodeParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("device", C.c_int32), ("dtype", C.c_int32), ("batch", C.c_int32),
                ("seqlen_q", C.c_int32), ("num_heads_q", C.c_int32), ("num_heads_k", C.c_int32),
                ("head_dim", C.c_int32), ("q", Tensor), ("out", Tensor), ("lse", C.c_uint64),
                ("cache_dtype", C.c_int32), ("k_cache", Tensor), ("v_cache", Tensor), ("cache_batch", C.c_int32),
                ("cache_seqlen", C.c_int32), ("block_table", C.c_uint64), ("block_table_stride", C.c_int64),
                ("max_pages", C.c_int32), ("cache_seqlens", C.c_uint64), ("cache_batch_idx", C.c_uint64),
                ("cache_leftpad", C.c_uint64), ("scaling", C.c_int32), ("k_scale", C.c_uint64),
                ("v_scale", C.c_uint64), ("k_new", Tensor), ("v_new", Tensor), ("seqlen_new", C.c_int32),
                ("rotary_cos", C.c_uint64), ("rotary_sin", C.c_uint64), ("rotary_dim", C.c_int32),
                ("seqlen_ro", C.c_int32), ("rotary_interleaved", C.c_int32), ("scale", C.c_float),
                ("softcap", C.c_float), ("window_left", C.c_int32), ("window_right", C.c_int32),
                ("alibi_slopes", C.c_uint64), ("alibi_batch_stride", C.c_int64), ("num_splits", C.c_int32),
                ("workspace", C.c_uint64), ("workspace_size", C.c_uint64), ("cu_seqlens_q", C.c_uint64),
                ("total_q", C.c_int32)]


def fp8_e4m3_to_float(b):
    """csrc/common/quant.h's decoding, vectorized."""
    b = np.asarray(b, np.uint8).astype(np.int64)
    sign, exp, mant = b >> 7, (b >> 3) & 0xF, b & 7
    mag = np.where(exp == 0, np.ldexp(mant.astype(np.float64), -9), np.ldexp(1 + mant / 8.0, exp - 7))
    mag = np.where((exp == 0xF) & (mant == 7), np.nan, mag)
    return np.where(sign == 1, -mag, mag)


class DecodeCase:
    """A decode problem against an existing cache (no appended tokens): contiguous or paged
    (page_size), plain, fp8 or int8 with per-head or per-token scales."""

    def __init__(self, dtype, cache, B, Sq, Hq, Hk, D, cache_seqlens, *, capacity=None, page_size=None,
                 leftpad=None, scaling="head", softcap=0.0, alibi=False, window=(-1, -1), num_splits=1,
                 seqlen_new=0, rotary_dim=0, interleaved=False, rng_seed=0):
        rng = np.random.default_rng(rng_seed)
        self.seqlen_new, self.rotary_dim, self.interleaved = seqlen_new, rotary_dim, interleaved
        self.dtype, self.cache, self.B, self.Sq, self.Hq, self.Hk, self.D = dtype, cache, B, Sq, Hq, Hk, D
        self.seqlens, self.leftpad = list(cache_seqlens), leftpad
        self.softcap, self.window, self.num_splits = softcap, window, num_splits
        self.scale = D ** -0.5
        self.page_size = page_size
        cap = capacity or max(cache_seqlens) + seqlen_new
        if page_size:
            self.max_pages = (cap + page_size - 1) // page_size
            self.npages = B * self.max_pages + 1
            self.block_table = rng.permutation(self.npages)[:B * self.max_pages].reshape(B, self.max_pages).astype(
                np.int32)
            shape = (self.npages, page_size, Hk, D)
        else:
            self.max_pages, self.block_table = 0, None
            shape = (B, cap, Hk, D)
        self.cap = cap
        self.q = from_bits(to_bits(rng.standard_normal((B, Sq, Hq, D)), dtype), dtype)
        if cache == "plain":
            self.kc = to_bits(rng.standard_normal(shape), dtype)
            self.vc = to_bits(rng.standard_normal(shape), dtype)
            self.kval, self.vval = from_bits(self.kc, dtype), from_bits(self.vc, dtype)
            self.ks = self.vs = None
        else:
            def raw():
                if cache == "fp8":  # finite values 2^-5 .. 15, both signs
                    e = rng.integers(2, 11, shape)
                    return (rng.integers(0, 2, shape) << 7 | e << 3 | rng.integers(0, 8, shape)).astype(np.uint8)
                return rng.integers(-127, 128, shape).astype(np.int8)
            self.kc, self.vc = raw(), raw()
            dec = fp8_e4m3_to_float if cache == "fp8" else (lambda x: x.astype(np.float64))
            self.kval, self.vval = dec(self.kc), dec(self.vc)
            sshape = (Hk,) if scaling == "head" else shape[:3]
            self.scaling = scaling
            base = 0.25 if cache == "fp8" else 0.06  # int8: new rows of N(0, 1) rarely saturate
            self.ks = (base * rng.uniform(0.5, 1.5, sshape)).astype(np.float32)
            self.vs = (base * rng.uniform(0.5, 1.5, sshape)).astype(np.float32)
        self.alibi = rng.uniform(0.05, 0.5, Hq).astype(np.float32) if alibi else None
        self.scaling = scaling
        rnd = lambda *shape: from_bits(to_bits(rng.standard_normal(shape), dtype), dtype)
        self.knew, self.vnew = rnd(B, seqlen_new, Hk, D), rnd(B, seqlen_new, Hk, D)
        self.seqlen_ro = cap + Sq
        if rotary_dim:
            ang = np.arange(self.seqlen_ro)[:, None] * 10000.0 ** (-np.arange(rotary_dim // 2) / (rotary_dim // 2))
            self.cos = from_bits(to_bits(np.cos(ang), dtype), dtype)
            self.sin = from_bits(to_bits(np.sin(ang), dtype), dtype)

    def rotate(self, x, pos):
        """Rows x (n, D) rotated at positions pos (n,), in float64."""
        x = np.array(x, np.float64)
        if not self.rotary_dim:
            return x
        half = self.rotary_dim // 2
        k = np.arange(half)
        a, b = (2 * k, 2 * k + 1) if self.interleaved else (k, k + half)
        pos = np.clip(pos, 0, self.seqlen_ro - 1)
        c, s = self.cos[pos], self.sin[pos]
        x0, y0 = x[:, a].copy(), x[:, b].copy()
        x[:, a] = x0 * c - y0 * s
        x[:, b] = x0 * s + y0 * c
        return x

    def appended(self):
        """The new rows as the cache should hold them after the append: {(b, t, hk):
        (k row, v row)} dequantized, in float64 (8-bit: quantized with this module's model
        of csrc/common/quant.h, per-token scales from the row's max)."""
        out = {}
        for b in range(self.B):
            for t in range(self.seqlen_new):
                pos = self.seqlens[b] + t
                for hk in range(self.Hk):
                    k = self.rotate(self.knew[b, t, hk][None], np.array([pos]))[0]
                    v = self.vnew[b, t, hk].astype(np.float64)
                    out[(b, t, hk)] = (k, v)
        return out

    def _pos(self, b, pos):
        """(outer, row) of cache position pos of sequence b (kv_cache.h CacheView)."""
        if self.block_table is None:
            return b, pos
        return self.block_table[b, pos // self.page_size], pos % self.page_size

    def reference(self, kval=None, vval=None, ks=None, vs=None):
        """out, lse in float64 over a cache (default: the initial one; after an append, pass
        the device's cache as read back by decode())."""
        kval = self.kval if kval is None else kval
        vval = self.vval if vval is None else vval
        ks = self.ks if ks is None else ks
        vs = self.vs if vs is None else vs
        out = np.zeros(self.q.shape)
        lse = np.zeros((self.B, self.Hq, self.Sq))
        g = self.Hq // self.Hk
        left, right = self.window
        per_row = left >= 0 or right >= 0
        for b in range(self.B):
            lp = self.leftpad[b] if self.leftpad else 0
            lk = self.seqlens[b] + self.seqlen_new - lp
            qpos = self.seqlens[b] + (np.arange(self.Sq) if per_row else np.zeros(self.Sq, int))
            qb = [from_bits(to_bits(self.rotate(self.q[b, :, h], qpos), self.dtype), self.dtype)
                  for h in range(self.Hq)]
            pos = lp + np.arange(lk)
            o, r = zip(*(self._pos(b, p) for p in pos)) if lk else ((), ())
            o, r = np.array(o, int), np.array(r, int)
            off = lk - self.Sq
            i, j = np.arange(self.Sq)[:, None], np.arange(lk)[None, :]  # ALiBi's distance
            vis = visible(self.Sq, lk, off, left, right)
            for h in range(self.Hq):
                hk = h // g
                K, V = kval[o, r, hk], vval[o, r, hk]
                if ks is not None:
                    ksc = ks[hk] if self.scaling == "head" else ks[o, r, hk][:, None]
                    vsc = vs[hk] if self.scaling == "head" else vs[o, r, hk][:, None]
                    K, V = K * ksc, V * vsc
                s = self.scale * qb[h] @ K.T
                if self.softcap > 0:
                    s = self.softcap * np.tanh(s / self.softcap)
                if self.alibi is not None:
                    s = s - self.alibi[h] * np.abs(i + off - j)
                s = np.where(vis, s, -np.inf)
                mx = s.max(axis=1, keepdims=True) if lk else np.full((self.Sq, 1), -np.inf)
                mxf = np.where(np.isfinite(mx), mx, 0)
                e = np.exp(s - mxf)
                l = e.sum(axis=1, keepdims=True)
                out[b, :, h] = np.where(l > 0, e / np.where(l > 0, l, 1), 0) @ V
                with np.errstate(divide="ignore"):
                    lse[b, h] = np.where(l[:, 0] > 0, np.log(np.where(l[:, 0] > 0, l[:, 0], 1)) + mxf[:, 0], -np.inf)
        return out, lse


def decode(arch, c, order="sequential", patch=None, wg_order="forward", seed=0, packed=None):
    """decode.hip's path for fp16/bf16 queries without appended tokens: decode_kernel with
    c.num_splits splits, then decode_combine_kernel when there are several.  packed: query
    rows per sequence (each <= c.Sq): the last packed[b] rows of c.q[b], packed as
    (total_q, Hq, D) with cu_seqlens_q (bottom-right masks make them the same problem's last
    rows); out is then (total_q, Hq, D) and lse (Hq, total_q)."""
    r = Run(arch, order, seed=seed, patch=patch, wg_order=wg_order)
    mem = r.mem
    B, Sq, Hq, Hk, D = c.B, c.Sq, c.Hq, c.Hk, c.D
    q_host = c.q if packed is None else np.concatenate([c.q[b, Sq - n:] for b, n in enumerate(packed)])
    total_q = q_host.shape[0]
    pq = mem.array(to_bits(q_host, c.dtype), "q")
    es = ESIZE[c.dtype]
    po = mem.alloc(max(q_host.size * es, 4), "out")
    lse_rows = B * Hq * Sq if packed is None else Hq * total_q
    plse = mem.alloc(max(lse_rows * 4, 4), "lse")
    quant = c.cache != "plain"
    pk, pv = mem.array(c.kc, "k_cache"), mem.array(c.vc, "v_cache")
    outer, rows = c.kc.shape[0], c.kc.shape[1]
    ct = lambda a: Tensor(a, rows * Hk * D, Hk * D, D)
    qt = lambda a: Tensor(a, Sq * Hq * D if packed is None else 0, Hq * D, D)
    pbt = mem.array(c.block_table, "block_table") if c.block_table is not None else 0
    plen = mem.array(np.asarray(c.seqlens, np.int32), "cache_seqlens")
    plp = mem.array(np.asarray(c.leftpad, np.int32), "cache_leftpad") if c.leftpad else 0
    pks = mem.array(c.ks, "k_scale") if quant else 0
    pvs = mem.array(c.vs, "v_scale") if quant else 0
    pal = mem.array(c.alibi, "alibi") if c.alibi is not None else 0
    splits = 1 if c.dtype == "fp32" else min(c.num_splits, 128)  # DecodePlan::make
    nrows = lse_rows * splits
    al = lambda x: (x + 255) // 256 * 256
    o_bytes, lse_bytes = (al(nrows * D * 4), al(nrows * 4)) if splits > 1 else (0, 0)
    ws = mem.alloc(max(o_bytes + lse_bytes, 4), "workspace")
    cdt = {"plain": DTYPE[c.dtype], "fp8": 3, "int8": 4}[c.cache]
    scaling = 0 if not quant else (1 if c.scaling == "head" else 2)
    Sn = c.seqlen_new
    nt = lambda a: Tensor(a, Sn * Hk * D, Hk * D, D)
    pkn = mem.array(to_bits(c.knew, c.dtype), "k_new") if Sn else 0
    pvn = mem.array(to_bits(c.vnew, c.dtype), "v_new") if Sn else 0
    pcos = mem.array(to_bits(c.cos, c.dtype), "rotary_cos") if c.rotary_dim else 0
    psin = mem.array(to_bits(c.sin, c.dtype), "rotary_sin") if c.rotary_dim else 0
    p = DecodeParams(C.sizeof(DecodeParams), 2, DTYPE[c.dtype], B, Sq, Hq, Hk, D, qt(pq), qt(po), plse, cdt, ct(pk),
                     ct(pv), outer, rows, pbt, c.max_pages, c.max_pages, plen, 0, plp, scaling, pks, pvs,
                     nt(pkn) if Sn else Tensor(0, 0, 0, 0), nt(pvn) if Sn else Tensor(0, 0, 0, 0), Sn, pcos, psin,
                     c.rotary_dim, c.seqlen_ro if c.rotary_dim else 0, int(c.interleaved), c.scale, c.softcap,
                     c.window[0], c.window[1], pal, 0, c.num_splits, ws, o_bytes + lse_bytes)
    if packed is not None:
        p.cu_seqlens_q = mem.array(np.concatenate([[0], np.cumsum(packed)]).astype(np.int32), "cu_seqlens_q")
        p.total_q = total_q
    pb = bytes(p)
    if Sn:
        elem = {"plain": "S2_" if c.dtype != "fp32" else "f", "fp8": "h", "int8": "a"}[c.cache]
        tq = "f" if c.dtype == "fp32" else f"N{_tname(c.dtype)}"
        r.launch("decode", f"decode_append_kernelI{tq}{elem}E", ((B * Sn * Hk + 3) // 4, 1, 1), (256, 1, 1), pb)
    hd = 64 if D <= 64 else 128 if D <= 128 else 256
    m_tiles = (Sq * (Hq // Hk) + 15) // 16
    if c.dtype == "fp32":  # the vector-ALU path: a wave per (b, h, i), no splits
        elem = {"plain": "f", "fp8": "h", "int8": "a"}[c.cache]
        r.launch("decode", f"decode_rowwise_kernelI{elem}E", ((Sq + ROW_WAVES - 1) // ROW_WAVES, Hq, B), (256, 1, 1),
                 pb)
    else:
        r.launch(f"decode_{c.dtype}_{c.cache}_hdim{hd}", "decode_kernel", (splits * m_tiles, Hk, B), (256, 1, 1),
                 pb + struct.pack("<QQi", ws, ws + o_bytes, splits))
    if splits > 1 and c.dtype != "fp32":
        parts = 1
        while parts < 8 and 2 * parts < splits:
            parts *= 2
        parts = min(parts, 4)
        rows_out = lse_rows
        r.launch("decode", f"decode_combine_kernelIN{_tname(c.dtype)}", ((rows_out * parts + 3) // 4, 1, 1),
                 (256, 1, 1), pb + struct.pack("<QQii", ws, ws + o_bytes, splits, parts))
    out = from_bits(mem.read(po, q_host.size * es, BITS[c.dtype]), c.dtype).reshape(q_host.shape)
    lse = mem.read(plse, lse_rows * 4, np.float32)
    lse = lse.reshape(B, Hq, Sq) if packed is None else lse.reshape(Hq, total_q)
    # the cache as the kernels left it (values before scaling) and the scales
    kb, vb = mem.read(pk, c.kc.nbytes, c.kc.dtype).reshape(c.kc.shape), mem.read(pv, c.vc.nbytes, c.vc.dtype).reshape(
        c.vc.shape)
    if quant:
        dec = fp8_e4m3_to_float if c.cache == "fp8" else (lambda x: x.astype(np.float64))
        cache = (dec(kb), dec(vb), mem.read(pks, c.ks.nbytes, np.float32).reshape(c.ks.shape),
                 mem.read(pvs, c.vs.nbytes, np.float32).reshape(c.vs.shape))
    else:
        cache = (from_bits(kb, c.dtype), from_bits(vb, c.dtype), None, None)
    r.cache = cache
    return out, lse, r
