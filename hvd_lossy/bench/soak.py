"""Soak benchmark: random compressed all-to-alls, every received element checked.

    mpirun --oversubscribe -np 3 python -m hvd_lossy.bench soak [--calls N] [--seed S] [--json PATH]

Each round's settings come from a generator seeded with (seed, round), the same on every rank:
for every call dtype, row shape, splits (uneven, with zeros), abs or rel bound (0 included),
level, dither, NaN/Inf planted or not, and the process set (the world or, with 3+ ranks, one of
two overlapping sets); for the round how the calls run: one after the other, all started async
and finished in a shuffled order (calls on both sets in flight), or with autograd (the gradient
travels back compressed and its sender checks it). A rank's input is a function of (seed, call,
rank) only, so every receiver regenerates what each sender had and checks every element: the
received splits and shape, NaN where NaN was, +-Inf exactly, each finite value within its
frame's absolute bound in float64, the rank's own chunk bit for bit. A rank's own gradient is
checked the same way against what its receivers sent back.

Prints, and rank 0 writes to --json: calls, elements checked, violations (the target is 0) with
the first few described, resident memory after warm-up and at the end, seconds.
"""
import argparse
import datetime
import json
import os
import pathlib
import random
import subprocess
import sys
import time

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRAILING = ((), (4,), (16,), (3, 5), (32,))
ROWS = (0, 0, 1, 2, 3, 7, 20, 64)
BOUNDS = (0.0, 1e-3, 0.01, 0.05)
SPECIALS = (float("nan"), float("inf"), float("-inf"))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Call:
    """One all-to-all's settings, drawn alike on every rank; splits[i][j] are the rows member i
    of the call's set sends member j."""

    def __init__(self, g, number, sets):
        self.number = number
        self.set_name = g.choice(sorted(sets))
        self.members = sets[self.set_name][0]
        self.dtype, self.trailing = g.choice(DTYPES), g.choice(TRAILING)
        self.level, self.mode, self.eb = g.choice((1, 2)), g.choice(("rel", "abs")), g.choice(BOUNDS)
        self.dither = self.eb > 0 and g.random() < 0.25
        self.specials = g.random() < 0.3
        self.scale = g.choice((1e-3, 1.0, 50.0))
        n = len(self.members)
        self.splits = [[g.choice(ROWS) for _ in range(n)] for _ in range(n)]

    def compression(self, hvd):
        return hvd.Compression.lossy(self.eb, mode=self.mode, level=self.level, dither=self.dither)

    def rows_from(self, src):
        """(start, rows) of the piece member src sends each member, as lists."""
        row = self.splits[src]
        return [sum(row[:j]) for j in range(len(row))], row


def values(seed, call, who, rows, c, salt=0):
    """Rows of embedding-like values (a small table looked up, so duplicates occur) with NaN/Inf
    planted when the call asks: a function of its arguments only."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + call) * 4099 + who) * 7 + salt)
    table = torch.randn((16, *c.trailing), generator=g, dtype=torch.float64) * c.scale
    x = table[torch.randint(0, 16, (rows,), generator=g)]
    if c.specials and x.numel():
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=g)
        kinds = torch.randint(0, len(SPECIALS), (3,), generator=g)
        for p, k in zip(picks.tolist(), kinds.tolist()):
            flat[p] = SPECIALS[k]
    return x.to(c.dtype)


def frame_bound(ref, c):
    """The absolute bound of a frame of `ref`, by the codec's definition (float64)."""
    if c.mode == "abs":
        return c.eb
    x = ref.double()
    finite = x[torch.isfinite(x)]
    return c.eb * float(finite.max() - finite.min()) if finite.numel() else 0.0


class Checker:
    def __init__(self):
        self.elements, self.violations, self.first = 0, 0, []

    def fail(self, what):
        self.violations += 1
        if len(self.first) < 10:
            self.first.append(what)

    def piece(self, got, ref, c, exact, what):
        """Every element of `got` against `ref`; returns nothing, counts violations."""
        self.elements += ref.numel()
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return self.fail(f"{what}: got {got.dtype} {tuple(got.shape)}, expected "
                             f"{ref.dtype} {tuple(ref.shape)}")
        a, b = got.double().reshape(-1), ref.double().reshape(-1)
        nan = torch.isnan(b)
        inf = torch.isinf(b)
        finite = ~(nan | inf)
        bad = int((torch.isnan(a) != nan).sum()) + int((a[inf] != b[inf]).sum())
        if exact:
            bad += int((a[finite] != b[finite]).sum())
        else:
            bad += int(((a[finite] - b[finite]).abs() > frame_bound(ref, c)).sum())
            bad += int((~torch.isfinite(a[finite])).sum())
        if bad:
            self.fail(f"{what}: {bad} of {ref.numel()} elements wrong "
                      f"({c.dtype}, {c.mode} {c.eb}, level {c.level}, dither {c.dither})")


def check_output(out, got, seed, c, me, checker, what="output"):
    """The received rows of member `me`, piece by piece against each sender's regenerated input."""
    n = len(c.members)
    expected = [c.splits[src][me] for src in range(n)]
    if got.tolist() != expected:
        checker.fail(f"call {c.number}: received splits {got.tolist()}, expected {expected}")
        return
    offset = 0
    for src in range(n):
        starts, rows = c.rows_from(src)
        x = values(seed, c.number, c.members[src], sum(rows), c)
        ref = x[starts[me]:starts[me] + rows[me]]
        checker.piece(out[offset:offset + rows[me]], ref, c, src == me,
                      f"call {c.number} {what} from member {src}")
        offset += rows[me]


def gradient_of_output(seed, c, me):
    """What member `me` sends back as the gradient of its output: a piece per sender."""
    n = len(c.members)
    return torch.cat([values(seed, c.number, 1000 + c.members[me] * 97 + src,
                             c.splits[src][me], c, salt=1) for src in range(n)])


def check_gradient(g_x, seed, c, me, checker):
    n = len(c.members)
    starts, rows = c.rows_from(me)
    for dest in range(n):
        ref = values(seed, c.number, 1000 + c.members[dest] * 97 + me, rows[dest], c, salt=1)
        checker.piece(g_x[starts[dest]:starts[dest] + rows[dest]], ref, c, dest == me,
                      f"call {c.number} gradient from member {dest}")


def run(args, hvd, sets):
    checker, calls, rank = Checker(), 0, hvd.rank()
    warm_rss, t0, number = None, time.perf_counter(), 0
    for rnd in range(args.rounds):
        g = random.Random(args.seed * 1_000_003 + rnd)
        kind = g.choice(("sync", "async", "grad"))
        batch = [Call(g, number + i, sets) for i in range(g.choice((1, 2, 3, 4)))]
        number += len(batch)
        order = list(range(len(batch)))
        g.shuffle(order)
        mine = [c for c in batch if rank in c.members]
        started = []
        for c in mine:
            ps, me = sets[c.set_name][1], c.members.index(rank)
            starts, rows = c.rows_from(me)
            x = values(args.seed, c.number, rank, sum(rows), c)
            if kind == "grad":
                x.requires_grad_()
                out, got = hvd.alltoall(x, rows, compression=c.compression(hvd), process_set=ps)
                check_output(out.detach(), got, args.seed, c, me, checker)
                (g_x,) = torch.autograd.grad(out, x, grad_outputs=gradient_of_output(args.seed, c, me))
                check_gradient(g_x, args.seed, c, me, checker)
            elif kind == "async":
                started.append((c, me, hvd.alltoall_async(x, rows, compression=c.compression(hvd),
                                                          process_set=ps)))
            else:
                out, got = hvd.alltoall(x, rows, compression=c.compression(hvd), process_set=ps)
                check_output(out, got, args.seed, c, me, checker)
        by_number = {c.number: (c, me, h) for c, me, h in started}
        for i in order:  # the round's shared shuffled order, restricted to this rank's calls
            if batch[i].number in by_number:
                c, me, handle = by_number[batch[i].number]
                out, got = hvd.synchronize(handle)
                check_output(out, got, args.seed, c, me, checker, "async output")
        calls += len(mine)
        if rnd + 1 == args.warmup:
            warm_rss = rss_bytes()
        if args.progress and (rnd + 1) % args.progress == 0:
            print(f"rank {rank}: round {rnd + 1}, {calls} calls, {checker.elements} elements, "
                  f"{checker.violations} violations, RSS {rss_bytes() / 2**20:.1f} MiB, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    return checker, number, calls, warm_rss or rss_bytes(), rss_bytes(), seconds


def process_sets(size, use_sets):
    """name -> member global ranks: two overlapping sets with 3+ ranks (a set of every rank is
    the global one, which Horovod refuses to add)."""
    if not use_sets or size < 3:
        return {}
    return {"low": list(range(size - 1)), "high": list(range(1, size))}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hvd_lossy.bench soak",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000,
                        help="rounds of 1 to 4 all-to-alls (2.5 on average)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=None,
                        help="rounds before the warm-up RSS is taken (default rounds // 10)")
    parser.add_argument("--no-sets", action="store_true", help="the world only, no process sets")
    parser.add_argument("--progress", type=int, default=0, metavar="ROUNDS",
                        help="print the counts so far every ROUNDS rounds (0: never)")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here (rank 0)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.warmup = max(1, args.rounds // 10) if args.warmup is None else args.warmup

    import horovod.torch as horovod

    import hvd_lossy.torch as hvd
    # Static sets need the size before init: mpirun and horovodrun both say it.
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("HOROVOD_SIZE") or 1)
    members = process_sets(size, not args.no_sets)
    sets = [hvd.ProcessSet(m) for m in members.values()]
    hvd.init(process_sets=sets)
    world = list(range(hvd.size()))
    table = {"world": (world, hvd.global_process_set)}
    table.update({name: (m, ps) for (name, m), ps in zip(members.items(), sets)})
    checker, collective_calls, calls, warm, end, seconds = run(args, hvd, table)
    totals = horovod.allgather_object((calls, checker.elements, checker.violations, checker.first,
                                       end - warm, seconds))
    line = (f"rank {hvd.rank()}: soak {calls} calls, {checker.elements} elements checked, "
            f"{checker.violations} violations, RSS {warm / 2**20:.1f} -> {end / 2**20:.1f} MiB "
            f"after {args.warmup} warm-up rounds, {seconds:.1f} s")
    print(line, flush=True)
    if hvd.rank() == 0:
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": f"mpirun --oversubscribe -np {hvd.size()} python -m hvd_lossy.bench soak "
                       + " ".join(argv if argv is not None else sys.argv[2:]),
            "commit": _commit(), "ranks": hvd.size(), "rounds": args.rounds,
            "load_average": os.getloadavg(), "process_sets": members,
            "calls": collective_calls, "rank_calls": sum(t[0] for t in totals),
            "elements_checked": sum(t[1] for t in totals),
            "violations": sum(t[2] for t in totals),
            "first_violations": [v for t in totals for v in t[3]][:10],
            "rss_growth_bytes_per_rank": [t[4] for t in totals],
            "seconds_per_rank": [t[5] for t in totals]}
        print(json.dumps({k: report[k] for k in ("calls", "elements_checked", "violations",
                                                 "rss_growth_bytes_per_rank")}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {args.json}", flush=True)
    return 1 if sum(t[2] for t in totals) else 0


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
