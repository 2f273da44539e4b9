"""Drop-in for horovod.torch with error-bounded compression of the non-reducing collectives.

    import hvd_lossy.torch as hvd
    hvd.init()
    out, got = hvd.alltoall(lookups, splits, compression=hvd.Compression.lossy(0.03))

Everything horovod.torch offers is here unchanged, except:
  - alltoall, allgather, broadcast (and their _async forms) take `compression=` (after
    `name`, as Horovod's allreduce does): Compression.none is exactly Horovod's operation,
    Compression.fp16 casts around it, Compression.lossy(...) sends error-bounded byte frames;
  - bfloat16, which Horovod's alltoall/allgather/broadcast reject, works: with Compression.none
    it travels as lossless frames (bit-identical result);
  - the reductions (allreduce*, grouped_allreduce*, reducescatter*) raise ValueError when given
    a lossy compressor, because compressed bytes cannot be summed; DistributedOptimizer takes
    one and sends a step's dense gradients as one allgather of frames (hvd_lossy.optimizer);
  - synchronize/poll also accept the handles of compressed operations;
  - comm_stats()/reset_comm_stats() report bytes, ratios and time per collective;
  - init() lets Open MPI yield the core while it polls (mpi_yield_when_idle, unless the launch
    set it; HVD_LOSSY_MPI_YIELD=0 keeps Open MPI's own choice): hvd_lossy.backend.yield_when_idle.
Lossy collectives raise RankError (a ValueError) on every rank when any rank gets bad input or
a corrupt frame, instead of leaving the others waiting.
"""
import functools as _functools
import inspect as _inspect

import horovod.torch as _hvd
import torch as _torch
from horovod.torch import mpi_ops as _ops

globals().update({_k: _v for _k, _v in vars(_hvd).items() if not _k.startswith("__")})

from hvd_lossy import alltoall as _a2a  # noqa: E402  (after the copy: these names override it)
from hvd_lossy import gather as _gather  # noqa: E402
from hvd_lossy import grad_ids as _grad_ids  # noqa: E402
from hvd_lossy.backend import as_backend as _as_backend  # noqa: E402
from hvd_lossy.backend import yield_when_idle as _yield_when_idle  # noqa: E402
from hvd_lossy.protocol import Handle as _Handle  # noqa: E402
from hvd_lossy.protocol import RankError  # noqa: E402,F401
from hvd_lossy.compression import Compression, LossyCompressor, NoneCompressor, is_lossy  # noqa: E402,F401
from hvd_lossy import auto as _auto  # noqa: E402
from hvd_lossy import optimizer as _optimizer  # noqa: E402
from hvd_lossy import stats as _stats  # noqa: E402
from hvd_lossy.stats import reset_comm_stats  # noqa: E402,F401
from hvd_lossy import FrameError  # noqa: E402,F401

global_process_set = _ops.global_process_set
ProcessSet = _ops.ProcessSet


def init(*args, **kwargs):
    """horovod.torch.init(), with Open MPI allowed to yield the core while it polls
    (hvd_lossy.backend.yield_when_idle)."""
    _yield_when_idle()
    return _hvd.init(*args, **kwargs)


def _reject_lossy(fn):
    """Wraps a reducing Horovod function so that a lossy compressor is refused up front."""
    signature = _inspect.signature(fn)
    takes_compression = "compression" in signature.parameters

    @_functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if takes_compression:
            compression = signature.bind_partial(*args, **kwargs).arguments.get("compression")
        else:
            compression = kwargs.pop("compression", None)
            if not is_lossy(compression) and compression not in (None, NoneCompressor):
                raise TypeError(f"{fn.__name__}() takes no compression argument, got {compression!r}")
        if is_lossy(compression):
            raise ValueError(
                f"{fn.__name__}() cannot use {compression!r}: it produces byte frames, and "
                "summing compressed bytes is meaningless. Use it with alltoall, allgather or "
                "broadcast; reductions take Compression.none or Compression.fp16.")
        return fn(*args, **kwargs)

    return wrapper


for _name in ("allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
              "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_",
              "sparse_allreduce_async", "reducescatter", "reducescatter_async",
              "grouped_reducescatter", "grouped_reducescatter_async"):
    globals()[_name] = _reject_lossy(getattr(_hvd, _name))


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,  # noqa: N802
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Horovod's DistributedOptimizer; a lossy `compression` codes the dense gradients as its
    all-to-all codes the embedding gradients (`compression.for_backward()`), a step's as one
    frame a rank (a segment a parameter) in one allgather, summed alike on every rank
    (hvd_lossy.optimizer)."""
    if not is_lossy(compression):
        return _hvd.DistributedOptimizer(
            optimizer, named_parameters, compression, backward_passes_per_step, op,
            gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set)
    return _optimizer.distributed(optimizer, named_parameters, compression,
                                  backward_passes_per_step, op, gradient_predivide_factor,
                                  groups if groups is not None else (num_groups or None),
                                  sparse_as_dense, process_set)


def _backward_of(compression):
    if not is_lossy(compression):
        return compression
    return _auto.pair(compression, compression.for_backward())


def _fix_args(compression, process_set):
    # Horovod's fourth positional argument is process_set; accept it there too.
    if isinstance(compression, ProcessSet):
        return Compression.none, compression
    if isinstance(compression, str):
        # A name is the commonest slip (the DLRM example's flags are names); say what to pass.
        raise TypeError(f"compression must be a compressor, got the string {compression!r}: pass "
                        "hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.lossy(0.03) or "
                        "hvd.Compression.adaptive(controller, tables)")
    return (Compression.none if compression is None else compression), process_set


def _detached(tensor):
    # Started outside the autograd Function: keep the compressor's work out of the graph (a
    # non-tensor still goes through, so that start() reports it on every rank).
    return tensor.detach() if isinstance(tensor, _torch.Tensor) else tensor


class _Alltoall(_torch.autograd.Function):
    """Completes a started alltoall; its gradient returns by an alltoall with the splits
    reversed, compressed by the forward compressor's for_backward(). Unlike Horovod's, a
    non-contiguous gradient works."""

    @staticmethod
    def forward(ctx, tensor, started, compression, process_set):
        output, received = started.wait()
        ctx.received, ctx.process_set = received, process_set
        ctx.backward_compression = _backward_of(compression)
        # Taken in backward only (a reusing call's keys and segments, numbered by id): forward
        # calls without one (evaluation) pay nothing for it.
        ctx.call_ids = getattr(started, "call_ids", None) if getattr(
            ctx.backward_compression, "sums_gradients_by_id", False) else None
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _dead_gradient):
        grad_output = grad_output.contiguous()
        grad, ids = None, ctx.call_ids() if ctx.call_ids is not None else None
        if ids is not None:  # a reusing call: the gradients travel summed by id
            grad = _grad_ids.backward(
                ids, grad_output, ctx.backward_compression,
                lambda tensor, splits, plan: _a2a.Alltoall(
                    tensor, splits, None, ctx.backward_compression,
                    _as_backend(ctx.process_set), plan=plan).start())
        if grad is None:
            grad, _ = alltoall(grad_output, splits=ctx.received,
                               compression=ctx.backward_compression, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, compression=Compression.none,
             process_set=global_process_set, ids=None, recv_ids=None):
    """Scatters slices of dim 0 of `tensor` to all ranks and gathers the slices sent here.

    As horovod.torch.alltoall, plus `compression`. With a lossy compressor every rank's slices
    become one frame a destination (hvd_lossy.compress_grouped, straight into the send buffer),
    one uint8 Horovod alltoall moves them (it exchanges their byte counts itself), and the
    received frames are decoded straight into the output.

    Arguments:
        tensor: the tensor to distribute; the ranks must agree on dtype and trailing shape.
        splits: rows of dim 0 for each rank, in rank order (list or int tensor); None splits dim 0
                evenly, which must then divide by the number of ranks.
        name: a name of the operation.
        compression: Compression.none (exactly Horovod's alltoall), Compression.fp16, or a
                     LossyCompressor (Compression.lossy(error_bound, ...)).
        process_set: process set to limit the operation to; default all ranks.
        ids: None, or an int64 tensor of shape (rows,): the key (embedding id) of each row of
             a 2-D `tensor`, meaningful within its segment (table). A lossy compressor then
             finds duplicate rows by their ids instead of hashing every row (not faster on
             the CPU today: RESULTS, "Id dedup against content dedup"; reuse=True needs them);
             the frames are the same bytes (at a bound > 0), and wrong ids cost speed, never the
             bound (each duplicate's bits are checked against its id's first row). Bad ids
             raise RankError on every rank. The gradient all-to-all and Compression.none/fp16 do not use them.
        recv_ids: with a `reuse=True` compressor (and `ids`): a list with one int64 tensor a
             rank, the keys of the rows that rank sends here, in order (the own rank's entry is
             ignored). Rows a rank already holds then travel as references or residuals
             (hvd_lossy.reuse_exchange); recv_ids that are not the ids sent raise RankError
             on every rank, as does any divergence of what the ranks hold, after which every
             rank starts its reuse caches afresh.

    Returns:
        1) the gathered tensor (each element within the frame's absolute bound of what its
           sender had, for a lossy compressor);
        2) if `splits` was given: the rows received from each rank, as a tensor.
    """
    compression, process_set = _fix_args(compression, process_set)
    started = _a2a.start(_detached(tensor), splits, name, compression, process_set, ids,
                         recv_ids)
    output, received = _Alltoall.apply(tensor, started, compression, process_set)
    return output if splits is None else (output, received)


_plain_handles = {}  # Horovod handle -> our Handle, to record statistics on synchronize


def _expose(handle):
    if handle.is_plain_horovod:
        # A handle finished by horovod.torch.synchronize is gone from Horovod's map but not from
        # ours (its statistics are then not recorded): forget those, so entries stay bounded by
        # the operations in flight.
        live = _ops._handle_map
        for stale in [h for h in _plain_handles if h not in live]:
            del _plain_handles[stale]
        _plain_handles[handle._work.handle] = handle
        return handle._work.handle
    return handle


class _DifferentiableHandle(_Handle):
    """An alltoall_async(..., differentiable=True): synchronize() puts the output into the
    input's autograd graph, so the gradient travels back as with alltoall()."""

    def __init__(self, tensor, started, compression, process_set):
        super().__init__(started._work, None)
        self._tensor, self._started = tensor, started
        self._compression, self._process_set = compression, process_set

    def poll(self):
        return self._started.poll()

    def wait(self):
        if not self._done:
            self._done = True
            self._result = _Alltoall.apply(self._tensor, self._started, self._compression,
                                           self._process_set)
        return self._result


def alltoall_async(tensor, splits=None, name=None, compression=Compression.none,
                   process_set=global_process_set, differentiable=False, ids=None,
                   recv_ids=None):
    """Starts alltoall(). As Horovod's alltoall_async, without gradient tracking by default.

    Arguments:
        ids, recv_ids: as for alltoall().
        differentiable: True makes synchronize() return an output that is part of `tensor`'s
            autograd graph: backward sends its gradient back with the splits reversed,
            compressed by the compressor's for_backward(), exactly as alltoall() does. This is
            what overlapping the embedding exchange with other forward work needs.

    Returns:
        a handle for poll() and synchronize(). As with Horovod, synchronize() returns the pair
        (output, received_splits) whether or not `splits` was given. With Compression.none and
        differentiable=False the handle is Horovod's own. A lossy call never raises here: bad
        arguments on any rank travel in the frame headers and raise RankError in
        synchronize(), on every rank.
    """
    compression, process_set = _fix_args(compression, process_set)
    if differentiable:
        started = _a2a.start(_detached(tensor), splits, name, compression, process_set, ids,
                             recv_ids)
        return _DifferentiableHandle(tensor, started, compression, process_set)
    return _expose(_a2a.start(tensor, splits, name, compression, process_set, ids, recv_ids))


class _Allgather(_torch.autograd.Function):
    """Allgather; the gradient is Horovod's (averaged over ranks, uncompressed)."""

    @staticmethod
    def forward(ctx, tensor, name, compression, process_set):
        output = _gather.allgather_start(tensor, name, compression, process_set).wait()
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return output

    @staticmethod
    def backward(ctx, grad_output):
        grad = _ops.allreduce(grad_output.contiguous(), op=_ops.Average, process_set=ctx.process_set)
        dims = _ops.allgather(_torch.tensor([ctx.dim], dtype=_torch.int64), process_set=ctx.process_set)
        offset = int(dims[:ctx.process_set.rank()].sum())
        return grad.narrow(0, offset, ctx.dim), None, None, None


def allgather(tensor, name=None, compression=Compression.none, process_set=global_process_set):
    """Concatenates `tensor` of all ranks along dim 0 (trailing shapes must agree).

    As horovod.torch.allgather, plus `compression` (see alltoall). With a lossy compressor each
    rank sends one frame; every rank, this one included, gets the decoded values.

    Returns:
        the concatenation, dim 0 being the sum of all ranks' dim 0.
    """
    compression, process_set = _fix_args(compression, process_set)
    return _Allgather.apply(tensor, name, compression, process_set)


def allgather_async(tensor, name=None, compression=Compression.none, process_set=global_process_set):
    """Starts allgather(); returns a handle for poll() and synchronize()."""
    compression, process_set = _fix_args(compression, process_set)
    return _expose(_gather.allgather_start(tensor, name, compression, process_set))


class _Broadcast(_torch.autograd.Function):
    """Broadcast; the gradient is Horovod's (averaged, kept on the root only, uncompressed)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, compression, process_set):
        output = _gather.broadcast_start(tensor, root_rank, name, compression, process_set).wait()
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return output

    @staticmethod
    def backward(ctx, grad_output):
        grad = _ops.allreduce(grad_output.contiguous(), op=_ops.Average, process_set=ctx.process_set)
        if _ops.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None, None


def broadcast(tensor, root_rank, name=None, compression=Compression.none,
              process_set=global_process_set):
    """Sends `tensor` of global rank `root_rank` to all ranks (shapes and dtypes must agree).

    As horovod.torch.broadcast, plus `compression`. With a lossy compressor the root returns
    the decoded frame too, so that all ranks hold identical values.
    """
    compression, process_set = _fix_args(compression, process_set)
    return _Broadcast.apply(tensor, root_rank, name, compression, process_set)


def broadcast_async(tensor, root_rank, name=None, compression=Compression.none,
                    process_set=global_process_set):
    """Starts broadcast(); returns a handle for poll() and synchronize()."""
    compression, process_set = _fix_args(compression, process_set)
    return _expose(_gather.broadcast_start(tensor, root_rank, name, compression, process_set))


def comm_stats():
    """Statistics of this rank's collectives since the last reset_comm_stats() (see
    hvd_lossy.stats.comm_stats), plus "auto": one dict per compressor with auto=True and
    process set, saying what it decided ("lossy", "plain" or "probing"), for which message
    size, from which agreed times, and how many calls took each path."""
    stats = _stats.comm_stats()
    stats["auto"] = _auto.report()
    return stats


def synchronize(handle):
    """Waits for an operation started by any *_async function (Horovod's or hvd_lossy's)
    and returns its result; a lossy operation raises RankError on every rank if any failed."""
    if isinstance(handle, _Handle):
        return handle.wait()
    ours = _plain_handles.pop(handle, None)
    return ours.wait() if ours is not None else _ops.synchronize(handle)


def poll(handle):
    """True once synchronize(handle) would not block on communication."""
    if isinstance(handle, _Handle):
        return handle.poll()
    return _ops.poll(handle)
