"""Calibration worker of benchmarks/perfmodel_validate.py: one Horovod collective call's fixed cost
and the link's payload rate, on the transport the DLRM example uses (run under mpirun inside
the emulated link's namespace):

    mpirun -np 4 python benchmarks/perfmodel_collectives.py --big-mib 4 --iters 7 --json out.json

latency: a plain horovod.torch.alltoall of one float a destination (bytes negligible), the
slowest rank's median call; payload rate: all ranks' remote bytes of a plain all-to-all of
--big-mib MiB a rank over its slowest median call. Rank 0 also reads the loopback's tx_bytes
around the big calls (every byte that crossed the link), so the JSON shows the overhead of
headers and control traffic against the payload; and, with --dense-params / --id-rows, the
loopback bytes a call of the example's dense allreduce and ids allgather really move (MPI picks
its own algorithm, which need not be the ring the model assumes).
"""
import argparse
import json
import pathlib

import torch

from hvd_lossy.bench.alltoall import time_calls

TX_BYTES = pathlib.Path("/sys/class/net/lo/statistics/tx_bytes")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big-mib", type=float, default=4.0, help="MiB a rank of the payload-rate call")
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--dense-params", type=int, default=0, help="floats of an allreduce whose link bytes to count")
    p.add_argument("--id-rows", type=int, default=0, help="rows of 26 int64 ids a rank of an allgather to count")
    p.add_argument("--json", type=pathlib.Path, required=True)
    args = p.parse_args(argv)
    import horovod.torch as hvd
    hvd.init()
    P = hvd.size()
    tiny = torch.zeros(P, dtype=torch.float32)
    latency = time_calls(lambda: hvd.alltoall(tiny), hvd, args.iters, warmup=2)
    n = int(args.big_mib * 2**20 / 4) // P * P
    big = torch.randn(n)
    hvd.barrier()
    before = int(TX_BYTES.read_text()) if hvd.rank() == 0 else 0
    seconds = time_calls(lambda: hvd.alltoall(big), hvd, args.iters, warmup=1)
    hvd.barrier()
    after = int(TX_BYTES.read_text()) if hvd.rank() == 0 else 0
    calls = args.iters + 1
    remote = P * (n * 4) * (P - 1) / P  # every rank's bytes to the others
    counted = {}
    if args.dense_params:
        dense = torch.randn(args.dense_params)
        counted["allreduce"] = link_bytes(hvd, lambda: hvd.allreduce(dense, op=hvd.Sum), args.iters)
    if args.id_rows:
        ids = torch.zeros(args.id_rows, 26, dtype=torch.int64)
        counted["allgather"] = link_bytes(hvd, lambda: hvd.allgather(ids), args.iters)
    if hvd.rank() == 0:
        args.json.write_text(json.dumps({
            "ranks": P, "latency_s": latency, "big_bytes_per_rank": n * 4, "big_seconds": seconds,
            "remote_bytes_per_call": remote, "payload_rate_bytes_s": remote / seconds,
            "link_bytes_per_call": (after - before) / calls,
            "counted_link_bytes_per_call": counted}, indent=1))


def link_bytes(hvd, call, iters):
    """Loopback bytes a call of `call` (rank 0's counter; no barrier between the calls)."""
    call()
    hvd.barrier()
    before = int(TX_BYTES.read_text()) if hvd.rank() == 0 else 0
    for _ in range(iters):
        call()
    hvd.barrier()
    after = int(TX_BYTES.read_text()) if hvd.rank() == 0 else 0
    return (after - before) / iters


if __name__ == "__main__":
    main()
