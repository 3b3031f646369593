"""fmha as a Hugging Face transformers attention implementation.

    import fmha.integrations.transformers
    fmha.integrations.transformers.register()      # once per process
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fmha")
    model.set_attn_implementation("fmha")          # or switch a model you already have

`register()` adds "fmha" to transformers' AttentionInterface (the attention function below)
and to its AttentionMaskInterface (the 2-D padding mask that flash-attention backends take,
transformers' own `flash_attention_mask`), so models written against those interfaces run their attention on fmha
(tests/test_transformers.py checks Llama, Mistral and Gemma-2 on the CPU in CI, and ran on
an H200). What transformers hands over is mapped onto fmha:

- padding masks -> the varlen kernels (tokens packed, results scattered back);
- packed sequences: `position_ids` that restart (batch of 1, no mask), or precomputed
  `cu_seq_lens_q/k` with `max_length_q/k` -> the varlen kernels;
- GQA/MQA natively; `sliding_window` (a total window of n tokens -> window_size
  (n - 1, n - 1), as flash-attention backends read it); `softcap`; `scaling`; `dropout`
  (training only, as transformers passes it); causal or not as the module says, with the
  bottom-right alignment that cached generation needs;
- fp32 activations next to half-precision weights (PEFT's fp32 layer norms, autocast) are
  cast to the weights' (or autocast's) dtype, as flash-attention backends do; a model that
  is fp32 throughout runs fmha's fp32 path;
- a V head dim different from the QK one (MLA) by zero-padding the smaller side;
- attention sinks (`s_aux`, gpt-oss) through fmha's `s_aux`.

transformers' paged continuous batching is not supported yet: such calls raise a
ValueError that says so.
"""

from __future__ import annotations

import weakref

import torch

from ..bert_padding import pad_input, unpad_input
from ..flash_attn_interface import flash_attn_func, flash_attn_varlen_func

NAME = "fmha"

__all__ = ["NAME", "attention_forward", "register"]


def register(name: str = NAME) -> None:
    """Adds fmha to transformers' attention and mask registries under `name` ("fmha"), so
    that `attn_implementation=name` selects it. Needs transformers >= 4.53 (the release
    with `masking_utils`)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fmha.integrations.transformers needs transformers >= 4.53 "
                          "(pip install 'fmha[transformers]')") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


def _target_dtype(query: torch.Tensor, module: torch.nn.Module):
    """The half dtype to compute in when fp32 activations meet a half-precision model
    (autocast, or fp32 layer norms in front of fp16/bf16 weights); None to keep the dtype."""
    if query.dtype != torch.float32:
        return None
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            return layer.weight.dtype if layer.weight.dtype in (torch.float16, torch.bfloat16) else None
    return None


# The last answer of _restarts: (a weak reference to the position ids, their version, the
# answer).  Every layer of a forward pass gets the same position-id tensor; reading the answer
# back costs a device synchronization, once per pass with this, not once per layer.
_last_restarts: tuple = (None, -1, False)


def _restarts(position_ids: torch.Tensor | None, batch: int) -> bool:
    """True when one row of position ids holds several sequences (the ids restart)."""
    global _last_restarts
    if position_ids is None or batch != 1 or position_ids.shape[-1] < 2:
        return False
    ref, version, answer = _last_restarts
    if ref is not None and ref() is position_ids and version == position_ids._version:
        return answer
    answer = bool((position_ids[..., 1:] <= position_ids[..., :-1]).any())
    _last_restarts = (weakref.ref(position_ids), position_ids._version, answer)
    return answer


def _cu_seqlens_from_positions(position_ids: torch.Tensor):
    """cu_seqlens (int32) and the longest sequence of packed sequences whose ids restart at
    their first position."""
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == pos.min()).flatten().to(torch.int32)
    total = torch.tensor([pos.numel()], dtype=torch.int32, device=pos.device)
    cu = torch.cat([starts, total])
    if int(cu[0]) != 0:
        raise ValueError("packed position_ids must start a sequence at the first token "
                         f"(got {pos[:4].tolist()}...)")
    return cu, int(cu.diff().max())


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention-function signature: query (B, Hq, Sq, D), key and value
    (B, Hk, Sk, D); returns (output (B, Sq, Hq, Dv), None)."""
    if kwargs.get("block_table") is not None or kwargs.get("k_cache") is not None:
        raise ValueError("fmha does not support transformers' paged continuous batching yet")
    batch, _, q_len, qk_dim = query.shape
    v_dim = value.shape[-1]
    if scaling is None:
        scaling = qk_dim ** -0.5
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    opts = dict(dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window,
                softcap=0.0 if softcap is None else softcap)

    # fmha takes (batch, seqlen, heads, dim).
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    target = _target_dtype(q, module)
    if target is not None:
        q, k, v = q.to(target), k.to(target), v.to(target)
    # One head dim for Q, K and V: zero columns change neither the scores nor the output.
    dim = max(qk_dim, v_dim)
    if qk_dim < dim:
        q, k = (torch.nn.functional.pad(x, (0, dim - qk_dim)) for x in (q, k))
    if v_dim < dim:
        v = torch.nn.functional.pad(v, (0, dim - v_dim))

    if s_aux is not None:  # fmha takes float32 sinks or sinks in q's dtype
        opts["s_aux"] = s_aux if s_aux.dtype in (torch.float32, q.dtype) else s_aux.float()

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None:
        out = _padded(q, k, v, attention_mask, q_len, opts)
    elif cu_q is not None and cu_k is not None:
        out = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                     v.reshape(-1, *v.shape[2:]), cu_q.to(torch.int32), cu_k.to(torch.int32),
                                     int(max_q), int(max_k), **opts).view(batch, q_len, *q.shape[2:])
    elif _restarts(position_ids, batch):
        cu, longest = _cu_seqlens_from_positions(position_ids)
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, longest, longest, **opts).unsqueeze(0)
    else:
        out = flash_attn_func(q, k, v, **opts)
    return out[..., :v_dim], None


def _padded(q, k, v, mask, q_len, opts):
    """Attention of a padded batch: mask (B, Sk) marks real key tokens (transformers' 2-D
    mask, sliced to the keys); the queries are the last q_len positions of each row."""
    batch = k.shape[0]
    mask = mask.bool()
    if mask.shape[-1] < k.shape[1]:  # a static cache longer than what was written: slice k and v
        k, v = k[:, :mask.shape[-1]], v[:, :mask.shape[-1]]
    k_packed, indices_k, cu_k, max_k, _ = unpad_input(k, mask)
    v_packed = v.reshape(-1, *v.shape[2:])[indices_k]
    q_mask = mask[:, -q_len:]
    q_packed, indices_q, cu_q, max_q, _ = unpad_input(q, q_mask)
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k, **opts)
    return pad_input(out, indices_q, batch, q_len)
