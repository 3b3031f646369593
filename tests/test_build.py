"""Build hygiene: the checked-in kernel instances of both GPU backends are what
tools/gen_instances.py writes, and the wgmma wrappers what tools/gen_wgmma.py writes (compiling them is CI's job: the CUDA build, and
.ci/hip_check.sh for HIP)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_instances_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_instances.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"generated instances are stale: {r.stdout}{r.stderr}"


def test_generated_wgmma_wrappers_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_wgmma.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"csrc/cuda_fmha/tile/wgmma_ops.h is stale: {r.stdout}{r.stderr}"


def _sass(lines):
    """A cuobjdump -sass style listing of `lines`, 16 bytes apart from 0."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(lines))


def test_sass_loops_reads_the_key_loop():
    # tools/tune/sass_loops.py: the innermost loop around the wgmmas (not the tile loop around
    # it), its wait depths with the FMNMX and exp2s before each, R2URs and local accesses.
    import importlib.util
    spec = importlib.util.spec_from_file_location("sass_loops", ROOT / "tools" / "tune" / "sass_loops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    body = (["R2UR UR4, R2"] + ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24"] * 8
            + ["WARPGROUP.DEPBAR.LE gsb0, 0x1", "FMNMX.FTZ R3, R4, R5, !PT", "MUFU.EX2 R6, R6",
               "FMNMX.FTZ R3, R3, R7, !PT", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R8, R8", "STL [R1], R9"])
    # 0: outer start, 1: inner start (0x10), inner BRA back to 0x10, outer BRA back to 0x0
    lines = ["MOV R1, c[0x0][0x28]"] + body + ["@P0 BRA 0x10", "@P1 BRA 0x0", "EXIT", "BRA 0x90"]
    loops = mod.key_loops(_sass(lines))
    assert len(loops) == 1, loops
    lp = loops[0]
    assert (lp["length"], lp["mma"], lp["r2ur"], lp["local"]) == (len(body) + 1, 8, 1, 1)
    assert lp["waits"] == [(1, 0, 0), (0, 2, 1)]
    assert mod.key_loops(_sass(lines), min_mma=9) == []
