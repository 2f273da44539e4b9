"""Collectives for the controller: mpi4py when it shares Horovod's world, else Horovod's own;
torch.distributed's default group when Horovod is not initialised and torch.distributed is.

The controller needs two collectives, both blocking and called by every rank in the same order:
``allgather_array`` (fixed-shape float64/int64 numpy arrays, the statistics) and
``allgather_object`` (small picklable objects, the configuration check). Under ``mpirun`` mpi4py's
COMM_WORLD is Horovod's world. Under ``horovodrun --gloo`` each process is its own MPI world of size
1, so the controller falls back to Horovod's collectives and says so once.
"""

import pickle
import sys
import time
import warnings

import numpy as np

__all__ = ["resolve_comm", "LocalComm", "MPIComm", "HorovodComm", "TorchComm"]


class LocalComm:
    """One process, no communication."""

    name = "local"
    rank = 0
    size = 1

    def allgather_array(self, array):
        return np.asarray(array)[None].copy()

    def allgather_object(self, obj):
        return [obj]


# Longest nap between two polls of a pending exchange: at most this much latency added to a
# collective that takes a round trip and the ranks' skew anyway.
MAX_POLL_SLEEP = 1e-3


def wait_yielding(request, sleep=time.sleep):
    """Waits for an mpi4py request by polling it, sleeping between polls (20 us, doubling up to
    MAX_POLL_SLEEP). A blocking MPI call busy-polls its core while the other ranks catch up;
    on a machine without spare cores that spin took the core from Horovod's background thread
    and from training: with the 40-step DLRM example over an emulated 1 Gbit/s link, the
    adaptive recipe's steps took 50-55 ms with a blocking Allgather and 44-46 ms with this
    wait (benchmarks/RESULTS.md, "adaptive's statistics exchange")."""
    nap = 20e-6
    while not request.Test():
        sleep(nap)
        nap = min(2 * nap, MAX_POLL_SLEEP)


class MPIComm:
    """An mpi4py communicator."""

    name = "mpi"

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def allgather_array(self, array):
        array = np.ascontiguousarray(array)
        out = np.empty((self.size,) + array.shape, dtype=array.dtype)
        wait_yielding(self.comm.Iallgather(array, out))
        return out

    def allgather_object(self, obj):
        return self.comm.allgather(obj)


class HorovodComm:
    """Horovod's collectives (horovod.torch must be initialised), over the world or over one
    process set, whose ranks are then the ranks within the set."""

    name = "horovod"

    def __init__(self, process_set=None):
        import horovod.torch as hvd

        self.hvd = hvd
        self.process_set = hvd.global_process_set if process_set is None else process_set
        self.rank = self.process_set.rank()
        self.size = self.process_set.size()
        self._count = 0

    def _name(self):
        # Every rank of the set issues the same collectives in the same order, so the names
        # match up; the set's id keeps two sets' controllers apart.
        self._count += 1
        return f"hvd_lossy.adaptive.{self.process_set.process_set_id}.{self._count}"

    def allgather_array(self, array):
        import torch

        array = np.ascontiguousarray(array)
        flat = torch.from_numpy(array.reshape(1, -1).copy())
        out = self.hvd.allgather(flat, name=self._name(), process_set=self.process_set).numpy()
        return out.reshape((self.size,) + array.shape)

    def allgather_object(self, obj):
        # Horovod 0.28's allgather_object has no process_set: the pickles travel as bytes,
        # their sizes first.
        import torch

        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.allgather_array(np.array([data.numel()], dtype=np.int64))[:, 0]
        blob = self.hvd.allgather(data, name=self._name(), process_set=self.process_set).numpy()
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(blob[offsets[i]:offsets[i + 1]].tobytes()) for i in range(self.size)]


class TorchComm:
    """A torch.distributed process group (None: the default group), e.g. under torchrun: no
    mpi4py or Horovod needed."""

    name = "torch"

    def __init__(self, group=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def allgather_array(self, array):
        import torch

        array = np.ascontiguousarray(array)
        mine = torch.from_numpy(array.reshape(-1).copy())
        out = torch.empty(self.size * mine.numel(), dtype=mine.dtype)
        self.dist.all_gather_into_tensor(out, mine, group=self.group)
        return out.numpy().reshape((self.size,) + array.shape)

    def allgather_object(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out


def _torch_world():
    """True when torch.distributed is initialised (and so may carry the statistics)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


_warned_fallback = False


def _horovod_world():
    """(rank, size) of an initialised horovod.torch, else None."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        if not hvd.is_initialized():
            return None
    except (AttributeError, ValueError):
        return None
    return hvd.rank(), hvd.size()


def resolve_comm(comm=None, process_set=None):
    """The controller's communicator.

    Arguments:
        comm: None (automatic), ``"mpi"`` (mpi4py COMM_WORLD), ``"horovod"``, ``"torch"``
            (torch.distributed's default group), ``"local"`` (one process), an mpi4py
            communicator, a ``TorchComm(group)``, or an object with ``rank``, ``size``,
            ``allgather_array`` and ``allgather_object``.
        process_set: a Horovod ProcessSet: the controller talks over that set only (Horovod's
            collectives), and its ranks are the ranks within the set, as in the all-to-alls
            of ``alltoall(..., process_set=)``. Not together with ``comm``.

    Returns:
        An object with ``rank``, ``size``, ``name``, ``allgather_array``, ``allgather_object``.

    Automatic: without an initialised Horovod, torch.distributed's default group if it is
    initialised, else mpi4py's COMM_WORLD (one process without mpi4py).
    With Horovod, mpi4py's COMM_WORLD if it holds the same ranks in the same order, else Horovod's
    collectives, with a one-time warning.
    """
    if process_set is not None:
        if comm is not None:
            raise ValueError(f"give comm or process_set, not both (got comm={comm!r})")
        if not all(hasattr(process_set, a) for a in ("rank", "size", "process_set_id")):
            raise TypeError(f"process_set must be a horovod ProcessSet, got "
                            f"{type(process_set).__name__}")
        return HorovodComm(process_set)
    if comm is None:
        return _auto_comm()
    if isinstance(comm, str):
        if comm == "local":
            return LocalComm()
        if comm == "horovod":
            return HorovodComm()
        if comm == "torch":
            return TorchComm()
        if comm == "mpi":
            from mpi4py import MPI

            return MPIComm(MPI.COMM_WORLD)
        raise ValueError(f"comm must be 'mpi', 'horovod', 'torch', 'local', None or a communicator, "
                         f"got {comm!r}")
    if hasattr(comm, "Allgather") and hasattr(comm, "Get_size"):
        return MPIComm(comm)
    if all(hasattr(comm, a) for a in ("rank", "size", "allgather_array", "allgather_object")):
        return comm
    raise TypeError(f"comm must be 'mpi', 'horovod', 'local', None, an mpi4py communicator or an "
                    f"object with allgather_array/allgather_object, got {type(comm).__name__}")


def _auto_comm():
    global _warned_fallback
    hvd_world = _horovod_world()
    if hvd_world is None and _torch_world():
        return TorchComm()
    try:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
    except ImportError:
        world = None
    if hvd_world is None:
        return MPIComm(world) if world is not None else LocalComm()
    hvd_rank, hvd_size = hvd_world
    if world is not None and world.Get_size() == hvd_size:
        # Same size on every rank, so every rank takes this branch and the check is collective.
        if world.allgather(hvd_rank) == list(range(hvd_size)):
            return MPIComm(world)
    if hvd_size == 1:
        return LocalComm()
    if not _warned_fallback:
        _warned_fallback = True
        size = "unavailable" if world is None else f"size {world.Get_size()}"
        warnings.warn(f"hvd_lossy.adaptive: mpi4py's COMM_WORLD ({size}) is not Horovod's world "
                      f"of {hvd_size} ranks (horovodrun --gloo?); exchanging table statistics "
                      f"with Horovod's collectives instead", RuntimeWarning, stacklevel=3)
    return HorovodComm()
