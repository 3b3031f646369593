"""The torch.library ops every public function goes through: ``torch.ops.fmha.fwd`` and
``torch.ops.fmha.bwd``, with fake implementations and registered autograd, so that
torch.compile(fullgraph=True) traces forward and backward without a graph break; and
``torch.ops.fmha.fwd_fp8``, the fp8 (e4m3) forward of Hopper GPUs, forward only.

Each fills a libfmha params struct (fmha/fmha.h) from the tensors and calls the backend of
the tensors' device.
"""

import contextlib
import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _C, _checks
from ._backend import _DTYPES, capturing, fmha_device, ptr, stream_handle, view


_NO_GUARD = contextlib.nullcontext()  # reusable: it holds nothing
# CPU tensors' backend; with them the stream (0) and the device guard (none) are known
# without asking the device, whose .type makes a new string each time (a small call's
# host time, the more so after a large kernel has evicted it from the caches).
_CPU = _C.Device.cpu
_CPU_WORKSPACE = functools.partial(torch.empty, dtype=torch.uint8, device="cpu")


def _device_guard(device: torch.device):
    """The tensors' GPU made current for the launch; nothing to do (and no guard object to
    build, a measurable part of a small call's host time) when it already is."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _NO_GUARD


def _empty_as(x: Tensor) -> Tensor:
    """A contiguous tensor of x's shape, dtype and device (empty_like parses its arguments in
    a third of the time torch.empty(x.shape, dtype=..., device=...) takes: a small call's
    host time)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _lse_shape(d: _checks.Dims) -> Tuple[int, ...]:
    return (d.heads_q, d.total_q) if d.varlen else (d.batch, d.heads_q, d.seqlen_q)


def _probs_shape(d: _checks.Dims) -> Tuple[int, ...]:
    return (d.batch, d.heads_q, d.seqlen_q, d.seqlen_k)


def _problem(d: _checks.Dims, dtype, cu_seqlens_q, cu_seqlens_k, seqused_k, scale, softcap,
             window_left, window_right, top_left, alibi_slopes, dropout_p, rng_state) -> "_C.Problem":
    """libfmha's fmha_problem, built in one call (the backward reuses the forward's).  One
    that holds no pointer and no random seed is a value (its fields are read-only from
    Python): the same call's is made once and reused (_PROBLEMS)."""
    plain = cu_seqlens_q is None and seqused_k is None and alibi_slopes is None and dropout_p == 0
    if plain:
        key = (d, dtype, scale, softcap, window_left, window_right, top_left)
        problem = _PROBLEMS.get(key)
        if problem is not None:
            return problem
    alibi, alibi_batch_stride = 0, 0
    if alibi_slopes is not None:
        alibi = alibi_slopes.data_ptr()
        alibi_batch_stride = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    seed = offset = 0
    if dropout_p > 0:
        seed, offset = (x & (2**64 - 1) for x in rng_state.tolist())
    problem = _C.Problem(_KERNEL_DTYPES[dtype], d.batch, d.seqlen_q, d.seqlen_k, d.total_q, d.total_k, d.heads_q,
                         d.heads_k, d.head_dim, ptr(cu_seqlens_q), ptr(cu_seqlens_k), ptr(seqused_k), scale, softcap,
                         window_left, window_right, _TOP_LEFT if top_left else _BOTTOM_RIGHT, alibi,
                         alibi_batch_stride, dropout_p, seed, offset)
    if plain:
        if len(_PROBLEMS) >= 256:  # a bound, for programs that call with ever new shapes
            _PROBLEMS.clear()
        _PROBLEMS[key] = problem
    return problem


_PROBLEMS: dict = {}


_TOP_LEFT, _BOTTOM_RIGHT = _C.MaskAlign.top_left, _C.MaskAlign.bottom_right
_KERNEL_DTYPES = {**_DTYPES, _checks.FP8: _C.DType.float8_e4m3}


def _draw_rng_state() -> Tensor:
    """(seed, offset) from torch's default CPU generator, so torch.manual_seed reproduces
    dropout on every device without touching (or synchronizing) a GPU."""
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64)


def _contiguous_small(x: Optional[Tensor]) -> Optional[Tensor]:
    return None if x is None else x.contiguous()


def _vector_rows(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels that serve this device and dtype move 16-byte rows: the GPU
    tensor-core kernels (fp16/bf16), CUDA and HIP alike.  Their callers here pad head dims and
    copy misaligned tensors; the tests also turn it on for the CPU backend (which takes any
    layout), so that this padding and copying is checked where CI runs."""
    return dtype != torch.float32 and device.type == "cuda"


def _vector_head_dim(device: torch.device, dtype: torch.dtype, head_dim: int) -> int:
    """Head dim the kernels see: the GPU tensor-core kernels move 16-byte rows, so fp16/bf16
    head dims are padded (with zeros, which change no dot product) to a multiple of 8."""
    if _vector_rows(device, dtype):
        return -(-head_dim // 8) * 8
    return head_dim


def _vector_aligned(x: Tensor) -> bool:
    """Whether the GPU kernels can move x's rows as 16-byte vectors: 16-byte aligned data and
    every stride but the last a multiple of 16 bytes."""
    if x.data_ptr() % 16 != 0:
        return False
    vec = 16 // x.element_size()
    if x.is_contiguous() and x.shape[-1] % vec == 0:  # then every stride is a multiple of the last dim
        return True
    return all(st % vec == 0 for st in x.stride()[:-1])


def _vector_layout(x: Tensor, head_dim: int) -> Tensor:
    """x with `head_dim` columns (zero-padded) and 16-byte aligned rows, copying only when needed."""
    if x.shape[-1] != head_dim:
        return F.pad(x, (0, head_dim - x.shape[-1]))
    if not _vector_aligned(x):
        return x.clone(memory_format=torch.contiguous_format)
    return x


def _fwd_impl(
    q: Tensor, k: Tensor, v: Tensor,
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
    max_seqlen_q: int, max_seqlen_k: int,
    scale: float, softcap: float, window_left: int, window_right: int, top_left: bool,
    alibi_slopes: Optional[Tensor], dropout_p: float, deterministic: bool, return_probs: bool,
    rng_state: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention forward: (out, lse, rng_state, probs).  See docs/api.md."""
    d = _checks.attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                 max_seqlen_k, scale, softcap, window_left, window_right,
                                 alibi_slopes, dropout_p)
    out, lse, rng_state, probs, _ = _fwd_checked(
        d, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, softcap, window_left,
        window_right, top_left, alibi_slopes, dropout_p, deterministic, return_probs, rng_state)
    if rng_state is None:
        rng_state = torch.zeros(2, dtype=torch.int64)
    return out, lse, rng_state, q.new_empty(0) if probs is None else probs


def _fwd_checked(d, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, softcap,
                 window_left, window_right, top_left, alibi_slopes, dropout_p, deterministic, return_probs,
                 rng_state, out=None):
    """_fwd_impl after its argument checks, which gave d.  `out` (checked by the caller): the
    kernel writes the result there when it can address it (on a GPU, 16-bit tensors need
    16-byte aligned rows and a head dim that is a multiple of 8); otherwise the result is
    computed into a buffer and copied there.  Returns _fwd_impl's results, except that the
    RNG state is None without dropout and the probabilities None unless asked for (two
    tensors fewer to make: a small call's host time), and the libfmha problem, which a
    backward of the same call may reuse (its pointers are those of cu_seqlens_q,
    cu_seqlens_k, seqused_k and alibi_slopes when these are contiguous)."""
    device, gpu = q.device, not q.is_cpu
    backend = fmha_device(device) if gpu else _CPU
    metadata = cu_seqlens_q is not None or seqused_k is not None
    if metadata or alibi_slopes is not None:
        cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes = map(
            _contiguous_small, (cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes))
    # Whether a CUDA graph is being captured matters only to metadata and dropout (and asking
    # costs a small call's host time).
    in_capture = (metadata or dropout_p > 0) and capturing(device)
    if metadata and not in_capture:
        _checks.metadata_values(d, cu_seqlens_q, cu_seqlens_k, seqused_k)
    if dropout_p > 0:
        if rng_state is None:
            if in_capture:
                raise ValueError("dropout while capturing a CUDA graph needs an explicit rng_state "
                                 "(a fresh draw would be frozen into the graph)")
            rng_state = _draw_rng_state()
        elif rng_state.dtype != torch.int64 or rng_state.numel() != 2:
            raise ValueError(f"rng_state must be an int64 tensor [seed, offset], got {rng_state.dtype} "
                             f"of shape {tuple(rng_state.shape)}")
        rng_state = rng_state.detach().to("cpu").clone()
    else:
        rng_state = None

    head_dim = d.head_dim
    d_kernel = _vector_head_dim(device, q.dtype, head_dim)
    vector = _vector_rows(device, q.dtype)
    if vector:
        q, k, v = (_vector_layout(x, d_kernel) for x in (q, k, v))
    if d_kernel != head_dim:
        d = d._replace(head_dim=d_kernel)
    user_out = out
    if out is None or d_kernel != head_dim or (vector and not _vector_aligned(out)):
        out = _empty_as(q)
    lse = torch.empty(_lse_shape(d), dtype=torch.float32, device=device)
    probs = torch.empty(_probs_shape(d), dtype=q.dtype, device=device) if return_probs else None

    problem = _problem(d, q.dtype, cu_seqlens_q, cu_seqlens_k, seqused_k, scale, softcap, window_left,
                       window_right, top_left, alibi_slopes, dropout_p, rng_state)
    probs_view = (probs.data_ptr(), probs.stride(0), probs.stride(2), probs.stride(1)) if return_probs else None
    with _device_guard(device) if gpu else _NO_GUARD:
        _C.fwd(backend, stream_handle(device) if gpu else 0, problem, view(q, d.varlen), view(k, d.varlen),
               view(v, d.varlen), view(out, d.varlen), lse.data_ptr(), probs_view)
    if d_kernel != head_dim:
        out = out[..., :head_dim]
    if user_out is not None and out is not user_out:
        user_out.copy_(out)
        out = user_out
    return out, lse, rng_state, probs, problem


fwd = torch.library.custom_op("fmha::fwd", mutates_args=())(_fwd_impl)


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale,
              softcap, window_left, window_right, top_left, alibi_slopes, dropout_p, deterministic,
              return_probs, rng_state):
    d = _checks.attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                 max_seqlen_k, scale, softcap, window_left, window_right,
                                 alibi_slopes, dropout_p)
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(d), dtype=torch.float32)
    probs = q.new_empty(_probs_shape(d) if return_probs else (0,))
    return out, lse, torch.empty(2, dtype=torch.int64, device="cpu"), probs


def _bwd_impl(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
    max_seqlen_q: int, max_seqlen_k: int,
    scale: float, softcap: float, window_left: int, window_right: int, top_left: bool,
    alibi_slopes: Optional[Tensor], dropout_p: float, rng_state: Tensor, deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Attention backward: (dq, dk, dv) from dout (and optionally dlse, the LSE's gradient)."""
    d = _checks.attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                 max_seqlen_k, scale, softcap, window_left, window_right,
                                 alibi_slopes, dropout_p)
    return _bwd_checked(d, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                        max_seqlen_k, scale, softcap, window_left, window_right, top_left, alibi_slopes, dropout_p,
                        rng_state, deterministic)


def _bwd_checked(d, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                 max_seqlen_k, scale, softcap, window_left, window_right, top_left, alibi_slopes, dropout_p,
                 rng_state, deterministic, problem=None):
    """_bwd_impl after the checks of the inputs it shares with the forward, which gave d;
    `problem`, when given, is the forward's (_fwd_checked)."""
    shape = q.shape
    if dout.shape != shape or out.shape != shape or dout.dtype != q.dtype or out.dtype != q.dtype:
        for name, t in (("dout", dout), ("out", out)):
            if tuple(t.shape) != tuple(shape) or t.dtype != q.dtype:
                raise ValueError(f"{name} must match q: shape {tuple(shape)} and dtype {q.dtype}, "
                                 f"got {tuple(t.shape)} and {t.dtype}")
    lse_shape = _lse_shape(d)
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is not None and (tuple(t.shape) != lse_shape or t.dtype != torch.float32):
            raise ValueError(f"{name} must be float32 of shape {lse_shape}, got {t.dtype} {tuple(t.shape)}")
    device, gpu = q.device, not q.is_cpu
    backend = fmha_device(device) if gpu else _CPU
    dout, out = _checks.contiguous_last(dout), _checks.contiguous_last(out)
    lse, dlse = lse.contiguous(), _contiguous_small(dlse)

    head_dim = d.head_dim
    d_kernel = _vector_head_dim(device, q.dtype, head_dim)
    if _vector_rows(device, q.dtype):
        q, k, v, out, dout = (_vector_layout(x, d_kernel) for x in (q, k, v, out, dout))
    if d_kernel != head_dim:
        d = d._replace(head_dim=d_kernel)
    dq, dk, dv = _empty_as(q), _empty_as(k), _empty_as(v)
    if problem is None:  # (the small tensors stay referenced here until the kernels are enqueued)
        cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes = map(
            _contiguous_small, (cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes))
        problem = _problem(d, q.dtype, cu_seqlens_q, cu_seqlens_k, seqused_k, scale, softcap, window_left,
                           window_right, top_left, alibi_slopes, dropout_p, rng_state)
    workspace = functools.partial(torch.empty, dtype=torch.uint8, device=device) if gpu else _CPU_WORKSPACE
    vl = d.varlen
    with _device_guard(device) if gpu else _NO_GUARD:
        _C.bwd(backend, stream_handle(device) if gpu else 0, problem, view(q, vl), view(k, vl), view(v, vl),
               view(out, vl), view(dout, vl), view(dq, vl), view(dk, vl), view(dv, vl), lse.data_ptr(), ptr(dlse),
               deterministic, workspace)
    if d_kernel != head_dim:
        dq, dk, dv = (x[..., :head_dim] for x in (dq, dk, dv))
    return dq, dk, dv


bwd = torch.library.custom_op("fmha::bwd", mutates_args=())(_bwd_impl)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
              max_seqlen_k, scale, softcap, window_left, window_right, top_left, alibi_slopes,
              dropout_p, rng_state, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# --- autograd: fwd's backward is bwd, with the forward's options replayed. ---

def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, softcap,
     window_left, window_right, top_left, alibi_slopes, dropout_p, deterministic, return_probs,
     _rng_in) = inputs
    out, lse, rng_state, _probs = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, rng_state)
    ctx.options = (max_seqlen_q, max_seqlen_k, scale, softcap, window_left, window_right, top_left,
                   dropout_p, deterministic)


def _replay_backward(bwd_fn, ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes, rng_state = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, scale, softcap, window_left, window_right, top_left, dropout_p,
     deterministic) = ctx.options
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = bwd_fn(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, scale, softcap, window_left, window_right, top_left, alibi_slopes, dropout_p,
        rng_state, deterministic)
    return (dq, dk, dv) + (None,) * 15


def _backward(ctx, dout, dlse, _drng, _dprobs):
    return _replay_backward(torch.ops.fmha.bwd, ctx, dout, dlse)


torch.library.register_autograd("fmha::fwd", _backward, setup_context=_setup_context)


def _input_dims(inputs) -> _checks.Dims:
    """fmha::fwd's argument checks, on its argument tuple."""
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, softcap,
     window_left, window_right, _top_left, alibi_slopes, dropout_p) = inputs[:15]
    return _checks.attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                    max_seqlen_k, scale, softcap, window_left, window_right,
                                    alibi_slopes, dropout_p)


class _EagerAttention(torch.autograd.Function):
    """fmha::fwd and its backward for eager calls, without the dispatcher: the same
    implementations, context and backward as the registered op.  Called as
    apply(q, k, v, rest) with rest the op's other arguments as one tuple (apply's cost grows
    with its argument count; the index and slope tensors in rest take no gradient).  The
    backward reuses the forward's checked dimensions and libfmha problem."""

    @staticmethod
    def forward(ctx, q, k, v, rest):
        inputs = (q, k, v) + rest
        ctx.dims = _input_dims(inputs)
        # The small index and slope tensors are made contiguous here and saved so: the
        # pointers in the forward's problem then stay valid for the backward.
        if rest[0] is not None or rest[1] is not None or rest[2] is not None or rest[10] is not None:
            inputs = ((q, k, v) + tuple(map(_contiguous_small, rest[:3])) + rest[3:10]
                      + (_contiguous_small(rest[10]),) + rest[11:])
        *output, ctx.problem = _fwd_checked(ctx.dims, *inputs)
        _setup_context(ctx, inputs, output)
        # Gradients that are not given stay None (no zero LSE gradient is made and read),
        # and the RNG state and probabilities have none.
        ctx.set_materialize_grads(False)
        for x in output[2:]:
            if x is not None:
                ctx.mark_non_differentiable(x)
        return tuple(output)

    @staticmethod
    def backward(ctx, dout, dlse, _drng, _dprobs):
        bwd_fn = functools.partial(_bwd_checked, ctx.dims, problem=ctx.problem)
        return _replay_backward(bwd_fn, ctx, dout, dlse)[:3] + (None,)


# --- What the kernels do not take, composed around the op once for every entry point: a V
# head dim that differs from the QK head dim, and attention sinks. ---


def _value_head_dim(q: Tensor, k: Tensor, v: Tensor) -> int:
    """v's head dim when it differs from q's and k's, else 0.  k and v may then differ in the
    last dimension only; the op checks everything else."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)) or v.dim() == 0 or k.dim() == 0:
        return 0  # the op names the bad argument
    if v.shape[-1] == k.shape[-1]:
        return 0
    if v.dim() != k.dim() or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)} except the head dim (last dimension), "
                         f"got {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k has head dimension {k.shape[-1]} but q has {q.shape[-1]}; they must match")
    if not 1 <= v.shape[-1] <= _checks.MAX_HEAD_DIM:
        raise ValueError(f"v's head dimension (last dim of v) must be between 1 and {_checks.MAX_HEAD_DIM}, "
                         f"got {v.shape[-1]}")
    if not 1 <= q.shape[-1] <= _checks.MAX_HEAD_DIM:  # before padding, so that the message names q's own
        raise ValueError(f"head dimension (last dim of q) must be between 1 and {_checks.MAX_HEAD_DIM}, "
                         f"got {q.shape[-1]}")
    return v.shape[-1]


def _sink_weight(lse: Tensor, s_aux: Tensor, varlen: bool) -> Tuple[Tensor, Tensor]:
    """(w, lse') for a sink logit s per query head: lse' = logaddexp(lse, s) is the log of
    the denominator with the sink, and w = sigmoid(lse - s) = exp(lse - lse') the share of
    each row's mass that stays on the keys, shaped to multiply the output.  A row that sees
    no key (lse = -inf) gets w = 0 and lse' = s: the sink takes all the mass."""
    s = s_aux.float()
    s = s[:, None] if varlen else s[None, :, None]  # against lse (Hq, total_q) or (B, Hq, Sq)
    w = torch.sigmoid(lse - s)
    w = w.t() if varlen else w.transpose(1, 2)  # -> (total_q, Hq) or (B, Sq, Hq)
    return w.unsqueeze(-1), torch.logaddexp(lse, s)


def apply_sink(out: Tensor, lse: Tensor, s_aux: Tensor, varlen: bool, in_place: bool = False
               ) -> Tuple[Tensor, Tensor]:
    """(out', lse') of attention with a sink from attention without one: out' = out * w,
    lse' = logaddexp(lse, s) (_sink_weight).  Exact, and differentiable in out, lse and s
    by autograd: the backward of out and lse (the op's, which takes dlse) then gives the
    sink-adjusted dq, dk, dv, and ds = -sum over rows of exp(s - lse') * rowsum(dout' * out').
    The product is taken in fp32 and rounded once; in_place writes out' into out."""
    w, lse_sink = _sink_weight(lse, s_aux, varlen)
    if in_place:
        return out.mul_(w), lse_sink
    return (out.float() * w).to(out.dtype), lse_sink


def attention(*inputs, out: Optional[Tensor] = None, s_aux: Optional[Tensor] = None
              ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """torch.ops.fmha.fwd's arguments and results (on eager calls the RNG state is None
    without dropout, and the probabilities None unless asked for), plus two features
    composed around the op here, once, for every entry point:

    * v may have a head dim other than q's and k's (then k and v differ in the last
      dimension only): the narrower of q/k and v is zero-padded to the wider head dim (the
      caller computed the scale from q's), which changes no score and no output column, and
      the output is sliced back; F.pad's backward slices the gradients.
    * s_aux (Hq,), checked by the caller (_checks.sink): a sink logit per query head that
      joins every row's softmax denominator and adds no value (apply_sink); the returned
      LSE includes it.

    Eager calls on plain tensors skip the dispatcher, whose cost per call (forward and
    backward) was about as much host time as a training step's kernels at S = 512; anything
    traced (torch.compile, export, fake or subclass tensors) goes through the registered op.

    `out` (checked by the caller, _checks.out_tensor) receives the output, and is returned
    in its place.  With nothing to differentiate, eager calls write it in the kernel with no
    output allocated (_fwd_checked says when a copy is needed; a padded V head dim always
    computes into a buffer).  When an input requires grad (or the call is traced) the output
    is computed as usual and copied into `out`, an in-place copy that autograd
    differentiates, so gradients through `out` are exact."""
    q, k, v = inputs[:3]
    head_dim_v = _value_head_dim(q, k, v)
    if head_dim_v:
        width = _vector_head_dim(q.device, q.dtype, max(head_dim_v, q.shape[-1]))
        q, k, v = (F.pad(x, (0, width - x.shape[-1])) if x.shape[-1] != width else x for x in (q, k, v))
        inputs = (q, k, v) + tuple(inputs[3:])
    # The call's other tensors, cu_seqlens_q/k, seqused_k, alibi_slopes and rng_state (the op's
    # other arguments are numbers, which its checks enforce); then out and s_aux.
    others = () if (inputs[3] is None and inputs[4] is None and inputs[5] is None and inputs[13] is None
                     and inputs[17] is None) else tuple(
        x for x in (inputs[3], inputs[4], inputs[5], inputs[13], inputs[17]) if isinstance(x, Tensor))
    eager = (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
             and (len(others) == 0 or all(type(x) is Tensor for x in others))
             and (out is None or type(out) is Tensor) and (s_aux is None or type(s_aux) is Tensor)
             and (q.is_cuda or q.is_cpu) and not torch.compiler.is_compiling()
             and not torch._C._are_functorch_transforms_active())
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                        (len(others) > 0 and any(x.requires_grad for x in others)))
    direct = None  # the caller's out, when the kernel writes it
    if not eager:
        result = torch.ops.fmha.fwd(*inputs)
    elif grad:
        result = _EagerAttention.apply(q, k, v, tuple(inputs[3:]))
    else:  # nothing to differentiate: no autograd node either
        direct = out if not head_dim_v else None
        result = _fwd_checked(_input_dims(inputs), *inputs, direct)[:4]
    o, lse = result[0], result[1]
    if s_aux is not None:
        sink_grad = torch.is_grad_enabled() and s_aux.requires_grad
        o, lse = apply_sink(o, lse, s_aux, inputs[3] is not None, in_place=o is direct and not sink_grad)
    if head_dim_v:
        o = o[..., :head_dim_v]
    if out is not None and o is not out:
        out.copy_(o)
        o = out
    return (o, lse) + tuple(result[2:])


# --- Forward-only results: a node whose backward raises, for calls the kernels have no
# backward for (fp8 inputs, KV caches). ---


class _ForwardOnly(torch.autograd.Function):
    """Ties an output to inputs that require grad, so that a backward through it fails
    loudly with `message` instead of silently dropping attention's share of the gradient."""

    @staticmethod
    def forward(ctx, out, message, *inputs):
        ctx.message = message
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(ctx.message)


class _ForwardOnlyInPlace(torch.autograd.Function):
    """_ForwardOnly for an output written into the caller's tensor (out=): that tensor
    itself gets the node whose backward raises."""

    @staticmethod
    def forward(ctx, out, message, *inputs):
        ctx.message = message
        ctx.mark_dirty(out)
        return out

    backward = staticmethod(_ForwardOnly.backward)


def forward_only(out: Tensor, message: str, inputs, written_in_place: bool) -> Tensor:
    """out, tied to whichever of `inputs` require grad (when grad mode is on) by a node
    whose backward raises RuntimeError(message)."""
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
        inputs = [x for x in inputs if x is not None]
        return (_ForwardOnlyInPlace if written_in_place else _ForwardOnly).apply(out, message, *inputs)
    return out


# --- The fp8 forward: float8_e4m3fn q, k, v with float32 dequantization factors, bfloat16
# out, CUDA sm_90 only, no dropout and no backward. ---

_FP8_BACKWARD = ("fp8 attention is forward-only: it has no gradient for q, k, v (FlashAttention-3's fp8 forward "
                 "has none either); train with bfloat16 or float16 inputs, or call it under torch.no_grad()")


def _fp8_dims(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap, window_left,
              window_right, alibi_slopes, q_descale, k_descale, v_descale) -> _checks.Dims:
    """fmha::fwd_fp8's argument checks (shapes and strides: also while tracing)."""
    d = _checks.attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k, scale,
                                 softcap, window_left, window_right, alibi_slopes, 0.0, fp8=True)
    _checks.fp8_inputs(d, q, k, v, (q_descale, k_descale, v_descale))
    _fp8_on_cuda(q.device)
    return d


def _fp8_on_cuda(device: torch.device) -> None:
    """The part of fp8_device that needs no GPU (so it holds while tracing too)."""
    if device.type != "cuda" or torch.version.hip:
        where = f"{device} (a ROCm GPU)" if device.type == "cuda" else str(device)
        raise ValueError(f"fp8 attention runs on CUDA GPUs with sm_90 (Hopper); q, k and v are on {where}")


def fp8_device(device: torch.device) -> None:
    """Refuses a device the fp8 forward does not run on: it needs sm_90 (Hopper) tensor
    cores (FlashAttention-3's fp8 kernels have the same limit)."""
    _fp8_on_cuda(device)
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise ValueError(f"fp8 attention runs on CUDA GPUs with sm_90 (Hopper); q is on {device}, "
                         f"{torch.cuda.get_device_name(device)}, of compute capability {major}.{minor}")


def _descale_view(x: Optional[Tensor]) -> Optional[Tuple[int, int, int]]:
    """libfmha's fmha_descale of a checked descale tensor: (data, batch_stride, head_stride);
    one value (any shape of one element) has strides 0 and 0, and a (batch, nheads_k) tensor
    is addressed through its own strides (expanded ones included), with no copy."""
    if x is None:
        return None
    if x.numel() == 1:
        return x.data_ptr(), 0, 0
    return x.data_ptr(), x.stride(0), x.stride(1)


def _fwd_fp8_checked(d, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap,
                     window_left, window_right, top_left, alibi_slopes, q_descale, k_descale, v_descale, out=None):
    """fmha::fwd_fp8 after its argument checks, which gave d.  A head dim that is not a
    multiple of 16 is zero-padded to one (the kernels move 16-byte rows; zeros change no
    dot product) and the output sliced back.  `out` (checked by the caller, bfloat16): the
    kernel writes the result there when it can address it (16-byte aligned rows, no
    padding), and otherwise into a buffer that is then copied there."""
    device = q.device
    fp8_device(device)
    backend = fmha_device(device)
    cu_seqlens_q, cu_seqlens_k, alibi_slopes = map(_contiguous_small, (cu_seqlens_q, cu_seqlens_k, alibi_slopes))
    if cu_seqlens_q is not None and not capturing(device):
        _checks.metadata_values(d, cu_seqlens_q, cu_seqlens_k, None)
    head_dim = d.head_dim
    if head_dim % 16:  # (padded as bytes: e4m3's zero is the byte 0)
        width = -(-head_dim // 16) * 16
        q, k, v = (F.pad(x.view(torch.uint8), (0, width - head_dim)).view(x.dtype) for x in (q, k, v))
        d = d._replace(head_dim=width)
    user_out = out
    if out is None or d.head_dim != head_dim or not _vector_aligned(out):
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
    lse = torch.empty(_lse_shape(d), dtype=torch.float32, device=device)
    problem = _problem(d, q.dtype, cu_seqlens_q, cu_seqlens_k, None, scale, softcap, window_left, window_right,
                       top_left, alibi_slopes, 0.0, None)
    with _device_guard(device):
        _C.fwd(backend, stream_handle(device), problem, view(q, d.varlen), view(k, d.varlen), view(v, d.varlen),
               view(out, d.varlen), lse.data_ptr(), None,
               q_descale=_descale_view(q_descale), k_descale=_descale_view(k_descale),
               v_descale=_descale_view(v_descale),
               alloc=functools.partial(torch.empty, dtype=torch.uint8, device=device))
    if d.head_dim != head_dim:
        out = out[..., :head_dim]
    if user_out is not None and out is not user_out:
        user_out.copy_(out)
        out = user_out
    return out, lse


def _fwd_fp8_impl(
    q: Tensor, k: Tensor, v: Tensor,
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
    scale: float, softcap: float, window_left: int, window_right: int, top_left: bool,
    alibi_slopes: Optional[Tensor],
    q_descale: Optional[Tensor], k_descale: Optional[Tensor], v_descale: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """The fp8 forward: (out, lse), out bfloat16 like q's shape.  Scores are
    scale * q_descale * k_descale * q.k and the output is multiplied by v_descale; each
    descale is None (1), one float32 value, or (batch, nheads_k).  See docs/api.md."""
    d = _fp8_dims(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap, window_left,
                  window_right, alibi_slopes, q_descale, k_descale, v_descale)
    return _fwd_fp8_checked(d, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap,
                            window_left, window_right, top_left, alibi_slopes, q_descale, k_descale, v_descale)


fwd_fp8 = torch.library.custom_op("fmha::fwd_fp8", mutates_args=())(_fwd_fp8_impl)


@fwd_fp8.register_fake
def _fwd_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap, window_left,
                  window_right, top_left, alibi_slopes, q_descale, k_descale, v_descale):
    d = _fp8_dims(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap, window_left,
                  window_right, alibi_slopes, q_descale, k_descale, v_descale)
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty(_lse_shape(d), dtype=torch.float32)


def attention_fp8(*inputs, out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """torch.ops.fmha.fwd_fp8's arguments and results (out, lse).  As in attention(), eager
    calls on plain tensors skip the dispatcher and write `out` (checked by the caller,
    bfloat16) in the kernel; traced calls go through the op and copy into `out`.  Forward
    only: when an input requires grad, a backward through the output raises."""
    q, k, v = inputs[:3]
    tensors = [x for x in inputs if isinstance(x, Tensor)] + ([out] if out is not None else [])
    eager = (not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()
             and all(type(x) is Tensor for x in tensors))
    if eager:
        o, lse = _fwd_fp8_checked(_fp8_dims(*inputs[:11], *inputs[12:]), *inputs, out=out)
    else:
        o, lse = torch.ops.fmha.fwd_fp8(*inputs)
        if out is not None:
            out.copy_(o)
            o = out
    return forward_only(o, _FP8_BACKWARD, (q, k, v), written_in_place=o is out), lse
