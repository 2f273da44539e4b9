"""Compressed all-to-all: the alltoall case of hvd_lossy.collective's template.

One lossy alltoall is ONE alltoall of the backend (Horovod or torch.distributed):
  pack:    the chunk for each destination is ONE frame of format 2 whose segments are the
           pieces for that destination and whose header carries the protocol fields
           (hvd_lossy.chunk_header), compressed straight into the send buffer on the tensor's
           device (one native call for the ranks before this one, one for those after;
           hvd_lossy.compress_grouped codes device tensors too). The chunk a rank sends itself
           never crosses a link, so it is not compressed: a frame of no segments travels (the
           verdict needs every rank's header), its rows are copied straight into the output;
  launch:  one uint8 alltoall; the backend exchanges the byte splits itself;
  receive: every rank holds every sender's header, so all reach the same verdict; the frames are
           decoded straight into the one output tensor.
Nothing blocks before the launch, so alltoall_async overlaps communication fully.
"""
import numpy as np
import torch

import hvd_lossy
from hvd_lossy import auto as _auto
from hvd_lossy import chunk_header
from hvd_lossy import reuse_exchange
from hvd_lossy.backend import as_backend
from hvd_lossy.collective import (LossyCall, check_announced_output, decode_chunks, new_output,
                                  plain_start, remote_bytes)
from hvd_lossy.compressor import NoneCompressor, is_lossy
from hvd_lossy.protocol import (GRANK, LOSSLESS, REUSE, ROWS, RankError, _LocalError,
                                check_lossy_tensor, header, like_of, per_rank_limit)


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


def checked_ids(ids, tensor):
    """ids by the codec's rule (hvd_lossy._codec.check_ids), a failure told to every rank."""
    try:
        return hvd_lossy._codec.check_ids(ids, tensor)
    except (TypeError, ValueError) as e:
        raise _LocalError(9, detail=str(e)) from e


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


class Alltoall(LossyCall):
    """One lossy alltoall; start() returns the Handle whose wait() gives (output, received
    splits)."""
    op = "alltoall"

    def __init__(self, tensor, splits, name, compressor, backend, ids=None, recv_ids=None,
                 plan=None):
        super().__init__(tensor, compressor, name, backend)
        self.splits, self.ids, self.recv_ids, self.name_given = splits, ids, recv_ids, name
        # plan: the frames' (destination, rows, absolute bound), instead of the compressor's
        # plan in its mode (hvd_lossy.grad_ids: segments of summed gradients)
        self.given_plan = plan
        self.reusing = None  # reuse_exchange.Reusing of a call that reuses
        self.split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
        self.rows_to = [0] * self.size
        self.late_failure = None

    def pack(self):
        tensor, me, c = self.tensor, self.me, self.compressor
        check_lossy_tensor(tensor)
        self.rows_to = rows_to = split_list(self.splits, tensor.shape[0], self.size)
        self.plan = plan = c.plan(rows_to) if self.given_plan is None else self.given_plan
        _check_plan(plan, rows_to)
        self.tensor = tensor = self.arrange(tensor, plan)
        keys = self.keys(tensor)
        lo = sum(rows_to[:me])
        hi = lo + rows_to[me]
        self.local_rows = (lo, hi)
        seed = c.next_dither_seed(self.grank, self.backend.global_size(),
                                  sum(1 for dest, _r, _e in plan if dest != me))
        # The ranks before this one, then the ones after it: the own chunk is copied, not coded.
        parts = [(range(me + 1), tensor[:lo], None if keys is None else keys[:lo]),
                 (range(me + 1, self.size), tensor[hi:], None if keys is None else keys[hi:])]
        self.want_stats = (c.wants_codec_stats() and self.device.type == "cpu"
                           and self.given_plan is None)
        self.piece_stats = []
        if getattr(c, "reuse", False) and keys is not None:
            self.want_stats = False  # a residual's range is not the table's
            send, sizes = self._pack_reusing(keys, lo, hi)
        else:
            send, sizes = self._pack_frames(parts, seed,
                                            mode=None if self.given_plan is None else "abs")
        it = iter(sizes)
        self.frame_sizes = [None if dest == me else next(it) for dest, _r, _e in plan]
        if self.want_stats:
            it = iter(row for block in self.piece_stats for row in block)
            self.codec_stats = [None if dest == me else next(it) for dest, _r, _e in plan]
        self.record.error_bounds = [float(p[2]) for p in plan if p[0] != me]
        self.record.raw_bytes = (tensor.shape[0] - rows_to[me]) * _row_bytes(tensor)
        self.record.local_bytes = rows_to[me] * _row_bytes(tensor)
        return send

    def arrange(self, tensor, plan):
        """The tensor whose rows the plan's frames cut, in order (a subclass may reorder rows;
        hvd_lossy.torch's alltoall sends `tensor` as given; so does a call given its plan, whose
        rows are in its frames' order already: hvd_lossy.grad_ids's sums, also of a row_len
        compressor's gradient)."""
        if self.given_plan is None and getattr(self.compressor, "row_len", None) is not None:
            raise _LocalError(9, detail=f"{self.compressor!r} has row_len, the layout of "
                                        "hvd_lossy.distributed's flattened chunks; this alltoall "
                                        "takes [rows, dim] tensors and segments=<tables>")
        return tensor

    def keys(self, tensor):
        """The ids of the arranged tensor's rows, one a row (None without ids); a subclass that
        reorders rows in `arrange` reorders the ids alike."""
        return None if self.ids is None else checked_ids(self.ids, tensor)

    def _pieces(self, dests, plan=None):
        return [p for p in plan or self.plan if p[0] in dests and p[0] != self.me]

    def _pack_reusing(self, keys, lo, hi):
        """The frames of a reusing call: residuals against each destination's mirror, at the
        absolute bounds X's pieces get (hvd_lossy.reuse_exchange)."""
        if self.recv_ids is None:
            raise _LocalError(9, detail="a reusing compressor with ids needs recv_ids (the keys "
                                        "of the rows each rank sends here): the receiver "
                                        "predicts from its cache by them")
        r = self.reusing = reuse_exchange.Reusing(self, keys, self.recv_ids)

        def code(residual, plan, row_keys, zero):
            parts = [(range(self.me + 1), residual[:lo], row_keys[:lo]),
                     (range(self.me + 1, self.size), residual[hi:], row_keys[hi:])]
            zeros = None if zero is None else [zero[:lo], zero[hi:]]
            send, sizes = self._pack_frames(parts, None, mode="abs", plan=plan,
                                            block=r.block(), zero_rows=zeros)
            return send, sizes, self.send_splits.tolist()

        send, sizes = r.encode(code)
        counts = self.send_splits.tolist()
        r.after_send(send, chunk_header.offsets_of(counts), counts)
        return send, sizes

    def _pack_frames(self, parts, seed, mode=None, plan=None, block=None, zero_rows=None):
        """One frame a destination straight into the send buffer, each carrying the protocol
        fields in its header (the same for every destination). A reusing call passes its
        residuals as `parts`, their absolute bounds in `plan`, its header `block` and its
        references' zero rows a part (hvd_lossy.reuse.zero_rows)."""
        c = self.compressor
        trailing = list(self.tensor.shape[1:])
        fields = header(self.tensor, None, 0, 0, self.pending, self.grank, self.settings)
        fields[REUSE] = block
        ext = chunk_header.extension(fields)
        meta = chunk_header.block_bytes(ext)
        plans = [self._pieces(dests, plan) for dests, _rows, _ids in parts]
        groups = [[sum(1 for p in pieces if p[0] == d) for d in dests]
                  for (dests, _rows, _ids), pieces in zip(parts, plans)]
        cap = sum(hvd_lossy.max_grouped_bytes([p[1] for p in pieces], trailing, g, 0)
                  for pieces, g in zip(plans, groups))
        send = torch.empty(cap, dtype=torch.uint8, device=self.device)
        sizes, offset, chunk_bytes = [], 0, []
        for k, ((dests, rows, ids), pieces, g) in enumerate(zip(parts, plans, groups)):
            stats = (np.empty((len(pieces), hvd_lossy.STATS_PER_PIECE)) if self.want_stats
                     else None)
            try:
                got, frames = hvd_lossy.compress_grouped(
                    rows.detach(), [p[1] for p in pieces], [p[2] for p in pieces], g,
                    0, send, offset, mode=mode or c.mode, level=c.level, dedup=c.dedup,
                    dither=seed, extension=ext, stats=stats, ids=ids,
                    _zero_rows=None if zero_rows is None else zero_rows[k])
            except Exception as e:
                raise _LocalError(7, detail=f"{type(e).__name__}: {e}") from e
            if seed is not None:
                seed = (seed + len(pieces)) % hvd_lossy.DITHER_SEEDS
            if stats is not None:
                self.piece_stats.append(stats)
            # A piece's size is the codec's share: the first of a frame's pieces less the
            # protocol's bytes in the frame header, which meta_bytes counts.
            k = 0
            for n_pieces in g:
                if n_pieces:
                    got[k] -= meta
                k += n_pieces
            offset += sum(frames)
            chunk_bytes.extend(frames)
            sizes.extend(got)
        for dest, nbytes in enumerate(chunk_bytes):
            self._check_split(dest, nbytes)
        self.send_splits = torch.tensor(chunk_bytes, dtype=torch.int32)
        # The frames of no segments sent to ranks that get no rows (~13 bytes and the
        # protocol's) are counted in neither.
        self.record.wire_bytes = sum(sizes)
        self.record.meta_bytes = meta * self.size
        return send[:offset], sizes

    def _check_split(self, dest, nbytes):
        if nbytes > per_rank_limit(self.size):
            raise _LocalError(8, nbytes, dest)

    def pack_failed(self):
        frame = chunk_header.header_frame(self.tensor, header(
            self.tensor, self.failure, 0, 0, self.pending, self.grank, self.settings))
        self.send_splits = torch.tensor([frame.numel()] * self.size, dtype=torch.int32)
        self.record.meta_bytes = frame.numel() * self.size
        return frame.repeat(self.size).to(self.device)

    def launch(self, payload):
        return self.backend.alltoall_async(payload, self.send_splits, self.base + ".data")

    def after_launch(self):
        # The compressor's statistics wait until the bytes travel; a failure here is reported
        # like a receive failure (the peers' call is already under way).
        try:
            if self.want_stats:
                self.compressor.after_compress(self.plan, self.frame_sizes, self.tensor,
                                               codec_stats=self.codec_stats)
            else:
                self.compressor.after_compress(self.plan, self.frame_sizes, self.tensor)
            if self.reusing is not None:
                self.compressor.after_reuse(self.plan, self.reusing.shares())
        except Exception as e:
            self.late_failure = _LocalError(9, detail=f"after_compress: {type(e).__name__}: {e}")

    def complete(self, work):
        recv, recv_splits = work.wait()
        return recv, recv_splits.tolist()

    def headers(self, recv, counts):
        self.heads = chunk_header.heads_of(recv, counts)
        headers = chunk_header.parse_chunks(recv, counts, heads=self.heads)
        # The own chunk's rows never crossed a link (its frame has no segments).
        headers[self.me][ROWS] = self.rows_to[self.me]
        self.record.recv_wire_bytes = recv.numel()
        return headers

    def verify_headers(self, recv, counts):
        chunk_header.parse_chunks(recv, counts, verify=True)

    def decode(self, recv, counts, headers):
        if self.late_failure is not None:
            raise self.late_failure
        dtype, trailing = like_of(headers[0])
        rows = [h[ROWS] for h in headers]
        check_announced_output(headers, dtype, trailing)
        out = self.output_for((sum(rows), *trailing), dtype)
        starts = [sum(rows[:s]) for s in range(self.size + 1)]
        offsets = chunk_header.offsets_of(counts)
        me = self.me
        lo, hi = self.local_rows
        hvd_lossy._codec.copy_rows(out[starts[me]:starts[me + 1]], self.tensor[lo:hi].detach())
        if out.device.type == "cpu":  # one native call each side of the own rows
            for sources in (range(me), range(me + 1, self.size)):
                if sources:
                    decode_chunks(recv, [(offsets[s], counts[s], rows[s]) for s in sources],
                                  out[starts[sources[0]]:starts[sources[-1] + 1]],
                                  [headers[s][GRANK] for s in sources])
        else:  # every sender's frame in one batched decode, around the own rows
            sources = [s for s in range(self.size) if s != me]
            decode_chunks(recv, [(offsets[s], counts[s], rows[s]) for s in sources], out,
                          [headers[s][GRANK] for s in sources], [starts[s] for s in sources],
                          [self.heads[s] for s in sources])
        if self.reusing is not None:
            self.reusing.decode(recv, offsets, counts, out, starts, headers,
                                lambda h: h[REUSE])
        self.received = torch.tensor(rows, dtype=self.split_dtype)
        return out

    def _finish(self, work):
        try:
            return super()._finish(work)
        except RankError:
            # Every rank raises this call's error (or, for a frame only this rank could not
            # decode, its peers raise next call): all forget their caches, to start fresh.
            if getattr(self.compressor, "reuse", False):
                self.compressor.reuse_state().reset(self.backend.key)
            raise
        finally:
            if self.reusing is not None:
                self.reusing.done()

    def output_for(self, shape, dtype):
        """The tensor the received rows are decoded into (a subclass may hand its own)."""
        return new_output(shape, dtype, self.device)

    def result(self, output):
        return output, self.received

    def start(self):
        handle = super().start()
        # After wait(): what the call's gradient needs to travel summed by id (a reusing
        # call's; None otherwise).
        handle.call_ids = lambda: None if self.reusing is None else self.reusing.call_ids()
        return handle


def _row_bytes(tensor):
    return (tensor.numel() // max(tensor.shape[0], 1) if tensor.dim() else 1) * tensor.element_size()


def _plain_start(tensor, splits, name, compression, backend):
    return plain_start("alltoall", tensor, compression, lambda payload: backend.alltoall_async(
        payload, splits, name), local_bytes=remote_bytes(tensor, splits, backend)[1])


def start(tensor, splits=None, name=None, compression=NoneCompressor, process_set=None,
          ids=None, recv_ids=None):
    """Starts an alltoall with any compressor; returns a Handle whose wait() gives
    (output, received_splits). process_set: a Horovod ProcessSet (None: all ranks) or an
    hvd_lossy.backend backend. ids: one int64 key per row for a lossy compressor's dedup
    (hvd_lossy.compress_chunks); the plain paths do not use them."""
    backend = as_backend(process_set)
    if compression is None:
        compression = NoneCompressor
    if is_lossy(compression) and compression.auto:
        return _auto.start(
            tensor, splits, backend, compression,
            lambda: Alltoall(tensor, splits, name, compression, backend, ids, recv_ids).start(),
            lambda: start(tensor, splits, name, NoneCompressor, backend))
    if is_lossy(compression):
        return Alltoall(tensor, splits, name, compression, backend, ids, recv_ids).start()
    if compression is NoneCompressor and getattr(tensor, "dtype", None) == torch.bfloat16:
        return Alltoall(tensor, splits, name, LOSSLESS, backend).start()
    return _plain_start(tensor, splits, name, compression, backend)

