"""hvd_lossy for torch.distributed users: `all_to_all_single` with `compression=`.

    import hvd_lossy.distributed as dist      # instead of: import torch.distributed as dist
    dist.init_process_group("gloo")
    work = dist.all_to_all_single(output, input, out_splits, in_splits, async_op=True,
                                  compression=dist.Compression.lossy(0.03))
    work.wait()

Everything torch.distributed offers is here unchanged, except all_to_all_single, which takes
`compression=` (the compressors of hvd_lossy.torch): Compression.none is exactly
torch.distributed's call, Compression.fp16 casts around it, a lossy compressor sends frames
through the same exchange as hvd_lossy.torch (hvd_lossy.alltoall over hvd_lossy.backend's
TorchBackend), so the frames are the same bytes whichever library carried them. Lossy calls
raise RankError on every rank of the group when any rank gets bad arguments or a bad frame.

Data flow of a lossy call (every step on every rank, in this order):

    input (1-D elements, or [rows, ...])  --view-->  rows for the codec ([rows, row_len] with
      row_len; the splits divided by row_len)  --plan (compressor)-->  frames per destination
      --arrange (row_len only: each chunk [rows, tables x row_len] becomes table-major,
      one copy)-->  pack + one uint8 all_to_all_single (after the byte counts)  -->  headers:
      verdict alike on every rank  -->  decode into `output` (the autograd form's: on the
      codec's output cache; row_len: into a table-major buffer, then one copy back into the
      interleaved chunks of `output`).
"""
import weakref as _weakref

import torch as _torch
import torch.distributed as _dist

globals().update({_k: _v for _k, _v in vars(_dist).items() if not _k.startswith("__")})

from hvd_lossy import auto as _auto  # noqa: E402  (after the copy: these names override it)
from hvd_lossy import grad_ids as _grad_ids  # noqa: E402
from hvd_lossy import stats as _stats  # noqa: E402
from hvd_lossy._layout import SingleAlltoall as _SingleAlltoall  # noqa: E402
from hvd_lossy._layout import interleave_into as _interleave_into  # noqa: E402
from hvd_lossy._layout import table_major as _table_major  # noqa: E402
from hvd_lossy.alltoall import Alltoall as _Alltoall  # noqa: E402
from hvd_lossy.backend import TorchBackend as _TorchBackend  # noqa: E402
from hvd_lossy.collective import new_output as _new_output  # noqa: E402
from hvd_lossy.compression import (Compression, FP16Compressor, LossyCompressor,  # noqa: E402,F401
                                   NoneCompressor, is_lossy)
from hvd_lossy.protocol import RankError  # noqa: E402,F401
from hvd_lossy.stats import reset_comm_stats  # noqa: E402,F401

_backends = _weakref.WeakKeyDictionary()  # group -> TorchBackend (rank and size read once)


def _backend(group):
    key = _dist.group.WORLD if group is None else group
    b = _backends.get(key)
    if b is None:
        b = _backends[key] = _TorchBackend(key)
    return b


class Work:
    """A started all_to_all_single: wait() blocks until `output` holds the result (True, as
    torch's Work.wait()) and raises RankError, on every rank, if a lossy call failed."""

    def __init__(self, wait, is_completed, record=None):
        self._wait, self._is_completed, self._done = wait, is_completed, False
        self.record = record  # a lossy call's statistics (protocol.Handle.record)

    def wait(self, timeout=None):
        if not self._done:
            self._done = True
            self._wait()
        return True

    def is_completed(self):
        return self._done or bool(self._is_completed())


def _started(handle):
    return Work(handle.wait, handle.poll, handle.record)


def _plain(output, input, output_split_sizes, input_split_sizes, group, async_op, backend,
           compression):
    """torch.distributed's own call (Compression.none, returned as is), or around an fp16 cast."""
    record = _stats.CallStats(op="alltoall", compression=(
        "Compression.none" if compression is NoneCompressor else "Compression.fp16"))
    sent, kept = _remote_bytes(input, input_split_sizes, backend)
    record.raw_bytes, record.local_bytes = sent, kept
    record.recv_raw_bytes = output.numel() * output.element_size()
    if compression is NoneCompressor:
        record.wire_bytes, record.recv_wire_bytes = sent, record.recv_raw_bytes
        _stats.record(record)
        return _dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                       group=group, async_op=async_op)
    payload, ctx = compression.compress(input)
    record.wire_bytes = sent * payload.element_size() // max(input.element_size(), 1)
    into = _torch.empty(output.shape, dtype=payload.dtype, device=output.device)
    record.recv_wire_bytes = into.numel() * into.element_size()
    _stats.record(record)
    work = _dist.all_to_all_single(into, payload.contiguous(), output_split_sizes,
                                   input_split_sizes, group=group, async_op=True)

    def finish():
        work.wait()
        output.copy_(compression.decompress(into, ctx))
    started = Work(finish, work.is_completed)
    if async_op:
        return started
    started.wait()
    return None


def _remote_bytes(input, splits, backend):
    from hvd_lossy.collective import remote_bytes
    return remote_bytes(input, splits, backend)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False, compression=Compression.none, ids=None, recv_ids=None):
    """As torch.distributed.all_to_all_single, plus `compression`.

    Splits `input` along dim 0 by `input_split_sizes` (None: evenly), sends piece d to rank d
    of `group`, and fills `output` in place with the pieces received, in rank order
    (`output_split_sizes` of them; None: evenly).

    Arguments:
        output, input: tensors of one dtype and trailing shape; split sizes count dim-0 rows
            (elements of a 1-D tensor, as the reference DLRM code flattens its lookups).
        compression: Compression.none (exactly torch.distributed's call), Compression.fp16, or
            a LossyCompressor (Compression.lossy(error_bound, ...), Compression.adaptive(...),
            auto=True). With `row_len=dim` a 1-D input's chunks are read as
            `[rows, tables x dim]`: each table's rows are their own frame (own bound, own dedup);
            the tables of each chunk come from the compressor's `tables`/`segments`, those of
            each received chunk from its frames.
        async_op: True returns a Work whose wait() completes the call.
        ids: None, or int64 keys (embedding ids) of the rows, for a lossy compressor's dedup
            (as hvd_lossy.torch.alltoall's): shape (rows,) for a [rows, dim] input; with
            `row_len` one key per row and table, shape [rows, tables] (tables: the same in
            every chunk; else 1-D, one key per row_len elements, in the input's order). The
            frames are the same bytes with or without them (at a bound > 0); wrong ids cost
            speed, never the bound. Compression.none/fp16 do not use them.
        recv_ids: with a `reuse=True` compressor and `ids`: the keys of the rows received, in
            the output's layout (shape (rows,); with `row_len`, [rows, tables], the same
            tables from every rank), so that rows this rank holds travel as references or
            residuals (hvd_lossy.reuse_exchange; also a list of one tensor a source, as
            hvd_lossy.torch.alltoall takes).

    Returns:
        None, or with async_op=True a Work with wait() and is_completed(). A lossy call never
        raises when it starts: bad arguments on any rank travel in the frame headers and raise
        RankError in wait() (or here, synchronously), on every rank. A receiving rank whose
        frames disagree with its `output_split_sizes` raises at once; its peers raise with
        their next lossy call on the group.
    """
    return _start(output, input, output_split_sizes, input_split_sizes, group, async_op,
                  compression, ids=ids, recv_ids=recv_ids)


def _start(output, input, output_split_sizes, input_split_sizes, group, async_op, compression,
           tables=None, calls=None, ids=None, recv_ids=None):
    """all_to_all_single; `tables` gives a row_len layout's tables per destination (the autograd
    form's gradient), `calls` collects the lossy call objects started, `ids` as there."""
    compression = NoneCompressor if compression is None else compression
    backend = _backend(group)
    if not is_lossy(compression):
        if compression not in (NoneCompressor, FP16Compressor):
            raise TypeError(f"compression must be Compression.none, Compression.fp16 or a "
                            f"LossyCompressor, got {compression!r}")
        return _plain(output, input, output_split_sizes, input_split_sizes, group, async_op,
                      backend, compression)

    def lossy():
        call = _SingleAlltoall(output, input, output_split_sizes, input_split_sizes, compression,
                               backend, tables, ids, recv_ids)
        if calls is not None:
            calls.append(call)
        return _started(call.start())
    if compression.auto:
        handle = _auto.start(input, input_split_sizes, backend, compression, lossy, lambda: _plain(
            output, input, output_split_sizes, input_split_sizes, group, True, backend,
            NoneCompressor))
    else:
        handle = lossy()
    if async_op:
        return handle
    handle.wait()
    return None


def for_backward(compression):
    """The compressor that the gradient of an all-to-all compressed by `compression` travels
    with (its `backward` setting), for a custom autograd Function's backward."""
    if not is_lossy(compression):
        return compression
    return _auto.pair(compression, compression.for_backward())


def _output_like(input, output_split_sizes, compression, shape=None):
    """The output of the autograd form (or its gradient, of `shape`). Lossy: on the codec's
    output cache, as hvd_lossy.torch's outputs are, so decoding into it pays no page faults
    once the cache holds a block of its size; otherwise torch's own allocation, as a plain
    torch.distributed script makes it."""
    if shape is None:
        rows = (input.shape[0] if output_split_sizes is None
                else sum(int(s) for s in output_split_sizes))
        shape = (rows, *input.shape[1:])
    if is_lossy(compression):
        return _new_output(tuple(shape), input.dtype, input.device)
    return input.new_empty(shape)


class _AllToAll(_torch.autograd.Function):
    """Completes a started all_to_all_single; the gradient returns by one with the splits
    reversed, compressed by the forward compressor's for_backward(); a reusing call's gradient
    travels summed by id (hvd_lossy.grad_ids), as hvd_lossy.torch's alltoall's does."""

    @staticmethod
    def forward(ctx, input, started, output, calls, splits, group, compression):
        started.wait()
        ctx.splits, ctx.group, ctx.input_shape = splits, group, input.shape
        ctx.backward_compression = for_backward(compression)
        ctx.tables = calls[0].recv_tables if calls else None  # what each sender's chunk held
        # a reusing call, for its gradient to travel summed by id (backward reads its ids)
        reusing = bool(calls) and calls[0].reusing is not None
        ctx.call = calls[0] if reusing and getattr(ctx.backward_compression,
                                                   "sums_gradients_by_id", False) else None
        return output

    @staticmethod
    def backward(ctx, grad_output):
        output_split_sizes, input_split_sizes = ctx.splits
        grad_output = grad_output.contiguous()
        grad = _summed_by_id(ctx, grad_output)
        if grad is None:
            grad = _output_like(grad_output, None, ctx.backward_compression, ctx.input_shape)
            _start(grad, grad_output, input_split_sizes, output_split_sizes,
                   ctx.group, False, ctx.backward_compression, tables=ctx.tables)
        return grad, None, None, None, None, None, None


def _summed_by_id(ctx, grad_output):
    """The gradient of a reusing call's input with the gradients summed by id on the wire, or
    None for the per-lookup path (no reusing call, or a plan that does not cut the chunks as
    the forward's segments). The sums travel as rows in the frames' order: with row_len, each
    chunk's tables one after the other, as the forward's frames held them."""
    call = ctx.call
    if call is None:
        return None
    compressor, backend = ctx.backward_compression, _backend(ctx.group)
    grad = _grad_ids.backward(
        call.reusing.call_ids(), _frame_rows(grad_output, call.row_len, call.expect,
                                             call.recv_tables),
        compressor, lambda tensor, splits, plan: _Alltoall(
            tensor, splits, None, compressor, backend, plan=plan).start())
    if grad is None:
        return None
    if call.row_len is not None:
        grad = _interleaved(grad, call.rows_to, call.send_tables)
    return grad.reshape(ctx.input_shape)


def _frame_rows(t, row_len, rows, tables):
    """`[rows, row_len]` of `t` in the frames' order: each chunk's tables one after the other, as
    the forward's frames held them (t itself without row_len)."""
    if row_len is None:
        return t
    chunks = _table_major(t.reshape(-1, row_len), rows, tables)
    return _torch.cat([c.reshape(-1, row_len) for c in chunks]) if chunks else \
        t.reshape(0, row_len)


def _interleaved(rows_t, rows, tables):
    """_frame_rows undone: the chunks of `rows_t` with their tables side by side again, flat."""
    out = _torch.empty_like(rows_t)
    _interleave_into(out, rows_t, rows, tables)
    return out.reshape(-1)


class _DifferentiableWork(Work):
    def __init__(self, finish, is_completed):
        super().__init__(None, is_completed)
        self._finish, self._output = finish, None

    def wait(self, timeout=None):
        """Returns the output, part of the input's autograd graph."""
        if not self._done:
            self._done = True
            self._output = self._finish()
        return self._output


def all_to_all_single_autograd(input, output_split_sizes=None, input_split_sizes=None, group=None,
                               async_op=False, compression=Compression.none, ids=None,
                               recv_ids=None):
    """all_to_all_single as part of the autograd graph: returns a new output whose gradient
    travels back by an all_to_all_single with the splits reversed, compressed by the
    compressor's `backward` setting (for_backward()). The gradient of a row_len layout keeps
    each rank's tables (learnt from the frames the forward received). With a reusing compressor,
    `ids` and `recv_ids` (as for all_to_all_single) let the forward reuse rows and the gradient
    travel summed by (table, id), one row an id within one bound (hvd_lossy.grad_ids); the
    gradient of the input then holds each id's sum on its first row, zeros on its repeats.

    Returns:
        the output tensor; with async_op=True a Work whose wait() returns it.
    """
    output = _output_like(input, output_split_sizes, compression)
    calls = []
    started = _start(output, input.detach(), output_split_sizes, input_split_sizes, group, True,
                     compression, calls=calls, ids=ids, recv_ids=recv_ids)
    splits = (None if output_split_sizes is None else list(output_split_sizes),
              None if input_split_sizes is None else list(input_split_sizes))

    def finish():
        return _AllToAll.apply(input, started, output, calls, splits, group, compression)
    work = _DifferentiableWork(finish, started.is_completed)
    return work if async_op else work.wait()


def destroy_process_group(group=None):
    """As torch.distributed.destroy_process_group, after waiting for what hvd_lossy still has
    under way on the group (auto=True's agreements, read a few calls after they start)."""
    for g in [g for g in list(_backends.keys()) if group is None or g is group]:
        _auto.settle(_backends.pop(g).key)
    return _dist.destroy_process_group(group)


def comm_stats():
    """Statistics of this rank's all_to_all_single calls since reset_comm_stats() (see
    hvd_lossy.stats.comm_stats), plus "auto" as in hvd_lossy.torch.comm_stats()."""
    stats = _stats.comm_stats()
    stats["auto"] = _auto.report()
    return stats
