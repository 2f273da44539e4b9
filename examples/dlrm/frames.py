"""Compression.lossy's settings with one frame per (destination, table).

`Compression.lossy` makes one frame per destination. A destination's chunk holds several tables
back to back (exchange.py), and a relative bound is a fraction of the frame's value range, so in
one mixed frame the table with the widest values sets the absolute error of all of them: early in
training, when a 3-row table's embeddings span +-0.6 and a 100k-row table's +-0.003, a 3% bound
on the mixed frame wipes out the big table. Cutting each chunk into its tables' pieces (the
extension point LossyCompressor offers for this: `plan`/`after_compress`) makes "relative"
mean relative to each table's own range, and lets the run report bytes per table.
"""

import math

from hvd_lossy.compression import SAME, LossyCompressor
from hvd_lossy.torch import Compression


class TableFrames(LossyCompressor):
    """A fixed error bound, one frame per (destination, table).

    Arguments:
        error_bound, mode, level: as Compression.lossy.
        layouts: per destination rank, the names of the tables in its chunk, in chunk order
            (forward: this rank's tables for every destination; backward: destination r's tables).
        backward: gradient all-to-all: "same", None, an error bound, or Compression.fp16.
        backward_layouts: the layouts of the gradient all-to-all (chunk for rank r holds r's tables).
        table_bytes: dict name -> [raw bytes, frame bytes] that compressed frames are added to
            (shared by the forward and backward compressors; keys prefixed "bwd:" for gradients).
    """

    def __init__(self, error_bound, mode, layouts, backward=SAME, backward_layouts=None,
                 table_bytes=None, prefix="", level=1):
        super().__init__(error_bound, mode=mode, level=level, backward=backward)
        self.layouts, self.backward_layouts = layouts, backward_layouts
        self.table_bytes = {} if table_bytes is None else table_bytes
        self.prefix = prefix
        self._names = []

    def plan(self, splits):
        """Each destination's rows in equal parts, one per table of its layout."""
        plan, names = [], []
        for dest, rows in enumerate(splits):
            layout = self.layouts[dest]
            if not layout:
                if rows:
                    raise ValueError("chunk for rank %d has %d rows but no tables" % (dest, rows))
                plan.append((dest, 0, self.error_bound))
                names.append(None)
                continue
            per_table, rest = divmod(int(rows), len(layout))
            if rest:
                raise ValueError("chunk for rank %d has %d rows, not divisible among its tables %s"
                                 % (dest, rows, layout))
            plan.extend((dest, per_table, self.error_bound) for _ in layout)
            names.extend(layout)
        self._names = names
        return plan

    def after_compress(self, plan, frame_sizes, tensor):
        row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()
        for (_dest, rows, _eb), size, name in zip(plan, frame_sizes, self._names):
            if name is not None:
                acc = self.table_bytes.setdefault(self.prefix + name, [0, 0])
                acc[0] += rows * row_bytes
                acc[1] += size

    def for_backward(self):
        if self.backward is None:
            return Compression.none
        if self.backward is Compression.fp16:
            return Compression.fp16
        if self._backward_compressor is None:
            eb = self.error_bound if self.backward == SAME else self.backward
            self._backward_compressor = TableFrames(eb, self.mode, self.backward_layouts, backward=None,
                                                    table_bytes=self.table_bytes, prefix="bwd:",
                                                    level=self.level)
        return self._backward_compressor
