"""The rank-agreement protocol of hvd_lossy's lossy collectives: headers, error codes, verdicts,
handles. hvd_lossy.collective builds the collectives on it.

The rule it enforces: a rank that notices a problem does not raise on its own while its peers
carry on. Every chunk a rank sends is a frame whose header carries the protocol's fields
(hvd_lossy.chunk_header), so each rank sees every sender's header in the one data collective; a failure on the sending side (bad arguments, a failing compressor,
ranks disagreeing on dtype or shape) is written there, and every rank raises the same RankError
from the same headers. There is no status round when nothing failed.

A failure only the receiver can see (a frame that fails its checksum, a frame that disagrees with
what its sender announced) raises RankError on that rank at once; its next lossy collective on the same
process set carries the failure in its headers, and every other rank raises the same RankError
there. So every rank raises and no rank is left waiting in a collective another rank skipped.
"""
import collections
import json
import zlib

import torch

from hvd_lossy.compressor import FP16Compressor, LossyCompressor, NoneCompressor

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.bool)  # code = index; -1 = other
LOSSY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_NDIM = 8  # HL_MAX_NDIM of the frame format

# Header fields: a list of ints (header()), which every chunk carries in its frame's header
# (hvd_lossy.chunk_header). PENDING/PENDING_A/PENDING_SEQ report a failure this rank found
# receiving an earlier call (code, the sender, that call's number); SETTINGS is a digest of the
# compressor's settings (settings_digest), which the ranks must share; the trailing dims fill
# MAX_NDIM slots, -1 padded; REUSE, after them, is None or a reusing call's check values
# (hvd_lossy.reuse_exchange): (sent check a peer, received check a peer, predicts a peer).
(_STATUS, _A, _B, GRANK, _DTYPE, _NDIM, ROWS, PAYLOAD, _PENDING, _PENDING_A, _PENDING_SEQ,
 _SETTINGS) = range(12)
_DIMS = 12
REUSE = _DIMS + MAX_NDIM
HEADER_FIELDS = REUSE + 1

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
    8: "{a} bytes for rank {b} exceed what one destination may take in a call "
       "((2^31 - 1) / ranks: Horovod's counts are int32)",
    9: "bad argument",
    10: "the bytes received from rank {a} failed to decode (checksum or format error)",
    11: "the frames received from rank {a} disagree with the dtype, shape or rows it announced",
    12: "ranks disagree on the {what}",
    13: "receiving failed unexpectedly",
    14: "{a} bytes exceed the {b} bytes one rank may send in a call (Horovod's counts are int32)",
    15: "rank {a} announced more output than max_output_bytes (hvd_lossy.set_max_output_bytes)",
    16: "the reuse cache of rank {b} for rank {a} is not the mirror rank {a} coded against (a "
        "frame lost or corrupted, a call skipped or made without ids, a rank or compressor "
        "restarted, or recv_ids that are not the ids sent); every rank reset its reuse caches",
}
_AGREEMENT = ("dtype", "number of dims", "trailing shape", "compression settings", "dim 0",
              "reuse (ids and recv_ids on some ranks only)")

INT32_MAX = 2 ** 31 - 1


def per_rank_limit(size):
    """Bytes one rank may send to one destination (alltoall) or contribute (allgather) in one
    call of a process set of `size` ranks. Horovod's uint8 counts and displacements are int32,
    so a call must stay under 2 GiB on every rank, and a receiver's total is the sum of `size`
    senders' chunks, which no sender sees: keeping each chunk under 1/size of the limit keeps
    every rank's send and receive totals under it."""
    return INT32_MAX // max(size, 1)


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
        super().__init__(detail or _error_text(code, a, b, dtype))
        self.code, self.a, self.b, self.detail, self.dtype = code, int(a), int(b), detail, dtype
        self.origin = origin  # global rank; None: the rank that raised it (raise_received fills it)


def dtype_code(tensor):
    dtype = getattr(tensor, "dtype", None)
    return _DTYPES.index(dtype) if dtype in _DTYPES else -1


def _dtype_name(code):
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "unknown"


class _Pending:
    """Per process set (backend.key): the number of this rank's lossy collectives so far (the same on every
    rank of the set, since they are collective) and a receive failure not yet reported."""

    def __init__(self):
        self.calls = 0
        self.failure = None  # (code, sender grank, call number)
        self.raised_at = set()  # call numbers this rank already raised a RankError for


_pending = collections.defaultdict(_Pending)


def begin_call(backend):
    """Numbers a new lossy collective on `backend`'s group; returns (number, pending fields)."""
    p = _pending[backend.key]
    p.calls += 1
    fields = p.failure or (0, 0, 0)
    p.failure = None  # it travels in this call's headers
    return p.calls, fields


def settings_digest(compressor):
    """A 31-bit digest of what the ranks of a lossy collective must agree on about its
    compressor (compressor.agreement(): bound, mode, level, dither, ...): ranks calling with
    different compressors or bounds get a RankError instead of frames decoded to bounds their
    receivers did not ask for."""
    agreement = getattr(compressor, "agreement", None)
    key = agreement() if agreement is not None else repr(compressor)
    return zlib.crc32(json.dumps(key, sort_keys=True, default=repr).encode()) & 0x7FFFFFFF


def header(tensor, failure, rows, payload, pending, grank, settings=0):
    """The header fields (list of ints) global rank `grank` sends ahead of `payload` frame
    bytes."""
    code, a, b = (failure.code, failure.a, failure.b) if failure else (0, 0, 0)
    is_tensor = isinstance(tensor, torch.Tensor)
    dims = (list(tensor.shape[1:]) if is_tensor else []) + [-1] * MAX_NDIM
    ndim = tensor.dim() if is_tensor else -1
    return ([code, a, b, grank, dtype_code(tensor), ndim, int(rows), int(payload)]
            + list(pending) + [settings] + dims[:MAX_NDIM] + [None])


def like_of(h):
    """(dtype, trailing shape) announced by a header."""
    return _DTYPES[h[_DTYPE]], tuple(d for d in h[_DIMS:_DIMS + max(h[_NDIM] - 1, 0)])


def check_headers(headers, compare_rows=False):
    """The verdict every rank reaches alike from all ranks' headers: the first reported
    failure, else the first disagreement, else None."""
    for h in headers:
        if h[_STATUS]:
            return _LocalError(h[_STATUS], h[_A], h[_B], origin=h[GRANK], dtype=h[_DTYPE])
    keys = [lambda h: _dtype_name(h[_DTYPE]), lambda h: h[_NDIM], lambda h: like_of(h)[1],
            lambda h: f"settings {h[_SETTINGS]:#010x}"]
    if compare_rows:
        keys.append(lambda h: h[ROWS])
    for what, key in enumerate(keys):
        values = [key(h) for h in headers]
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {h[GRANK]} has {v}" for h, v in zip(headers, values))
            return _LocalError(12, what, detail=listing, origin=-1)
    return reuse_diverged(headers)


def reuse_diverged(headers):
    """For a reusing call: every pair (sender s, receiver d) must have the same check value on
    both ends (s's mirror for d, d's cache for s); the verdict for the first that does not."""
    blocks = [h[REUSE] for h in headers]
    if all(b is None for b in blocks):
        return None
    if any(b is None for b in blocks):
        listing = ", ".join(f"rank {h[GRANK]} {'reuses' if h[REUSE] else 'does not'}"
                            for h in headers)
        return _LocalError(12, 5, detail=listing, origin=-1)
    n = len(blocks)
    for s, bs in enumerate(blocks):
        for d, bd in enumerate(blocks):
            if s != d and (len(bs[0]) != n or len(bd[1]) != n or bs[0][d] != bd[1][s]):
                return _LocalError(16, headers[s][GRANK], headers[d][GRANK], origin=-1)
    return None


def _error_text(code, a, b, dtype):
    """The text of error `code` with its values, the same on every rank."""
    what = _AGREEMENT[a] if code == 12 and 0 <= a < len(_AGREEMENT) else "?"
    return _ERRORS.get(code, "error code {code}").format(a=a, b=b, code=code, what=what,
                                                         dtype=_dtype_name(dtype))


def _message(op, rows, local, grank):
    parts, seen, origins = [], set(), []
    for code, a, b, origin, dtype in rows:
        if code == 0 or (code, a, b, origin) in seen:
            continue
        seen.add((code, a, b, origin))
        text = _error_text(code, a, b, dtype)
        if code == 12 and local is not None and local.code == 12:
            text += f" ({local.detail})"  # every rank computed the same listing
        parts.append(text if origin < 0 else f"rank {origin}: {text}")
        if origin >= 0:
            origins.append(origin)
    message = f"hvd_lossy {op} failed on every rank: " + "; ".join(parts)
    if local is not None and local.detail and local.code != 12 and local.origin in (None, grank):
        message += f" (detail on rank {grank}: {local.detail})"
    return message, origins


def verdict_raises(headers, backend, compare_rows=False):
    """Whether raise_from_headers would raise for these headers."""
    raised = _pending[backend.key].raised_at
    return check_headers(headers, compare_rows) is not None or any(
        h[_PENDING] and h[_PENDING_SEQ] not in raised for h in headers)


def raise_from_headers(op, headers, backend, local=None, compare_rows=False):
    """For headers every rank holds alike (the data collective's): raises the same RankError on
    all ranks if any reported a failure or they disagree, adding any receive failure a peer
    reports from an earlier call (which a rank that already raised for it skips). `local` adds
    this rank's own detail."""
    rows = [[h[_STATUS], h[_A], h[_B], h[GRANK], h[_DTYPE]] for h in headers if h[_STATUS]]
    verdict = check_headers(headers, compare_rows)
    if verdict is not None and not rows:
        rows, local = [[verdict.code, verdict.a, verdict.b, verdict.origin, verdict.dtype]], verdict
    p = _pending[backend.key]
    late, calls = [], set()
    for h in headers:
        if h[_PENDING] and h[_PENDING_SEQ] not in p.raised_at:
            late.append([h[_PENDING], h[_PENDING_A], 0, h[GRANK], -1])
            calls.add(h[_PENDING_SEQ])
    if verdict is None and not late:
        return
    p.raised_at.update(calls)
    message, origins = _message(op, rows + late, local, backend.global_rank())
    if late:
        numbers = ", ".join(f"#{c}" for c in sorted(calls))
        message += (f" (the receive failure was found in hvd_lossy collective {numbers} on this "
                    "process set and reported with the next one)")
    raise RankError(message, origins) from local


def raise_received(op, failure, call, backend):
    """This rank failed receiving call number `call`: raise now and report it to the peers
    in this rank's next lossy collective on the process set."""
    if failure.origin is None:
        failure.origin = backend.global_rank()
    p = _pending[backend.key]
    p.failure = (failure.code, failure.a, call)
    p.raised_at.add(call)
    message, origins = _message(op, [[failure.code, failure.a, failure.b, failure.origin,
                                      failure.dtype]], failure, backend.global_rank())
    raise RankError(message.replace("failed on every rank", "failed receiving on this rank")
                    + "; its peers raise this with their next lossy collective on the process set",
                    origins) from failure


def base_name(op, name, call, backend):
    """Names the sub-operations of lossy call number `call` (begin_call's) alike on all ranks
    of the process set, also when the user gives no name: calls are collective within a set,
    so its count agrees across its ranks (one global count would not: ranks outside a set skip
    its calls)."""
    if name is not None:
        return name
    return f"hvd_lossy.{op}.{backend.key}.{call}"


def check_lossy_tensor(tensor, min_ndim=1):
    if not isinstance(tensor, torch.Tensor):
        raise _LocalError(9, detail=f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in LOSSY_DTYPES:
        raise _LocalError(5, dtype=dtype_code(tensor))
    if not min_ndim <= tensor.dim() <= MAX_NDIM:
        raise _LocalError(6, tensor.dim(), MAX_NDIM)


class Handle:
    """A started collective; `hvd_lossy.torch.synchronize(handle)` returns its result.
    `work`: the backend's started collective (hvd_lossy.backend.Work), which `finish` completes."""

    def __init__(self, work, finish, is_plain_horovod=False, poll=None, record=None):
        self._work, self._finish, self._done, self._result = work, finish, False, None
        # the call's hvd_lossy.stats.CallStats, complete once wait() returns (a lossy call's:
        # auto reads its codec time there)
        self.record = record
        # True when the call is exactly Horovod's own (Compression.none): the public async API
        # then hands out Horovod's integer handle, so horovod.torch.synchronize works on it too.
        self.is_plain_horovod = is_plain_horovod
        # poll(work): True once wait() would not block; a call of several rounds (a broadcast)
        # passes its own, which also starts the next round when one is done.
        self._poll = poll or (lambda work: work.poll())

    def poll(self):
        return self._done or self._poll(self._work)

    def wait(self):
        if not self._done:
            self._done = True
            self._result = self._finish(self._work)
        return self._result


# Horovod's alltoall rejects bfloat16; with no compression requested it travels as lossless
# frames instead (error bound 0: the decoded tensor is bit-identical to the input).
LOSSLESS = LossyCompressor(0.0, mode="abs", backward=None)


def compression_name(compression):
    return {NoneCompressor: "Compression.none", FP16Compressor: "Compression.fp16"}.get(
        compression, repr(compression))
