"""The CPU format-2 encoder of two checkouts side by side: compress_chunks(format=2, level=1) of
a lookup-like all-to-all call (52 pieces of 2048 rows x 16 floats from 4096 distinct rows),
rounds alternating between the checkouts (one subprocess a round and tree), medians and their
ratio, JSON out. For changes that must leave the CPU encoder's speed as it was.

    python benchmarks/v2_encode_ab.py --trees /work/main /work/wt-cuda2 --rounds 6 \
        --json benchmarks/results/v2_encode_ab.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROUND = r"""
import time, torch, hvd_lossy
g = torch.Generator().manual_seed(0)
table = torch.randn(4096, 16, generator=g)
x = table[torch.randint(0, 4096, (52 * 2048,), generator=g)] * 0.1
rows = [2048] * 52
for _ in range(3):
    hvd_lossy.compress_chunks(x, rows, 0.03, level=1, format=2)
ts = []
for _ in range({repeat}):
    t = time.perf_counter()
    hvd_lossy.compress_chunks(x, rows, 0.03, level=1, format=2)
    ts.append(time.perf_counter() - t)
ts.sort()
print(ts[len(ts) // 2])
"""


def one_round(tree, repeat):
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", ROUND.format(repeat=repeat)], env=env, cwd=tree,
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, required=True, metavar=("BASE", "NEW"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    times = {t: [] for t in args.trees}
    for r in range(args.rounds):
        order = args.trees if r % 2 == 0 else args.trees[::-1]
        for tree in order:
            times[tree].append(one_round(tree, args.repeat))
    base, new = (statistics.median(times[t]) for t in args.trees)
    result = {"trees": args.trees, "rounds": args.rounds, "repeat": args.repeat,
              "median_ms": {t: statistics.median(v) * 1e3 for t, v in times.items()},
              "rounds_ms": {t: [x * 1e3 for x in v] for t, v in times.items()},
              "new_over_base": new / base, "loadavg": os.getloadavg()}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
