#!/usr/bin/env python3
"""Analyze per-CTA timelines: per SM, gaps between CTAs, prologue, loop, epilogue; fixed-cost fit."""
import csv, sys, collections, statistics as st
for path in sys.argv[1:]:
    rows = [r for r in csv.DictReader(open(path))]
    rows = [{k: int(v) for k, v in r.items()} for r in rows]
    rows = [r for r in rows if r["c_end"] != 0]
    bysm = collections.defaultdict(list)
    for r in rows: bysm[r["sm"]].append(r)
    busy = idle = 0; spans = []; pro = []; epi = []; per_it = []; ends = []; gaps = []
    for sm, rs in bysm.items():
        rs.sort(key=lambda r: r["c0"])
        first, last = rs[0]["c0"], max(r["c_end"] for r in rs)
        spans.append((sm, first, last))
        for a, b in zip(rs, rs[1:]): gaps.append(b["c0"] - a["c_end"])
        for r in rs:
            pro.append(r["c_kv"] - r["c0"]); epi.append(r["c_end"] - r["c_loop"])
            if r["n_iters"]: per_it.append((r["c_loop"] - r["c_kv"]) / r["n_iters"])
            busy += r["c_end"] - r["c0"]
    # global time via globaltimer for kernel span
    g0 = min(r["g0"] for r in rows); g1 = max(r["g0"] for r in rows)
    span_cycles = [l - f for _, f, l in spans]
    # linear fit of cta cycles vs n_iters
    xs = [r["n_iters"] for r in rows]; ys = [r["c_end"] - r["c0"] for r in rows]
    mx, my = st.mean(xs), st.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0
    icpt = my - slope * mx
    tot_it = sum(xs)
    nsm = len(bysm)
    ideal = slope * tot_it / nsm
    print(f"{path.split('/')[-1]}: ctas {len(rows)} sms {nsm} iters/cta {mx:.1f}")
    print(f"  per-SM span cycles: max {max(span_cycles)} min {min(span_cycles)} mean {st.mean(span_cycles):.0f}; busy share {busy/sum(span_cycles):.3f}")
    print(f"  fit cta_cycles = {icpt:.0f} + {slope:.0f} * n_iters; ideal (slope*iters/SMs) {ideal:.0f} = {ideal/max(span_cycles):.3f} of max span")
    print(f"  prologue (start->K,V in) median {st.median(pro):.0f}; epilogue median {st.median(epi):.0f}; per-iter median {st.median(per_it):.0f}")
    print(f"  gap between CTAs on an SM: median {st.median(gaps) if gaps else 0:.0f} mean {st.mean(gaps) if gaps else 0:.0f}")
    print(f"  fixed (intercept) x ctas / SMs = {icpt*len(rows)/nsm:.0f} cycles = {icpt*len(rows)/nsm/max(span_cycles):.3f} of span; gaps sum/SM {sum(gaps)/nsm:.0f} = {sum(gaps)/nsm/max(span_cycles):.3f}")
    # tail: per-SM last end spread
    if "c_e1" in rows[0]:
        md = lambda f: st.median([f(r) for r in rows if r["n_iters"] > 1])
        print(f"  kv->q0 {md(lambda r: r['c_q0']-r['c_kv']):.0f}  first step {md(lambda r: r['c_it1']-r['c_q0']):.0f}  "
              f"loop1-loop0 {md(lambda r: r['c_loop1']-r['c_loop']):.0f}  loop0->e1 {md(lambda r: r['c_e1']-r['c_loop']):.0f}  "
              f"e1->e2 {md(lambda r: r['c_e2']-r['c_e1']):.0f}  e2->end {md(lambda r: r['c_end']-r['c_e2']):.0f}  end1-end0 {md(lambda r: r['c_end1']-r['c_end']):.0f}")
        later = [(r['c_loop']-r['c_it1'])/(r['n_iters']-1) for r in rows if r['n_iters'] > 1]
        print(f"  later steps median {st.median(later):.0f}")
    lasts = sorted(l for _, _, l in spans); firsts = sorted(f for _, f, _ in spans)
    print(f"  tail: last end - median SM end = {lasts[-1]-st.median(lasts):.0f} cycles (clock per SM; offsets between SMs unknown)")
