"""All-to-all worker of `python -m hvd_lossy.bench netlink` (run by it under mpirun, inside the
network namespace whose loopback carries the emulated link):

    mpirun -np N python -m hvd_lossy.bench.netlink_worker --modes plain,fp16,auto --sizes 0.0625,1 \
        --iters 5 --repeat 3 --json out.json

The messages are those of `hvd_lossy.bench alltoall` (real Criteo ids, DLRM-initialised tables,
per-table frames). Per message size the modes take turns, `--repeat` rounds of `--iters` timed
calls each, so machine noise hits every mode alike. Per round, rank 0 reads the loopback's
tx_bytes before and after the timed calls: with every rank inside the namespace that counter is
every byte that crossed the link (payload, headers, Horovod's own control traffic). Those timed
calls each follow a barrier, and time_calls ends with an allreduce; those collectives' bytes
(~1 KB each) are in that count; `--back-to-back`
also counts each round's calls run one after the other, as a training loop runs them, less the
one barrier that closes the round (`link_bytes_back_to_back`).

A mode whose compressor cannot be built (e.g. "auto" before hvd_lossy has auto=True) or whose
call raises is reported as failed, with the error, and the other modes go on.
"""
import argparse
import json
import pathlib
import traceback

import torch

from hvd_lossy import auto
from hvd_lossy.bench.alltoall import message, time_calls
from hvd_lossy.bench.criteo import N_SPARSE, load_sparse_ids

DIM = 32
# The netlink default modes; "auto" is lossy 0.03 with auto=True (the library picks per call).
MODES = ["plain", "fp16", "lossy 0.01", "lossy 0.03", "lossy 0.05", "auto"]
AUTO_BOUND = 0.03
TX_BYTES = pathlib.Path("/sys/class/net/lo/statistics/tx_bytes")


def make_compressor(hvd, mode, segments):
    """The compressor of `mode` (None for plain Horovod); ValueError for an unknown mode name.
    Whatever the constructor raises (TypeError for an unsupported auto=True) propagates."""
    if mode == "plain":
        return None
    if mode == "fp16":
        return hvd.Compression.fp16
    if mode == "auto":
        return hvd.Compression.lossy(AUTO_BOUND, segments=segments, auto=True)
    if mode.startswith("lossy "):  # "lossy <bound>" at level 1, "lossy <bound> l2" at level 2
        words = mode.split()
        level = 2 if words[2:] == ["l2"] else 1
        if len(words) > 3 or (len(words) == 3 and level != 2):
            raise ValueError(f"unknown all-to-all mode {mode!r}; expected 'lossy <bound> [l2]'")
        return hvd.Compression.lossy(float(words[1]), segments=segments, level=level)
    raise ValueError(f"unknown all-to-all mode {mode!r}; expected one of {MODES} or "
                     f"'lossy <bound> [l2]'")


def tx_bytes():
    return int(TX_BYTES.read_text())


def timed_round(hvd, call, iters):
    """(slowest rank's median seconds per call, link bytes per call as rank 0 saw them)."""
    hvd.barrier()
    before = tx_bytes() if hvd.rank() == 0 else 0
    seconds = time_calls(call, hvd, iters, warmup=0)
    hvd.barrier()  # every rank has received everything: all of it has crossed the link
    after = tx_bytes() if hvd.rank() == 0 else 0
    return seconds, (after - before) / iters


def counted_round(hvd, call, iters):
    """Link bytes a call of `iters` calls run back to back, as rank 0 sees them: the round is
    closed by a barrier (everything has crossed the link), whose bytes, measured alone just
    before, are taken off."""
    marks = []
    for calls in (0, iters):
        hvd.barrier()
        before = tx_bytes() if hvd.rank() == 0 else 0
        for _ in range(calls):
            call()
        hvd.barrier()
        marks.append((tx_bytes() if hvd.rank() == 0 else 0) - before)
    barrier, calls = marks
    return (calls - barrier) / iters


def run_size(hvd, ids, cards, size, modes, iters, repeat, back_to_back=False):
    import horovod.torch as horovod
    rank, ranks = hvd.rank(), hvd.size()
    owned = len([t for t in range(N_SPARSE) if t % ranks == rank])
    per_dest = max(1, round(size / (ranks * owned * DIM * 4)))
    x, splits = message(ids, cards, rank, ranks, per_dest)
    raw = x.numel() * 4
    calls, failed, warmups = {}, [], {}
    for mode in modes:
        try:
            comp = make_compressor(hvd, mode, owned)
        except Exception as e:  # noqa: BLE001 - reported as this mode's result, not fatal
            failed.append({"mode": mode, "bytes": raw, "status": "failed", "error": f"{type(e).__name__}: {e}"})
            continue
        if comp is None:
            calls[mode] = lambda: horovod.alltoall(x, splits)
        else:
            calls[mode] = lambda comp=comp: hvd.alltoall(x, splits, compression=comp)
        # warm-up: Horovod's response cache, the codec's buffers, and auto's probing (an auto
        # compressor measures both paths on its first calls and has agreed on one by DECIDED_WITHIN)
        warmups[mode] = 1 + (auto.DECIDED_WITHIN if getattr(comp, "auto", False) else 0)
    rows = []
    for rep in range(repeat):
        for mode in list(calls):
            try:
                for _ in range(warmups[mode] if rep == 0 else 0):
                    calls[mode]()
                seconds, link = timed_round(hvd, calls[mode], iters)
                extra = ({"link_bytes_back_to_back": counted_round(hvd, calls[mode], iters)}
                         if back_to_back else {})
            except Exception as e:  # noqa: BLE001 - the collective raised on every rank
                failed.append({"mode": mode, "bytes": raw, "status": "failed",
                               "error": f"{type(e).__name__}: {e}",
                               "traceback": traceback.format_exc(limit=3)})
                del calls[mode]
                continue
            rows.append({"mode": mode, "bytes": raw, "samples_per_rank": per_dest, "repeat": rep,
                         "ms_per_call": 1e3 * seconds, "link_bytes_per_call": link, "status": "ok",
                         **extra})
    return rows + failed


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hvd_lossy.bench.netlink_worker",
                                description=__doc__.split("\n")[0])
    p.add_argument("--modes", type=lambda s: s.split(","), default=MODES)
    p.add_argument("--sizes", type=lambda s: [int(float(v) * 2**20) for v in s.split(",")], required=True,
                   help="per-rank message sizes in MiB, comma-separated")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=pathlib.Path, required=True)
    p.add_argument("--back-to-back", action="store_true",
                   help="also count the link bytes of each round's calls run back to back")
    args = p.parse_args(argv)

    import hvd_lossy.torch as hvd
    hvd.init()
    ids, cards = load_sparse_ids()
    ids = torch.from_numpy(ids)
    rows = []
    for size in args.sizes:
        rows += run_size(hvd, ids, cards, size, args.modes, args.iters, args.repeat,
                         args.back_to_back)
    if hvd.rank() == 0:
        args.json.write_text(json.dumps({"ranks": hvd.size(), "dim": DIM, "iters": args.iters,
                                         "results": rows}, indent=1))


if __name__ == "__main__":
    main()
