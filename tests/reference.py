"""Independent references for the fmha tests.

* `attention_ref` / `attention_ref_grads`: attention written with plain torch ops in float64,
  straight from the semantics of docs/api.md, one sequence at a time so every feature
  (varlen, seqused_k, GQA, both mask alignments, windows, softcap, ALiBi, dropout with a
  given keep-mask, empty rows, attention sinks as an extra score column, a V head dim of
  its own) is a few obvious lines.  Gradients come from torch autograd.
* `philox4x32_10` / `dropout_keep_mask`: Philox4x32-10 and the element mapping of
  docs/dropout.md in numpy uint64 arithmetic, vectorized over all elements.

Nothing here imports fmha.
"""

import math

import numpy as np
import torch


# ----------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------


def visible_mask(sq, sk, left=-1, right=-1, top_left=False, device="cpu"):
    """(sq, sk) bool: key j visible to query i iff i + off - left <= j <= i + off + right."""
    off = 0 if top_left else sk - sq
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def _attend_one(q, k, v, scale, softcap, left, right, top_left, slopes, keep, dropout_p, sink=None):
    """One sequence.  q (Sq, Hq, D), k/v (Sk, Hk, D) float64 (v may have its own D); slopes
    (Hq,) or None; keep (Hq, Sq, Sk) bool or None; sink (Hq,) or None: a logit per head
    appended to every row's scores as one more column that carries no value.  Returns out
    (Sq, Hq, Dv), lse (Hq, Sq)."""
    sq, hq, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    if sk == 0:  # nothing to attend to: zero output, LSE -inf (or the sink's), no dependence on q
        lse = q.new_full((hq, sq), -math.inf) if sink is None else sink[:, None].expand(hq, sq)
        return q.new_zeros(sq, hq, v.shape[-1]), lse
    # Query head h reads key/value head h // (Hq // Hk).
    k = k.repeat_interleave(hq // hk, dim=1)
    v = v.repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    off = 0 if top_left else sk - sq
    if slopes is not None:
        i = torch.arange(sq, device=q.device, dtype=q.dtype)[:, None]
        j = torch.arange(sk, device=q.device, dtype=q.dtype)[None, :]
        s = s - slopes[:, None, None] * (i + off - j).abs()
    vis = visible_mask(sq, sk, left, right, top_left, q.device)
    s = s.masked_fill(~vis, -math.inf)
    if sink is not None:  # the sink column: in the denominator, not in P.V
        s = torch.cat([s, sink[:, None, None].expand(hq, sq, 1)], dim=-1)
    # A max of -inf means the row sees nothing; shift by 0 there so exp gives exact zeros
    # (and finite gradients) instead of NaN.  The shift is detached: softmax does not
    # depend on it.
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    row_sum = e.sum(dim=-1, keepdim=True)
    seen = row_sum > 0
    p = e / torch.where(seen, row_sum, torch.ones_like(row_sum))
    lse = torch.where(seen, torch.log(row_sum) + m, torch.full_like(row_sum, -math.inf)).squeeze(-1)
    p = p[..., :sk]
    if keep is not None:
        p = p * keep.to(p.dtype) / (1.0 - dropout_p)
    out = torch.einsum("hij,jhd->ihd", p, v)
    return out, lse


def attention_ref(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                  softmax_scale=None, causal=False, window_size=(-1, -1), top_left=False,
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, keep_mask=None, s_aux=None):
    """Reference forward in float64.  Keywords follow flash_attn_func, plus top_left.
    s_aux (Hq,): attention sinks (an extra score column per row, no value); rows that see
    no key then get out 0 and lse s_aux[h], varlen rows outside every sequence too.

    Fixed length: q (B, Sq, Hq, D), k/v (B, Sk, Hk, D); returns out like q and lse
    (B, Hq, Sq).  Varlen (cu_seqlens given): q (total_q, Hq, D), returns lse (Hq, total_q);
    rows outside every sequence get out 0 and lse -inf.
    keep_mask: bool (B, Hq, Sq, Sk) (varlen: (B, Hq, >= max Sq, >= max Sk), read at
    [:Sq_b, :Sk_b] of each sequence) or None for no dropout.
    Inputs may require grad; they are converted to float64 inside the graph.
    """
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0  # flash_attn: causal means the right window is 0
    slopes = None if alibi_slopes is None else alibi_slopes.double()
    sink = None if s_aux is None else s_aux.double()

    def slopes_of(b):
        if slopes is None:
            return None
        return slopes if slopes.dim() == 1 else slopes[b]

    def keep_of(b, sq, sk):
        return None if keep_mask is None else keep_mask[b, :, :sq, :sk].to(q.device)

    opts = dict(scale=scale, softcap=softcap, left=left, right=right, top_left=top_left,
                dropout_p=dropout_p, sink=sink)
    if cu_seqlens_q is None:
        if q.shape[0] == 0:  # no sequences at all
            return q.new_zeros(q.shape[:-1] + v.shape[-1:]), q.new_zeros(0, q.shape[2], q.shape[1])
        outs, lses = [], []
        for b in range(q.shape[0]):
            sk = k.shape[1] if seqused_k is None else int(seqused_k[b])
            o, lse = _attend_one(q[b], k[b, :sk], v[b, :sk], slopes=slopes_of(b),
                                 keep=keep_of(b, q.shape[1], sk), **opts)
            outs.append(o)
            lses.append(lse)
        return torch.stack(outs), torch.stack(lses)

    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    total_q, hq = q.shape[0], q.shape[1]
    # Pieces of out / lse in row order, so rows outside every sequence are zeros / -inf.
    def no_rows_lse(n):
        return q.new_full((hq, n), -math.inf) if sink is None else sink[:, None].expand(hq, n)

    out_parts = [q.new_zeros(cq[0], hq, v.shape[-1])]
    lse_parts = [no_rows_lse(cq[0])]
    for b in range(len(cq) - 1):
        sk = ck[b + 1] - ck[b] if seqused_k is None else int(seqused_k[b])
        sq = cq[b + 1] - cq[b]
        o, lse = _attend_one(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b] + sk], v[ck[b]:ck[b] + sk],
                             slopes=slopes_of(b), keep=keep_of(b, sq, sk), **opts)
        out_parts.append(o)
        lse_parts.append(lse)
    out_parts.append(q.new_zeros(total_q - cq[-1], hq, v.shape[-1]))
    lse_parts.append(no_rows_lse(total_q - cq[-1]))
    return torch.cat(out_parts), torch.cat(lse_parts, dim=1)


def attention_ref_grads(q, k, v, dout, **kwargs):
    """(out, lse, dq, dk, dv) in float64 for the loss sum(out * dout).

    Works on float64 copies of q, k, v (the same dtype-rounded values the kernel sees).
    Inputs that the graph does not reach (e.g. every row empty) get zero gradients.
    """
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out, lse = attention_ref(*leaves, **kwargs)
    if out.requires_grad:
        grads = torch.autograd.grad(out, leaves, dout.double(), allow_unused=True)
    else:
        grads = (None, None, None)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    return (out.detach(), lse.detach(), *grads)


def softmax_probs_ref(q, k, **kwargs):
    """Softmax probabilities (B, Hq, Sq, Sk) of a fixed-length problem without dropout,
    float64: rows that see nothing are 0.  Uses attention_ref with v = identity so that
    out[b, i, h, j] = P[b, h, i, j]."""
    B, sk, hk = k.shape[0], k.shape[1], k.shape[2]
    eye = torch.eye(sk, dtype=torch.float64, device=k.device)
    v = eye[None, :, None, :].expand(B, sk, hk, sk)
    out, _ = attention_ref(q, k, v, **kwargs)
    return out.permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------
# Philox4x32-10 and the dropout mapping of docs/dropout.md
# ----------------------------------------------------------------------------------------

_MASK32 = np.uint64(0xFFFFFFFF)
_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on broadcastable arrays of 32-bit counter words (held in uint64 so the
    32 x 32 -> 64 bit products are exact); k0, k1 are Python ints.  Returns four uint64
    arrays of 32-bit output words."""
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3)))
    k0, k1 = int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF
    for _ in range(10):
        p0 = _PHILOX_M0 * c0
        p1 = _PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & _MASK32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & _MASK32)
        k0 = (k0 + _PHILOX_W0) & 0xFFFFFFFF
        k1 = (k1 + _PHILOX_W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def keep_threshold(dropout_p):
    """round((1 - p) * 65536): a 16-bit number below it means 'keep'."""
    return min(65536, int(math.floor((1.0 - dropout_p) * 65536.0 + 0.5)))


def dropout_keep_mask(seed, offset, dropout_p, num_heads, seqlen_q, seqlen_k, batch=1,
                      batch_index=None):
    """Bool numpy array (batch, num_heads, seqlen_q, seqlen_k): element (b, h, i, j) kept.

    num_heads is Hq.  batch_index (optional int) computes only sequence `batch_index`
    (result batch dimension 1), as used for one sequence of a varlen batch.
    """
    seed = int(seed) & (2**64 - 1)  # rng_state is int64; Philox wants the uint64 bits
    offset = int(offset) & (2**64 - 1)
    key0 = seed & 0xFFFFFFFF
    key1 = ((seed >> 32) + (offset >> 32)) & 0xFFFFFFFF
    bs = np.arange(batch) if batch_index is None else np.array([batch_index])
    b = bs.astype(np.uint64)[:, None, None, None]
    h = np.arange(num_heads, dtype=np.uint64)[None, :, None, None]
    i = np.arange(seqlen_q, dtype=np.uint64)[None, None, :, None]
    j = np.arange(seqlen_k, dtype=np.uint64)[None, None, None, :]
    u16, u8, u4, u2 = (np.uint64(x) for x in (16, 8, 4, 2))
    row_group = (i // u16) * u8 + i % u8
    col_group = (j // u16) * u4 + (j % u8) // u2
    bh = (b * np.uint64(num_heads) + h) & _MASK32
    words = philox4x32_10(col_group, row_group, bh, np.uint64(offset & 0xFFFFFFFF), key0, key1)
    k = u4 * ((i % u16) // u8) + u2 * ((j % u16) // u8) + j % u2  # 0..7, element of the group
    k = np.broadcast_to(k, words[0].shape)
    word = np.choose((k // u2).astype(np.intp), words)
    bits = (word >> (np.uint64(16) * (k % u2))) & np.uint64(0xFFFF)
    return bits < np.uint64(keep_threshold(dropout_p))


def dropout_keep_mask_varlen(seed, offset, dropout_p, num_heads, seqlens_q, seqlens_k,
                             max_seqlen_q=None, max_seqlen_k=None):
    """Padded bool array (B, Hq, max_seqlen_q, max_seqlen_k) for a varlen batch (False in
    the padding): sequence b uses its own index as the batch coordinate and its own lengths
    (seqlens_k after seqused_k).  The maxima default to the largest lengths."""
    B = len(seqlens_q)
    mq = max([0, *seqlens_q]) if max_seqlen_q is None else max_seqlen_q
    mk = max([0, *seqlens_k]) if max_seqlen_k is None else max_seqlen_k
    out = np.zeros((B, num_heads, mq, mk), dtype=bool)
    for b in range(B):
        sq, sk = int(seqlens_q[b]), int(seqlens_k[b])
        if sq and sk:
            out[b, :, :sq, :sk] = dropout_keep_mask(seed, offset, dropout_p, num_heads, sq, sk,
                                                    batch_index=b)[0]
    return out


def torch_sdpa(q, k, v, enable_gqa=False, **kw):
    """torch's scaled_dot_product_attention with `enable_gqa` on every torch fmha supports:
    torch < 2.5 has no such argument, so there K and V heads are repeated to the query's."""
    import torch.nn.functional as F
    if enable_gqa:
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        except TypeError:  # torch 2.4
            rep = q.shape[-3] // k.shape[-3]
            k, v = (t.repeat_interleave(rep, dim=-3) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, **kw)
