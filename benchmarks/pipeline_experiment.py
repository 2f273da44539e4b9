"""Does pipelining pay? One lossy alltoall of all tables against G groups of tables in flight.

With G groups, each group is its own hvd_lossy alltoall_async: group g+1 compresses while group
g travels, and group g decodes (in its synchronize) while g+1 travels. Run it under mpirun,
inside a network namespace with a limited loopback to see a link (see `python -m hvd_lossy.bench
netlink` for the recipe):

    mpirun -np 2 python benchmarks/pipeline_experiment.py [--groups 1,2,3] [--iters 40]

Prints, on rank 0, the slowest rank's median milliseconds per exchange for each G, per round.
Data: 13 tables of dim 128 a rank, 512 lookups a destination each, ids skewed towards the first
rows (u^3 of a uniform u), so that rows repeat as lookups do.
"""
import argparse
import statistics
import time

import torch

import hvd_lossy.torch as hvd

TABLES, ROWS, DIM, TABLE_ROWS = 13, 512, 128, 20000


def lookups(rank, ranks):
    """(ranks * TABLES * ROWS, DIM): per destination, its rows of table 0, then table 1, ..."""
    g = torch.Generator().manual_seed(rank)
    tables = [torch.rand(TABLE_ROWS, DIM, generator=g) * 0.02 - 0.01 for _ in range(TABLES)]
    ids = [(TABLE_ROWS * torch.rand(ROWS * ranks, generator=g) ** 3).long() for _ in tables]
    x = torch.stack([t[i] for t, i in zip(tables, ids)])  # (TABLES, ranks * ROWS, DIM)
    return x.view(TABLES, ranks, ROWS, DIM).transpose(0, 1).contiguous()


def exchange_ms(x, groups, iters):
    """Slowest rank's median ms of one exchange of x cut into `groups` groups of tables."""
    ranks = x.shape[0]
    sizes = [TABLES // groups + (g < TABLES % groups) for g in range(groups)]
    parts, start = [], 0
    for k in sizes:
        parts.append(x[:, start:start + k].reshape(ranks * k * ROWS, DIM).contiguous())
        start += k
    compressors = [hvd.Compression.lossy(0.03, segments=k) for k in sizes]
    times = []
    for _ in range(iters):
        hvd.barrier()
        t0 = time.perf_counter()
        handles = [hvd.alltoall_async(p, compression=c) for p, c in zip(parts, compressors)]
        for h in handles:
            hvd.synchronize(h)
        times.append(time.perf_counter() - t0)
    local = torch.tensor([statistics.median(times[5:])], dtype=torch.float64)
    return 1e3 * float(hvd.allreduce(local, op=hvd.Max))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", default="1,2,3")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    hvd.init()
    x = lookups(hvd.rank(), hvd.size())
    groups = [int(g) for g in args.groups.split(",")]
    results = {g: [] for g in groups}
    for _ in range(args.rounds):
        for g in groups:  # taking turns, so that noise hits every setting alike
            results[g].append(round(exchange_ms(x, g, args.iters), 2))
    if hvd.rank() == 0:
        for g, ms in results.items():
            print(f"groups {g}: ms per exchange {ms}", flush=True)


if __name__ == "__main__":
    main()
