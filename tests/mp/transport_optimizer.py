"""Worker: DistributedOptimizer given a lossy compressor reduces every dense gradient to the same
bits on every rank, within the bound of the true average (or sum), step after step; with auto
it follows the all-to-all's agreed mode; its plain forms are Horovod's. Run by
tests/test_transport.py (transport_run.py ... optimizer) with 2 and 3 ranks."""
import copy

import horovod.torch as horovod
import pytest
import torch
from horovod.torch.optimizer import _DistributedOptimizer
from transport_util import N, R, cases_of, run_cases

import hvd_lossy.torch as hvd
from hvd_lossy import reuse
from hvd_lossy.backend import as_backend


def model():
    torch.manual_seed(5)  # the same initial parameters on every rank
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def loss_of(m, rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank's own batch
    x, y = torch.randn(32, 6, generator=g), torch.randn(32, 1, generator=g)
    return ((m(x) - y) ** 2).mean()


def gradients_of(m, rank, step):
    """Rank `rank`'s gradients at step `step`, computed here on a copy of the model."""
    twin = copy.deepcopy(m)
    loss_of(twin, rank, step).backward()
    return [p.grad.double() for p in twin.parameters()]


def run_steps(compression, op=hvd.Average, steps=3, before_step=None):
    """Trains `steps` steps; after each backward checks every parameter's reduced gradient
    against the ranks' true ones. Returns the largest error seen (0: an exact reduction)."""
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(),
                                   compression=compression, op=op)
    coding = compression.for_backward()
    worst = 0.0
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        true = [gradients_of(m, r, step) for r in range(N)]
        opt.zero_grad()
        loss_of(m, R, step).backward()
        opt.synchronize()
        for i, p in enumerate(m.parameters()):
            total = sum(t[i] for t in true)
            bound = sum(reuse.absolute_bound(t[i].float().reshape(-1), coding.error_bound,
                                             coding.mode) for t in true)
            if op == hvd.Average:
                total, bound = total / N, bound / N
            err = float((p.grad.double() - total).abs().max())
            rounding = 2 * N * 2.0 ** -24 * float(total.abs().max())  # float32 sums, as Horovod's
            assert err <= bound + rounding, \
                f"step {step}, parameter {i}: error {err} over the bound {bound}"
            worst = max(worst, err)
            row = p.grad.reshape(1, -1)
            assert torch.equal(horovod.allgather(row), row.repeat(N, 1)), "ranks differ"
        with opt.skip_synchronize():
            opt.step()
    for p in m.parameters():  # the replicas stayed identical
        row = p.detach().reshape(1, -1)
        assert torch.equal(horovod.allgather(row), row.repeat(N, 1)), "parameters diverged"
    return worst


def test_lossy_gradients_reach_every_rank_alike_within_the_bound_of_the_average():
    assert run_steps(hvd.Compression.lossy(0.03)) > 0  # coded, not sent as they are
    assert run_steps(hvd.Compression.lossy(0.03, backward=0.05), op=hvd.Sum) > 0


def test_with_auto_the_dense_gradients_follow_the_alltoalls_agreed_mode():
    compression = hvd.Compression.lossy(0.03, auto=True)
    x = torch.rand(4 * N, 8)

    def alltoall(_step):  # auto's warm-up: its first call runs lossy, its second plain
        hvd.alltoall(x, [4] * N, compression=compression)

    assert run_steps(compression, steps=1, before_step=alltoall) > 0, \
        "after a lossy all-to-all the gradients travel coded"
    assert run_steps(compression, steps=1, before_step=alltoall) <= 1e-6, \
        "after a plain one they travel as Horovod's allreduce"
    # a call auto counts (after its warm-up): the dense gradients' exchange adds to its cost
    slot = compression._auto_slots[as_backend(None).key]
    seen = {}

    def alltoall_and_note(step):
        alltoall(step)
        seen["call"] = slot.calls - 1
        seen["cost"] = slot.costs[seen["call"]]

    run_steps(compression, steps=1, before_step=alltoall_and_note)
    assert slot.costs[seen["call"]] > seen["cost"], "the optimizer's exchange was not counted"


class TwoBranch(torch.nn.Module):
    """model() beside a branch that only rank 0's loss uses."""

    def __init__(self):
        super().__init__()
        self.net = model()
        torch.manual_seed(6)
        self.side = torch.nn.Linear(6, 1)

    def loss(self, rank, step):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(32, 6, generator=g), torch.randn(32, 1, generator=g)
        out = self.net(x) + (self.side(x) if rank == 0 else 0)
        return ((out - y) ** 2).mean()


def test_the_gradients_leave_from_the_last_hook_or_at_synchronize_where_one_got_none():
    """The allgather starts as soon as backward has every parameter's gradient, so that it
    travels while the rest of backward runs; a rank where some parameter got none starts it at
    synchronize(), with zeros for that one, and the ranks still agree within the bound."""
    m = TwoBranch()
    lossy = hvd.Compression.lossy(0.03)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(), compression=lossy)
    for step in range(2):
        opt.zero_grad()
        m.loss(R, step).backward()
        launched = opt._step is not None and opt._step.handle is not None
        assert launched == (R == 0), f"rank {R}: launched before synchronize() is {launched}"
        opt.synchronize()
        twin = copy.deepcopy(m)
        twin.loss(0, step).backward()  # only rank 0 gives the side branch a gradient
        for p, q in zip(m.side.parameters(), twin.side.parameters()):
            true = q.grad.double() / N
            bound = reuse.absolute_bound(q.grad.reshape(-1), lossy.for_backward().error_bound,
                                         lossy.for_backward().mode) / N
            err = float((p.grad.double() - true).abs().max())
            assert err <= bound + 2 * N * 2.0 ** -24 * float(true.abs().max()), \
                f"error {err} over the bound {bound}"
            row = p.grad.reshape(1, -1)
            assert torch.equal(horovod.allgather(row), row.repeat(N, 1)), "ranks differ"
        with opt.skip_synchronize():
            opt.step()


def test_a_gradient_coding_that_is_horovods_gives_horovods_optimizer():
    for backward, plain in ((hvd.Compression.fp16, hvd.Compression.fp16),
                            (None, hvd.Compression.none)):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                       compression=hvd.Compression.lossy(0.03, backward=backward))
        assert type(opt)._allreduce_grad_async is _DistributedOptimizer._allreduce_grad_async
        assert opt._compression is plain


def test_what_a_lossy_optimizer_cannot_do_is_refused_on_every_rank():
    lossy = hvd.Compression.lossy(0.03)
    params = list(model().parameters())
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), compression=lossy, op=hvd.Adasum)
    with pytest.raises(ValueError, match="groups=2 is not supported"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), compression=lossy, groups=2)
    table = torch.nn.Embedding(10, 4, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(table.parameters(), lr=0.1), compression=lossy)
    with pytest.raises(ValueError, match="sparse gradient"):
        table(torch.tensor([1, 2])).sum().backward()
    del opt


if __name__ == "__main__":
    run_cases(cases_of(globals()))
