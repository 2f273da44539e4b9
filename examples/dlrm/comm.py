"""The all-to-all the exchange uses, its compressor, and what it cost.

`Link` picks the transport (`hvd_lossy.torch.alltoall` with the chosen compressor, or
`horovod.torch.alltoall` for --plain-horovod), feeds the adaptive controller, and accounts bytes
and seconds per training step, split into forward (lookups) and backward (gradients).

Bytes follow hvd_lossy.stats: "plain" is the uncompressed size of every tensor handed to the
all-to-all (the rank's own chunk included), "sent" what was handed to Horovod for it as it goes
on the wire: the frames ("codec", their own headers included) plus the protocol header of each
destination but the rank itself. Totals are summed over ranks.
"""

import contextlib

import numpy as np
import torch

import backend
import data
from backend import hvd

_KEYS = ("raw_bytes", "wire_bytes", "meta_bytes", "compress_s", "comm_s", "decompress_s")


def backward_setting(args):
    """--backward-error-bound as the compressors' `backward` argument."""
    from hvd_lossy.compression import Compression
    b = args.backward_error_bound
    return {"none": None, "fp16": Compression.fp16}.get(b, b) if isinstance(b, str) else b


def dither_setting(args):
    """--dither as the compressors' `dither` argument."""
    return {"none": False, "backward": "backward", "all": True}[args.dither]


def dense_compression(args):
    """DistributedOptimizer's compressor for --dense-compression: one whose gradient coding
    (for_backward(), which the optimizer uses) is the all-to-all's gradients' ("same") or at a
    bound of its own; None for none."""
    if args.dense_compression == "none":
        return None
    from hvd_lossy.compression import Compression
    own = args.dense_compression
    return Compression.lossy(args.error_bound, args.eb_mode, level=args.level,
                             dither=dither_setting(args),
                             backward=backward_setting(args) if own == "same" else own)


def make_compression(args, owners, rank, world, cardinalities, total_steps):
    """(compressor, controller or None) for --compression; ValueError for bad settings."""
    from hvd_lossy.compression import Compression
    backward = backward_setting(args)
    dither = dither_setting(args)
    auto = args.auto
    reuse = getattr(args, "reuse", False)
    if args.compression == "none":
        return Compression.none, None
    if args.compression == "fp16":
        return Compression.fp16, None
    if args.compression == "lossy" and args.lossy_frames == "destination":
        return Compression.lossy(args.error_bound, args.eb_mode, level=args.level,
                                 backward=backward, dither=dither, auto=auto, reuse=reuse), None
    if args.compression == "lossy":
        from frames import table_compressors
        names = [[n for n, r in zip(data.TABLE_NAMES, owners) if r == k] for k in range(world)]
        return table_compressors(args.error_bound, args.eb_mode, args.level, backward, names, rank,
                                 dither=dither, auto=auto, reuse=reuse), None
    from hvd_lossy.adaptive import Controller
    tables = {name: (rows, owner) for name, rows, owner in zip(data.TABLE_NAMES, cardinalities, owners)}
    # The schedule decays to 1.0 over the run and the controller re-plans ~20 times, unless told.
    E = args.schedule_iters or total_steps
    interval = args.interval or max(1, min(100, total_steps // 20))
    kwargs = dict(tables=tables, base=args.error_bound, mode=args.eb_mode, E=E, interval=interval)
    if args.policy:
        kwargs["policy"] = args.policy
    if args.schedule:
        kwargs["schedule"] = args.schedule
    if args.grad_base is not None:
        kwargs["grad_base"] = args.grad_base
    controller = Controller(**kwargs)
    local = controller.tables_of(rank)
    compressor = Compression.adaptive(controller, tables=local, backward=backward, level=args.level,
                                      dither=dither, auto=auto, reuse=reuse)
    return compressor, controller


class Link:
    """Transport of the embedding exchange for one run.

    Arguments:
        args: parsed command line (compression settings, --plain-horovod).
        owners: owner rank of each table.
        rank, world: this rank and the number of ranks.
        cardinalities: rows of each table.
        total_steps: training steps of the run (the adaptive schedule's default length).
    """

    def __init__(self, args, owners, rank, world, cardinalities, total_steps):
        self.plain = args.plain_horovod
        self.args, self.owners, self.rank, self.world = args, owners, rank, world
        self.local_names = [data.TABLE_NAMES[t] for t, r in enumerate(owners) if r == rank]
        self.controller = None
        self.compression = None
        if not self.plain:
            self._lossy = backend.lossy()  # hvd_lossy.torch, or hvd_lossy.distributed
            try:
                self.compression, self.controller = make_compression(
                    args, owners, rank, world, cardinalities, total_steps)
            except ValueError as e:
                from cli import UsageError
                raise UsageError("compression settings: %s" % e) from None
        self.steps, self.table_history = [], []
        self._mark = self._fwd = None
        self._evaluating = False
        self._plain_bytes = 0

    def alltoall(self, tensor, splits, **ids):
        """(output, received_splits), autograd through the call (the backward all-to-all sends
        the gradients back, compressed per the compressor's backward setting). `ids=` (the
        rows' ids, --ids) goes to hvd_lossy's alltoall; --plain-horovod drops it."""
        name = "emb.a2a"  # one name: Horovod caches responses by name, and calls never overlap
        if self.plain:
            out = hvd.alltoall(tensor, splits=splits, name=name)
            # what leaves the rank: its own chunk is a local copy (as hvd_lossy counts it)
            rows = [int(r) for r in splits]  # a list or a tensor
            self._plain_bytes = (tensor.numel() * tensor.element_size()
                                 * (sum(rows) - rows[self.rank]) // max(sum(rows), 1))
        else:
            compression = self.compression
            if self._evaluating and self.args.eval_compression == "none":
                compression = self._lossy.Compression.none
            out = self._lossy.alltoall(tensor, splits=splits, name=name, compression=compression,
                                       **ids)
        if self._mark is not None and self._fwd is None:
            self._fwd = self._snapshot()
        return out

    def alltoall_start(self, tensor, splits, **ids):
        """alltoall() started now and finished by calling the returned wait(): a differentiable
        hvd_lossy alltoall_async, so the caller can compute while the lookups travel. Plain
        Horovod's async alltoall has no autograd: there it runs at once."""
        if self.plain or self._evaluating:
            result = self.alltoall(tensor, splits)
            return lambda: result
        handle = self._lossy.alltoall_async(tensor, splits=splits, name="emb.a2a",
                                            compression=self.compression, differentiable=True,
                                            **ids)

        def wait():
            out = self._lossy.synchronize(handle)
            if self._mark is not None and self._fwd is None:
                self._fwd = self._snapshot()
            return out
        return wait

    @contextlib.contextmanager
    def evaluating(self):
        """Evaluation: uncompressed lookups unless --eval-compression same; the controller
        records nothing."""
        self._evaluating = True
        if self.controller is not None:
            self.controller.eval()
        try:
            yield
        finally:
            self._evaluating = False
            if self.controller is not None:
                self.controller.train()

    def begin_step(self):
        self._mark, self._fwd = self._snapshot(), None

    def step(self, step):
        """End of training step `step` (1-based, after the optimizers): the controller counts the
        iteration and, on its exchange iterations, re-plans the bounds."""
        if self.controller is None:
            return
        self.controller.step()
        if self.controller.iteration % self.controller.interval == 0:
            bounds = self.controller.bounds()
            self.table_history.append({"step": step, "tables": {
                s.name: {"bound": bounds[s.name], "ratio": s.ratio} for s in self.controller.stats()}})

    def step_split(self, iter_s, ex):
        """Bytes and seconds of the step just finished (from begin_step on); appended to the
        run's record and returned."""
        end = self._snapshot()
        if self.plain:
            fwd_s, bwd_s = ex.clock.get("fwd_s", 0.0), ex.backward_seconds()
            raw = self._plain_bytes
            rec = dict(fwd_raw=raw, fwd_wire=raw, bwd_raw=raw, bwd_wire=raw, fwd_codec=raw,
                       bwd_codec=raw, compress_s=0.0, comm_s=fwd_s + bwd_s, decompress_s=0.0)
        else:
            fwd = _diff(self._fwd, self._mark)
            bwd = _diff(end, self._fwd)
            both = _diff(end, self._mark)
            # meta_bytes counts a header for every destination; the own one stays local.
            remote = (self.world - 1) / self.world
            rec = dict(fwd_raw=fwd["raw_bytes"], bwd_raw=bwd["raw_bytes"],
                       fwd_wire=fwd["wire_bytes"] + fwd["meta_bytes"] * remote,
                       bwd_wire=bwd["wire_bytes"] + bwd["meta_bytes"] * remote,
                       fwd_codec=fwd["wire_bytes"], bwd_codec=bwd["wire_bytes"],
                       compress_s=both["compress_s"] + both["decompress_s"], comm_s=both["comm_s"],
                       decompress_s=both["decompress_s"])
        rec["compute_s"] = max(iter_s - rec["compress_s"] - rec["comm_s"], 0.0)
        self.steps.append(rec)
        self._mark = None
        return rec

    def reset(self):
        self.steps, self.table_history = [], []
        if not self.plain:
            self._lossy.reset_comm_stats()

    def totals(self):
        """Bytes over the whole training run, summed over ranks."""
        local = np.array([[s["fwd_raw"], s["fwd_wire"], s["bwd_raw"], s["bwd_wire"],
                           s["fwd_codec"] + s["bwd_codec"]]
                          for s in self.steps], np.float64).reshape(-1, 5).sum(axis=0)
        tot = hvd.allreduce(torch.from_numpy(local), op=hvd.Sum, name="a2a.totals").numpy()
        plain, sent = tot[0] + tot[2], tot[1] + tot[3]
        return dict(a2a_bytes_plain=int(plain), a2a_bytes_sent=int(sent),
                    a2a_bytes_codec=int(tot[4]),
                    compression_ratio=float(plain / sent) if sent else 1.0,
                    a2a_fwd_bytes_plain=int(tot[0]), a2a_fwd_bytes_sent=int(tot[1]),
                    a2a_bwd_bytes_plain=int(tot[2]), a2a_bwd_bytes_sent=int(tot[3]),
                    compression=self.args.compression, plain_horovod=self.plain,
                    compressor=_describe(self.compression),
                    auto=[] if self.plain else self._lossy.comm_stats()["auto"])

    def table_report(self):
        """Per-table bounds and ratios at the end of training (collective for adaptive)."""
        if self.controller is not None:
            self.controller.exchange()  # fold the last partial interval into the totals
            s = self.controller.summary()
            tables = {n: {"bound": t["bound"], "table_bound": t["table_bound"], "class": t["class"],
                          "ratio": t["ratio"], "bwd_ratio": t["bwd_ratio"], "owner": t["owner"]}
                      for n, t in s["tables"].items()}
            return {"tables": tables, "table_history": self.table_history,
                    "adaptive": {k: s[k] for k in ("iteration", "multiplier", "policy", "schedule",
                                                    "ratio", "bwd_ratio")}}
        bound = self.args.error_bound if self.args.compression == "lossy" else 0.0
        bwd = self.args.backward_error_bound
        bwd_bound = bound if bwd == "same" else (bwd if isinstance(bwd, float) else 0.0)
        tables = {n: {"bound": bound, "bwd_bound": bwd_bound, "owner": self.owners[t]}
                  for t, n in enumerate(data.TABLE_NAMES)}
        if hasattr(self.compression, "table_bytes"):  # per-table frames: bytes summed over ranks
            summed = {}
            for part in hvd.allgather_object(self.compression.table_bytes, name="table_bytes"):
                for key, (raw, sent) in part.items():
                    acc = summed.setdefault(key, [0, 0])
                    acc[0] += raw
                    acc[1] += sent
            for key, (raw, sent) in summed.items():
                name, field = (key[4:], "bwd_ratio") if key.startswith("bwd:") else (key, "ratio")
                tables[name][field] = raw / sent if sent else None
        return {"tables": tables, "table_history": self.table_history}

    def _snapshot(self):
        if self.plain:
            return dict.fromkeys(_KEYS, 0)
        total = self._lossy.comm_stats()["total"]
        return {k: total[k] for k in _KEYS}


def _describe(compression):
    if compression is None:
        return "horovod.torch.alltoall"
    if isinstance(compression, type):
        return compression.__name__
    from hvd_lossy.adaptive import AdaptiveCompressor
    if isinstance(compression, AdaptiveCompressor):
        c = compression.controller
        return "adaptive(policy=%s, schedule=%s, base=%g, mode=%s, backward=%r)" % (
            c.policy.get_config().get("name", c.policy), c.get_config()["schedule"], c.base, c.mode,
            compression.backward)
    return repr(compression)


def _diff(a, b):
    return {k: a[k] - b[k] for k in _KEYS}
