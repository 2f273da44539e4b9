"""Short-block sections (issue #10, native/frame.h "Short-block section") before and after, on
the codes the README main job's 1 Gbit/s setting sends: two checkouts run alternately, each in
its own process, taking turns pass by pass, and each pass's fastest of many is compared (the
minimum is what the machine's other load disturbs least; turns spread that load on both).

    python benchmarks/short_blocks_bench.py --tree before=/path/a --tree after=/path/b \
        --frames DIR [--rounds 5] [--reps 40] [--json out.json]

DIR holds format-2 frames an all-to-all sent (one file a frame, as
benchmarks/radix_main_job_codes.py's hook saves them). Each frame is decoded once and coded
again with its own segments' rows, absolute bounds and dither seed (lookups deduplicated,
gradients dithered), so both trees code the same values to the same codes; what differs is how
the codes are packed. Per tree and direction: frame bytes, and the fastest pass of
compress_chunks and of decompress_chunks over all of that direction's frames, one thread.
HVD_LOSSY_NO_AVX512=1 / HVD_LOSSY_NO_AVX2=1 in the environment pass to both trees (the kernels of
machines without AVX-512 or AVX2).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

WORKER = r"""
import glob, json, os, sys, time, torch, hvd_lossy
# both workers on one core (they never run at once): on different cores the same tree measured
# up to 1.3x apart, one core being busier than the other
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
hvd_lossy.set_num_threads(1)
frames_dir = sys.argv[1]
jobs = {"fwd": [], "bwd": []}
for path in sorted(glob.glob(frames_dir + "/*.bin")):
    f = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8)
    segs = hvd_lossy.frame_info(f)["segments"]
    if not segs or any(s["level"] != 1 or s["lossless"] for s in segs):
        continue
    x = hvd_lossy.decompress(f)
    seed = segs[0]["dither_seed"]
    kind = "bwd" if seed is not None else "fwd"
    jobs[kind].append((x, [s["rows"] for s in segs], [s["eb_abs"] for s in segs], seed))
def enc(kind):
    return [hvd_lossy.compress_chunks(x, r, eb, mode="abs", level=1, format=2, dither=seed)[0]
            for x, r, eb, seed in jobs[kind]]
frames = {kind: enc(kind) for kind in jobs}
info = {}
for kind, js in jobs.items():
    segs = [s for f in frames[kind] for s in hvd_lossy.frame_info(f)["segments"]]
    info[kind] = {"frames": len(js), "raw_bytes": sum(x.numel() * x.element_size() for x, *_ in js),
                  "frame_bytes": sum(f.numel() for f in frames[kind]), "segments": len(segs),
                  "short_segments": sum(s.get("short_blocks", False) for s in segs)}
print(json.dumps(info), flush=True)
for line in sys.stdin:  # "compress fwd", "decompress bwd", ...: one timed pass, its seconds
    what, kind = line.split()
    t = time.perf_counter()
    if what == "compress":
        enc(kind)
    else:
        for fr in frames[kind]:
            hvd_lossy.decompress_chunks(fr)
    print(time.perf_counter() - t, flush=True)
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH, two of them")
    p.add_argument("--frames", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--json", type=pathlib.Path)
    a = p.parse_args(argv)
    trees = [t.split("=", 1) for t in a.tree]
    if len(trees) != 2:
        p.error(f"--tree twice (before and after), got {len(trees)}")
    workers = {}
    for name, path in trees:  # cwd too: `python -c` puts the working directory first on sys.path
        workers[name] = subprocess.Popen([sys.executable, "-c", WORKER, a.frames], cwd=path,
                                         env={"PYTHONPATH": path, "OMP_NUM_THREADS": "1",
                                              **{k: v for k, v in os.environ.items()
                                                 if k.startswith("HVD_LOSSY_NO_")}},
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = {name: json.loads(w.stdout.readline()) for name, w in workers.items()}
    kinds = [k for k in ("fwd", "bwd") if info[trees[0][0]][k]["frames"]]  # directions present

    def timed(name, what, kind):
        w = workers[name]
        w.stdin.write(f"{what} {kind}\n")
        w.stdin.flush()
        return float(w.stdout.readline())

    (b, _), (n, _) = trees
    rounds = []
    for r in range(a.rounds):
        # the trees take turns call by call, so that the machine's other load falls on both
        best = {(name, what, kind): float("inf") for name in (b, n)
                for what in ("compress", "decompress") for kind in kinds}
        for rep in range(a.reps):
            order = (b, n) if rep % 2 == 0 else (n, b)
            for what in ("compress", "decompress"):
                for kind in kinds:
                    for name in order:
                        best[(name, what, kind)] = min(best[(name, what, kind)], timed(name, what, kind))
        rounds.append({f"{name} {what} {kind}": v for (name, what, kind), v in best.items()})
        print(f"round {r + 1}: " + "  ".join(
            f"{kind} {what} {best[(b, what, kind)] / best[(n, what, kind)]:.3f}x"
            for kind in kinds for what in ("compress", "decompress"))
            + "  (before/after time of the fastest pass, > 1: after faster)")
    for w in workers.values():
        w.stdin.close()
        w.wait()
    for kind in kinds:
        print(f"{kind}: {info[n][kind]['short_segments']} of {info[n][kind]['segments']} segments in short "
              f"blocks; {info[b][kind]['raw_bytes'] / info[b][kind]['frame_bytes']:.2f}x -> "
              f"{info[n][kind]['raw_bytes'] / info[n][kind]['frame_bytes']:.2f}x "
              f"({info[n][kind]['frame_bytes'] / info[b][kind]['frame_bytes'] - 1:+.1%} bytes)")
        for what in ("compress", "decompress"):
            ratios = sorted(r[f"{b} {what} {kind}"] / r[f"{n} {what} {kind}"] for r in rounds)
            print(f"  {what}: median {ratios[len(ratios) // 2]:.3f}x over {len(ratios)} rounds"
                  f" ({ratios[0]:.3f}..{ratios[-1]:.3f})")
    if a.json:
        a.json.write_text(json.dumps({"benchmark": "short_blocks_bench", "trees": dict(trees),
                                      "frames": a.frames, "reps": a.reps, "info": info,
                                      "rounds": rounds}, indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
