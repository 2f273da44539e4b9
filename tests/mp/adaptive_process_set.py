"""Worker: AdaptiveCompressor in an all-to-all limited to a process set (3 ranks, mpirun).

Global ranks 1 and 2 form the set; within it they are ranks 0 and 1. The controller is built
with process_set=, so it exchanges statistics over the set only, and owners are ranks within
the set: every table's rows must come back within that table's bound, forward and backward,
and both members hold the same bounds after an exchange. A controller of the whole world used
in the set's all-to-all raises RankError naming the mismatch instead of misplacing bounds.
Rank 0, outside the set, stays in step (a lossy alltoall of all ranks closes the run).
"""
import torch

import hvd_lossy.torch as hvd
from hvd_lossy.adaptive import Controller

hvd.init(process_sets="dynamic")
R, N = hvd.rank(), hvd.size()
assert N == 3, N
MEMBERS = [1, 2]
ps = hvd.add_process_set(MEMBERS)
B, D = 4, 8
TABLES = [{"name": "huge", "cardinality": 10**7, "owner": 0},  # owners: ranks within the set
          {"name": "tiny", "cardinality": 4, "owner": 0},
          {"name": "mid", "cardinality": 5000, "owner": 1}]
SCALE = {"huge": 1.0, "tiny": 50.0, "mid": 0.01}


def rows(table, dest, step, grad=False):
    g = torch.Generator().manual_seed(1000 * step + 10 * dest + [t["name"] for t in TABLES].index(table)
                                      + 7 * grad)
    return torch.randn(B, D, generator=g) * SCALE[table] * (0.1 if grad else 1.0)


def within(got, ref, bound, what):
    x = ref.double()
    limit = bound * (x.max() - x.min()).item()
    err = (got.double() - x).abs().max().item()
    assert err <= limit, f"rank {R}: {what}: error {err} > {bound} x range = {limit}"


if R in MEMBERS:
    me = ps.rank()
    controller = Controller(TABLES, policy="paper", E=4, interval=1, grad_base=0.1, process_set=ps)
    assert (controller.rank, controller.size) == (me, 2)
    lossy = hvd.Compression.adaptive(controller, controller.tables_of(me), backward="table")
    for step in range(3):
        bounds, gbounds = controller.bounds(), controller.grad_bounds()
        mine = controller.tables_of(me)
        send = torch.cat([rows(t, dest, step) for dest in range(2) for t in mine]).requires_grad_()
        out, got = hvd.alltoall(send, splits=[B * len(mine)] * 2, compression=lossy,
                                process_set=ps)
        offset = 0
        for src in range(2):
            for t in controller.tables_of(src):
                within(out[offset:offset + B], rows(t, me, step), bounds[t], f"{t} from {src}")
                offset += B
        # the gradient of the rows of table t that src sent here (rank `me`): known everywhere
        grad = torch.cat([rows(t, 2 * src + me, step, grad=True) for src in range(2)
                          for t in controller.tables_of(src)])
        (g_send,) = torch.autograd.grad(out, send, grad_outputs=grad)
        offset = 0
        for dest in range(2):
            for t in mine:  # the gradient of what this rank sent to dest, from dest
                within(g_send[offset:offset + B], rows(t, 2 * me + dest, step, grad=True), gbounds[t],
                       f"gradient of {t} from {dest}")
                offset += B
        controller.step()  # interval=1: an exchange over the set every step
    both = controller._comm.allgather_object(controller.bounds())
    assert both[0] == both[1], both
    world = Controller({"huge": 10**7}, comm="local")  # laid out for 1 rank, not the set's 2
    try:
        hvd.alltoall(torch.zeros(2 * B, D), splits=[B, B], process_set=ps,
                     compression=hvd.Compression.adaptive(world, ["huge"]))
    except hvd.RankError as e:
        assert "the all-to-all has 2 ranks but the controller spans 1" in str(e), e
    else:
        raise AssertionError("a controller of another size was accepted")
x = torch.randn(3 * N, 4)
assert hvd.alltoall(x, compression=hvd.Compression.lossy(0.02)).shape == x.shape
print(f"rank {R}: adaptive process set OK", flush=True)
hvd.remove_process_set(ps)
