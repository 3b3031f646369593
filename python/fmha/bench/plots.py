"""PNG plots of a benchmark run (matplotlib):

    python -m fmha.bench.plots bench-results/results.json

speedup over standard attention, memory saved, and TFLOP/s of every backend, each against
sequence length."""

from __future__ import annotations

import json
import os
import sys


def _series(results, peer, mode, head_dim, causal, key="tflops"):
    pts = [(r["seqlen"], r[key][peer]) for r in results
           if r["suite"] == "training" and r["mode"] == mode and r["head_dim"] == head_dim
           and r["causal"] == causal and peer in r[key]]
    return sorted(pts)


def write_plots(payload, out_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, results = payload["meta"], payload["results"]
    title = f"{meta['device']}, {meta['dtype']}, {meta['date']}"
    written = []
    dims = sorted({r["head_dim"] for r in results if r["suite"] == "training"})
    results_training = [r for r in results if r["suite"] == "training"]

    # Speedup of fmha over standard attention (torch's math backend), forward + backward;
    # only when the run measured it (a --peers subset may leave it out).
    speedups = []
    for d in dims:
        for causal in (False, True):
            fm = dict(_series(results, "fmha", "fwd_bwd", d, causal, "ms"))
            mt = dict(_series(results, "torch-math", "fwd_bwd", d, causal, "ms"))
            xs = sorted(set(fm) & set(mt))
            if xs:
                speedups.append((xs, [mt[x] / fm[x] for x in xs], f"D={d}{' causal' if causal else ''}"))
    if speedups:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for xs, ys, label in speedups:
            ax.plot(xs, ys, marker="o", label=label)
        _seqlen_axis(ax, results_training)
        ax.set(xlabel="sequence length", ylabel="speedup over standard attention (x)",
               title=f"fmha forward+backward vs torch math\n{title}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out_dir, "speedup_vs_standard.png"))

    # Memory: peak extra memory of standard attention over fmha's.
    mem = [r for r in results if r["suite"] == "memory"]
    if mem:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for peer in [p for p in meta["peers"] if p != "fmha"]:
            pts = [(r["seqlen"], r["mib"][peer] / r["mib"]["fmha"]) for r in mem
                   if peer in r["mib"] and r["mib"].get("fmha")]
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, marker="o", label=f"{peer} / fmha")
        _seqlen_axis(ax, mem)
        ax.set(yscale="log", xlabel="sequence length",
               ylabel="peak extra memory, ratio to fmha", title=f"Memory, forward+backward, D=128\n{title}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out_dir, "memory_vs_seqlen.png"))

    # Decode bandwidth against cache length, one sequence.
    dec = [r for r in results if r["suite"] == "decode" and r["batch"] == 1]
    if dec:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        names = sorted({n for r in dec for n in r["gbps"]})
        for name in names:
            for page in sorted({r["page"] or 0 for r in dec}):
                pts = sorted((r["cache_len"], r["gbps"][name]) for r in dec
                             if (r["page"] or 0) == page and name in r["gbps"])
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", label=f"{name}{' paged ' + str(page) if page else ''}")
        ax.axhline(meta["copy_gbps"], color="gray", linestyle="--", label="device copy")
        _seqlen_axis(ax, [{"seqlen": r["cache_len"]} for r in dec])
        ax.set(xlabel="cache length", ylabel="K/V read GB/s", title=f"Decode, B=1, 32 q heads / 8 kv heads, D=128\n{title}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out_dir, "decode_bandwidth.png"))

    # TFLOP/s of every backend, D = 128 (or the first head dim), per mode and mask.
    d = 128 if 128 in dims else (dims[0] if dims else None)
    if d is not None:
        fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
        for ax, (mode, causal) in zip(axes.flat, [("fwd", False), ("fwd", True), ("fwd_bwd", False),
                                                  ("fwd_bwd", True)]):
            for peer in meta["peers"]:
                pts = _series(results, peer, mode, d, causal)
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", label=peer, linewidth=2.5 if peer == "fmha" else 1.2)
            _seqlen_axis(ax, results_training)
            ax.set(title=f"{mode}{' causal' if causal else ''}, D={d}", ylabel="TFLOP/s")
            ax.grid(alpha=0.3)
        axes[1][0].set_xlabel("sequence length")
        axes[1][1].set_xlabel("sequence length")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(title)
        written.append(_save(fig, out_dir, "tflops_vs_seqlen.png"))
    return written


def _seqlen_axis(ax, results):
    xs = sorted({r["seqlen"] for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in xs])
    ax.minorticks_off()


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        payload = json.load(f)
    for path in write_plots(payload, os.path.dirname(os.path.abspath(argv[0]))):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
