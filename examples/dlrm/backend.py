"""The collective library the example runs on: Horovod (mpirun) or torch.distributed (torchrun).

`hvd` stands for horovod.torch in train.py and comm.py; `use("torch")` (before hvd.init())
makes it a small torch.distributed stand-in with the calls the example makes, and `lossy()`
the matching compressed all-to-all (hvd_lossy.torch, or hvd_lossy.distributed wrapped to
hvd_lossy.torch's signatures). The model, data and compressors are the same on both.
"""
import torch
import torch.distributed


class _Proxy:
    def __init__(self):
        self._impl = None

    def __getattr__(self, name):
        if self._impl is None:
            use("horovod")
        return getattr(self._impl, name)


hvd = _Proxy()
_lossy = _Proxy()
NAMES = ("horovod", "torch")


def use(name):
    """Selects the backend: "horovod" or "torch"."""
    if name == "horovod":
        import horovod.torch
        import hvd_lossy.torch
        hvd._impl, _lossy._impl = horovod.torch, hvd_lossy.torch
    elif name == "torch":
        hvd._impl, _lossy._impl = _TorchHvd(), _TorchLossy()
    else:
        raise ValueError(f"backend must be one of {NAMES}, got {name!r}")


def finish():
    """Ends the run. torch.distributed: the group is destroyed and the process leaves at once,
    because with torch 2.13 a gloo thread can still be releasing a finished work's tensors when
    the interpreter finalises, and std::terminate then aborts the process after the run
    succeeded (seen with plain torch.distributed code too, without hvd_lossy)."""
    if isinstance(hvd._impl, _TorchHvd):
        import os
        import sys
        _lossy.dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def lossy():
    """hvd_lossy.torch, or its torch.distributed counterpart."""
    return _lossy


class _TorchHvd:
    """The horovod.torch calls the example makes, on torch.distributed's default group (gloo)."""
    Sum = "sum"

    def __init__(self):
        import torch.distributed as dist
        self.dist = dist

    def init(self):
        if not self.dist.is_initialized():
            self.dist.init_process_group("gloo")

    def rank(self):
        return self.dist.get_rank()

    def size(self):
        return self.dist.get_world_size()

    def broadcast_parameters(self, state, root_rank):
        for value in state.values():
            self.dist.broadcast(value, src=root_rank)

    def DistributedOptimizer(self, optimizer, named_parameters=None, op=Sum):  # noqa: N802
        return _SummingOptimizer(optimizer, self.dist)

    def allreduce(self, tensor, op=Sum, name=None):
        out = tensor.clone()
        self.dist.all_reduce(out)
        return out

    def allgather(self, tensor, name=None):
        from hvd_lossy.backend import TorchBackend
        return TorchBackend().allgather_async(tensor, name).wait()  # dim 0 may differ by rank

    def alltoall(self, tensor, splits, name=None):
        """torch.distributed.all_to_all_single itself (Compression.none), with autograd."""
        return _TorchLossy().alltoall(tensor, splits)

    def allgather_object(self, obj, name=None):
        out = [None] * self.size()
        self.dist.all_gather_object(out, obj)
        return out


class _SummingOptimizer:
    """horovod's DistributedOptimizer(op=Sum): gradients summed over ranks before step(), in
    one all_reduce of them all, as Horovod fuses them (one collective a tensor costs a round
    trip each, ten of them a step for this model)."""

    def __init__(self, optimizer, dist):
        self.optimizer, self.dist = optimizer, dist

    def zero_grad(self):
        self.optimizer.zero_grad()

    # --save / --resume: the state is the wrapped optimizer's (the sums keep none), as with
    # Horovod's DistributedOptimizer
    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)

    def step(self):
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.dist.all_reduce(flat)
            at = 0
            for g in grads:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
        self.optimizer.step()


class _TorchLossy:
    """hvd_lossy.torch's alltoall signatures on hvd_lossy.distributed.all_to_all_single."""

    def __init__(self):
        import hvd_lossy.distributed as dist
        self.dist, self.Compression = dist, dist.Compression
        self.comm_stats, self.reset_comm_stats = dist.comm_stats, dist.reset_comm_stats

    def _received(self, splits):
        # torch.distributed wants the receive sizes up front: ask the senders (what a
        # torch.distributed script knows from its sharding).
        send = torch.as_tensor([int(s) for s in splits], dtype=torch.int64)
        recv = torch.empty_like(send)
        torch.distributed.all_to_all_single(recv, send)  # not the exchange: not in its statistics
        return recv.tolist()

    def alltoall(self, tensor, splits, name=None, compression=None):
        recv = self._received(splits)
        out = self.dist.all_to_all_single_autograd(
            tensor, recv, [int(s) for s in splits],
            compression=self.Compression.none if compression is None else compression)
        return out, torch.tensor(recv, dtype=torch.int32)

    def alltoall_async(self, tensor, splits, name=None, compression=None, differentiable=True):
        recv = self._received(splits)
        work = self.dist.all_to_all_single_autograd(
            tensor, recv, [int(s) for s in splits], async_op=True,
            compression=self.Compression.none if compression is None else compression)
        return work, recv

    def synchronize(self, handle):
        work, recv = handle
        return work.wait(), torch.tensor(recv, dtype=torch.int32)
