"""Compressed all-to-all over Horovod (the protocol pieces live in hvd_lossy.protocol).

One lossy alltoall takes two Horovod collectives, and every rank runs both, so an error
anywhere raises everywhere and no rank is left waiting in a collective its peers skipped:

  1. locally: check the arguments, ask the compressor for a plan (frames per destination) and
     compress all pieces in ONE hvd_lossy.compress_chunks call. A failure does not raise here;
     it is written into the header below and the rank sends headers only.
  2. one uint8 Horovod alltoall. Each destination's chunk is a fixed header (status, dtype,
     shape, rows, payload bytes) followed by its self-delimiting frames; Horovod exchanges the
     byte splits itself. Every rank now sees every rank's header, so all reach the same verdict
     on bad arguments and on disagreeing dtypes or shapes.
  3. locally: decode each source's frames and check them against its header.
  4. allgather a 5-int status row (code, a, b, origin rank, dtype); if any rank failed in steps 1-3,
     all raise the same RankError.
Nothing blocks before step 2 is launched, so alltoall_async overlaps communication fully.
"""
import time

import torch
from horovod.torch import mpi_ops as _ops

import hvd_lossy
from hvd_lossy import stats as _stats
from hvd_lossy.compression import Compression, NoneCompressor, is_lossy
from hvd_lossy.protocol import (GRANK, HEADER_BYTES, LOSSLESS, PAYLOAD, ROWS, Handle, _LocalError,
                                agree_or_raise, base_name, check_headers, check_lossy_tensor,
                                compression_name, decode, header, header_bytes, like_of, parse_header)

_INT32_MAX = 2 ** 31 - 1  # Horovod's alltoall splits are int32 byte counts here


def split_list(splits, rows, size):
    """Rows for each destination as a list of Python ints, checked."""
    if splits is None:
        if rows % size:
            raise _LocalError(4, rows, size)
        return [rows // size] * size
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point:
            raise _LocalError(9, detail=f"splits must be a 1-D integer tensor, got {splits.dtype} "
                                        f"of shape {tuple(splits.shape)}")
        values = splits.tolist()
    else:
        values = list(splits)
    if any(not hasattr(v, "__index__") for v in values):
        raise _LocalError(9, detail=f"splits must be integers, got {values!r}")
    values = [int(v) for v in values]
    if len(values) != size:
        raise _LocalError(1, len(values), size)
    for dest, v in enumerate(values):
        if v < 0:
            raise _LocalError(2, dest, v)
    if sum(values) != rows:
        raise _LocalError(3, sum(values), rows)
    return values


def _check_plan(plan, rows_to):
    per_dest, last = [0] * len(rows_to), 0
    for dest, rows, _eb in plan:
        if not last <= dest < len(rows_to) or rows < 0:
            raise _LocalError(9, detail=f"compressor plan {plan!r} is not in destination order "
                                        f"for splits {rows_to}")
        per_dest[dest] += rows
        last = dest
    if per_dest != rows_to:
        raise _LocalError(9, detail=f"compressor plan rows per destination {per_dest} differ "
                                    f"from splits {rows_to}")


def compress_for_destinations(tensor, splits, compressor, size, rank=0):
    """Step 1: (rows per destination, frame buffer, frame bytes per destination, bounds)."""
    check_lossy_tensor(tensor)
    rows_to = split_list(splits, tensor.shape[0], size)
    plan = compressor.plan(rows_to)
    _check_plan(plan, rows_to)
    try:
        buffer, frame_sizes = hvd_lossy.compress_chunks(
            tensor.detach(), [p[1] for p in plan], [p[2] for p in plan],
            mode=compressor.mode, level=compressor.level, dedup=compressor.dedup,
            dither=compressor.next_dither_seed(rank))
    except Exception as e:
        raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
    compressor.after_compress(plan, frame_sizes, tensor)
    byte_counts = [0] * size
    for (dest, _rows, _eb), nbytes in zip(plan, frame_sizes):
        byte_counts[dest] += nbytes
    for dest, nbytes in enumerate(byte_counts):
        if nbytes + HEADER_BYTES > _INT32_MAX:
            raise _LocalError(8, nbytes, dest)
    return rows_to, buffer, byte_counts, [float(p[2]) for p in plan]


def _lossy_start(tensor, splits, name, compressor, process_set):
    size = process_set.size()
    base = base_name("alltoall", name, process_set)
    record = _stats.CallStats(op="alltoall", compression=repr(compressor))
    t0 = time.perf_counter()
    failure, rows_to, buffer, byte_counts = None, [0] * size, None, [0] * size
    try:
        rows_to, buffer, byte_counts, record.error_bounds = compress_for_destinations(
            tensor, splits, compressor, size, process_set.rank())
    except _LocalError as e:
        failure = e
    except Exception as e:  # e.g. a compressor subclass's plan() raising: still tell the peers
        failure = _LocalError(9, detail=f"{type(e).__name__}: {e}")
    device = tensor.device if isinstance(tensor, torch.Tensor) else "cpu"
    parts, offset = [], 0
    for dest in range(size):
        nbytes = 0 if failure else byte_counts[dest]
        parts.append(header_bytes(header(tensor, failure, rows_to[dest], nbytes), device))
        if nbytes:
            parts.append(buffer[offset:offset + nbytes])
        offset += nbytes
    payload = torch.cat(parts)
    send_splits = torch.tensor([HEADER_BYTES + (0 if failure else n) for n in byte_counts],
                               dtype=torch.int32)
    record.compress_s = time.perf_counter() - t0
    if not failure:
        record.raw_bytes = tensor.numel() * tensor.element_size()
        record.wire_bytes = buffer.numel()
    record.meta_bytes = HEADER_BYTES * size
    t1 = time.perf_counter()
    handle = _ops.alltoall_async(payload, splits=send_splits, name=base + ".data", process_set=process_set)
    record.comm_s = time.perf_counter() - t1
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def finish(hvd_handle):
        t2 = time.perf_counter()
        recv, recv_splits = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t2
        t3 = time.perf_counter()
        output, received, local = None, None, failure
        try:
            output, received = _receive(recv, recv_splits.tolist())
        except _LocalError as e:
            local = failure or e  # a rank that failed itself reports its own failure
        except Exception as e:  # never skip the status round: peers would wait in it
            local = failure or _LocalError(13, detail=f"{type(e).__name__}: {e}")
        record.decompress_s = time.perf_counter() - t3
        agree_or_raise("alltoall", local, base + ".status", process_set, record)
        record.recv_wire_bytes = recv.numel() - HEADER_BYTES * size
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output, torch.tensor(received, dtype=split_dtype)

    return Handle(handle, finish)


def _receive(recv, recv_splits):
    """Steps 2-3 on the receiving side: headers, verdict, decoded output, rows per source."""
    chunks, offset = [], 0
    for n in recv_splits:
        chunks.append(recv[offset:offset + n])
        offset += n
    headers = [parse_header(c, src) for src, c in enumerate(chunks)]
    for src, (h, c) in enumerate(zip(headers, chunks)):
        if h[PAYLOAD] != c.numel() - HEADER_BYTES:
            raise _LocalError(10, h[GRANK], detail=f"header announces {h[PAYLOAD]} bytes, "
                                                   f"{c.numel() - HEADER_BYTES} arrived")
    verdict = check_headers(headers)
    if verdict is not None:
        raise verdict
    bodies = [(h[ROWS], c[HEADER_BYTES:]) for h, c in zip(headers, chunks)]
    output = decode(bodies, like_of(headers[0]), [h[GRANK] for h in headers])
    return output, [h[ROWS] for h in headers]


def _plain_start(tensor, splits, name, compression, process_set):
    """Horovod's own alltoall on compression.compress(tensor); for Compression.none this is
    exactly horovod.torch.alltoall_async (a non-contiguous input is made contiguous first)."""
    record = _stats.CallStats(op="alltoall", compression=compression_name(compression))
    t0 = time.perf_counter()
    payload, ctx = compression.compress(tensor)
    payload = payload.contiguous()
    record.compress_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    handle = _ops.alltoall_async(payload, splits=splits, name=name, process_set=process_set)
    record.comm_s = time.perf_counter() - t1
    record.raw_bytes = tensor.numel() * tensor.element_size()
    record.wire_bytes = payload.numel() * payload.element_size()

    def finish(hvd_handle):
        t2 = time.perf_counter()
        output, received_splits = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t2
        record.recv_wire_bytes = output.numel() * output.element_size()
        t3 = time.perf_counter()
        output = compression.decompress(output, ctx)
        record.decompress_s = time.perf_counter() - t3
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output, received_splits

    return Handle(handle, finish, is_plain_horovod=compression is NoneCompressor)


def start(tensor, splits=None, name=None, compression=Compression.none,
          process_set=_ops.global_process_set):
    """Starts an alltoall with any compressor; returns a Handle whose wait() gives
    (output, received_splits)."""
    if compression is None:
        compression = NoneCompressor
    if is_lossy(compression):
        return _lossy_start(tensor, splits, name, compression, process_set)
    if compression is NoneCompressor and getattr(tensor, "dtype", None) == torch.bfloat16:
        return _lossy_start(tensor, splits, name, LOSSLESS, process_set)
    return _plain_start(tensor, splits, name, compression, process_set)
