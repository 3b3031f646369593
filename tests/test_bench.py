"""The benchmark's bookkeeping: the commit in its header (from a clean clone too), its
warning when the measured matmul ceiling was beaten, the CPU note, and a tiny CPU run
end to end (the timings themselves are not tested: speed is shown by runs, not tests)."""

import io
import json
import pathlib
import re
import sys

import pytest
import torch

import fmha
from fmha.bench import __main__ as bench


def test_build_records_its_commit():
    # CMakeLists.txt writes fmha/_build_info.py at configure time: a hash when the tree it
    # was built from is a git checkout (as this one is when .git is here: CI's clean clone),
    # "unknown" only for a copy without .git (the GPU machine's).
    from fmha import _build_info
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?|unknown", _build_info.COMMIT), _build_info.COMMIT
    if (pathlib.Path(__file__).resolve().parent.parent / ".git").exists():
        assert _build_info.COMMIT != "unknown", "built from a git checkout, yet no commit recorded"


def test_commit_falls_back_to_the_build(monkeypatch):
    monkeypatch.delenv("FMHA_BENCH_COMMIT", raising=False)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(bench.subprocess, "run", no_git)
    from fmha import _build_info
    assert bench._commit() == _build_info.COMMIT
    monkeypatch.setenv("FMHA_BENCH_COMMIT", "abc1234")
    assert bench._commit() == "abc1234"


def test_progress_bar_only_on_a_terminal(monkeypatch):
    # A redirected run (tools/bench_tables.sh's terminal.txt) gets no bars; a terminal does.
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(bench._progress(range(3), "shapes")) == [0, 1, 2]
        assert ("shapes" in stream.getvalue()) == drawn, stream.getvalue()


def test_ceiling_note():
    rows = [{"suite": "training", "mode": "fwd", "case": "B=1 S=128", "tflops": {"fmha": 0.5, "torch-flash": 2.0}}]
    assert bench._ceiling_note({"matmul_tflops": 3.0}, rows) is None
    note = bench._ceiling_note({"matmul_tflops": 1.0}, rows)
    assert note and "torch-flash" in note and "not one" in note


def test_tiny_cpu_run(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--quick", "--suites", "training", "--modes", "fwd", "--seqlens", "128",
                     "--head-dims", "64", "--peers", "torch-math", "--budget", "0.02", "--out", str(out)])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    assert payload["meta"]["commit"] not in ("", None)
    assert any("reference implementation" in n for n in payload["meta"]["notes"])
    assert payload["results"] and all(r["tflops"].get("fmha", 0) > 0 for r in payload["results"])
    md = (out / "results.md").read_text()
    assert f"commit {payload['meta']['commit']}" in md and "reference implementation" in md
    assert fmha.__version__ in capsys.readouterr().out


def test_peer_errors(tmp_path, monkeypatch):
    # Another library refusing a shape in its own exception type (FlashAttention-4 raises
    # several) is a skipped cell with the reason, not the end of the run; fmha refusing in
    # anything but RuntimeError is a bug and stops it.
    from fmha.bench.peers import Peer

    def refuse(q, k, v, causal):
        raise AssertionError("head dim not supported")

    def fmha_bug(q, k, v, causal):
        raise TypeError("bug")

    args = ["--device", "cpu", "--quick", "--suites", "training", "--modes", "fwd", "--seqlens", "128",
            "--head-dims", "64", "--budget", "0.01", "--out", str(tmp_path / "bench")]
    real = bench.peers
    monkeypatch.setattr(bench, "peers", lambda device: real(device)[:1] + [Peer("other", "bshd", refuse)])
    assert bench.main(args) == 0
    rows = json.loads((tmp_path / "bench" / "results.json").read_text())["results"]
    assert rows and all(r["skipped"]["other"] == "head dim not supported" and r["tflops"]["fmha"] > 0 for r in rows)
    monkeypatch.setattr(bench, "peers", lambda device: real(device)[:1] + [Peer("fmha-x", "bshd", fmha_bug)])
    with pytest.raises(TypeError, match="bug"):
        bench.main(args)


def test_flash_attn_4_alone_is_not_taken_for_flash_attn_2(tmp_path, monkeypatch):
    # flash-attn-4 installs flash_attn as a namespace package with only flash_attn.cute; the
    # FlashAttention-2 peer must then be absent rather than crash the benchmark.
    import importlib
    import sys

    import pytest

    from fmha.bench import peers
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("a flash_attn package is installed here")
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    importlib.invalidate_caches()
    assert importlib.util.find_spec("flash_attn") is not None
    assert peers._fa2_func() is None


def test_model_suite_cpu(tmp_path, capsys):
    # The end-to-end suite on a small Llama: fmha and transformers' sdpa, losses compared
    # before any time is reported, a table in results.md.
    import pytest
    pytest.importorskip("transformers")
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--suites", "model", "--budget", "0.01", "--out", str(out)])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    (row,) = [r for r in payload["results"] if r["suite"] == "model"]
    assert set(row["ms"]) == {"fmha", "sdpa"} and row["loss_gap"] < 1e-4
    assert "End to end: one training step" in (out / "results.md").read_text()


def test_context_parallel_suite_cpu(tmp_path, capsys):
    # The context-parallel suite on the CPU: the ring simulated on one device (labelled so),
    # its output checked against fmha's single call before any time, a table in results.md.
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--quick", "--suites", "context_parallel", "--budget", "0.01",
                     "--out", str(out)])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    rows = [r for r in payload["results"] if r["suite"] == "context_parallel"]
    assert {r["mode"] for r in rows} == {"fwd", "fwd_bwd"}
    for r in rows:
        assert r["simulated"] and r["world"] == 2 and r["rel_err"] < 1e-4
        assert all(r["ms"][k] > 0 for k in ("ring", "compute", "comm", "single")) and r["efficiency"] > 0
    md = (out / "results.md").read_text()
    assert "Context parallel" in md and "simulated on one device" in md
    assert "simulated on one device" in capsys.readouterr().out


def test_context_parallel_seqlens(tmp_path):
    # --seqlens picks the context-parallel suite's total lengths, and a length the zigzag
    # chunks (2W of them) do not divide is refused with the rule, not run.
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--suites", "context_parallel", "--modes", "fwd", "--budget", "0.01",
                     "--seqlens", "128", "--out", str(out)])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    assert [r["case"].split()[0] for r in payload["results"] if r["suite"] == "context_parallel"] == ["S=128"]
    with pytest.raises(ValueError, match="multiple of 4"):
        bench.main(["--device", "cpu", "--suites", "context_parallel", "--seqlens", "130", "--out", str(out)])


def test_paged_prefill_suite_cpu(tmp_path, capsys):
    # Chunked prefill over paged caches (pages of 16 and 32 on the CPU) against the same work
    # on contiguous varlen tensors: checked first, then timed, then the ratio in results.md.
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--suites", "paged_prefill", "--budget", "0.01", "--out", str(out)])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    rows = [r for r in payload["results"] if r["suite"] == "paged_prefill"]
    assert [r["page"] for r in rows] == [16, 32]
    for r in rows:
        assert set(r["ms"]) == {"fmha-paged", "fmha-contiguous"} and r["paged_over_contiguous"] > 0
        assert r["fmha_rel_err"] < 1e-5
    assert "Chunked prefill over a paged cache" in (out / "results.md").read_text()
    assert "paged / contiguous" in capsys.readouterr().out


def test_decode_suite_cpu(tmp_path):
    # Grouped heads (8 query heads over 2 KV heads on the CPU), contiguous and paged 16: fmha
    # checked against torch's SDPA with K and V repeated per group (on every torch release,
    # 2.4 included), then timed; torch's own peer runs where its SDPA takes grouped heads.
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--quick", "--suites", "decode", "--budget", "0.01", "--out", str(out)])
    assert rc == 0
    rows = [r for r in json.loads((out / "results.json").read_text())["results"] if r["suite"] == "decode"]
    assert rows and {r["page"] for r in rows} == {None, 16}
    for r in rows:
        assert r["fmha_rel_err"] < 1e-4 and r["gbps"]["fmha"] > 0
        sdpa_gqa = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)
        assert ("torch-math" in r["ms"]) == (sdpa_gqa and r["page"] is None)


def test_cpu_peers_alternate_in_rounds(monkeypatch):
    # On the CPU each peer's timed runs come in CPU_ROUNDS rounds that alternate between the
    # peers (one library is never timed alone in one window of the machine's speed), and
    # the result is the median over all of its runs; a GPU times each peer once.
    import torch
    from fmha.bench.peers import Case, Peer

    order = []
    runs = {"fmha": [1.0, 2.0, 9.0], "other": [4.0]}
    monkeypatch.setattr(bench, "peer_calls", lambda peer, case, device, mode: peer.name)
    monkeypatch.setattr(bench.timing, "run_ms", lambda name, device, budget_s: order.append(name) or runs[name])
    peers = [Peer("fmha", "bshd", None), Peer("other", "bshd", None),
             Peer("never", "bshd", None, unsupported=lambda case: "no such shape")]
    case = Case(1, 128, 1, 64, False, torch.float32)
    ms, skipped = bench.time_peers(peers, case, torch.device("cpu"), "fwd", 1.0)
    assert bench.CPU_ROUNDS > 1 and order == ["fmha", "other"] * bench.CPU_ROUNDS
    assert ms == {"fmha": 2.0, "other": 4.0} and skipped == {"never": "no such shape"}
    order.clear()
    bench.time_peers(peers, case, torch.device("meta"), "fwd", 1.0)
    assert order == ["fmha", "other"]
