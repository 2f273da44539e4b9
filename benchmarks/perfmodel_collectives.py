"""Calibration worker of benchmarks/perfmodel_validate.py: one Horovod collective call's fixed cost
and the link's payload rate, on the transport the DLRM example uses (run under mpirun inside
the emulated link's namespace):

    mpirun -np 4 python benchmarks/perfmodel_collectives.py --big-mib 4 --iters 7 --json out.json

latency: a plain horovod.torch.alltoall of one float a destination (bytes negligible), the
slowest rank's median call; payload rate: all ranks' remote bytes of a plain all-to-all of
--big-mib MiB a rank over its slowest median call. Rank 0 also reads the loopback's tx_bytes
around the big calls (every byte that crossed the link), so the JSON shows the overhead of
headers and control traffic against the payload.
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
    if hvd.rank() == 0:
        args.json.write_text(json.dumps({
            "ranks": P, "latency_s": latency, "big_bytes_per_rank": n * 4, "big_seconds": seconds,
            "remote_bytes_per_call": remote, "payload_rate_bytes_s": remote / seconds,
            "link_bytes_per_call": (after - before) / calls}, indent=1))


if __name__ == "__main__":
    main()
