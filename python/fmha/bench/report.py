"""Tables of benchmark results: TFLOP/s of every peer and fmha's speedup over each."""

from __future__ import annotations


def _rows(payload):
    peers = payload["meta"]["peers"]
    others = [p for p in peers if p != "fmha"]
    header = ["mode", "shape"] + [f"{p} TFLOP/s" for p in peers] + [f"vs {p}" for p in others]
    rows = []
    for r in payload["results"]:
        if r["suite"] != "training":
            continue
        cells = [r["mode"], r["case"]]
        for p in peers:
            cells.append(f"{r['tflops'][p]:.3g}" if p in r["tflops"] else "-")
        for p in others:
            if "fmha" in r["ms"] and p in r["ms"]:
                cells.append(f"{r['ms'][p] / r['ms']['fmha']:.2f}x")
            else:
                cells.append("-")
        rows.append(cells)
    return header, rows


def markdown(payload) -> str:
    m = payload["meta"]
    header, rows = _rows(payload)
    lines = [
        f"# fmha benchmark: {m['device']}, {m['date']}",
        "",
        f"fmha {m['fmha']} (commit {m['commit']}), torch {m['torch']}, {m['dtype']}. Ceilings measured in "
        f"the same run: matmul {m['matmul_tflops']:.3g} TFLOP/s, device copy {m['copy_gbps']:.0f} GB/s. "
        "`vs X` is X's time over fmha's (above 1 means fmha is faster). Medians of timed runs after "
        "warm-up; forward+backward FLOPs count 3.5x the forward.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    mh, mrows = _memory_rows(payload)
    if mrows:
        lines += ["", "## Peak extra memory, forward + backward (MiB)", "",
                  "| " + " | ".join(mh) + " |", "|" + "---|" * len(mh)]
        lines += ["| " + " | ".join(r) + " |" for r in mrows]
    return "\n".join(lines) + "\n"


def _memory_rows(payload):
    mem = [r for r in payload["results"] if r["suite"] == "memory"]
    if not mem:
        return [], []
    names = [p for p in payload["meta"]["peers"] if any(p in r["mib"] for r in mem)]
    header = ["shape"] + [f"{p} MiB" for p in names] + [f"{p} / fmha" for p in names if p != "fmha"]
    rows = []
    for r in mem:
        cells = [r["case"]] + [f"{r['mib'][p]:.0f}" if p in r["mib"] else "-" for p in names]
        for p in names:
            if p != "fmha":
                ok = p in r["mib"] and r["mib"].get("fmha")
                cells.append(f"{r['mib'][p] / r['mib']['fmha']:.1f}x" if ok else "-")
        rows.append(cells)
    return header, rows


def memory_terminal(payload) -> str:
    header, rows = _memory_rows(payload)
    if not rows:
        return ""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join(["", fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def terminal(payload) -> str:
    header, rows = _rows(payload)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
