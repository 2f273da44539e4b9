"""Reuse in the lossy all-to-all (issue 24, part 3): hvd_lossy.reuse's pieces for every
destination and source of one call, and the check that keeps mirrors and caches in step.

A call reuses when its compressor has `reuse=True` and it is given `ids` (the keys of the rows
sent) and `recv_ids` (the keys of the rows received, one tensor a source: the receiver predicts
from its cache by them). Per call, on every rank:

  pack     for each destination: P and hit from the mirror, the residual at the bound X gets
           (hvd_lossy.reuse.encode_with_prediction: every predicted row checked against X^,
           a destination whose row would miss is re-sent all fresh), the mirror updated;
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
  decode   for each source: X^ = P + R^ from the cache, which X^ then replaces.

Caches are keyed by (process set, name, dtype, row): a compressor used at two call sites keeps
their caches apart when the calls are named; unnamed calls of one shape share them, which is
correct (both ends see the same calls in the same order), only less effective.
"""
import zlib

import numpy as np
import torch

from hvd_lossy import _codec, reuse
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
        self.x, self.keys = tensor.detach(), keys
        starts = np.cumsum([0] + call.rows_to).tolist()
        self.groups = [(starts[d], starts[d + 1]) for d in range(size)]
        self.seg_rows = [[r for dest, r, _e in call.plan if dest == d] for d in range(size)]
        bounds = [[e for dest, _r, e in call.plan if dest == d] for d in range(size)]
        # Check values from the digests before this call changes them.
        self.send_check = [0 if d == me else _ids_crc(self._ids(d), self.send[d].digest)
                           for d in range(size)]
        self.recv_check = [0 if s == me else _ids_crc(self.recv_ids[s], self.recv[s].digest)
                           for s in range(size)]
        parts = [self._predict(d, c.mode, bounds[d]) for d in range(size)]
        self.state.in_flight.add(key)
        self.prediction = torch.cat([p for p, _h, _e, _c in parts])
        self.hit = torch.cat([h for _p, h, _e, _c in parts])
        self.eb_rows = torch.cat([e for _p, _h, e, _c in parts])
        self.code_bounds = [eb for _p, _h, _e, ebs in parts for eb in ebs]
        self.predicted = [False] * size
        self.x_hat = None

    def _ids(self, d):
        a, b = self.groups[d]
        return self.keys[a:b]

    def _predict(self, d, mode, bounds):
        a, b = self.groups[d]
        x, rows = self.x[a:b], self.seg_rows[d]
        ebs, eb_rows = reuse.segment_bounds(x, rows, bounds, mode)
        if d == self.me or b == a:  # the own chunk is copied; an empty one holds nothing
            return torch.zeros_like(x), torch.zeros(b - a, dtype=torch.bool), eb_rows, ebs
        prediction, hit = self.send[d].predict(x, self._ids(d), rows)
        return prediction, hit.cpu(), eb_rows, reuse.residual_bounds(x, prediction, rows, ebs)

    def block(self):
        """The REUSE block of this call's header (chunk_header.extension writes it)."""
        return (tuple(self.send_check), tuple(self.recv_check), tuple(self.predicted))

    def encode(self, code):
        """Runs `code(residual) -> (result, decoded residual, as the peers decode it)` until
        every predicted row is within its bound (hvd_lossy.reuse.encode_with_prediction), then
        updates the mirrors; `code` reads block() for the header. Returns the result."""
        def attempt(residual, predicted):
            self.predicted = list(predicted)
            return code(residual)
        hit = self.hit.to(self.x.device)
        result, self.x_hat, self.predicted = reuse.encode_with_prediction(
            self.x, self.prediction, hit, self.eb_rows, self.groups, attempt)
        self.sent_hit = hit.clone()
        for d, (a, b) in enumerate(self.groups):
            if not self.predicted[d]:
                self.sent_hit[a:b] = False
        return result

    def after_send(self, send, offsets, counts):
        """The mirrors take what each destination will decode, their digests the frames."""
        for d, (a, b) in enumerate(self.groups):
            if d == self.me:
                continue
            if b > a:
                self.send[d].store(self._ids(d), self.x_hat[a:b], self.seg_rows[d])
            self.send[d].chain(reuse.frame_crc(send[offsets[d]:offsets[d] + counts[d]]))

    def done(self):
        self.state.in_flight.discard(self.key)

    def shares(self):
        """(rows, references, residuals) of every plan frame, None for the own chunk's."""
        out = []
        for d, (a, _b) in enumerate(self.groups):
            at = a
            for rows in self.seg_rows[d]:
                if d == self.me:
                    out.append(None)
                else:
                    t = reuse.tally(self.sent_hit[at:at + rows], self.x_hat[at:at + rows],
                                    self.prediction[at:at + rows])
                    out.append((rows, t["references"], t["residuals"]))
                at += rows
        return out

    def decode(self, recv, offsets, counts, out, starts, headers, block_of):
        """Every source's rows of `out` (decoded residuals) become X^, which the caches take."""
        for s in range(self.size):
            if s == self.me:
                continue
            frame = recv[offsets[s]:offsets[s] + counts[s]]
            rows = out[starts[s]:starts[s + 1]]
            if rows.shape[0]:
                ids = self.recv_ids[s].to(rows.device)
                if ids.numel() != rows.shape[0]:
                    raise _LocalError(9, detail=f"recv_ids[{s}] has {ids.numel()} ids, rank "
                                                f"{s} sent {rows.shape[0]} rows")
                seg_rows = [g["rows"] for g in _codec.frame_info(frame)["segments"]]
                predicted = block_of(headers[s])[2][self.me]
                rows.copy_(reuse.apply_received(self.recv[s], rows, ids, seg_rows, predicted))
            self.recv[s].chain(reuse.frame_crc(frame))
