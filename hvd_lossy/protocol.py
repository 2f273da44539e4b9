"""The rank-agreement protocol of hvd_lossy's lossy collectives: headers, error codes, the
status round, frame decoding and handles. hvd_lossy.alltoall and hvd_lossy.gather build on it.

The rule it enforces: a rank that notices a problem does not raise on its own. It reports the
problem to its peers in the next collective they all run anyway (a header, or the final status
allgather), and then every rank raises the same RankError. So no rank is ever left waiting in a
collective that another rank skipped.
"""
import collections
import itertools
import time

import torch
from horovod.torch import mpi_ops as _ops

import hvd_lossy
from hvd_lossy.compression import Compression, LossyCompressor, NoneCompressor

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.bool)  # code = index; -1 = other
LOSSY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_NDIM = 8  # HL_MAX_NDIM of the frame format

# Header: int64 fields, then the trailing dims (MAX_NDIM slots, -1 padded). The same layout is
# the metadata row that broadcast allgathers.
MAGIC = 0x314C5648  # "HVL1": guards against reading frames or garbage as a header
_MAGIC, _STATUS, _A, _B, GRANK, _DTYPE, _NDIM, ROWS, PAYLOAD = range(9)
_DIMS = 9
HEADER_FIELDS = _DIMS + MAX_NDIM
HEADER_BYTES = 8 * HEADER_FIELDS

# Error codes. {a}/{b} travel with the code, so every rank prints the same text; "detail",
# the local exception text, is known to the rank where it happened only.
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
    12: "ranks disagree on the {what}",
    13: "receiving failed unexpectedly",
}
_AGREEMENT = ("dtype", "number of dims", "trailing shape", "dim 0")


class RankError(ValueError):
    """A collective failed on one or more ranks; raised on every rank of the process set.

    Attributes:
        ranks: the global ranks that reported a failure of their own (empty when the ranks
               merely disagree on dtype or shape).
    """

    def __init__(self, message, ranks):
        super().__init__(message)
        self.ranks = list(ranks)


class _LocalError(Exception):
    """A failure noticed on this rank, carried to the others as (code, a, b, origin)."""

    def __init__(self, code, a=0, b=0, detail=None, origin=None, dtype=-1):
        super().__init__(detail or _ERRORS[code])
        self.code, self.a, self.b, self.detail, self.dtype = code, int(a), int(b), detail, dtype
        self.origin = _ops.rank() if origin is None else origin


def dtype_code(tensor):
    dtype = getattr(tensor, "dtype", None)
    return _DTYPES.index(dtype) if dtype in _DTYPES else -1


def _dtype_name(code):
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "unknown"


def header(tensor, failure, rows, payload):
    """The header fields (list of ints) this rank sends ahead of `payload` frame bytes."""
    code, a, b = (failure.code, failure.a, failure.b) if failure else (0, 0, 0)
    is_tensor = isinstance(tensor, torch.Tensor)
    dims = (list(tensor.shape[1:]) if is_tensor else []) + [-1] * MAX_NDIM
    ndim = tensor.dim() if is_tensor else -1
    return [MAGIC, code, a, b, _ops.rank(), dtype_code(tensor), ndim, int(rows), int(payload)] + dims[:MAX_NDIM]


def header_bytes(fields, device):
    return torch.tensor(fields, dtype=torch.int64).view(torch.uint8).to(device)


def parse_header(chunk, source):
    """Header fields from the first HEADER_BYTES of a uint8 chunk from process-set rank `source`."""
    if chunk.numel() < HEADER_BYTES:
        raise _LocalError(10, source, detail=f"{chunk.numel()} bytes, shorter than a header")
    # A copy: headers of later ranks in an allgather sit at offsets not divisible by 8.
    fields = chunk[:HEADER_BYTES].to("cpu", copy=True).view(torch.int64).tolist()
    if fields[_MAGIC] != MAGIC:
        raise _LocalError(10, source, detail="no hvd_lossy header where one was expected")
    return fields


def like_of(h):
    """(dtype, trailing shape) announced by a header."""
    return _DTYPES[h[_DTYPE]], tuple(d for d in h[_DIMS:_DIMS + max(h[_NDIM] - 1, 0)])


def check_headers(headers, compare_rows=False):
    """The verdict every rank reaches alike from all ranks' headers: the first reported
    failure, else the first disagreement, else None."""
    for h in headers:
        if h[_STATUS]:
            return _LocalError(h[_STATUS], h[_A], h[_B], origin=h[GRANK], dtype=h[_DTYPE])
    keys = [lambda h: _dtype_name(h[_DTYPE]), lambda h: h[_NDIM], lambda h: like_of(h)[1]]
    if compare_rows:
        keys.append(lambda h: h[ROWS])
    for what, key in enumerate(keys):
        values = [key(h) for h in headers]
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {h[GRANK]} has {v}" for h, v in zip(headers, values))
            return _LocalError(12, what, detail=listing, origin=-1)
    return None


def decode(bodies, like, origins):
    """Decodes each source's frames (several per source allowed) and checks them against its
    header; returns the concatenation. bodies: list of (announced rows, uint8 tensor)."""
    dtype, trailing = like
    pieces = []
    for (rows, body), origin in zip(bodies, origins):
        try:
            frames = hvd_lossy.decompress_chunks(body) if body.numel() else []
        except Exception as e:  # FrameError, or ValueError when sizes overrun the chunk
            raise _LocalError(10, origin, detail=f"{type(e).__name__}: {e}") from e
        got = [(f.dtype, tuple(f.shape)) for f in frames]
        if sum(f.shape[0] for f in frames) != rows or any(d != dtype or s[1:] != trailing for d, s in got):
            raise _LocalError(11, origin, detail=f"rank {origin} announced {rows} rows of {dtype} x "
                                                 f"{trailing}, its frames hold {got}")
        pieces.extend(frames)
    device = bodies[0][1].device if bodies else "cpu"
    return torch.cat(pieces) if pieces else torch.empty((0, *trailing), dtype=dtype, device=device)


def _message(op, rows, local):
    parts, seen, origins = [], set(), []
    for code, a, b, origin, dtype in rows:
        if code == 0 or (code, a, b, origin) in seen:
            continue
        seen.add((code, a, b, origin))
        what = _AGREEMENT[a] if code == 12 and 0 <= a < len(_AGREEMENT) else "?"
        text = _ERRORS.get(code, "error code {code}").format(a=a, b=b, code=code, what=what,
                                                            dtype=_dtype_name(dtype))
        if code == 12 and local is not None and local.code == 12:
            text += f" ({local.detail})"  # every rank computed the same listing
        parts.append(text if origin < 0 else f"rank {origin}: {text}")
        if origin >= 0:
            origins.append(origin)
    message = f"hvd_lossy {op} failed on every rank: " + "; ".join(parts)
    if local is not None and local.detail and local.code != 12 and local.origin == _ops.rank():
        message += f" (detail on rank {_ops.rank()}: {local.detail})"
    return message, origins


def agree_or_raise(op, failure, name, process_set, record):
    """Step 4: all ranks share their failure, if any, and all raise or none does."""
    t0 = time.perf_counter()
    row = [failure.code, failure.a, failure.b, failure.origin, failure.dtype] if failure else [0, 0, 0, 0, -1]
    rows = _ops.synchronize(_ops.allgather_async(
        torch.tensor([row], dtype=torch.int64), name=name, process_set=process_set)).tolist()
    record.comm_s += time.perf_counter() - t0
    record.meta_bytes += 8 * len(row)
    if any(r[0] for r in rows):
        message, origins = _message(op, rows, failure)
        raise RankError(message, origins) from failure


def raise_verdict(op, headers, local=None, compare_rows=False):
    """For headers every rank holds alike (an allgather's result): raises the same RankError
    on all ranks if any reported a failure or they disagree; local adds this rank's detail."""
    rows = [[h[_STATUS], h[_A], h[_B], h[GRANK], h[_DTYPE]] for h in headers if h[_STATUS]]
    verdict = check_headers(headers, compare_rows)
    if verdict is None:
        return
    if not rows:
        rows, local = [[verdict.code, verdict.a, verdict.b, verdict.origin, verdict.dtype]], verdict
    message, origins = _message(op, rows, local)
    raise RankError(message, origins) from local


_call_counters = collections.defaultdict(itertools.count)


def base_name(op, name, process_set):
    """Names the sub-operations of one call alike on all ranks of the process set, also when
    the user gives no name. Calls are collective within a set, so a counter per set agrees
    across its ranks (one global counter would not: ranks outside a set skip its calls)."""
    if name is not None:
        return name
    return f"hvd_lossy.{op}.{process_set.process_set_id}.{next(_call_counters[process_set.process_set_id])}"


def check_lossy_tensor(tensor, min_ndim=1):
    if not isinstance(tensor, torch.Tensor):
        raise _LocalError(9, detail=f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in LOSSY_DTYPES:
        raise _LocalError(5, dtype=dtype_code(tensor))
    if not min_ndim <= tensor.dim() <= MAX_NDIM:
        raise _LocalError(6, tensor.dim(), MAX_NDIM)


class Handle:
    """A started collective; `hvd_lossy.torch.synchronize(handle)` returns its result."""

    def __init__(self, hvd_handle, finish, is_plain_horovod=False):
        self._hvd_handle, self._finish, self._done, self._result = hvd_handle, finish, False, None
        # True when the call is exactly Horovod's own (Compression.none): the public async API
        # then hands out Horovod's integer handle, so horovod.torch.synchronize works on it too.
        self.is_plain_horovod = is_plain_horovod

    def poll(self):
        return self._done or _ops.poll(self._hvd_handle)

    def wait(self):
        if not self._done:
            self._done = True
            self._result = self._finish(self._hvd_handle)
        return self._result


# Horovod's alltoall rejects bfloat16; with no compression requested it travels as lossless
# frames instead (error bound 0: the decoded tensor is bit-identical to the input).
LOSSLESS = LossyCompressor(0.0, mode="abs", backward=None)


def compression_name(compression):
    return {NoneCompressor: "Compression.none", Compression.fp16: "Compression.fp16"}.get(
        compression, repr(compression))
