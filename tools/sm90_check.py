#!/usr/bin/env python3
"""On an sm_90 GPU: the forward of both CUDA paths (the sm_90a wgmma kernel, and the
mma.sync kernels forced by FMHA_FORCE_MMA_SYNC=1) against the float64 reference, over
the features the sm_90a kernel takes, one line per problem.  A quick first look when a
kernel changes (the test suite is the full check; this names the problem that fails).

    python tools/sm90_check.py [--quick]
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import fmha  # noqa: E402
from reference import attention_ref  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel(a, r):
    a, r = a.double().cpu(), r.double().cpu()
    if not torch.isfinite(a).all():
        return math.inf
    return ((a - r).norm() / max(r.norm().item(), 1e-30)).item()


def lse_err(lse, ref):
    if lse is None:
        return 0.0
    lse, ref = lse.double().cpu(), ref.double().cpu()
    empty = torch.isneginf(ref)
    if not torch.equal(torch.isneginf(lse), empty) or torch.isnan(lse).any():
        return math.inf
    return rel(lse[~empty], ref[~empty]) if (~empty).any() else 0.0


def run(path, fn):
    """(out, lse, names of the CUDA kernels the call launched)."""
    if path == "mma":
        os.environ["FMHA_FORCE_MMA_SYNC"] = "1"
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out, lse = fn()
        return out, lse, {e.name for e in prof.events() if "fmha" in e.name}
    finally:
        os.environ.pop("FMHA_FORCE_MMA_SYNC", None)


def fixed_case(dtype, b, sq, sk, hq, hk, d, **opts):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    ref_opts = {n: x.cpu() if isinstance(x, torch.Tensor) else x for n, x in opts.items()}
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), **ref_opts)

    def call():
        torch.cuda.synchronize()
        out, lse, _ = fmha.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
        torch.cuda.synchronize()
        return out, lse
    return call, ref_out, ref_lse, dtype


def sdpa_case(dtype, b, sq, sk, h, d):
    """torch's (B, H, S, D) layout (head stride > row stride) and top-left causal."""
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, h, sk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, h, sk, d, device="cuda", dtype=dtype)
    tr = lambda x: x.transpose(1, 2).cpu()  # noqa: E731
    ref_out, _ = attention_ref(tr(q), tr(k), tr(v), causal=True, top_left=True)

    def call():
        torch.cuda.synchronize()
        out = fmha.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        torch.cuda.synchronize()
        return out, None
    return call, ref_out, None, dtype


def varlen_case(dtype, lens_q, lens_k, hq, hk, d, **opts):
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cq[-1]), hq, d, device="cuda", dtype=dtype)
    k = torch.randn(int(ck[-1]), hk, d, device="cuda", dtype=dtype)
    v = torch.randn(int(ck[-1]), hk, d, device="cuda", dtype=dtype)
    ref_out, ref_lse = attention_ref(q.cpu(), k.cpu(), v.cpu(), cu_seqlens_q=cq, cu_seqlens_k=ck, **opts)

    def call():
        torch.cuda.synchronize()
        out, lse, _ = fmha.flash_attn_varlen_func(q, k, v, cq.cuda(), ck.cuda(), max(lens_q), max(lens_k),
                                                  return_attn_probs=True, **opts)
        torch.cuda.synchronize()
        return out, lse
    return call, ref_out, ref_lse, dtype


def cases(quick):
    bf, fp = torch.bfloat16, torch.float16
    yield "D128 S256", fixed_case(bf, 1, 256, 256, 2, 2, 128)
    yield "D128 S1", fixed_case(bf, 2, 1, 1, 2, 2, 128)
    yield "D128 S300 causal", fixed_case(bf, 2, 300, 300, 3, 3, 128, causal=True)
    for d in (64, 96, 128, 192, 256, 40, 80, 136, 200):
        for dt in (bf, fp):
            yield f"D{d} {dt} S333/517 causal GQA4", fixed_case(dt, 2, 333, 517, 8, 2, d, causal=True)
    if quick:
        return
    for d in (64, 128, 256):
        yield f"D{d} S1000 noncausal", fixed_case(bf, 1, 1000, 1000, 4, 4, d)
        yield f"D{d} Sq>Sk causal (empty rows)", fixed_case(bf, 2, 200, 70, 2, 2, d, causal=True)
        yield f"D{d} window (64, 0)", fixed_case(bf, 2, 400, 400, 2, 1, d, window_size=(64, 0))
        yield f"D{d} window (30, 50)", fixed_case(fp, 2, 257, 300, 2, 2, d, window_size=(30, 50))
        yield f"D{d} softcap", fixed_case(bf, 2, 260, 260, 2, 2, d, softcap=5.0, causal=True)
        slopes = torch.rand(4, device="cuda") * 0.3
        yield f"D{d} alibi", fixed_case(fp, 2, 200, 240, 4, 2, d, alibi_slopes=slopes, causal=True)
        yield f"D{d} varlen", varlen_case(bf, [5, 0, 300, 129, 1], [7, 3, 280, 0, 400], 4, 2, d, causal=True)
        yield f"D{d} varlen noncausal", varlen_case(fp, [130, 64, 0, 257], [90, 513, 10, 128], 2, 2, d)
        yield f"D{d} SDPA layout, top-left causal", sdpa_case(bf, 2, 300, 500, 2, d)
        yield f"D{d} long", fixed_case(bf, 1, 4100, 4100, 2, 2, d, causal=True)
        yield f"D{d} many tiles per CTA", fixed_case(bf, 3, 1500, 1500, 40, 8, d, causal=True)
        yield f"D{d} many tiles, Sq > Sk", fixed_case(fp, 4, 1100, 300, 40, 40, d, causal=True)


def diagnose(out, ref):
    """Where a wrong output is wrong: error by 16-row group and by 8-column group."""
    o = out.double().cpu().reshape(-1, out.shape[-2], out.shape[-1])
    r = ref.double().cpu().reshape(-1, ref.shape[-2], ref.shape[-1])
    rows = o.shape[0]
    by_row = [((o[i:i + 16] - r[i:i + 16]).norm() / r[i:i + 16].norm().clamp_min(1e-30)).item()
              for i in range(0, min(rows, 256), 16)]
    by_col = [((o[..., j:j + 8] - r[..., j:j + 8]).norm() / r[..., j:j + 8].norm().clamp_min(1e-30)).item()
              for j in range(0, o.shape[-1], 8)]
    print("  rel err by 16 rows:", " ".join(f"{e:.1e}" for e in by_row))
    print("  rel err by 8 cols: ", " ".join(f"{e:.1e}" for e in by_col))
    print("  out[0, 0, :8]:", o[0, 0, :8].tolist())
    print("  ref[0, 0, :8]:", r[0, 0, :8].tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    failed = 0
    print(f"{'problem':42s} {'sm90 out':>9s} {'sm90 lse':>9s} {'mma out':>9s} {'mma lse':>9s}")
    for name, (call, ref_out, ref_lse, dtype) in cases(args.quick):
        errs, ran_sm90 = [], []
        for path in ("sm90", "mma"):
            out, lse, kernels = run(path, call)
            errs += [rel(out, ref_out), lse_err(lse, ref_lse)]
            ran_sm90.append(any("fwd_sm90_kernel" in k for k in kernels))
            if path == "sm90":
                sm90_out = out
        ok = errs[0] <= TOL[dtype] and errs[1] <= 1e-4 and errs[2] <= TOL[dtype] and ran_sm90 == [True, False]
        failed += not ok
        print(f"{name:42s} " + " ".join(f"{e:9.2e}" for e in errs) + ("" if ok else f"  FAIL (sm90 kernel ran: {ran_sm90})"), flush=True)
        if not ok and failed <= 3 and errs[0] > TOL[dtype]:
            diagnose(sm90_out, ref_out)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
