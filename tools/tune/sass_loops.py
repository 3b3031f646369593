#!/usr/bin/env python3
"""The key loops of sm_90a kernels, read from their SASS: for each loop (a backward branch
around 8 to 64 wgmmas), its length in instructions, its wgmmas, R2URs (descriptors copied
from vector registers) and local-memory accesses, and where each wgmma wait sits: its depth
(`WARPGROUP.DEPBAR.LE gsb0, N`) and how many FMNMX (row maxima) and MUFU.EX2 (exp2s) of the
loop come before it.  In the forward, the wait for block i - 1's P V (depth 0) should follow
the row maxima of block i and some of its exp2s, so that the softmax overlaps that product;
ptxas moves it ahead of them when registers run short or a branch splits the loop
(docs/tuning.md, "Inside a consumer").

    python tools/tune/sass_loops.py csrc/cuda_fmha/instances/fwd_sm90_bf16_hdim256_long.cu [more .cu or .cubin]

A .cu is compiled for sm_90a first (nvcc from PATH, the repository's include paths); a
.cubin is read as it is.  cuobjdump comes with the CUDA toolkit (or `pip download
nvidia-cuda-cuobjdump`; --cuobjdump names it).
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b[^;]*?0x([0-9a-f]+)")
LOCAL = re.compile(r"\b(LDL|STL)\b")


def instructions(sass: str):
    """[(address, text)] of a cuobjdump -sass listing, in order."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(LINE.match, sass.splitlines()) if m]


def key_loops(sass: str, min_mma: int = 8, max_mma: int = 64):
    """One dict per innermost loop with min_mma to max_mma wgmmas: length, mma, r2ur, local,
    fmnmx, exp2 and waits [(depth, FMNMX before it, EX2 before it)]."""
    ins = instructions(sass)
    index = {a: i for i, (a, _) in enumerate(ins)}
    spans = []
    for i, (a, text) in enumerate(ins):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            spans.append((index[int(m.group(1), 16)], i))
    loops = []
    for lo, hi in spans:
        if any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2 in spans):
            continue  # an outer loop (the tile loop around the key loops)
        body = [t for _, t in ins[lo:hi + 1]]
        mma = sum("GMMA" in t for t in body)
        if not min_mma <= mma <= max_mma:
            continue
        waits, fmnmx, exp2 = [], 0, 0
        for t in body:
            fmnmx += "FMNMX" in t
            exp2 += "MUFU.EX2" in t
            w = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", t)
            if w:
                waits.append((int(w.group(1), 16), fmnmx, exp2))
        loops.append(dict(length=len(body), mma=mma, r2ur=sum("R2UR" in t for t in body),
                          local=sum(bool(LOCAL.search(t)) for t in body), fmnmx=fmnmx, exp2=exp2, waits=waits))
    return loops


def cubin_of(src: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    if src.suffix == ".cubin":
        return src
    out = tmp / (src.stem + ".cubin")
    subprocess.run(["nvcc", "-std=c++17", "-O3", "--use_fast_math", "-gencode", "arch=compute_90a,code=sm_90a",
                    f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}", "-cubin", "-o", str(out), str(src)],
                   check=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=pathlib.Path)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for f in args.files:
            sass = subprocess.run([args.cuobjdump, "-sass", str(cubin_of(f, pathlib.Path(tmp)))], check=True,
                                  capture_output=True, text=True).stdout
            print(f.name, f"local accesses in all: {sum(bool(LOCAL.search(t)) for _, t in instructions(sass))}")
            for lp in key_loops(sass):
                waits = " ".join(f"wait<{d}> after {m}/{lp['fmnmx']} FMNMX, {e}/{lp['exp2']} EX2" for d, m, e in lp["waits"])
                print(f"  loop {lp['length']} instructions, {lp['mma']} wgmma, {lp['r2ur']} R2UR, "
                      f"{lp['local']} local | {waits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
