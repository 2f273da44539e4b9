"""Compressed all-to-all over Horovod, and the rank-agreement protocol shared by every lossy
collective in hvd_lossy.torch.

One lossy alltoall, on every rank (each step runs on every rank, so an error anywhere raises
everywhere and no rank is left waiting in a collective its peers skipped):

  1. check the arguments, ask the compressor for a plan (frames per destination) and compress
     all pieces in ONE hvd_lossy.compress_chunks call; a failure becomes an error code, not an
     exception, at this point;
  2. allgather one int64 metadata row per rank (status, dtype, shape, rows and bytes per
     destination); every rank now raises the same RankError if any rank failed or the ranks
     disagree on dtype or trailing shape;
  3. one uint8 Horovod alltoall with the byte counts as splits;
  4. decode each source's bytes (a source may send several self-delimiting frames) and check
     them against what the source announced in step 2;
  5. allgather a 3-int status row, so that a frame failing its checksum on one rank raises on all.
"""
import itertools
import time

import torch
from horovod.torch import mpi_ops as _ops

import hvd_lossy
from hvd_lossy import stats as _stats
from hvd_lossy.compression import Compression, LossyCompressor, NoneCompressor, is_lossy

# Dtypes by code in the metadata row; -1 = not a tensor or a dtype not listed here.
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.bool)
LOSSY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_NDIM = 8  # HL_MAX_NDIM of the frame format

# Metadata row: these fields, then the trailing dims (MAX_NDIM slots, -1 padded), then the
# fields of the operation (alltoall: rows to each rank, then bytes to each rank).
_STATUS, _A, _B, _GRANK, _DTYPE, _NDIM = range(6)
HEAD = 6 + MAX_NDIM

# Error codes carried in the status field. {a}/{b} come from the failing rank's row, so every
# rank can print the same message; "detail" is the local exception text, known to that rank only.
_ERRORS = {
    1: "got {a} splits for {b} ranks",
    2: "splits[{a}] is negative ({b})",
    3: "splits sum to {a} but the tensor has {b} rows in dim 0",
    4: "splits=None needs dim 0 ({a}) to divide evenly among {b} ranks",
    5: "dtype {dtype} cannot be compressed (expected float32, float16 or bfloat16)",
    6: "the tensor has {a} dims, expected 1 to {b}",
    7: "compression failed",
    8: "{a} bytes for rank {b} exceed Horovod's int32 split limit",
    9: "bad argument",
    10: "the bytes received from rank {a} failed to decode (checksum or format error)",
    11: "the frames received from rank {a} disagree with the dtype, shape or rows it announced",
}
_INT32_MAX = 2 ** 31 - 1


class RankError(ValueError):
    """A collective failed on one or more ranks; raised on every rank of the process set.

    Attributes:
        ranks: the global ranks that reported the problem.
    """

    def __init__(self, message, ranks):
        super().__init__(message)
        self.ranks = list(ranks)


class _LocalError(Exception):
    def __init__(self, code, a=0, b=0, detail=None):
        super().__init__(detail or _ERRORS[code])
        self.code, self.a, self.b, self.detail = code, int(a), int(b), detail


def dtype_code(tensor):
    dtype = getattr(tensor, "dtype", None)
    return _DTYPES.index(dtype) if dtype in _DTYPES else -1


def _dtype_name(code):
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "unknown"


def meta_row(tensor, error, fields):
    """The metadata row of this rank: status, shape description and the op's own fields."""
    code, a, b = (error.code, error.a, error.b) if error else (0, 0, 0)
    is_tensor = isinstance(tensor, torch.Tensor)
    dims = list(tensor.shape[1:]) if is_tensor else []
    dims = (dims + [-1] * MAX_NDIM)[:MAX_NDIM]
    ndim = tensor.dim() if is_tensor else -1
    return [code, a, b, _ops.rank(), dtype_code(tensor), ndim] + dims + [int(f) for f in fields]


def allgather_rows(row, name, process_set):
    """Allgathers one int64 row per rank; returns a (ranks, len(row)) CPU tensor."""
    t = torch.tensor(row, dtype=torch.int64).view(1, -1)
    return _ops.synchronize(_ops.allgather_async(t, name=name, process_set=process_set))


def raise_on_errors(op, rows, error):
    """Raises the same RankError on every rank if any row carries an error code."""
    failed = [r for r in rows.tolist() if r[_STATUS] != 0]
    if not failed:
        return
    parts = []
    for r in failed:
        text = _ERRORS.get(r[_STATUS], "error code {code}").format(
            a=r[_A], b=r[_B], code=r[_STATUS], dtype=_dtype_name(r[_DTYPE]))
        parts.append(f"rank {r[_GRANK]}: {text}")
    message = f"hvd_lossy {op} failed on every rank because of " + "; ".join(parts)
    if error is not None and error.detail:
        message += f" (here, rank {_ops.rank()}: {error.detail})"
    raise RankError(message, [r[_GRANK] for r in failed]) from error


def check_agreement(op, rows, compare_rows=False):
    """Raises RankError on every rank if the ranks disagree on dtype or shape (past dim 0)."""
    rows = rows.tolist()
    checks = [("dtype", lambda r: _dtype_name(r[_DTYPE])), ("number of dims", lambda r: r[_NDIM]),
              ("trailing shape", lambda r: tuple(d for d in r[HEAD - MAX_NDIM:HEAD] if d >= 0))]
    if compare_rows:
        checks.append(("dim 0", lambda r: r[HEAD]))
    for what, key in checks:
        values = [key(r) for r in rows]
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {r[_GRANK]} has {v}" for r, v in zip(rows, values))
            raise RankError(f"hvd_lossy {op}: ranks disagree on the {what}: {listing}",
                            [r[_GRANK] for r in rows])


def decode_sources(recv, bytes_from, rows_from, like, grank_of):
    """Decodes the frames of each source and checks them against what the source announced.

    Arguments:
        recv: 1-D uint8 tensor, the sources' bytes back to back in rank order.
        bytes_from / rows_from: per source, bytes it sent and rows it announced.
        like: (dtype, trailing shape) every frame must have.
        grank_of: global rank of each source, for error messages.
    """
    dtype, trailing = like
    pieces, offset = [], 0
    for src, (nbytes, nrows) in enumerate(zip(bytes_from, rows_from)):
        chunk = recv[offset:offset + nbytes]
        offset += nbytes
        try:
            frames = hvd_lossy.decompress_chunks(chunk) if nbytes else []
        except Exception as e:  # FrameError, or ValueError when frame sizes overrun the chunk
            raise _LocalError(10, grank_of[src], detail=f"{type(e).__name__}: {e}") from e
        got_rows = sum(f.shape[0] for f in frames)
        bad = [f for f in frames if f.dtype != dtype or tuple(f.shape[1:]) != trailing]
        if bad or got_rows != nrows:
            detail = (f"rank {grank_of[src]} announced {nrows} rows of {dtype} x {trailing}, its frames "
                      f"hold {[(f.dtype, tuple(f.shape)) for f in frames]}")
            raise _LocalError(11, grank_of[src], detail=detail)
        pieces.extend(frames)
    if pieces:
        return torch.cat(pieces)
    return torch.empty((0, *trailing), dtype=dtype, device=recv.device)


def finish_with_status(op, error, name, process_set, record):
    """Step 5: every rank shares whether decoding worked, then all raise or none do."""
    t0 = time.perf_counter()
    rows = allgather_rows(meta_row(None, error, []), name, process_set)
    record.comm_s += time.perf_counter() - t0
    record.meta_bytes += 8 * rows.shape[1]
    raise_on_errors(op, rows, error)


_call_counter = itertools.count()


def base_name(op, name):
    """Names the sub-operations of one call identically on all ranks (calls are collective, so
    the per-process counter agrees across ranks), also when the user gives no name."""
    return name if name is not None else f"hvd_lossy.{op}.{next(_call_counter)}"


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
    if any(not isinstance(v, int) and not (hasattr(v, "__index__")) for v in values):
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


def check_lossy_tensor(tensor, min_ndim=1):
    if not isinstance(tensor, torch.Tensor):
        raise _LocalError(9, detail=f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in LOSSY_DTYPES:
        raise _LocalError(5)
    if not min_ndim <= tensor.dim() <= MAX_NDIM:
        raise _LocalError(6, tensor.dim(), MAX_NDIM)


def _check_plan(plan, rows_to):
    per_dest = [0] * len(rows_to)
    last = 0
    for dest, rows, _eb in plan:
        if not 0 <= dest < len(rows_to) or dest < last or rows < 0:
            raise _LocalError(9, detail=f"compressor plan {plan!r} is not in destination order "
                                        f"for splits {rows_to}")
        per_dest[dest] += rows
        last = dest
    if per_dest != rows_to:
        raise _LocalError(9, detail=f"compressor plan rows per destination {per_dest} differ "
                                    f"from splits {rows_to}")


class Handle:
    """A started collective; `hvd_lossy.torch.synchronize(handle)` returns its result."""

    def __init__(self, hvd_handle, finish):
        self._hvd_handle, self._finish, self._done, self._result = hvd_handle, finish, False, None
        # True when the call is exactly Horovod's own (Compression.none): the public async API
        # then hands out Horovod's integer handle, so horovod.torch.synchronize works on it too.
        self.is_plain_horovod = False

    def poll(self):
        return self._done or self._hvd_handle is None or _ops.poll(self._hvd_handle)

    def wait(self):
        if not self._done:
            self._done = True
            self._result = self._finish(self._hvd_handle)
        return self._result


def _lossy_start(tensor, splits, name, compressor, process_set):
    size = process_set.size()
    base = base_name("alltoall", name)
    record = _stats.CallStats(op="alltoall", compression=repr(compressor))
    error, buffer, rows_to, byte_counts = None, None, [0] * size, [0] * size
    t0 = time.perf_counter()
    try:
        check_lossy_tensor(tensor)
        rows_to = split_list(splits, tensor.shape[0], size)
        plan = compressor.plan(rows_to)
        _check_plan(plan, rows_to)
        try:
            buffer, frame_sizes = hvd_lossy.compress_chunks(
                tensor.detach(), [p[1] for p in plan], [p[2] for p in plan],
                mode=compressor.mode, level=compressor.level, dedup=compressor.dedup)
        except Exception as e:
            raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
        compressor.after_compress(plan, frame_sizes, tensor)
        for (dest, _rows, _eb), nbytes in zip(plan, frame_sizes):
            byte_counts[dest] += nbytes
        for dest, nbytes in enumerate(byte_counts):
            if nbytes > _INT32_MAX:
                raise _LocalError(8, nbytes, dest)
        record.error_bounds = [float(p[2]) for p in plan]
    except _LocalError as e:
        error = e
    except Exception as e:  # e.g. a compressor subclass's plan() raising: still tell the peers
        error = _LocalError(9, detail=f"{type(e).__name__}: {e}")
    record.compress_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    row = meta_row(tensor, error, rows_to + byte_counts)
    rows = allgather_rows(row, base + ".meta", process_set)
    record.meta_bytes = 8 * len(row)
    raise_on_errors("alltoall", rows, error)
    check_agreement("alltoall", rows)
    me = process_set.rank()
    rows_from = rows[:, HEAD + me].tolist()
    bytes_from = rows[:, HEAD + size + me].tolist()
    granks = rows[:, _GRANK].tolist()
    send_splits = torch.tensor(byte_counts, dtype=torch.int32)
    handle = _ops.alltoall_async(buffer, splits=send_splits, name=base + ".data",
                                 process_set=process_set)
    record.comm_s = time.perf_counter() - t1
    record.raw_bytes = tensor.numel() * tensor.element_size()
    record.wire_bytes = buffer.numel()
    like = (tensor.dtype, tuple(tensor.shape[1:]))
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def finish(hvd_handle):
        t2 = time.perf_counter()
        recv, _ = _ops.synchronize(hvd_handle)
        record.comm_s += time.perf_counter() - t2
        t3 = time.perf_counter()
        output, failure = None, None
        try:
            output = decode_sources(recv, bytes_from, rows_from, like, granks)
        except _LocalError as e:
            failure = e
        record.decompress_s = time.perf_counter() - t3
        finish_with_status("alltoall", failure, base + ".status", process_set, record)
        record.recv_wire_bytes = recv.numel()
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return output, torch.tensor(rows_from, dtype=split_dtype)

    return Handle(handle, finish)


# Horovod's alltoall rejects bfloat16; with no compression requested it travels as lossless
# frames instead (error bound 0: the decoded tensor is bit-identical to the input).
LOSSLESS = LossyCompressor(0.0, mode="abs", backward=None)


def _plain_start(tensor, splits, name, compression, process_set):
    """Horovod's own alltoall on compression.compress(tensor); for Compression.none this is
    exactly horovod.torch.alltoall_async."""
    record = _stats.CallStats(op="alltoall", compression=getattr(compression, "__name__", repr(compression)))
    t0 = time.perf_counter()
    payload, ctx = compression.compress(tensor)
    payload = payload.contiguous()  # Horovod rejects non-contiguous tensors; same bytes otherwise
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

    result = Handle(handle, finish)
    result.is_plain_horovod = compression is NoneCompressor
    return result


def start(tensor, splits=None, name=None, compression=Compression.none, process_set=_ops.global_process_set):
    """Starts an alltoall with any compressor; returns a Handle whose wait() gives
    (output, received_splits)."""
    if compression is None:
        compression = NoneCompressor
    if is_lossy(compression):
        return _lossy_start(tensor, splits, name, compression, process_set)
    if compression is NoneCompressor and getattr(tensor, "dtype", None) == torch.bfloat16:
        return _lossy_start(tensor, splits, name, LOSSLESS, process_set)
    return _plain_start(tensor, splits, name, compression, process_set)
