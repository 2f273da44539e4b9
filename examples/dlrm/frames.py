"""Compression.lossy with one frame per table, and the bytes each table's frames took.

A destination's chunk holds several tables back to back (exchange.py), and a relative bound is a
fraction of a frame's value range: in one mixed frame the table with the widest values sets the
absolute error of all of them (early in training a 3-row table's embeddings span +-0.6 and a
100k-row table's +-0.003, so 3% of the mixed range wipes out the big table). LossyCompressor's
`segments` cuts each chunk into its tables' frames; this subclass only adds, through the
`after_compress` hook, the raw and compressed bytes per table for the run's report.
"""

import math

from hvd_lossy.compression import LossyCompressor


class TableBytes(LossyCompressor):
    """Compression.lossy(error_bound, mode, level, backward, segments=<tables of each chunk>)
    that records bytes per table.

    Arguments:
        error_bound, mode, level, backward: as Compression.lossy.
        layouts: per destination rank, the names of the tables in its chunk, in chunk order
            (forward: this rank's tables, for every destination; backward: rank r's tables).
        table_bytes: dict that receives key -> [raw bytes, frame bytes], key = prefix + name
            (shared by the forward and backward compressors).
        prefix: "" for lookups, "bwd:" for gradients.
    """

    def __init__(self, error_bound, mode, level, layouts, backward=None, table_bytes=None, prefix="",
                 dither=False, auto=False, reuse=False):
        super().__init__(error_bound, mode=mode, level=level, backward=backward,
                         segments=[len(layout) for layout in layouts], dither=dither, auto=auto,
                         reuse=reuse)
        self.layouts = [list(layout) for layout in layouts]
        self.table_bytes = {} if table_bytes is None else table_bytes
        self.prefix = prefix

    def after_compress(self, plan, frame_sizes, tensor):
        row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()
        seen = {}  # frames so far per destination: the index into its layout
        for (dest, rows, _eb), size in zip(plan, frame_sizes):
            k = seen.get(dest, 0)
            seen[dest] = k + 1
            if rows and size is not None and k < len(self.layouts[dest]):
                acc = self.table_bytes.setdefault(self.prefix + self.layouts[dest][k], [0, 0])
                acc[0] += rows * row_bytes
                acc[1] += size


def table_compressors(error_bound, mode, level, backward, names_by_rank, rank, dither=False,
                      auto=False, reuse=False):
    """The forward compressor of `rank` (with its gradient compressor as `backward`).

    Arguments:
        backward: None (uncompressed gradients), Compression.fp16, "same" or an error bound.
        names_by_rank: the table names each rank owns.
        dither: as LossyCompressor's (False, True or "backward").
        auto: as LossyCompressor's (--auto), for both compressors.
        reuse: as LossyCompressor's (--reuse), for the lookups' compressor only.
    Returns:
        a TableBytes whose `table_bytes` collects both directions.
    """
    table_bytes = {}
    if backward == "same" or isinstance(backward, float):
        eb = error_bound if backward == "same" else backward
        backward = TableBytes(eb, mode, level, names_by_rank, table_bytes=table_bytes, prefix="bwd:",
                              dither=bool(dither), auto=auto)
    world = len(names_by_rank)
    return TableBytes(error_bound, mode, level, [names_by_rank[rank]] * world, backward=backward,
                      table_bytes=table_bytes, dither=dither is True, auto=auto, reuse=reuse)
