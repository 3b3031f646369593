"""A model of the sm_90a backward's launch under a causal mask: CTAs start in launch order on
whichever multiprocessor frees first (one CTA per SM), and a CTA takes as long as its query
blocks plus a fixed cost.  Prints the makespan over the even share (total work / SMs) for the
grid's order and for wave_block_order's groups as wave_order_units picks them (tile_order.h),
at the training table's shapes (16k tokens of width 2048).  A model, not a measurement: the
kernel's A/B is tools/tune/trait_ab.sh with tune_sm90_bwd.cu.

    python tools/tune/bwd_launch_model.py [--sms 132] [--cta-cost 2]
"""

import argparse
import heapq


def makespan(works, sms: int) -> float:
    free = [0.0] * sms
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def order_units(n_blocks: int, sms: int) -> int:  # wave_order_units under a causal mask
    wave = sms // n_blocks if n_blocks < sms else 1
    return min(wave, 8)


def launch(n_blocks: int, units: int, group: int):
    """(key block, unit) in wave_block_order's order."""
    for linear in range(n_blocks * units):
        first = linear // (group * n_blocks) * group
        in_group, size = linear % (group * n_blocks), min(group, units - first)
        yield in_group // size, first + in_group % size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--cta-cost", type=float, default=2.0, help="a CTA's fixed cost, in query blocks")
    args = ap.parse_args()
    print(f"{'D':>4} {'S':>6} {'group':>5}  grid order  groups   (makespan / even share)")
    for d, block_m, block_n in ((64, 128, 128), (128, 64, 128), (192, 64, 64)):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            units = 16384 // s * (2048 // d)
            n_blocks, q_blocks = s // block_n, s // block_m
            # Key block n sees the query blocks from its diagonal on (bottom-right = top-left here).
            work = [max(0, q_blocks - n * block_n // block_m) + args.cta_cost for n in range(n_blocks)]
            even = sum(work) * units / args.sms
            g = order_units(n_blocks, args.sms)
            grid = makespan((work[n] for n, _ in launch(n_blocks, units, 1)), args.sms) / even
            grouped = makespan((work[n] for n, _ in launch(n_blocks, units, g)), args.sms) / even
            print(f"{d:4d} {s:6d} {g:5d}  {grid:10.3f}  {grouped:6.3f}")


if __name__ == "__main__":
    main()
