"""Compressed allgather and broadcast, on the protocol of hvd_lossy.protocol.

allgather: each rank sends one header plus one frame in a single Horovod allgather, then the
status round (2 collectives). broadcast: the receivers must size their buffer before the
payload arrives, so all ranks first allgather their headers (which also settles every argument
check), then the root's frame is broadcast, then the status round (3 collectives).

Every rank returns the decoded tensor, the root of a broadcast and a rank's own slice of an
allgather included, so that all ranks hold exactly the same values afterwards.
"""
import time

import torch
from horovod.torch import mpi_ops as _ops

import hvd_lossy
from hvd_lossy import stats as _stats
from hvd_lossy.compression import NoneCompressor, is_lossy
from hvd_lossy.protocol import (GRANK, HEADER_BYTES, HEADER_FIELDS, LOSSLESS, PAYLOAD, ROWS, Handle,
                                RankError, _LocalError, agree_or_raise, base_name, check_headers,
                                check_lossy_tensor, compression_name, decode, header, header_bytes,
                                like_of, parse_header, raise_verdict)


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


def _plain(op, tensor, compression, launch):
    """A Horovod collective on compression.compress(tensor); for Compression.none exactly
    Horovod's own, except that a non-contiguous input is made contiguous first."""
    record = _stats.CallStats(op=op, compression=compression_name(compression))
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

    return Handle(handle, finish, is_plain_horovod=compression is NoneCompressor)


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


def _device(tensor):
    return tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")


def _finish(op, base, failure, process_set, record, receive):
    """Decode with `receive()`, then the status round; returns the output on every rank or
    raises on every rank."""
    t0 = time.perf_counter()
    output, local = None, failure
    try:
        output = receive()
    except _LocalError as e:
        local = failure or e
    except Exception as e:  # never skip the status round: peers would wait in it
        local = failure or _LocalError(13, detail=f"{type(e).__name__}: {e}")
    record.decompress_s = time.perf_counter() - t0
    agree_or_raise(op, local, base + ".status", process_set, record)
    record.recv_raw_bytes = output.numel() * output.element_size()
    _stats.record(record)
    return output


def _split_gathered(recv, size):
    """Headers and frame bytes of each rank in an allgather result (header, frames, header...)."""
    headers, bodies, offset = [], [], 0
    for src in range(size):
        h = parse_header(recv[offset:], src)
        body = recv[offset + HEADER_BYTES:offset + HEADER_BYTES + h[PAYLOAD]]
        if body.numel() != h[PAYLOAD]:
            raise _LocalError(10, h[GRANK], detail=f"header announces {h[PAYLOAD]} bytes, {body.numel()} left")
        headers.append(h)
        bodies.append((h[ROWS], body))
        offset += HEADER_BYTES + h[PAYLOAD]
    if offset != recv.numel():
        raise _LocalError(10, -1, detail=f"{recv.numel() - offset} bytes after the last rank's frames")
    verdict = check_headers(headers)
    if verdict is not None:
        raise verdict
    return decode(bodies, like_of(headers[0]), [h[GRANK] for h in headers])


def allgather_start(tensor, name, compression, process_set):
    """Starts an allgather; the Handle's wait() gives the concatenation along dim 0."""
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return _plain("allgather", tensor, compression, lambda payload: _ops.allgather_async(
            payload, name=name, process_set=process_set))
    base = base_name("allgather", name, process_set)
    record = _stats.CallStats(op="allgather", compression=repr(compressor))
    failure, parts = None, []
    try:
        check_lossy_tensor(tensor)
        parts = [_compress(tensor, compressor, record)]
    except _LocalError as e:
        failure = e
    rows = 0 if failure else tensor.shape[0]
    head = header_bytes(header(tensor, failure, rows, record.wire_bytes), _device(tensor))
    record.meta_bytes = HEADER_BYTES
    t0 = time.perf_counter()
    handle = _ops.allgather_async(torch.cat([head] + parts), name=base + ".data", process_set=process_set)
    record.comm_s = time.perf_counter() - t0

    def finish(hvd_handle):
        t1 = time.perf_counter()
        recv = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t1
        record.recv_wire_bytes = recv.numel() - HEADER_BYTES * process_set.size()
        return _finish("allgather", base, failure, process_set, record,
                       lambda: _split_gathered(recv, process_set.size()))

    return Handle(handle, finish)


def broadcast_start(tensor, root_rank, name, compression, process_set):
    """Starts a broadcast from global rank root_rank; the Handle's wait() gives the tensor."""
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return _plain("broadcast", tensor, compression, lambda payload: _ops.broadcast_async(
            payload, root_rank, name=name, process_set=process_set))
    base = base_name("broadcast", name, process_set)
    record = _stats.CallStats(op="broadcast", compression=repr(compressor))
    failure, frame = None, None
    is_root = _ops.rank() == root_rank
    try:
        check_lossy_tensor(tensor, min_ndim=0)
        if is_root:
            frame = _compress(tensor, compressor, record)
    except _LocalError as e:
        failure = e
    n_rows = tensor.shape[0] if isinstance(tensor, torch.Tensor) and tensor.dim() else 1
    t0 = time.perf_counter()
    fields = torch.tensor([header(tensor, failure, n_rows, record.wire_bytes)], dtype=torch.int64)
    headers = _ops.synchronize(_ops.allgather_async(fields, name=base + ".meta", process_set=process_set)).tolist()
    record.comm_s += time.perf_counter() - t0
    record.meta_bytes = 8 * HEADER_FIELDS
    raise_verdict("broadcast", headers, failure, compare_rows=True)
    granks = [h[GRANK] for h in headers]
    if root_rank not in granks:
        raise RankError(f"hvd_lossy broadcast failed on every rank: root_rank {root_rank} is not in "
                        f"the process set (global ranks {granks})", [])
    nbytes = headers[granks.index(root_rank)][PAYLOAD]
    payload = frame if is_root else torch.empty(nbytes, dtype=torch.uint8, device=tensor.device)
    t1 = time.perf_counter()
    handle = _ops.broadcast_async(payload, root_rank, name=base + ".data", process_set=process_set)
    record.comm_s += time.perf_counter() - t1

    def receive(recv):
        try:
            output = hvd_lossy.decompress(recv)
        except Exception as e:
            raise _LocalError(10, root_rank, detail=f"{type(e).__name__}: {e}") from e
        if output.dtype != tensor.dtype or output.shape != tensor.shape:
            raise _LocalError(11, root_rank, detail=f"frame holds {output.dtype} {tuple(output.shape)}, "
                                                    f"expected {tensor.dtype} {tuple(tensor.shape)}")
        return output

    def finish(hvd_handle):
        t2 = time.perf_counter()
        recv = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t2
        record.recv_wire_bytes = recv.numel()
        return _finish("broadcast", base, None, process_set, record, lambda: receive(recv))

    return Handle(handle, finish)
