"""The documentation's Python code runs: every ```python block of README.md and docs/*.md is
preceded by a `<!-- doc-test: NAME -->` marker, and the test executes it on the CPU in a
fresh namespace from the setup NAME below (the tensors a reader would have at that point),
or skips it for the reason written after `skip`; examples/python/*.py run as scripts.  A
block without a marker fails the test, so new examples cannot escape it."""

import pathlib
import re
import runpy
import sys

import pytest
import torch

import fmha

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- doc-test: (.+?) -->")


def _blocks():
    """(file, line, marker or None, code) of every python block."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            m = MARKER.search(prev)
            yield path.relative_to(ROOT), i + 1, m.group(1) if m else None, "\n".join(lines[i + 1:end])


def _training():
    q, k, v = (torch.randn(2, 96, 4, 32) for _ in range(3))
    return dict(q=q, k=k, v=v, slopes=torch.rand(4))


def _padded():
    batch, seqlen = 3, 20
    mask = torch.ones(batch, seqlen, dtype=torch.int32)
    mask[1, 13:] = 0
    mask[2, 4:] = 0
    q, k, v = (torch.randn(batch, seqlen, 4, 32) for _ in range(3))
    return dict(q=q, k=k, v=v, attention_mask=mask, batch=batch, seqlen=seqlen,
                flash_attn_varlen_func=fmha.flash_attn_varlen_func)


def _check_padded(ns):
    # The varlen result equals each sequence on its own, and padding rows are zero.
    out, mask = ns["out"], ns["attention_mask"].bool()
    for b in range(ns["batch"]):
        n = int(mask[b].sum())
        alone = fmha.flash_attn_func(ns["q"][b:b + 1, :n], ns["k"][b:b + 1, :n], ns["v"][b:b + 1, :n], causal=True)
        torch.testing.assert_close(out[b:b + 1, :n], alone)
        assert (out[b, n:] == 0).all()


def _sdpa():
    q = torch.randn(2, 8, 50, 32)
    k, v = torch.randn(2, 2, 50, 32), torch.randn(2, 2, 50, 32)
    return dict(q=q, k=k, v=v)


def _decode():
    batch, hk, d, page = 2, 2, 64, 16
    pages = torch.arange(2 * 4, dtype=torch.int32).flip(0).view(batch, 4)
    return dict(q=torch.randn(batch, 1, 8, d, dtype=torch.bfloat16),
                k_cache=torch.randn(8, page, hk, d, dtype=torch.bfloat16),
                v_cache=torch.randn(8, page, hk, d, dtype=torch.bfloat16),
                k_new=torch.randn(batch, 1, hk, d, dtype=torch.bfloat16),
                v_new=torch.randn(batch, 1, hk, d, dtype=torch.bfloat16),
                lengths=torch.tensor([20, 33], dtype=torch.int32), pages=pages,
                cos=torch.randn(64, d // 2, dtype=torch.bfloat16), sin=torch.randn(64, d // 2, dtype=torch.bfloat16),
                torch=torch)


def _ops():
    q, k, v = (torch.randn(2, 50, 4, 32) for _ in range(3))
    return dict(q=q, k=k, v=v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=50,
                max_seqlen_k=50, scale=32 ** -0.5, softcap=0.0, window_left=-1, window_right=0, top_left=False,
                alibi_slopes=None, dropout_p=0.0, deterministic=False, return_probs=False, rng_state=None)


SETUPS = {"plain": dict, "training": _training, "padded": _padded, "sdpa": _sdpa, "decode": _decode, "ops": _ops}
CHECKS = {"padded": _check_padded}
BLOCKS = list(_blocks())


def test_every_block_has_a_marker():
    missing = [f"{path}:{line}" for path, line, marker, _ in BLOCKS if marker is None]
    assert not missing, f"python blocks without a <!-- doc-test: ... --> marker: {missing}"
    unknown = [f"{path}:{line} ({marker})" for path, line, marker, _ in BLOCKS
               if marker and not marker.startswith("skip") and marker not in SETUPS]
    assert not unknown, f"unknown doc-test setups: {unknown}"


@pytest.mark.parametrize("path,line,marker,code", BLOCKS, ids=[f"{p.name}:{n}" for p, n, _, _ in BLOCKS])
def test_block_runs(path, line, marker, code):
    if marker is None or marker not in SETUPS:
        pytest.skip(marker or "no marker (test_every_block_has_a_marker fails)")
    if "activate_flash_attention_impl" in code and not hasattr(getattr(torch.nn, "attention", None), "activate_flash_attention_impl"):
        pytest.skip("torch's flash-attention registry needs torch 2.11+")
    ns = {"torch": torch, "fmha": fmha, **SETUPS[marker]()}
    try:
        exec(compile(code, f"{path}:{line}", "exec"), ns)
    finally:
        if "torch.nn.attention" in code and hasattr(torch.nn.attention, "current_flash_attention_impl") \
                and torch.nn.attention.current_flash_attention_impl() is not None:
            torch.nn.attention.restore_flash_attention_impl()
    if marker in CHECKS:
        CHECKS[marker](ns)


EXAMPLES = sorted((ROOT / "examples" / "python").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--device", "cpu"])
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.strip(), f"{script.name} printed nothing"
