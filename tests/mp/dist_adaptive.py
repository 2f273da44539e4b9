"""The adaptive controller over a torch.distributed group (no mpi4py, no Horovod): per-table
bounds on the reference DLRM's flattened layout, forward and backward."""
import torch

from dist_util import N, R, dist, max_error, rel_bound

from hvd_lossy.adaptive import Controller

B, D = 6, 8  # samples per rank, embedding dim
# Rank r owns tables r and N + r: two each, with value scales far apart.
TABLES = [{"name": f"t{i}", "cardinality": 10 ** (i % 4 + 2), "owner": i % N} for i in range(2 * N)]
SCALE = {f"t{i}": 10.0 ** (i % 3 - 1) for i in range(2 * N)}


def _rows(table, dest, step, grad=False):
    g = torch.Generator().manual_seed(1000 * step + 10 * dest + int(table[1:]) + 7 * grad)
    return torch.randn(B, D, generator=g) * SCALE[table] * (0.1 if grad else 1.0)


def test_adaptive_controller_runs_over_the_process_group_with_per_table_bounds():
    controller = Controller(TABLES, policy="paper", schedule="step", E=4, interval=2,
                            grad_base=0.1)
    assert controller.comm_backend == "torch"
    mine = controller.tables_of(R)
    c = dist.Compression.adaptive(controller, mine, backward="table", row_len=D)
    for step in range(4):
        bounds, gbounds = controller.bounds(), controller.grad_bounds()
        # [global batch, tables x D], tables side by side, flattened: the reference layout
        send = torch.cat([torch.cat([_rows(t, dest, step) for t in mine], dim=1)
                          for dest in range(N)]).reshape(-1).requires_grad_(True)
        out_splits = [B * len(controller.tables_of(s)) * D for s in range(N)]
        out = dist.all_to_all_single_autograd(send, out_splits, [B * len(mine) * D] * N,
                                              compression=c)
        at = 0
        for src in range(N):
            theirs = controller.tables_of(src)
            got = out[at:at + out_splits[src]].view(B, len(theirs), D)
            for k, t in enumerate(theirs):
                ref = _rows(t, R, step)
                bound = 0.0 if src == R else rel_bound(ref, bounds[t])
                assert max_error(got[:, k], ref) <= bound, (step, t, max_error(got[:, k], ref))
            at += out_splits[src]
        grad = torch.cat([torch.cat([_rows(t, R, step, grad=True) for t in
                                     controller.tables_of(src)], dim=1).reshape(-1)
                          for src in range(N)])
        out.backward(grad)
        got = send.grad.view(N, B, len(mine), D)
        for dest in range(N):
            for k, t in enumerate(mine):
                ref = _rows(t, dest, step, grad=True)
                bound = 0.0 if dest == R else rel_bound(ref, gbounds[t])
                assert max_error(got[dest, :, k], ref) <= bound, (step, t, dest)
        controller.step()
    everyone = controller._comm.allgather_object(sorted(controller.bounds().items()))
    assert all(b == everyone[0] for b in everyone), everyone
