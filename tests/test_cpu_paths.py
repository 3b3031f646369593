"""Every CPU code path against the float64 reference.

The suite's own process runs the widest path the machine has: AVX-512, and on CPUs with
AMX-BF16 (Sapphire Rapids and later, the CI machine) the bf16 forward, backward and decode
on AMX tiles (csrc/cpu/amx.inc).  The other paths (AVX-512 without AMX, AVX2, the generic
section) would then go untested, so the CPU cases of the kernel test files run again here in
child processes with each one forced (FMHA_CPU_AMX=0, FMHA_CPU_ISA=avx2|generic; both are
read once per process).  A forced path that the CPU lacks falls back to a narrower one.
"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = ["tests/test_forward.py", "tests/test_backward.py", "tests/test_dropout.py",
         "tests/test_kvcache.py", "tests/test_varlen.py"]
PATHS = {
    "avx512-without-amx": {"FMHA_CPU_AMX": "0"},
    "avx2": {"FMHA_CPU_ISA": "avx2"},
    "generic": {"FMHA_CPU_ISA": "generic"},
}

# A bf16 forward whose bits show which path ran: the AMX forward rounds P to bf16 before
# P V, the vector kernels keep it in fp32.
PROBE = """
import hashlib, torch, fmha
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 96, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3))
out = fmha.flash_attn_func(q, k, v)
print(hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest())
"""


def _cpu_has_amx_bf16():
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags and "avx512_bf16" in flags


def _run(code_or_args, env_extra, timeout):
    env = dict(os.environ, **env_extra)
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("name", list(PATHS))
def test_cpu_path_against_float64(name):
    r = _run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *FILES, "-k", "cpu"], PATHS[name],
             timeout=900)
    assert r.returncode == 0, f"{name}: the CPU cases failed on this path\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
    assert " passed" in r.stdout, r.stdout[-2000:]


@pytest.mark.skipif(not _cpu_has_amx_bf16(), reason="the CPU has no AMX-BF16")
def test_amx_switch_changes_the_path():
    default = _run(PROBE, {}, timeout=120)
    off = _run(PROBE, {"FMHA_CPU_AMX": "0"}, timeout=120)
    assert default.returncode == 0 and off.returncode == 0, default.stderr[-2000:] + off.stderr[-2000:]
    assert default.stdout.strip() != off.stdout.strip(), \
        "FMHA_CPU_AMX=0 gave the same bits as the AMX path: the switch (or AMX) is not in effect"
