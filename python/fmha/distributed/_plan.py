"""Which kernel calls one rank makes for one ring step: the block geometry.

Each rank holds its part of the sequence as *segments*: runs of local rows whose global
positions are ``start + stride * i`` (contiguous ring: one segment; zigzag: two, chunks r
and 2W-1-r; stripe: one segment of stride W).  For the query rows of one rank and the keys
that arrived from another, the global mask (key gk visible to query gq iff
``gq - left <= gk <= gq + right``; -1 = unbounded; causal is right = 0) restricted to a pair of
segments is a band ``i + lo <= j <= i + hi`` in local indices.  Every nonempty band is one
fmha call on a slice ``q[i0:i1] x k[j0:j1]`` with a top-left window ``(left', right')`` whose
bounds are >= 0 (or -1 when the slice's own size makes them unbounded); an empty band is
skipped.  Pairs whose bands continue each other in local indices are fused into one call
(zigzag's own block is one causal call over both chunks; a block from an earlier rank is one
unmasked call over the first half of the keys); whether a fusion is exact is checked pair by
pair, by comparing the fused call's slice and window on that pair with the pair's own.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple


class Segment(NamedTuple):
    loc: int      # first local row
    length: int   # rows
    start: int    # global position of the first row
    stride: int   # global distance between consecutive rows


class Block(NamedTuple):
    """One kernel call: q rows [q0, q1), k rows [k0, k1) (local), top-left window."""
    q0: int
    q1: int
    k0: int
    k1: int
    left: int   # -1: unbounded
    right: int  # -1: unbounded


def band_block(lq: int, lk: int, lo: Optional[int], hi: Optional[int]) -> Optional[Block]:
    """The visible part of ``i + lo <= j <= i + hi`` (None: unbounded) on an lq x lk block, as
    a slice and a top-left window on it; None when nothing is visible."""
    if lq <= 0 or lk <= 0 or (lo is not None and hi is not None and lo > hi):
        return None
    i0 = 0 if hi is None else max(0, -hi)          # rows whose last visible key is >= 0
    i1 = lq if lo is None else min(lq, lk - lo)    # rows whose first visible key is < lk
    if i0 >= i1:
        return None
    j0 = 0 if lo is None else max(0, i0 + lo)
    j1 = lk if hi is None else min(lk, i1 + hi)
    # On the slice, i' = i - i0 and j' = j - j0: i' - left <= j' <= i' + right.
    left = -1 if lo is None else j0 - i0 - lo      # >= 0 since j0 >= i0 + lo
    right = -1 if hi is None else i0 + hi - j0     # >= 0 since row i0 sees a key
    if left >= i1 - i0 - 1:
        left = -1
    if right >= j1 - j0 - 1:
        right = -1
    return Block(i0, i1, j0, j1, left, right)


def _band(qs: Segment, ks: Segment, left: int, right: int) -> Tuple[Optional[int], Optional[int]]:
    """The global window on a pair of segments of equal stride w, in local indices:
    gk >= gq - left  <=>  j >= i + ceil((delta - left) / w), and
    gk <= gq + right <=>  j <= i + floor((delta + right) / w), delta = start_q - start_k."""
    w = qs.stride
    delta = qs.start - ks.start
    lo = None if left < 0 else -((left - delta) // w)
    hi = None if right < 0 else (delta + right) // w
    return lo, hi


def _shift(x: Optional[int], by: int) -> Optional[int]:
    return None if x is None else x + by


def _fuse(pairs, qsegs, ksegs) -> Optional[Block]:
    """One call covering every pair of qsegs x ksegs (consecutive local rows each), if one band
    in local indices reproduces every pair's visible set exactly; None otherwise."""
    qa, ka = qsegs[0].loc, ksegs[0].loc
    lq = sum(s.length for s in qsegs)
    lk = sum(s.length for s in ksegs)
    candidates = []
    for (qs, ks), (lo, hi, blk) in pairs.items():
        if blk is not None and qs in qsegs and ks in ksegs:
            by = (ks.loc - ka) - (qs.loc - qa)
            c = (_shift(lo, by), _shift(hi, by))
            if c not in candidates:
                candidates.append(c)
    for lo_c, hi_c in candidates:
        ok = True
        for qs in qsegs:
            for ks in ksegs:
                by = (qs.loc - qa) - (ks.loc - ka)
                if band_block(qs.length, ks.length, _shift(lo_c, by), _shift(hi_c, by)) != pairs[(qs, ks)][2]:
                    ok = False
                    break
            if not ok:
                break
        if ok:
            b = band_block(lq, lk, lo_c, hi_c)
            return None if b is None else Block(b.q0 + qa, b.q1 + qa, b.k0 + ka, b.k1 + ka, b.left, b.right)
    return None


@functools.lru_cache(maxsize=4096)
def plan(qsegs: Tuple[Segment, ...], ksegs: Tuple[Segment, ...], left: int, right: int) -> Tuple[Block, ...]:
    """The calls that compute attention of the rows in qsegs over the keys in ksegs under the
    global window (left, right), fewest first: one fused call, else one per key segment or
    per query segment (whichever is fewer), else one per nonempty pair."""
    pairs = {}
    for qs in qsegs:
        for ks in ksegs:
            if qs.stride != ks.stride:
                raise ValueError("segments of different strides cannot share a band")
            lo, hi = _band(qs, ks, left, right)
            pairs[(qs, ks)] = (lo, hi, band_block(qs.length, ks.length, lo, hi))
    nonempty = [(qs, ks) for (qs, ks), (_, _, b) in pairs.items() if b is not None]
    if not nonempty:
        return ()

    def single(qs, ks):
        b = pairs[(qs, ks)][2]
        return Block(b.q0 + qs.loc, b.q1 + qs.loc, b.k0 + ks.loc, b.k1 + ks.loc, b.left, b.right)

    whole = _fuse(pairs, qsegs, ksegs)
    if whole is not None:
        return (whole,)
    options = []
    for by_keys in (True, False):
        calls = []
        for seg in (ksegs if by_keys else qsegs):
            group = [p for p in nonempty if p[1 if by_keys else 0] == seg]
            if not group:
                continue
            fused = _fuse(pairs, qsegs, (seg,)) if by_keys else _fuse(pairs, (seg,), ksegs)
            calls.extend([fused] if fused is not None else [single(*p) for p in group])
        options.append(tuple(calls))
    return min(options, key=len)


# --- the layouts -------------------------------------------------------------------------

LAYOUTS = ("ring", "zigzag", "stripe")


def segments(layout: str, rank: int, world: int, local_len: int) -> Tuple[Segment, ...]:
    """The segments of rank `rank`'s local rows (local_len of them) in a sequence of
    world * local_len tokens."""
    if layout == "ring":      # contiguous: rank r holds tokens [r L, (r + 1) L)
        return (Segment(0, local_len, rank * local_len, 1),)
    if layout == "zigzag":    # chunks r and 2W-1-r of 2W
        c = local_len // 2
        return (Segment(0, c, rank * c, 1), Segment(c, c, (2 * world - 1 - rank) * c, 1))
    if layout == "stripe":    # token t on rank t % W
        return (Segment(0, local_len, rank, world),)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def step_plan(layout: str, rank: int, src: int, world: int, local_len: int, left: int, right: int
              ) -> Tuple[Block, ...]:
    """The calls of rank `rank` on the keys and values of rank `src`."""
    return plan(segments(layout, rank, world, local_len), segments(layout, src, world, local_len), left, right)
