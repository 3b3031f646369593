"""Argument checks that run before any kernel: each error names the argument and the limit.

Shape and type checks are trace-friendly (torch.compile runs them on fake tensors).  Checks
of metadata *values* (cu_seqlens, seqused_k) read the tensors, so they run only in the real
op; on a GPU that is one small device-to-host copy, skipped while a CUDA graph is being
captured (the kernels clamp every length to the tensor bounds, so bad values can never
make them read or write out of bounds).
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple, Optional

import torch

from ._backend import _DTYPES

MAX_HEAD_DIM = 256
_INT32_MAX = 2**31 - 1

# The fp8 forward's input dtype (FlashAttention-3's), and every 8-bit float torch has, so that
# the others are refused by name rather than as "not float16".
FP8 = torch.float8_e4m3fn
_FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                              "float8_e8m0fnu") if hasattr(torch, n))


class Dims(NamedTuple):  # a tuple: built on every call, where a frozen dataclass costs several times more
    batch: int
    seqlen_q: int  # fixed: Sq; varlen: max_seqlen_q
    seqlen_k: int
    total_q: int  # varlen: rows of q; fixed: B * Sq
    total_k: int
    heads_q: int
    heads_k: int
    head_dim: int
    varlen: bool


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _int(x, name: str, minimum: int) -> int:
    if type(x) is int and x >= minimum:  # the common case first: these checks run on every call
        return x
    if isinstance(x, bool) or not isinstance(x, (int, torch.SymInt)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return x


_INF = math.inf


def _float(x, name: str) -> float:
    if type(x) is float and math.isfinite(x):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float, torch.SymFloat)):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return float(x)


def _same_device(x: torch.Tensor, name: str, q: torch.Tensor) -> None:
    if x.device != q.device:
        raise ValueError(f"{name} is on {x.device} but q is on {q.device}; all tensors must share a device")


def _index_tensor(x, name: str, numel: int, q: torch.Tensor, what: str) -> None:
    _tensor(x, name)
    if x.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32, got {x.dtype}")
    if x.dim() != 1 or x.numel() != numel:
        raise ValueError(f"{name} must have shape ({numel},) ({what}), got {tuple(x.shape)}")
    _same_device(x, name, q)


def _window_bound(x, name: str) -> int:
    """One window bound: any integer (int, numpy integer, 0-d integer tensor), >= -1."""
    if isinstance(x, (bool, float)) or (isinstance(x, torch.Tensor) and not _integral_tensor(x)):
        raise TypeError(f"{name} must be an int, got {x!r}")
    if isinstance(x, torch.SymInt):
        value = x
    else:
        try:
            value = operator.index(x)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(x).__name__}") from None
    if value < -1:
        raise ValueError(f"{name} must be >= -1, got {value}")
    return value


def _integral_tensor(x: torch.Tensor) -> bool:
    return not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool


def window(window_size, causal: bool) -> tuple[int, int]:
    """flash_attn's (left, right) window, with causal forcing right = 0. Any pair of integers
    is accepted, as flash-attn does: a tuple or list, a 2-element integer tensor or numpy
    array, numpy integers."""
    if type(window_size) is tuple and len(window_size) == 2 and type(causal) is bool:
        left, right = window_size
        if type(left) is int and type(right) is int and left >= -1 and right >= -1:
            return left, 0 if causal else right
    if isinstance(window_size, torch.Tensor):
        if not _integral_tensor(window_size) or window_size.numel() != 2:
            raise TypeError(f"window_size must be a (left, right) pair of ints, got a {window_size.dtype} tensor "
                            f"of shape {tuple(window_size.shape)}")
        window_size = window_size.reshape(-1).tolist()
    elif isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__"):
        raise TypeError(f"window_size must be a (left, right) pair of ints, got {window_size!r}")
    if len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair of ints, got {window_size!r}")
    left = _window_bound(window_size[0], "window_size[0]")
    right = _window_bound(window_size[1], "window_size[1]")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return left, 0 if causal else right


def attention_inputs(
    q, k, v,
    cu_seqlens_q, cu_seqlens_k, seqused_k,
    max_seqlen_q, max_seqlen_k,
    scale, softcap, window_left, window_right,
    alibi_slopes, dropout_p, fp8: bool = False,
) -> Dims:
    """Shapes, dtypes and options of an attention call; fp8: the inputs of the fp8 forward
    (float8_e4m3fn q, k, v; fp8_inputs checks what is particular to them)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        for name, x in (("q", q), ("k", k), ("v", v)):
            _tensor(x, name)
    if fp8:
        if q.dtype != FP8:
            raise TypeError(f"q must be torch.float8_e4m3fn for the fp8 forward, got {q.dtype}")
    elif q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    device = q.device
    if k.device != device or v.device != device:
        _same_device(k, "k", q)
        _same_device(v, "v", q)
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (varlen) or both be None")
    varlen = cu_seqlens_q is not None

    if varlen:
        layout_q, layout_k = "(total_q, nheads, headdim)", "(total_k, nheads_k, headdim)"
        if q.dim() != 3:
            raise ValueError(f"q must be 3-D {layout_q} in varlen mode, got shape {tuple(q.shape)}")
        if k.dim() != 3:
            raise ValueError(f"k must be 3-D {layout_k} in varlen mode, got shape {tuple(k.shape)}")
        total_q, heads_q, head_dim = q.shape
        total_k, heads_k, head_dim_k = k.shape
        _tensor(cu_seqlens_q, "cu_seqlens_q")
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1:
            raise ValueError(f"cu_seqlens_q must have shape (batch + 1,), got {tuple(cu_seqlens_q.shape)}")
        batch = cu_seqlens_q.numel() - 1
        _index_tensor(cu_seqlens_q, "cu_seqlens_q", batch + 1, q, "batch + 1")
        _index_tensor(cu_seqlens_k, "cu_seqlens_k", batch + 1, q, "batch + 1, like cu_seqlens_q")
        seqlen_q = _int(max_seqlen_q, "max_seqlen_q", 0)
        seqlen_k = _int(max_seqlen_k, "max_seqlen_k", 0)
    else:
        layout_q, layout_k = "(batch, seqlen_q, nheads, headdim)", "(batch, seqlen_k, nheads_k, headdim)"
        if q.dim() != 4:
            raise ValueError(f"q must be 4-D {layout_q}, got shape {tuple(q.shape)}")
        if k.dim() != 4:
            raise ValueError(f"k must be 4-D {layout_k}, got shape {tuple(k.shape)}")
        batch, seqlen_q, heads_q, head_dim = q.shape
        batch_k, seqlen_k, heads_k, head_dim_k = k.shape
        if batch_k != batch:
            raise ValueError(f"k has batch size {batch_k} but q has {batch}")
        total_q, total_k = batch * seqlen_q, batch * seqlen_k
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if head_dim_k != head_dim:
        raise ValueError(f"k has head dimension {head_dim_k} but q has {head_dim}; they must match")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dimension (last dim of q) must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    if heads_q < 1 or heads_k < 1 or heads_q % heads_k != 0:
        raise ValueError(
            f"the number of query heads ({heads_q}) must be a positive multiple of the number of "
            f"key/value heads ({heads_k})"
        )
    if (q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1) and head_dim > 1:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.stride(-1) != 1:
                raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {x.stride()}")
    if max(seqlen_q, seqlen_k, total_q, total_k) > _INT32_MAX:
        for name, n in (("sequence length", max(seqlen_q, seqlen_k)), ("rows", max(total_q, total_k))):
            if n > _INT32_MAX:
                raise ValueError(f"{name} {n} exceeds the int32 limit {_INT32_MAX}")

    if seqused_k is not None:
        _index_tensor(seqused_k, "seqused_k", batch, q, "batch")
    if alibi_slopes is not None:
        _tensor(alibi_slopes, "alibi_slopes")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be torch.float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
            raise ValueError(
                f"alibi_slopes must have shape ({heads_q},) or ({batch}, {heads_q}) (nheads or "
                f"batch x nheads), got {tuple(alibi_slopes.shape)}"
            )
        _same_device(alibi_slopes, "alibi_slopes", q)
    # Options of the common types and in range pass in one test (each check below is a call:
    # a small call's host time); anything else gets the checks that name it.
    if not (type(scale) is float and type(softcap) is float and type(dropout_p) is float
            and type(window_left) is int and type(window_right) is int and -_INF < scale < _INF
            and 0.0 <= softcap < _INF and 0.0 <= dropout_p < 1.0 and window_left >= -1 and window_right >= -1):
        _float(scale, "softmax_scale")
        if _float(softcap, "softcap") < 0:
            raise ValueError(f"softcap must be >= 0 (0 disables it), got {softcap}")
        _int(window_left, "window_size[0]", -1)
        _int(window_right, "window_size[1]", -1)
        p = _float(dropout_p, "dropout_p")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return Dims(batch, seqlen_q, seqlen_k, total_q, total_k, heads_q, heads_k, head_dim, varlen)


def metadata_values(
    dims: Dims,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
) -> None:
    """Rejects cu_seqlens / seqused_k values that do not describe the tensors."""
    if cu_seqlens_q is None and seqused_k is None:
        return
    parts = [t for t in (cu_seqlens_q, cu_seqlens_k, seqused_k) if t is not None]
    host = torch.cat([t.reshape(-1) for t in parts]).to("cpu", torch.int64).tolist()
    b = dims.batch
    if cu_seqlens_q is not None:
        cus = {"cu_seqlens_q": host[: b + 1], "cu_seqlens_k": host[b + 1 : 2 * b + 2]}
        rows = {"cu_seqlens_q": (dims.total_q, "q", "max_seqlen_q", dims.seqlen_q),
                "cu_seqlens_k": (dims.total_k, "k and v", "max_seqlen_k", dims.seqlen_k)}
        for name, cu in cus.items():
            total, tensors, max_name, max_len = rows[name]
            if cu[0] < 0:
                raise ValueError(f"{name}[0] must be >= 0, got {cu[0]}")
            for i in range(b):
                if cu[i + 1] < cu[i]:
                    raise ValueError(f"{name} must be non-decreasing, but {name}[{i}] = {cu[i]} > {name}[{i + 1}] = {cu[i + 1]}")
                if cu[i + 1] - cu[i] > max_len:
                    raise ValueError(f"sequence {i} has {cu[i + 1] - cu[i]} rows in {name}, more than {max_name} = {max_len}")
            if cu[b] > total:
                raise ValueError(f"{name}[{b}] = {cu[b]} exceeds the {total} rows of {tensors}")
        used = host[2 * b + 2 :]
        caps = [cus["cu_seqlens_k"][i + 1] - cus["cu_seqlens_k"][i] for i in range(b)]
    else:
        used = host
        caps = [dims.seqlen_k] * b
    if seqused_k is not None:
        for i, (u, cap) in enumerate(zip(used, caps)):
            if not 0 <= u <= cap:
                raise ValueError(f"seqused_k[{i}] = {u} is outside [0, {cap}], the keys sequence {i} has")


def contiguous_last(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """flash_attn accepts any strides but needs the head dimension contiguous."""
    if x is not None and isinstance(x, torch.Tensor) and x.dim() > 0 and x.stride(-1) != 1:
        return x.contiguous()
    return x


def _span(x: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte address that x's elements occupy."""
    first = x.data_ptr()
    last = first + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) * x.element_size()
    return first, last + x.element_size() - 1


def out_tensor(out, shape, q: torch.Tensor, inputs, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Checks a caller's `out=` tensor: q's dtype (or `dtype`: bfloat16 for fp8 inputs) and
    device, `shape`, a contiguous last dimension, no element written twice (a zero stride),
    and no memory shared with the inputs the kernel reads while it writes (`inputs`:
    (name, tensor) pairs)."""
    _tensor(out, "out")
    if dtype is not None:
        if out.dtype != dtype:
            raise TypeError(f"out must be {dtype} (the fp8 forward's output dtype), got {out.dtype}")
    elif out.dtype != q.dtype:
        raise TypeError(f"out must have q's dtype {q.dtype}, got {out.dtype}")
    if out.device != q.device:
        raise ValueError(f"out is on {out.device} but q is on {q.device}; all tensors must share a device")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"out must have a contiguous last dimension (stride 1), got strides {out.stride()}")
    if any(st == 0 and n > 1 for n, st in zip(out.shape, out.stride())):
        raise ValueError(f"out must not have overlapping elements (a zero stride), got strides {out.stride()}")
    if out.numel() == 0 or torch.compiler.is_compiling() or type(out) is not torch.Tensor:
        return out  # fake tensors have no addresses; an empty out is never written
    lo, hi = _span(out)
    for name, x in inputs:
        if x is None or x.numel() == 0 or type(x) is not torch.Tensor:
            continue
        if x.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            continue
        xlo, xhi = _span(x)
        if lo <= xhi and xlo <= hi:
            raise ValueError(f"out must not share memory with {name}: the kernels read {name} while they write out")
    return out


def sink(s_aux, learnable_sink, q: torch.Tensor) -> Optional[torch.Tensor]:
    """The attention-sink logits, given as s_aux (vLLM, FlashAttention-3 forks) or
    learnable_sink (FlashAttention-4): one per query head, shape (nheads,), float32 or q's
    dtype, on q's device.  Their values are checked (finite) where reading them costs no
    device synchronization: on the CPU, outside tracing."""
    if s_aux is not None and learnable_sink is not None:
        raise ValueError("give the sink logits once: s_aux or learnable_sink, not both")
    name, x = ("s_aux", s_aux) if learnable_sink is None else ("learnable_sink", learnable_sink)
    if x is None:
        return None
    _tensor(x, name)
    heads_q = q.shape[-2] if q.dim() >= 2 else 0
    if x.dtype not in (torch.float32, q.dtype):
        raise TypeError(f"{name} must be torch.float32 or q's dtype {q.dtype}, got {x.dtype}")
    if tuple(x.shape) != (heads_q,):
        raise ValueError(f"{name} must have shape ({heads_q},) (one logit per query head), got {tuple(x.shape)}")
    _same_device(x, name, q)
    if (x.device.type == "cpu" and type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and not bool(torch.isfinite(x.detach()).all())):
        raise ValueError(f"{name} must be finite, got {x.detach().tolist()}")
    return x


def descale(x, name: str, batch: int, heads_k: int, q: torch.Tensor) -> Optional[torch.Tensor]:
    """FlashAttention-3's per-(sequence, KV head) descale factor, as one scale per KV head
    (Hk,) when it means exactly that: a scalar (any shape of one element), (1, Hk), or
    (batch, Hk) whose rows are one row by construction (a zero batch stride, as
    `scale.expand(batch, Hk)` makes it).  Rows that may differ raise: fmha's caches take one
    scale per head or per token, never per sequence."""
    if x is None:
        return None
    _tensor(x, name)
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be torch.float32, got {x.dtype}")
    _same_device(x, name, q)
    if x.numel() == 1:
        return x.reshape(1).expand(heads_k).contiguous()
    if x.dim() != 2 or x.shape[1] != heads_k or x.shape[0] not in (1, batch):
        raise ValueError(f"{name} must be a scalar or have shape ({batch}, {heads_k}) (batch, nheads_k; or "
                         f"(1, {heads_k})), got {tuple(x.shape)}")
    if x.shape[0] > 1 and x.stride(0) != 0:
        raise ValueError(f"{name} ({batch}, {heads_k}) with its own row per sequence is not supported: fmha's "
                         f"8-bit caches take one scale per KV head (pass {name}[0:1], or the (nheads_k,) scale "
                         f"expanded to ({batch}, {heads_k})) or per token (k_scale/v_scale of shape "
                         f"(num_blocks, page_size, nheads_k))")
    return x[0].contiguous()


# --- The fp8 forward (FlashAttention-3's): float8_e4m3fn q, k, v on sm_90, bfloat16 out. ---


def is_fp8(q, k, v) -> bool:
    """Whether q, k, v (tensors) are the fp8 forward's inputs: True when all three are float8_e4m3fn,
    False when none is an 8-bit float; anything between raises, naming the odd tensor."""
    if q.dtype in _DTYPES and k.dtype in _DTYPES and v.dtype in _DTYPES:  # the common case, first
        return False
    tensors = (("q", q), ("k", k), ("v", v))
    eight = [(n, x.dtype) for n, x in tensors if isinstance(x, torch.Tensor) and x.dtype in _FLOAT8]
    if not eight:
        return False
    for name, dtype in eight:
        if dtype != FP8:
            raise TypeError(f"{name} is {dtype}: fp8 attention takes torch.float8_e4m3fn (e4m3) inputs only")
    if len(eight) != 3:
        dtypes = ", ".join(f"{n} {x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}" for n, x in tensors)
        raise TypeError(f"q, k and v must all be torch.float8_e4m3fn (the fp8 forward) or none of them, got {dtypes}")
    return True


def input_descale(x, name: str, batch: int, heads_k: int, q: torch.Tensor) -> None:
    """FlashAttention-3's dequantization factor of an fp8 input: float32 on q's device, one
    value (any shape of one element: the whole tensor) or (batch, nheads_k) (per sequence and
    KV head, any strides)."""
    _tensor(x, name)
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be torch.float32, got {x.dtype}")
    if x.numel() != 1 and tuple(x.shape) != (batch, heads_k):
        raise ValueError(f"{name} must be a scalar or have shape ({batch}, {heads_k}) (batch, nheads_k), got "
                         f"{tuple(x.shape)}")
    _same_device(x, name, q)


def fp8_inputs(d: Dims, q, k, v, descales) -> None:
    """What the fp8 forward needs beyond attention_inputs(fp8=True) (its device is checked in
    ops): the (q, k, v)_descale factors (input_descale), and, for a head dim that is a
    multiple of 16 (others are zero-padded to one, a copy, in ops), rows the kernels can load
    as they are as 16-byte vectors: every stride but the last a multiple of 16 elements, and
    16-byte aligned data (where there is an address: not while tracing).  Such a layout is
    never fixed by a hidden copy: one the kernels cannot load raises, naming the tensor."""
    for name, x in zip(("q_descale", "k_descale", "v_descale"), descales):
        if x is not None:
            input_descale(x, name, d.batch, d.heads_k, q)
    if d.head_dim % 16:
        return
    for name, x in (("q", q), ("k", k), ("v", v)):
        bad = [(dim, st) for dim, (n, st) in enumerate(zip(x.shape[:-1], x.stride()[:-1])) if n > 1 and st % 16]
        if bad:
            dim, st = bad[0]
            raise ValueError(
                f"{name} has stride {st} in dimension {dim} (shape {tuple(x.shape)}, strides {x.stride()}): the fp8 "
                f"kernels need every stride but the last to be a multiple of 16 elements (16 bytes); make it "
                f"contiguous, or allocate it so")
        if type(x) is torch.Tensor and not torch.compiler.is_compiling() and x.data_ptr() % 16:
            raise ValueError(f"{name}'s data is not 16-byte aligned (address {x.data_ptr():#x}): the fp8 kernels load "
                             f"16-byte rows; pass a tensor whose storage offset is a multiple of 16 elements")
