"""The protocol header of hvd_lossy's collectives: its fields inside a format-2 frame's header.

Every chunk a rank sends in a lossy collective (one a destination of an alltoall, one a rank
of an allgather and of broadcast's header round) is ONE format-2 frame (frame.h) whose header
carries, in its extension (HL_FRAME_EXT, covered by the frame's CRC32C), what the protocol
(hvd_lossy.protocol) says beyond what the frame already describes:

    uint8   flags              bit 0 FAILED, bit 1 PENDING, bit 2 SIZED, bit 3 REUSE, the
                               others zero
    varint  grank              the sender's global rank (zigzag)
    uint32  settings           the settings digest (protocol.settings_digest), little-endian
    FAILED:  zigzag varints status, a, b, dtype   the failure found sending (protocol codes)
    PENDING: zigzag varints code, a, call         a receive failure of an earlier call
    SIZED:   zigzag varints ndim, rows, payload   the tensor and frame bytes of a frame that
                                                  travels apart (broadcast's payload round)
    REUSE:   varint n, then uint32 sent[n], uint32 received[n], uint8 predicts[ceil(n / 8)]
             a reusing alltoall's check values (hvd_lossy.reuse_exchange): for each rank p of
             the process set, the sender's for what it sends p, the receiver's for what p
             sends it (0 for itself), and whether its frame to p predicts (bit p % 8 of byte
             p // 8); every rank compares every pair (protocol.reuse_diverged)

dtype, ndim and the trailing dims are the frame's, rows the sum of its segments' and the
payload the frame itself, unless SIZED says otherwise. A chunk without rows (and every chunk
after a failure, and every chunk of broadcast's header round) is a frame of no segments. So a
chunk's whole header is the frame's, about 20 bytes.

The extension is the same for every destination of a call, so the codec writes it into every
frame as it lays them out (hvd_lossy.compress_grouped(extension=...)).
"""
import torch

from hvd_lossy import _bytes, _codec, _decode
from hvd_lossy.protocol import (GRANK, HEADER_FIELDS, LOSSY_DTYPES, MAX_NDIM, PAYLOAD, REUSE,
                                ROWS, _A,
                                _B, _DIMS, _DTYPE, _LocalError, _NDIM, _PENDING, _PENDING_A,
                                _PENDING_SEQ, _SETTINGS, _STATUS)

FAILED, PENDING, SIZED, REUSED = 0x01, 0x02, 0x04, 0x08
_BLOCKS = ((FAILED, (_STATUS, _A, _B, _DTYPE)), (PENDING, (_PENDING, _PENDING_A, _PENDING_SEQ)),
           (SIZED, (_NDIM, ROWS, PAYLOAD)))


def extension(fields, sized=False):
    """The extension bytes of protocol header fields (protocol.header's list); `sized` adds
    their ndim, rows and payload (SIZED), for a frame that does not hold them itself."""
    block = fields[REUSE] if len(fields) > REUSE else None
    flags = ((FAILED if fields[_STATUS] else 0) | (PENDING if fields[_PENDING] else 0)
             | (SIZED if sized else 0) | (REUSED if block is not None else 0))
    out = bytearray([flags]) + _bytes.varint(int(fields[GRANK])) + _bytes.u32(
        int(fields[_SETTINGS]))
    for flag, slots in _BLOCKS:
        if flags & flag:
            for i in slots:
                out += _bytes.varint(int(fields[i]))
    if block is not None:
        sent, received, predicts = block
        out += _bytes.varint(len(sent))
        for value in (*sent, *received):
            out += _bytes.u32(int(value))
        bits = bytearray((len(sent) + 7) // 8)
        for p, on in enumerate(predicts):
            bits[p // 8] |= (1 << (p % 8)) if on else 0
        out += bits
    return bytes(out)


def block_bytes(ext):
    """Bytes the extension adds to a frame header: its length byte and itself."""
    return 1 + len(ext)


def header_frame(tensor, fields, sized=False):
    """A frame of no segments that carries the fields (as uint8 tensor on the CPU): what a rank
    sends after a failure, and in broadcast's header round. Its dtype and shape are the
    tensor's where it has a lossy dtype and a valid shape (a 0-d tensor's: 1 dim), else float32
    of 1 dim (a verdict reads the failure, not them)."""
    ok = (isinstance(tensor, torch.Tensor) and tensor.dtype in LOSSY_DTYPES
          and tensor.dim() <= MAX_NDIM)
    frame = _codec.empty_frame(tensor.dtype if ok else torch.float32,
                               list(tensor.shape[1:]) if ok else [], extension(fields, sized))
    return torch.frombuffer(bytearray(frame), dtype=torch.uint8)


def fields_of(head, source):
    """Protocol header fields (protocol.header's list) of one chunk_heads entry: (dtype code,
    ndim, trailing, rows, frame bytes, header bytes, extension) of the chunk of process-set
    rank `source`."""
    if isinstance(head, str):
        raise _LocalError(10, source, detail=head)
    dtype, ndim, trailing, rows, total, _hlen, ext = head[:7]
    if ext is None:
        raise _LocalError(10, source, detail="a frame without the protocol's extension")
    r = _bytes.ByteReader(ext, what="a frame extension")
    fields = [0] * HEADER_FIELDS
    fields[_DTYPE], fields[_NDIM], fields[ROWS], fields[PAYLOAD] = dtype, ndim, rows, total
    fields[_DIMS:_DIMS + MAX_NDIM] = (list(trailing) + [-1] * MAX_NDIM)[:MAX_NDIM]
    fields[REUSE] = None
    try:
        flags = r.u8()
        if flags & ~(FAILED | PENDING | SIZED | REUSED):
            raise r.fail(f"has unknown flags {flags:#04x}")
        fields[GRANK] = r.varint()
        fields[_SETTINGS] = r.u32()
        for flag, slots in _BLOCKS:
            if flags & flag:
                for i in slots:
                    fields[i] = r.varint()
        if flags & REUSED:
            fields[REUSE] = _reuse_block(r)
        if flags & FAILED and fields[_STATUS] == 0:
            raise r.fail("flags a failure of status 0")
        if flags & PENDING and fields[_PENDING] == 0:
            raise r.fail("flags a pending failure of code 0")
        if r.left():
            raise r.fail(f"has {r.left()} stray bytes")
    except _codec.FrameError as e:
        raise _LocalError(10, source, detail=str(e)) from None
    return fields


def _reuse_block(r):
    n = r.varint()
    if not 1 <= n <= 127:
        raise r.fail(f"has a reuse block for {n} ranks")
    sent = tuple(r.u32() for _ in range(n))
    received = tuple(r.u32() for _ in range(n))
    bits = [r.u8() for _ in range((n + 7) // 8)]
    return sent, received, tuple(bool(bits[p // 8] >> (p % 8) & 1) for p in range(n))


def _host(recv):
    return recv if recv.device.type == "cpu" else recv.cpu()


def offsets_of(counts):
    offsets, at = [], 0
    for n in counts:
        offsets.append(at)
        at += n
    return offsets


def heads_of(recv, counts, verify=False):
    """The frame head of every sender's chunk in the uint8 tensor `recv` (chunk s: counts[s]
    bytes, back to back), or a str saying why it is not a frame. A device buffer's chunks are
    read from bounded prefixes (hvd_lossy._decode.frame_heads: header and descriptors, one
    copy to the host); `verify` checks every CRC32C, which takes the whole buffer on the host."""
    chunks = list(zip(offsets_of(counts), counts))
    if recv.device.type == "cpu" or verify:
        return _codec.chunk_heads(_host(recv), chunks, verify=verify)
    return _decode.frame_heads(recv, chunks)


def parse_chunks(recv, counts, verify=False, heads=None):
    """Header fields of every sender's chunk in the uint8 tensor `recv` (chunk s: counts[s]
    bytes, back to back), each one frame with the protocol's extension, from `heads`
    (heads_of's; None: read them). `verify` also checks every frame's CRC32C, so that a
    verdict read from the headers is never one a corrupted chunk made up (decoding checks it
    anyway). _LocalError 10 names the first sender whose chunk is not such a frame."""
    if heads is None:
        heads = heads_of(recv, counts, verify)
    return [fields_of(head, s) for s, head in enumerate(heads)]


def split_chunks(recv, size):
    """The byte counts of the `size` frames back to back in `recv` (an allgather's result:
    one frame a rank, the sizes from their headers)."""
    try:
        counts = _decode.split_frames(recv)
    except _codec.FrameError as e:
        raise _LocalError(10, -1, detail=f"the frames received do not split: {e}") from None
    if len(counts) != size:
        raise _LocalError(10, -1, detail=f"{len(counts)} frames received from {size} ranks")
    return counts
