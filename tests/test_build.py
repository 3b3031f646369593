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
