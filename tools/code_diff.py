#!/usr/bin/env python3
"""Machine code of kernel instances, before and after a change, without a GPU.

For refactors that should not change what runs: builds the named instance files of
csrc/cuda_fmha/instances (SASS, through nvcc and cuobjdump) and csrc/hip_fmha/instances
(AMDGPU assembly, through clang-19) from a git revision and from the working tree, and
reports per instance whether the code is identical, the same instructions reordered, or
different, with the resources (registers, stack, local memory; VGPRs, AGPRs, scratch,
occupancy) of both.  A change that keeps every instance identical needs no device run to
show it costs nothing.

    tools/code_diff.py --base HEAD bwd_sm90_bf16_hdim128.cu fwd_bf16_hdim64.hip
    tools/code_diff.py --arch 80 fwd_bf16_hdim128_scoremod.cu      # sm_80 instead of sm_90a

cuobjdump comes with the CUDA toolkit; without it, `pip download nvidia-cuda-cuobjdump`
and unpack the wheel (its bin/ folder on PATH, or --cuobjdump).  Exits 1 when any instance
differs beyond reordering.
"""
import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def export_tree(rev: str, dest: pathlib.Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "csrc"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def cuda_code(tree: pathlib.Path, inst: str, arch: str, out: pathlib.Path, cuobjdump: str):
    cubin = out.with_suffix(".cubin")
    gencode = f"arch=compute_{arch},code=sm_{arch}"
    subprocess.run(["nvcc", "-std=c++17", "-O3", "--use_fast_math", "-gencode", gencode, f"-I{tree / 'csrc'}",
                    f"-I{tree / 'csrc' / 'include'}", "-cubin", "-o", str(cubin),
                    str(tree / "csrc" / "cuda_fmha" / "instances" / inst)], check=True, capture_output=True)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    code = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", l).split(";")[0].strip()
            for l in sass.splitlines() if re.match(r"^\s+/\*[0-9a-f]+\*/", l)]
    res = subprocess.run([cuobjdump, "-res-usage", str(cubin)], check=True, capture_output=True, text=True).stdout
    resources = " ".join(re.findall(r"(?:REG|STACK|LOCAL):\d+", res))
    return code, resources


def hip_code(tree: pathlib.Path, inst: str, arch: str, out: pathlib.Path, clang: str):
    asm = out.with_suffix(".s")
    subprocess.run([clang, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib", "-O3",
                    "-std=c++17", "-S", "-DFMHA_HIP_DEVICE_CHECK", f'-DFMHA_HIP_ARCH_LIST="{arch}"',
                    f"-I{tree / 'csrc'}", f"-I{tree / 'csrc' / 'include'}", "--rocm-path=/usr",
                    "-fgpu-approx-transcendentals", "-o", str(asm),
                    str(tree / "csrc" / "hip_fmha" / "instances" / inst)], check=True, capture_output=True)
    text = asm.read_text()
    # The compilation unit's id (a hash of the path) and comments differ between two trees.
    code = [l.strip() for l in text.splitlines()
            if l.strip() and "__hip_cuid" not in l and not l.lstrip().startswith((";", ".file", ".ident"))]
    keys = ("NumVgprs", "NumAgprs", "NumSgprs", "ScratchSize", "Occupancy")
    resources = " ".join(f"{k}:{v}" for k, v in re.findall(r"; (" + "|".join(keys) + r"): (\d+)", text))
    return code, resources


def opcodes(code):
    return collections.Counter(l.split()[0] if not l.startswith("@") else l.split()[1] for l in code if l)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("instances", nargs="+", help="instance file names (.cu: CUDA, .hip: HIP)")
    ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree with")
    ap.add_argument("--arch", help="CUDA: 90a (default), 80, ...; HIP: gfx942 (default), gfx90a")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--clang", default=shutil.which("clang-19") or "clang")
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="fmha_code_diff_") as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "base").mkdir()
        export_tree(args.base, tmp / "base")
        for inst in args.instances:
            hip = inst.endswith(".hip")
            arch = args.arch or ("gfx942" if hip else "90a")
            results = []
            for label, tree in (("base", tmp / "base"), ("new", ROOT)):
                out = tmp / f"{label}_{inst}"
                try:
                    results.append(hip_code(tree, inst, arch, out, args.clang) if hip
                                   else cuda_code(tree, inst, arch, out, args.cuobjdump))
                except subprocess.CalledProcessError as e:
                    print(f"{inst}: {label} build failed\n{(e.stderr or b'').decode(errors='replace')[-2000:]}")
                    return 1
            (code0, res0), (code1, res1) = results
            if code0 == code1:
                verdict = "identical"
            elif opcodes(code0) == opcodes(code1) and len(code0) == len(code1):
                verdict = f"reordered ({sum(a != b for a, b in zip(code0, code1))} of {len(code0)} lines differ)"
            else:
                verdict = f"DIFFERENT ({len(code0)} -> {len(code1)} lines)"
                failed = True
            same_res = "same resources" if res0 == res1 else f"resources {res0} -> {res1}"
            print(f"{inst} [{arch}]: {verdict}; {same_res} ({res1})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
