"""Shared pieces of the torch.distributed workers (under torchrun): the group, the case runner
and deterministic inputs any rank can rebuild for any other rank."""
import os
import sys

import torch

import hvd_lossy.distributed as dist
from cases import cases_of, run_cases as _run_cases  # noqa: F401 (cases_of: for the workers)

BACKEND = "gloo"  # `--backend mpi` under mpirun, where torch has MPI
if "--backend" in sys.argv:
    _at = sys.argv.index("--backend")
    BACKEND = sys.argv[_at + 1]
    del sys.argv[_at:_at + 2]
dist.init_process_group(BACKEND)
R, N = dist.get_rank(), dist.get_world_size()


def lookups(src, case, rows, dim=4, dtype=torch.float32, scale=1.0):
    """Rows drawn from a small table, so duplicates occur as in embedding lookups."""
    g = torch.Generator().manual_seed(7919 * case + src)
    table = (torch.rand((16, dim), generator=g, dtype=torch.float64) * 2 - 1) * scale
    return table[torch.randint(0, 16, (rows,), generator=g)].to(dtype)


def uneven_splits(src, case, n):
    """Rows rank src sends to each of n ranks: uneven, with zeros."""
    return [((src * 7 + d * 3 + case) % 4) * 2 + (d == src and case % 2) for d in range(n)]


def max_error(got, ref):
    return float((got.detach().double() - ref.detach().double()).abs().max()) if got.numel() else 0.0


def rel_bound(piece, eb):
    """The absolute bound of a frame of `piece` under relative bound eb (float64)."""
    p = piece.double()
    return eb * float(p.max() - p.min()) if p.numel() else 0.0


def run_cases(cases):
    """cases.run_cases with this rank, then the group's teardown."""
    _run_cases(cases, R)
    dist.destroy_process_group()
    # Not a normal exit: with torch 2.13 a gloo worker thread can still be dropping a finished
    # work's tensors when the interpreter finalises, and std::terminate aborts the process
    # (seen in 4 of 8 runs of a plain torch.distributed DLRM with no hvd_lossy at all).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
