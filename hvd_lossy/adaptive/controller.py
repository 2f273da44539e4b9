"""The dual-level adaptive controller: per-table bounds x an iteration-wise multiplier.

Every rank builds the same ``Controller``; it accumulates local statistics of lookups, gradients
and frames, and every ``interval`` calls of ``step()`` allgathers them, merges them in rank order
and runs the policy, so all ranks hold bit-identical bounds without a broadcast.
"""

import dataclasses
import hashlib
import json
import math
import os

import numpy as np

import hvd_lossy

from . import stats as _stats
from .comm import resolve_comm
from .config import TableSpec, check_int, table_specs
from .policies import make_policy
from .schedules import check_schedule, multiplier
from .telemetry import summary, telemetry_record, write_line

__all__ = ["TableSpec", "Controller"]

MODES = ("rel", "abs")
EVAL_BOUNDS = ("none", "base", "table")
DIRECTIONS = ("forward", "backward")


def _setting(name, doc=None):
    """A read-only property of the controller's setting `self._<name>`."""
    return property(lambda self: getattr(self, "_" + name), doc=doc)


class Controller:
    """Per-table error bounds, adapted every ``interval`` iterations, times a schedule multiplier.

    Arguments:
        tables: dict name -> cardinality (owners round-robin by position: table i on rank
            i % size), dict name -> (cardinality, owner), or a list of ``TableSpec`` / dicts with
            ``name``, ``cardinality``, optional ``owner``.
        policy: table-wise policy: ``"paper"``, ``"sensitivity"``, ``"budget"``, ``"uniform"``, a
            dict ``{"name": ..., **params}`` or a Policy (see ``hvd_lossy.adaptive.policies``).
        schedule: iteration-wise multiplier: ``"step"``, ``"linear"``, ``"log"``, ``"constant"``.
        E: iterations until the multiplier reaches 1.0 (default 65,536).
        base: base error bound (relative to each frame's value range in mode "rel").
        interval: iterations between exchanges of statistics (and new bounds).
        mode: ``"rel"`` (bound x (max - min) of each frame) or ``"abs"``.
        eval_bound: bounds in eval mode: ``"none"`` (0, lossless), ``"base"`` (``base`` for every
            table) or ``"table"`` (table bounds without the multiplier).
        grad_base: base bound of gradients (default ``base``); a table's gradient bound is its
            table bound x grad_base / base x multiplier.
        sample_every: observe lookups/gradients only on iterations divisible by this (each
            observation costs about as much as compressing the rows); default
            max(1, interval // 10), i.e. about 10 samples per interval.
        telemetry: path of a JSON-lines file that rank 0 rewrites (one line per exchange), or None.
        comm: see ``hvd_lossy.adaptive.comm.resolve_comm``; None picks mpi4py or Horovod.
        process_set: a Horovod ProcessSet for a controller of the all-to-alls within that set:
            it exchanges statistics over the set only, and ranks (owners, ``tables_of``) are
            ranks within the set. Only the set's members construct it.

    Construction is collective: every rank checks its configuration and exchanges a hash of it, so
    a bad or mismatched configuration raises ValueError on every rank instead of hanging.
    """

    def __init__(self, tables, policy="paper", schedule="step", E=65536, base=0.03, interval=100,
                 mode="rel", eval_bound="none", grad_base=None, sample_every=None, telemetry=None,
                 comm=None, process_set=None):
        self._comm = resolve_comm(comm, process_set)
        error = None
        try:
            self._configure(tables, policy, schedule, E, base, interval, mode, eval_bound,
                            grad_base, sample_every, telemetry)
        except (ValueError, TypeError) as e:
            error = e
        self._agree(error)
        self._it = 0
        self._training = True
        self._rows = _stats.empty_rows(len(self._specs))
        self._totals = _stats.empty_rows(len(self._specs))
        self._last = [_stats.row_stats(s, self._rows[i]) for i, s in enumerate(self._specs)]
        self._table_bounds = self._plan()
        if self._telemetry is not None and self.rank == 0:
            open(self._telemetry, "w").close()

    # ----- configuration -------------------------------------------------------------------------

    def _configure(self, tables, policy, schedule, E, base, interval, mode, eval_bound, grad_base,
                   sample_every, telemetry):
        self._specs = table_specs(tables, self._comm.size)
        self._index = {s.name: i for i, s in enumerate(self._specs)}
        self._policy = make_policy(policy)
        self._policy.check_tables([s.name for s in self._specs])
        check_schedule(schedule, E)
        self._schedule, self._E = schedule, int(E)
        self._base = hvd_lossy.check_error_bound(base, "base", positive=True)
        self._grad_base = (self._base if grad_base is None
                           else hvd_lossy.check_error_bound(grad_base, "grad_base", positive=True))
        self._interval = check_int("interval", interval, 1)
        self._sample_every = (max(1, self._interval // 10) if sample_every is None
                              else check_int("sample_every", sample_every, 1))
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if eval_bound not in EVAL_BOUNDS:
            raise ValueError(f"eval_bound must be one of {list(EVAL_BOUNDS)}, got {eval_bound!r}")
        self._mode, self._eval_bound = mode, eval_bound
        if telemetry is not None and not isinstance(telemetry, (str, os.PathLike)):
            raise TypeError(f"telemetry must be a path or None, got {type(telemetry).__name__}")
        self._telemetry = None if telemetry is None else os.fspath(telemetry)

    def _agree(self, error):
        """Collective: every rank raises if any rank's configuration is bad or differs."""
        digest = None
        if error is None:
            cfg = self.get_config()
            cfg.pop("telemetry")  # only rank 0 writes it; other ranks may leave it out
            digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
        msg = None if error is None else f"{type(error).__name__}: {error}"
        gathered = self._comm.allgather_object((digest, msg))
        if error is not None:
            raise error
        bad = [(r, m) for r, (_, m) in enumerate(gathered) if m is not None]
        if bad:
            raise ValueError(f"adaptive controller configuration failed on rank(s) "
                             f"{[r for r, _ in bad]}: rank {bad[0][0]}: {bad[0][1]}")
        if len({d for d, _ in gathered}) > 1:
            # Every rank saw the mismatch, so this second exchange is collective too.
            cfgs = self._comm.allgather_object(cfg)
            diff = sorted(k for k in cfg if any(c.get(k) != cfgs[0].get(k) for c in cfgs))
            detail = "; ".join(f"{k}: " + ", ".join(f"rank {r} {c.get(k)!r}"
                                                     for r, c in enumerate(cfgs)) for k in diff)
            raise ValueError(f"ranks disagree on the adaptive controller configuration "
                             f"(every rank must pass the same): {detail}")

    def get_config(self):
        """JSON-serialisable configuration; ``Controller.from_config`` rebuilds it."""
        return {"tables": [dataclasses.asdict(s) for s in self._specs],
                "policy": self._policy.get_config(), "schedule": self._schedule, "E": self._E,
                "base": self._base, "interval": self._interval, "mode": self._mode,
                "eval_bound": self._eval_bound, "grad_base": self._grad_base,
                "sample_every": self._sample_every, "telemetry": self._telemetry}

    @classmethod
    def from_config(cls, config, comm=None):
        """A Controller from ``get_config()`` output (collective, like the constructor)."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        return cls(**config, comm=comm)

    @classmethod
    def from_json(cls, path_or_dict, comm=None):
        """A Controller from a JSON file path, a JSON string, or a dict (collective)."""
        if isinstance(path_or_dict, dict):
            return cls.from_config(path_or_dict, comm=comm)
        text = os.fspath(path_or_dict)
        if text.lstrip().startswith("{"):
            return cls.from_config(json.loads(text), comm=comm)
        with open(text) as f:
            return cls.from_config(json.load(f), comm=comm)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"Controller({args})"

    # ----- tables and ranks ----------------------------------------------------------------------

    @property
    def rank(self):
        return self._comm.rank

    @property
    def size(self):
        return self._comm.size

    @property
    def comm_backend(self):
        """``"mpi"``, ``"horovod"`` or ``"local"``: how statistics are exchanged."""
        return self._comm.name

    @property
    def tables(self):
        """TableSpec of every table, in configuration order."""
        return list(self._specs)

    @property
    def names(self):
        return [s.name for s in self._specs]

    def tables_of(self, rank):
        """Names of the tables owned by ``rank``, in configuration order."""
        check_int("rank", rank, 0)
        return [s.name for s in self._specs if s.owner == rank]

    def _idx(self, table):
        try:
            return self._index[table]
        except (KeyError, TypeError):
            raise ValueError(f"unknown table {table!r}; tables are {self.names}") from None

    # ----- observation ---------------------------------------------------------------------------

    @property
    def sampling(self):
        """Whether observe_lookups/observe_gradients record anything this iteration."""
        return self._training and self._it % self._sample_every == 0

    def observe_lookups(self, table, tensor):
        """Record the value range, spread and unique-row fraction of a table's looked-up rows.

        Arguments:
            table: table name.
            tensor: (rows, row_len) looked-up embedding rows (any float dtype, any device).

        Returns:
            None when this iteration is not sampled, else the tuple (elements, sum, sum of
            squares, min, max, rows, distinct rows) just recorded.
        """
        i = self._idx(table)
        if not self.sampling:
            return None
        seen = _stats.lookup_stats(tensor)
        n, s, ss, lo, hi, rows, uniq = seen
        r, f = self._rows[i], _stats.IDX
        r[f["values"]] += n
        r[f["moment_values"]] += n
        r[f["sum"]] += s
        r[f["sumsq"]] += ss
        r[f["min"]] = min(r[f["min"]], lo)
        r[f["max"]] = max(r[f["max"]], hi)
        r[f["rows"]] += rows
        r[f["unique_rows"]] += uniq
        return seen

    def observe_coded(self, table, rows, row_len, stats):
        """Record what the codec learnt of a table's looked-up rows (hvd_lossy.piece_stats, or
        compress_grouped's stats while coding them): the finite range, distinct rows and, where
        the row has them (not NaN), the moments.

        Arguments:
            table: table name.
            rows, row_len: the piece's rows and elements a row.
            stats: a row indexed by hvd_lossy.STAT_*, with a finite range and distinct rows.

        Returns:
            None when this iteration is not sampled, else the distinct rows recorded.
        """
        i = self._idx(table)
        if not self.sampling:
            return None
        r, f = self._rows[i], _stats.IDX
        finite, s, ss = (float(stats[k]) for k in (hvd_lossy.STAT_FINITE, hvd_lossy.STAT_SUM,
                                                   hvd_lossy.STAT_SUMSQ))
        moments = math.isfinite(finite) and math.isfinite(s) and math.isfinite(ss)
        r[f["values"]] += finite if moments else float(rows * row_len)
        if moments:
            r[f["moment_values"]] += finite
            r[f["sum"]] += s
            r[f["sumsq"]] += ss
        r[f["min"]] = min(r[f["min"]], float(stats[hvd_lossy.STAT_MIN]))
        r[f["max"]] = max(r[f["max"]], float(stats[hvd_lossy.STAT_MAX]))
        r[f["rows"]] += rows
        unique = float(stats[hvd_lossy.STAT_UNIQUE])
        r[f["unique_rows"]] += unique
        return unique

    def observe_gradients(self, table, tensor):
        """Record the gradient magnitude (mean |g|) of a table's looked-up rows."""
        i = self._idx(table)
        if not self.sampling:
            return
        n, s = _stats.grad_stats(tensor)
        self._rows[i, _stats.IDX["grad_values"]] += n
        self._rows[i, _stats.IDX["grad_abs_sum"]] += s

    def record_reuse(self, table, rows, reused):
        """Record that of `rows` forward rows of a table sent in a reusing call, `reused` went as
        references or residuals (the telemetry's per-table reuse_rate)."""
        i = self._idx(table)
        if not self._training:
            return
        self._rows[i, _stats.IDX["reuse_rows"]] += rows
        self._rows[i, _stats.IDX["reused_rows"]] += reused

    def record_frame(self, table, raw_bytes, frame_bytes, error_bound=None, values=None,
                     fixed_bytes=0, direction="forward"):
        """Record one compressed frame of a table (called by the compressor).

        Arguments:
            table: table name.
            raw_bytes: uncompressed size of the frame's rows, bytes.
            frame_bytes: compressed frame size, bytes.
            error_bound: effective bound the frame was compressed with (default: the table's
                current bound); frames with bound 0 (lossless) do not calibrate the rate model.
            values: elements actually encoded (rows after dedup x row length); default
                raw_bytes / 4.
            fixed_bytes: bytes of the frame that do not scale with the bound (header, dedup
                map), for the rate model of the budget policy.
            direction: ``"forward"`` (lookups) or ``"backward"`` (gradients).
        """
        i = self._idx(table)
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        if not self._training:
            return
        r, f = self._rows[i], _stats.IDX
        if direction == "backward":
            r[f["bwd_raw_bytes"]] += raw_bytes
            r[f["bwd_frame_bytes"]] += frame_bytes
            return
        r[f["raw_bytes"]] += raw_bytes
        r[f["frame_bytes"]] += frame_bytes
        r[f["fixed_bytes"]] += fixed_bytes
        eb = self.bound(table) if error_bound is None else float(error_bound)
        values = raw_bytes / 4 if values is None else float(values)
        if eb > 0 and values > 0:
            r[f["enc_values"]] += values
            r[f["enc_log2_eb"]] += values * math.log2(eb)

    # ----- iterations ----------------------------------------------------------------------------

    @property
    def iteration(self):
        """Training iterations completed (step() calls in train mode)."""
        return self._it

    @property
    def multiplier(self):
        """The schedule's multiplier at the current iteration."""
        return multiplier(self._schedule, self._it, self._E)

    def step(self):
        """End one training iteration; every ``interval`` iterations, exchange and re-plan.

        Collective on exchange iterations: every rank must call step() equally often. In eval
        mode step() does nothing (evaluation batches do not advance the schedule).
        """
        if not self._training:
            return
        self._it += 1
        if self._it % self._interval == 0:
            self.exchange()

    def exchange(self):
        """Collective: merge all ranks' statistics, recompute the bounds, write telemetry.

        Returns:
            list of TableStats (the merged statistics of the interval just ended).
        """
        merged = _stats.merge_rows(self._comm.allgather_array(self._rows))
        self._rows = _stats.empty_rows(len(self._specs))
        self._totals = _stats.merge_rows(np.stack([self._totals, merged]))
        self._last = [_stats.row_stats(s, merged[i]) for i, s in enumerate(self._specs)]
        self._table_bounds = self._plan(self._table_bounds)
        if self._telemetry is not None and self.rank == 0:
            write_line(self._telemetry, telemetry_record(self))
        return list(self._last)

    def _plan(self, previous=None):
        bounds = self._policy.table_bounds(self._last, self._base, self._mode, previous)
        for name in self.names:
            b = bounds.get(name)
            if b is None or not math.isfinite(b) or b <= 0:
                raise RuntimeError(f"policy {self._policy!r} gave table {name!r} the bound {b!r}; "
                                   f"expected a finite number > 0")
        return {name: float(bounds[name]) for name in self.names}

    # ----- bounds --------------------------------------------------------------------------------

    def train(self):
        """Training mode: table bounds x multiplier, statistics recorded. Returns self."""
        self._training = True
        return self

    def eval(self):
        """Evaluation mode: ``eval_bound`` bounds, nothing recorded, step() a no-op.

        Switch all ranks together (train() too): exchanges happen inside step(). Returns self.
        """
        self._training = False
        return self

    @property
    def training(self):
        return self._training

    def table_bound(self, table):
        """The policy's bound of ``table``, before the schedule's multiplier."""
        return self._table_bounds[self.names[self._idx(table)]]

    def bound(self, table):
        """The effective bound of ``table`` now (see ``bounds``)."""
        return self.bounds()[self.names[self._idx(table)]]

    def bounds(self):
        """Current effective bound per table: dict name -> float.

        Train mode: table bound x multiplier. Eval mode: 0.0 (lossless) for eval_bound "none",
        ``base`` for "base", the table bound for "table".
        """
        if self._training:
            m = self.multiplier
            return {n: b * m for n, b in self._table_bounds.items()}
        if self._eval_bound == "none":
            return {n: 0.0 for n in self.names}
        if self._eval_bound == "base":
            return {n: self._base for n in self.names}
        return dict(self._table_bounds)

    def grad_bounds(self):
        """Per-table gradient bounds: bounds() scaled by grad_base / base."""
        scale = self._grad_base / self._base
        return {n: b * scale for n, b in self.bounds().items()}

    # The settings, fixed when the controller is built: read-only.
    mode = _setting("mode")
    base = _setting("base")
    policy = _setting("policy")
    schedule = _setting("schedule")
    E = _setting("E")
    interval = _setting("interval")
    telemetry_path = _setting("telemetry", "Path of the telemetry JSON-lines file (written by "
                                           "rank 0), or None.")

    # ----- reporting -----------------------------------------------------------------------------

    def stats(self):
        """Merged TableStats of the last interval (empty before the first exchange)."""
        return list(self._last)

    def totals(self):
        """Merged TableStats accumulated over every exchange so far (bytes, moments)."""
        return [_stats.row_stats(s, self._totals[i]) for i, s in enumerate(self._specs)]

    def summary(self):
        """Per-table bound, ratio and bytes over all exchanges so far (local, not collective).

        Returns:
            dict with ``iteration``, ``multiplier``, ``policy``, ``schedule``, ``tables`` (name ->
            ``bound``, ``table_bound``, ``class`` (paper policy, else None), ``owner``,
            ``cardinality``, ``raw_bytes``, ``frame_bytes``, ``ratio``, ``bwd_raw_bytes``,
            ``bwd_frame_bytes``, ``bwd_ratio``) and the totals ``raw_bytes``, ``frame_bytes``,
            ``ratio`` (forward) and ``bwd_*`` (backward); ratios are None without frames. Bytes
            count frames recorded until the last exchange; call ``exchange()`` first for all.
        """
        return summary(self)
