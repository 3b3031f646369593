"""The fp8 (e4m3) forward against the 16-bit forwards it would replace, on one sm_90 GPU:
fmha's fp8 forward (flash_attn_func on float8_e4m3fn q, k, v with per-tensor descales,
bfloat16 out), fmha's bf16 forward and torch SDPA's cuDNN bf16 forward (and
FlashAttention-3's fp8 forward where its `flash_attn_interface` is installed), at the
training suite's 16,384 tokens per batch and model width 2048, D = 128 and 256.  The figure
of merit is fp8 TFLOP/s and fmha's bf16 time over its fp8 time (`fp8 vs bf16`; above 1 the
fp8 forward is faster).  Every fp8 output is checked against an fp32 reference of the
dequantized inputs before any time is kept."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import fmha

from . import report, timing
from .peers import Case

FP8 = torch.float8_e4m3fn

# Max |out - ref| / max|v| of the check: the tests' limit (tests/test_fp8.py, FP8_TOL) with
# room, as the check only has to catch a wrong kernel.
CHECK_TOL = 0.05


def available(device: torch.device) -> Optional[str]:
    """None where the suite runs, else why not."""
    if device.type != "cuda" or torch.version.hip:
        return "the fp8 forward runs on CUDA GPUs with sm_90 (Hopper) only"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return f"the fp8 forward runs on sm_90 (Hopper) only, not on {torch.cuda.get_device_name(device)}"
    return None


def cases(quick: bool) -> list[Case]:
    dims, seqlens = ((128,), (1024, 4096)) if quick else ((128, 256), (1024, 2048, 4096, 8192, 16384))
    return [Case(16384 // s, s, 2048 // d, d, causal, torch.bfloat16)
            for d in dims for causal in (False, True) for s in seqlens]


@dataclass
class Inputs:
    q: torch.Tensor  # bf16 (B, S, H, D)
    k: torch.Tensor
    v: torch.Tensor
    q8: torch.Tensor  # e4m3, per-tensor scaled
    k8: torch.Tensor
    v8: torch.Tensor
    descales: tuple  # float32 () each


def _quantize(x: torch.Tensor):
    scale = (x.abs().amax().float() / 448.0).clamp(min=1e-12)
    return (x / scale).to(FP8), scale


def make_inputs(case: Case, device) -> Inputs:
    shape = (case.batch, case.seqlen, case.heads, case.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3))
    (q8, qs), (k8, ks), (v8, vs) = (_quantize(x) for x in (q, k, v))
    return Inputs(q, k, v, q8, k8, v8, (qs, ks, vs))


@dataclass
class Fp8Peer:
    name: str
    run: Callable[[Case, Inputs], torch.Tensor]


def _fmha_fp8(case: Case, x: Inputs) -> torch.Tensor:
    qs, ks, vs = x.descales
    return fmha.flash_attn_func(x.q8, x.k8, x.v8, causal=case.causal, q_descale=qs, k_descale=ks, v_descale=vs)


def _fmha_bf16(case: Case, x: Inputs) -> torch.Tensor:
    return fmha.flash_attn_func(x.q, x.k, x.v, causal=case.causal)


def _cudnn_bf16(case: Case, x: Inputs) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        # (B, H, S, D) views of the same memory: no copy is timed.
        return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (x.q, x.k, x.v)), is_causal=case.causal)


def peers() -> list[Fp8Peer]:
    out = [Fp8Peer("fmha-fp8", _fmha_fp8), Fp8Peer("fmha", _fmha_bf16)]
    if hasattr(torch.nn.attention.SDPBackend, "CUDNN_ATTENTION"):
        out.append(Fp8Peer("torch-cudnn", _cudnn_bf16))
    if importlib.util.find_spec("flash_attn_interface") is not None:  # FlashAttention-3 (hopper/ build)
        try:
            from flash_attn_interface import flash_attn_func as fa3
        except ImportError:
            fa3 = None
        if fa3 is not None:
            def run(case, x):
                qs, ks, vs = (s.reshape(1, 1).expand(case.batch, case.heads) for s in x.descales)
                out = fa3(x.q8, x.k8, x.v8, causal=case.causal, q_descale=qs, k_descale=ks, v_descale=vs)
                return out[0] if isinstance(out, tuple) else out
            out.append(Fp8Peer("fa3-fp8", run))
    return out


def check_fmha(case: Case, device) -> float:
    """max |out - ref| / max|v| of fmha's fp8 output on the first batch element and two
    heads, against fp32 SDPA on the dequantized inputs."""
    x = make_inputs(case, device)
    out = _fmha_fp8(case, x)
    sl = (slice(0, 1), slice(None), slice(0, 2))
    deq = [t[sl].float() * s for t, s in zip((x.q8, x.k8, x.v8), x.descales)]
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in deq), is_causal=case.causal).transpose(1, 2)
    return ((out[sl].float() - ref).abs().max() / deq[2].abs().max()).item()


def run(device: torch.device, quick: bool, budget_s: float) -> list[dict]:
    """One row per case (the result format of the training suite: ms and tflops per peer,
    skipped with a reason), plus fp8_vs_bf16.  Raises RuntimeError when a check fails."""
    rows = []
    fpeers = peers()
    for case in cases(quick):
        err = check_fmha(case, device)
        if not err < CHECK_TOL:
            raise RuntimeError(f"fmha's fp8 output is wrong for {case.label()}: max error {err:.2e} of max|v| "
                               f"> {CHECK_TOL}")
        row = {"suite": "fp8", "mode": "fwd", "case": case.label(), "batch": case.batch, "seqlen": case.seqlen,
               "heads": case.heads, "head_dim": case.head_dim, "causal": case.causal, "fmha_rel_err": err,
               "ms": {}, "tflops": {}, "skipped": {}}
        sets = [make_inputs(case, device) for _ in range(3)]
        for peer in fpeers:
            try:
                ms = timing.median_ms([lambda s=s: peer.run(case, s) for s in sets], device, budget_s=budget_s)
            except (RuntimeError, ValueError, torch.cuda.OutOfMemoryError) as e:  # a peer refusing a shape
                row["skipped"][peer.name] = str(e).splitlines()[0][:80]
                torch.cuda.empty_cache()
                continue
            row["ms"][peer.name] = ms
            row["tflops"][peer.name] = case.flops_fwd() / (ms * 1e-3) / 1e12
        if "fmha-fp8" in row["ms"] and "fmha" in row["ms"]:
            row["fp8_vs_bf16"] = row["ms"]["fmha"] / row["ms"]["fmha-fp8"]
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    return rows


def _rows(payload):
    rows_in = [r for r in payload["results"] if r["suite"] == "fp8"]
    if not rows_in:
        return [], []
    names = report.peer_names(rows_in, "ms")
    others = [n for n in names if n != "fmha-fp8"]
    header = ["shape"] + [f"{n} TFLOP/s" for n in names] + [f"fp8 vs {n}" for n in others]
    rows = []
    for r in rows_in:
        cells = [r["case"]] + [f"{r['tflops'][n]:.3g}" if n in r["tflops"] else "-" for n in names]
        for n in others:
            ok = "fmha-fp8" in r["ms"] and n in r["ms"]
            cells.append(f"{r['ms'][n] / r['ms']['fmha-fp8']:.2f}x" if ok else "-")
        rows.append(cells)
    return header, rows


def markdown(payload) -> str:
    header, rows = _rows(payload)
    if not rows:
        return ""
    lines = ["", "## fp8 forward (e4m3 q, k, v, per-tensor descales, bf16 out) against bf16 forwards", "",
             "`fp8 vs X` is X's time over fmha's fp8 time (above 1 means the fp8 forward is faster); `fp8 vs "
             "fmha` is the gain over fmha's own bf16 forward.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def terminal(payload) -> str:
    header, rows = _rows(payload)
    if not rows:
        return ""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    notes = sorted({f"{n}: {why}" for r in payload["results"] if r["suite"] == "fp8" for n, why in r["skipped"].items()})
    return "\n".join(["", fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows] + notes)
