"""The collectives hvd_lossy's exchange runs on: Horovod or a torch.distributed process group.

The exchange (hvd_lossy.collective's plan -> pack -> launch -> headers -> verdict -> decode)
needs only this from a collective library, so one code path serves both:

    exchange (alltoall.py, gather.py, auto.py)        backend (this module)
      pack: uint8 send buffer + byte splits  ------->  alltoall_async(payload, splits, name)
                                                         -> Work; wait() = (recv, recv_splits)
      one frame per rank                     ------->  allgather_async(tensor, name)
                                                         -> Work; wait() = concatenation (dim 0)
      root's frame                           ------->  broadcast_async(tensor, root, name)
                                                         -> Work; wait() = root's tensor
      rank(), size() (in the group), global_rank()/global_size() (headers, dither seeds),
      key (per-group state)

A Work has poll() (True once wait() will not block on communication) and wait().

Horovod's alltoall and allgather size their output themselves. torch.distributed's need the
receive sizes up front, so TorchBackend exchanges them first in one small blocking collective
(Horovod does the same round inside its alltoall, AlltoallGetRecvSplits); the data collective
after it is asynchronous.
"""
import os
import weakref

import torch

# Open MPI's MCA setting, read from the environment when MPI starts (in Horovod's init).
YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"


def yield_when_idle(environ=os.environ):
    """Lets Open MPI yield the core while it waits, unless the launch chose (`mpirun --mca
    mpi_yield_when_idle N` sets the variable) or HVD_LOSSY_MPI_YIELD=0 says to keep Open MPI's
    own default. Returns the value MPI will start with (None: its default).

    Open MPI busy-polls unless it sees more ranks than cores; but every Horovod rank also runs
    Horovod's background thread, which polls inside MPI while the rank's own thread computes, so
    with as many ranks as cores the two share a core, and the polling took 27% of a rank's CPU
    samples in a profile of a whole DLRM example run (Horovod issue 2804 is the same effect).
    Yielding measured every mode 1.2-1.7x faster a step on a 2-core machine, plain Horovod
    1.22-1.57x (benchmarks/RESULTS.md, "MPI's polling"): the setting is Horovod's gain, not the
    codec's, and plain Horovod gets it from the same variable. MPI implementations other than
    Open MPI ignore it."""
    if environ.get("HVD_LOSSY_MPI_YIELD", "1") != "0":
        environ.setdefault(YIELD_VARIABLE, "1")
    return environ.get(YIELD_VARIABLE)


class Work:
    """A started collective: wait() returns `result()` once `done()` (the library's wait)
    returned; poll() asks `ready()`."""

    def __init__(self, done, ready, result, handle=None):
        self._done, self._ready, self._result = done, ready, result
        self.handle = handle  # the library's own handle (Horovod's integer), where one exists
        self._finished = False

    def poll(self):
        return self._finished or bool(self._ready())

    def wait(self):
        if not self._finished:
            self._done()
            self._finished = True
        return self._result()


class HorovodBackend:
    """A Horovod process set (horovod.torch must be initialised)."""
    name = "horovod"

    def __init__(self, process_set):
        from horovod.torch import mpi_ops
        self._ops, self.process_set = mpi_ops, process_set
        self.key = process_set.process_set_id

    def rank(self):
        return self.process_set.rank()

    def size(self):
        return self.process_set.size()

    def global_rank(self):
        return self._ops.rank()

    def global_size(self):
        return self._ops.size()

    def _work(self, handle):
        box = []
        return Work(lambda: box.append(self._ops.synchronize(handle)),
                    lambda: self._ops.poll(handle), lambda: box[0], handle=handle)

    def alltoall_async(self, payload, splits, name):
        """splits: dim-0 rows per destination (list or int tensor), None for even; wait()
        gives (output, received splits as Horovod's int tensor)."""
        return self._work(self._ops.alltoall_async(payload, splits=splits, name=name,
                                                   process_set=self.process_set))

    def allgather_async(self, tensor, name, same_shape=False):
        return self._work(self._ops.allgather_async(tensor, name=name,
                                                    process_set=self.process_set))

    def broadcast_async(self, tensor, root_rank, name):
        return self._work(self._ops.broadcast_async(tensor, root_rank, name=name,
                                                    process_set=self.process_set))


class TorchBackend:
    """A torch.distributed process group (None: the default group). Gloo on the CPU; NCCL
    (its counts travel on the payload's device) or MPI where this torch has them."""
    name = "torch"

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("hvd_lossy.distributed needs torch.distributed.init_process_group() "
                               "first (torch.distributed is not initialised)")
        self._dist = dist
        group = dist.group.WORLD if group is None else group
        self._rank, self._size = dist.get_rank(group), dist.get_world_size(group)
        if self._rank < 0:
            raise ValueError(f"this rank (global {dist.get_rank()}) is not in the process group "
                             f"{group!r}")
        self._global = dist.get_rank()
        # Held weakly and named by its name: state kept per group (call numbers, auto slots)
        # must not keep a group alive past destroy_process_group, or its threads outlive the
        # interpreter and abort the process at exit.
        self._group = weakref.ref(group)
        self.key = ("torch", group.group_name)
        self._counts_on_device = dist.get_backend(group) == "nccl"

    @property
    def group(self):
        group = self._group()
        if group is None:
            raise RuntimeError(f"process group {self.key[1]!r} was destroyed")
        return group

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def global_rank(self):
        return self._global

    def global_size(self):
        return self._dist.get_world_size()

    def _counts(self, values, device):
        where = device if self._counts_on_device else torch.device("cpu")
        return torch.tensor(values, dtype=torch.int64, device=where)

    def _work(self, work, result):
        return Work(work.wait, work.is_completed, result, handle=work)

    def alltoall_async(self, payload, splits, name=None):
        """splits: dim-0 rows per destination (list or int tensor), None for even; wait()
        gives (output, received splits as an int32 tensor)."""
        d = self._dist
        if splits is None:
            send = [payload.shape[0] // self._size] * self._size
        else:
            send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        recv_counts = self._counts([0] * self._size, payload.device)
        d.all_to_all_single(recv_counts, self._counts(send, payload.device), group=self.group)
        recv = recv_counts.tolist()
        out = torch.empty((sum(recv), *payload.shape[1:]), dtype=payload.dtype,
                          device=payload.device)
        work = d.all_to_all_single(out, payload, recv, send, group=self.group, async_op=True)
        return self._work(work, lambda: (out, torch.tensor(recv, dtype=torch.int32)))

    def allgather_async(self, tensor, name=None, same_shape=False):
        """The concatenation along dim 0 of every rank's tensor. same_shape=True promises that
        every rank's tensor has this one's shape, which saves the size round."""
        d = self._dist
        tensor = tensor.contiguous()
        if same_shape:
            rows = [tensor.shape[0]] * self._size
        else:
            counts = self._counts([0] * self._size, tensor.device)
            d.all_gather_into_tensor(counts, self._counts([tensor.shape[0]], tensor.device),
                                     group=self.group)
            rows = counts.tolist()
        widest = max(rows)
        if tensor.shape[0] < widest:  # torch's allgather moves equal shapes: pad to the widest
            padded = tensor.new_empty((widest, *tensor.shape[1:]))
            padded[:tensor.shape[0]].copy_(tensor)
            tensor = padded
        out = tensor.new_empty((widest * self._size, *tensor.shape[1:]))
        work = d.all_gather_into_tensor(out, tensor, group=self.group, async_op=True)

        def result():
            if rows == [widest] * self._size:
                return out
            return torch.cat([out[r * widest:r * widest + n] for r, n in enumerate(rows)])
        return self._work(work, result)

    def broadcast_async(self, tensor, root_rank, name=None):
        """root_rank: a global rank, as in torch.distributed.broadcast's src."""
        work = self._dist.broadcast(tensor, src=root_rank, group=self.group, async_op=True)
        return self._work(work, lambda: tensor)


def as_backend(group):
    """A backend as is; a Horovod ProcessSet becomes its HorovodBackend, None Horovod's global
    process set."""
    if isinstance(group, (HorovodBackend, TorchBackend)):
        return group
    if group is None:
        from horovod.torch import mpi_ops
        group = mpi_ops.global_process_set
    return HorovodBackend(group)
