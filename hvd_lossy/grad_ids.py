"""Gradients summed by id (issue 24): the gradient all-to-all of a reusing call sends one row
per (segment, id) instead of one per lookup.

A reusing alltoall (Compression.lossy(..., reuse=True) with `ids` and `recv_ids`) has checked on
every rank that each receiver's recv_ids are the ids its sender sent (the REUSE block's check
values, hvd_lossy.reuse_exchange). So both ends of every pair know the same keys, cut into the
same segments (the sender's plan, which the frames carry). The rows of one (segment, id) are
lookups of one embedding row, whose backward sums their gradients anyway; so:

  receiver of the lookups (sends the gradients)
      sums its gradient rows per (segment, id): one row an id, in order of first occurrence;
      codes each segment's sums at the absolute bound its rows get today (the compressor's
      bound over the rows' range, for rel), so each id's summed gradient is within ONE bound,
      where today's sum of k coded rows is within k;
  owner of the tables (gets the gradients)
      finds the same (segment, id) order from the ids it sent, and returns as the gradient of
      its input each id's sum on the id's first row and zeros on the others: what an
      embedding's backward sums is the same.

Measured by benchmarks/reuse_bytes.py --grad-by-id: 2.9x fewer gradient bytes on the quality
recipe (benchmarks/RESULTS.md). Plain compressors only: an adaptive compressor's controller
reads per-table statistics of per-lookup frames, so its gradients stay per lookup.
"""
import numpy as np
import torch

from hvd_lossy import _C, _codec


def number_keys(keys, seg_rows):
    """The distinct keys of each segment (seg_rows[k] consecutive rows of the 1-D int64 `keys`),
    numbered by first occurrence, segment after segment.

    Returns:
        (inverse, first, counts): int64 tensors, each row's number and each number's first
        row, and each segment's count of distinct keys.
    """
    keys = keys.to("cpu", torch.int64).contiguous()
    inverse = torch.empty(keys.numel(), dtype=torch.int64)
    first = torch.empty(keys.numel(), dtype=torch.int64)
    counts = _C.number_keys(keys.data_ptr() if keys.numel() else 0, [int(r) for r in seg_rows],
                            inverse.data_ptr(), first.data_ptr())
    return inverse, first[:sum(counts)], counts


def _host(t, name):
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (the native passes read host memory), got "
                         f"one on {t.device}")
    return t.contiguous()


def sum_rows(rows, inverse, seg_rows, n_unique, spans=False):
    """The rows (a contiguous CPU tensor, dim 0 the rows) summed by number_keys' numbering
    `inverse` of the segments `seg_rows`, as ``torch.zeros(n_unique, ...).index_add_(0, inverse,
    rows)`` sums them, in one native pass (native/cpu/keyed.h).

    Returns:
        (sums, spans): sums shaped (n_unique, *rows.shape[1:]); with spans=True each segment's
        finite range max - min as the codec's range pass finds it (NaN without a finite
        element), else None.
    """
    code = _codec._dtype_code(rows)
    rows, inverse = _host(rows, "rows"), _host(inverse, "inverse").to(torch.int64)
    seg_rows = [int(r) for r in seg_rows]
    if not sum(seg_rows) == inverse.numel() == rows.shape[0]:
        raise ValueError(f"segments of {sum(seg_rows)} rows, {inverse.numel()} numbers and "
                         f"{rows.shape[0]} rows, expected one count")
    out = torch.empty((int(n_unique), *rows.shape[1:]), dtype=rows.dtype)
    found = np.empty(len(seg_rows)) if spans else None
    _C.sum_rows(code, rows.data_ptr() if rows.numel() else 0, rows[:1].numel(),
                inverse.data_ptr() if inverse.numel() else 0, seg_rows, int(n_unique),
                out.data_ptr() if out.numel() else 0, found.ctypes.data if spans else 0)
    return out, (found.tolist() if spans else None)


def expand_rows(sums, inverse, first):
    """(len(inverse), ...) rows holding each number's row of `sums` on its first row
    (first[inverse[r]] == r) and zeros elsewhere, in one native pass (native/cpu/keyed.h)."""
    code = _codec._dtype_code(sums)
    sums = _host(sums, "sums")
    inverse, first = (_host(t, name).to(torch.int64) for t, name in ((inverse, "inverse"),
                                                                     (first, "first")))
    if first.numel() != sums.shape[0]:
        raise ValueError(f"{first.numel()} first rows for {sums.shape[0]} sums, expected one a sum")
    out = torch.empty((inverse.numel(), *sums.shape[1:]), dtype=sums.dtype)
    _C.expand_rows(code, sums.data_ptr() if sums.numel() else 0, sums[:1].numel(),
                   inverse.data_ptr() if inverse.numel() else 0,
                   first.data_ptr() if first.numel() else 0, inverse.numel(), sums.shape[0],
                   out.data_ptr() if out.numel() else 0)
    return out


class Keyed:
    """One side of a call: its rows' keys, in order, cut into segments.

    Arguments:
        keys: int64 tensor (rows,), the id of every row (the own chunk's included).
        seg_rows: per peer, in rank order, the rows of each of its segments.
    """

    def __init__(self, keys, seg_rows):
        self.seg_rows = [list(map(int, rows)) for rows in seg_rows]
        flat = [r for rows in self.seg_rows for r in rows]
        if sum(flat) != keys.numel():
            raise ValueError(f"segments of {sum(flat)} rows for {keys.numel()} keys")
        # Numbered by first occurrence a segment, in segment order (one native pass, no sort):
        # both ends see a chunk's rows in one order, so they number them alike.
        self.inverse, self.first, counts = number_keys(keys, flat)
        self._flat = flat
        it = iter(counts)
        self.unique_rows = [[next(it) for _ in rows] for rows in self.seg_rows]

    def peer_rows(self):
        """Rows of each peer's chunk."""
        return [sum(rows) for rows in self.seg_rows]

    def peer_unique(self):
        """Distinct (segment, id) of each peer's chunk."""
        return [sum(rows) for rows in self.unique_rows]

    def sum(self, rows, spans=False):
        """(sums, spans): `rows` (rows, ...) summed per (segment, id), in order of first
        occurrence, as index_add_ into zeros sums them; with spans=True also each segment's
        finite range max - min (0.0 without a finite element) as the codec's rel bound takes
        it (NaN and +-Inf travel as outliers and must not set the bound), else None. One native
        pass: each segment's range, then its sums while its rows are in cache."""
        sums, found = sum_rows(rows, self.inverse, self._flat, self.first.numel(), spans)
        return sums, (None if found is None else [0.0 if s != s else s for s in found])

    def expand(self, sums):
        """(rows, ...) with each (segment, id)'s sum on its first row, zeros elsewhere."""
        if sums.shape[0] != self.first.numel():
            raise RuntimeError(f"got {sums.shape[0]} summed gradient rows, expected one a "
                               f"distinct (segment, id) of the rows sent: {self.first.numel()}")
        return expand_rows(sums, self.inverse, self.first)


class CallIds:
    """What the gradient of one reusing alltoall needs: both sides' keys and segments, and this
    rank's place among the peers."""

    def __init__(self, sent, received, me):
        self.sent, self.received, self.me = sent, received, me


def _cut_as_forward(compressor, received):
    """The compressor's plan of the chunks, or None where it does not cut them as the forward's
    segments are (the gradients then travel one row a lookup)."""
    base = compressor.plan(received.peer_rows())
    pieces = [(d, r) for d, rows in enumerate(received.seg_rows) for r in rows]
    if [(d, r) for d, r, _e in base if r] != [(d, r) for d, r in pieces if r]:
        return None
    return base


def plan(compressor, received, spans):
    """The gradient call's frames, (destination, rows, absolute bound) a segment, or None where
    _cut_as_forward says the per-lookup path. spans: each segment's finite range (Keyed.sum's),
    read for a rel bound."""
    base = _cut_as_forward(compressor, received)
    return None if base is None else _frames(base, compressor, received, spans)


def _frames(base, compressor, received, spans):
    """plan's frames from the compressor's plan `base` of the chunks (_cut_as_forward's)."""
    ebs = iter(e for _d, r, e in base if r)
    ranges = iter(spans if compressor.mode == "rel" else [])
    out = []
    for d, (rows, unique) in enumerate(zip(received.seg_rows, received.unique_rows)):
        if not rows:
            out.append((d, 0, 0.0))
        for r, u in zip(rows, unique):
            eb = next(ebs) if r else 0.0
            if compressor.mode == "rel":
                span = next(ranges)
                if r:
                    eb = eb * span if eb > 0 else 0.0
            out.append((d, u, eb))
    return out


def backward(ids, grad, compressor, start):
    """The gradient of the forward input, with the gradients summed by id on the wire.

    Arguments:
        ids: the forward call's CallIds.
        grad: (rows received forward, ...) contiguous gradient of the forward output.
        compressor: the gradient compressor (its bound, mode and dither).
        start: start(tensor, splits, plan) -> a started alltoall whose wait() gives
            (output, received splits), coding `plan`'s frames in mode "abs".
    Returns:
        the gradient rows of the forward input, or None where plan() says the per-lookup path.
    """
    base = _cut_as_forward(compressor, ids.received)
    if base is None:  # before the sums: they would be of no use
        return None
    sums, spans = ids.received.sum(grad, spans=compressor.mode == "rel")
    handle = start(sums, ids.received.peer_unique(),
                   _frames(base, compressor, ids.received, spans))
    # The call's raw bytes: what its gradients are uncompressed, one row a lookup (so that a
    # ratio against plain Horovod counts the summing too).
    me, rows = ids.me, ids.received.peer_rows()
    handle.record.raw_bytes = (sum(rows) - rows[me]) * grad[:1].numel() * grad.element_size()
    output, got = handle.wait()
    if list(map(int, got)) != ids.sent.peer_unique():
        raise RuntimeError(f"got {list(map(int, got))} summed gradient rows from the ranks, "
                           f"expected {ids.sent.peer_unique()} (one a distinct id sent there)")
    return ids.sent.expand(output)
