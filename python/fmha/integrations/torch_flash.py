"""fmha as the implementation behind torch's flash-attention ops: SDPA's flash backend
(`aten::_scaled_dot_product_flash_attention` and its backward) and
`torch.nn.attention.varlen.varlen_attn` (`aten::_flash_attention_forward` / `_backward`).

    import fmha, torch
    torch.nn.attention.activate_flash_attention_impl("fmha")   # torch with the registry
    fmha.use_as_sdpa_backend()                                  # the same, any torch >= 2.4
    ...
    torch.nn.attention.restore_flash_attention_impl()           # torch's kernels again
    # (or: handle = fmha.use_as_sdpa_backend(); ...; handle.remove())

Importing fmha registers "fmha" with torch's registry when torch has it
(`torch.nn.attention.register_flash_attention_impl`), without activating it, as torch's
own "FA3"/"FA4" entries do. Activation overrides those aten ops for the CUDA dispatch key
(which ROCm builds of torch also use; not run on ROCm), so every call that torch sends to its
flash kernels runs fmha's instead, autograd included. What fmha cannot serve raises a
RuntimeError naming it: `block_table` (paged KV), `alibi_slopes` (torch's backward op does
not carry them), `return_debug_mask`.

Semantics carried over: SDPA's `is_causal` is top-left aligned (torch's definition; torch
only sends square causal problems to flash anyway), `_flash_attention_forward`'s is
bottom-right (flash-attn's, which varlen_attn documents); windows (-1 = unbounded, causal
sets the right one to 0); GQA (fewer key/value heads); `seqused_k` (forward);
dropout with fmha's (seed, offset) returned as the op's rng state and replayed exactly by
the backward; deterministic backward when `torch.use_deterministic_algorithms(True)`.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["NAME", "use_as_sdpa_backend", "registry_available"]

NAME = "fmha"

_OPS = ("_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace", "_flash_attention_backward",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward")


def registry_available() -> bool:
    """Whether this torch has the flash-attention implementation registry (torch 2.13 has it;
    fmha.use_as_sdpa_backend() works without it)."""
    import torch.nn.attention as attention
    return hasattr(attention, "register_flash_attention_impl") and hasattr(attention, "activate_flash_attention_impl")


@dataclasses.dataclass
class Handle:
    """Keeps fmha's kernels registered; remove() gives the ops back to torch: it drops the
    registration it holds, or, for an activation through torch's registry, restores
    torch's implementation."""
    library: object = None
    via_registry: bool = False

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None
        elif self.via_registry and torch.nn.attention.current_flash_attention_impl() == NAME:
            torch.nn.attention.restore_flash_attention_impl()
            self.via_registry = False


def _register_kernels(dispatch_key: str = "CUDA") -> Handle:
    lib = torch.library.Library("aten", "IMPL", dispatch_key)
    impls = {
        "_flash_attention_forward": _flash_forward,
        "_flash_attention_forward_no_dropout_inplace": _flash_forward_inplace,
        "_flash_attention_backward": _flash_backward,
        "_scaled_dot_product_flash_attention": _sdpa_forward,
        "_scaled_dot_product_flash_attention_backward": _sdpa_backward,
    }
    for name, fn in impls.items():
        if hasattr(torch.ops.aten, name):  # an older torch may lack some of them
            lib.impl(name, fn, dispatch_key)
    return Handle(lib)


def use_as_sdpa_backend() -> Handle:
    """Routes torch's flash-attention ops to fmha. With torch's registry this is
    `torch.nn.attention.activate_flash_attention_impl("fmha")` (restore with
    `restore_flash_attention_impl()`); without it the kernels are registered directly and
    the returned handle's remove() restores torch's."""
    if registry_available():
        torch.nn.attention.activate_flash_attention_impl(NAME)
        return Handle(via_registry=True)
    return _register_kernels()


def _register_with_torch() -> None:
    """Called by `import fmha`. A torch whose registry has changed shape gets a warning, not
    an fmha that fails to import; use_as_sdpa_backend() then still works."""
    try:
        if registry_available() and NAME not in torch.nn.attention.list_flash_attention_impls():
            torch.nn.attention.register_flash_attention_impl(NAME, register_fn=lambda: _register_kernels())
    except Exception as e:  # pragma: no cover - depends on the torch release
        import warnings
        warnings.warn(f"fmha could not register with torch's flash-attention registry: {e}")


# ---------------------------------------------------------------------------------------
# The kernels, in aten's signatures.


def _unsupported(what: str, reason: str):
    return RuntimeError(f"fmha flash_attention {what} unsupported: {reason}")


def _window(is_causal, left, right):
    left = -1 if left is None or left < 0 else int(left)
    right = 0 if is_causal else (-1 if right is None or right < 0 else int(right))
    return left, right


def _rng_out(rng_cpu: torch.Tensor, device) -> torch.Tensor:
    """fmha's dropout (seed, offset) as the op's rng state: two uint64 on the device."""
    return rng_cpu.to(torch.int64).view(torch.uint64).to(device)


def _rng_in(rng_state: torch.Tensor) -> torch.Tensor:
    return rng_state.detach().reshape(-1)[:2].view(torch.int64).to("cpu")


def _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
             scale, window_size_left, window_size_right, seqused_k, alibi_slopes, block_table, top_left):
    from ..ops import _fwd_impl
    if return_debug_mask:
        raise _unsupported("forward", "return_debug_mask must be False")
    if block_table is not None:
        raise _unsupported("forward", "block_table (paged KV) is not supported")
    if alibi_slopes is not None:
        raise _unsupported("forward", "alibi_slopes (torch's backward op does not carry them)")
    if scale is None:
        scale = query.shape[-1] ** -0.5
    left, right = _window(is_causal, window_size_left, window_size_right)
    out, lse, rng, _ = _fwd_impl(query, key, value, cum_seq_q, cum_seq_k, seqused_k, int(max_q), int(max_k),
                                 float(scale), 0.0, left, right, top_left, None, float(dropout_p), False, False,
                                 None)
    return out, lse, _rng_out(rng, query.device)


def _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                   *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
                   block_table=None, num_splits=None):
    # num_splits: fmha's forward never splits a sequence's keys; every count is accepted.  On
    # CUDA its key-block length follows max_k, so results are batch-invariant on the CPU only.
    out, lse, rng = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                             return_debug_mask, scale, window_size_left, window_size_right, seqused_k,
                             alibi_slopes, block_table, False)
    unused = torch.zeros((), dtype=torch.uint64, device=query.device)
    return out, lse, rng, unused, torch.empty(0, dtype=query.dtype, device=query.device)


def _flash_forward_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                           return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                           seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    if dropout_p != 0.0:
        raise _unsupported("forward (in place)", "dropout_p must be 0")
    result, lse, _ = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                              return_debug_mask, scale, window_size_left, window_size_right, seqused_k,
                              alibi_slopes, block_table, False)
    out.copy_(result)
    return lse


def _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
              is_causal, rng_state, scale, window_size_left, window_size_right, top_left):
    from ..ops import _bwd_impl
    if scale is None:
        scale = query.shape[-1] ** -0.5
    left, right = _window(is_causal, window_size_left, window_size_right)
    rng = _rng_in(rng_state) if dropout_p > 0 else torch.zeros(2, dtype=torch.int64)
    return _bwd_impl(grad_out, query, key, value, out, logsumexp, None, cum_seq_q, cum_seq_k, None, int(max_q),
                     int(max_k), float(scale), 0.0, left, right, top_left, None, float(dropout_p), rng,
                     torch.are_deterministic_algorithms_enabled())


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                    is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    dq, dk, dv = _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                           dropout_p, is_causal, rng_state, scale, window_size_left, window_size_right, False)
    return dq, dk, dv


def _sdpa_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    # SDPA's layout is (B, H, S, D); fmha's (B, S, H, D): transposed views, no copies.
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    out, lse, rng = _forward(q, k, v, None, None, q.shape[1], k.shape[1], dropout_p, is_causal, return_debug_mask,
                             scale, None, None, None, None, None, True)
    unused = torch.zeros((), dtype=torch.uint64, device=query.device)
    return (out.transpose(1, 2), lse, None, None, query.shape[2], key.shape[2], rng, unused,
            torch.empty(0, dtype=query.dtype, device=query.device))


def _sdpa_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, philox_seed, philox_offset, *, scale=None):
    go, q, k, v, o = (x.transpose(1, 2) for x in (grad_out, query, key, value, out))
    dq, dk, dv = _backward(go, q, k, v, o, logsumexp, None, None, q.shape[1], k.shape[1], dropout_p, is_causal,
                           philox_seed, scale, None, None, True)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
