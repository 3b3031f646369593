"""Static check: every instruction of every fmha HIP kernel (all instances, dispatch.hip
and decode.hip, for gfx90a and gfx942) has semantics in the emulator.  Compiles what is not
cached yet (minutes on one core the first time).

    python tools/amdemu/coverage.py [--arch gfx942] [--jobs 1]
"""

import argparse
import collections
import concurrent.futures
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from amdemu import build, codeobj, emu  # noqa: E402


def sources():
    inst = sorted((build.HIP_DIR / "instances").glob("*.hip"))
    return [p.stem for p in inst] + ["dispatch", "decode"]


def unsupported(name, arch):
    co = codeobj.CodeObject(build.instance(name, arch), arch)
    comp = emu.Compiler(arch)
    bad = {}
    for ins in co.instrs.values():
        try:
            comp.compile(ins)
        except emu.Unsupported as e:
            bad.setdefault(ins.mnem, str(e))
    return name, len(co.instrs), bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", nargs="+", default=list(build.ARCHS))
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    total, missing = 0, collections.defaultdict(set)
    with concurrent.futures.ProcessPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(unsupported, n, arch) for arch in a.arch for n in sources()]
        for f in futs:
            name, n, bad = f.result()
            total += n
            for m, why in bad.items():
                missing[(m, why)].add(name)
    for (m, why), names in sorted(missing.items()):
        print(f"unsupported {m}: {why} ({len(names)} code objects, e.g. {sorted(names)[0]})")
    print(f"{total} instructions in {len(sources()) * len(a.arch)} code objects; "
          f"{len(missing)} unsupported mnemonics")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
