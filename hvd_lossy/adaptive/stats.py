"""Per-table statistics: local accumulation, exchange-friendly layout, merged view.

Each rank accumulates, per table, a fixed row of float64 moments (``FIELDS``). Every field merges
by sum except ``min``/``max``, so the merge of all ranks' rows is order-free; the controller
allgathers the rows and every rank merges them in rank order, hence bit-identical results.
"""

import dataclasses
import math

import numpy as np

__all__ = ["FIELDS", "empty_rows", "merge_rows", "TableStats", "row_stats", "grad_stats",
           "lookup_stats"]

FIELDS = (
    "values",        # lookup elements observed
    "moment_values", # of those, the elements behind sum and sumsq (the codec reports no moments)
    "sum",           # sum of lookup elements
    "sumsq",         # sum of squared lookup elements
    "min",           # min lookup element (+inf when none)
    "max",           # max lookup element (-inf when none)
    "rows",          # lookup rows observed
    "unique_rows",   # distinct rows, summed over observations
    "grad_values",   # gradient elements observed
    "grad_abs_sum",  # sum of |gradient|
    "raw_bytes",     # forward frames: uncompressed bytes
    "frame_bytes",   # forward frames: compressed bytes
    "fixed_bytes",   # forward frames: bytes that do not scale with the bound (header, dedup map)
    "enc_values",    # forward frames: elements actually encoded (after row dedup)
    "enc_log2_eb",   # forward frames: sum of enc_values * log2(effective bound used)
    "bwd_raw_bytes",    # backward (gradient) frames: uncompressed bytes
    "bwd_frame_bytes",  # backward (gradient) frames: compressed bytes
    "reuse_rows",    # forward rows sent in reusing calls (hvd_lossy.reuse_exchange)
    "reused_rows",   # of those, sent as references or residuals against what the peer held
)
IDX = {name: i for i, name in enumerate(FIELDS)}


def empty_rows(n_tables):
    """Accumulator for ``n_tables`` tables: zeros, min = +inf, max = -inf."""
    rows = np.zeros((n_tables, len(FIELDS)), dtype=np.float64)
    rows[:, IDX["min"]] = np.inf
    rows[:, IDX["max"]] = -np.inf
    return rows


def merge_rows(gathered):
    """Merge per-rank accumulators of shape (ranks, tables, fields) in rank order."""
    merged = gathered.sum(axis=0)
    merged[:, IDX["min"]] = gathered[:, :, IDX["min"]].min(axis=0)
    merged[:, IDX["max"]] = gathered[:, :, IDX["max"]].max(axis=0)
    return merged


LOOKUP_UNIQUE = 6  # index of the distinct-row count in lookup_stats()'s tuple


def lookup_stats(tensor):
    """Moments of a (rows, row_len) lookup tensor: (values, sum, sumsq, min, max, rows, unique).

    Non-finite elements are left out of the moments, as the codec leaves them out of the range.
    Distinct rows are counted by a 64-bit hash of the bit pattern of each row's first 4 elements
    (rows that agree there but differ later, or a hash collision, count once).
    """
    import torch

    t = tensor.detach()
    if t.dim() == 1:
        t = t.reshape(-1, 1)
    t = t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t
    rows = t.shape[0]
    uniq = float(_unique_rows(t))
    if t.numel() == 0:
        return (0.0, 0.0, 0.0, math.inf, -math.inf, float(rows), uniq)
    # The common case (all finite) in float32, summed in float64: no float64 copy of the whole
    # tensor (this runs for every observed frame).
    f = t if t.dtype == torch.float32 else t.float()
    lo, hi = (float(v) for v in torch.aminmax(f))
    if math.isfinite(lo) and math.isfinite(hi):
        sumsq = float((f * f).sum(dtype=torch.float64))
        if math.isfinite(sumsq):  # squares beyond float32's range take the float64 path
            return (float(t.numel()), float(f.sum(dtype=torch.float64)), sumsq, lo, hi,
                    float(rows), uniq)
    x = t.to(torch.float64)
    finite = torch.isfinite(x)
    n = int(finite.sum())
    if n == 0:
        return (0.0, 0.0, 0.0, math.inf, -math.inf, float(rows), uniq)
    # torch.where, not boolean indexing: the latter is ~100x slower on CPU.
    lo = float(torch.where(finite, x, math.inf).min())
    hi = float(torch.where(finite, x, -math.inf).max())
    x = torch.where(finite, x, 0.0)
    return (float(n), float(x.sum()), float((x * x).sum()), lo, hi, float(rows), uniq)


def _unique_rows(t, columns=4):
    import torch

    if t.shape[0] == 0:
        return 0
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    # Only the first `columns` elements of each row are hashed: distinct embedding rows differ
    # in all of them, and this keeps the count cheap (it runs on every observed frame).
    ints = t[:, :columns].contiguous().view(bits).to(torch.int64)
    # Fixed odd multipliers (same on every rank): a multiply-add hash over the row's bit patterns.
    gen = torch.Generator().manual_seed(0x5EED)
    mult = torch.randint(1, 2 ** 62, (ints.shape[1],), generator=gen, dtype=torch.int64) | 1
    mult = mult.to(ints.device)
    h = (ints * mult).sum(dim=1)
    return int(torch.unique(h).numel())


def grad_stats(tensor):
    """(elements, sum of |g|) over the finite elements of a gradient tensor."""
    import torch

    g = tensor.detach()
    total = float(g.abs().sum(dtype=torch.float64))
    if math.isfinite(total):  # the common case, without a float64 copy of the whole tensor
        return float(g.numel()), total
    g = g.to(torch.float64)
    finite = torch.isfinite(g)
    return float(finite.sum()), float(torch.where(finite, g.abs(), 0.0).sum())


@dataclasses.dataclass(frozen=True)
class TableStats:
    """Merged statistics of one table over one interval, on every rank alike.

    Quantities that were not observed this interval are ``nan``; ``has_lookups``, ``has_grads``
    and ``has_frames`` say which were.
    """

    name: str
    cardinality: int
    owner: int
    values: float = 0.0        # lookup elements observed
    mean: float = math.nan     # of the lookups whose moments were taken (see moment_values)
    std: float = math.nan      # spread of the lookup values
    min: float = math.nan
    max: float = math.nan
    rows: float = 0.0
    unique_fraction: float = math.nan  # distinct rows / rows, per observation
    grad: float = math.nan     # mean |gradient|
    raw_bytes: float = 0.0     # forward frames, bytes
    frame_bytes: float = 0.0
    fixed_bytes: float = 0.0   # part of frame_bytes that does not scale with the bound
    enc_values: float = 0.0    # elements encoded in forward frames (after dedup)
    log2_bound: float = math.nan  # enc_values-weighted mean log2 of the effective bound used
    bwd_raw_bytes: float = 0.0
    bwd_frame_bytes: float = 0.0
    reuse_rows: float = 0.0
    reused_rows: float = 0.0

    @property
    def reuse_rate(self):
        """Share of the forward rows of reusing calls that a peer already held (sent as
        references or residuals), nan without such calls."""
        return self.reused_rows / self.reuse_rows if self.reuse_rows > 0 else math.nan

    @property
    def range(self):
        """max - min of the lookup values (the unit of a relative bound), nan if not observed."""
        return self.max - self.min

    @property
    def ratio(self):
        """Achieved forward compression ratio raw/frame, nan without frames."""
        return self.raw_bytes / self.frame_bytes if self.frame_bytes > 0 else math.nan

    @property
    def bits_per_value(self):
        """Compressed bits per encoded element (fixed bytes left out), nan without frames."""
        if self.enc_values <= 0:
            return math.nan
        return 8.0 * (self.frame_bytes - self.fixed_bytes) / self.enc_values

    @property
    def has_lookups(self):
        return self.values > 0

    @property
    def has_grads(self):
        return not math.isnan(self.grad)

    @property
    def has_frames(self):
        return self.enc_values > 0 and self.frame_bytes > 0

    def to_json(self):
        """Plain dict of the stored and derived fields (nan as None, for JSON)."""
        d = dataclasses.asdict(self)
        d.update(range=self.range, ratio=self.ratio, bits_per_value=self.bits_per_value,
                 reuse_rate=self.reuse_rate)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}


def row_stats(spec, row):
    """TableStats of ``spec`` (name, cardinality, owner) from one merged accumulator row."""
    f = {name: float(row[i]) for name, i in IDX.items()}
    kw = dict(name=spec.name, cardinality=spec.cardinality, owner=spec.owner)
    if f["values"] > 0:
        kw.update(values=f["values"], min=f["min"], max=f["max"])
    if f["moment_values"] > 0:
        mean = f["sum"] / f["moment_values"]
        var = max(f["sumsq"] / f["moment_values"] - mean * mean, 0.0)
        kw.update(mean=mean, std=math.sqrt(var))
    if f["rows"] > 0:
        kw.update(rows=f["rows"], unique_fraction=f["unique_rows"] / f["rows"])
    if f["grad_values"] > 0:
        kw.update(grad=f["grad_abs_sum"] / f["grad_values"])
    kw.update({k: f[k] for k in ("raw_bytes", "frame_bytes", "fixed_bytes", "enc_values",
                                 "bwd_raw_bytes", "bwd_frame_bytes", "reuse_rows",
                                 "reused_rows")})
    if f["enc_values"] > 0:
        kw.update(log2_bound=f["enc_log2_eb"] / f["enc_values"])
    return TableStats(**kw)
