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
        *[f"Note: {n}\n" for n in m.get("notes", [])],
    ]
    if rows:  # the training table (absent when only other suites ran)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    dh, drows = _decode_rows(payload)
    if drows:
        lines += ["", f"## Decode: K/V read bandwidth, GB/s (device copy: {m['copy_gbps']:.0f} GB/s)", "",
                  "| " + " | ".join(dh) + " |", "|" + "---|" * len(dh)]
        lines += ["| " + " | ".join(r) + " |" for r in drows]
    ph, prows = _paged_prefill_rows(payload)
    if prows:
        lines += ["", "## Chunked prefill over a paged cache (flash_attn_varlen_func with block_table)", "",
                  "`paged / contiguous` is fmha's paged time over its time for the same work on contiguous varlen "
                  "tensors (1.00 = no cost for paging).", "",
                  "| " + " | ".join(ph) + " |", "|" + "---|" * len(ph)]
        lines += ["| " + " | ".join(r) + " |" for r in prows]
    eh, erows = _model_rows(payload)
    if erows:
        lines += ["", "## End to end: one training step (forward, loss, backward)", "",
                  "Same model and tokens for every implementation; `vs X` is X's step time over fmha's.", "",
                  "| " + " | ".join(eh) + " |", "|" + "---|" * len(eh)]
        lines += ["| " + " | ".join(r) + " |" for r in erows]
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


def _model_rows(payload):
    rows_in = [r for r in payload["results"] if r["suite"] == "model"]
    if not rows_in:
        return [], []
    header = ["model", "attention", "ms / step", "tokens/s", "loss", "vs"]
    rows = []
    for r in rows_in:
        for name in list(r["ms"]) + list(r["skipped"]):
            if name in r["ms"]:
                rows.append([r["case"], name, f"{r['ms'][name]:.1f}", f"{r['tokens_per_s'][name]:.0f}",
                             f"{r['loss'][name]:.4f}", f"{r['ms'][name] / r['ms']['fmha']:.2f}x"])
            else:
                rows.append([r["case"], name, "-", "-", "-", f"skipped: {r['skipped'][name]}"])
    return header, rows


def model_terminal(payload) -> str:
    header, rows = _model_rows(payload)
    return _table(header, rows) if rows else ""


def peer_names(rows_in, key: str) -> list:
    """The peers of a suite's rows, timed (row[key]) or skipped, in order of first appearance."""
    names = []
    for r in rows_in:
        for n in list(r[key]) + list(r["skipped"]):
            if n not in names:
                names.append(n)
    return names


def _decode_rows(payload):
    rows_in = [r for r in payload["results"] if r["suite"] == "decode"]
    if not rows_in:
        return [], []
    names = peer_names(rows_in, "gbps")
    copy = payload["meta"]["copy_gbps"]
    others = [n for n in names if not n.startswith("fmha")]
    header = ["shape"] + [f"{n} GB/s" for n in names] + ["fmha / copy"] + [f"fmha vs {n}" for n in others]
    rows = []
    for r in rows_in:
        g = r["gbps"]
        cells = [r["case"]] + [f"{g[n]:.0f}" if n in g else "-" for n in names]
        cells.append(f"{g['fmha'] / copy:.0%}" if "fmha" in g else "-")
        for n in others:
            cells.append(f"{r['ms'][n] / r['ms']['fmha']:.2f}x" if "fmha" in r["ms"] and n in r["ms"] else "-")
        rows.append(cells)
    return header, rows


def _paged_prefill_rows(payload):
    rows_in = [r for r in payload["results"] if r["suite"] == "paged_prefill"]
    if not rows_in:
        return [], []
    names = peer_names(rows_in, "ms")
    header = ["shape"] + [f"{n} ms" for n in names] + [f"{n} TFLOP/s" for n in names] + ["paged / contiguous"]
    rows = []
    for r in rows_in:
        cells = [r["case"]] + [f"{r['ms'][n]:.3f}" if n in r["ms"] else "-" for n in names]
        cells += [f"{r['tflops'][n]:.1f}" if n in r["tflops"] else "-" for n in names]
        cells.append(f"{r['paged_over_contiguous']:.2f}" if "paged_over_contiguous" in r else "-")
        rows.append(cells)
    return header, rows


def paged_prefill_terminal(payload) -> str:
    header, rows = _paged_prefill_rows(payload)
    notes = sorted({f"{n}: {why}" for r in payload["results"] if r["suite"] == "paged_prefill"
                    for n, why in r["skipped"].items() if why})
    return (_table(header, rows) + ("\n" + "\n".join(notes) if notes else "")) if rows else ""


def _table(header, rows) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join(["", fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def decode_terminal(payload) -> str:
    header, rows = _decode_rows(payload)
    notes = sorted({f"{n}: {why}" for r in payload["results"] if r["suite"] == "decode"
                    for n, why in r["skipped"].items() if n.startswith("fmha") and why})
    return (_table(header, rows) + ("\n" + "\n".join(notes) if notes else "")) if rows else ""


def memory_terminal(payload) -> str:
    header, rows = _memory_rows(payload)
    return _table(header, rows) if rows else ""


def terminal(payload) -> str:
    header, rows = _rows(payload)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
