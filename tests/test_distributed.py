"""fmha.distributed against single-process fmha on the whole sequence.

Each world size is one set of processes (gloo on the CPU; NCCL, one GPU per rank, on CUDA),
spawned by the module's fixture as subprocesses of this file and bounded by a timeout, so a
hang fails instead of blocking.  Every rank runs every case: the whole-sequence reference
(fmha.flash_attn_func / flash_attn_varlen_func, out, LSE and the gradients of q, k, v under a
loss that also weighs the LSE), its own shard of the inputs, the distributed function, and a
comparison of its local rows; it writes one line per case, which the parametrized tests read.
The planner of the ring's block calls is checked exhaustively against brute-force masks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 150

FIXED = ("ring", "zigzag", "stripe")


def _cases(device: str):
    """Case specs (names are the test ids)."""
    cases = []
    dtypes = ["float32", "bfloat16"] if device == "cpu" else ["bfloat16", "float16"]
    for layout in FIXED:
        for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (True, (5, 0)), (False, (3, 6))):
            for dtype in dtypes:
                if dtype != dtypes[0] and window != (-1, -1):
                    continue
                cases.append(dict(kind="fixed", layout=layout, causal=causal, window=window, dtype=dtype, H=4,
                                  Hk=2, pack=None))
        cases.append(dict(kind="fixed", layout=layout, causal=True, window=(-1, -1), dtype=dtypes[0], H=2, Hk=2,
                          pack="qkv", softcap=5.0))
        cases.append(dict(kind="fixed", layout=layout, causal=True, window=(9, 0), dtype=dtypes[0], H=4, Hk=1,
                          pack="kv"))
    for layout in ("ring", "zigzag"):
        for causal in (False, True):
            for dtype in dtypes:
                cases.append(dict(kind="varlen", layout=layout, causal=causal, window=(-1, -1), dtype=dtype, H=4,
                                  Hk=2, pack=None))
        cases.append(dict(kind="varlen", layout=layout, causal=True, window=(-1, -1), dtype=dtypes[0], H=2, Hk=2,
                          pack="qkv"))
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (4, 0))):
        for stride in (1, 2):
            cases.append(dict(kind="llama3", causal=causal, window=window, dtype=dtypes[0], H=4, Hk=2, pack=None,
                              stride=stride))
    cases.append(dict(kind="llama3", causal=True, window=(-1, -1), dtype=dtypes[-1], H=4, Hk=2, pack="kv",
                      stride=1))
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (6, 0))):
        cases.append(dict(kind="ulysses", causal=causal, window=window, dtype=dtypes[0], H=4, Hk=4, pack=None))
    cases.append(dict(kind="ulysses", causal=True, window=(-1, -1), dtype=dtypes[-1], H=8, Hk=4, pack="kv",
                      softcap=3.0))
    # Ulysses over packed documents (rows of the whole batch, documents crossing ranks).
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (4, 0)), (False, (3, 5))):
        cases.append(dict(kind="ulysses_varlen", causal=causal, window=window, dtype=dtypes[0], H=4, Hk=4,
                          pack=None))
    cases.append(dict(kind="ulysses_varlen", causal=True, window=(-1, -1), dtype=dtypes[-1], H=8, Hk=4, pack="kv",
                      softcap=3.0))
    cases.append(dict(kind="ulysses_varlen", causal=True, window=(-1, -1), dtype=dtypes[0], H=4, Hk=4, pack="qkv"))
    cases.append(dict(kind="ulysses_varlen", causal=True, window=(-1, -1), dtype=dtypes[0], H=8, Hk=4, pack=None,
                      alibi=True))
    # Ulysses x ring: a 2 x 2 mesh on 4 ranks, 2 x 1 on 2 (mesh "ring": 1 x W, the ring alone).
    for layout in FIXED:
        for causal, window in ((True, (-1, -1)), (False, (3, 6))):
            cases.append(dict(kind="usp", layout=layout, causal=causal, window=window, dtype=dtypes[0], H=4, Hk=2,
                              pack=None))
    cases.append(dict(kind="usp", layout="zigzag", causal=True, window=(5, 0), dtype=dtypes[-1], H=4, Hk=2,
                      pack="kv", softcap=2.0))
    cases.append(dict(kind="usp", layout="stripe", causal=True, window=(-1, -1), dtype=dtypes[0], H=2, Hk=2,
                      pack="qkv", mesh="ring"))
    cases.append(dict(kind="errors"))
    if device == "cuda":
        cases.append(dict(kind="torch_cp"))
    for c in cases:
        if c["kind"] in ("errors", "torch_cp"):
            c["name"] = c["kind"]
            continue
        parts = [c["kind"], c.get("layout", ""), "causal" if c["causal"] else "full",
                 "" if c["window"] == (-1, -1) else "w%d_%d" % tuple(c["window"]), c["dtype"],
                 f"h{c['H']}_{c['Hk']}", c["pack"] or "", f"s{c['stride']}" if "stride" in c else "",
                 "softcap" if c.get("softcap") else "", "alibi" if c.get("alibi") else "", c.get("mesh", "")]
        c["name"] = "-".join(p for p in parts if p)
    return cases


# --------------------------------------------------------------------------------------
# The worker (runs in each spawned process).


def _tol(dtype):
    return {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (1e-2, 1e-2)}[dtype]


def _close(name, got, want, dtype, errors):
    atol, rtol = _tol(dtype)
    got, want = got.float(), want.float()
    fin = torch.isfinite(want)
    if not torch.equal(fin, torch.isfinite(got)) or not torch.equal(want[~fin], got[~fin]):
        errors.append(f"{name}: non-finite entries differ")
        return
    if got.numel() and not torch.allclose(got[fin], want[fin], atol=atol, rtol=rtol):
        errors.append(f"{name}: max abs diff {(got[fin] - want[fin]).abs().max().item():.3g}")


def _run_case(c, rank, world, device):
    import fmha
    import fmha.distributed as fd

    torch.manual_seed(zlib.crc32(c["name"].encode()))
    if c["kind"] == "errors":
        return _errors(rank, world, device)
    if c["kind"] == "torch_cp":
        return _torch_cp(rank, world, device)
    dtype = getattr(torch, c["dtype"])
    H, Hk, D = c["H"], c["Hk"], (16 if device == "cpu" else 64)
    softcap = c.get("softcap", 0.0)
    errors = []

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    if c["kind"] in ("fixed", "ulysses", "usp"):
        B, S = 2, 6 * world if c["kind"] == "ulysses" else 8 * world
        if device != "cpu":
            S = 64 * world
        q, k, v, do = randn(B, S, H, D), randn(B, S, Hk, D), randn(B, S, Hk, D), randn(B, S, H, D)
        dl = torch.randn(B, H, S, device=device)
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse, _ = fmha.flash_attn_func(*full, causal=c["causal"], window_size=c["window"], softcap=softcap,
                                           return_attn_probs=True)
        (out.float() * do.float()).sum().add_((torch.nan_to_num(lse, neginf=0.0) * dl).sum()).backward()
        layout = c.get("layout", "ring")
        sh = lambda x, dim=1: fd.shard(x, rank, world, layout, dim)  # noqa: E731
        kw = {}
        if c["kind"] == "usp":
            U = 1 if c.get("mesh") == "ring" or world % 2 else 2
            ug, rg = _mesh(U, world // U)
            kw = dict(ulysses_group=ug, ring_group=rg, layout=layout)
            sh = lambda x, dim=1: fd.usp_shard(x, rank % U, U, rank // U, world // U, layout, dim)  # noqa: E731
        loc = [sh(x).detach().clone() for x in (q, k, v)]
        func = {"ring": "ring_flash_attn", "zigzag": "zigzag_ring_flash_attn", "stripe": "stripe_flash_attn"}
        base = {"fixed": func[layout], "ulysses": "ulysses_flash_attn", "usp": "usp_flash_attn"}[c["kind"]]
        if c["pack"] == "qkv":
            packed = torch.stack(loc, dim=2).requires_grad_()
            args = (packed,)
            grads = lambda: packed.grad.unbind(2)  # noqa: E731
            fn = getattr(fd, base + "_qkvpacked_func")
        elif c["pack"] == "kv":
            lq, packed = loc[0].requires_grad_(), torch.stack(loc[1:], dim=2).requires_grad_()
            args = (lq, packed)
            grads = lambda: (lq.grad,) + tuple(packed.grad.unbind(2))  # noqa: E731
            fn = getattr(fd, base + "_kvpacked_func")
        else:
            args = tuple(x.requires_grad_() for x in loc)
            grads = lambda: tuple(x.grad for x in args)  # noqa: E731
            fn = getattr(fd, base + "_func")
        o, l, _ = fn(*args, causal=c["causal"], window_size=c["window"], return_attn_probs=True, softcap=softcap,
                     **kw)
        (o.float() * sh(do).float()).sum().add_((torch.nan_to_num(l, neginf=0.0) * sh(dl, 2)).sum()).backward()
        _close("out", o, sh(out), dtype, errors)
        _close("lse", l, sh(lse, 2), torch.float32 if dtype == torch.float32 else dtype, errors)
        for n, g, x in zip(("dq", "dk", "dv"), grads(), full):
            _close(n, g, sh(x.grad), dtype, errors)
        return errors

    if c["kind"] in ("varlen", "llama3", "ulysses_varlen"):
        lengths = [2 * world, 6 * world, 0, 4 * world] if c["kind"] == "varlen" else [5, 3 * world + 1, 6 * world - 6]
        if device != "cpu":
            lengths = [x * 16 for x in lengths]
        cu = torch.tensor([0] + lengths, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
        T, maxlen = int(cu[-1]), max(lengths)
        q, k, v, do = randn(T, H, D), randn(T, Hk, D), randn(T, Hk, D), randn(T, H, D)
        dl = torch.randn(H, T, device=device)
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        alibi = {"alibi_slopes": torch.rand(H, device=device)} if c.get("alibi") else {}
        out, lse, _ = fmha.flash_attn_varlen_func(*full, cu, cu, maxlen, maxlen, causal=c["causal"],
                                                  window_size=c["window"], softcap=softcap, return_attn_probs=True,
                                                  **alibi)
        (out.float() * do.float()).sum().add_((torch.nan_to_num(lse, neginf=0.0) * dl).sum()).backward()
        if c["kind"] == "varlen":
            pos = fd.varlen_positions(cu.tolist(), rank, world, c["layout"]).to(device)
            _, lcu, lmax = fd.shard_varlen(q, cu, rank, world, c["layout"])
            extra = (lcu, lmax)
            base = "ring_flash_attn_varlen" if c["layout"] == "ring" else "zigzag_ring_flash_attn_varlen"
        elif c["kind"] == "llama3":
            n = T // world
            pos = torch.arange(rank * n, (rank + 1) * n, device=device)
            cq, ck, mq, mk, ks = fd.llama3_flash_attn_prepare_cu_seqlens(cu, c["causal"], rank, world)
            extra = (cq, ck, mq, mk, c["stride"], ks)
            base = "llama3_flash_attn_varlen"
        else:  # ulysses_varlen: rows of the whole batch, with its cu_seqlens
            n = T // world
            pos = torch.arange(rank * n, (rank + 1) * n, device=device)
            extra = (cu, maxlen)
            base = "ulysses_flash_attn_varlen"
        sh = lambda x, dim=0: x.index_select(dim, pos)  # noqa: E731
        loc = [sh(x).detach().clone() for x in (q, k, v)]
        if c["pack"] == "qkv":
            packed = torch.stack(loc, dim=1).requires_grad_()
            args = (packed,)
            grads = lambda: packed.grad.unbind(1)  # noqa: E731
            fn = getattr(fd, base + "_qkvpacked_func")
        elif c["pack"] == "kv":
            lq, packed = loc[0].requires_grad_(), torch.stack(loc[1:], dim=1).requires_grad_()
            args = (lq, packed)
            grads = lambda: (lq.grad,) + tuple(packed.grad.unbind(1))  # noqa: E731
            fn = getattr(fd, base + "_kvpacked_func")
        else:
            args = tuple(x.requires_grad_() for x in loc)
            grads = lambda: tuple(x.grad for x in args)  # noqa: E731
            fn = getattr(fd, base + "_func")
        o, l, _ = fn(*args, *extra, causal=c["causal"], window_size=c["window"], return_attn_probs=True,
                     softcap=softcap, **alibi)
        (o.float() * sh(do).float()).sum().add_((torch.nan_to_num(l, neginf=0.0) * sh(dl, 1)).sum()).backward()
        _close("out", o, sh(out), dtype, errors)
        _close("lse", l, sh(lse, 1), torch.float32 if dtype == torch.float32 else dtype, errors)
        for n, g, x in zip(("dq", "dk", "dv"), grads(), full):
            _close(n, g, sh(x.grad), dtype, errors)
        return errors


_MESHES = {}


def _mesh(ulysses: int, ring: int):
    """(Ulysses group, ring group) of this rank on a ulysses x ring mesh (rank = r U + u).
    new_group is collective: every rank creates every group, in the same order."""
    import torch.distributed as dist

    if (ulysses, ring) not in _MESHES:
        rank, groups = dist.get_rank(), [None, None]
        for r in range(ring):
            g = dist.new_group([r * ulysses + u for u in range(ulysses)])
            groups[0] = g if rank // ulysses == r else groups[0]
        for u in range(ulysses):
            g = dist.new_group([r * ulysses + u for r in range(ring)])
            groups[1] = g if rank % ulysses == u else groups[1]
        _MESHES[(ulysses, ring)] = tuple(groups)
    return _MESHES[(ulysses, ring)]


def _cp_unshard():
    """torch's context_parallel_unshard: public in some releases, only in the private module in
    others (2.13 keeps it in experimental._context_parallel, earlier ones in _attention)."""
    import importlib

    for mod in ("torch.distributed.tensor.experimental", "torch.distributed.tensor.experimental._context_parallel",
                "torch.distributed.tensor.experimental._attention"):
        try:
            return getattr(importlib.import_module(mod), "context_parallel_unshard")
        except (ImportError, AttributeError):
            pass
    return None


def _torch_cp(rank, world, device):
    """torch's own context parallel API (torch.distributed.tensor.experimental.context_parallel)
    with fmha active as SDPA's flash implementation: out and gradients against fmha on the
    whole sequence.  CUDA only: on the CPU torch's CP has no rule for SDPA's CPU op."""
    import fmha
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    errors = []
    B, H, S, D = 1, 4, 256 * world, 64
    q, k, v, do = (torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16) for _ in range(4))
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = fmha.scaled_dot_product_attention(*full, is_causal=True)
    ref.backward(do)
    handle = fmha.use_as_sdpa_backend()
    try:
        mesh = init_device_mesh("cuda", (world,))
        cq, ck, cv, cdo = (x.clone() for x in (q, k, v, do))
        with context_parallel(mesh, buffers=[cq, ck, cv, cdo], buffer_seq_dims=[2, 2, 2, 2]):
            for x in (cq, ck, cv):
                x.requires_grad_()
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
            out.backward(cdo)
            got = [out, cq.grad, ck.grad, cv.grad]
            for x in (cq, ck, cv):  # leaving the context resizes the buffers back, which a leaf
                x.requires_grad_(False)  # that requires grad refuses
        got = _cp_unshard()(mesh, got, [2, 2, 2, 2])
        for n, g, w in zip(("out", "dq", "dk", "dv"), got, [ref] + [x.grad for x in full]):
            _close(n, g, w, torch.bfloat16, errors)
    finally:
        handle.remove()
    return errors


def _errors(rank, world, device):
    """What is not supported raises a ValueError naming it."""
    import torch.distributed as dist

    import fmha.distributed as fd

    errors = []
    x = torch.randn(1, 4 * world, 2, 16, device=device)
    cu = torch.tensor([0, 4 * world], dtype=torch.int32, device=device)
    y = torch.randn(4 * world - 1, world, 16, device=device)  # one row short of cu's total over the ranks
    checks = [
        ("dropout_p", lambda: fd.ring_flash_attn_func(x, x, x, dropout_p=0.1)),
        ("alibi_slopes", lambda: fd.zigzag_ring_flash_attn_func(x, x, x, alibi_slopes=torch.ones(2))),
        ("window_size", lambda: fd.ring_flash_attn_varlen_func(x[0], x[0], x[0], cu // world, 4, causal=True,
                                                               window_size=(2, 0))),
        ("multiple of 2", lambda: fd.zigzag_ring_flash_attn_func(x[:, :3], x[:, :3], x[:, :3])),
        ("multiple of the world size", lambda: fd.ulysses_flash_attn_func(x[:, :, :1], x[:, :, :1], x[:, :, :1])
         if world > 1 else (_ for _ in ()).throw(ValueError("multiple of the world size"))),
        ("ulysses_group or ring_group", lambda: fd.usp_flash_attn_func(x, x, x)),
        ("world size times the local rows", lambda: fd.ulysses_flash_attn_varlen_func(y, y, y, cu, 4 * world)),
        ("Ulysses group's size", lambda: fd.usp_flash_attn_func(x[:, :, :1], x[:, :, :1], x[:, :, :1],
                                                                 ulysses_group=dist.group.WORLD)
         if world > 1 else (_ for _ in ()).throw(ValueError("Ulysses group's size"))),
    ]
    for what, call in checks:
        try:
            call()
            errors.append(f"{what}: no error")
        except ValueError as e:
            if what not in str(e):
                errors.append(f"{what}: message {e}")
    return errors


def _worker(rank, world, port, device, out_path):
    os.environ.setdefault("FMHA_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    results = {}
    for c in _cases(device):
        t0 = time.perf_counter()
        try:
            errs = _run_case(c, rank, world, dev)
            results[c["name"]] = "ok" if not errs else "; ".join(errs)
        except Exception:
            results[c["name"]] = traceback.format_exc(limit=6)
        results[c["name"] + ".s"] = time.perf_counter() - t0
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# The driver (pytest side).


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RUNS = {}


def _spawn(world: int, device: str):
    """{rank: {case: "ok" | error}} from one run of every case on `world` processes."""
    key = (world, device)
    if key in _RUNS:
        return _RUNS[key]
    tmp = tempfile.mkdtemp(prefix="fmha_dist_")
    port = _free_port()
    env = dict(os.environ, FMHA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), str(world), str(port),
                               device, os.path.join(tmp, f"rank{r}.json")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    deadline = time.monotonic() + TIMEOUT_S
    logs, timed_out = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out)
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    results = {}
    for r in range(world):
        path = os.path.join(tmp, f"rank{r}.json")
        results[r] = json.load(open(path)) if os.path.exists(path) else {}
    status = "timed out" if timed_out else "; ".join(f"rank {r} exit {p.returncode}" for r, p in enumerate(procs)
                                                     if p.returncode)
    _RUNS[key] = (results, status, "\n".join(logs)[-3000:])
    return _RUNS[key]


def _check(world, device, name):
    results, status, log = _spawn(world, device)
    for r in range(world):
        got = results[r].get(name)
        assert got == "ok", f"rank {r} of {world} ({device}): {got or 'no result'}; {status}\n{log[-1500:]}"


CPU_CASES = [c["name"] for c in _cases("cpu")]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", CPU_CASES)
def test_cpu_gloo(world, name):
    _check(world, "cpu", name)


def test_cpu_world_of_one():
    # A group of one: the ring is a single local call, the all-to-alls and gathers are copies.
    results, status, log = _spawn(1, "cpu")
    bad = {n: v for n, v in results[0].items() if not n.endswith(".s") and v != "ok"}
    assert results[0] and not bad, f"{str(bad)[:3000]}; {status}\n{log[-1500:]}"


_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", [c["name"] for c in _cases("cuda")] if _CUDA else ["-"])
def test_cuda_nccl(world, name):
    if world > torch.cuda.device_count():
        pytest.skip(f"needs {world} GPUs")
    if name == "torch_cp" and _cp_unshard() is None:
        pytest.skip(f"torch {torch.__version__} has no context_parallel_unshard to gather the shards with")
    _check(world, "cuda", name)


def test_plan_matches_brute_force_masks():
    from fmha.distributed import _plan

    def visible(lq, lk, left, right):
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None]
        m = torch.ones(lq, lk, dtype=torch.bool)
        if left >= 0:
            m &= j >= i - left
        if right >= 0:
            m &= j <= i + right
        return m

    from fmha.distributed.sharding import positions
    for layout in _plan.LAYOUTS:
        for world in (1, 2, 3, 4):
            for local in (2, 6):
                S = world * local
                for left in (-1, 0, 1, 3, 7):
                    for right in (-1, 0, 2):
                        full = visible(S, S, left, right)
                        for r in range(world):
                            pr = positions(S, r, world, layout)
                            for s in range(world):
                                want = full[pr][:, positions(S, s, world, layout)]
                                got = torch.zeros_like(want)
                                for b in _plan.step_plan(layout, r, s, world, local, left, right):
                                    blk = visible(b.q1 - b.q0, b.k1 - b.k0, b.left, b.right)
                                    assert not got[b.q0:b.q1, b.k0:b.k1][blk].any(), "overlapping calls"
                                    got[b.q0:b.q1, b.k0:b.k1] |= blk
                                assert torch.equal(got, want), (layout, world, local, left, right, r, s)


def test_plan_fuses_zigzag_blocks():
    from fmha.distributed._plan import Block, step_plan
    # Own block: one causal call over both chunks; an earlier rank's: all queries over its
    # first chunk; a later rank's: the second chunk of queries over all its keys.
    assert step_plan("zigzag", 1, 1, 2, 8, -1, 0) == (Block(0, 8, 0, 8, -1, 0),)
    assert step_plan("zigzag", 1, 0, 2, 8, -1, 0) == (Block(0, 8, 0, 4, -1, -1),)
    assert step_plan("zigzag", 0, 1, 2, 8, -1, 0) == (Block(4, 8, 0, 8, -1, -1),)
    assert step_plan("ring", 0, 1, 2, 8, -1, 0) == ()           # causal: later keys are skipped
    assert step_plan("ring", 3, 0, 4, 8, 8, 0) == ()            # window of 8: three blocks back is unseen


@pytest.mark.parametrize("row_dim", [1, 0], ids=["fixed", "varlen"])
def test_merge_against_float64(row_dim):
    """The ring's LSE merge on rows that a slice (fixed length) or an index (varlen) picks,
    against the float64 combination; rows empty on one side take the other side as it is,
    rows empty on both stay out 0, lse -inf (never NaN), rows outside the selection keep
    their values."""
    from fmha.distributed._ring import Sel, merge_

    g = torch.Generator().manual_seed(0)
    n, h, d, pick = 24, 3, 8, 16
    shape = (n, h, d) if row_dim == 0 else (1, n, h, d)
    lse_shape = (h, n) if row_dim == 0 else (1, h, n)
    acc_out = torch.randn(shape, generator=g)
    acc_lse = torch.randn(lse_shape, generator=g) * 4
    if row_dim == 0:
        idx = torch.randperm(n, generator=g)[:pick].sort().values
        sel = Sel(slice(None), idx, None, pick, pick)
    else:
        idx = torch.arange(4, 4 + pick)
        sel = Sel(slice(4, 4 + pick), None, None, pick, pick)
    out = torch.randn(shape[:row_dim] + (pick,) + shape[row_dim + 1:], generator=g).bfloat16()
    lse = torch.randn(lse_shape[:-1] + (pick,), generator=g) * 4
    # Empty rows (lse -inf, out 0): in acc only, in the block only, in both.
    for i_sel, acc_empty, blk_empty in ((0, True, False), (1, False, True), (2, True, True)):
        if acc_empty:
            acc_lse[..., idx[i_sel]] = -torch.inf
            acc_out.select(row_dim, int(idx[i_sel])).zero_()
        if blk_empty:
            lse[..., i_sel] = -torch.inf
            out.select(row_dim, i_sel).zero_()
    want_out, want_lse = acc_out.double().clone(), acc_lse.double().clone()
    a_lse, b_lse = acc_lse.double()[..., idx], lse.double()
    new = torch.logaddexp(a_lse, b_lse)
    safe = torch.where(torch.isneginf(new), 0.0, new)
    wa = torch.exp(a_lse - safe).transpose(-1, -2).unsqueeze(-1)
    wb = torch.exp(b_lse - safe).transpose(-1, -2).unsqueeze(-1)
    a_out = acc_out.double().index_select(row_dim, idx)
    want_out.index_copy_(row_dim, idx, a_out * wa + out.double() * wb)
    want_lse[..., idx] = new

    merge_(acc_out, acc_lse, sel, out, lse, row_dim)
    assert not acc_out.isnan().any() and not acc_lse.isnan().any()
    torch.testing.assert_close(acc_lse.double(), want_lse, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(acc_out.double(), want_out, atol=1e-5, rtol=1e-5)
    assert torch.isneginf(acc_lse[..., idx[2]]).all() and (acc_out.select(row_dim, int(idx[2])) == 0).all()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    sys.path.insert(0, HERE)
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
