"""python -m fmha.bench: fmha against torch's attention backends (and FlexAttention,
flash-attn when importable), side by side on one device, with ratios.

Every result is a median of CUDA-event timings after warm-up on fresh random inputs (on
the CPU, of wall-clock timings taken in rounds that alternate between the libraries), and
fmha's output is checked against an fp32 reference before any number is printed.  The
machine's matmul rate and copy bandwidth are measured in the same run.  Results go to the
terminal, and to JSON and Markdown files under --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

import torch

import fmha

from . import context_parallel, decode, fp8, memory, model, paged_prefill, report, timing
from .peers import Case, peers

_OOM = getattr(torch, "OutOfMemoryError", RuntimeError)  # torch.OutOfMemoryError since 2.5


def _progress(items, desc):
    """A progress bar where stderr is a terminal; none where it is redirected, so that a
    run's log (a results folder's terminal.txt) holds only the tables."""
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, leave=False, file=sys.stderr, disable=None)  # None: off unless a tty
    except ImportError:
        return items


def training_cases(device: torch.device, quick: bool, dtype: torch.dtype) -> list[Case]:
    """ANCHORS.md's shapes on a GPU: 16,384 tokens per batch, model width 2048."""
    if device.type == "cuda":
        dims, seqlens = ((128,), (1024, 4096)) if quick else ((64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384))
        tokens, width = 16384, 2048
    else:
        dims, seqlens = ((64,), (128, 512)) if quick else ((64, 128), (128, 256, 512, 1024))
        tokens, width = 1024, 256
    return [Case(tokens // s, s, width // d, d, causal, dtype)
            for d in dims for causal in (False, True) for s in seqlens]


def _inputs(case: Case, layout: str, device, sets: int, grad: bool):
    shape = ((case.batch, case.seqlen, case.heads, case.head_dim) if layout == "bshd"
             else (case.batch, case.heads, case.seqlen, case.head_dim))
    return [tuple(torch.randn(shape, device=device, dtype=case.dtype).requires_grad_(grad) for _ in range(4))
            for _ in range(sets)]


def check_fmha(case: Case, device) -> float:
    """Relative error of fmha's output against an fp32 reference on the first batch
    element and two heads (enough to catch a wrong kernel, cheap at any size)."""
    q, k, v, _ = _inputs(case, "bshd", device, 1, False)[0]
    out = fmha.flash_attn_func(q, k, v, causal=case.causal)
    sl = (slice(0, 1), slice(None), slice(0, 2))
    qr, kr, vr = (x[sl].float().transpose(1, 2) for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=case.causal).transpose(1, 2)
    return ((out[sl].float() - ref).norm() / ref.norm()).item()


# On the CPU the peers of a shape are timed in rounds that alternate between them, and each
# one's result is the median over its rounds' runs: this project's 2-core VM changes speed
# by 1.5-4x from one window of seconds to the next (benchmarks/results/2026-12-05-cpu),
# so timing one library for a whole budget and then the next compared different windows.
# A GPU's clocks hold still: one round.
CPU_ROUNDS = 5


def peer_calls(peer, case: Case, device, mode: str) -> list:
    """The peer's calls of a timed run, one per input set."""
    sets = _inputs(case, peer.layout, device, 3, mode == "fwd_bwd")

    def call(q, k, v, do):
        out = peer.forward(q, k, v, case.causal)
        if mode == "fwd_bwd":
            torch.autograd.grad(out, (q, k, v), do)

    return [lambda s=s: call(*s) for s in sets]


def time_peers(peers_, case: Case, device, mode: str, budget_s: float) -> tuple:
    """({peer name: median ms}, {peer name: why it was skipped}) over the peers that support
    the shape; a peer that raises (its own way of refusing a shape) is skipped from then on."""
    calls, times, skipped = {}, {}, {}
    for peer in peers_:
        reason = peer.unsupported(case)
        if reason is not None:
            skipped[peer.name] = reason
        else:
            calls[peer.name], times[peer.name] = None, []
    rounds = CPU_ROUNDS if device.type == "cpu" else 1
    for _ in range(rounds):
        for peer in peers_:
            if peer.name not in times:
                continue
            try:
                with peer.context():
                    if calls[peer.name] is None:
                        calls[peer.name] = peer_calls(peer, case, device, mode)
                    times[peer.name] += timing.run_ms(calls[peer.name], device, budget_s=budget_s / rounds)
                if rounds == 1:
                    calls[peer.name] = None  # its inputs freed before the next peer's are made
            except Exception as e:  # noqa: BLE001 - a peer refusing a shape, in its own error type
                if peer.name.startswith("fmha") and not isinstance(e, (RuntimeError, _OOM)):
                    raise  # fmha refuses with RuntimeError; anything else is a bug to see
                skipped[peer.name] = (str(e).splitlines() or [type(e).__name__])[0][:80]
                del times[peer.name], calls[peer.name]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return {name: statistics.median(t) for name, t in times.items()}, skipped


def _checkpoint(out_dir, meta, results) -> None:
    """Partial results, rewritten after every shape, so a run cut short still leaves data."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.partial.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)


def _commit() -> str:
    """The commit of the fmha being measured: FMHA_BENCH_COMMIT (a copy of the tree without
    .git, as on the GPU machine), else git's when the package runs from a checkout (an
    editable install), else the one recorded when the package was built."""
    if os.environ.get("FMHA_BENCH_COMMIT"):
        return os.environ["FMHA_BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), check=True).stdout.strip()
    except Exception:
        pass
    try:
        from .. import _build_info
        return _build_info.COMMIT
    except ImportError:
        return "unknown"


def _ceiling_note(meta, results):
    """A warning when some measurement beat the matmul rate measured at the start, which
    then was no ceiling (the machine was busy, or clocks were still low)."""
    best = max(((t, peer, r["case"], r["mode"]) for r in results if r["suite"] == "training"
                for peer, t in r["tflops"].items()), default=None)
    if best is None or best[0] <= meta["matmul_tflops"]:
        return None
    t, peer, case, mode = best
    return (f"{peer} reached {t:.3g} TFLOP/s ({mode}, {case}), above the matmul rate measured at the start "
            f"({meta['matmul_tflops']:.3g}): that ceiling is not one (a busy machine or low clocks then). Ratios "
            f"within this run still compare like with like; absolute rates and fractions of the ceiling do not.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fmha.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="bfloat16 on a GPU, float32 on the CPU unless given")
    ap.add_argument("--quick", action="store_true", help="a few shapes, about a minute on a GPU")
    ap.add_argument("--modes", default="fwd,fwd_bwd", help="comma-separated: fwd, fwd_bwd")
    ap.add_argument("--peers", default=None, help="comma-separated subset of peers to run")
    ap.add_argument("--suites", default="training,decode,memory",
                    help="comma-separated: training, decode, memory, model (one training step of a Llama-shaped "
                         "transformers model, attention by fmha and by transformers' others; needs transformers), "
                         "context_parallel (zigzag ring attention over the visible GPUs, simulated on one), "
                         "paged_prefill (chunked prefill over a paged cache against the same work on contiguous "
                         "varlen tensors), fp8 (the fp8 e4m3 forward against fmha's and cuDNN's bf16 forwards; sm_90 "
                         "only)")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed runs per measurement")
    ap.add_argument("--seqlens", default=None,
                    help="comma-separated: only these sequence lengths (training; context_parallel: total tokens, "
                         "each a multiple of twice the rank count, in place of the suite's defaults)")
    ap.add_argument("--head-dims", default=None, help="comma-separated: only these training head dims")
    ap.add_argument("--out", default="bench-results",
                    help="folder for the JSON, Markdown and PNG results (bench-results/ is git-ignored)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    # The CPU's default is fp32 (what most CPU users run); --dtype bfloat16 compares the
    # bf16 paths (torch's uses AMX tiles where the CPU has them, and so does fmha's forward).
    dtype = getattr(torch, args.dtype or ("float32" if device.type == "cpu" else "bfloat16"))
    budget = args.budget if args.budget is not None else (0.3 if args.quick else 1.0)
    modes = args.modes.split(",")
    suites = args.suites.split(",")
    all_peers = peers(device)
    wanted = set(args.peers.split(",")) | {"fmha"} if args.peers else None
    if wanted:
        all_peers = [p for p in all_peers if p.name in wanted]

    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "fmha": fmha.__version__, "commit": _commit(), "torch": torch.__version__,
        "dtype": str(dtype).replace("torch.", ""), "quick": args.quick,
        "peers": [p.name for p in all_peers],
        "matmul_tflops": timing.matmul_tflops(device, args.quick),
        "copy_gbps": timing.copy_gbps(device, args.quick),
    }
    meta["notes"] = []
    if device.type == "cpu":
        meta["notes"].append("fmha's CPU backend is also its reference implementation (every feature, fp32 "
                             "accumulation): tiled kernels on AVX-512/AVX2, AMX tiles for bf16 where the "
                             "CPU has them. Both libraries use every core, so another busy process moves both.")
    print(f"fmha {meta['fmha']} ({meta['commit']}) on {meta['device']}, torch {meta['torch']}, {meta['dtype']}; "
          f"ceilings: matmul {meta['matmul_tflops']:.3g} TFLOP/s, copy {meta['copy_gbps']:.0f} GB/s")
    for note in meta["notes"]:
        print(f"note: {note}")

    results = []
    cases = training_cases(device, args.quick, dtype) if "training" in suites else []
    if args.seqlens:
        cases = [c for c in cases if c.seqlen in {int(x) for x in args.seqlens.split(",")}]
    if args.head_dims:
        cases = [c for c in cases if c.head_dim in {int(x) for x in args.head_dims.split(",")}]
    for case in _progress(cases, "training shapes"):
        err = check_fmha(case, device)
        tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
        if not err < tol:
            print(f"fmha output is wrong for {case.label()}: relative error {err:.2e} > {tol:.0e}; "
                  f"no timings printed", file=sys.stderr)
            return 1
        for mode in modes:
            flops = case.flops_fwd() * (3.5 if mode == "fwd_bwd" else 1.0)
            row = {"suite": "training", "mode": mode, "case": case.label(), "batch": case.batch,
                   "seqlen": case.seqlen, "heads": case.heads, "head_dim": case.head_dim,
                   "causal": case.causal, "fmha_rel_err": err, "ms": {}, "tflops": {}, "skipped": {}}
            ms, row["skipped"] = time_peers(all_peers, case, device, mode, budget)
            for peer in all_peers:  # in the peers' order
                if peer.name in ms:
                    row["ms"][peer.name] = ms[peer.name]
                    row["tflops"][peer.name] = flops / (ms[peer.name] * 1e-3) / 1e12
            results.append(row)
            _checkpoint(args.out, meta, results)

    if "decode" in suites:
        dpeers = decode.peers(device)
        if wanted:
            dpeers = [p for p in dpeers if p.name in wanted or p.name.startswith("fmha")]
        for case in _progress(decode.cases(device, args.quick), "decode"):
            row = {"suite": "decode", "case": case.label(), "batch": case.batch, "cache_len": case.cache_len,
                   "page": case.page, "ms": {}, "gbps": {}, "skipped": {}}
            try:
                row["fmha_rel_err"] = decode.check_fmha(case, device, dtype)
                tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
                if not row["fmha_rel_err"] < tol:
                    print(f"fmha decode is wrong for {case.label()}: relative error {row['fmha_rel_err']:.2e}",
                          file=sys.stderr)
                    return 1
            except RuntimeError as e:  # no decode kernels for this device yet
                row["fmha_rel_err"] = None
                row["skipped"]["fmha"] = str(e).splitlines()[0][:120]
            for peer in dpeers:
                if peer.name in row["skipped"] or (peer.name.startswith("fmha") and row["fmha_rel_err"] is None):
                    row["skipped"].setdefault(peer.name, row["skipped"].get("fmha", ""))
                    continue
                if peer.contiguous_only and case.page:
                    row["skipped"][peer.name] = "no paged caches"
                    continue
                try:
                    row["ms"][peer.name], row["gbps"][peer.name] = decode.run_case(peer, case, device, dtype, budget)
                except (RuntimeError, _OOM) as e:
                    row["skipped"][peer.name] = str(e).splitlines()[0][:80]
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            results.append(row)
            _checkpoint(args.out, meta, results)

    if "paged_prefill" in suites:
        tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
        ppeers = paged_prefill.peers(device)
        for case in _progress(paged_prefill.cases(device, args.quick), "paged prefill"):
            err = paged_prefill.check_fmha(case, device, dtype)
            if not err < tol:
                print(f"fmha's paged prefill differs from its contiguous varlen result for {case.label()}: "
                      f"relative difference {err:.2e}; no timings printed", file=sys.stderr)
                return 1
            row = {"suite": "paged_prefill", "case": case.label(), "batch": case.batch, "context": case.context,
                   "chunk": case.chunk, "page": case.page, "fmha_rel_err": err, "ms": {}, "tflops": {},
                   "skipped": {}}
            for peer in ppeers:
                reason = peer.unsupported(case)
                if reason is None:
                    try:
                        ms = paged_prefill.run_case(peer, case, device, dtype, budget)
                        row["ms"][peer.name], row["tflops"][peer.name] = ms, case.flops() / (ms * 1e-3) / 1e12
                        continue
                    except (RuntimeError, _OOM) as e:
                        reason = str(e).splitlines()[0][:80]
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                row["skipped"][peer.name] = reason
            if "fmha-paged" in row["ms"] and "fmha-contiguous" in row["ms"]:
                row["paged_over_contiguous"] = row["ms"]["fmha-paged"] / row["ms"]["fmha-contiguous"]
            results.append(row)
            _checkpoint(args.out, meta, results)

    if "memory" in suites and device.type == "cuda":
        mem_peers = [p for p in all_peers if p.name in ("fmha", "torch-flash", "torch-efficient", "torch-cudnn",
                                                         "torch-math")]
        for case in _progress(memory.cases(args.quick, dtype), "memory"):
            row = {"suite": "memory", "case": case.label(), "seqlen": case.seqlen, "batch": case.batch,
                   "heads": case.heads, "head_dim": case.head_dim, "mib": {}, "skipped": {}}
            for peer in mem_peers:
                try:
                    row["mib"][peer.name] = memory.peak_extra_mib(peer, case, device)
                except (RuntimeError, _OOM) as e:
                    row["skipped"][peer.name] = str(e).splitlines()[0][:80]
                torch.cuda.empty_cache()
            results.append(row)

    if "model" in suites:
        tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
        for case in model.cases(device, args.quick, dtype):
            row = model.run(case, device, budget)
            gap = model.loss_gap(row)
            if "fmha" not in row["ms"] or gap is None or not gap < tol:
                print(f"model suite, {case.label()}: fmha's loss {row['loss']} differs from the others' by "
                      f"{gap} (or did not run: {row['skipped']}); no timings printed", file=sys.stderr)
                return 1
            row["loss_gap"] = gap
            results.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    if "context_parallel" in suites:
        tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
        cp_seqlens = [int(x) for x in args.seqlens.split(",")] if args.seqlens else None
        for row in context_parallel.run(device, args.quick, dtype, modes, budget, seqlens=cp_seqlens):
            if not row["rel_err"] < tol:
                print(f"context_parallel, {row['case']}: the ring's output differs from fmha's by {row['rel_err']:.2e}; "
                      f"no timings printed", file=sys.stderr)
                return 1
            results.append(row)

    if "fp8" in suites:
        why = fp8.available(device)
        if why is not None:
            meta["notes"].append(f"fp8 suite skipped: {why}")
            print(f"note: fp8 suite skipped: {why}", file=sys.stderr)
        else:
            try:
                results += fp8.run(device, args.quick, budget)
            except RuntimeError as e:  # a failed check: no timings
                print(f"fp8 suite: {e}; no timings printed", file=sys.stderr)
                return 1
            _checkpoint(args.out, meta, results)

    note = _ceiling_note(meta, results)
    if note:
        meta["notes"].append(note)
        print(f"note: {note}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    payload = {"meta": meta, "results": results}
    partial = os.path.join(args.out, "results.partial.json")
    if os.path.exists(partial):
        os.remove(partial)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(payload, f, indent=1)
    table = report.markdown(payload) + context_parallel.markdown(payload) + fp8.markdown(payload)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(report.terminal(payload))
    print(report.decode_terminal(payload))
    print(report.paged_prefill_terminal(payload))
    print(report.memory_terminal(payload))
    print(report.model_terminal(payload))
    print(context_parallel.terminal(payload))
    print(fp8.terminal(payload))
    written = ["results.json", "results.md"]
    try:
        from . import plots

        written += [os.path.basename(p) for p in plots.write_plots(payload, args.out)]
    except ImportError:
        print("(matplotlib is not installed: no plots; pip install 'fmha[bench]')")
    print(f"\nwrote {', '.join(written)} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
