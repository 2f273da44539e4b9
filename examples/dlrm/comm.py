"""The all-to-all the exchange uses, its compressor, and what it cost.

`Link` picks the transport (`hvd_lossy.torch.alltoall` with the chosen compressor, or
`horovod.torch.alltoall` for --plain-horovod), feeds the adaptive controller, and accounts bytes
and seconds per training step, split into forward (lookups) and backward (gradients).

Bytes follow hvd_lossy.stats: "plain" is the uncompressed size of every tensor handed to the
all-to-all (the rank's own chunk included), "sent" what was handed to Horovod for it. Totals are
summed over ranks.
"""

import horovod.torch as hvd
import numpy as np

import data

_KEYS = ("raw_bytes", "wire_bytes", "compress_s", "comm_s", "decompress_s")


def backward_setting(args):
    """--backward-error-bound as the compressors' `backward` argument."""
    from hvd_lossy.torch import Compression
    b = args.backward_error_bound
    return {"none": None, "fp16": Compression.fp16}.get(b, b) if isinstance(b, str) else b


def make_compression(args, local_names, cardinalities, owners):
    """(compressor, controller or None) for --compression; ValueError for bad settings."""
    from hvd_lossy.torch import Compression
    backward = backward_setting(args)
    if args.compression == "none":
        return Compression.none, None
    if args.compression == "fp16":
        return Compression.fp16, None
    if args.compression == "lossy":
        return Compression.lossy(args.error_bound, args.eb_mode, backward=backward), None
    from hvd_lossy.adaptive import Controller
    specs = {name: rows for name, rows in zip(data.TABLE_NAMES, cardinalities)}
    kwargs = dict(tables=specs, base=args.error_bound, mode=args.eb_mode)
    if args.policy:
        kwargs["policy"] = args.policy
    if args.schedule:
        kwargs["schedule"] = args.schedule
    controller = Controller(**kwargs)
    return Compression.adaptive(controller, tables=local_names, backward=backward), controller


class Link:
    """Transport of the embedding exchange for one run.

    Arguments:
        args: parsed command line (compression settings, --plain-horovod).
        owners: owner rank of each table.
        rank, world: this rank and the number of ranks.
        cardinalities: rows of each table.
    """

    def __init__(self, args, owners, rank, world, cardinalities):
        self.plain = args.plain_horovod
        self.args, self.owners, self.rank, self.world = args, owners, rank, world
        self.local = [t for t, r in enumerate(owners) if r == rank]
        self.local_names = [data.TABLE_NAMES[t] for t in self.local]
        self.controller = None
        if self.plain:
            self.compression = None
        else:
            import hvd_lossy.torch as lossy_hvd
            self._lossy = lossy_hvd
            try:
                self.compression, self.controller = make_compression(
                    args, self.local_names, cardinalities, owners)
            except ValueError as e:
                from cli import UsageError
                raise UsageError(str(e)) from None
        self.steps = []
        self._mark = self._fwd = None
        self._calls = 0

    def alltoall(self, tensor, splits):
        """(output, received_splits), autograd through the call (the backward all-to-all sends
        the gradients back, compressed per the compressor's backward setting)."""
        self._calls += 1
        name = "emb.a2a.%d" % self._calls
        if self.plain:
            out = hvd.alltoall(tensor, splits=splits, name=name)
            self._plain_bytes = tensor.numel() * tensor.element_size()
        else:
            out = self._lossy.alltoall(tensor, splits=splits, name=name, compression=self.compression)
        if self._mark is not None and self._fwd is None:
            self._fwd = self._snapshot()
        return out

    def observe(self, table, lookups):
        if self.controller is not None:
            self.controller.observe_lookups(data.TABLE_NAMES[table], lookups)

    def begin_step(self):
        self._mark, self._fwd = self._snapshot(), None

    def step(self):
        """End of a training step (after the optimizers): lets the controller update its bounds."""
        if self.controller is not None:
            self.controller.step()

    def step_split(self, iter_s, ex):
        """Bytes and seconds of the step just finished (from begin_step on); appended to the
        run's record and returned."""
        end = self._snapshot()
        if self.plain:
            fwd_s, bwd_s = ex.clock.get("fwd_s", 0.0), ex.backward_seconds()
            raw = self._plain_bytes
            rec = dict(fwd_raw=raw, fwd_wire=raw, bwd_raw=raw, bwd_wire=raw,
                       compress_s=0.0, comm_s=fwd_s + bwd_s, decompress_s=0.0)
        else:
            fwd = _diff(self._fwd, self._mark)
            bwd = _diff(end, self._fwd)
            both = _diff(end, self._mark)
            rec = dict(fwd_raw=fwd["raw_bytes"], fwd_wire=fwd["wire_bytes"],
                       bwd_raw=bwd["raw_bytes"], bwd_wire=bwd["wire_bytes"],
                       compress_s=both["compress_s"] + both["decompress_s"], comm_s=both["comm_s"],
                       decompress_s=both["decompress_s"])
        rec["compute_s"] = max(iter_s - rec["compress_s"] - rec["comm_s"], 0.0)
        self.steps.append(rec)
        self._mark = None
        return rec

    def reset(self):
        self.steps = []
        if not self.plain:
            self._lossy.reset_comm_stats()

    def totals(self):
        """Bytes over the whole training run, summed over ranks."""
        local = np.array([[s["fwd_raw"], s["fwd_wire"], s["bwd_raw"], s["bwd_wire"]] for s in self.steps],
                         np.float64).sum(axis=0)
        import torch
        tot = hvd.allreduce(torch.from_numpy(local), op=hvd.Sum, name="a2a.totals").numpy()
        plain, sent = tot[0] + tot[2], tot[1] + tot[3]
        return dict(a2a_bytes_plain=int(plain), a2a_bytes_sent=int(sent),
                    compression_ratio=float(plain / sent) if sent else 1.0,
                    a2a_fwd_bytes_plain=int(tot[0]), a2a_fwd_bytes_sent=int(tot[1]),
                    a2a_bwd_bytes_plain=int(tot[2]), a2a_bwd_bytes_sent=int(tot[3]),
                    compression=self.args.compression, plain_horovod=self.plain,
                    compressor=repr(self.compression) if self.compression is not None else "horovod")

    def table_report(self):
        """Per-table bounds and ratios (adaptive: the controller's view; otherwise the fixed bound)."""
        if self.controller is not None:
            return {"tables": self.controller.summary()}
        bound = self.args.error_bound if self.args.compression == "lossy" else 0.0
        return {"tables": {name: {"bound": bound} for name in data.TABLE_NAMES}}

    def _snapshot(self):
        if self.plain:
            return dict.fromkeys(_KEYS, 0)
        total = self._lossy.comm_stats()["total"]
        return {k: total[k] for k in _KEYS}


def _diff(a, b):
    return {k: a[k] - b[k] for k in _KEYS}
