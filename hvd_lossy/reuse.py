"""Reuse across iterations (issue 24, part 3): prediction + residual through the unchanged codec.

For each (peer, segment) the sender keeps a *mirror* of what the receiver holds, a direct-mapped
cache of decoded rows keyed by id; the receiver keeps the *cache* it mirrors. For a row whose id
is held, the prediction P is the held row, else P = 0. The sender codes R = X - P with the
codec at the ABSOLUTE bound X itself would get; the receiver decodes R^ and forms X^ = P + R^.
A held row within the bound codes to all-zero codes (the codec's dedup folds them into one row:
a reference); a drifted row codes to small codes (a residual); a new row is coded fresh.

Why the bound stays strict: the sender reconstructs X^ exactly as the receiver does (it decodes
its own frame and adds P with the one function both sides use, `reconstruct`) and re-sends fresh
(P = 0) every predicted row with an element outside the bound, so float rounding in P + R^ can
never push a row out. Fresh rows are the codec's own rows, bounded as today.

Why mirror and cache stay identical: whatever is decoded replaces the held copy on both sides,
with one deterministic replacement rule (`DirectMappedCache.store`), and each side chains a
digest over the CRCs of the frames it applied (`PeerCaches.chain`); the transport compares the
digests in every call (hvd_lossy.alltoall), so divergence is detected, never decoded.

The pieces here know no transport: `ReuseEncoder` / `ReuseDecoder` are the codec-level pair for
one peer (what tests and benchmarks drive); hvd_lossy.alltoall uses the same pieces for every
destination of one call.
"""
import struct
import zlib

import numpy as np
import torch

from hvd_lossy import _codec, _decode

DEFAULT_MEMORY_BYTES = 256 << 20
_TAG_BYTES = 9  # a cache slot's int64 tag and its valid flag
# An odd 64-bit multiplier (2^64 / golden ratio, as int64): spreads consecutive ids over slots.
_HASH_MULTIPLIER = -7046029254386353131


def stored_bound(eb):
    """The bound a frame stores for a wanted absolute bound `eb` (frame.h hl_bound_code: the
    largest float32 <= eb whose low 8 significand bits are zero), as a float. Coding a residual
    with exactly this bound gives it the bound X itself gets in its own frame."""
    if not eb > 0:
        return 0.0
    f = np.float32(min(eb, 3.4028234e38))
    if float(f) > eb:
        f = np.nextafter(f, np.float32(0))
    bits = np.array([f], dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFFF00)
    return float(bits.view(np.float32)[0])


def absolute_bound(x, error_bound, mode):
    """The absolute bound the codec gives segment `x` for `error_bound` in `mode` ("rel": a
    fraction of x's finite range, as native absolute_bound computes it), as stored."""
    if mode == "abs":
        return stored_bound(float(error_bound))
    if mode != "rel":
        raise ValueError(f"mode must be 'rel' or 'abs', got {mode!r}")
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return 0.0
    lo, hi = float(finite.min()), float(finite.max())
    return stored_bound(float(error_bound) * (hi - lo) if hi > lo else 0.0)


def capacity_for(memory_bytes, peers, segments, row_len, dtype):
    """Slots of each (peer, segment) cache so that a rank's mirrors (as a sender) and caches (as
    a receiver) together stay under `memory_bytes`: half each, shared by `peers` x `segments`.
    Both ends of a pair compute it from what they share (the settings, the process set's size,
    the chunk's segments and row), so their caches have the same slots."""
    per_row = row_len * dtype.itemsize + _TAG_BYTES
    return max(1, int(memory_bytes) // (2 * max(peers, 1) * max(segments, 1) * per_row))


def reconstruct(prediction, hit, decoded):
    """X^ of every row: P + R^ where the row was predicted, R^ itself where it was coded fresh.
    The sender and the receiver both call this, so X^ is the same bits on both."""
    return torch.where(hit.unsqueeze(1), prediction + decoded, decoded)


def rows_within(x_hat, x, eb_rows):
    """Per row: whether every element of x_hat is within its row's bound of x (float64, as the
    codec checks; NaN and Inf never pass, so such rows go fresh, where the codec keeps them)."""
    err = (x_hat.double() - x.double()).abs()
    return (err <= eb_rows.to(err.device, torch.float64).unsqueeze(1)).all(1)


def frame_crc(frame):
    """The CRC32C a frame carries at bytes [3, 7) (frame.h): it covers the whole frame."""
    return int.from_bytes(bytes(frame[3:7].cpu().tolist()), "little")


class DirectMappedCache:
    """Decoded rows of one (peer, segment) by id: slot = hash(id) mod capacity, a tag array of
    ids and a [capacity, row_len] row array. Fixed memory whatever the ids."""

    def __init__(self, capacity, row_len, dtype, device):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
        self.capacity = int(capacity)
        self.tags = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.valid = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.rows = torch.zeros(capacity, row_len, dtype=dtype, device=device)

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.tags, self.valid, self.rows))

    def slots(self, ids):
        h = ids * _HASH_MULTIPLIER  # wraps mod 2^64 alike on every device
        h = h ^ (h >> 29)
        return torch.remainder(h, self.capacity)

    def predict(self, ids):
        """(P, hit): the held row of each id (zeros where not held) and whether it was held."""
        slots = self.slots(ids)
        held = self.rows[slots]
        # A held row with NaN or Inf predicts nothing: X - Inf and Inf + R^ lose X.
        hit = self.valid[slots] & (self.tags[slots] == ids) & torch.isfinite(held).all(1)
        prediction = torch.where(hit.unsqueeze(1), held, 0)
        return prediction, hit

    def store(self, ids, rows):
        """The decoded rows replace the held ones. Rows of one call that share a slot (equal
        ids, or a collision) resolve by one rule, the last such row wins, found with
        scatter_reduce first: index_put_ with repeated indices leaves the winner unspecified."""
        if ids.numel() == 0:
            return
        slots = self.slots(ids)
        uniq, inverse = torch.unique(slots, return_inverse=True)
        order = torch.arange(ids.numel(), device=ids.device)
        last = torch.full((uniq.numel(),), -1, dtype=torch.int64, device=ids.device)
        last = last.scatter_reduce(0, inverse, order, "amax")
        self.tags[uniq] = ids[last]
        self.valid[uniq] = True
        self.rows[uniq] = rows[last].to(self.rows.dtype)


class PeerCaches:
    """Everything one side holds for one peer: a cache a segment, made at the first call with
    rows (all later calls must have the same segments, row and dtype), and the chained digest
    of the frames applied, d_{k+1} = crc32(CRC of frame k, seed d_k). The caches' geometry is
    folded into the digest when they are made, so two ends that sized them differently
    disagree from that call on."""

    def __init__(self, capacity_of):
        self._capacity_of = capacity_of  # segments -> slots of each segment's cache
        self.caches = None
        self.geometry = None
        self.digest = 0

    def _ensure(self, segments, row_len, dtype, device):
        geometry = (segments, row_len, str(dtype))
        if self.caches is None:
            capacity = self._capacity_of(segments)
            self.caches = [DirectMappedCache(capacity, row_len, dtype, device)
                           for _ in range(segments)]
            self.geometry = geometry
            # folded in, not restarted: frames of no rows may have been chained before
            self.digest = zlib.crc32(repr((capacity,) + geometry).encode(), self.digest)
        elif geometry != self.geometry:
            raise ValueError(f"reuse caches were made for (segments, row_len, dtype) = "
                             f"{self.geometry}, this call has {geometry}; use another name "
                             f"or compressor for a second call site")

    def nbytes(self):
        return sum(c.nbytes() for c in self.caches or ())

    def predict(self, x, ids, seg_rows):
        """(P, hit) of the rows of x (segments of seg_rows rows back to back)."""
        self._ensure(len(seg_rows), x.shape[1], x.dtype, x.device)
        parts = [c.predict(i) for c, i in zip(self.caches, ids.split(seg_rows))]
        if not parts:
            return torch.zeros_like(x), torch.zeros(0, dtype=torch.bool, device=x.device)
        return torch.cat([p for p, _ in parts]), torch.cat([h for _, h in parts])

    def store(self, ids, rows, seg_rows):
        for c, i, r in zip(self.caches or (), ids.split(seg_rows), rows.split(seg_rows)):
            c.store(i, r)

    def chain(self, crc):
        self.digest = zlib.crc32(struct.pack("<I", crc), self.digest)


class ReuseState:
    """A compressor's reuse memory on this rank: mirrors (as a sender) and caches (as a
    receiver) per key (process set first) and peer. The cap holds for each process set: its
    call sites (keys) share it equally. A new call site on a process set drops the caches of
    the others there, which then come back smaller; every rank of the set sees the same calls
    in the same order, so every rank does this at the same call and the ends stay in step."""

    def __init__(self, memory_bytes):
        self.memory_bytes = memory_bytes
        self._sides = {}  # key -> (send: {peer: PeerCaches}, recv: {peer: PeerCaches})
        self._sites = {}  # process set -> keys seen there
        self.in_flight = set()  # keys of calls packed and not yet decoded

    def side(self, key, size, row_len, dtype):
        sites = self._sites.setdefault(key[0], set())
        if key not in sites:
            sites.add(key)
            self.reset(key[0])
        if key not in self._sides:
            budget = self.memory_bytes // len(sites)

            def capacity_of(segments):
                return capacity_for(budget, size, segments, row_len, dtype)
            self._sides[key] = tuple({p: PeerCaches(capacity_of) for p in range(size)}
                                     for _ in range(2))
        return self._sides[key]

    def reset(self, process_set):
        """Forgets every mirror and cache of the process set: both ends of every pair do this
        when a call raises, so they start fresh together."""
        for key in [k for k in self._sides if k[0] == process_set]:
            del self._sides[key]

    def nbytes(self):
        return sum(p.nbytes() for send, recv in self._sides.values()
                   for peers in (send, recv) for p in peers.values())


def segment_bounds(x, seg_rows, error_bounds, mode):
    """(absolute bound a segment, the same repeated a row) for segments of seg_rows rows."""
    ebs = [absolute_bound(part, eb, mode) for part, eb in zip(x.split(seg_rows), error_bounds)]
    return ebs, _per_row(ebs, seg_rows)


def _per_row(values, seg_rows):
    return torch.repeat_interleave(torch.tensor(values, dtype=torch.float64),
                                   torch.tensor(seg_rows, dtype=torch.int64))


def residual_bounds(x, prediction, seg_rows, ebs):
    """The bound each segment's residual is coded at: X's own, less a slack for the two float
    roundings between X and X^ (X - P, then P + R^), so that a predicted row misses the bound
    only in pathological cases (which encode_with_prediction then sends fresh). Any bound up to
    X's is valid: the receiver only decodes."""
    eps = torch.finfo(x.dtype).eps
    out = []
    for xs, ps, eb in zip(x.split(seg_rows), prediction.split(seg_rows), ebs):
        scale = max(_finite_abs_max(xs), _finite_abs_max(ps))
        tighter = eb - 4 * eps * scale
        out.append(stored_bound(tighter) if tighter > 0 else eb)
    return out


def _finite_abs_max(t):
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def encode_with_prediction(x, prediction, hit, eb_rows, groups, code):
    """Codes x against its prediction: `code(residual, predicted) -> (result, decoded
    residual)`, where `groups` are the (start, stop) row ranges of the frames and predicted[g]
    says whether group g's held rows are predicted. A group with a predicted row that would
    reconstruct outside its bound is re-sent all fresh (the receiver learns it from
    `predicted`), so every row of X^ is within the bound. Returns (result, X^, predicted)."""
    predicted = [bool(hit[a:b].any()) for a, b in groups]
    while True:
        hit_now = hit.clone()
        for (a, b), on in zip(groups, predicted):
            if not on:
                hit_now[a:b] = False
        residual = torch.where(hit_now.unsqueeze(1), x - prediction, x)
        result, decoded = code(residual, predicted)
        x_hat = reconstruct(prediction, hit_now, decoded)
        ok = rows_within(x_hat, x, eb_rows) | ~hit_now
        missed = [on and not bool(ok[a:b].all()) for (a, b), on in zip(groups, predicted)]
        if not any(missed):
            return result, x_hat, predicted
        predicted = [on and not m for on, m in zip(predicted, missed)]


class ReuseEncoder:
    """The sender's end for one peer: one frame a call (a segment a table, compress_chunks)
    whose segments are residuals against the mirror.

    Arguments:
        error_bound, mode, level: as for hvd_lossy.compress_chunks; a segment's residual is
            coded within the absolute bound the segment of X itself would get.
        capacity: slots of each segment's cache.
    """

    def __init__(self, error_bound, mode="rel", level=1, capacity=1 << 16):
        self.error_bound, self.mode, self.level = error_bound, mode, level
        self.peer = PeerCaches(lambda segments: capacity)
        self.last = {}  # what the last call sent: rows, references, residuals, fresh

    @property
    def digest(self):
        return self.peer.digest

    def encode(self, x, ids, seg_rows):
        """(frame, predicted) of x (segments of seg_rows rows, one id a row) for the peer, which
        decodes it with ReuseDecoder.decode(frame, ids, predicted); the mirror then holds what
        the peer decodes."""
        seg_rows = [int(r) for r in seg_rows]
        ebs, eb_rows = segment_bounds(x, seg_rows, [self.error_bound] * len(seg_rows), self.mode)
        prediction, hit = self.peer.predict(x, ids, seg_rows)
        code_ebs = residual_bounds(x, prediction, seg_rows, ebs)

        def code(residual, _predicted):
            frame, _ = _codec.compress_chunks(residual.contiguous(), seg_rows, code_ebs,
                                              mode="abs", level=self.level, ids=ids)
            return frame, _decode.decompress(frame).reshape(x.shape)

        frame, x_hat, (predicted,) = encode_with_prediction(
            x, prediction, hit, eb_rows, [(0, x.shape[0])], code)
        self.last = tally(hit if predicted else hit & False, x_hat, prediction)
        self.peer.store(ids, x_hat, seg_rows)
        self.peer.chain(frame_crc(frame))
        return frame, predicted

    def nbytes(self):
        return self.peer.nbytes()


def tally(hit, x_hat, prediction):
    """Rows of a call by kind: references (predicted, decoded to the held row itself),
    residuals (predicted, the held row corrected) and fresh."""
    refs = int((hit & (x_hat == prediction).all(1)).sum())
    return {"rows": int(hit.numel()), "references": refs, "residuals": int(hit.sum()) - refs,
            "fresh": int((~hit).sum())}


class ReuseDecoder:
    """The receiver's end for one peer: decodes ReuseEncoder's frames against its cache."""

    def __init__(self, capacity=1 << 16):
        self.peer = PeerCaches(lambda segments: capacity)

    @property
    def digest(self):
        return self.peer.digest

    def decode(self, frame, ids, predicted=True):
        info = _codec.frame_info(frame)
        seg_rows = [s["rows"] for s in info["segments"]]
        decoded = _decode.decompress(frame).reshape(sum(seg_rows), -1)
        x_hat = apply_received(self.peer, decoded, ids, seg_rows, predicted)
        self.peer.chain(frame_crc(frame))
        return x_hat

    def nbytes(self):
        return self.peer.nbytes()


def apply_received(peer, decoded, ids, seg_rows, predicted):
    """X^ of a received chunk (decoded residuals, segments of seg_rows rows), which then
    replaces what `peer` holds: the receiver's half of encode_with_prediction."""
    prediction, hit = peer.predict(decoded, ids, seg_rows)
    if not predicted:
        hit = torch.zeros_like(hit)
    x_hat = reconstruct(prediction, hit, decoded)
    peer.store(ids, x_hat, seg_rows)
    return x_hat
