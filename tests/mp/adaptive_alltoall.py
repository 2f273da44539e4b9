"""Worker: AdaptiveCompressor through hvd_lossy.torch.alltoall on 2 ranks (mpirun).

Each rank owns two tables and sends every rank its tables' lookups for that rank's samples
(chunk = [table 0 rows, table 1 rows]); gradients return to the owners. Every table's rows must
come back within that table's own bound, forward (lookups) and backward (gradients); after an
exchange both ranks hold the same bounds, and in eval mode the alltoall is lossless.
Exits non-zero (an AssertionError) on any failure.
"""
import torch

import hvd_lossy.torch as hvd
from hvd_lossy.adaptive import Controller

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, size
B, D = 6, 8  # samples per rank, embedding dim
# Owners: rank 0 holds "huge" (TIGHTEN) and "tiny" (LOOSEN), rank 1 the two BASE tables.
TABLES = [{"name": "huge", "cardinality": 10**7, "owner": 0},
          {"name": "tiny", "cardinality": 4, "owner": 0},
          {"name": "mid1", "cardinality": 5000, "owner": 1},
          {"name": "mid2", "cardinality": 4000, "owner": 1}]
SCALE = {"huge": 1.0, "tiny": 50.0, "mid1": 0.01, "mid2": 3.0}
controller = Controller(TABLES, policy="paper", schedule="step", E=4, interval=2,
                        grad_base=0.1)
compression = hvd.Compression.adaptive(controller, controller.tables_of(rank), backward="table")
coded = []  # the tables observed through the codec's report, not a second pass over the rows
_observe_coded = controller.observe_coded
controller.observe_coded = lambda table, *a: (coded.append(table), _observe_coded(table, *a))[1]


def lookups(table, dest, step):
    """Rows of `table` for rank dest's samples (known to every rank, for checking)."""
    g = torch.Generator().manual_seed(1000 * step + 10 * dest + controller.names.index(table))
    return torch.randn(B, D, generator=g) * SCALE[table]


def grads(table, src, step):
    g = torch.Generator().manual_seed(7 + 1000 * step + 10 * src + controller.names.index(table))
    return torch.randn(B, D, generator=g) * SCALE[table] * 0.1


def check_within(received, expected, bound, what):
    """Every element within bound x (max - min) of the expected piece (mode rel), in float64."""
    x = expected.double()
    limit = bound * (x.max() - x.min()).item()
    err = (received.double() - x).abs().max().item()
    assert err <= limit, f"rank {rank}: {what}: error {err} > bound {bound} x range = {limit}"
    return err


for step in range(4):
    bounds, gbounds = controller.bounds(), controller.grad_bounds()
    mine = controller.tables_of(rank)
    send = torch.cat([lookups(t, dest, step) for dest in range(size) for t in mine])
    send.requires_grad_(True)
    out, received = hvd.alltoall(send, splits=[B * len(mine)] * size, compression=compression)
    assert received.tolist() == [B * len(controller.tables_of(s)) for s in range(size)]
    offset, errors = 0, {}
    for src in range(size):
        for t in controller.tables_of(src):
            errors[t] = check_within(out[offset:offset + B], lookups(t, rank, step), bounds[t],
                                     f"step {step} lookups of {t} from rank {src}")
            offset += B
    # the own chunk is copied exactly; what travels is lossy, not lossless
    assert all(errors[t] == 0 for t in mine), errors
    assert any(errors[t] > 0 for t in controller.tables_of(1 - rank)), errors
    # Gradient of out: rows in the order received; they go back to the owners.
    grad_out = torch.cat([grads(t, rank, step) for src in range(size)
                          for t in controller.tables_of(src)])
    out.backward(grad_out)
    offset = 0
    for dest in range(size):
        for t in mine:
            check_within(send.grad[offset:offset + B], grads(t, dest, step), gbounds[t],
                         f"step {step} gradients of {t} from rank {dest}")
            offset += B
    controller.step()

# The frames fed the controller: ratios per table, the same bounds on both ranks.
summary = controller.summary()
both = hvd.allgather_object((controller.bounds(), summary))
assert both[0] == both[1], both
for t in controller.names:
    assert summary["tables"][t]["ratio"] > 1, summary["tables"][t]
    assert summary["tables"][t]["bwd_ratio"] > 1, summary["tables"][t]
assert summary["tables"]["huge"]["class"] == "tighten" and controller.multiplier == 1.0
stats = {s.name: s for s in controller.stats()}
assert stats["tiny"].has_lookups and stats["tiny"].has_grads and stats["tiny"].rows == 2 * B * 2
assert set(coded) == set(controller.tables_of(rank)), coded  # every call's remote frames
# The last interval (steps 2, 3) saw every lookup of every table: its own chunk through the rows,
# the chunks that travelled through the range the codec reported. Both exact.
for t in controller.names:
    seen = torch.stack([lookups(t, dest, step) for dest in range(size) for step in (2, 3)])
    assert (stats[t].min, stats[t].max) == (seen.min().item(), seen.max().item()), (t, stats[t])

# Eval mode: uncompressed (lossless frames), bit-identical.
controller.eval()
send = torch.cat([lookups(t, dest, 99) for dest in range(size) for t in mine])
out = hvd.alltoall(send, compression=compression)
offset = 0
for src in range(size):
    for t in controller.tables_of(src):
        assert torch.equal(out[offset:offset + B], lookups(t, rank, 99)), t
        offset += B
print(f"rank {rank}: adaptive alltoall OK, summary ratio {summary['ratio']:.2f}", flush=True)
