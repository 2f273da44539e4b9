"""One template for hvd_lossy's collectives; alltoall and gather specialise it.

A lossy call is one object that runs five steps, always in this order on every rank:

  plan     check the arguments and decide the frames (subclass: `pack`);
  pack     compress into the send buffer, each chunk one frame whose header carries the
           protocol's fields (hvd_lossy.chunk_header). A failure here does not raise: it goes
           into the headers, and the chunks are frames of no segments;
  launch   ONE collective of the backend (Horovod or torch.distributed, hvd_lossy.backend)
           moves the buffer (subclass: `launch`);
  receive  every rank holds every sender's header, so all reach the same verdict on the
           sending side's failures and raise alike (protocol.raise_from_headers); then the
           frames are decoded straight into the output (subclass: `decode`);
  report   a failure only this receiver sees raises here and travels in the headers of the
           next lossy call on the process set (protocol.raise_received).

Compression.none and Compression.fp16 take `plain_start`: the backend's own collective on
`compression.compress(tensor)`.
"""
import time

import torch

import hvd_lossy
from hvd_lossy import _decode
from hvd_lossy import stats as _stats
from hvd_lossy.compressor import NoneCompressor
from hvd_lossy.protocol import (GRANK, ROWS, Handle, _LocalError, base_name, begin_call,
                                compression_name, raise_from_headers, raise_received,
                                settings_digest, verdict_raises)


def new_output(shape, dtype, device):
    """The output tensor of a collective: on the CPU from the codec's output cache, so that
    decoding into it pays no page faults once the cache holds a block of its size."""
    if device.type == "cpu":
        return hvd_lossy._codec.empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)


def check_announced_output(headers, dtype, trailing):
    """Refuses, before anything is allocated, headers whose rows would make the output larger
    than hvd_lossy.max_output_bytes(): the rows come from the peers, and a corrupt or hostile
    header could otherwise make this rank allocate without bound. The frames themselves may
    decode to no more than their header's rows (decompress_into refuses more)."""
    row_bytes = dtype.itemsize
    for t in trailing:
        row_bytes *= t
    total = 0
    for h in headers:
        if h[ROWS] < 0:
            raise _LocalError(10, h[GRANK], detail=f"header announces {h[ROWS]} rows")
        total += h[ROWS] * row_bytes
        if total > hvd_lossy.max_output_bytes():
            raise _LocalError(15, h[GRANK], detail=f"the headers announce at least {total} bytes "
                                                   f"of output, more than max_output_bytes "
                                                   f"({hvd_lossy.max_output_bytes()})")


def decode_chunks(recv, chunks, out, origins, first_rows=None, heads=None):
    """Decodes chunks `(offset, bytes, rows)` of the uint8 tensor `recv`, each one frame whose
    header announced its rows of `out`'s dtype and row shape (the verdict read them), into
    consecutive rows of `out`; origins[i]: the global rank that sent chunk i. On the CPU one
    native call, threaded across frames. On a device every chunk's frame goes to one batched
    decode (hvd_lossy._decode.decode_into), chunk i at row first_rows[i] of `out` (None:
    consecutive from row 0), read with `heads` (chunk_header.heads_of's; None: read here)."""
    if out.device.type == "cpu":
        errors = hvd_lossy.decompress_into(recv, chunks, out)
        for origin, error in zip(origins, errors):
            if error is not None:
                raise _LocalError(11 if error.mismatch else 10, origin, detail=error)
        return
    if first_rows is None:
        first_rows = [sum(rows for _o, _n, rows in chunks[:i]) for i in range(len(chunks))]
    if heads is None:
        heads = _decode.frame_heads(recv, [(offset, nbytes) for offset, nbytes, _r in chunks])
    taken = range(len(chunks))
    try:
        frames, taken = _decode.place_chunks(chunks, heads, first_rows,
                                             out[0].numel() if out.shape[0] else 0)
        _decode.decode_into(recv, frames, [heads[i] for i in taken], out, trailing=out.shape[1:])
    except _decode.FrameRefusal as e:
        raise _LocalError(11 if e.mismatch else 10, origins[taken[e.index]],
                          detail=str(e)) from e


def remote_bytes(tensor, splits, backend):
    """(bytes an alltoall of `tensor` sends to other ranks, bytes it keeps): its own chunk is a
    local copy in every method. Bad splits count as sending everything (the collective reports
    them)."""
    rows = tensor.shape[0] if isinstance(tensor, torch.Tensor) and tensor.dim() else 0
    if not rows:
        return 0, 0
    own = rows // max(backend.size(), 1)
    if splits is not None:
        try:
            own = min(max(int(splits[backend.rank()]), 0), rows)
        except (IndexError, TypeError, ValueError):
            own = 0
    total = tensor.numel() * tensor.element_size()
    return total * (rows - own) // rows, total * own // rows


def plain_start(op, tensor, compression, launch, local_bytes=0):
    """The backend's collective `launch(payload)` (-> Work) on compression.compress(tensor); for
    Compression.none exactly the backend's own, except that a non-contiguous input is made
    contiguous first. The alltoall's result is the pair (output, received_splits).
    local_bytes: of the input, what an alltoall keeps on this rank (left out of the bytes
    sent, as the lossy path leaves it out)."""
    record = _stats.CallStats(op=op, compression=compression_name(compression))
    t0 = time.perf_counter()
    payload, ctx = compression.compress(tensor)
    payload = payload.contiguous()
    record.compress_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    handle = launch(payload)
    record.comm_s = time.perf_counter() - t1
    raw = tensor.numel() * tensor.element_size()
    record.local_bytes = local_bytes
    record.raw_bytes = raw - local_bytes
    record.wire_bytes = payload.numel() * payload.element_size() * (raw - local_bytes) // max(raw, 1)

    def finish(work):
        t2 = time.perf_counter()
        result = work.wait()
        record.comm_s += time.perf_counter() - t2
        output = result[0] if isinstance(result, tuple) else result
        record.recv_wire_bytes = output.numel() * output.element_size()
        t3 = time.perf_counter()
        output = compression.decompress(output, ctx)
        record.decompress_s = time.perf_counter() - t3
        record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(record)
        return (output, result[1]) if isinstance(result, tuple) else output

    return Handle(handle, finish, is_plain_horovod=compression is NoneCompressor)


class LossyCall:
    """One call of a lossy collective. Subclasses implement:

        pack()            -> uint8 send tensor of frames (raise _LocalError to fail);
        pack_failed()     -> the send tensor of frames of no segments, after a failure;
        launch(payload)   -> the backend's Work (self.backend: hvd_lossy.backend);
        complete(work)    -> (received uint8 tensor, its chunks' byte counts or None);
        headers(recv, counts) -> every sender's header fields, in process-set rank order;
        verify_headers(recv, counts) -> checks their checksums before a verdict raises;
        decode(recv, counts, headers) -> the output (raise _LocalError on a bad frame);
        after_launch()    -> work that may wait until the bytes travel (compressor hooks).
    """
    op = ""
    compare_rows = False  # whether the verdict also requires every rank's rows to agree

    def __init__(self, tensor, compressor, name, backend):
        self.tensor, self.compressor, self.backend = tensor, compressor, backend
        self.size, self.me, self.grank = backend.size(), backend.rank(), backend.global_rank()
        self.call, self.pending = begin_call(backend)
        self.settings = settings_digest(compressor)
        self.base = base_name(self.op, name, self.call, backend)
        self.record = _stats.CallStats(op=self.op, compression=repr(compressor))
        self.failure = None
        self.device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")

    def start(self):
        t0 = time.perf_counter()
        try:
            payload = self.pack()
        except _LocalError as e:
            self.failure = e
        except Exception as e:  # e.g. a compressor subclass's plan() raising: still tell the peers
            self.failure = _LocalError(9, detail=f"{type(e).__name__}: {e}")
        if self.failure is not None:
            payload = self.pack_failed()
        self.record.compress_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        handle = self.launch(payload)
        self.record.comm_s = time.perf_counter() - t1
        if self.failure is None:
            t2 = time.perf_counter()
            self.after_launch()
            self.record.compress_s += time.perf_counter() - t2
        return Handle(handle, self._finish, poll=self.poll, record=self.record)

    def after_launch(self):
        pass

    def verify_headers(self, recv, counts):
        """Checks the checksums of headers that carry one (raise _LocalError 10 if one fails);
        called before a verdict read from them raises."""

    def poll(self, work):
        """True once _finish(work) would not wait for communication."""
        return work.poll()

    def _finish(self, work):
        t0 = time.perf_counter()
        recv, counts = self.complete(work)
        self.record.comm_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            headers = self.headers(recv, counts)
            if verdict_raises(headers, self.backend, self.compare_rows):
                # Only a checked header may make this rank raise what its peers raise too.
                self.verify_headers(recv, counts)
        except _LocalError as e:
            raise_received(self.op, e, self.call, self.backend)
        raise_from_headers(self.op, headers, self.backend, self.failure,
                           compare_rows=self.compare_rows)
        try:
            output = self.decode(recv, counts, headers)
        except _LocalError as e:
            raise_received(self.op, e, self.call, self.backend)
        except Exception as e:  # never return without telling the peers
            raise_received(self.op, _LocalError(13, detail=f"{type(e).__name__}: {e}"), self.call,
                           self.backend)
        self.record.decompress_s = time.perf_counter() - t1
        self.record.recv_raw_bytes = output.numel() * output.element_size()
        _stats.record(self.record)
        return self.result(output)

    def result(self, output):
        return output
