"""Which libfmha backend serves a torch device, and how to reach its stream."""

from __future__ import annotations

import functools

import torch

from . import _C

_DTYPES = {
    torch.float16: _C.DType.float16,
    torch.bfloat16: _C.DType.bfloat16,
    torch.float32: _C.DType.float32,
}


def available_backends() -> frozenset:
    """Devices this build of fmha can compute on: ``"cpu"``, plus ``"cuda"`` or ``"hip"``
    when their kernels were compiled into libfmha."""
    names = {"cpu": _C.Device.cpu, "cuda": _C.Device.cuda, "hip": _C.Device.hip}
    return frozenset(n for n, d in names.items() if _C.capabilities(d)["available"])


@functools.lru_cache(maxsize=None)
def _available(kind: "_C.Device") -> bool:
    return bool(_C.capabilities(kind)["available"])


def fmha_device(device: torch.device) -> "_C.Device":
    """The libfmha backend for a torch device; raises if this build lacks it."""
    if device.type == "cpu":
        return _C.Device.cpu
    if device.type == "cuda":
        kind = _C.Device.hip if torch.version.hip else _C.Device.cuda
        if not _available(kind):
            name = "HIP" if torch.version.hip else "CUDA"
            raise ValueError(
                f"tensors are on {device}, but this fmha build has no {name} kernels "
                f"(available: {sorted(available_backends())}); rebuild fmha where the "
                f"{'ROCm' if torch.version.hip else 'CUDA'} compiler is installed"
            )
        return kind
    raise ValueError(f"fmha does not run on {device.type} tensors (supported: cpu, cuda)")


# torch's raw-stream query (what its own generated kernels launch on): an int without
# building a Stream object, which costs a small call several microseconds.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """The current torch stream of a GPU device as an int (0 for the CPU)."""
    if device.type == "cuda":
        if _raw_stream is not None and device.index is not None:
            return _raw_stream(device.index)
        return torch.cuda.current_stream(device).cuda_stream
    return 0


def capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def view(t: torch.Tensor, varlen: bool) -> tuple:
    """libfmha's fmha_tensor of a (B, S, H, D) or, in varlen mode, (total, H, D) tensor, as the
    (data, batch_stride, row_stride, head_stride) tuple fmha._C takes."""
    st = t.stride()
    if varlen:
        return t.data_ptr(), 0, st[0], st[1]
    return t.data_ptr(), st[0], st[1], st[2]


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()
