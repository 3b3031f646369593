#!/usr/bin/env python3
"""Compiles every HIP kernel of fmha device-only for each AMD architecture and prints, per
kernel, what the compiler reports (VGPRs, AGPRs, LDS bytes, scratch, occupancy, SGPR spills)
and what the ISA shows (v_mfma instructions in the whole kernel and in its main loop).

No AMD GPU is needed: the kernels take ids from amdgcn builtins (csrc/hip_fmha/tile/arch.h),
so a bare clang with HIP headers builds them.  Exits nonzero if any kernel uses scratch,
spills VGPRs, calls a function, or (the matrix-core kernels) has a main loop without MFMA.

    python tools/hip_report.py                        # gfx90a and gfx942, every kernel
    python tools/hip_report.py --markdown docs/amd_resources.md   # the committed page
    python tools/hip_report.py --asm-dir DIR          # read DIR/<arch>/<source>.s instead
"""

import argparse
import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
HIP_DIR = ROOT / "csrc" / "hip_fmha"
ARCHS = ("gfx90a", "gfx942")

REMARK = re.compile(r"remark:\s+(Function Name|SGPRs Spill|VGPRs Spill):\s*(\S+)")
LABEL = re.compile(r"^(\.LBB\d+_\d+):")
BRANCH = re.compile(r"^\s+s_(?:cbranch_\w+|branch)\s+(\.LBB\d+_\d+)")
INFO = re.compile(r"^; (NumVgprs|NumAgprs|ScratchSize|Occupancy|LDSByteSize): (\d+)")


# Translation units beside the instances whose kernels are the vector-ALU helpers
# (row-wise, append, combine): no MFMA by design.
ROWWISE_SOURCES = ("dispatch", "decode")


def sources():
    """(name, path) of every translation unit with kernels: the instances, then the
    row-wise kernels of dispatch.hip and decode.hip."""
    inst = sorted((HIP_DIR / "instances").glob("*.hip"))
    return [(p.stem, p) for p in inst] + [(n, HIP_DIR / f"{n}.hip") for n in ROWWISE_SOURCES]


def find_compiler(explicit):
    for c in ([explicit] if explicit else []) + [os.environ.get("FMHA_HIP_CLANG"), "clang-19", "clang-20",
                                                   "/opt/rocm/llvm/bin/clang", "clang"]:
        if c and shutil.which(c):
            return shutil.which(c)
    sys.exit("hip_report: no clang found (install clang-19, or pass --compiler)")


def compile_flags(compiler, arch, rocm_path):
    flags = [compiler, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib", "-O3",
             "-std=c++17", "-S", "-DFMHA_HIP_DEVICE_CHECK", f'-DFMHA_HIP_ARCH_LIST="{arch}"',
             f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}", "-Rpass-analysis=kernel-resource-usage"]
    if rocm_path:
        flags.append(f"--rocm-path={rocm_path}")
    # The flag hip.cmake also passes where the compiler has it (clang >= 19): log2f and
    # friends become single instructions instead of device-library calls.
    probe = subprocess.run([compiler, "-x", "hip", "-fgpu-approx-transcendentals", "--cuda-device-only",
                            "-nogpulib", f"--offload-arch={arch}", "-fsyntax-only", "-", "-nogpuinc"],
                           input="", capture_output=True, text=True)
    if probe.returncode == 0:
        flags.append("-fgpu-approx-transcendentals")
    return flags


def compile_one(flags, src, out_s):
    r = subprocess.run(flags + ["-o", str(out_s), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{src.name}: compile failed\n{r.stderr[-4000:]}")
    return r.stderr


def parse_remarks(stderr):
    """Mangled name -> {'sgpr_spill': n, 'vgpr_spill': n}."""
    out, cur = {}, None
    for key, val in REMARK.findall(stderr):
        if key == "Function Name":
            cur = out.setdefault(val, {})
        elif cur is not None:
            cur["sgpr_spill" if key.startswith("SGPR") else "vgpr_spill"] = int(val)
    return out


def parse_asm(text):
    """Mangled kernel name -> resources, MFMA counts, calls."""
    kernels = set(re.findall(r"^\s*\.amdhsa_kernel\s+(\S+)", text, re.M))
    funcs, cur, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_.$][\w.$]*):", line)
        if m and m.group(1) in kernels:
            cur, body = m.group(1), []
            funcs[cur] = {"body": body}
            continue
        if cur is None:
            continue
        if line.startswith("; Kernel info:"):
            funcs[cur]["in_info"] = True
            continue
        if funcs[cur].get("in_info"):
            im = INFO.match(line)
            if im:
                funcs[cur][im.group(1)] = int(im.group(2))
            if line.startswith("; Occupancy"):
                cur = None
            continue
        body.append(line)
    result = {}
    for name, f in funcs.items():
        lines = f["body"]
        labels = {}
        loops = []  # (start, end) of each back edge
        for i, line in enumerate(lines):
            lm = LABEL.match(line)
            if lm:
                labels[lm.group(1)] = i
            bm = BRANCH.match(line)
            if bm and bm.group(1) in labels and labels[bm.group(1)] < i:
                loops.append((labels[bm.group(1)], i))
        # The main loop: the loop with the most MFMA (then the longest).  Not simply the
        # longest: an unrolled epilogue loop (the backward's dK/dV stores) can outgrow it.
        def loop_mfma(se):
            return sum(1 for ln in lines[se[0]:se[1] + 1] if "v_mfma" in ln)

        main = max(loops, key=lambda se: (loop_mfma(se), se[1] - se[0])) if loops else None
        mfma = sum(1 for ln in lines if "v_mfma" in ln)
        result[name] = {
            "vgpr": f.get("NumVgprs", 0), "agpr": f.get("NumAgprs", 0), "scratch": f.get("ScratchSize", 0),
            "occupancy": f.get("Occupancy", 0), "lds": f.get("LDSByteSize", 0), "mfma": mfma,
            "mfma_loop": loop_mfma(main) if main else None,
            "calls": sum(1 for ln in lines if "s_swappc" in ln or "s_setpc" in ln),
        }
    return result


TYPE_CODES = {"f": "fp32", "NS0_3f16E": "fp16", "NS0_4bf16E": "bf16", "h": "fp8", "a": "int8", "S2_": "same"}


def pretty(source, mangled):
    """A readable kernel name: the instance file's stem, or a row-wise kernel and its
    template arguments (dtype, then the cache element where there is one)."""
    if source not in ROWWISE_SOURCES:
        return source
    m = re.match(r"_ZN4fmha3hip\d+(\w+?)I((?:f|h|a|NS0_3f16E|NS0_4bf16E|S2_)+)E", mangled)
    if not m:
        return mangled
    args = re.findall(r"NS0_3f16E|NS0_4bf16E|S2_|f|h|a", m.group(2))
    names = [TYPE_CODES[a] for a in args]
    names = [names[0] if n == "same" else n for n in names]
    return f"{m.group(1)}<{', '.join(names)}>"


def compiler_version(compiler) -> str:
    if not compiler:
        return "the compiler that wrote --asm-dir"
    first = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()
    return first[0].strip() if first else compiler


def markdown_page(table: str, version: str, archs) -> str:
    """docs/amd_resources.md: the table with what its columns mean."""
    return (
        "# HIP kernel resources (generated)\n\n"
        f"Written by `python tools/hip_report.py --markdown docs/amd_resources.md` ({version}; "
        f"{', '.join(archs)}), every kernel compiled device-only; regenerate it rather than edit it. "
        "VGPR/AGPR: registers per lane (512 in all on gfx90a/gfx942); LDS: bytes per workgroup; "
        "scratch: bytes per lane; occupancy: waves per SIMD as the compiler reports it; SGPR "
        "spills go to VGPR lanes, not to memory. docs/amd.md says what these figures do and do "
        "not show.\n\n" + table + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=list(ARCHS))
    ap.add_argument("--compiler", help="clang with the AMDGPU target (default: clang-19, then clang)")
    ap.add_argument("--rocm-path", help="where hip/hip_runtime.h lives under include/ (default: /usr on Debian)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--asm-dir", type=pathlib.Path, help="read ARCH/SOURCE.s from here instead of compiling")
    ap.add_argument("--keep-asm", type=pathlib.Path, help="write the ISA to KEEP_ASM/ARCH/SOURCE.s")
    ap.add_argument("--markdown", type=pathlib.Path,
                    help="also write the table as a Markdown page (docs/amd_resources.md is this page)")
    args = ap.parse_args()

    srcs = sources()
    asm_root = args.asm_dir or args.keep_asm or pathlib.Path(tempfile.mkdtemp(prefix="fmha_hip_"))
    remarks = {}
    compiler = None
    if not args.asm_dir:
        compiler = find_compiler(args.compiler)
        rocm = args.rocm_path or ("/usr" if pathlib.Path("/usr/include/hip/hip_runtime.h").exists()
                                  and not pathlib.Path("/opt/rocm").exists() else None)
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for arch in args.arch:
                flags = compile_flags(compiler, arch, rocm)
                (asm_root / arch).mkdir(parents=True, exist_ok=True)
                for name, path in srcs:
                    jobs[(arch, name)] = pool.submit(compile_one, flags, path, asm_root / arch / f"{name}.s")
            failed = False
            for key, fut in jobs.items():
                try:
                    remarks[key] = parse_remarks(fut.result())
                except RuntimeError as e:
                    print(e, file=sys.stderr)
                    failed = True
            if failed:
                return 1

    rows, problems = [], []
    for arch in args.arch:
        for name, _ in srcs:
            asm = asm_root / arch / f"{name}.s"
            for mangled, k in sorted(parse_asm(asm.read_text()).items()):
                spills = remarks.get((arch, name), {}).get(mangled, {})
                k.update(sgpr_spill=spills.get("sgpr_spill", "-"), vgpr_spill=spills.get("vgpr_spill", 0))
                label = pretty(name, mangled)
                matrix_core = name not in ROWWISE_SOURCES
                rows.append((label, arch, k, matrix_core))
                if k["scratch"] > 0 or k["vgpr_spill"]:
                    problems.append(f"{label} ({arch}): {k['scratch']} bytes of scratch, {k['vgpr_spill']} VGPR spills")
                if k["calls"]:
                    problems.append(f"{label} ({arch}): {k['calls']} function calls (a device-library call?)")
                if matrix_core and not k["mfma_loop"]:
                    problems.append(f"{label} ({arch}): no v_mfma in the main loop")

    head = ("| kernel | arch | VGPR | AGPR | LDS bytes | scratch | occupancy | SGPR spills | v_mfma | v_mfma in main loop |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for label, arch, k, matrix_core in rows:
        loop = k["mfma_loop"] if matrix_core else "— (no MFMA by design)"
        lines.append(f"| {label} | {arch} | {k['vgpr']} | {k['agpr']} | {k['lds']} | {k['scratch']} | "
                     f"{k['occupancy']} | {k['sgpr_spill']} | {k['mfma']} | {loop} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        args.markdown.write_text(markdown_page(table, compiler_version(compiler), args.arch))
    print(f"\n{len(rows)} kernels on {', '.join(args.arch)}: "
          f"{'all without scratch, MFMA in every matrix-core main loop' if not problems else 'PROBLEMS'}")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
