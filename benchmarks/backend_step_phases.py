"""Where the DLRM example's training step spends its time, on Horovod and on torch.distributed.

    sudo python benchmarks/backend_step_phases.py [--rates unlimited,1] [--modes plain,lossy]

Runs examples/dlrm/train.py at backend_netlink.py's setting (criteo-d128, 2 ranks, 40 steps)
in a private namespace (hvd_lossy.bench.netlink's), with its phases timed by wrapping them
(median per step after 5 warm-up steps, rank 0): ids (the ids' allgather), lookup, a2a start
and a2a finish (the forward all-to-all), bottom and top (the MLPs), backward (autograd,
the gradients' all-to-all included), dense opt (the dense gradients' sum and step: where a
rank waits for the slower one), emb opt, rest (loss, bookkeeping).
"""
import argparse
import collections
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = {"plain": ["--plain-horovod"], "lossy": ["--compression", "lossy", "--error-bound", "0.03"]}
PHASES = ("ids", "lookup", "a2a start", "a2a finish", "bottom", "top", "backward", "dense opt",
          "emb opt", "rest", "iter")


def worker(argv):
    """One rank: train.py with its phases timed; rank 0 prints them as one JSON line."""
    sys.path.insert(0, str(REPO / "examples" / "dlrm"))
    import torch
    import comm
    import exchange
    import model
    import train
    acc, steps = collections.defaultdict(float), []

    def timed(fn, key):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t0
        return call

    for owner, attr, key in ((exchange.EmbeddingExchange, "gather_ids", "ids"),
                             (exchange.EmbeddingExchange, "start", "a2a start"),
                             (exchange.EmbeddingExchange, "finish", "a2a finish"),
                             (model.DenseArch, "forward_bottom", "bottom"),
                             (model.DenseArch, "forward_top", "top"),
                             (model.LocalTables, "forward", "lookup"),
                             (torch.Tensor, "backward", "backward")):
        setattr(owner, attr, timed(getattr(owner, attr), key))
    build = train.build_model

    def build_timed(*args, **kwargs):
        built = build(*args, **kwargs)
        for opt, key in ((built[4], "dense opt"), (built[5], "emb opt")):
            if opt is not None:
                opt.step = timed(opt.step, key)
        return built
    train.build_model = build_timed
    split = comm.Link.step_split

    def step_split(self, iter_s, ex):
        steps.append(dict(acc, iter=iter_s))
        acc.clear()
        return split(self, iter_s, ex)
    comm.Link.step_split = step_split
    run = train.train

    def train_timed(args):
        result = run(args)
        if train.hvd.rank() == 0:
            kept = steps[5:]
            med = {k: statistics.median(s.get(k, 0.0) for s in kept) for k in PHASES if k != "rest"}
            med["rest"] = med["iter"] - sum(v for k, v in med.items() if k != "iter")
            print("PHASES " + json.dumps(med), flush=True)
        return result
    train.train = train_timed
    sys.argv = ["train.py", *argv]
    train.main()


def run_one(ns, backend, mode, opts):
    from hvd_lossy.bench import netlink as nl
    args = nl.SETTINGS["criteo-d128"](opts, 2) + MODES[mode] + nl.COMMON_TRAIN + [
        "--backend", backend]
    me = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if backend == "horovod":
        cmd = nl.mpirun(2, ["OMP_NUM_THREADS", "PYTHONPATH", "PATH"], me)
    else:
        cmd = [str(pathlib.Path(sys.executable).parent / "torchrun"), "--standalone",
               "--nproc_per_node", "2", *me[1:]]
    proc = subprocess.run(ns.command(cmd), env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=opts.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("PHASES "):
            return json.loads(line[len("PHASES "):])
    raise RuntimeError(f"{backend} {mode} failed (status {proc.returncode}):\n"
                       f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="unlimited,1", help="Gbit/s or 'unlimited', comma-separated")
    p.add_argument("--modes", default="plain,lossy")
    p.add_argument("--backends", default="horovod,torch")
    p.add_argument("--namespace", default=f"hvdl-phases{os.getpid()}",
                   help="name of the private namespace (must start with hvdl-)")
    p.add_argument("--json", type=pathlib.Path)
    opts = p.parse_args(argv)
    opts.synthetic, opts.synthetic_test, opts.steps, opts.timeout = 100_000, 10_000, 40, 600
    from hvd_lossy.bench import netlink as nl
    runs = []
    with nl.signals_raise(), nl.Namespace(opts.namespace) as ns, tempfile.TemporaryDirectory():
        for rate in [None if r == "unlimited" else float(r) for r in opts.rates.split(",")]:
            ns.set_rate(rate)
            for backend in opts.backends.split(","):
                for mode in opts.modes.split(","):
                    med = run_one(ns, backend, mode, opts)
                    runs.append(dict(bandwidth_gbit=rate, backend=backend, mode=mode, ms={
                        k: 1e3 * v for k, v in med.items()}, load=os.getloadavg()[0]))
                    print(f"{'unlimited' if rate is None else f'{rate:g} Gbit/s':10} {backend:8} "
                          f"{mode:6} " + " ".join(f"{k}={1e3 * med[k]:.1f}" for k in PHASES),
                          flush=True)
    if opts.json:
        opts.json.write_text(json.dumps(dict(
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command="python benchmarks/backend_step_phases.py " + " ".join(argv), runs=runs),
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
