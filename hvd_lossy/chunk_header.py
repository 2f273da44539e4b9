"""One header a destination: the alltoall's protocol fields inside the destination's v2 frame.

Each destination's chunk of a lossy alltoall is ONE format-2 frame (frame.h) whose
header carries, in its extension (HL_V2_EXT, covered by the frame's CRC32C), what the
protocol header (hvd_lossy.protocol) says beyond what the frame already describes:

    uint8   flags              bit 0 FAILED, bit 1 PENDING, the others zero
    varint  grank              the sender's global rank (zigzag)
    uint32  settings           the settings digest (protocol.settings_digest), little-endian
    FAILED:  zigzag varints status, a, b, dtype   the failure found sending (protocol codes)
    PENDING: zigzag varints code, a, call         a receive failure of an earlier call

dtype, ndim and the trailing dims are the frame's, rows the sum of its segments' and the
payload the frame itself. A destination that gets no rows (and every destination after a
failure) gets a frame of no segments. So a destination's whole header is the frame's (about
20 bytes) instead of a protocol header in front of a frame header.

The extension is the same for every destination of a call, so the codec writes it into every
frame as it lays them out (hvd_lossy.compress_grouped(extension=...); the CUDA encoder sets
HeadV2::ext the same way, native/v2_frames.h). Chunks led by the older compact "H3" header
(protocol.parse_compact), which device tensors sent before the CUDA format-2 encoder, are still
read.
"""
import struct

import torch

from hvd_lossy import _codec
from hvd_lossy.protocol import (GRANK, HEADER_FIELDS, LOSSY_DTYPES, MAGIC, MAX_NDIM, PAYLOAD,
                                ROWS, _A, _B, _DIMS, _DTYPE, _LocalError, _NDIM,
                                _PENDING, _PENDING_A, _PENDING_SEQ, _SETTINGS, _STATUS,
                                _varint, parse_compact)

FAILED, PENDING = 0x01, 0x02
_V2_MAGIC = b"HV\x02"
_U32 = struct.Struct("<I")


def extension(fields):
    """The extension bytes of protocol header fields (protocol.header's list)."""
    flags = (FAILED if fields[_STATUS] else 0) | (PENDING if fields[_PENDING] else 0)
    out = bytearray([flags]) + _varint(int(fields[GRANK])) + _U32.pack(int(fields[_SETTINGS]))
    if flags & FAILED:
        for i in (_STATUS, _A, _B, _DTYPE):
            out += _varint(int(fields[i]))
    if flags & PENDING:
        for i in (_PENDING, _PENDING_A, _PENDING_SEQ):
            out += _varint(int(fields[i]))
    return bytes(out)


def block_bytes(ext):
    """Bytes the extension adds to a frame header: its length byte and itself."""
    return 1 + len(ext)


def failure_frame(tensor, fields):
    """The chunk a rank sends every destination after a failure: a frame of no segments that
    carries the fields (the frame's dtype and shape are the tensor's where it has a lossy
    dtype and a valid shape, else float32 of 1 dim; the verdict reads the failure, not them)."""
    ok = (isinstance(tensor, torch.Tensor) and tensor.dtype in LOSSY_DTYPES
          and 1 <= tensor.dim() <= MAX_NDIM)
    return _codec.empty_frame(tensor.dtype if ok else torch.float32,
                              list(tensor.shape[1:]) if ok else [], extension(fields))


class _Reader:
    def __init__(self, data, source):
        self.data, self.at, self.source = data, 0, source

    def fail(self, why):
        return _LocalError(10, self.source, detail=f"a frame extension that {why}")

    def varint(self):
        v, shift = 0, 0
        while self.at < len(self.data) and shift < 70:
            b = self.data[self.at]
            self.at += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return (v >> 1) ^ -(v & 1)
        raise self.fail("ends inside a varint")

    def u32(self):
        if len(self.data) - self.at < 4:
            raise self.fail("ends inside its settings digest")
        self.at += 4
        return _U32.unpack_from(self.data, self.at - 4)[0]


def fields_of(head, source):
    """Protocol header fields (protocol.header's list) of one chunk_heads entry: (dtype code,
    ndim, trailing, rows, frame bytes, header bytes, extension)."""
    if isinstance(head, str):
        raise _LocalError(10, source, detail=head)
    dtype, ndim, trailing, rows, total, _hlen, ext = head
    if ext is None:
        raise _LocalError(10, source, detail="a frame without the protocol's extension")
    r = _Reader(ext, source)
    flags = ext[0]
    if flags & ~(FAILED | PENDING):
        raise r.fail(f"has unknown flags {flags:#04x}")
    r.at = 1
    fields = [MAGIC] + [0] * (HEADER_FIELDS - 1)
    fields[GRANK] = r.varint()
    fields[_SETTINGS] = r.u32()
    fields[_DTYPE], fields[_NDIM], fields[ROWS], fields[PAYLOAD] = dtype, ndim, rows, total
    fields[_DIMS:] = (list(trailing) + [-1] * MAX_NDIM)[:MAX_NDIM]
    if flags & FAILED:
        for i in (_STATUS, _A, _B, _DTYPE):
            fields[i] = r.varint()
        if fields[_STATUS] == 0:
            raise r.fail("flags a failure of status 0")
    if flags & PENDING:
        for i in (_PENDING, _PENDING_A, _PENDING_SEQ):
            fields[i] = r.varint()
        if fields[_PENDING] == 0:
            raise r.fail("flags a pending failure of code 0")
    if r.at != len(ext):
        raise r.fail(f"has {len(ext) - r.at} stray bytes")
    return fields


def parse_chunks(recv, counts):
    """(header fields, header bytes before the frames) of every sender's chunk in the uint8
    tensor `recv` (chunk s: counts[s] bytes, back to back). A chunk is one v2 frame with the
    extension (its header bytes 0: the frame is the payload), or an "H3" header followed by
    frames. _LocalError 10 names the first sender whose chunk is neither."""
    host = recv if recv.device.type == "cpu" else recv.cpu()
    buf = host.numpy()
    offsets = [sum(counts[:s]) for s in range(len(counts))]
    framed = [s for s, n in enumerate(counts)
              if n >= 3 and bytes(buf[offsets[s]:offsets[s] + 3]) == _V2_MAGIC]
    heads = dict(zip(framed, _codec.chunk_heads(host, [(offsets[s], counts[s]) for s in framed])))
    headers, lens = [], []
    for s, n in enumerate(counts):
        if s in heads:
            headers.append(fields_of(heads[s], s))
            lens.append(0)
        else:  # the compact header, or foreign bytes (which it names)
            h, hlen = parse_compact(buf, offsets[s], n, s)
            if h[PAYLOAD] != n - hlen:
                raise _LocalError(10, h[GRANK], detail=f"header announces {h[PAYLOAD]} bytes, "
                                                       f"{n - hlen} arrived")
            headers.append(h)
            lens.append(hlen)
    return headers, lens


def verify_chunks(recv, counts, header_lens):
    """Checks the CRC32C of every chunk that is one frame (the others' headers have none), so
    that a verdict read from headers is never one a corrupted chunk made up: _LocalError 10
    names the first sender whose frame fails."""
    offsets = [sum(counts[:s]) for s in range(len(counts))]
    framed = [s for s, hlen in enumerate(header_lens) if hlen == 0]
    host = recv if recv.device.type == "cpu" else recv.cpu()
    for s, head in zip(framed, _codec.chunk_heads(host, [(offsets[s], counts[s]) for s in framed],
                                                   verify=True)):
        if isinstance(head, str):
            raise _LocalError(10, s, detail=head)
