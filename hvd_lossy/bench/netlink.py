"""The embedding all-to-all and DLRM training over an emulated network link.

    sudo python -m hvd_lossy.bench netlink [--rates 1,10,25,100,unlimited] [--ranks 2,3]
        [--repeat 3] [--json out.json] [--png out.png] [--quick] [-- extra train.py flags]

On one machine the ranks' all-to-all goes through shared memory, where compression only costs
time. This tool makes a private network namespace, limits its loopback with a token bucket
(`tc qdisc ... tbf rate R`) and runs every rank inside it with MPI over TCP, so every byte of
every collective crosses a link of R Gbit/s ("unlimited": the namespace's loopback with no
qdisc). At each rate, in one run, it measures

  a) the all-to-all's time per call for plain Horovod, fp16, lossy at 0.01/0.03/0.05 and auto
     (hvd_lossy.bench.netlink_worker, messages 64 KiB to 64 MiB a rank);
  b) the DLRM example's median step time (after warm-up steps) and AUC for uncompressed
     (--plain-horovod), fp16, lossy, adaptive and auto, at each --ranks, on Criteo-scale synthetic
     data at --embedding-dim 128 --batch-size 1024 and at the example's README defaults;
  c) with --parts user: the same step time for benchmarks/user_dlrm.py, a training loop written
     against plain horovod.torch as a user would (README, "Port your script"), dim 128, global
     batch 1024, 21 tables, switched only by its import line and `compression=`;
  d) the bytes that really crossed the link: the loopback's tx_bytes delta per run.

Where the unlimited link is measured too, every training record carries its `ceiling`: the
baseline's step on the unlimited link over its step at this rate, the speedup that free
communication would give; and at a limited rate its `ceiling_share`, the speedup over the
ceiling, with a 95% interval.

Within a rate the modes take turns, --repeat rounds, each round starting one mode later, so noise
and a run's place in the round hit all of them alike. Every run
gets the same Horovod and MPI settings (--cycle-time, --fusion-mb, --mpi-yield; recorded). A
mode that fails (e.g. auto before the library has it) is reported as failed with its error; the
others go on.

Needs root, `ip` and `tc` (iproute2) and `mpirun`; says which is missing otherwise. The
namespace is deleted afterwards, also on errors, Ctrl-C and SIGTERM. No address outside it is
used: MPI's TCP and out-of-band traffic are pinned to the namespace's `lo`.
"""
import argparse
import contextlib
import datetime
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from hvd_lossy.backend import YIELD_VARIABLE
from hvd_lossy.bench import _cli, machine
from hvd_lossy.bench.netlink_summary import (DLRM_BASELINE, alltoall_table, dlrm_table,
                                          pool_runs, rate_label, summarise_alltoall, summarise_dlrm,
                                          write_png)

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "dlrm" / "train.py"
USER = REPO / "benchmarks" / "user_dlrm.py"

DEFAULT_RATES = [1.0, 10.0, 25.0, 100.0, None]  # Gbit/s; None: no qdisc ("unlimited")
# Token bucket of the recipe measured in benchmarks/RESULTS.md: a burst of 512 KiB keeps short
# messages from being paced packet by packet; the latency only bounds the queue.
TBF = ["burst", "512kb", "latency", "100ms"]
A2A_SIZES_MIB = [1 / 16, 1 / 4, 1, 4, 16, 64]
A2A_MODES = ["plain", "fp16", "lossy 0.01", "lossy 0.03", "lossy 0.05", "auto"]

# DLRM modes: train.py flags. adaptive is the training recipe of scripts/run_main.sh, at level
# 1: level 2 decodes to the same bits (tests/test_format.py), so it trains identically, and its
# entropy coder costs more time than its ~20% fewer bytes save on any of these links.
DLRM_MODES = {
    "uncompressed": ["--plain-horovod"],
    "fp16": ["--compression", "fp16"],
    "lossy": ["--compression", "lossy", "--error-bound", "0.03"],
    "adaptive": ["--compression", "adaptive", "--error-bound", "0.03", "--backward-error-bound", "0.02",
                 "--dither", "backward", "--level", "1"],
    "auto": ["--compression", "lossy", "--error-bound", "0.03", "--auto"],
    # the bottom MLP runs while the lookups travel (train.py --overlap); asked for by name only
    "lossy-overlap": ["--compression", "lossy", "--error-bound", "0.03", "--overlap"],
    # lossy lookups, float16 gradients: the codec on the forward only (RESULTS, "Lossy lookups
    # with float16 gradients"); asked for by name only
    "lossy-fp16-backward": ["--compression", "lossy", "--error-bound", "0.03",
                            "--backward-error-bound", "fp16"],
}
# auto over that: its steps all lossy lookups and fp16 gradients, or all plain; by name only
DLRM_MODES["auto-fp16-backward"] = DLRM_MODES["lossy-fp16-backward"] + ["--auto"]
# lossy with the lookups reused from what the receiver holds, gradients summed by id (train.py
# --reuse; RESULTS, "Rows the receiver already holds"); by name only
DLRM_MODES["reuse"] = DLRM_MODES["lossy"] + ["--reuse"]
# the drop-in with compression none: what hvd_lossy's own path costs beside Horovod's (the
# floor of auto's cost where it decides plain); by name only
DLRM_MODES["none"] = ["--compression", "none"]
DEFAULT_DLRM_MODES = ["uncompressed", "fp16", "lossy", "adaptive", "auto"]
# user_dlrm.py's modes, named as the example's so that one summary serves both.
USER_MODES = {"uncompressed": ["--mode", "plain"], "fp16": ["--mode", "fp16"],
              "lossy": ["--mode", "lossy", "--error-bound", "0.03"],
              "auto": ["--mode", "auto", "--error-bound", "0.03"], "none": ["--mode", "none"],
              "lossy-fp16-backward": ["--mode", "lossy-fp16-backward", "--error-bound", "0.03"]}
DEFAULT_USER_MODES = ["uncompressed", "fp16", "lossy", "auto"]
# user_dlrm.py's settings: DLRM's dot interaction, the concatenation (3.6x the dense parameters:
# the dense allreduce carries more of a step's bytes than the all-to-all), and the dot one with
# its dense allreduce as float16 (Horovod's DistributedOptimizer compression=, every mode) or, in
# the lossy modes, coded by the all-to-all's compressor (hvd_lossy's DistributedOptimizer)
USER_SETTINGS = {"user-d128": [], "user-d128-cat": ["--interaction", "cat"],
                 "user-d128-dense-fp16": ["--dense-fp16"], "user-d128-dense-lossy": ["--dense-lossy"]}
USER_SETTING = "user-d128"
README_BATCH = 128  # the example's default --batch-size


def batch_for(batch, ranks):
    """The multiple of `ranks` nearest to `batch` (ties: the smaller): train.py splits the global
    batch evenly, so 3 ranks train on 1023 rows instead of 1024. At least one row a rank."""
    below = batch - batch % ranks
    return max(ranks, below if batch - below <= below + ranks - batch else below + ranks)


# Train.py flags of each DLRM setting, for `ranks` ranks. criteo-d128: Criteo-scale synthetic rows
# (published cardinalities capped at 100k) at the paper's width, N and --steps sized so that a run
# takes well under a minute at 1 Gbit/s on 2 cores.
SETTINGS = {
    "criteo-d128": lambda o, ranks: ["--synthetic", str(o.synthetic), "--synthetic-test", str(o.synthetic_test),
                                     "--embedding-dim", "128", "--batch-size", str(batch_for(1024, ranks)),
                                     "--steps", str(o.steps)],
    # the bundled Criteo rows, every flag at its default (README)
    "readme": lambda o, ranks: ([] if README_BATCH % ranks == 0 else
                                ["--batch-size", str(batch_for(README_BATCH, ranks))]),
    # scripts/run_main.sh: the bundled rows at the paper's width, 3 epochs (21 steps, seconds a run)
    "bundled-d128": lambda o, ranks: ["--embedding-dim", "128", "--batch-size", str(batch_for(1024, ranks)),
                                      "--epochs", "3"],
    # --quick: a few steps of a small model, seconds a run
    "tiny": lambda o, ranks: ["--synthetic", "4096", "--synthetic-test", "512", "--embedding-dim", "16",
                              "--batch-size", str(batch_for(256, ranks)), "--steps", str(o.steps)],
}
COMMON_TRAIN = ["--no-progress", "--eval-points", "0", "--seed", "0"]
# What the JSON's records hold (also written into it).
FIELDS = {
    "dlrm": "per (bandwidth_gbit, ranks, setting, mode): iter_seconds_median = median over rounds of "
            "each run's median step (rank 0, warm-up steps left out); speedup = uncompressed's / this; "
            "speedup_paired = median over rounds of uncompressed's step / this mode's in the same "
            "round (back to back: a slow spell of the machine hits both); paired_range = the "
            "least and largest of those rounds' ratios; speedup_geomean, speedup_interval = their "
            "geometric mean and its 95% bootstrap interval (10,000 resamples, seed 0; two rounds "
            "or more); auto_decisions = per run, in round order, "
            "[decision, lossy calls, calls] of its forward auto compressor (None without auto); "
            "steps_seconds_total = median over rounds of a run's summed steps (warm-up included), "
            "speedup_total = uncompressed's / this (what auto's probing costs shows here); "
            "ceiling = uncompressed's on the unlimited link / uncompressed's at this rate; "
            "ceiling_share, ceiling_share_interval = at a limited rate, the geometric mean of "
            "uncompressed's steps on the unlimited link over that of this mode's here (speedup "
            "over ceiling) and its 95% bootstrap interval, the two resampled apart (the rates "
            "run one after another: no round pairs them; pooled, each run's two sides together); "
            "auc = mean over rounds; wire_bytes = median tx_bytes delta of the namespace's lo over a "
            "whole run (all ranks, every collective, start-up and evaluation included); "
            "a2a_bytes_sent = the example's own all-to-all count; status ok|failed (+ error); "
            "settings user-*: benchmarks/user_dlrm.py (no AUC, no a2a counts)",
    "alltoall": "per (bandwidth_gbit, ranks, mode, bytes): bytes = the message each rank hands to the "
                "all-to-all (its own chunk included); ms_per_call = median over rounds of the slowest "
                "rank's median call; wire_bytes = tx_bytes of lo per call (all ranks, headers and "
                "Horovod control traffic included); speedup = plain's ms / this",
    "bandwidth_gbit": "tbf rate in Gbit/s; null = no qdisc (unlimited)",
    "dlrm_runs, alltoall_runs": "every single run / round behind the summaries",
}
EXIT_UNAVAILABLE = 3  # distinct from usage errors (2): scripts/run_main.sh falls back on it


class Unavailable(RuntimeError):
    """This machine cannot emulate a link; the message names what is missing."""


# ---------------------------------------------------------------- preconditions


def missing_requirements():
    """What stops us creating a limited namespace, as readable phrases (empty: nothing)."""
    problems = [f"`{tool}` not found on PATH ({why})" for tool, why in (
        ("ip", "iproute2: creates the network namespace"),
        ("tc", "iproute2: limits its loopback"),
        ("mpirun", "Open MPI: runs the ranks inside it")) if shutil.which(tool) is None]
    if os.geteuid() != 0:
        problems.append(f"not root (euid {os.geteuid()}): network namespaces and qdiscs need root")
    return problems


def preflight(probe_name=None):
    """Raises Unavailable unless root, ip, tc and mpirun are there and a namespace with a tbf
    qdisc can really be made (containers may forbid either); the probe namespace is removed."""
    problems = missing_requirements()
    if problems:
        raise Unavailable("cannot emulate a link: " + "; ".join(problems))
    with Namespace(probe_name or f"hvdl-probe-{os.getpid()}") as ns:
        ns.set_rate(1.0)


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise Unavailable(f"`ip {' '.join(args)}` failed (exit {proc.returncode}): "
                          f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def namespaces():
    """Names of the existing network namespaces."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


class Namespace:
    """A network namespace of our own with its loopback up; deleted on exit from `with`.

    Everything run through `command()` lives in it, so traffic can only reach its own `lo`."""

    def __init__(self, name):
        if not name.startswith("hvdl-") or "/" in name:
            raise ValueError(f"namespace name must start with 'hvdl-' and hold no '/', got {name!r}")
        self.name = name
        self.rate = None

    def __enter__(self):
        if self.name in namespaces():
            raise Unavailable(f"network namespace {self.name} already exists; another run is using it "
                              f"(or a killed one left it: `ip netns del {self.name}`)")
        proc = _ip("netns", "add", self.name, check=False)
        if proc.returncode != 0:
            raise Unavailable(f"cannot create network namespace {self.name}: `ip netns add` said: "
                              f"{proc.stderr.strip() or proc.returncode}")
        try:  # from here on the namespace exists: whatever interrupts us deletes it
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def command(self, argv):
        return ["ip", "netns", "exec", self.name, *argv]

    def set_rate(self, gbit):
        """Loopback limited to `gbit` Gbit/s, or no qdisc at all for None."""
        if gbit is None:
            # `del` fails when there is no root qdisc yet: that is already unlimited.
            subprocess.run(self.command(["tc", "qdisc", "del", "dev", "lo", "root"]), capture_output=True)
        else:
            proc = subprocess.run(self.command(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf",
                                                "rate", f"{gbit:g}gbit", *TBF]), capture_output=True, text=True)
            if proc.returncode != 0:
                raise Unavailable(f"cannot limit {self.name}'s loopback to {gbit:g} Gbit/s with tc tbf "
                                  f"(is the sch_tbf module available?): {proc.stderr.strip()}")
        self.rate = gbit

    def tx_bytes(self):
        """Bytes sent on the namespace's loopback so far (= bytes that crossed the link)."""
        proc = subprocess.run(self.command(["cat", "/sys/class/net/lo/statistics/tx_bytes"]),
                              capture_output=True, text=True, check=True)
        return int(proc.stdout)

    def close(self):
        """Ends whatever still runs inside (only our own runs can), then deletes the namespace."""
        pids = _ip("netns", "pids", self.name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", self.name, check=False)
        if self.name in namespaces():
            print(f"netlink: WARNING: could not delete network namespace {self.name}; "
                  f"remove it with `ip netns del {self.name}`", file=sys.stderr)


@contextlib.contextmanager
def signals_raise():
    """SIGTERM and SIGHUP raise SystemExit (SIGINT already raises KeyboardInterrupt), so the
    `finally` and `with` blocks that delete the namespace run on them too."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---------------------------------------------------------------- running ranks in the namespace


def horovod_env(opts):
    """The Horovod and MPI settings every mode gets, as environment variables: Open MPI's yield
    always, Horovod's settings where given (else Horovod's own)."""
    env = {}
    # Set for every mode, plain Horovod's too: hvd_lossy.torch.init() turns it on where the
    # launch left it unset (RESULTS, "MPI's polling"), and a comparison needs the same MPI.
    env[YIELD_VARIABLE] = "1" if opts.mpi_yield == "on" else "0"
    if opts.cycle_time is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{opts.cycle_time:g}"
    if opts.fusion_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(opts.fusion_mb * 2**20))
    return env


def mpirun(ranks, env_names, argv):
    """mpirun of `argv` on `ranks` processes of this machine, MPI pinned to TCP over `lo`."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
           "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo",
           "--mca", "oob_tcp_if_include", "lo"]
    for name in sorted(env_names):
        cmd += ["-x", name]
    return cmd + argv


def run_in(ns, ranks, argv, opts, timeout):
    """Runs `argv` under mpirun inside `ns`. Returns dict(rc, output, seconds, wire_bytes).
    Whatever ends this call early (timeout, Ctrl-C, an exception) ends the ranks first."""
    extra = horovod_env(opts)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = ns.command(mpirun(ranks, ["OMP_NUM_THREADS", "PYTHONPATH", "PATH", *extra], argv))
    before = ns.tx_bytes()
    t0 = time.perf_counter()
    # Own session: a Ctrl-C reaches only us, and we end the whole launch ourselves.
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, rc = f"timed out after {timeout:g} s", None
    except BaseException:
        _kill_group(proc)
        raise
    return dict(rc=rc, output=output, seconds=time.perf_counter() - t0, wire_bytes=ns.tx_bytes() - before)


def _kill_group(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def error_of(output, rc):
    """The line that says why a launch failed: train.py's own error line when there is one."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    for line in lines:
        if line.startswith("train.py: error:"):
            return line
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:400]
    return f"exit status {rc}: " + " | ".join(lines[-3:])[:400]


# ---------------------------------------------------------------- the two measurements


def run_alltoall(ns, rate, ranks, opts, workdir):
    """All-to-all records at one rate: one launch, the modes taking turns inside it."""
    out = workdir / f"a2a_{rate}_{ranks}.json"
    argv = [sys.executable, "-m", "hvd_lossy.bench.netlink_worker", "--modes", ",".join(opts.a2a_modes),
            "--sizes", ",".join(f"{s:g}" for s in opts.sizes), "--iters", str(opts.iters),
            "--repeat", str(opts.repeat), "--json", str(out)]
    run = run_in(ns, ranks, argv, opts, opts.timeout)
    base = {"bandwidth_gbit": rate, "ranks": ranks}
    if run["rc"] != 0 or not out.exists():
        return [dict(base, mode=m, bytes=None, status="failed", error=error_of(run["output"], run["rc"]))
                for m in opts.a2a_modes]
    return [dict(base, **r) for r in json.loads(out.read_text())["results"]]


def _train(ns, rate, ranks, setting, mode, rep, opts, argv, args, out):
    """Launches one training run that writes its JSON to `out`: (its record, that JSON), the
    JSON None for a failed run, whose record then carries the error instead of numbers. With
    --keep-metrics the JSON moves there (its per-step times are what a summary leaves out)."""
    run = run_in(ns, ranks, argv, opts, opts.timeout)
    rec = {"bandwidth_gbit": rate, "ranks": ranks, "setting": setting, "mode": mode, "repeat": rep,
           "train_args": args, "wire_bytes": run["wire_bytes"], "wall_seconds": run["seconds"]}
    if run["rc"] != 0 or not out.exists():
        return dict(rec, status="failed", error=error_of(run["output"], run["rc"])), None
    m = json.loads(out.read_text())
    if opts.keep_metrics:
        out.rename(opts.keep_metrics / out.name)
    return rec, m


def _step_fields(steps, warmup):
    warm = min(warmup, len(steps) - 1)  # at least one step is left to take the median of
    return dict(status="ok", iter_seconds_median=statistics.median(steps[warm:]), warmup_steps=warm,
                steps_seconds_total=sum(steps))


def run_dlrm(ns, rate, ranks, setting, mode, rep, opts, workdir):
    """One training run of the example: its record (auto's report when it ran auto, as
    run_user's)."""
    metrics = workdir / f"dlrm_{rate}_{ranks}_{setting}_{mode}_{rep}.json"
    args = SETTINGS[setting](opts, ranks) + DLRM_MODES[mode] + COMMON_TRAIN + opts.train_args
    argv = [sys.executable, str(TRAIN), *args, "--label", mode, "--metrics-out", str(metrics)]
    rec, m = _train(ns, rate, ranks, setting, mode, rep, opts, argv, args, metrics)
    if m is None:
        return rec
    return dict(rec, **_step_fields(m["iter_seconds"], opts.warmup), steps=m["steps"], auc=m["auc"],
                logloss=m["logloss"], a2a_bytes_sent=m["a2a_bytes_sent"],
                a2a_bytes_plain=m["a2a_bytes_plain"], compression_ratio=m["compression_ratio"],
                train_seconds=m["train_seconds"], auto=m.get("auto") or None)


def run_user(ns, rate, ranks, setting, mode, rep, opts, workdir):
    """One run of the user-style script: a record in the schema of run_dlrm's (no AUC; auto's
    report when it ran auto)."""
    out = workdir / f"{setting}_{rate}_{ranks}_{mode}_{rep}.json"
    args = ["--dim", "128", "--global-batch", str(batch_for(1024, ranks)), "--steps", str(opts.steps),
            *USER_SETTINGS[setting], *USER_MODES[mode]]
    argv = [sys.executable, str(USER), *args, "--json", str(out)]
    rec, m = _train(ns, rate, ranks, setting, mode, rep, opts, argv, args, out)
    if m is None:
        return rec
    return dict(rec, **_step_fields(m["step_seconds"], opts.warmup), steps=len(m["step_seconds"]),
                auc=None, auto=(m.get("report") or {}).get("auto"))


# ---------------------------------------------------------------- command line


def _rates(text):
    out = []
    for v in text.split(","):
        v = v.strip().lower()
        if v in ("unlimited", "none", "inf"):
            out.append(None)
            continue
        try:
            g = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"rates are Gbit/s numbers or 'unlimited', got {v!r}") from None
        if g <= 0:
            raise argparse.ArgumentTypeError(f"a rate must be > 0 Gbit/s, got {v!r}")
        out.append(g)
    return out


def _choices(allowed):
    def parse(text):
        got = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in got if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; expected some of {list(allowed)}")
        return got
    return parse


def parser():
    # Its defaults depend on --quick, so the help texts state them (no automatic "(default: None)").
    p = _cli.Parser(prog="python -m hvd_lossy.bench netlink", description=__doc__.split("\n")[0],
                    epilog="Flags after `--` go to every train.py run.",
                    formatter_class=argparse.HelpFormatter)
    p.add_argument("--rates", type=_rates, default=None,
                   help="link rates in Gbit/s and/or 'unlimited' (default 1,10,25,100,unlimited)")
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=None,
                   help="rank counts, comma-separated (default 2,3; more than 2 oversubscribes 2 cores)")
    p.add_argument("--repeat", type=int, default=None, help="rounds of every mode at each rate (default 3)")
    p.add_argument("--parts", type=_choices(["alltoall", "dlrm", "user"]), default=["alltoall", "dlrm"],
                   help="what to measure: alltoall, dlrm (the example), user (benchmarks/user_dlrm.py) "
                        "(default alltoall,dlrm)")
    p.add_argument("--a2a-modes", type=_choices(A2A_MODES), default=A2A_MODES,
                   help="all-to-all modes (default %s)" % ",".join(A2A_MODES))
    p.add_argument("--dlrm-modes", type=_choices(DLRM_MODES), default=list(DEFAULT_DLRM_MODES),
                   help="DLRM modes, of %s (default %s; speedups are against %s)" % (
                       ",".join(DLRM_MODES), ",".join(DEFAULT_DLRM_MODES), DLRM_BASELINE))
    p.add_argument("--user-modes", type=_choices(USER_MODES), default=list(DEFAULT_USER_MODES),
                   help="modes of the user script, of %s (default %s)" % (
                       ",".join(USER_MODES), ",".join(DEFAULT_USER_MODES)))
    p.add_argument("--settings", type=_choices(SETTINGS), default=None,
                   help="DLRM settings (default criteo-d128,readme)")
    p.add_argument("--user-settings", type=_choices(USER_SETTINGS), default=[USER_SETTING],
                   help="settings of the user script, of %s (default %s: DLRM's dot interaction; "
                        "-cat: the concatenation; -dense-fp16: the dense allreduce as float16; "
                        "-dense-lossy: the lossy modes' dense gradients coded too)" % (
                            ",".join(USER_SETTINGS), USER_SETTING))
    p.add_argument("--sizes", type=lambda s: [float(v) for v in s.split(",")], default=None,
                   help="all-to-all message sizes in MiB a rank (default 0.0625,0.25,1,4,16,64)")
    p.add_argument("--iters", type=int, default=None, help="timed all-to-all calls per mode and round (default 5)")
    p.add_argument("--synthetic", type=int, default=100_000, help="criteo-d128: synthetic training rows")
    p.add_argument("--synthetic-test", type=int, default=10_000, help="criteo-d128: held-out rows")
    p.add_argument("--steps", type=int, default=None, help="criteo-d128/tiny: training steps (default 40)")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the median step time (default 5)")
    p.add_argument("--cycle-time", type=float, default=None, metavar="MS",
                   help="HOROVOD_CYCLE_TIME for every run (default: Horovod's own)")
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="HOROVOD_FUSION_THRESHOLD in MiB for every run (default: Horovod's own)")
    p.add_argument("--mpi-yield", choices=("on", "off"), default="on",
                   help="Open MPI's mpi_yield_when_idle for every run, plain Horovod's too: on (1, "
                        "what hvd_lossy.torch.init() sets by default) or off (0, Open MPI's own "
                        "where ranks do not outnumber cores) (default on)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch before it is killed")
    p.add_argument("--namespace", default=None, help="namespace name (default hvdl-<pid>; must start with hvdl-)")
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--png", type=pathlib.Path, default=None)
    p.add_argument("--keep-metrics", type=pathlib.Path, default=None, metavar="DIR",
                   help="keep every training run's JSON here (the example's metrics, the user "
                        "script's step times and comm_stats)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny run for tests: 1 Gbit/s, 2 ranks, 1 round, 64 KiB and 1 MiB messages, "
                        "the tiny DLRM setting (explicit flags still win)")
    p.add_argument("--check", action="store_true",
                   help="only say whether this machine can emulate a link (exit 0) or why not (exit 3)")
    p.add_argument("--pool", type=pathlib.Path, nargs="+", default=None, metavar="JSON",
                   help="measure nothing: summarise the training runs of these --json outputs "
                        "together (each file's rounds paired within it), for intervals over "
                        "more rounds than one run has; with --json, write that summary")
    return p


def parse(argv):
    argv = list(argv)
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    opts.train_args = train_args
    quick = dict(rates=[1.0], ranks=[2], repeat=1, settings=["tiny"], sizes=[1 / 16, 1], iters=2, steps=6,
                 warmup=2)
    full = dict(rates=DEFAULT_RATES, ranks=[2, 3], repeat=3, settings=["criteo-d128", "readme"],
                sizes=A2A_SIZES_MIB, iters=5, steps=40, warmup=5)
    for key, value in (quick if opts.quick else full).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    for name in ("repeat", "iters", "steps"):
        if getattr(opts, name) < 1:
            parser().error(f"--{name} must be >= 1, got {getattr(opts, name)}")
    if opts.warmup < 0:
        parser().error(f"--warmup must be >= 0, got {opts.warmup}")
    if any(n < 2 for n in opts.ranks):
        parser().error(f"--ranks must be >= 2 (an all-to-all needs a peer), got {opts.ranks}")
    for part, script in (("dlrm", TRAIN), ("user", USER)):
        if part in opts.parts and not script.exists():
            parser().error(f"the {part} part needs {script} (a source checkout); use --parts alltoall")
    return opts


def meta(opts, argv):
    return {"benchmark": "netlink", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m hvd_lossy.bench netlink " + " ".join(argv),
            "machine": {"cpus": os.cpu_count(), "host": os.uname().nodename},
            "cpu": machine.describe(),
            "link": {"qdisc": "tbf rate <R>gbit " + " ".join(TBF), "unlimited": "no qdisc",
                     "transport": "mpirun --mca btl tcp,self over the namespace's lo"},
            "horovod": {"cycle_time_ms": opts.cycle_time, "fusion_mb": opts.fusion_mb,
                        "mpi_yield_when_idle": opts.mpi_yield,
                        "env": horovod_env(opts),
                        "inherited": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}},
            "rates_gbit": opts.rates, "ranks": opts.ranks, "repeat": opts.repeat, "warmup_steps": opts.warmup,
            "dlrm_modes": {m: DLRM_MODES[m] for m in opts.dlrm_modes}, "a2a_modes": opts.a2a_modes,
            "user_modes": {m: USER_MODES[m] for m in opts.user_modes},
            "user_settings": {s: USER_SETTINGS[s] for s in opts.user_settings},
            "train_args": opts.train_args,
            "fields": FIELDS}


def turns(modes, rep):
    """The modes in round `rep`'s order: each round starts one mode later than the last."""
    k = rep % len(modes) if modes else 0
    return list(modes[k:]) + list(modes[:k])


def _outcome(rec):
    """A training run's line in the log: its median step, AUC (the example's) and link bytes."""
    if rec["status"] != "ok":
        return f"FAILED: {rec['error']}"
    auc = f", AUC {rec['auc']:.4f}" if rec.get("auc") is not None else ""
    return (f"{1e3 * rec['iter_seconds_median']:.1f} ms/step{auc}, "
            f"{rec['wire_bytes'] / 1e6:.1f} MB on the link")


def measure(ns, opts, log=print):
    """Every measurement at every rate; returns (dlrm runs, all-to-all rows)."""
    dlrm, a2a = [], []
    with tempfile.TemporaryDirectory(prefix="hvdl-netlink-") as tmp:
        work = pathlib.Path(tmp)
        for rate in opts.rates:
            ns.set_rate(rate)
            for ranks in opts.ranks:
                if "alltoall" in opts.parts:
                    log(f"[{rate_label(rate)}, {ranks} ranks] all-to-all: {', '.join(opts.a2a_modes)}")
                    a2a += run_alltoall(ns, rate, ranks, opts, work)
                for rep in range(opts.repeat if "user" in opts.parts else 0):
                    for setting in opts.user_settings:
                        for mode in turns(opts.user_modes, rep):
                            rec = run_user(ns, rate, ranks, setting, mode, rep, opts, work)
                            log(f"[{rate_label(rate)}, {ranks} ranks] {setting} {mode} #{rep}: "
                                f"{_outcome(rec)}")
                            dlrm.append(rec)
                if "dlrm" not in opts.parts:
                    continue
                for setting in opts.settings:
                    for rep in range(opts.repeat):
                        for mode in turns(opts.dlrm_modes, rep):
                            rec = run_dlrm(ns, rate, ranks, setting, mode, rep, opts, work)
                            log(f"[{rate_label(rate)}, {ranks} ranks] dlrm {setting} {mode} #{rep}: "
                                f"{_outcome(rec)}")
                            dlrm.append(rec)
    return dlrm, a2a


def pooled(paths, out=None):
    """--pool: the training table of several runs' JSONs as one (no root, nothing launched)."""
    reports = []
    for path in paths:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"netlink: --pool {path}: {e}") from None
        if not isinstance(report, dict) or not isinstance(report.get("dlrm_runs"), list):
            raise SystemExit(f"netlink: --pool {path}: no 'dlrm_runs' list: expected the --json "
                             f"of a netlink run")
        reports.append(report)
    runs = pool_runs([r["dlrm_runs"] for r in reports])
    dlrm = summarise_dlrm(runs)
    print(f"DLRM training, {len(paths)} runs pooled ({', '.join(map(str, paths))}); each file's "
          f"rounds paired within it\n" + dlrm_table(dlrm))
    if out:
        _write_json(out, {"benchmark": "netlink", "pooled": [str(p) for p in paths],
                          "commands": [r.get("command") for r in reports],
                          "dates": [r.get("date") for r in reports],
                          "cpus": [r.get("cpu") for r in reports],
                          "fields": FIELDS, "dlrm": dlrm, "dlrm_runs": runs})
    return 0


def _write_json(path, report):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = parse(argv)
    if opts.pool:
        return pooled(opts.pool, opts.json)
    name = opts.namespace or f"hvdl-{os.getpid()}"
    try:
        if opts.check:
            preflight(f"{name}-probe" if opts.namespace else None)
            print("netlink: ok: root, ip, tc and mpirun present; a namespace with a tbf qdisc works")
            return 0
        missing = missing_requirements()
        if missing:
            raise Unavailable("cannot emulate a link: " + "; ".join(missing))
        if opts.keep_metrics:
            opts.keep_metrics.mkdir(parents=True, exist_ok=True)
        with signals_raise(), Namespace(name) as ns:
            print(f"netlink: namespace {name}, rates {', '.join(map(rate_label, opts.rates))}", flush=True)
            runs, rows = measure(ns, opts, log=lambda s: print(s, flush=True))
    except Unavailable as e:
        print(f"netlink: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        print(f"netlink: interrupted; namespace {name} deleted, nothing written", file=sys.stderr)
        return 130
    dlrm, a2a = summarise_dlrm(runs), summarise_alltoall(rows)
    if a2a:
        print("\nall-to-all over the emulated link\n" + alltoall_table(a2a))
    if dlrm:
        print(f"\nDLRM training (median step after {opts.warmup} warm-up steps, median over "
              f"{opts.repeat} rounds; link MB: bytes that crossed the link in a run)\n" + dlrm_table(dlrm))
    if opts.json:
        _write_json(opts.json, dict(meta(opts, argv), dlrm=dlrm, alltoall=a2a, dlrm_runs=runs,
                                    alltoall_runs=rows))
    if opts.png:
        opts.png.parent.mkdir(parents=True, exist_ok=True)
        write_png(opts.png, dlrm, a2a)
        print(f"wrote {opts.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
