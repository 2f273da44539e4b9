"""What observing the lookups costs the adaptive all-to-all, per call, on the sender.

Every call of the adaptive compressor is sampled (`sample_every=1`, the worst case; the default
samples one call in ten of an interval). The sender's `compress_s` (comm_stats: packing plus the
compressor hook after the launch, where the observations run) is compared with `observe=False`,
the floor. Run it under mpirun, once per checkout to compare (PYTHONPATH picks the tree):

    mpirun -np 2 python benchmarks/adaptive_observe.py [--iters 60] [--json OUT]

Data: 13 tables of dim 128 a rank, 512 lookups a destination each, drawn from 3,000 rows (about
the distinct-row fraction of real lookups), one codec thread a rank.
"""
import argparse
import json
import statistics

import torch

import hvd_lossy
import hvd_lossy.torch as hvd
from hvd_lossy.adaptive import Controller

TABLES, ROWS, DIM = 13, 512, 128


def median_ms(compression, x, splits, iters, warmup=10):
    seen = []
    for i in range(iters + warmup):
        hvd.alltoall(x, splits=splits, compression=compression)
        if i >= warmup:
            seen.append(hvd.comm_stats()["last"]["compress_s"])
    return 1e3 * statistics.median(seen)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--iters", type=int, default=60, help="timed calls a setting")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the settings taking turns")
    p.add_argument("--json", help="write the results here (rank 0)")
    o = p.parse_args()
    hvd.init()
    rank, ranks = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    specs = [{"name": f"t{i}", "cardinality": 10**5, "owner": i % ranks}
             for i in range(TABLES * ranks)]
    controller = Controller(specs, policy="paper", interval=10**6, sample_every=1)
    mine = controller.tables_of(rank)
    settings = {observe: hvd.Compression.adaptive(controller, mine, backward=None,
                                                  observe=observe)
                for observe in (True, False)}
    g = torch.Generator().manual_seed(rank)
    base = torch.randn(3000, DIM, generator=g) * 0.01
    x = base[torch.randint(0, 3000, (ROWS * len(mine) * ranks,), generator=g)].contiguous()
    splits = [ROWS * len(mine)] * ranks
    rounds = []
    for _ in range(o.rounds):
        got = {("observe" if k else "no_observe"): median_ms(c, x, splits, o.iters)
               for k, c in settings.items()}
        slowest = hvd.allgather_object(got)
        rounds.append({k: max(r[k] for r in slowest) for k in got})
    if rank == 0:
        for r in rounds:
            print(f"compress_s ms a call (slowest rank): observe {r['observe']:.3f}, "
                  f"observe=False {r['no_observe']:.3f}, cost {r['observe'] - r['no_observe']:.3f}")
        if o.json:
            with open(o.json, "w") as f:
                json.dump({"ranks": ranks, "tables_a_rank": TABLES, "rows": ROWS, "dim": DIM,
                           "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
