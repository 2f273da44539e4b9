"""Where one lossy embedding exchange spends its time, on Horovod and on torch.distributed.

    sudo python benchmarks/backend_profile.py [--rates unlimited,1] [--iters 30] [--json out.json]

2 ranks in a private namespace (hvd_lossy.bench.netlink's; its loopback unlimited or limited
with tbf), each sending the DLRM example's chunk to each destination: 13 tables x 512 rows x 128
float32 (criteo-d128 on 2 ranks), Compression.lossy(0.03, segments=13) with the default
gradient recipe, through the calls the example makes: hvd_lossy.torch.alltoall under mpirun,
hvd_lossy.distributed.all_to_all_single_autograd under torchrun (gloo). Per call, the stages
of the shared exchange are timed by wrapping them (one wrapper a stage, re-entry not counted):

  compress   Alltoall.pack: plan, layout, codec into the send buffer, headers
  counts     torch only: TorchBackend's blocking byte-count all_to_all_single
  launch     the backend's alltoall_async, less `counts`
  after      Alltoall.after_launch (compressor hooks)
  wait       Alltoall.complete: waiting for the data all-to-all
  headers    parsing every sender's header (and the verdict)
  decode     Alltoall.decode (own chunk copy, codec, layout copies)
  other      the call's wall time less the stages (autograd, output allocation, Python)

for the forward (start to wait) and for the autograd backward (the gradient's exchange) apart,
plus, as references on the same link, the plain all-to-all of the raw chunk (forward and
backward) and the bare collectives: one count round, and a uint8 all-to-all of the
compressed size. Medians over the iterations after warm-up, rank 0 and the slower rank.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLES, ROWS, DIM = 13, 512, 128
STAGES = ("compress", "counts", "launch", "after", "wait", "headers", "decode", "other")


# ---------------------------------------------------------------- worker (one rank)


class Stages:
    """Wall time per stage of the current phase; wrappers accumulate into it."""

    def __init__(self):
        self.phase, self.times, self._active = None, {}, set()

    def add(self, stage, seconds):
        if self.phase is not None:
            key = (self.phase, stage)
            self.times[key] = self.times.get(key, 0.0) + seconds

    def wrap(self, owner, attr, stage):
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            if stage in self._active:
                return fn(*args, **kwargs)
            self._active.add(stage)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._active.discard(stage)
                self.add(stage, time.perf_counter() - t0)
        setattr(owner, attr, timed)


class _TimedDist:
    """torch.distributed as TorchBackend sees it, its blocking all_to_all_single timed."""

    def __init__(self, dist, stages):
        self._dist, self._stages = dist, stages

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_to_all_single(self, *args, async_op=False, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._dist.all_to_all_single(*args, async_op=async_op, **kwargs)
        finally:
            if not async_op:
                self._stages.add("counts", time.perf_counter() - t0)


def _lookups(rank):
    """This rank's chunk for every destination: its 13 tables' lookups, table-major."""
    import torch
    g = torch.Generator().manual_seed(1000 + rank)
    n = 100_000  # criteo-d128's cap on the cardinalities, initialised as DLRM does
    per_table = []
    for _t in range(TABLES):
        table = (torch.rand((n, DIM), generator=g) * 2 - 1) * (1.0 / n) ** 0.5
        per_table.append(table[torch.randint(0, n, (2 * ROWS,), generator=g)])
    lookups = torch.stack(per_table)  # [tables, 2 destinations x rows, dim]
    return lookups.view(TABLES, 2, ROWS, DIM).transpose(0, 1).reshape(-1, DIM).contiguous()


class _Ops:
    """The example's calls on one backend: lossy and plain exchanges with autograd, a barrier,
    and the bare collectives for reference."""

    def __init__(self, name):
        import torch
        self.name, self.torch = name, torch
        if name == "horovod":
            import hvd_lossy.torch as hvd
            hvd.init()
            self.lib, self.rank = hvd, hvd.rank()
        else:
            import hvd_lossy.distributed as dist
            dist.init_process_group("gloo")
            self.lib, self.rank = dist, dist.get_rank()

    def exchange(self, x, compression):
        rows = [x.shape[0] // 2] * 2
        if self.name == "horovod":
            out, _ = self.lib.alltoall(x, splits=self.torch.tensor(rows, dtype=self.torch.int32),
                                       name="emb.a2a", compression=compression)
            return out
        return self.lib.all_to_all_single_autograd(x, rows, rows, compression=compression)

    def barrier(self):
        if self.name == "horovod":
            self.lib.allreduce(self.torch.zeros(1), name="barrier")
        else:
            self.lib.barrier()

    def count_round(self):
        torch = self.torch
        if self.name == "horovod":
            self.lib.alltoall(torch.zeros(2, dtype=torch.int32), name="counts")
        else:
            recv = torch.empty(2, dtype=torch.int64)
            self.lib.all_to_all_single(recv, torch.zeros(2, dtype=torch.int64))

    def bytes_round(self, nbytes):
        torch = self.torch
        send = torch.zeros(2 * nbytes, dtype=torch.uint8)
        if self.name == "horovod":
            self.lib.alltoall(send, name="bytes")
        else:
            self.lib.all_to_all_single(torch.empty_like(send), send)

    def gather(self, obj):
        if self.name == "horovod":
            return self.lib.allgather_object(obj)
        out = [None] * 2
        self.lib.all_gather_object(out, obj)
        return out


def _instrument(ops, stages):
    from hvd_lossy import alltoall as a2a, backend, collective
    from hvd_lossy._layout import SingleAlltoall
    stages.wrap(a2a.Alltoall, "pack", "compress")
    for cls in (backend.HorovodBackend, backend.TorchBackend):
        stages.wrap(cls, "alltoall_async", "launch")
    stages.wrap(a2a.Alltoall, "after_launch", "after")
    stages.wrap(a2a.Alltoall, "complete", "wait")
    stages.wrap(a2a.Alltoall, "headers", "headers")
    stages.wrap(collective, "raise_from_headers", "headers")
    for cls in (a2a.Alltoall, SingleAlltoall):
        stages.wrap(cls, "decode", "decode")
    if ops.name == "torch":
        b = ops.lib._backend(None)
        b._dist = _TimedDist(b._dist, stages)


def worker(name, iters, warmup):
    import torch
    torch.set_num_threads(1)
    ops = _Ops(name)
    from hvd_lossy import stats
    from hvd_lossy.compression import Compression, NoneCompressor
    lossy = Compression.lossy(0.03, segments=TABLES)
    x = _lookups(ops.rank)
    g = torch.Generator().manual_seed(2000 + ops.rank)
    grad = torch.randn(x.shape, generator=g) * 1e-4
    stages = Stages()
    _instrument(ops, stages)
    rows = []
    for it in range(warmup + iters):
        row = {}
        for mode, compression in (("lossy", lossy), ("plain", NoneCompressor)):
            ops.barrier()
            leaf = x.clone().requires_grad_(True)
            stages.phase, stages.times = "fwd", {}
            sent = stats.comm_stats()["total"]["wire_bytes"]
            t0 = time.perf_counter()
            out = ops.exchange(leaf, compression)
            t1 = time.perf_counter()
            if mode == "lossy":
                row["lossy fwd bytes sent"] = stats.comm_stats()["total"]["wire_bytes"] - sent
            stages.phase = "bwd"
            out.backward(grad)
            t2 = time.perf_counter()
            stages.phase = None
            row[f"{mode} fwd"], row[f"{mode} bwd"] = t1 - t0, t2 - t1
            if mode == "lossy":
                for phase, total in (("fwd", t1 - t0), ("bwd", t2 - t1)):
                    st = {s: stages.times.get((phase, s), 0.0) for s in STAGES[:-1]}
                    st["launch"] -= st["counts"]
                    st["other"] = total - sum(st.values())
                    row.update({f"{phase} {s}": v for s, v in st.items()})
        ops.barrier()
        t0 = time.perf_counter()
        ops.count_round()
        row["count round alone"] = time.perf_counter() - t0
        ops.barrier()
        t0 = time.perf_counter()
        if it == 0:  # the forward's frames, bare: one size on both ranks
            nbytes = int(max(ops.gather(row["lossy fwd bytes sent"])))
        ops.bytes_round(nbytes)
        row["uint8 a2a alone"] = time.perf_counter() - t0
        if it >= warmup:
            rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    every = ops.gather(med)
    if ops.rank == 0:
        print("PROFILE " + json.dumps(dict(backend=name, iters=iters, ranks=every)), flush=True)
    if name == "torch":
        ops.lib.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)  # see examples/dlrm/backend.finish: gloo threads at interpreter exit


# ---------------------------------------------------------------- driver


def run_backend(ns, name, iters, warmup, timeout):
    from hvd_lossy.bench import netlink as nl
    py = sys.executable
    me = [str(pathlib.Path(__file__).resolve()), "--worker", name, "--iters", str(iters),
          "--warmup", str(warmup)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if name == "horovod":
        cmd = nl.mpirun(2, ["OMP_NUM_THREADS", "PYTHONPATH", "PATH"], [py, *me])
    else:
        cmd = [str(pathlib.Path(py).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
               *me]
    proc = subprocess.run(ns.command(cmd), env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("PROFILE "):
            return json.loads(line[len("PROFILE "):])
    raise RuntimeError(f"{name} profile failed (status {proc.returncode}):\n"
                       f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _ms(v):
    return f"{1e3 * v:6.2f}"


def report(rate, results):
    print(f"\n== link {'unlimited' if rate is None else f'{rate:g} Gbit/s'} "
          "(ms, median; rank 0 / slower rank) ==")
    keys = [k for k in results[0]["ranks"][0]]
    print(f"{'':22}" + "".join(f"{r['backend']:>18}" for r in results))
    for k in keys:
        cells = []
        for r in results:
            v0, vmax = r["ranks"][0][k], max(rank[k] for rank in r["ranks"])
            fmt = (lambda v: f"{v:6.0f}") if k.endswith("bytes sent") else _ms
            cells.append(f"{fmt(v0)} / {fmt(vmax)}")
        print(f"{k:22}" + "".join(f"{c:>18}" for c in cells))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="unlimited,1", help="Gbit/s or 'unlimited', comma-separated")
    p.add_argument("--backends", default="horovod,torch", help="comma-separated")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--namespace", default=f"hvdl-profile{os.getpid()}",
                   help="name of the private namespace (must start with hvdl-)")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--worker", choices=["horovod", "torch"], help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        return worker(opts.worker, opts.iters, opts.warmup)
    from hvd_lossy.bench import netlink as nl
    rates = [None if r == "unlimited" else float(r) for r in opts.rates.split(",")]
    out = []
    with nl.signals_raise(), nl.Namespace(opts.namespace) as ns, tempfile.TemporaryDirectory():
        for rate in rates:
            ns.set_rate(rate)
            results = [run_backend(ns, b, opts.iters, opts.warmup, 600)
                       for b in opts.backends.split(",")]
            report(rate, results)
            out.append(dict(bandwidth_gbit=rate, results=results))
    if opts.json:
        opts.json.write_text(json.dumps(dict(
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load=os.getloadavg(),
            command="python benchmarks/backend_profile.py " + " ".join(argv or sys.argv[1:]),
            shapes=dict(tables=TABLES, rows=ROWS, dim=DIM, dtype="float32"), runs=out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
