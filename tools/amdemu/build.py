"""Builds device code objects (ELF) of HIP sources with clang-19, device-only, as
tools/hip_report.py compiles them but linked (lld) into a loadable code object.

Outputs are cached by a hash of the compiler command and of every header the fmha HIP
sources can include, under $FMHA_AMDEMU_CACHE (default ~/.cache/fmha-amdemu)."""

import hashlib
import os
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
HIP_DIR = ROOT / "csrc" / "hip_fmha"
ARCHS = ("gfx90a", "gfx942")


def find_tool(names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def compiler():
    return find_tool([os.environ.get("FMHA_HIP_CLANG") or "clang++-19", "/usr/lib/llvm-19/bin/clang++"])


def objdump():
    return find_tool(["llvm-objdump-19", "/usr/lib/llvm-19/bin/llvm-objdump"])


def missing_tools():
    """Names of what is missing to build and decode code objects (empty if all is there)."""
    out = []
    if compiler() is None:
        out.append("clang++-19")
    if objdump() is None:
        out.append("llvm-objdump-19 (apt llvm-19)")
    if find_tool(["ld.lld-19", "/usr/lib/llvm-19/bin/ld.lld", "ld.lld"]) is None:
        out.append("ld.lld (apt lld-19)")
    if not pathlib.Path("/usr/include/hip/hip_runtime.h").exists() and not os.environ.get("FMHA_ROCM_PATH"):
        out.append("HIP headers (apt libamdhip64-dev)")
    return out


def _tree_hash():
    h = hashlib.sha256()
    for d in (ROOT / "csrc" / "hip_fmha", ROOT / "csrc" / "common", ROOT / "csrc" / "include"):
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.suffix in (".h", ".hip", ".cpp", ".hpp"):
                h.update(str(p.relative_to(ROOT)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def cache_dir():
    d = pathlib.Path(os.environ.get("FMHA_AMDEMU_CACHE", pathlib.Path.home() / ".cache" / "fmha-amdemu"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(src, arch, defines=(), extra_source=None, root=None):
    """Path of the code object of `src` (a .hip path, or None with extra_source: HIP text)
    for `arch`.  defines: extra -D flags; root: a copy of the repository whose csrc/ is
    on the include path instead of ours (variant())."""
    root = pathlib.Path(root) if root else ROOT
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("amdemu: clang++-19 not found")
    rocm = os.environ.get("FMHA_ROCM_PATH", "/usr")
    flags = ["-x", "hip", f"--offload-arch={arch}", f"--rocm-path={rocm}", "-nogpulib", "--cuda-device-only",
             "--no-gpu-bundle-output", "-O3", "-std=c++17", "-DFMHA_HIP_DEVICE_CHECK",
             f'-DFMHA_HIP_ARCH_LIST="{arch}"', f"-I{root / 'csrc'}", f"-I{root / 'csrc' / 'include'}",
             "-fgpu-approx-transcendentals"] + [f"-D{d}" for d in defines]
    h = hashlib.sha256()
    h.update(" ".join([cxx] + flags).encode())
    h.update(_tree_hash().encode())
    if extra_source is not None:
        h.update(extra_source.encode())
        name = "inline"
    else:
        src = pathlib.Path(src)
        h.update(str(src).encode())
        h.update(src.read_bytes())
        name = src.stem
    out = cache_dir() / f"{name}-{arch}-{h.hexdigest()[:16]}.co"
    if out.exists():
        return out
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    if extra_source is not None:
        srcfile = out.with_suffix(f".{os.getpid()}.hip")
        srcfile.write_text(extra_source)
    else:
        srcfile = src
    env = dict(os.environ)
    env["PATH"] = "/usr/lib/llvm-19/bin:" + env.get("PATH", "")  # ld.lld for the device link
    r = subprocess.run([cxx] + flags + ["-o", str(tmp), str(srcfile)], capture_output=True, text=True, env=env)
    if extra_source is not None:
        srcfile.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"amdemu: compiling {name} for {arch} failed:\n{r.stderr[-6000:]}")
    os.replace(tmp, out)
    return out


def instance(name, arch, defines=()):
    """Code object of csrc/hip_fmha/instances/<name>.hip (or dispatch / decode for the
    row-wise kernels of dispatch.hip and decode.hip)."""
    p = HIP_DIR / "instances" / f"{name}.hip"
    if not p.exists():
        p = HIP_DIR / f"{name}.hip"
    return build(p, arch, defines)


def variant(name, arch, edits):
    """Code object of instance `name` compiled from a copy of csrc/ with text edits
    {relative path under csrc/: (old, new)} applied (each old must occur exactly once):
    the deliberately broken kernels of the tests."""
    import shutil as _sh
    h = hashlib.sha256(repr(sorted(edits.items())).encode() + _tree_hash().encode()).hexdigest()[:16]
    tree = cache_dir() / "variants" / h
    if not (tree / "done").exists():
        if tree.exists():
            _sh.rmtree(tree)
        _sh.copytree(ROOT / "csrc", tree / "csrc")
        for rel, (old, new) in edits.items():
            f = tree / "csrc" / rel
            text = f.read_text()
            if text.count(old) != 1:
                raise ValueError(f"variant edit of {rel}: {old!r} occurs {text.count(old)} times")
            f.write_text(text.replace(old, new))
        (tree / "done").write_text("")
    p = tree / "csrc" / "hip_fmha" / "instances" / f"{name}.hip"
    if not p.exists():
        p = tree / "csrc" / "hip_fmha" / f"{name}.hip"
    return build(p, arch, root=tree)
