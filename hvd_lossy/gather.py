"""Compressed allgather and broadcast: the same rank-agreement protocol as hvd_lossy.alltoall
(metadata allgather, payload collective, status allgather), with one frame per rank.

Every rank returns the decoded tensor, the root of a broadcast and a rank's own slice of an
allgather included, so that all ranks hold exactly the same values afterwards.
"""
import time

import torch
from horovod.torch import mpi_ops as _ops

import hvd_lossy
from hvd_lossy import stats as _stats
from hvd_lossy.alltoall import (_GRANK, HEAD, LOSSLESS, Handle, RankError, _LocalError, allgather_rows,
                                base_name, check_agreement, check_lossy_tensor, decode_sources,
                                finish_with_status, meta_row, raise_on_errors)
from hvd_lossy.compression import NoneCompressor, is_lossy

def _compress(tensor, compressor, record):
    """One frame of the whole tensor, or the _LocalError that stops it."""
    t0 = time.perf_counter()
    try:
        frame, _ = compressor.compress(tensor.detach())
    except Exception as e:
        raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
    finally:
        record.compress_s += time.perf_counter() - t0
    record.raw_bytes = tensor.numel() * tensor.element_size()
    record.wire_bytes = frame.numel()
    record.error_bounds = [float(compressor.error_bound)] if hasattr(compressor, "error_bound") else []
    return frame


def _exchange_meta(op, tensor, error, fields, name, process_set, record, compare_rows=False):
    t0 = time.perf_counter()
    row = meta_row(tensor, error, fields)
    rows = allgather_rows(row, name, process_set)
    record.comm_s += time.perf_counter() - t0
    record.meta_bytes += 8 * len(row)
    raise_on_errors(op, rows, error)
    check_agreement(op, rows, compare_rows=compare_rows)
    return rows


def _plain(op, tensor, compression, launch):
    """A Horovod collective on compression.compress(tensor); for Compression.none exactly
    Horovod's own, except that a non-contiguous input is made contiguous first."""
    record = _stats.CallStats(op=op, compression=getattr(compression, "__name__", repr(compression)))
    payload, ctx = compression.compress(tensor)
    payload = payload.contiguous()
    t0 = time.perf_counter()
    handle = launch(payload)
    record.comm_s = time.perf_counter() - t0
    record.raw_bytes = tensor.numel() * tensor.element_size()
    record.wire_bytes = payload.numel() * payload.element_size()

    def finish(hvd_handle):
        t1 = time.perf_counter()
        output = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t1
        record.recv_wire_bytes = output.numel() * output.element_size()
        output = compression.decompress(output, ctx)
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output

    result = Handle(handle, finish)
    result.is_plain_horovod = compression is NoneCompressor
    return result


def _lossy_compressor(tensor, compression):
    """The frame compressor to use, or None for Horovod's own path. bfloat16, which Horovod's
    allgather and broadcast reject, travels as lossless frames when no compression is asked."""
    if compression is None:
        compression = NoneCompressor
    if is_lossy(compression):
        return compression
    if compression is NoneCompressor and getattr(tensor, "dtype", None) == torch.bfloat16:
        return LOSSLESS
    return None


def allgather_start(tensor, name, compression, process_set):
    """Starts an allgather; the Handle's wait() gives the concatenation along dim 0."""
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return _plain("allgather", tensor, compression, lambda payload: _ops.allgather_async(
            payload, name=name, process_set=process_set))
    base = base_name("allgather", name)
    record = _stats.CallStats(op="allgather", compression=repr(compressor))
    error, frame, n_rows = None, None, 0
    try:
        check_lossy_tensor(tensor)
        n_rows = tensor.shape[0]
        frame = _compress(tensor, compressor, record)
    except _LocalError as e:
        error = e
    rows = _exchange_meta("allgather", tensor, error, [n_rows, record.wire_bytes],
                          base + ".meta", process_set, record)
    rows_from, bytes_from = rows[:, HEAD].tolist(), rows[:, HEAD + 1].tolist()
    granks = rows[:, _GRANK].tolist()
    like = (tensor.dtype, tuple(tensor.shape[1:]))
    t0 = time.perf_counter()
    handle = _ops.allgather_async(frame, name=base + ".data", process_set=process_set)
    record.comm_s += time.perf_counter() - t0

    def finish(hvd_handle):
        t1 = time.perf_counter()
        recv = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t1
        t2 = time.perf_counter()
        output, failure = None, None
        try:
            output = decode_sources(recv, bytes_from, rows_from, like, granks)
        except _LocalError as e:
            failure = e
        record.decompress_s = time.perf_counter() - t2
        finish_with_status("allgather", failure, base + ".status", process_set, record)
        record.recv_wire_bytes = recv.numel()
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output

    return Handle(handle, finish)


def broadcast_start(tensor, root_rank, name, compression, process_set):
    """Starts a broadcast from global rank root_rank; the Handle's wait() gives the tensor."""
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return _plain("broadcast", tensor, compression, lambda payload: _ops.broadcast_async(
            payload, root_rank, name=name, process_set=process_set))
    base = base_name("broadcast", name)
    record = _stats.CallStats(op="broadcast", compression=repr(compressor))
    error, frame = None, None
    is_root = _ops.rank() == root_rank
    try:
        check_lossy_tensor(tensor, min_ndim=0)
        if is_root:
            frame = _compress(tensor, compressor, record)
    except _LocalError as e:
        error = e
    n_rows = tensor.shape[0] if isinstance(tensor, torch.Tensor) and tensor.dim() else 1
    rows = _exchange_meta("broadcast", tensor, error, [n_rows, record.wire_bytes],
                          base + ".meta", process_set, record, compare_rows=True)
    granks = rows[:, _GRANK].tolist()
    if root_rank not in granks:
        raise RankError(f"hvd_lossy broadcast: root_rank {root_rank} is not in the process set "
                        f"(global ranks {granks})", granks)
    nbytes = int(rows[granks.index(root_rank), HEAD + 1])
    payload = frame if is_root else torch.empty(nbytes, dtype=torch.uint8, device=tensor.device)
    t0 = time.perf_counter()
    handle = _ops.broadcast_async(payload, root_rank, name=base + ".data", process_set=process_set)
    record.comm_s += time.perf_counter() - t0

    def finish(hvd_handle):
        t1 = time.perf_counter()
        recv = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t1
        t2 = time.perf_counter()
        output, failure = None, None
        try:
            output = hvd_lossy.decompress(recv)
        except Exception as e:
            failure = _LocalError(10, root_rank, detail=f"{type(e).__name__}: {e}")
        if output is not None and (output.dtype != tensor.dtype or output.shape != tensor.shape):
            failure = _LocalError(11, root_rank, detail=f"frame holds {output.dtype} "
                                  f"{tuple(output.shape)}, expected {tensor.dtype} {tuple(tensor.shape)}")
        record.decompress_s = time.perf_counter() - t2
        finish_with_status("broadcast", failure, base + ".status", process_set, record)
        record.recv_wire_bytes = recv.numel()
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output

    return Handle(handle, finish)
