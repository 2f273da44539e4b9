"""The collective library the example runs on: Horovod (mpirun), torch.distributed (torchrun)
or none (one process).

`hvd` stands for horovod.torch in train.py and comm.py; `use("torch")` (before hvd.init())
makes it a small torch.distributed stand-in with the calls the example makes, and `lossy()`
the matching compressed all-to-all (hvd_lossy.torch, or hvd_lossy.distributed wrapped to
hvd_lossy.torch's signatures). The model, data and compressors are the same on all of them.

`use("local")` is one rank and no collective library at all (no Horovod, no MPI, no process
group): what a machine with one GPU and no launcher can run. Its all-to-all hands the rank its
own chunk, as Horovod and hvd_lossy do for the chunk a rank sends itself (never coded), so the
compressor is built but codes nothing.

With `--device cuda` the tensors the collectives carry live on the rank's GPU: Horovod's
alltoall moves device frames (NCCL where Horovod has it), torch.distributed runs on NCCL.
"""
import os

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
_chosen = None  # the name use() selected
NAMES = ("horovod", "torch", "local")
# What launchers set for the rank's index on its node, in the order they are trusted.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "SLURM_LOCALID", "HOROVOD_LOCAL_RANK")


def use(name, device="cpu"):
    """Selects the backend: "horovod", "torch" or "local". device ("cpu" or "cuda") picks
    torch.distributed's library: gloo on the CPU, NCCL on GPUs."""
    global _chosen
    if name not in NAMES:
        raise ValueError(f"backend must be one of {NAMES}, got {name!r}")
    _chosen = name
    if name == "horovod":
        import horovod.torch
        import hvd_lossy.torch
        hvd._impl, _lossy._impl = horovod.torch, hvd_lossy.torch
    elif name == "torch":
        hvd._impl, _lossy._impl = _TorchHvd("nccl" if device == "cuda" else "gloo"), _TorchLossy()
    else:
        hvd._impl, _lossy._impl = _LocalHvd(), _LocalLossy()


def init():
    """hvd.init() of the selected backend; on Horovod through hvd_lossy.torch.init(), whatever
    all-to-all the run uses (--plain-horovod too), so that every mode starts MPI alike (it lets
    Open MPI yield the core while it polls: hvd_lossy.backend.yield_when_idle)."""
    if hvd._impl is None:
        use("horovod")
    (_lossy if _chosen == "horovod" else hvd).init()


def local_rank():
    """This rank's index on its node: the backend's own answer (Horovod's local_rank()), else
    the launcher's environment (torchrun, mpirun, srun), else 0 (one process)."""
    impl = hvd._impl
    if impl is not None and hasattr(impl, "local_rank"):
        return impl.local_rank()
    for name in LOCAL_RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


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

    def __init__(self, library="gloo"):
        import torch.distributed as dist
        self.dist, self.library = dist, library

    def init(self):
        if not self.dist.is_initialized():
            self.dist.init_process_group(self.library)

    def _on_wire(self, tensor):
        """NCCL carries device tensors only: a host tensor (the run's byte totals) goes to this
        rank's GPU and its result comes back."""
        if self.library == "nccl" and not tensor.is_cuda:
            return tensor.cuda()
        return tensor

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
        out = self._on_wire(tensor).clone()
        self.dist.all_reduce(out)
        return out.to(tensor.device)

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
        if torch.distributed.get_backend() == "nccl":  # NCCL moves device tensors only
            send = send.cuda()
        recv = torch.empty_like(send)
        torch.distributed.all_to_all_single(recv, send)  # not the exchange: not in its statistics
        return recv.tolist()

    def alltoall(self, tensor, splits, name=None, compression=None, ids=None, recv_ids=None):
        recv = self._received(splits)
        out = self.dist.all_to_all_single_autograd(
            tensor, recv, [int(s) for s in splits],
            compression=self.Compression.none if compression is None else compression, ids=ids,
            recv_ids=recv_ids)
        return out, torch.tensor(recv, dtype=torch.int32)

    def alltoall_async(self, tensor, splits, name=None, compression=None, differentiable=True,
                       ids=None, recv_ids=None):
        recv = self._received(splits)
        work = self.dist.all_to_all_single_autograd(
            tensor, recv, [int(s) for s in splits], async_op=True,
            compression=self.Compression.none if compression is None else compression, ids=ids,
            recv_ids=recv_ids)
        return work, recv

    def synchronize(self, handle):
        work, recv = handle
        return work.wait(), torch.tensor(recv, dtype=torch.int32)


class _LocalHvd:
    """The horovod.torch calls the example makes, for one rank and no collective library: every
    collective of one rank is its input (a copy, as Horovod returns a new tensor)."""
    Sum = "sum"

    def init(self):
        pass

    def rank(self):
        return 0

    def size(self):
        return 1

    def local_rank(self):
        return 0

    def broadcast_parameters(self, state, root_rank):
        pass

    def DistributedOptimizer(self, optimizer, named_parameters=None, op=Sum):  # noqa: N802
        return optimizer

    def allreduce(self, tensor, op=Sum, name=None):
        return tensor.clone()

    def allgather(self, tensor, name=None):
        return tensor.clone()

    def alltoall(self, tensor, splits, name=None):
        return _LocalLossy().alltoall(tensor, splits)

    def allgather_object(self, obj, name=None):
        return [obj]


class _LocalLossy:
    """hvd_lossy.torch's alltoall signatures for one rank: the one chunk is the rank's own, which
    hvd_lossy copies and never codes, so `compression` changes nothing here."""

    def __init__(self):
        from hvd_lossy import stats
        from hvd_lossy.compression import Compression
        self.Compression = Compression
        self.reset_comm_stats = stats.reset_comm_stats

    def comm_stats(self):
        from hvd_lossy import auto, stats
        out = stats.comm_stats()
        out["auto"] = auto.report()
        return out

    def alltoall(self, tensor, splits, name=None, compression=None, ids=None, recv_ids=None):
        rows = [int(s) for s in splits]
        if rows != [tensor.shape[0]]:
            raise ValueError("one rank sends all %d rows to itself, got splits %s"
                             % (tensor.shape[0], rows))
        return tensor.clone(), torch.tensor(rows, dtype=torch.int32)

    def alltoall_async(self, tensor, splits, name=None, compression=None, differentiable=True,
                       ids=None, recv_ids=None):
        return self.alltoall(tensor, splits)

    def synchronize(self, handle):
        return handle
