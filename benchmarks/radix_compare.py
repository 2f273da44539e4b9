"""Radix packing (issue #10, native/frame.h "Radix section") before and after, side by side: two
checkouts' hvd_lossy run alternately, round by round, on this machine.

    python benchmarks/radix_compare.py --tree before=/work/main --tree after=. [--rounds 3]
        [--json benchmarks/results/radix_compare.json]

Per round and tree (each in its own process, PYTHONPATH=tree):
  sizes   the wire benchmark's chunk (hvd_lossy.bench.wire.codec_alone's: 13 Criteo tables of
          dim 32, rank 0's chunk for rank 1, rel 0.03) at 64/256/1024 rows: the level-1 format-2
          frame's bytes and how many segments are radix packed (deterministic)
  codec   `python -m hvd_lossy.bench codec --levels 1 --formats 2 --workloads realistic criteo`
          (compress and decompress GB/s, one thread, medians of its --repeat)
  dlrm    the README main job's adaptive run over shared memory (scripts/run_main.sh section 2:
          2 ranks under mpirun, --level 1, --metrics-out): all-to-all ratio, bytes and AUC
The codec's speeds are compared as ratios after/before of the same round; the machine is shared,
so the load average before and after each round is recorded too.
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

PY = sys.executable
SIZES = r"""
import json, torch, hvd_lossy
from hvd_lossy.bench.alltoall import message
from hvd_lossy.bench.criteo import load_sparse_ids
from hvd_lossy.bench.wire import RANKS, TABLES
ids, cards = load_sparse_ids()
ids = torch.from_numpy(ids)
out = {}
for rows in (64, 256, 1024):
    x, _ = message(ids, cards, 0, RANKS, rows)
    chunk = x[x.shape[0] // RANKS:].contiguous()
    frame = hvd_lossy.compress_chunks(chunk, [rows] * TABLES, 0.03, level=1, format=2)[0]
    segs = hvd_lossy.frame_info(frame)["segments"]
    out[rows] = {"raw": chunk.numel() * 4, "frame_bytes": frame.numel(),
                 "code_bytes": sum(s["code_bytes"] for s in segs),
                 "radix_segments": sum(1 for s in segs if s.get("radix")),
                 "segments": len(segs)}
print(json.dumps(out))
"""
DLRM_ARGS = ["--data", "data/criteo_kaggle_sample", "--seed", "0", "--compression", "adaptive",
             "--error-bound", "0.03", "--backward-error-bound", "0.02", "--dither", "backward",
             "--level", "1"]


def env_for(tree):
    return dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1",
                OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(cmd, tree, timeout=1200):
    p = subprocess.run(cmd, cwd=tree, env=env_for(tree), capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed in {tree}: {p.stdout[-1500:]}{p.stderr[-1500:]}")
    return p.stdout


def sizes(tree):
    return json.loads(run([PY, "-c", SIZES], tree).strip().splitlines()[-1])


def codec(tree, tmp):
    out = pathlib.Path(tmp) / f"codec_{abs(hash(str(tree)))}.json"
    run([PY, "-m", "hvd_lossy.bench", "codec", "--levels", "1", "--formats", "2", "--workloads",
         "realistic", "criteo", "--json", str(out)], tree)
    keep = ("ratio", "compress_GBps", "decompress_new_GBps", "decompress_into_GBps")
    return {f"{r['workload']} {r['method']}": {k: r[k] for k in keep}
            for r in json.loads(out.read_text())["runs"] if "method" in r and "ratio" in r}


def dlrm(tree, tmp):
    out = pathlib.Path(tmp) / f"dlrm_{abs(hash(str(tree)))}.json"
    mpirun = ["mpirun", "--oversubscribe", "-np", "2", "--mca", "btl", "self,tcp", "--mca",
              "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", "-x",
              "OMP_NUM_THREADS", "-x", "PYTHONPATH"]
    run(mpirun + [PY, "examples/dlrm/train.py", *DLRM_ARGS, "--metrics-out", str(out)], tree)
    m = json.loads(out.read_text())
    keep = ("auc", "logloss", "compression_ratio", "a2a_bytes_plain", "a2a_bytes_sent",
            "a2a_fwd_bytes_sent", "a2a_bwd_bytes_sent", "iter_seconds_median")
    return {k: m[k] for k in keep}


def commit(tree):
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", required=True, help="label=PATH (two of them)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-dlrm", action="store_true")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    trees = [(lab, pathlib.Path(path).resolve()) for lab, path in (t.split("=", 1) for t in args.tree)]
    res = {"benchmark": "radix_compare", "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
           "cores": os.cpu_count(), "trees": {lab: {"path": str(t), "commit": commit(t)} for lab, t in trees},
           "sizes": {lab: sizes(t) for lab, t in trees}, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]  # alternate which tree goes first
            rnd = {"load_before": os.getloadavg()[0], "codec": {}, "dlrm": {}}
            for lab, t in order:
                rnd["codec"][lab] = codec(t, tmp)
                if not args.skip_dlrm:
                    rnd["dlrm"][lab] = dlrm(t, tmp)
            rnd["load_after"] = os.getloadavg()[0]
            res["rounds"].append(rnd)
            print(f"round {r + 1}/{args.rounds} done, load {rnd['load_before']:.2f} -> {rnd['load_after']:.2f}",
                  flush=True)
    (a, _), (b, _) = trees
    print(f"\nsizes (level 1, format 2, the wire chunk): {a} -> {b}")
    for rows in res["sizes"][a]:
        sa, sb = res["sizes"][a][rows], res["sizes"][b][rows]
        print(f"  {rows:>5} rows: {sa['frame_bytes']:7d} -> {sb['frame_bytes']:7d} B "
              f"({sb['frame_bytes'] / sa['frame_bytes'] - 1:+.1%}), ratio {sa['raw'] / sa['frame_bytes']:.2f}x -> "
              f"{sb['raw'] / sb['frame_bytes']:.2f}x, radix segments {sb['radix_segments']}/{sb['segments']}")
    print(f"\ncodec, {b}/{a} per round (speed ratios > 1: {b} faster)")
    for key in res["rounds"][0]["codec"][a]:
        for metric in ("ratio", "compress_GBps", "decompress_new_GBps", "decompress_into_GBps"):
            rs = [rnd["codec"][b][key][metric] / rnd["codec"][a][key][metric] for rnd in res["rounds"]]
            print(f"  {key:32} {metric:21} " + " ".join(f"{x:.3f}" for x in rs)
                  + f"   median {sorted(rs)[len(rs) // 2]:.3f}")
    if not args.skip_dlrm:
        print("\nDLRM main job (adaptive, level 1, shared memory), per round")
        for i, rnd in enumerate(res["rounds"]):
            for lab in (a, b):
                m = rnd["dlrm"][lab]
                print(f"  round {i + 1} {lab:8} all-to-all x{m['compression_ratio']:.3f}  sent "
                      f"{m['a2a_bytes_sent']} B (fwd {m['a2a_fwd_bytes_sent']}, bwd {m['a2a_bwd_bytes_sent']})"
                      f"  AUC {m['auc']!r}  logloss {m['logloss']!r}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
