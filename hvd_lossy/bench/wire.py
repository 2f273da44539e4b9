"""Bytes on the wire of the lossy all-to-all against plain Horovod, as the kernel counts them
(issue #10's measurement): 2 ranks in a private network namespace, each sending 13 Criteo
tables of dim 32 to every rank, `rows` lookups a (destination, table), one segment a table
(`segments=13`), rel-eb 0.03 at level 2. The ratio is plain's tx bytes of the namespace's
loopback (TCP/IP included) over the lossy mode's, per call, counted two ways: the calls run back
to back as a training loop runs them ("ratio"), and the timed calls, each after the timing's
barrier, whose ~1 KB falls on both modes alike ("ratio_with_barriers", the count before
2026-12-01 18:10 UTC).

    python -m hvd_lossy.bench.wire [--rows 64,256,1024] [--tree label=PATH ...] [--json PATH]

--tree runs the same worker against another checkout's hvd_lossy (e.g. before=/work/main), so
two versions are compared side by side in one run. Needs root (ip netns) and mpirun.
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from hvd_lossy.bench import machine, netlink

WORKER = pathlib.Path(__file__).resolve().parent / "netlink_worker.py"
RANKS, TABLES, DIM = 2, 13, 32
MODES = ["plain", "lossy 0.03 l2"]


def size_mib(rows):
    """The worker's per-rank message size in MiB for `rows` lookups a (destination, table)."""
    return rows * RANKS * TABLES * DIM * 4 / 2 ** 20


def run_tree(ns, tree, rows, iters, repeat, workdir):
    out = workdir / f"wire_{abs(hash(tree))}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv = [sys.executable, str(WORKER), "--modes", ",".join(MODES),
            "--sizes", ",".join(f"{size_mib(r):.9g}" for r in rows), "--iters", str(iters),
            "--repeat", str(repeat), "--json", str(out), "--back-to-back"]
    cmd = ns.command(netlink.mpirun(RANKS, ["OMP_NUM_THREADS", "PYTHONPATH", "PATH"], argv))
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"worker failed in {tree}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["results"]


COUNTS = {"back_to_back": "link_bytes_back_to_back", "with_barriers": "link_bytes_per_call"}


def summarise(results):
    """{rows: {count: {mode: median link bytes a call}}} over the repeats, for each of COUNTS."""
    table = {}
    for r in results:
        if r.get("status") != "ok":
            raise RuntimeError(f"mode {r['mode']} failed: {r.get('error')}")
        for count, field in COUNTS.items():
            table.setdefault(r["samples_per_rank"], {}).setdefault(count, {}).setdefault(
                r["mode"], []).append(r[field])
    return {rows: {count: {m: sorted(v)[len(v) // 2] for m, v in modes.items()}
                   for count, modes in counts.items()}
            for rows, counts in sorted(table.items())}


def row_summary(counts):
    """One rows entry of the report: back-to-back bytes a mode and their ratio, and the same
    with the timing's barriers."""
    b2b, timed = counts["back_to_back"], counts["with_barriers"]
    return dict(b2b, ratio=b2b["plain"] / b2b[MODES[1]], with_barriers=timed,
                ratio_with_barriers=timed["plain"] / timed[MODES[1]])


def codec_alone(rows_list):
    """Bytes of rank 0's chunk for rank 1 as the codec alone writes it (this checkout): one
    frame of 13 segments. Deterministic."""
    import torch

    import hvd_lossy
    from hvd_lossy.bench.alltoall import message
    from hvd_lossy.bench.criteo import load_sparse_ids
    ids, cards = load_sparse_ids()
    ids = torch.from_numpy(ids)
    out = {}
    for rows in rows_list:
        x, _ = message(ids, cards, 0, RANKS, rows)
        chunk = x[x.shape[0] // RANKS:].contiguous()
        raw = chunk.numel() * 4
        nbytes = hvd_lossy.compress_chunks(chunk, [rows] * TABLES, 0.03, level=2)[0].numel()
        out[str(rows)] = {"raw": raw, "bytes": nbytes, "ratio": raw / nbytes}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hvd_lossy.bench.wire", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[64, 256, 1024])
    p.add_argument("--tree", action="append", default=[],
                   help="label=PATH of an hvd_lossy checkout to measure (default: this one)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(netlink.REPO)]]
    missing = netlink.missing_requirements()
    if missing:
        sys.exit(f"wire: cannot run: {missing}")
    report = {"benchmark": "wire", "cpu": machine.describe(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": "python -m hvd_lossy.bench.wire " + " ".join(argv or sys.argv[1:]),
              "ranks": RANKS, "tables": TABLES, "dim": DIM, "modes": MODES,
              "load_average": os.getloadavg(), "trees": {}}
    with netlink.signals_raise(), tempfile.TemporaryDirectory() as tmp, \
            netlink.Namespace(f"hvdl-wire-{os.getpid()}") as ns:
        for label, tree in trees:
            per_rows = summarise(run_tree(ns, tree, args.rows, args.iters, args.repeat, pathlib.Path(tmp)))
            report["trees"][label] = {"path": tree, "rows": {
                str(r): row_summary(c) for r, c in per_rows.items()}}
    report["codec_alone"] = codec = codec_alone(args.rows)
    print(f"codec alone, one destination's 13 tables: {'rows':>6} {'ratio':>9}")
    for r, c in codec.items():
        print(f"{'':42}{r:>6} {c['ratio']:8.2f}x")
    print(f"{'tree':>8} {'rows':>6} {'plain B/call':>13} {'lossy B/call':>13} {'ratio':>7}"
          f"   (with the timing's barriers: {'plain':>7} {'lossy':>7} {'ratio':>6})")
    for label, t in report["trees"].items():
        for r, m in t["rows"].items():
            w = m["with_barriers"]
            print(f"{label:>8} {r:>6} {m['plain']:13.0f} {m[MODES[1]]:13.0f} {m['ratio']:7.2f}"
                  f"   {'':31}{w['plain']:7.0f} {w[MODES[1]]:7.0f} {m['ratio_with_barriers']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
