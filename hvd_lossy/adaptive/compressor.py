"""AdaptiveCompressor: the controller's per-table bounds applied to the embedding all-to-all.

One frame per (destination, table): the rows each destination receives of each table are
compressed alone with that table's bound, and the bound travels in the frame header, so
receivers decode without knowing the plan.
"""

import math

import hvd_lossy
from hvd_lossy import check_error_bound
from hvd_lossy.compressor import (SAME, FP16Compressor, LossyCompressor, NoneCompressor,
                                  compressor_from_config, register_codec)
from hvd_lossy.reuse import DEFAULT_MEMORY_BYTES

from . import stats as _stats

__all__ = ["AdaptiveCompressor"]

TABLE = "table"
DIRECTIONS = ("forward", "backward")


def _check_backward(value):
    """backward as stored: None, "table", a float, FP16Compressor or a LossyCompressor."""
    if value is None or value is NoneCompressor:
        return None
    if isinstance(value, str) and value in (SAME, TABLE):
        return TABLE
    if value is FP16Compressor or (isinstance(value, str) and value == "fp16"):
        return FP16Compressor
    if isinstance(value, LossyCompressor):
        return value
    if isinstance(value, dict):
        return compressor_from_config(value)
    return check_error_bound(value, "backward")


def _segment_header_bytes(trailing):
    """A piece's bytes that do not scale with its bound, for the rate model: the worst-case
    descriptor of one more segment in a destination's frame (the frame's own header is shared
    by its pieces)."""
    one, two = (hvd_lossy.max_grouped_bytes([0] * n, trailing, [n], 0) for n in (1, 2))
    return two - one


@register_codec
class AdaptiveCompressor(LossyCompressor):
    """Per-table error bounds from a ``Controller``, for ``hvd_lossy.torch.alltoall``.

    Arguments:
        controller: the ``hvd_lossy.adaptive.Controller`` that chooses the bounds.
        tables: layout of each destination's chunk: a list of table names (every chunk holds
            these tables' rows back to back, in equal parts: the forward lookups sent by an owner,
            ``controller.tables_of(rank)``), or one such list per destination.
        backward: the gradient all-to-all (reversed splits; chunk for rank r holds
            ``controller.tables_of(r)``): ``"table"`` (or ``"same"``) per-table gradient bounds
            ``controller.grad_bounds()``, a float (one bound for every gradient frame; 0 is
            lossless), None (uncompressed, Horovod's own alltoall), ``"fp16"`` or any
            LossyCompressor (used as is).
        level: codec level, 1 or 2.
        dedup: store identical rows of a frame once.
        observe: feed the controller the statistics of what is compressed: lookups (value range,
            spread, unique rows) in the forward direction, gradient magnitude in the backward
            one. With ``observe=False`` call ``controller.observe_*`` yourself. With
            ``backward=None`` gradients are not seen; use ``backward=0.0`` (lossless) to observe
            them.
        bound: the bounds of this compressor's frames: ``"table"`` (the controller's) or a float.
        direction: ``"forward"`` or ``"backward"`` (set by ``for_backward``).
        dither: False, True (every frame) or ``"backward"`` (the gradient frames only; see
            ``LossyCompressor``). The backward compressor built for ``backward="table"`` or a
            float dithers when this is True or ``"backward"``.
        auto: compress only where it pays, as ``LossyCompressor``'s ``auto``; the backward
            compressor built here inherits it.
        row_len: the embedding dim of hvd_lossy.distributed's flattened layout (chunks
            ``[rows, tables x row_len]``, see ``LossyCompressor``); the tables of each chunk are
            ``tables``' (forward) and ``controller.tables_of(r)``'s (backward), as above.

    Rows per table are the chunk's rows divided by its number of tables; a chunk that does not
    divide evenly raises ValueError. Outside an alltoall (``compress(tensor)``, for allgather or
    broadcast) the whole tensor is one frame at the controller's base bound.
    """

    codec_id = "adaptive"
    # The controller learns from per-table statistics of per-lookup frames: gradients summed by
    # id (hvd_lossy.grad_ids) would hand it other rows.
    sums_gradients_by_id = False

    def __init__(self, controller, tables, backward=TABLE, level=1, dedup=True, observe=True,
                 bound=TABLE, direction="forward", dither=False, auto=False, row_len=None,
                 reuse=False, reuse_memory=DEFAULT_MEMORY_BYTES):
        super().__init__(controller.base, mode=controller.mode, level=level, backward=None,
                         dedup=dedup, dither=dither, auto=auto, row_len=row_len, reuse=reuse,
                         reuse_memory=reuse_memory)
        self.controller = controller
        self.tables = self._check_tables(tables)
        self.backward = _check_backward(backward)
        self.bound = (TABLE if isinstance(bound, str) and bound == TABLE
                      else check_error_bound(bound, "bound"))
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        if not isinstance(observe, bool):
            raise TypeError(f"observe must be True or False, got {observe!r}")
        self.direction, self.observe = direction, observe
        self._unique_fraction = {}  # last observed, per table, for the rate model's element count
        self._controller_config = None  # agreement()'s copy, made at its first call

    def _check_tables(self, tables):
        if not isinstance(tables, (list, tuple)):
            raise TypeError(f"tables must be a list of table names or a list of such lists, got "
                            f"{type(tables).__name__}")
        nested = bool(tables) and all(isinstance(t, (list, tuple)) for t in tables)
        if nested:
            if len(tables) != self.controller.size:
                raise ValueError(f"tables gives {len(tables)} chunk layouts, expected one per "
                                 f"rank ({self.controller.size})")
            layouts = [list(t) for t in tables]
        else:
            layouts = [list(tables)]
        known = set(self.controller.names)
        for layout in layouts:
            for name in layout:
                if name not in known:
                    raise ValueError(f"unknown table {name!r}; the controller's tables are "
                                     f"{self.controller.names}")
        return layouts if nested else layouts[0]

    def _layout(self, dest):
        nested = bool(self.tables) and isinstance(self.tables[0], list)
        return self.tables[dest] if nested else self.tables

    def _bounds(self):
        if self.bound != TABLE:
            return None
        if self.direction == "backward" and self.controller.training:
            return self.controller.grad_bounds()
        return self.controller.bounds()

    def plan(self, splits):
        """One frame per (destination, table) in tensor order, with that table's bound.

        Returns:
            list of (destination, rows, error_bound); a destination without tables gets one
            empty frame.
        """
        if len(splits) != self.controller.size:
            raise ValueError(f"the all-to-all has {len(splits)} ranks but the controller spans "
                             f"{self.controller.size}: for alltoall(..., process_set=ps) build "
                             f"the Controller with process_set=ps")
        bounds = self._bounds()
        plan = []
        for dest, rows in enumerate(splits):
            names = self._layout(dest)
            if not names:
                if rows:
                    raise ValueError(f"the chunk for rank {dest} has {rows} rows but no tables")
                plan.append((dest, 0, 0.0))
                continue
            per_table, rest = divmod(int(rows), len(names))
            if rest:
                raise ValueError(f"the chunk for rank {dest} has {rows} rows, not divisible into "
                                 f"equal parts for its {len(names)} tables {names}")
            for name in names:
                eb = bounds[name] if bounds is not None else self.bound
                plan.append((dest, per_table, float(eb)))
        return plan

    def _tables_of(self, plan):
        """The table of each frame of a plan() result (None for a destination without tables),
        read from the plan and the fixed layout: no state passes from plan() to after_compress(),
        so one compressor may serve several exchanges in flight."""
        tables, seen = [], {}
        for dest, _rows, _eb in plan:
            names = self._layout(dest)
            k = seen[dest] = seen.get(dest, -1) + 1
            if names and k >= len(names):
                raise ValueError(f"the plan has {k + 1} frames for rank {dest}, its layout "
                                 f"{names} has {len(names)} tables")
            tables.append(names[k] if names else None)
        return tables

    def wants_codec_stats(self):
        """The forward frames' range and distinct rows come from the codec, on sampled calls."""
        return self.observe and self.direction == "forward" and self.controller.sampling

    def _observe(self, name, piece, coded):
        """Observe a table's piece: from the codec's statistics when it has them (a finite range
        and a distinct-row count), else from the rows themselves (device tensors, dithered
        frames). Returns the distinct-row count, or None when not sampled."""
        c = self.controller
        if coded is not None and all(math.isfinite(coded[k]) for k in
                                     (hvd_lossy.STAT_MIN, hvd_lossy.STAT_MAX,
                                      hvd_lossy.STAT_UNIQUE)):
            return c.observe_coded(name, piece.shape[0], math.prod(piece.shape[1:]), coded)
        seen = c.observe_lookups(name, piece)
        return None if seen is None else seen[_stats.LOOKUP_UNIQUE]

    @staticmethod
    def _with_own_chunk(plan, frame_sizes, tensor, codec_stats):
        """codec_stats with the pieces of the chunk a rank keeps (size None) filled in by
        hvd_lossy.piece_stats: one native call over that chunk, which is never coded (its
        pieces are consecutive, as plan() lists a destination's frames together)."""
        coded, offset, own, at = list(codec_stats), 0, [], None
        for i, ((_dest, rows, _eb), size) in enumerate(zip(plan, frame_sizes)):
            if size is None and rows:
                at = offset if at is None else at
                own.append((i, rows))
            offset += rows
        if own:
            chunk = tensor[at:at + sum(rows for _i, rows in own)]
            for (i, _rows), row in zip(own, hvd_lossy.piece_stats(chunk, [r for _i, r in own])):
                coded[i] = row
        return coded

    def after_compress(self, plan, frame_sizes, tensor, codec_stats=None):
        """Record each frame's bytes with the controller (and observe its rows if asked); the
        size of a frame the alltoall did not code (the rank's own chunk) is None. With
        codec_stats (see LossyCompressor.after_compress) the forward observations read the
        codec's range and distinct rows instead of passing over the rows in Python."""
        frame_tables = self._tables_of(plan)
        if codec_stats is None:
            coded = [None] * len(plan)
        else:
            coded = self._with_own_chunk(plan, frame_sizes, tensor, codec_stats)
        row_len = math.prod(tensor.shape[1:])
        row_bytes = row_len * tensor.element_size()
        header = _segment_header_bytes(list(tensor.shape[1:]))
        c, offset = self.controller, 0
        for (_dest, rows, eb), size, name, stats in zip(plan, frame_sizes, frame_tables, coded):
            piece = tensor[offset:offset + rows]
            offset += rows
            if name is None or rows == 0:
                continue
            values = rows * row_len
            if self.direction == "forward":
                if self.observe:
                    unique = self._observe(name, piece, stats)
                    if unique is not None:
                        self._unique_fraction[name] = unique / rows
                if self.dedup:
                    values *= self._unique_fraction.get(name, 1.0)
            elif self.observe:
                c.observe_gradients(name, piece)
            if size is None:  # the chunk a rank keeps: observed, but never coded
                continue
            c.record_frame(name, rows * row_bytes, size, error_bound=eb, values=values,
                           fixed_bytes=header, direction=self.direction)

    def after_reuse(self, plan, shares):
        """Each table's reuse share with the controller (its telemetry's reuse_rate)."""
        for name, share in zip(self._tables_of(plan), shares):
            if name is not None and share is not None and share[0]:
                self.controller.record_reuse(name, share[0], share[1] + share[2])

    def for_backward(self):
        """The gradient compressor: chunk for rank r holds ``controller.tables_of(r)``.

        A backward compressor's own for_backward (a double backward) is uncompressed.
        """
        if self.backward is None or self.direction == "backward":
            return NoneCompressor
        if self.backward is FP16Compressor or isinstance(self.backward, LossyCompressor):
            return self.backward
        if self._backward_compressor is None:
            layouts = [self.controller.tables_of(r) for r in range(self.controller.size)]
            self._backward_compressor = AdaptiveCompressor(
                self.controller, layouts, backward=None, level=self.level, dedup=self.dedup,
                observe=self.observe, bound=self.backward, direction="backward",
                dither=bool(self.dither), auto=self.auto, row_len=self.row_len)
        return self._backward_compressor

    def agreement(self):
        """As LossyCompressor's, with the controller's configuration in place of one bound; the
        table layout is left out, since each rank sends its own tables."""
        # A Controller's configuration is fixed when it is built, and get_config() over its
        # tables costs ~60 us, paid twice a step (forward and backward) for the protocol's
        # settings digest: taken once.
        if self._controller_config is None:
            controller = self.controller.get_config()
            controller.pop("telemetry", None)  # only rank 0 writes it
            self._controller_config = controller
        controller = self._controller_config
        return {"type": type(self).__name__, "controller": controller, "level": self.level,
                "dedup": self.dedup, "bound": self.bound, "direction": self.direction,
                "dither": self.dither, "auto": self.auto,
                **({"reuse_memory": self.reuse_memory} if self.reuse else {})}

    def compress(self, tensor):
        """One frame of the whole tensor at the base bound (collectives other than alltoall)."""
        return super().compress(tensor)

    def get_config(self):
        """JSON-serialisable settings, the controller's included; from_config is collective."""
        backward = self.backward
        if backward is FP16Compressor:
            backward = "fp16"
        elif isinstance(backward, LossyCompressor):
            backward = backward.get_config()
        config = {"id": self.codec_id, "controller": self.controller.get_config(),
                  "tables": self.tables, "backward": backward, "level": self.level,
                  "dedup": self.dedup, "observe": self.observe, "bound": self.bound,
                  "direction": self.direction, "dither": self.dither, "auto": self.auto}
        if self.row_len is not None:
            config["row_len"] = self.row_len
        if self.reuse:
            config["reuse"], config["reuse_memory"] = True, self.reuse_memory
        return config

    @classmethod
    def from_config(cls, config, comm=None):
        """Rebuild from get_config(): builds a new Controller (collective on every rank)."""
        from .controller import Controller

        config = dict(config)
        codec_id = config.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise ValueError(f"config is for {codec_id!r}, not {cls.codec_id!r}")
        controller = Controller.from_config(config.pop("controller"), comm=comm)
        return cls(controller, **config)

    def __repr__(self):
        backward = "'fp16'" if self.backward is FP16Compressor else repr(self.backward)
        return (f"AdaptiveCompressor(controller={self.controller!r}, tables={self.tables!r}, "
                f"backward={backward}, level={self.level!r}, dedup={self.dedup!r}, "
                f"observe={self.observe!r}, bound={self.bound!r}, "
                f"direction={self.direction!r}, dither={self.dither!r}, auto={self.auto!r}"
                + ("" if self.row_len is None else f", row_len={self.row_len!r}")
                + (f", reuse=True, reuse_memory={self.reuse_memory!r}" if self.reuse else "")
                + ")")
