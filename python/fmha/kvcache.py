"""Inference with a KV cache: flash-attn 2.x's flash_attn_with_kvcache (contiguous or paged
caches, in-place append, rotary, GQA, windows, softcap, ALiBi), 8-bit caches (fp8 e4m3,
int8) with per-head or per-token scales, and merge_attentions for combining partial
results by their log-sum-exp."""

import operator
import os
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _C, _checks
from ._backend import _DTYPES, fmha_device, ptr, stream_handle
from . import ops as _ops
from .ops import _vector_aligned

_QUANT = {torch.float8_e4m3fn: _C.DType.float8_e4m3, torch.int8: _C.DType.int8}
_QMAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


def _bshd(t: Optional[Tensor]) -> "_C.Tensor":
    if t is None:
        return _C.Tensor()
    return _C.Tensor(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))


def _check_cache_args(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, k_scale, v_scale, alibi_slopes, cu_seqlens_q=None, max_seqlen_q=0):
    packed = cu_seqlens_q is not None
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _checks._tensor(x, name)
        dims = 3 if packed and x is q else 4
        if x.dim() != dims:
            what = " (total_q, nheads, headdim): packed by cu_seqlens_q" if packed and x is q else ""
            raise ValueError(f"{name} must be {dims}-D{what}, got shape {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {x.stride()}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32 (fp8 queries are not supported), got {q.dtype}")
    if packed:
        _checks._tensor(cu_seqlens_q, "cu_seqlens_q")
        if cu_seqlens_q.dtype != torch.int32:
            raise TypeError(f"cu_seqlens_q must be torch.int32, got {cu_seqlens_q.dtype}")
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1:
            raise ValueError(f"cu_seqlens_q must have shape (batch + 1,), got {tuple(cu_seqlens_q.shape)}")
        _checks._same_device(cu_seqlens_q, "cu_seqlens_q", q)
        if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
            raise ValueError(f"max_seqlen_q must be an int >= 0 (the most query rows of any sequence), got "
                             f"{max_seqlen_q!r}")
        if k is not None or v is not None:
            raise ValueError("k and v (tokens to append) cannot be combined with cu_seqlens_q: write them into the "
                             "cache first (or call once per step without cu_seqlens_q)")
        if rotary_cos is not None or rotary_sin is not None:
            raise ValueError("rotary_cos/rotary_sin cannot be combined with cu_seqlens_q: rotate q (and the cached "
                             "keys) before the call")
        batch, seqlen_q, (heads_q, head_dim) = cu_seqlens_q.numel() - 1, max_seqlen_q, q.shape[1:]
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
    if v_cache.shape[-1] != k_cache.shape[-1]:
        raise ValueError(f"v_cache has head dimension {v_cache.shape[-1]} but k_cache has {k_cache.shape[-1]}: "
                         f"flash_attn_with_kvcache's decode kernels read one head dim for keys and values (padding "
                         f"the narrower cache would copy it whole on every call); a V head dim other than the QK "
                         f"head dim is served by flash_attn_func and flash_attn_varlen_func")
    if tuple(v_cache.shape) != tuple(k_cache.shape) or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache must match k_cache: {tuple(k_cache.shape)} {k_cache.dtype}, got "
                         f"{tuple(v_cache.shape)} {v_cache.dtype}")
    _, cache_seqlen, heads_k, head_dim_k = k_cache.shape
    if head_dim_k != head_dim:
        raise ValueError(f"k_cache has head dimension {head_dim_k} but q has {head_dim}")
    if not 1 <= head_dim <= _checks.MAX_HEAD_DIM:
        raise ValueError(f"head dimension must be between 1 and {_checks.MAX_HEAD_DIM}, got {head_dim}")
    if heads_q % heads_k != 0:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the cache's ({heads_k})")
    quantized = k_cache.dtype in _QUANT
    if quantized:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise ValueError(f"a {k_cache.dtype} cache needs {name} (see fmha.quantize_kv_cache)")
            _checks._tensor(s, name)
            if s.dtype != torch.float32:
                raise TypeError(f"{name} must be torch.float32, got {s.dtype}")
            if tuple(s.shape) not in ((heads_k,), tuple(k_cache.shape[:3])):
                raise ValueError(f"{name} must have shape ({heads_k},) (per head) or {tuple(k_cache.shape[:3])} "
                                 f"(per token), got {tuple(s.shape)}")
            if not s.is_contiguous() or s.device != q.device:
                raise ValueError(f"{name} must be contiguous and on {q.device}")
        if k_scale.shape != v_scale.shape:
            raise ValueError("k_scale and v_scale must have the same shape")
    else:
        if k_cache.dtype != q.dtype:
            raise TypeError(f"k_cache must have q's dtype {q.dtype}, or be float8_e4m3fn / int8 with scales; got "
                            f"{k_cache.dtype}")
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale/v_scale apply to float8_e4m3fn and int8 caches, not {k_cache.dtype}")
    index = lambda x, name, shape: _checks._index_tensor(x, name, shape, q, "batch")  # noqa: E731
    index(cache_seqlens, "cache_seqlens", batch)
    if cache_batch_idx is not None:
        index(cache_batch_idx, "cache_batch_idx", batch)
    if cache_leftpad is not None:
        index(cache_leftpad, "cache_leftpad", batch)
    if block_table is not None:
        _checks._tensor(block_table, "block_table")
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be torch.int32, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_num_blocks), got {tuple(block_table.shape)}")
        if cache_seqlen % 16 != 0:
            raise ValueError(f"page size (k_cache.shape[1]) must be a multiple of 16, got {cache_seqlen}")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be combined with block_table (a paged cache)")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            _checks._tensor(x, name)
            if x.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
            if x.dim() != 4 or x.shape[0] != batch or x.shape[2:] != (heads_k, head_dim):
                raise ValueError(f"{name} must have shape ({batch}, seqlen_new, {heads_k}, {head_dim}), got "
                                 f"{tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _checks._tensor(x, name)
            if x.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
            if x.dim() != 2 or 2 * x.shape[1] > head_dim or x.shape[1] < 1:
                raise ValueError(f"{name} must have shape (seqlen_ro, rotary_dim / 2) with rotary_dim <= "
                                 f"{head_dim}, got {tuple(x.shape)}")
        if rotary_cos.shape != rotary_sin.shape:
            raise ValueError("rotary_cos and rotary_sin must have the same shape")
    if alibi_slopes is not None:
        _checks._tensor(alibi_slopes, "alibi_slopes")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be torch.float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
            raise ValueError(f"alibi_slopes must have shape ({heads_q},) or ({batch}, {heads_q}), got "
                             f"{tuple(alibi_slopes.shape)}")


def _packed(t: Tensor) -> "_C.Tensor":
    """A (total, H, D) tensor of packed rows (the batch stride is ignored)."""
    return _C.Tensor(t.data_ptr(), 0, t.stride(0), t.stride(1))


def _CHECK_METADATA() -> bool:
    """FMHA_CHECK_METADATA=1: read device-resident metadata back (a synchronization) and
    raise on any index out of range, before the kernels run (which would clamp it)."""
    return os.environ.get("FMHA_CHECK_METADATA") == "1"


def _check_metadata_on_host(batch, seqlen_q, total_q, cu_seqlens_q, cache_seqlens, seqlen_new, cache_batch,
                            cache_seqlen, block_table, cache_leftpad, cache_batch_idx) -> None:
    """The kernels' metadata, checked on the host (FMHA_CHECK_METADATA=1): what the GPU
    kernels would silently clamp raises ValueError here, naming the entry."""
    host = lambda x: None if x is None else x.detach().to("cpu", torch.int64)  # noqa: E731
    cu, filled, table, leftpad, idx = (host(x) for x in (cu_seqlens_q, cache_seqlens, block_table, cache_leftpad,
                                                          cache_batch_idx))
    where = "FMHA_CHECK_METADATA: "
    if cu is not None:
        lens = cu[1:] - cu[:-1]
        if batch and cu[0] < 0:
            raise ValueError(f"{where}cu_seqlens_q[0] = {int(cu[0])} must be >= 0")
        for name, bad in (("is decreasing", lens < 0), (f"exceeds max_seqlen_q = {seqlen_q}", lens > seqlen_q)):
            if bad.any():
                b = int(bad.nonzero()[0])
                raise ValueError(f"{where}sequence {b} has {int(lens[b])} query rows (cu_seqlens_q[{b}] = "
                                 f"{int(cu[b])}, cu_seqlens_q[{b + 1}] = {int(cu[b + 1])}): cu_seqlens_q {name}")
        if int(cu[-1]) > total_q:
            raise ValueError(f"{where}cu_seqlens_q[{batch}] = {int(cu[-1])} exceeds the {total_q} rows of q")
    capacity = cache_seqlen * (table.shape[1] if table is not None else 1)
    end = filled + seqlen_new
    for b in range(batch):
        if filled[b] < 0 or end[b] > capacity:
            raise ValueError(f"{where}cache_seqlens (seqused_k)[{b}] = {int(filled[b])} (+ {seqlen_new} new) is "
                             f"outside [0, {capacity}], the positions the cache (block_table width x page size) "
                             f"holds per sequence")
        if leftpad is not None and not 0 <= leftpad[b] <= filled[b]:
            raise ValueError(f"{where}cache_leftpad[{b}] = {int(leftpad[b])} is outside [0, {int(filled[b])}]")
        if idx is not None and not 0 <= idx[b] < cache_batch:
            raise ValueError(f"{where}cache_batch_idx[{b}] = {int(idx[b])} is outside [0, {cache_batch})")
        if table is not None:
            pages = table[b, :(int(end[b]) + cache_seqlen - 1) // cache_seqlen]
            bad = (pages < 0) | (pages >= cache_batch)
            if bad.any():
                i = int(bad.nonzero()[0])
                raise ValueError(f"{where}block_table[{b}][{i}] = {int(pages[i])} is outside [0, {cache_batch}) "
                                 f"pages")


def _kernel_layout(x: Optional[Tensor], head_dim: int) -> Optional[Tensor]:
    """x as the GPU decode kernels can read it: `head_dim` columns (zero-padded) and 16-byte
    aligned rows and strides, copied only when it is not so already.  8-bit caches are
    padded through a uint8 view (the zero byte is 0 in fp8 e4m3 and int8 alike)."""
    if x is None:
        return None
    if x.shape[-1] != head_dim:
        raw = x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x
        padded = torch.nn.functional.pad(raw, (0, head_dim - x.shape[-1]))
        return padded.view(x.dtype) if raw is not x else padded
    if not _vector_aligned(x):
        return x.clone(memory_format=torch.contiguous_format)
    return x


def _copy_back(dst: Tensor, src: Tensor) -> None:
    """dst[...] = src[..., :dst.shape[-1]], bytewise for 8-bit caches."""
    if dst.dtype == torch.float8_e4m3fn:
        dst, src = dst.view(torch.uint8), src.view(torch.uint8)
    dst.copy_(src[..., :dst.shape[-1]])


def _kvcache_fwd_impl(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
    rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Tensor,
    cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
    k_scale: Optional[Tensor], v_scale: Optional[Tensor], scale: float, window_left: int, window_right: int,
    softcap: float, rotary_interleaved: bool, alibi_slopes: Optional[Tensor], num_splits: int,
    cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
) -> Tuple[Tensor, Tensor]:
    """(out, lse) of q against the cache after appending k, v; see flash_attn_with_kvcache."""
    return _kvcache_fwd(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                        cache_leftpad, block_table, k_scale, v_scale, scale, window_left, window_right, softcap,
                        rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q, max_seqlen_q)


def _kvcache_fwd(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                 block_table, k_scale, v_scale, scale, window_left, window_right, softcap, rotary_interleaved,
                 alibi_slopes, num_splits, cu_seqlens_q=None, max_seqlen_q=0, out=None):
    """_kvcache_fwd_impl, writing into `out` (checked by the caller) when it is given.

    The GPU kernels for 16-bit queries move 16-byte rows: q, out, k, v and the caches need
    16-byte aligned rows and a head dim that is a multiple of 8 (16 for 8-bit caches).  Any
    other head dim or stride is served here, as flash-attn does: inputs are zero-padded or
    copied, out is computed into a buffer and copied, and a padded or copied cache that the
    call appends to is copied back whole (a cost of the cache's size per call, for layouts
    the kernels cannot address; the usual ones take no copy)."""
    _check_cache_args(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, k_scale, v_scale, alibi_slopes, cu_seqlens_q, max_seqlen_q)
    packed = cu_seqlens_q is not None
    if packed:
        batch, seqlen_q, (total_q, heads_q, head_dim) = cu_seqlens_q.numel() - 1, max_seqlen_q, q.shape
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
    if _CHECK_METADATA():
        _check_metadata_on_host(batch, seqlen_q, q.shape[0] if packed else 0, cu_seqlens_q, cache_seqlens,
                                0 if k is None else k.shape[1], k_cache.shape[0], k_cache.shape[1], block_table,
                                cache_leftpad, cache_batch_idx)
    user_out, user_caches = out, (k_cache, v_cache)
    if _ops._vector_rows(q.device, q.dtype):
        vec = 16 if k_cache.dtype in _QUANT else 8
        head_dim = -(-head_dim // vec) * vec
        q, k_cache, v_cache, k, v = (_kernel_layout(x, head_dim) for x in (q, k_cache, v_cache, k, v))
        if out is not None and (head_dim != out.shape[-1] or not _vector_aligned(out)):
            out = None
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_shape = (heads_q, total_q) if packed else (batch, heads_q, seqlen_q)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    rotary_cos, rotary_sin, block_table, cu_seqlens_q = (None if x is None else x.contiguous()
                                                         for x in (rotary_cos, rotary_sin, block_table, cu_seqlens_q))
    cache_seqlens, cache_batch_idx, cache_leftpad, alibi_slopes = (
        None if x is None else x.contiguous() for x in (cache_seqlens, cache_batch_idx, cache_leftpad, alibi_slopes))

    p = _C.DecodeParams()
    p.device = fmha_device(q.device)
    p.dtype = _DTYPES[q.dtype]
    p.batch, p.seqlen_q, p.num_heads_q, p.head_dim = batch, seqlen_q, heads_q, head_dim
    p.num_heads_k = k_cache.shape[2]
    if packed:
        p.q, p.out = _packed(q), _packed(out)
        p.cu_seqlens_q, p.total_q = cu_seqlens_q.data_ptr(), total_q
    else:
        p.q, p.out = _bshd(q), _bshd(out)
    p.lse = lse.data_ptr()
    p.cache_dtype = _QUANT.get(k_cache.dtype, _DTYPES.get(k_cache.dtype, p.dtype))
    p.k_cache, p.v_cache = _bshd(k_cache), _bshd(v_cache)
    p.cache_batch, p.cache_seqlen = k_cache.shape[0], k_cache.shape[1]
    if block_table is not None:
        p.block_table = block_table.data_ptr()
        p.block_table_stride, p.max_pages = block_table.stride(0), block_table.shape[1]
    p.cache_seqlens, p.cache_batch_idx, p.cache_leftpad = ptr(cache_seqlens), ptr(cache_batch_idx), ptr(cache_leftpad)
    if k_scale is not None:
        p.scaling = _C.CacheScaling.per_head if k_scale.dim() == 1 else _C.CacheScaling.per_token
        p.k_scale, p.v_scale = k_scale.data_ptr(), v_scale.data_ptr()
    if k is not None:
        p.k_new, p.v_new, p.seqlen_new = _bshd(k), _bshd(v), k.shape[1]
    if rotary_cos is not None:
        p.rotary_cos, p.rotary_sin = rotary_cos.data_ptr(), rotary_sin.data_ptr()
        p.rotary_dim, p.seqlen_ro = 2 * rotary_cos.shape[1], rotary_cos.shape[0]
        p.rotary_interleaved = int(rotary_interleaved)
    p.scale, p.softcap = scale, softcap
    p.window_left, p.window_right = window_left, window_right
    if alibi_slopes is not None:
        p.alibi_slopes = alibi_slopes.data_ptr()
        p.alibi_batch_stride = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    p.num_splits = num_splits
    workspace = torch.empty(_C.decode_workspace_size(p), dtype=torch.uint8, device=q.device)
    p.workspace, p.workspace_size = ptr(workspace), workspace.numel()
    _C.decode(p, stream_handle(q.device))
    if k is not None:  # the append went into a padded or realigned copy: back into the caller's caches
        for cache, used in zip(user_caches, (k_cache, v_cache)):
            if used is not cache:
                _copy_back(cache, used)
    if out.shape[-1] != user_caches[0].shape[-1]:
        out = out[..., :user_caches[0].shape[-1]]
    if user_out is not None and out is not user_out:
        user_out.copy_(out)
        out = user_out
    return out, lse


kvcache_fwd = torch.library.custom_op("fmha::kvcache_fwd", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))(
    _kvcache_fwd_impl)


@kvcache_fwd.register_fake
def _kvcache_fwd_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, k_scale, v_scale, scale, window_left, window_right, softcap,
                      rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q=None, max_seqlen_q=0):
    _check_cache_args(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, k_scale, v_scale, alibi_slopes, cu_seqlens_q, max_seqlen_q)
    if cu_seqlens_q is not None:
        return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None, cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None, num_splits: int = 0,
                            return_softmax_lse: bool = False, *, k_scale: Optional[Tensor] = None,
                            v_scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                            q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                            v_descale: Optional[Tensor] = None, s_aux: Optional[Tensor] = None,
                            learnable_sink: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                            max_seqlen_q: Optional[int] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention of q (batch, seqlen, nheads, headdim) against a KV cache, flash-attn 2.x's
    semantics: k_cache/v_cache are (batch_cache, seqlen_cache, nheads_k, headdim), or with
    block_table (batch, max_num_blocks) int32 paged (num_blocks, page_size, nheads_k,
    headdim) with page_size any multiple of 16.  cache_seqlens (int or (batch,) int32) are
    the filled lengths; k, v (batch, seqlen_new, nheads_k, headdim) are first written into
    the cache in place at cache_seqlens (rotated by rotary_cos/sin if given).  q is rotated
    at positions cache_seqlens + i when causal or windowed, else at cache_seqlens.
    cache_batch_idx maps batch entries to cache rows; cache_leftpad marks where each cache
    starts.  Causal aligns the last query with the last key.

    Quantized caches (keyword-only, fmha's extension): k_cache/v_cache of dtype
    torch.float8_e4m3fn or torch.int8 with float32 k_scale, v_scale of shape (nheads_k,) or
    (batch_cache, seqlen_cache, nheads_k): value = stored * scale (fmha.quantize_kv_cache
    makes them); appended tokens are quantized in place (per-token scales are written).

    FlashAttention-3's names (keyword-only): k_descale, v_descale (float32, a scalar or
    (batch, nheads_k)) are the scales of an 8-bit cache, as k_scale/v_scale (not both); a
    (batch, nheads_k) descale must have one row for every sequence (batch 1, or expanded
    from one row with stride 0, as vLLM passes it), since fmha's scales are per head or per
    token.  q_descale raises ValueError: fmha takes float16/bfloat16/float32 queries, not fp8.

    out= (keyword): a (batch, seqlen, nheads, headdim) tensor of q's dtype and device (any
    strides with a contiguous last dimension, sharing no memory with the inputs) that
    receives the result and is returned; the kernel writes it directly, nothing is
    allocated for the output (on a GPU a copy is needed only when the kernels cannot address
    it: head dim not a multiple of 8, rows not 16-byte aligned).

    Any head dim 1-256 at any stride: on a GPU, layouts the kernels cannot address (head dim
    not a multiple of 8, or 16 for 8-bit caches; unaligned rows) are padded or copied
    first, as flash-attn does; a cache that needed a copy and is appended to is copied back
    whole, a cost of the cache's size per call.

    s_aux (keyword; or learnable_sink): attention sinks, one logit per query head (nheads,),
    float32 or q's dtype, as in flash_attn_func: each joins its head's softmax denominator
    and adds no value; softmax_lse includes it.  v_cache must have k_cache's head dim (a V
    head dim of its own is served by flash_attn_func and flash_attn_varlen_func).

    Packed queries (keyword-only, FlashAttention-3's signature): with cu_seqlens_q (batch +
    1,) int32 and max_seqlen_q (int), q is (total_q, nheads, headdim) and sequence b owns
    rows cu_seqlens_q[b]:cu_seqlens_q[b + 1], any number of them (0 included), so one call
    mixes prefill chunks and decode steps; each sequence's mask aligns bottom-right on its
    own lengths (its last query row sees its last key).  The cache must already hold the
    keys (k, v and rotary_cos/sin raise); out and softmax_lse are then (total_q, nheads,
    headdim) and (nheads, total_q).

    Returns out (batch, seqlen, nheads, headdim), and softmax_lse (batch, nheads, seqlen)
    with return_softmax_lse.  Forward only (inference): when an input requires grad, out
    does too, and a backward through it raises instead of silently dropping attention's
    share of the gradient; train with flash_attn_func or flash_attn_varlen_func.
    """
    q = _checks.contiguous_last(q)
    k, v = _checks.contiguous_last(k), _checks.contiguous_last(v)
    _checks._tensor(q, "q")
    _checks._tensor(k_cache, "k_cache")
    if (cu_seqlens_q is None) != (max_seqlen_q is None):
        raise ValueError("cu_seqlens_q and max_seqlen_q must be given together (packed queries)")
    if cu_seqlens_q is not None:
        _checks._tensor(cu_seqlens_q, "cu_seqlens_q")
        batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q.dim() == 1 else -1
        max_seqlen_q = _seqlen_arg(max_seqlen_q, "max_seqlen_q")
    else:
        batch = q.shape[0]
    k_scale, v_scale = _descales(q, k_cache, k_scale, v_scale, q_descale, k_descale, v_descale, batch)
    s_aux = _checks.sink(s_aux, learnable_sink, q)
    if out is not None:
        _checks.out_tensor(out, q.shape, q, (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k),
                                             ("v", v)))
    if cache_seqlens is None:
        raise ValueError("cache_seqlens is required (the number of filled positions of each cache)")
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((max(batch, 0),), cache_seqlens, dtype=torch.int32, device=q.device)
    left, right = _checks.window(window_size, causal)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 picks automatically), got {num_splits!r}")
    # Eager calls on plain tensors skip the dispatcher (tens of microseconds per call, more
    # than a decode step's GPU time); anything traced (torch.compile, export, fake or
    # subclass tensors) goes through the registered op.
    eager = not torch.compiler.is_compiling() and all(
        x is None or type(x) is Tensor for x in (q, k_cache, v_cache, k, v, cache_seqlens, block_table))
    eager = eager and (out is None or type(out) is Tensor)
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, k_scale, v_scale, float(softmax_scale), left, right, float(softcap),
            bool(rotary_interleaved), alibi_slopes, num_splits)
    if cu_seqlens_q is not None:
        args += (cu_seqlens_q, max_seqlen_q)
    eager = eager and (cu_seqlens_q is None or type(cu_seqlens_q) is Tensor)
    out, lse = _run(args, eager, out, "flash_attn_with_kvcache", s_aux)
    return (out, lse) if return_softmax_lse else out


def _run(args, eager: bool, user_out: Optional[Tensor], name: str, s_aux: Optional[Tensor] = None
         ) -> Tuple[Tensor, Tensor]:
    """(out, lse) of the kvcache op on args (in _kvcache_fwd_impl's order), written into
    user_out when given, with the attention sinks s_aux applied; forward-only: a backward
    through out raises, naming `name`."""
    packed = len(args) > 20 and args[20] is not None  # cu_seqlens_q: lse (nheads, total_q)
    if eager:
        out, lse = _kvcache_fwd(*args, out=user_out)  # writes into user_out when it is given
    else:
        out, lse = torch.ops.fmha.kvcache_fwd(*args)
    if s_aux is not None:  # forward only: the sink is applied to the result in place
        with torch.no_grad():
            out, lse = _ops.apply_sink(out, lse, s_aux, varlen=packed, in_place=True)
    # q, k_cache, v_cache, k, v, s_aux; written in place, the caller's tensor carries the node
    out = _ops.forward_only(out, _FORWARD_ONLY[name], args[:5] + (s_aux,), written_in_place=out is user_out)
    if user_out is not None and out is not user_out:  # traced: the op allocated its output
        user_out.copy_(out)
        out = user_out
    return out, lse


def _seqlen_arg(x, name: str) -> int:
    """A max_seqlen argument: any integer >= 0 (a Python or numpy int, a 0-d integer tensor)."""
    if isinstance(x, bool) or (isinstance(x, Tensor) and (x.numel() != 1 or x.is_floating_point())):
        raise TypeError(f"{name} must be an int, got {x!r}")
    try:
        value = operator.index(x) if not isinstance(x, Tensor) else int(x)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(x).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _descales(q, k_cache, k_scale, v_scale, q_descale, k_descale, v_descale, batch=None):
    """k_scale, v_scale from FlashAttention-3's k_descale / v_descale (see
    flash_attn_with_kvcache); q_descale has no counterpart in fmha."""
    if q_descale is not None:
        raise ValueError(f"q_descale is not supported: it describes an fp8 q, and fmha computes with float16, "
                         f"bfloat16 or float32 queries (q is {q.dtype}); drop q_descale, or fold a scalar one "
                         f"into softmax_scale")
    if k_descale is None and v_descale is None:
        return k_scale, v_scale
    if (k_descale is None) != (v_descale is None):
        raise ValueError("k_descale and v_descale must be given together")
    if k_scale is not None or v_scale is not None:
        raise ValueError("give the cache scales once: k_scale/v_scale or k_descale/v_descale, not both")
    if k_cache.dtype not in _QUANT:
        raise ValueError(f"k_descale/v_descale apply to float8_e4m3fn and int8 caches, not {k_cache.dtype}")
    if q.dim() not in (3, 4) or k_cache.dim() != 4:
        raise ValueError(f"q must be 4-D (3-D packed) and k_cache 4-D, got shapes {tuple(q.shape)} and "
                         f"{tuple(k_cache.shape)}")
    batch, heads_k = q.shape[0] if batch is None else batch, k_cache.shape[2]
    return (_checks.descale(k_descale, "k_descale", batch, heads_k, q),
            _checks.descale(v_descale, "v_descale", batch, heads_k, q))


_FORWARD_ONLY = {
    "flash_attn_varlen_func": ("flash_attn_varlen_func with block_table (a paged KV cache) is forward-only "
                               "(inference): it has no gradient for q or the caches; train on contiguous k and v "
                               "(no block_table), or call it under torch.no_grad()"),
    "flash_attn_with_kvcache": ("flash_attn_with_kvcache is forward-only (inference): it has no gradient for q, k, v "
                                "or the caches; use flash_attn_func or flash_attn_varlen_func for training, or call "
                                "it under torch.no_grad()"),
}


def quantize_kv_cache(cache: Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                      scaling: str = "head") -> Tuple[Tensor, Tensor]:
    """(quantized cache, float32 scale) with cache ~= quantized * scale.  cache is
    (batch or pages, seqlen or page_size, nheads_k, headdim); dtype torch.float8_e4m3fn or
    torch.int8; scaling "head" gives scales (nheads_k,), "token" (batch, seqlen, nheads_k).
    Rounds to nearest even and saturates, as the kernels do for appended tokens."""
    if dtype not in _QMAX:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.int8, got {dtype}")
    if scaling not in ("head", "token"):
        raise ValueError(f"scaling must be 'head' or 'token', got {scaling!r}")
    if not isinstance(cache, Tensor) or cache.dim() != 4:
        raise ValueError("cache must be a 4-D tensor (batch, seqlen, nheads_k, headdim)")
    x = cache.float()
    amax = x.abs().amax(dim=(0, 1, 3)) if scaling == "head" else x.abs().amax(dim=3)
    scale = amax / _QMAX[dtype]
    expanded = scale[None, None, :, None] if scaling == "head" else scale[..., None]
    scaled = torch.where(expanded > 0, x / expanded.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    scaled = scaled.clamp(-_QMAX[dtype], _QMAX[dtype])
    quantized = scaled.round().to(dtype) if dtype == torch.int8 else scaled.to(dtype)
    return quantized, scale.contiguous()


def merge_attentions(outs: Union[Sequence[Tensor], Tensor], lses: Union[Sequence[Tensor], Tensor]
                     ) -> Tuple[Tensor, Tensor]:
    """Combines attention computed over disjoint key sets (split-KV, context parallelism):
    outs[i] (..., seqlen, nheads, headdim) with lses[i] (..., nheads, seqlen) (flash_attn's
    layouts) -> (out, lse) of attention over all the keys.  Differentiable with respect to
    every input; rows with all lse = -inf give out 0 and lse -inf."""
    outs = torch.stack(list(outs)) if not isinstance(outs, Tensor) else outs
    lses = torch.stack(list(lses)) if not isinstance(lses, Tensor) else lses
    if outs.dim() < 4 or lses.dim() != outs.dim() - 1:
        raise ValueError(f"outs must be (n, ..., seqlen, nheads, headdim) and lses (n, ..., nheads, seqlen), got "
                         f"{tuple(outs.shape)} and {tuple(lses.shape)}")
    if lses.transpose(-1, -2).shape != outs.shape[:-1]:
        raise ValueError(f"lses {tuple(lses.shape)} do not match outs {tuple(outs.shape)} (expected "
                         f"{tuple(outs.shape[:-3]) + (outs.shape[-2], outs.shape[-3])})")
    # Rows where every part is empty (lse -inf everywhere) are computed on zeros and masked
    # afterwards, so neither the values nor the gradients see -inf - (-inf).
    acc = torch.promote_types(outs.dtype, torch.float32)  # fp32 at least; float64 stays float64
    empty = torch.isneginf(lses).all(dim=0)
    lses = torch.where(empty, 0.0, lses.to(acc))
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse)
    out = (weights.transpose(-1, -2).unsqueeze(-1) * outs.to(acc)).sum(dim=0)
    out = torch.where(empty.transpose(-1, -2).unsqueeze(-1), 0.0, out)
    return out.to(outs.dtype), torch.where(empty, -torch.inf, lse)


def paged_varlen(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor],
                 seqused_k: Optional[Tensor], max_seqlen_q, max_seqlen_k, dropout_p: float,
                 softmax_scale: Optional[float], causal: bool, window_size, softcap: float,
                 alibi_slopes: Optional[Tensor], return_attn_probs: bool, block_table: Tensor, out: Optional[Tensor],
                 return_softmax_lse: bool, num_splits: int, q_descale: Optional[Tensor],
                 k_descale: Optional[Tensor], v_descale: Optional[Tensor], s_aux: Optional[Tensor] = None,
                 learnable_sink: Optional[Tensor] = None):
    """flash_attn_varlen_func over paged caches (block_table given): the kvcache op with
    packed queries and no append.  See flash_attn_varlen_func.  As FA3 (and vLLM, which
    passes them on every call): q_descale is checked and unused (q is never fp8), and
    k_descale / v_descale scale 8-bit caches and are checked and unused for 16-bit ones."""
    q = _checks.contiguous_last(q)
    for name, x in (("q", q), ("k", k_cache), ("v", v_cache), ("block_table", block_table),
                    ("cu_seqlens_q", cu_seqlens_q)):
        _checks._tensor(x, name)
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D (total_q, nheads, headdim), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"with block_table, k and v are paged caches (num_blocks, page_size, nheads_k, headdim); "
                         f"got k of shape {tuple(k_cache.shape)}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must have shape (batch, max_num_blocks), got {tuple(block_table.shape)}")
    batch = block_table.shape[0]
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_q must have shape ({batch + 1},) (batch + 1, batch = block_table.shape[0]), "
                         f"got {tuple(cu_seqlens_q.shape)}")
    if max_seqlen_q is None:
        raise ValueError("max_seqlen_q is required (the most query rows of any sequence)")
    max_seqlen_q = _seqlen_arg(max_seqlen_q, "max_seqlen_q")
    if max_seqlen_k is not None:
        _seqlen_arg(max_seqlen_k, "max_seqlen_k")  # checked; the kernels bound keys by seqused_k and the table
    if dropout_p != 0:
        raise ValueError(f"dropout_p must be 0 with block_table (paged KV is forward-only inference), got {dropout_p}")
    if seqused_k is None:
        if cu_seqlens_k is None:
            raise ValueError("with block_table, give seqused_k (batch,) int32 (the keys each sequence has in its "
                             "pages) or cu_seqlens_k (batch + 1,)")
        _checks._index_tensor(cu_seqlens_k, "cu_seqlens_k", batch + 1, q, "batch + 1")
        seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    else:
        _checks._index_tensor(seqused_k, "seqused_k", batch, q, "batch")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be torch.int32, got {block_table.dtype}")
    if k_cache.shape[1] % 16 != 0:
        raise ValueError(f"page size (k.shape[1]) must be a multiple of 16, got {k_cache.shape[1]}")
    # On the host only, and not while torch.compile traces (the lengths are data then).  Past
    # this check the CPU backend still rejects such lengths (validate.cpp, naming them
    # cache_seqlens) and the GPU kernels clamp them to the table (kv_cache.h, fwd_paged_sm90).
    if (seqused_k.device.type == "cpu" and seqused_k.numel() and type(seqused_k) is Tensor
            and not torch.compiler.is_compiling()):
        shortest = int(seqused_k.min())
        if shortest < 0:
            b = int(seqused_k.argmin())
            raise ValueError(f"seqused_k[{b}] = {shortest} must be >= 0 (the keys sequence {b} has in its pages)")
        capacity = block_table.shape[1] * k_cache.shape[1]
        longest = int(seqused_k.max())
        if longest > capacity:
            b = int(seqused_k.argmax())
            raise ValueError(f"seqused_k[{b}] = {longest} keys do not fit block_table's {block_table.shape[1]} "
                             f"pages of {k_cache.shape[1]} positions ({capacity})")
    if return_attn_probs and return_softmax_lse:
        raise ValueError("return_softmax_lse and return_attn_probs cannot both be set: return_softmax_lse "
                         "returns (out, softmax_lse), return_attn_probs (out, softmax_lse, S_dmask)")
    from .flash_attn_interface import _varlen_descales
    _varlen_descales(q, k_cache, cu_seqlens_q, q_descale, k_descale, v_descale)
    if k_cache.dtype in _QUANT:
        k_scale, v_scale = _descales(q, k_cache, None, None, None, k_descale, v_descale, batch)
    else:
        k_scale = v_scale = None
    s_aux = _checks.sink(s_aux, learnable_sink, q)
    if out is not None:
        _checks.out_tensor(out, q.shape, q, (("q", q), ("k", k_cache), ("v", v_cache)))
    left, right = _checks.window(window_size, causal)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 picks automatically, 1 never splits the keys), got "
                         f"{num_splits!r}")
    eager = not torch.compiler.is_compiling() and all(
        x is None or type(x) is Tensor for x in (q, k_cache, v_cache, seqused_k, block_table, cu_seqlens_q, out))
    args = (q, k_cache, v_cache, None, None, None, None, seqused_k, None, None, block_table, k_scale, v_scale,
            float(softmax_scale), left, right, float(softcap), True, alibi_slopes, num_splits, cu_seqlens_q,
            max_seqlen_q)
    out, lse = _run(args, eager, out, "flash_attn_varlen_func", s_aux)
    if return_softmax_lse:
        return out, lse
    if return_attn_probs:
        return out, lse, torch.empty(0, dtype=q.dtype, device=q.device)
    return out
