"""Reuse across iterations (issue 24, part 3): prediction + residual through the unchanged codec.

For each (peer, segment) the sender keeps a *mirror* of what the receiver holds, a direct-mapped
cache of decoded rows keyed by id; the receiver keeps the *cache* it mirrors. For a row whose id
is held, the prediction P is the held row, else P = 0. The sender codes R = X - P with the
codec at the ABSOLUTE bound X itself would get; the receiver decodes R^ and forms X^ = P + R^.
A held row within the bound codes to all-zero codes (the codec takes them for one row, unread:
a reference); a drifted row codes to small codes (a residual); a new row is coded fresh.

The per-row work is one native pass over all of a call's pieces (native/cpu/reuse.h): the
sender's `_codec.reuse_encode` predicts, subtracts, quantizes and dequantizes R with the codec's own
kernels (so R^ is bit for bit what the receiver decodes, without decoding the frame), forms X^
with the function the receiver's `_codec.reuse_apply` uses, and checks every element of a predicted
row against X in the same sweep.

Why the bound stays strict: a peer with a predicted row whose X^ would miss the bound is coded
fresh (P = 0) instead, so float rounding in P + R^ can never push a row out; fresh rows are the
codec's own rows, bounded as today. The frames are the codec's: a segment it stores losslessly
(R^ = R) is read back from the frame header and the pass rerun for it (encode_with_prediction).

Why mirror and cache stay identical: whatever is decoded replaces the held copy on both sides,
with one deterministic replacement rule (the last row of a call on a slot wins), and each side
chains a digest over the CRCs of the frames it applied (`PeerCaches.chain`); the transport
compares the digests in every call (hvd_lossy.alltoall), so divergence is detected, never
decoded.

The pieces here know no transport: `ReuseEncoder` / `ReuseDecoder` are the codec-level pair for
one peer (what tests and benchmarks drive); hvd_lossy.alltoall uses the same pieces for every
destination of one call. Reuse works on CPU tensors (its caches are host memory).
"""
import mmap
import struct
import zlib

import torch

from hvd_lossy import _codec, _decode

DEFAULT_MEMORY_BYTES = 256 << 20
# A cache slot is one record (native/cpu/reuse.h Cache): int64 tag at byte 0, valid byte at 8,
# the row's largest magnitude at 12, the row at _RECORD_HEAD, the whole rounded up to 8 bytes so
# that every record's tag is aligned.
_RECORD_HEAD = 16


def record_bytes(row_len, dtype):
    """Bytes of one cache slot's record for rows of row_len `dtype` elements."""
    return -(-(_RECORD_HEAD + row_len * dtype.itemsize) // 8) * 8


def absolute_bound(x, error_bound, mode="rel"):
    """The absolute bound the codec gives segment `x` for `error_bound` in `mode`, as its frame
    stores it: asked of the codec (a frame of x), so the rule stays written once, natively.
    For checks in tests and benchmarks; the reuse pass computes its bounds itself."""
    return _codec.frame_info(_codec.compress(x.contiguous(), error_bound, mode=mode))["eb_abs"]


_HUGE_PAGE = 2 << 20


def zeroed_records(nbytes):
    """nbytes of zeros for cache records, on transparent huge pages where the system gives them:
    lookups are random reads all over the caches (hundreds of MiB), so with 4 KiB pages nearly
    every one also misses the TLB; 2 MiB pages cut the reuse pass's time by about a third. An
    anonymous mapping 2 MiB longer than asked, cut at a 2 MiB boundary (the slack is never
    touched, so it costs address space only); the kernel zeroes pages on first touch."""
    area = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            area.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP off or unsupported: 4 KiB pages, the same records
            pass
    whole = torch.frombuffer(area, dtype=torch.uint8)  # keeps the mapping alive
    start = -whole.data_ptr() % _HUGE_PAGE
    return whole[start:start + nbytes]


def capacity_for(memory_bytes, peers, segments, row_len, dtype):
    """Slots of each (peer, segment) cache so that a rank's mirrors (as a sender) and caches (as
    a receiver) together stay under `memory_bytes`: half each, shared by `peers` x `segments`.
    Both ends of a pair compute it from what they share (the settings, the process set's size,
    the chunk's segments and row), so their caches have the same slots."""
    per_row = record_bytes(row_len, dtype)
    return max(1, int(memory_bytes) // (2 * max(peers, 1) * max(segments, 1) * per_row))


def frame_crc(frame):
    """The CRC32C a frame carries at bytes [3, 7) (frame.h): it covers the whole frame."""
    return int.from_bytes(bytes(frame[3:7].cpu().tolist()), "little")


class DirectMappedCache:
    """Decoded rows of one (peer, segment) by id: slot = hash(id) mod capacity (native
    reuse.h slot_of), each slot one record of its tag, valid flag and row (host memory the native
    passes read and write); tags, valid and rows are views of the records. Fixed memory whatever
    the ids."""

    def __init__(self, capacity, row_len, dtype):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
        self.capacity = int(capacity)
        self.stride = record_bytes(row_len, dtype)
        self.records = zeroed_records(capacity * self.stride).view(capacity, self.stride)
        self.tags = self.records[:, :8].view(torch.int64).view(capacity)
        self.valid = self.records[:, 8].view(torch.bool)
        row_bytes = row_len * dtype.itemsize
        self.rows = self.records[:, _RECORD_HEAD:_RECORD_HEAD + row_bytes].view(dtype)

    def nbytes(self):
        return self.records.numel()

    def slot(self, id_):
        return _codec.reuse_slot(int(id_), self.capacity)

    def arg(self):
        """The cache as the native passes take it."""
        return (self.records.data_ptr(), self.capacity, self.stride)


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

    def ensure(self, segments, row_len, dtype):
        """The caches of a call with `segments` segments of rows of row_len `dtype` elements."""
        geometry = (segments, row_len, str(dtype))
        if self.caches is None:
            capacity = self._capacity_of(segments)
            self.caches = [DirectMappedCache(capacity, row_len, dtype) for _ in range(segments)]
            self.geometry = geometry
            # folded in, not restarted: frames of no rows may have been chained before
            self.digest = zlib.crc32(repr((capacity,) + geometry).encode(), self.digest)
        elif geometry != self.geometry:
            raise ValueError(f"reuse caches were made for (segments, row_len, dtype) = "
                             f"{self.geometry}, this call has {geometry}; use another name "
                             f"or compressor for a second call site")
        return self.caches

    def nbytes(self):
        return sum(c.nbytes() for c in self.caches or ())

    def chain(self, crc):
        self.digest = zlib.crc32(struct.pack("<I", crc), self.digest)


class Pieces:
    """A call's pieces as the native passes take them: for each group (peer) with rows, its
    segments' row ranges of the call's tensor, each with its peer's cache of that segment."""

    def __init__(self):
        self.pieces, self.caches = [], []

    def add_group(self, group, start, seg_rows, eb_params, caches):
        for rows, eb, cache in zip(seg_rows, eb_params, caches):
            self.pieces.append([start, rows, group, len(self.caches), float(eb), False])
            self.caches.append(cache.arg())
            start += rows

    def set_lossless(self, flags):
        changed = False
        for p, flag in zip(self.pieces, flags):
            changed |= p[5] != flag
            p[5] = flag
        return changed

    def args(self):
        return [tuple(p) for p in self.pieces]


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
        self._buffers = {}  # key -> PassBuffers of its sender's pass

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

    def buffers(self, key):
        """The PassBuffers of call site `key` (its calls run one at a time: in_flight)."""
        return self._buffers.setdefault(key, PassBuffers())

    def reset(self, process_set):
        """Forgets every mirror and cache of the process set: both ends of every pair do this
        when a call raises, so they start fresh together."""
        for key in [k for k in self._sides if k[0] == process_set]:
            del self._sides[key]

    def nbytes(self):
        return sum(p.nbytes() for send, recv in self._sides.values()
                   for peers in (send, recv) for p in peers.values())


class PassBuffers:
    """The sender's pass's residual and X^ tensors, kept from call to call (a call site's
    calls run one at a time: ReuseState.in_flight): fresh ones, megabytes each, were faulted in
    page by page every call (about 1,100 faults, the most of a d128 call of 6,656 rows)."""

    def __init__(self):
        self._flat = None

    def pair(self, x):
        """(residual, x_hat) shaped like x."""
        n = x.numel()
        if self._flat is None or self._flat[0].numel() < n or self._flat[0].dtype != x.dtype:
            self._flat = tuple(torch.empty(n, dtype=x.dtype) for _ in range(2))
        return tuple(f[:n].view(x.shape) for f in self._flat)


class Encoded:
    """What the sender's pass made of a call: X^ of every piece's rows as the peers will
    decode them (but for rows that decode to their held row's bits, which x_hat leaves as it
    was), the pass's hit byte a row (which rows those are: store leaves their records alone),
    whether each group's frame predicts, and each piece's references and residuals (predicted
    rows decoded to the held row itself, and to a corrected one)."""

    def __init__(self, x_hat, hit, predicted, references, residuals):
        self.x_hat, self.hit, self.predicted = x_hat, hit, predicted
        self.references, self.residuals = references, residuals


# The native pass's hit byte of a reference (reuse.h kHitReference): a held row whose residual
# it wrote as +0.0 without quantizing it. A held row the full sweep settled (kHitHeld) keeps a
# residual of its own and is coded as any other row.
_HIT_REFERENCE = 3


def zero_rows(hit):
    """The codec's `_zero_rows` of a call (one byte a row, nonzero for a reference): it takes
    all of a piece's references for one row of zeros without reading or numbering them (a
    d128 call of references compared 512 bytes a row with the first, its slowest part)."""
    return (hit == _HIT_REFERENCE).view(torch.uint8)


def encode_with_prediction(x, ids, pieces, groups, rel, code, buffers=None):
    """Codes x (a CPU tensor, one int64 id a row) against its prediction: `code(residual,
    code_bounds, predicted, ids, zero)` codes the residual rows of the pieces (their absolute
    bounds in piece order, predicted[g] whether group g's frame predicts, the rows' ids for the
    codec's dedup and its `_zero_rows`, zero_rows(hit), or None without references) and returns
    (result, the frames' lossless flags a piece, as the codec chose them). The native pass is
    rerun with those flags (R^ = R there) and, if it then sends a group fresh, the residual
    re-coded; groups only ever go from predicted to fresh, so this ends. Returns (result,
    Encoded); the caches are not changed (store, once the frames are sent). `buffers`: a
    PassBuffers the residual and X^ are made in (else fresh tensors); the Encoded's X^ is then
    valid until the next call with them."""
    residual, x_hat = (buffers or PassBuffers()).pair(x)
    hit = torch.zeros(x.shape[0], dtype=torch.uint8)
    allow, coded_for, result, flags = [1] * groups, None, None, None
    while True:
        _ebs, code_ebs, refs, resids, predicted = _codec.reuse_encode(
            x.data_ptr(), _codec._dtype_code(x), ids.data_ptr(), x.shape[0], _row_len(x), rel,
            pieces.args(), pieces.caches, allow, residual.data_ptr(), x_hat.data_ptr(),
            hit.data_ptr())
        predicted = [bool(p) for p in predicted]
        if predicted != coded_for:
            zero = zero_rows(hit) if any(refs) else None  # (refs: held rows a piece)
            result, flags = code(residual, code_ebs, predicted, ids, zero)
            coded_for = predicted
        if not pieces.set_lossless(flags):
            return result, Encoded(x_hat, hit, predicted, refs, resids)
        allow = [int(p) for p in predicted]


def store(encoded, ids, pieces):
    """The rows the peers decode (an Encoded's) replace what the sender's mirrors hold."""
    x_hat = encoded.x_hat
    _codec.reuse_store(x_hat.data_ptr(), _codec._dtype_code(x_hat), ids.data_ptr(), x_hat.shape[0],
                       _row_len(x_hat), pieces.args(), pieces.caches, encoded.hit.data_ptr())


def apply_received(rows, ids, pieces, predicted):
    """The receiver's half: `rows` (CPU, the decoded residuals of every piece) become X^ in
    place, which then replaces what the caches hold."""
    _codec.reuse_apply(rows.data_ptr(), _codec._dtype_code(rows), ids.data_ptr(), rows.shape[0],
                   _row_len(rows), pieces.args(), pieces.caches, [int(p) for p in predicted])


def _row_len(x):
    return x.shape[1] if x.dim() > 1 else 1


def checked_ids(ids, rows):
    ids = ids.detach()
    if ids.dtype != torch.int64 or ids.dim() != 1 or ids.numel() != rows:
        raise ValueError(f"ids must be a 1-D int64 tensor of {rows} keys (one a row), got "
                         f"{ids.dtype} of shape {tuple(ids.shape)}")
    return ids.to("cpu").contiguous()


class ReuseEncoder:
    """The sender's end for one peer: one frame a call (a segment a table, compress_chunks)
    whose segments are residuals against the mirror.

    Arguments:
        error_bound, mode, level: as for hvd_lossy.compress_chunks; a segment's residual is
            coded within the absolute bound the segment of X itself would get.
        capacity: slots of each segment's cache.
    """

    def __init__(self, error_bound, mode="rel", level=1, capacity=1 << 16):
        if mode not in ("rel", "abs"):
            raise ValueError(f"mode must be 'rel' or 'abs', got {mode!r}")
        self.error_bound, self.mode, self.level = error_bound, mode, level
        self.peer = PeerCaches(lambda segments: capacity)
        self.buffers = PassBuffers()
        self.last = {}  # what the last call sent: rows, references, residuals, fresh

    @property
    def digest(self):
        return self.peer.digest

    def encode(self, x, ids, seg_rows):
        """(frame, predicted) of x (a CPU tensor, segments of seg_rows rows, one id a row) for
        the peer, which decodes it with ReuseDecoder.decode(frame, ids, predicted); the mirror
        then holds what the peer decodes."""
        seg_rows = [int(r) for r in seg_rows]
        x = x.contiguous()
        ids = checked_ids(ids, x.shape[0])
        pieces = Pieces()
        caches = self.peer.ensure(len(seg_rows), _row_len(x), x.dtype)
        pieces.add_group(0, 0, seg_rows, [self.error_bound] * len(seg_rows), caches)

        def code(residual, code_ebs, _predicted, keys, zero):
            frame, _ = _codec.compress_chunks(residual, seg_rows, code_ebs, mode="abs",
                                              level=self.level, ids=keys, _zero_rows=zero)
            return frame, _codec.segments_lossless(frame, [(0, frame.numel())])

        frame, enc = encode_with_prediction(x, ids, pieces, 1, self.mode == "rel", code,
                                            self.buffers)
        refs, resids = sum(enc.references), sum(enc.residuals)
        self.last = {"rows": x.shape[0], "references": refs, "residuals": resids,
                     "fresh": x.shape[0] - refs - resids}
        store(enc, ids, pieces)
        self.peer.chain(frame_crc(frame))
        return frame, enc.predicted[0]

    def nbytes(self):
        return self.peer.nbytes()


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
        rows = sum(seg_rows)
        x_hat = _decode.decompress(frame).reshape(rows, -1).contiguous()
        if rows:
            ids = checked_ids(ids, rows)
            pieces = Pieces()
            caches = self.peer.ensure(len(seg_rows), x_hat.shape[1], x_hat.dtype)
            pieces.add_group(0, 0, seg_rows, [0.0] * len(seg_rows), caches)
            apply_received(x_hat, ids, pieces, [predicted])
        self.peer.chain(frame_crc(frame))
        return x_hat

    def nbytes(self):
        return self.peer.nbytes()
