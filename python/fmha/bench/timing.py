"""Timing and the machine's ceilings (../.library/device/METHOD.md): device events after
warm-up, the median of many runs, inputs rotated so repeated runs do not measure the cache."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fns: Sequence[Callable[[], object]], device: torch.device, warmup: int = 3,
              min_runs: int = 10, budget_s: float = 1.0) -> float:
    """Median time of one call in milliseconds (of run_ms's runs)."""
    return statistics.median(run_ms(fns, device, warmup, min_runs, budget_s))


def run_ms(fns: Sequence[Callable[[], object]], device: torch.device, warmup: int = 3,
           min_runs: int = 10, budget_s: float = 1.0) -> list:
    """Times of timed calls in milliseconds, after warm-up, for about ``budget_s`` seconds.
    ``fns`` are equivalent calls on different input sets, cycled through so that no run
    reuses the previous run's data.  On a GPU each call sits between two events and calls
    are queued back to back (as triton's do_bench does), so the host's launch work overlaps
    the previous call and the events measure the device's time."""
    for i in range(warmup):
        fns[i % len(fns)]()
    _sync(device)
    start = time.perf_counter()
    fns[0]()
    _sync(device)
    one = max(time.perf_counter() - start, 1e-6)
    runs = int(min(1000, max(min_runs, budget_s / one)))
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
        for i, (begin, end) in enumerate(events):
            begin.record()
            fns[i % len(fns)]()
            end.record()
        torch.cuda.synchronize(device)
        return [b.elapsed_time(e) for b, e in events]
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def median_ms_graph(fns: Sequence[Callable[[], object]], device: torch.device, budget_s: float = 1.0,
                    calls_per_graph: int = 16) -> float:
    """As median_ms, but the calls are captured back to back in one CUDA graph (at least
    ``calls_per_graph`` of them, cycling through ``fns``) and the time of a replay is divided
    by the calls it holds: the device time of one call without the host's launch cost,
    which for a decode step (a few microseconds of GPU work) would otherwise be what is
    timed.  Serving engines capture whole decode steps, every layer's attention call in one
    graph, for the same reason.  One call per graph is not enough: a replay then costs
    about 10 us whatever it holds (an H200 timed a 0.1 MB copy at 10.7 us that way;
    benchmarks/results/2026-11-30-h200-decode-graph16).  Falls back to median_ms where a
    call cannot be captured."""
    if device.type != "cuda":
        return median_ms(fns, device, budget_s=budget_s)
    calls = len(fns) * max(1, -(-calls_per_graph // len(fns)))
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for fn in fns:  # warm-up outside capture: lazy initialization, autotuning
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fns[i % len(fns)]()
    except Exception:  # noqa: BLE001 - any capture failure: time the eager calls instead
        torch.cuda.synchronize(device)
        return median_ms(fns, device, budget_s=budget_s)
    return median_ms([graph.replay], device, budget_s=budget_s) / calls


def matmul_tflops(device: torch.device, quick: bool) -> float:
    """bf16 (CPU: fp32) matrix product rate on random data: the arithmetic ceiling."""
    n = (4096 if quick else 8192) if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = median_ms([lambda: a @ b], device, budget_s=0.5)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_gbps(device: torch.device, quick: bool) -> float:
    """Device-to-device copy rate counting bytes read plus written: the bandwidth ceiling."""
    numel = ((1 << 28) if not quick else (1 << 26)) if device.type == "cuda" else (1 << 24)
    src = torch.empty(numel, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = median_ms([lambda: dst.copy_(src)], device, budget_s=0.5)
    return 2 * numel / (ms * 1e-3) / 1e9
