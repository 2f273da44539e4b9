"""Reuse in the lossy all-to-all (issue 24, part 3): hvd_lossy.reuse's pieces for every
destination and source of one call, and the check that keeps mirrors and caches in step.

A call reuses when its compressor has `reuse=True` and it is given `ids` (the keys of the rows
sent) and `recv_ids` (the keys of the rows received, one tensor a source: the receiver predicts
from its cache by them). Per call, on every rank:

  pack     one native pass over every destination's pieces (hvd_lossy.reuse.
           encode_with_prediction): P from the mirror, the residual at the bound X gets, X^ as
           the destination will decode it, every predicted row checked against X (a
           destination whose row would miss is coded all fresh); the frames; the mirrors take
           X^ (one native store);
  header   the REUSE block of the protocol extension (hvd_lossy.chunk_header): for each peer
           the sender's check value crc32(ids sent there, seed = its mirror's digest), the
           receiver's crc32(recv_ids from there, seed = its cache's digest), and whether the
           frame to that peer predicts;
  verdict  every rank holds every rank's header, so every rank compares every pair (sender s,
           receiver d) alike (protocol.check_headers): any difference, a lost or corrupt frame
           (found one call later, when the digests differ), a call one rank made without ids
           or skipped with this compressor, a restarted rank or compressor (digest reset), a
           checkpoint resume on some ranks only, recv_ids that are not the ids sent, raises
           RankError on EVERY rank, and every rank then resets its caches (Alltoall._finish),
           so the next call starts fresh on both ends of every pair;
  decode   one native pass over every source's rows: X^ = P + R^ from the cache, which X^
           then replaces.

Caches are keyed by (process set, name, dtype, row): a compressor used at two call sites keeps
their caches apart when the calls are named; unnamed calls of one shape share them, which is
correct (both ends see the same calls in the same order), only less effective.
"""
import zlib

import numpy as np
import torch

from hvd_lossy import _codec, grad_ids, reuse
from hvd_lossy.protocol import _LocalError

MAX_PEERS = 11  # the REUSE block (8 bytes and a bit a rank) must fit the 127-byte extension


def _ids_crc(ids, seed):
    host = ids.detach().to("cpu", torch.int64).contiguous()
    return zlib.crc32(host.numpy().tobytes(), seed) & 0xFFFFFFFF


def checked_recv_ids(recv_ids, size):
    """recv_ids as a list of `size` int64 tensors (the own rank's entry is ignored)."""
    if not isinstance(recv_ids, (list, tuple)) or len(recv_ids) != size:
        got = (f"a list of {len(recv_ids)}" if isinstance(recv_ids, (list, tuple))
               else type(recv_ids).__name__)
        raise _LocalError(9, detail=f"recv_ids must be a list of {size} int64 tensors (one a "
                                    f"source rank, the keys of the rows it sends here), got "
                                    f"{got}")
    for s, ids in enumerate(recv_ids):
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 1:
            got = (f"{ids.dtype} of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor)
                   else type(ids).__name__)
            raise _LocalError(9, detail=f"recv_ids[{s}] must be a 1-D int64 tensor, got {got}")
    return list(recv_ids)


class Reusing:
    """One call's reuse, made in Alltoall.pack once the plan and the ids are known."""

    def __init__(self, call, keys, recv_ids):
        c, tensor = call.compressor, call.tensor
        size, me = call.size, call.me
        if size - 1 > MAX_PEERS:
            raise _LocalError(9, detail=f"reuse works in process sets of at most "
                                        f"{MAX_PEERS + 1} ranks (its header block must fit the "
                                        f"frame extension), this one has {size}")
        if tensor.device.type != "cpu":
            raise _LocalError(9, detail=f"reuse works on CPU tensors (its caches are host "
                                        f"memory), got one on {tensor.device}")
        self.recv_ids = checked_recv_ids(recv_ids, size)
        self.me, self.size = me, size
        key = (call.backend.key, call.name_given, str(tensor.dtype), tuple(tensor.shape[1:]))
        self.state, self.key = c.reuse_state(), key
        if key in self.state.in_flight:
            # Its receive side would check this call against caches the earlier call has not
            # updated yet: every rank refuses alike (calls are collective, in one order).
            raise _LocalError(9, detail="a reusing alltoall of this compressor and name is "
                                        "still in flight: synchronize it before starting the "
                                        "next, or give the calls different names")
        self.send, self.recv = self.state.side(key, size, tensor.shape[1], tensor.dtype)
        self.x = tensor.detach().contiguous()
        self.keys = keys.detach().to("cpu", torch.int64).contiguous()
        self.plan = call.plan
        starts = np.cumsum([0] + call.rows_to).tolist()
        self.groups = [(starts[d], starts[d + 1]) for d in range(size)]
        self.seg_rows = [[r for dest, r, _e in call.plan if dest == d] for d in range(size)]
        # Check values from the digests before this call changes them.
        self.send_check = [0 if d == me else _ids_crc(self._ids(d), self.send[d].digest)
                           for d in range(size)]
        self.recv_check = [0 if s == me else _ids_crc(self.recv_ids[s], self.recv[s].digest)
                           for s in range(size)]
        # The pieces coded against a mirror: every destination's but the own chunk's (copied)
        # and an empty chunk's (it holds nothing).
        self.pieces = reuse.Pieces()
        for d, (a, b) in enumerate(self.groups):
            if d != me and b > a:
                bounds = [e for dest, _r, e in call.plan if dest == d]
                caches = self.send[d].ensure(len(bounds), tensor.shape[1], tensor.dtype)
                self.pieces.add_group(d, a, self.seg_rows[d], bounds, caches)
        self.rel = c.mode == "rel"
        self.state.in_flight.add(key)
        self.predicted = [False] * size
        self.encoded = None
        self.recv_seg_rows = None  # per source, its frame's segment rows (decode)

    def _ids(self, d):
        a, b = self.groups[d]
        return self.keys[a:b]

    def _coded(self, d):
        a, b = self.groups[d]
        return d != self.me and b > a

    def block(self):
        """The REUSE block of this call's header (chunk_header.extension writes it)."""
        return (tuple(self.send_check), tuple(self.recv_check), tuple(self.predicted))

    def encode(self, code):
        """Runs `code(residual, plan, keys, zero) -> (send, sizes, counts)`, the frames of the
        residual rows (hvd_lossy.reuse.encode_with_prediction) with the plan's bounds the
        residuals' (absolute) ones, the rows' keys and the references' zero rows for the codec
        (or None), until the frames agree with the pass; `code` reads block() for the header.
        Returns (send, sizes)."""
        def attempt(residual, code_ebs, predicted, keys, zero):
            self.predicted = list(predicted)
            it = iter(code_ebs)
            plan = [(d, rows, next(it) if self._coded(d) else e) for d, rows, e in self.plan]
            send, sizes, counts = code(residual, plan, keys, zero)
            offsets = np.cumsum([0] + counts).tolist()
            frames = [(offsets[d], counts[d]) for d in range(self.size) if self._coded(d)]
            return (send, sizes), _codec.segments_lossless(send, frames)
        result, self.encoded = reuse.encode_with_prediction(
            self.x, self.keys, self.pieces, self.size, self.rel, attempt,
            self.state.buffers(self.key))
        return result

    def after_send(self, send, offsets, counts):
        """The mirrors take what each destination will decode, their digests the frames."""
        reuse.store(self.encoded, self.keys, self.pieces)
        for d in range(self.size):
            if d != self.me:
                self.send[d].chain(reuse.frame_crc(send[offsets[d]:offsets[d] + counts[d]]))

    def done(self):
        self.state.in_flight.discard(self.key)

    def call_ids(self):
        """Both sides' keys and segments (hvd_lossy.grad_ids), once decode() has run."""
        lo, hi = self.groups[self.me]
        received = [self.keys[lo:hi] if s == self.me else self.recv_ids[s].to("cpu", torch.int64)
                    for s in range(self.size)]
        return grad_ids.CallIds(
            sent=grad_ids.Keyed(self.keys, self.seg_rows),
            received=grad_ids.Keyed(torch.cat(received), self.recv_seg_rows), me=self.me)

    def shares(self):
        """(rows, references, residuals) of every plan frame, None for the own chunk's."""
        out, k = [], 0
        for d, rows, _e in self.plan:
            if d == self.me:
                out.append(None)
            elif self._coded(d):
                out.append((rows, self.encoded.references[k], self.encoded.residuals[k]))
                k += 1
            else:
                out.append((rows, 0, 0))
        return out

    def decode(self, recv, offsets, counts, out, starts, headers, block_of):
        """Every source's rows of `out` (decoded residuals) become X^, which the caches take:
        one native pass over all sources."""
        pieces = reuse.Pieces()
        ids = torch.zeros(out.shape[0], dtype=torch.int64)
        predicted = [0] * self.size
        seg_rows_of = [[] for _ in range(self.size)]
        for s in range(self.size):
            rows = starts[s + 1] - starts[s]
            if s == self.me or not rows:
                continue
            got = self.recv_ids[s]
            if got.numel() != rows:
                raise _LocalError(9, detail=f"recv_ids[{s}] has {got.numel()} ids, rank "
                                            f"{s} sent {rows} rows")
            ids[starts[s]:starts[s + 1]] = got
            frame = recv[offsets[s]:offsets[s] + counts[s]]
            seg_rows = seg_rows_of[s] = [g["rows"] for g in _codec.frame_info(frame)["segments"]]
            caches = self.recv[s].ensure(len(seg_rows), out.shape[1], out.dtype)
            pieces.add_group(s, starts[s], seg_rows, [0.0] * len(seg_rows), caches)
            predicted[s] = int(block_of(headers[s])[2][self.me])
        if pieces.pieces:
            reuse.apply_received(out, ids, pieces, predicted)
        self.recv_seg_rows = [self.seg_rows[s] if s == self.me else seg_rows_of[s]
                              for s in range(self.size)]
        for s in range(self.size):
            if s != self.me:
                self.recv[s].chain(reuse.frame_crc(recv[offsets[s]:offsets[s] + counts[s]]))
