#!/usr/bin/env python3
"""Summary of a tools/tune/trait_ab.sh run: for each shape, the base and new trees' times
averaged over the rounds, base / new (above 1: the new tree is faster), and whether the
checksums of the two trees agree; then the range and mean of base / new per (kernel, head
dim, mask).  Reads the three harnesses' lines:

    tune_sm90_bwd.cu   S=4096   D=128 causal fwd   1.103 ms ...  bwd   2.290 ms ...
    tune_sm90.cu       dispatched  S=4096   D=128 causal    0.377 ms ...
    tune_kernels.cu    bwd     bwd 64x128 st1  B=4   S=4096   D=128 causal    2.290 ms ...

    python tools/tune/ab_summary.py OUT/NAME_ab.txt
"""

import collections
import re
import sys

ROUND = re.compile(r"== round (\d+) D=(\d+) (base|new)")
BWD_HARNESS = re.compile(r"S=(\d+)\s+D=(\d+)\s+(causal)?\s*fwd\s+([\d.]+) ms.*bwd\s+([\d.]+) ms")
KERNELS = re.compile(r"(fwd|bwd)\s+(.*?)\s+B=\d+\s+S=(\d+)\s+D=(\d+)\s+(causal)?\s*([\d.]+) ms")
FWD_HARNESS = re.compile(r"(.*?)\s+S=(\d+)\s+D=(\d+)\s+(causal)?\s*([\d.]+) ms")
CHECKSUM = re.compile(r"checksum (?:(.*?) )?S=(\d+) D=(\d+) (full|causal) ([0-9a-f]+)$")


def parse(lines):
    """{(tree, kernel, name, D, S, causal): [ms per round]}, {(name, D, S, causal): {hashes}}."""
    times, sums, tree = collections.defaultdict(list), collections.defaultdict(set), None
    for line in lines:
        line = line.strip()
        m = ROUND.match(line)
        if m:
            tree = m.group(3)
            continue
        if tree is None:
            continue
        m = CHECKSUM.match(line)
        if m:
            sums[(m.group(1) or "", int(m.group(3)), int(m.group(2)), m.group(4) == "causal")].add(m.group(5))
            continue
        m = BWD_HARNESS.match(line)
        if m:
            key = (int(m.group(2)), int(m.group(1)), bool(m.group(3)))
            times[(tree, "fwd", "") + key].append(float(m.group(4)))
            times[(tree, "bwd", "") + key].append(float(m.group(5)))
            continue
        m = KERNELS.match(line)
        if m:
            times[(tree, m.group(1), m.group(2), int(m.group(4)), int(m.group(3)), bool(m.group(5)))].append(
                float(m.group(6)))
            continue
        m = FWD_HARNESS.match(line)
        if m:
            times[(tree, "fwd", m.group(1).strip(), int(m.group(3)), int(m.group(2)), bool(m.group(4)))].append(
                float(m.group(5)))
    return times, sums


def main() -> int:
    times, sums = parse(open(sys.argv[1]))
    groups = collections.defaultdict(list)
    for key in sorted(k for k in times if k[0] == "base"):
        new = times.get(("new",) + key[1:])
        if not new:
            continue
        _, kernel, name, d, s, causal = key
        base_ms, new_ms = sum(times[key]) / len(times[key]), sum(new) / len(new)
        ratio = base_ms / new_ms
        groups[(kernel, d, causal)].append(ratio)
        hashes = sums.get((name, d, s, causal)) or sums.get(("", d, s, causal))
        check = "" if not hashes else " checksums " + ("equal" if len(hashes) == 1 else "differ")
        print(f"{kernel} {name:24s} D={d:<3d} S={s:<6d} {'causal' if causal else 'full  '} "
              f"base {base_ms:8.3f} new {new_ms:8.3f} ms  base/new {ratio:.3f}{check}")
    for (kernel, d, causal), r in sorted(groups.items()):
        print(f"{kernel} D={d:<3d} {'causal' if causal else 'full  '} base/new {min(r):.3f}-{max(r):.3f}, "
              f"mean {sum(r) / len(r):.3f} over {len(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
