"""fmha: fast, memory-efficient, exact attention for NVIDIA and AMD GPUs (and a CPU
reference backend), with flash-attn 2.x's API and torch's SDPA signature.

    from fmha import flash_attn_func          # instead of: from flash_attn import ...
    out = flash_attn_func(q, k, v, causal=True)
"""

from . import _C
from ._backend import available_backends
from . import ops  # noqa: F401  (registers torch.ops.fmha.fwd / bwd)
from . import bert_padding
from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .kvcache import flash_attn_with_kvcache, merge_attentions, quantize_kv_cache
from .sdpa import scaled_dot_product_attention
from .integrations import torch_flash as _torch_flash
from .integrations.torch_flash import use_as_sdpa_backend

__version__ = _C.version()

# "fmha" in torch's flash-attention registry (torch.nn.attention), not activated: the user
# opts in with activate_flash_attention_impl("fmha") or use_as_sdpa_backend().
_torch_flash._register_with_torch()

# For C++ consumers of the wheel: cmake -DCMAKE_PREFIX_PATH=<this> finds fmha::fmha.
import os as _os

cmake_prefix_path = _os.path.join(_os.path.dirname(_C.__file__), "lib", "cmake")

__all__ = [
    "available_backends",
    "bert_padding",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "merge_attentions",
    "quantize_kv_cache",
    "scaled_dot_product_attention",
    "use_as_sdpa_backend",
]
