"""Shared pieces of the transport workers: deterministic per-rank inputs that every rank can
rebuild for every other rank, so each receiver knows exactly what its peers sent."""

import torch

import hvd_lossy.torch as hvd
from cases import cases_of, run_cases as _run_cases  # noqa: F401 (cases_of: for the workers)

hvd.init(process_sets="dynamic")  # cases may add process sets
R, N = hvd.rank(), hvd.size()


def lookups(src, case, rows, trailing=(4,), dtype=torch.float32):
    """Rows drawn from a small table, so duplicates occur as in embedding lookups.
    A function of (src, case, rows) only: any rank can rebuild any rank's input."""
    return lookups_and_ids(src, case, rows, trailing, dtype)[0]


def lookups_and_ids(src, case, rows, trailing=(4,), dtype=torch.float32):
    """lookups() and the table ids its rows were drawn with (int64, one a row)."""
    g = torch.Generator().manual_seed(7919 * case + src)
    table = torch.rand((16, *trailing), generator=g, dtype=torch.float64) * 2 - 1
    ids = torch.randint(0, 16, (rows,), generator=g)
    return table[ids].to(dtype), ids


def uneven_splits(src, case, n):
    """Rows rank src sends to each of n ranks: uneven, with zeros."""
    return [((src * 7 + d * 3 + case) % 4) * 2 + (d == src and case % 2) for d in range(n)]


def pieces_for(dest, case, n, trailing=(4,), dtype=torch.float32):
    """What each source sends to dest: list over sources of (rows tensor)."""
    out = []
    for src in range(n):
        splits = uneven_splits(src, case, n)
        x = lookups(src, case, sum(splits), trailing, dtype)
        start = sum(splits[:dest])
        out.append(x[start:start + splits[dest]])
    return out


def abs_bound(piece, eb, mode="rel"):
    """The absolute bound of a frame of `piece`, by the codec's definition (float64)."""
    if mode == "abs":
        return eb
    finite = piece.double()[torch.isfinite(piece.double())]
    if finite.numel() == 0:
        return 0.0
    return eb * float(finite.max() - finite.min())


def assert_within(got, ref, bound, what):
    err = float((got.double() - ref.double()).abs().max()) if got.numel() else 0.0
    assert got.shape == ref.shape and got.dtype == ref.dtype, \
        f"{what}: got {got.dtype} {tuple(got.shape)}, expected {ref.dtype} {tuple(ref.shape)}"
    assert err <= bound, f"{what}: max error {err} exceeds the bound {bound}"


def run_cases(cases):
    """cases.run_cases with this rank (Horovod's)."""
    _run_cases(cases, hvd.rank())
