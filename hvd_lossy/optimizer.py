"""DistributedOptimizer with the dense gradients coded within a bound (hvd_lossy.torch's).

Horovod's DistributedOptimizer allreduces each parameter's gradient as soon as backward has it,
and step() waits for them. Compressed bytes cannot be summed, so here a step's gradients go as
one allgather instead (hvd_lossy.gather): each rank's frame holds every parameter's gradient as
a segment of its own bound, coded and launched once backward has every parameter's gradient
(_Step). One collective a step: one a parameter, from each hook as Horovod does, added 4.2-7.5
ms a step to the DLRM user script's dense part against 1.1-2.9 (benchmarks/RESULTS.md). Every
rank decodes every rank's frame, its own included, and adds them in rank order: the same bits on
every rank, so the replicas stay identical, and each rank's term within its bound of what that
rank computed (the average within the bound of the true average, a sum within the sum of the
ranks' bounds, up to the float rounding of the sum that Horovod's allreduce has too).

Bytes: with 2 ranks the allgather moves each rank's frame once, as a ring allreduce moves the
tensor once; with n ranks a rank receives n - 1 frames against the ring's 2(n - 1) / n tensors,
so it moves fewer bytes while the ratio stays above n / 2.

Which coding: the compressor's gradient coding, `compression.for_backward()`, the one its
all-to-all sends the embedding gradients with (for Compression.lossy's defaults: relative 0.02
with subtractive dither, each parameter its own range; dither makes a rank's error uniform and
independent of the gradient, so it averages out over ranks and steps). A `backward=` that is
Horovod's (Compression.fp16, or None: uncompressed) gives Horovod's own allreduce with it. With
`auto=True` a step's dense gradients follow the all-to-all: lossy where its compressor's latest
call on the process set ran lossy, Horovod's plain allreduce where it ran plain (the mode is
agreed, the same on every rank), and their cost counts in that call's.
"""
import time

import horovod.torch as _hvd
import torch
from horovod.torch.compression import Compression as _HorovodCompression
from horovod.torch.optimizer import _DistributedOptimizer

from hvd_lossy import auto as _auto
from hvd_lossy import gather as _gather
from hvd_lossy.backend import as_backend
from hvd_lossy.compressor import NoneCompressor, is_lossy


def _allgather_grad_async(self, p):
    """The optimizer's _allreduce_grad_async: with a frame compressor this step, (a function
    giving p's reduced gradient, None); the step's gradients travel together (_Step)."""
    coding, report = _coding_now(self)
    if coding is None:
        t0 = time.perf_counter()
        handle, ctx = _DistributedOptimizer._allreduce_grad_async(self, p)
        if report is None:
            return handle, ctx
        return _timed(lambda: _hvd.synchronize(handle), t0, report), ctx
    if p.grad is None:  # not computed here, but other ranks may have: send zeros, as Horovod
        p.grad = p.data.new(p.size()).zero_()
    if p.grad.is_sparse:
        raise ValueError(f"parameter {self._parameter_names.get(p)!r} has a sparse gradient: "
                         f"a lossy compressor codes dense gradients only")
    if self._step is None:
        self._step = _Step(self, coding, report)
    return self._step.add(p), None


class _Step:
    """One step's coded gradients: each parameter's a segment (its own bound) of one flat
    tensor, one frame a rank in one allgather. One collective a step rather than one a
    parameter: each cost about 0.3 ms of Python and protocol, more than the coding of most
    parameters. It is launched from the hook of the last parameter to get its gradient, as
    Horovod launches each allreduce from its parameter's hook, so that it travels while the rest
    of backward runs (in a DLRM, the embeddings' gradient all-to-all); or, where some parameter
    got none this step, when synchronize() asks for the first result (Horovod adds those first)."""

    def __init__(self, opt, coding, report):
        self.opt, self.coding, self.report = opt, coding, report
        self.params, self.sums = [], None
        self.handle = None
        self.launch_seconds = 0.0

    def add(self, p):
        self.params.append(p)
        if len(self.params) == len(self.opt._requires_update):
            self._launch()
        return lambda: self.result(p)

    def result(self, p):
        if self.sums is None:
            self.opt._step = None  # the next step's hooks start another
            if self.handle is None:
                self._launch()
            t0 = time.perf_counter()
            self.sums, record = self._reduce()
            if self.report is not None:
                self.report(self.launch_seconds + time.perf_counter() - t0, record)
        return self.sums[p]

    def _launch(self):
        """Codes every parameter's gradient and starts the allgather."""
        t0 = time.perf_counter()
        opt = self.opt
        names = opt._parameter_names
        self.params.sort(key=lambda q: names[q])  # one order on every rank
        flat = torch.cat([q.grad.reshape(-1) for q in self.params])
        if opt.op == _hvd.Average and opt.gradient_predivide_factor != 1.0:
            flat = flat / opt.gradient_predivide_factor
        self.handle = _gather.allgather_start(flat, "dense." + names[self.params[0]],
                                              self.coding, opt.process_set,
                                              [q.numel() for q in self.params])
        self.launch_seconds = time.perf_counter() - t0

    def _reduce(self):
        """({parameter: its reduced gradient}, the allgather's record for auto's cost)."""
        opt = self.opt
        size = opt.process_set.size()
        decoded = self.handle.wait().view(size, -1)
        total = decoded[0].clone()
        for rank_rows in decoded[1:]:  # in rank order: the same sums on every rank
            total.add_(rank_rows)
        if opt.op == _hvd.Average:
            total.mul_(opt.gradient_predivide_factor / size)
        sums, at = {}, 0
        for q in self.params:
            sums[q] = total[at:at + q.numel()].view(q.grad.shape)
            at += q.numel()
        return sums, getattr(self.handle, "record", None)


def _coding_now(self):
    """(the frame compressor for this step's gradients, or None for Horovod's allreduce; and
    with auto, the function this step's cost goes to, else None). With auto the gradients take
    the mode of the all-to-all's latest call, and their exchange cost (launch and wait) is added
    to that call's, as its gradient all-to-all's is: auto then weighs the dense bytes a mode
    saves too (hvd_lossy.auto)."""
    coding, forward = self._gradient_coding, self._forward_compression
    if not getattr(forward, "auto", False):
        return coding, None
    s = getattr(forward, "_auto_slots", {}).get(as_backend(self.process_set).key)
    if s is None:  # no all-to-all yet on this process set: nothing to follow or report to
        return coding, None
    k = s.calls - 1
    return (None if s.last_mode == _auto.PLAIN else coding), \
        lambda seconds, record: s.add_cost(k, seconds, record)


def _timed(finish, t0, report):
    """`finish` reporting the call's cost when it runs: from t0 to now, plus its own time."""
    launched = time.perf_counter() - t0

    def timed():
        t1 = time.perf_counter()
        out = finish()
        report(launched + time.perf_counter() - t1, None)
        return out

    return timed


def distributed(optimizer, named_parameters, compression, backward_passes_per_step, op,
                gradient_predivide_factor, groups, sparse_as_dense, process_set):
    """hvd_lossy.torch.DistributedOptimizer for a lossy `compression` (the other arguments are
    Horovod's)."""
    coding = compression.for_backward()
    if not is_lossy(coding):  # Horovod's cast or nothing: Horovod's optimizer as it is
        plain = _HorovodCompression.none if coding is NoneCompressor else coding
        return _hvd.DistributedOptimizer(
            optimizer, named_parameters, plain, backward_passes_per_step, op,
            gradient_predivide_factor, groups=groups, sparse_as_dense=sparse_as_dense,
            process_set=process_set)
    if op not in (_hvd.Average, _hvd.Sum):
        raise ValueError(f"a lossy compressor reduces dense gradients with op=Average or op=Sum, "
                         f"got op={op!r}")
    if groups:
        raise ValueError(f"groups={groups!r} is not supported with a lossy compressor: each "
                         f"parameter travels as one frame a rank")
    if backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be > 0, got {backward_passes_per_step}")
    # Horovod's optimizer made on the user's class, as Horovod makes it, but for the allreduce
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__, _allreduce_grad_async=_allgather_grad_async))
    opt = cls(optimizer.param_groups, named_parameters, _HorovodCompression.none,
              backward_passes_per_step, op, gradient_predivide_factor, None, sparse_as_dense,
              process_set)
    opt._gradient_coding = coding
    opt._forward_compression = compression
    opt._step = None
    return opt
