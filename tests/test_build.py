"""Build hygiene: the checked-in kernel instances are what tools/gen_instances.py writes."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_instances_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_instances.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"csrc/cuda_fmha/instances is stale: {r.stdout}{r.stderr}"
