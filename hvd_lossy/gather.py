"""Compressed allgather and broadcast: hvd_lossy.collective's template for two more collectives.

allgather: each rank sends one format-2 frame of its tensor, the protocol's fields in its
header (hvd_lossy.chunk_header), in a single allgather (1 collective). broadcast: the receivers
must size their buffer before the payload arrives, so all ranks first allgather a frame of no
segments each that announces their tensor and, on the root, its frame's bytes (which also
settles every argument check), then the root's frame is broadcast (2 collectives). Starting a
broadcast only starts the header round: the payload round starts from poll() or synchronize()
once the headers are in, so broadcast_async neither blocks nor raises. The collectives are the
backend's (hvd_lossy.backend).

Every rank returns the decoded tensor, the root of a broadcast and a rank's own slice of an
allgather included, so that all ranks hold exactly the same values afterwards.
"""
import time

import torch

import hvd_lossy
from hvd_lossy import chunk_header
from hvd_lossy.backend import as_backend
from hvd_lossy.collective import (LossyCall, check_announced_output, decode_chunks, new_output,
                                  plain_start)
from hvd_lossy.compressor import NoneCompressor, is_lossy
from hvd_lossy.protocol import (GRANK, INT32_MAX, LOSSLESS, PAYLOAD, ROWS, RankError,
                                _LocalError, check_lossy_tensor, header, like_of, per_rank_limit,
                                raise_from_headers, raise_received)


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


class Allgather(LossyCall):
    op = "allgather"
    segments = None  # rows of each segment of a rank's frame (None: one); each its own bound

    def pack(self):
        check_lossy_tensor(self.tensor)
        t, c = self.tensor.detach(), self.compressor
        rows, trailing = self.segments or [t.shape[0]], list(t.shape[1:])
        ext = chunk_header.extension(header(t, None, 0, 0, self.pending, self.grank,
                                            self.settings))
        send = torch.empty(hvd_lossy.max_grouped_bytes(rows, trailing, [len(rows)], 0),
                           dtype=torch.uint8, device=self.device)
        try:
            _sizes, (nbytes,) = hvd_lossy.compress_grouped(
                t, rows, [c.error_bound] * len(rows), [len(rows)], 0, send, 0, mode=c.mode,
                level=c.level, dedup=c.dedup,
                dither=c.next_dither_seed(self.grank, self.backend.global_size()), extension=ext)
        except Exception as e:
            raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
        limit = per_rank_limit(self.size)
        if nbytes > limit:
            raise _LocalError(14, nbytes, limit)
        meta = chunk_header.block_bytes(ext)
        self.record.raw_bytes = t.numel() * t.element_size()
        self.record.wire_bytes = nbytes - meta
        self.record.meta_bytes = meta
        self.record.error_bounds = [float(c.error_bound)]
        return send[:nbytes]

    def pack_failed(self):
        frame = chunk_header.header_frame(self.tensor, header(
            self.tensor, self.failure, 0, 0, self.pending, self.grank, self.settings))
        self.record.meta_bytes = frame.numel()
        return frame.to(self.device)

    def launch(self, payload):
        return self.backend.allgather_async(payload, self.base + ".data")

    def complete(self, work):
        return work.wait(), None

    def headers(self, recv, counts):
        """Every rank's header, from its frame in the result (frame after frame)."""
        self.counts = chunk_header.split_chunks(recv, self.size)
        self.record.recv_wire_bytes = recv.numel()
        self.heads = chunk_header.heads_of(recv, self.counts)
        return chunk_header.parse_chunks(recv, self.counts, heads=self.heads)

    def verify_headers(self, recv, counts):
        chunk_header.parse_chunks(recv, self.counts, verify=True)

    def decode(self, recv, counts, headers):
        dtype, trailing = like_of(headers[0])
        rows = [h[ROWS] for h in headers]
        check_announced_output(headers, dtype, trailing)
        out = new_output((sum(rows), *trailing), dtype, self.device)
        decode_chunks(recv, list(zip(chunk_header.offsets_of(self.counts), self.counts, rows)),
                      out, [h[GRANK] for h in headers], heads=self.heads)
        return out


class Broadcast(LossyCall):
    op = "broadcast"
    compare_rows = True

    def __init__(self, tensor, root_rank, name, compressor, backend):
        super().__init__(tensor, compressor, name, backend)
        self.root_rank, self.is_root = root_rank, self.grank == root_rank
        self.frame = None
        self.data_handle = None  # the payload round, once started
        self.refusal = None  # the RankError of the header round, raised again by every wait

    def pack(self):
        check_lossy_tensor(self.tensor, min_ndim=0)
        if self.is_root:
            t = self.tensor
            try:
                self.frame, _ = self.compressor.compress(t.detach())
            except Exception as e:
                raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
            if self.frame.numel() > INT32_MAX:  # the root's frame is the whole payload
                raise _LocalError(14, self.frame.numel(), INT32_MAX)
            self.record.raw_bytes = t.numel() * t.element_size()
            self.record.wire_bytes = self.frame.numel()
            self.record.error_bounds = [float(self.compressor.error_bound)]
        return self.frame

    def pack_failed(self):
        return None

    def rows(self):
        t = self.tensor
        return (t.shape[0] if t.dim() else 1) if isinstance(t, torch.Tensor) else 0

    def launch(self, frame):
        """Starts the header round (every rank's header, so that receivers can size the
        payload and all ranks reach the same verdict before it moves) without waiting for it."""
        self.frame = frame
        nbytes = 0 if self.failure or frame is None else frame.numel()
        head = chunk_header.header_frame(self.tensor, header(
            self.tensor, self.failure, self.rows(), nbytes, self.pending, self.grank,
            self.settings), sized=True)
        self.record.meta_bytes = head.numel()
        return self.backend.allgather_async(head, self.base + ".meta")

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
        heads = meta_handle.wait()
        self.record.comm_s += time.perf_counter() - t0
        try:
            try:  # header frames are small: their checksums are checked before any verdict
                self.meta = chunk_header.parse_chunks(
                    heads, chunk_header.split_chunks(heads, self.size), verify=True)
            except _LocalError as e:
                raise_received(self.op, e, self.call, self.backend)
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
            worst = hvd_lossy.max_grouped_bytes([rows], trailing, [1], 0)
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


def allgather_start(tensor, name, compression, process_set=None, segments=None):
    """Starts an allgather; the Handle's wait() gives the concatenation along dim 0.
    process_set: a Horovod ProcessSet (None: all ranks) or an hvd_lossy.backend backend.
    segments: with a lossy compressor, the rows of each segment of a rank's frame (summing to
    its rows), each coded within its own bound (a relative bound: of its own range)."""
    backend = as_backend(process_set)
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return plain_start("allgather", tensor, compression,
                           lambda payload: backend.allgather_async(payload, name))
    call = Allgather(tensor, compressor, name, backend)
    if segments is not None:
        if sum(segments) != tensor.shape[0] or min(segments, default=0) < 0:
            raise ValueError(f"segments must be rows >= 0 summing to the tensor's "
                             f"{tensor.shape[0]}, got {segments}")
        call.segments = [int(r) for r in segments]
    return call.start()


def broadcast_start(tensor, root_rank, name, compression, process_set=None):
    """Starts a broadcast from global rank root_rank; the Handle's wait() gives the tensor."""
    backend = as_backend(process_set)
    compressor = _lossy_compressor(tensor, compression)
    if compressor is None:
        return plain_start("broadcast", tensor, compression,
                           lambda payload: backend.broadcast_async(payload, root_rank, name))
    return Broadcast(tensor, root_rank, name, compressor, backend).start()
