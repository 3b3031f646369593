#!/usr/bin/env python3
# Warp-stall samples by reason, executed instructions by opcode and the instructions that hold
# the most samples, from `ncu -i REP --page source --csv --print-source sass` (one file per kernel).
import csv, sys, collections, re
for f in sys.argv[1:]:
    rows = list(csv.reader(open(f)))
    hdr = rows[1]; data = rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
    tot = collections.Counter(); total = 0
    ops = collections.Counter(); opsamp = collections.Counter()
    per = []
    for r in data:
        if len(r) < len(hdr): continue
        s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0); total += s
        src = r[ix['Source']].strip()
        op = re.sub(r'^@!?U?P\w+\s+', '', src).split(' ')[0]
        n = int(r[ix['Instructions Executed']] or 0)
        ops[op.split('.')[0]] += n; opsamp[op.split('.')[0]] += s
        top = max(stall_cols, key=lambda h: int(r[ix[h]] or 0))
        for h in stall_cols: tot[h] += int(r[ix[h]] or 0)
        per.append((s, r[ix['Address']][-5:], top[6:], src))
    print(f"== {f} total samples {total}")
    for h, v in tot.most_common(12): print(f"  {h:28s} {v:7d} {100*v/total:5.1f}%")
    print("  executed warp instructions by opcode (share) / samples share:")
    te = sum(ops.values())
    for op, v in ops.most_common(16): print(f"    {op:10s} {100*v/te:5.1f}%  samples {100*opsamp[op]/total:5.1f}%")
    for s, a, t, src in sorted(per, reverse=True)[:25]: print(f"  {a} {s:6d} {100*s/total:4.1f}% {t:14s} {src[:70]}")
