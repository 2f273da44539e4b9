"""Compressed allgather and broadcast: hvd_lossy.collective's template for two more collectives.

allgather: each rank sends one header plus one frame in a single Horovod allgather (1
collective). broadcast: the receivers must size their buffer before the payload arrives, so all
ranks first allgather their headers (which also settles every argument check), then the root's
frame is broadcast (2 collectives). Starting a broadcast only starts the header round: the
payload round starts from poll() or synchronize() once the headers are in, so broadcast_async
neither blocks nor raises. The collectives are the backend's (hvd_lossy.backend).

Every rank returns the decoded tensor, the root of a broadcast and a rank's own slice of an
allgather included, so that all ranks hold exactly the same values afterwards.
"""
import time

import torch

import hvd_lossy
from hvd_lossy.backend import as_backend
from hvd_lossy.collective import (LossyCall, check_announced_output, decode_frames, host_bytes,
                                  new_output, plain_start)
from hvd_lossy.compression import NoneCompressor, is_lossy
from hvd_lossy.protocol import (GRANK, HEADER_BYTES, HEADER_FIELDS, INT32_MAX, LOSSLESS, PAYLOAD,
                                ROWS, RankError, _LocalError, check_lossy_tensor, header, like_of,
                                pack_header, parse_header, per_rank_limit, raise_from_headers)


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


class _OneFrame(LossyCall):
    """A collective whose every sender contributes one frame of its whole tensor."""

    def compress(self):
        try:
            frame, _ = self.compressor.compress(self.tensor.detach())
        except Exception as e:
            raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
        self.note_frame(frame.numel())
        return frame

    def note_frame(self, nbytes):
        """Statistics of the one frame this rank sends; refuses a frame too large for one
        call."""
        limit = self.send_limit()
        if HEADER_BYTES + nbytes > limit:
            raise _LocalError(14, HEADER_BYTES + nbytes, limit)
        self.record.raw_bytes = self.tensor.numel() * self.tensor.element_size()
        self.record.wire_bytes = nbytes
        self.record.error_bounds = [float(self.compressor.error_bound)]

    def rows(self):
        t = self.tensor
        return (t.shape[0] if t.dim() else 1) if isinstance(t, torch.Tensor) else 0

    def with_header(self, frame):
        send = torch.empty(HEADER_BYTES + (frame.numel() if frame is not None else 0),
                           dtype=torch.uint8)
        rows = 0 if self.failure else self.rows()
        nbytes = 0 if frame is None else frame.numel()
        pack_header(header(self.tensor, self.failure, rows, nbytes, self.pending, self.grank,
                           self.settings),
                    send.numpy(), 0)
        if frame is not None:
            send[HEADER_BYTES:].copy_(frame)
        self.record.meta_bytes = HEADER_BYTES
        return send.to(self.device) if self.device.type != "cpu" else send


class Allgather(_OneFrame):
    op = "allgather"

    def send_limit(self):
        return per_rank_limit(self.size)

    def pack(self):
        check_lossy_tensor(self.tensor)
        if self.device.type != "cpu":
            return self.with_header(self.compress())
        # The frame straight after its header slot, written once.
        t, c = self.tensor.detach(), self.compressor
        rows, trailing = [t.shape[0]], list(t.shape[1:])
        send = torch.empty(hvd_lossy.max_grouped_bytes(rows, trailing, [1], HEADER_BYTES),
                           dtype=torch.uint8)
        try:
            (size,) = hvd_lossy.compress_grouped(
                t, rows, [c.error_bound], [1], HEADER_BYTES, send, 0, mode=c.mode, level=c.level,
                dedup=c.dedup, dither=c.next_dither_seed(self.grank, self.backend.global_size()))
        except Exception as e:
            raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
        self.note_frame(size)
        self.record.meta_bytes = HEADER_BYTES
        pack_header(header(t, None, rows[0], size, self.pending, self.grank, self.settings),
                    send.numpy(), 0)
        return send[:HEADER_BYTES + size]

    def pack_failed(self):
        return self.with_header(None)

    def launch(self, payload):
        return self.backend.allgather_async(payload, self.base + ".data")

    def complete(self, work):
        return work.wait(), None

    def headers(self, recv, counts):
        """Headers and frame offsets of each rank in the result (header, frame, header...)."""
        buf = host_bytes(recv)
        headers, self.bodies, offset = [], [], 0
        for src in range(self.size):
            h = parse_header(buf, offset, recv.numel() - offset, src)
            if offset + HEADER_BYTES + h[PAYLOAD] > recv.numel():
                raise _LocalError(10, h[GRANK], detail=f"header announces {h[PAYLOAD]} bytes, "
                                                       f"{recv.numel() - offset - HEADER_BYTES} left")
            headers.append(h)
            self.bodies.append((offset + HEADER_BYTES, h[PAYLOAD]))
            offset += HEADER_BYTES + h[PAYLOAD]
        if offset != recv.numel():
            raise _LocalError(10, -1, detail=f"{recv.numel() - offset} bytes after the last rank's frames")
        self.record.recv_wire_bytes = recv.numel() - HEADER_BYTES * self.size
        return headers

    def decode(self, recv, counts, headers):
        dtype, trailing = like_of(headers[0])
        rows = [h[ROWS] for h in headers]
        check_announced_output(headers, dtype, trailing)
        out = new_output((sum(rows), *trailing), dtype, self.device)
        if self.device.type == "cpu":
            errors = hvd_lossy.decompress_into(
                recv, [(offset, n, r) for (offset, n), r in zip(self.bodies, rows)], out)
            for h, error in zip(headers, errors):
                if error is not None:
                    raise _LocalError(11 if error.mismatch else 10, h[GRANK], detail=error)
            return out
        row = 0
        for h, (offset, n), r in zip(headers, self.bodies, rows):
            if r or n:
                decode_frames(recv[offset:offset + n], out[row:row + r], dtype, trailing, h[GRANK])
            row += r
        return out


class Broadcast(_OneFrame):
    op = "broadcast"
    compare_rows = True

    def __init__(self, tensor, root_rank, name, compressor, backend):
        super().__init__(tensor, compressor, name, backend)
        self.root_rank, self.is_root = root_rank, self.grank == root_rank
        self.frame = None
        self.data_handle = None  # the payload round, once started
        self.refusal = None  # the RankError of the header round, raised again by every wait

    def send_limit(self):
        return INT32_MAX  # the root's frame is the whole payload; the headers are fixed-size

    def pack(self):
        check_lossy_tensor(self.tensor, min_ndim=0)
        if self.is_root:
            self.frame = self.compress()
        return self.frame

    def pack_failed(self):
        return None

    def launch(self, frame):
        """Starts the header round (every rank's header, so that receivers can size the
        payload and all ranks reach the same verdict before it moves) without waiting for it."""
        self.frame = frame
        nbytes = 0 if self.failure or frame is None else frame.numel()
        fields = torch.tensor([header(self.tensor, self.failure, self.rows(), nbytes, self.pending,
                                      self.grank, self.settings)], dtype=torch.int64)
        self.record.meta_bytes = 8 * HEADER_FIELDS
        return self.backend.allgather_async(fields, self.base + ".meta", same_shape=True)

    def poll(self, meta_handle):
        if self.data_handle is None and self.refusal is None:
            if not meta_handle.poll():
                return False
            try:
                self._launch_payload(meta_handle)
            except RankError:
                return True  # synchronize raises it without waiting
        return self.refusal is not None or self.data_handle.poll()

    def _launch_payload(self, meta_handle):
        """The verdict from every rank's header, then the root's frame (once per call)."""
        if self.refusal is not None:
            raise self.refusal
        if self.data_handle is not None:
            return
        t0 = time.perf_counter()
        self.meta = meta_handle.wait().tolist()
        self.record.comm_s += time.perf_counter() - t0
        try:
            raise_from_headers(self.op, self.meta, self.backend, self.failure,
                               compare_rows=True)
            granks = [h[GRANK] for h in self.meta]
            if self.root_rank not in granks:
                raise RankError(f"hvd_lossy broadcast failed on every rank: root_rank "
                                f"{self.root_rank} is not in the process set (global ranks "
                                f"{granks})", [])
            nbytes = self.meta[granks.index(self.root_rank)][PAYLOAD]
            # The ranks agree on the shape (compare_rows), so a frame larger than the worst case
            # of that shape is corrupt: every rank sees the same header and refuses alike.
            dtype, trailing = like_of(self.meta[0])
            rows = self.meta[0][ROWS]
            worst = hvd_lossy.max_frame_bytes(*_frame_rows(rows, trailing), len(trailing) + 1)
            if not 0 <= nbytes <= worst:
                raise RankError(f"hvd_lossy broadcast failed on every rank: rank {self.root_rank} "
                                f"announced a frame of {nbytes} bytes, expected 0 to {worst} "
                                f"for {rows} x {list(trailing)} {dtype}", [self.root_rank])
        except RankError as e:
            self.refusal = e
            raise
        payload = self.frame if self.is_root else torch.empty(nbytes, dtype=torch.uint8,
                                                              device=self.device)
        self.data_handle = self.backend.broadcast_async(payload, self.root_rank,
                                                        self.base + ".data")

    def complete(self, meta_handle):
        self._launch_payload(meta_handle)
        recv = self.data_handle.wait()
        self.record.recv_wire_bytes = recv.numel()
        return recv, None

    def headers(self, recv, counts):
        return self.meta

    def decode(self, recv, counts, headers):
        expected = self.tensor.numel() * self.tensor.element_size()
        try:
            output = hvd_lossy.decompress(recv, max_output_bytes=expected)
        except Exception as e:
            raise _LocalError(10, self.root_rank, detail=f"{type(e).__name__}: {e}") from e
        if output.dtype != self.tensor.dtype or output.shape != self.tensor.shape:
            raise _LocalError(11, self.root_rank,
                              detail=f"frame holds {output.dtype} {tuple(output.shape)}, expected "
                                     f"{self.tensor.dtype} {tuple(self.tensor.shape)}")
        return output


def _frame_rows(rows, trailing):
    """(rows, row_len) of a frame of shape (rows, *trailing) as max_frame_bytes counts them; a
    0-d or 1-D tensor is one row."""
    if not trailing:
        return 1, max(rows, 0)
    n = max(rows, 0)
    for t in trailing[:-1]:
        n *= t
    return n, trailing[-1]


def allgather_start(tensor, name, compression, process_set=None):
    """Starts an allgather; the Handle's wait() gives the concatenation along dim 0.
    process_set: a Horovod ProcessSet (None: all ranks) or an hvd_lossy.backend backend."""
    backend = as_backend(process_set)
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return plain_start("allgather", tensor, compression,
                           lambda payload: backend.allgather_async(payload, name))
    return Allgather(tensor, compressor, name, backend).start()


def broadcast_start(tensor, root_rank, name, compression, process_set=None):
    """Starts a broadcast from global rank root_rank; the Handle's wait() gives the tensor."""
    backend = as_backend(process_set)
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return plain_start("broadcast", tensor, compression,
                           lambda payload: backend.broadcast_async(payload, root_rank, name))
    return Broadcast(tensor, root_rank, name, compressor, backend).start()
