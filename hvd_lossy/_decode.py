"""Frames back into tensors: decompress, decompress_chunks, split_frames, and the device
receive path.

CPU frames go to the CPU decoder as one native call (hvd_lossy._codec). Device frames are read
with bounded host copies: the first bytes of every frame (header and descriptors:
PREFIX_BYTES, or what the descriptors need beyond) come to the host in one copy and are parsed
there without payloads or checksums (``frame_heads``), which sizes the output and routes each
frame (``route``):

  batched  level 1 with block-packed maps: every such frame of a call, wherever its bytes lie
           in the buffer and its rows in the output, goes to ONE
           ``_C.decompress_batched_cuda`` call (one launch set over one table of all their
           segments, native/cuda/decode_batch.cu);
  frame    a level-2 segment or an entropy-coded map: ``_C.decompress_cuda``, a frame a call;
  host     a bucketed row map (no device decoder), or a dithered segment with
           HVD_LOSSY_HOST_DITHER=1: the frame is copied to the host, decoded by the CPU decoder
           and its values copied back.
"""
import re
from collections import namedtuple

import torch

from . import _codec
from ._codec import FrameError, _as_frame_bytes, _CODE_DTYPES, _DTYPE_CODES, _output_limit

# Bytes of every device frame copied to the host for its header and descriptors: a
# destination's frame of up to ~90 segments (an encoder's descriptors are ~10 bytes; 256 hold
# any header before them). A frame whose descriptors may run longer has exactly what they need
# copied in a second round.
PREFIX_BYTES = 1024


class Head(namedtuple("Head", "dtype_code ndim trailing rows frame_bytes header_bytes extension "
                              "refusal bucketed dithered segments")):
    """A device frame's header and descriptors (_C.frame_heads): ``refusal`` says why the
    batched decoder cannot read it ('' when it can)."""

    @property
    def dtype(self):
        return _CODE_DTYPES[self.dtype_code]

    @property
    def shape(self):
        return () if self.ndim == 0 else (self.rows, *self.trailing)

    @property
    def numel(self):
        return _codec._numel(self.shape)


class FrameRefusal(Exception):
    """Frame ``index`` of a decode_into call was refused: ``mismatch`` when it is well formed
    but not what the output holds (dtype, row shape, room), else corrupt or truncated; its
    message is the codec's."""

    def __init__(self, index, message, mismatch=False, error=FrameError):
        super().__init__(message)
        self.index, self.mismatch, self.error = index, mismatch, error


def prefixes(buffer, chunks, limits):
    """The first min(length, limit) bytes of every (offset, length) chunk of the 1-D uint8
    tensor ``buffer``, gathered on its device and copied to the host at once: (host uint8
    tensor, [(offset in it, bytes, chunk length)] as _C.frame_heads takes them)."""
    parts, places, at = [], [], 0
    for (offset, length), limit in zip(chunks, limits):
        n = min(int(length), int(limit))
        parts.append(buffer[int(offset):int(offset) + n])
        places.append((at, n, int(length)))
        at += n
    if not parts:
        return torch.empty(0, dtype=torch.uint8), places
    return torch.cat(parts).cpu(), places


def frame_heads(buffer, chunks, prefix_bytes=PREFIX_BYTES):
    """The Head of the frame filling each (offset, length) chunk of ``buffer``, or the
    FrameError's message (str), read from bounded prefixes: one copy to the host, and another
    for the chunks whose descriptors may run past ``prefix_bytes`` (two more when it is below
    the 256 bytes of the longest header). No payload byte is copied and no checksum checked
    (decoding checks it)."""
    chunks = [(int(o), int(n)) for o, n in chunks]
    heads = _codec.frame_heads(*prefixes(buffer, chunks, [prefix_bytes] * len(chunks)))
    for _ in range(2):  # the header's bound, then the descriptors' (each at most the chunk)
        longer = [i for i, h in enumerate(heads) if type(h) is int]
        if not longer:
            break
        host, places = prefixes(buffer, [chunks[i] for i in longer], [heads[i] for i in longer])
        for i, head in zip(longer, _codec.frame_heads(host, places)):
            heads[i] = head
    return [h if isinstance(h, str) else Head(*h) for h in heads]


def route(head):
    """Which decoder reads a device frame: "batched", "frame" or "host" (the module's doc)."""
    if head.bucketed or (head.dithered and _codec._host_dither()):
        return "host"
    return "frame" if head.refusal else "batched"


def _check_room(i, head, first, out, trailing):
    if head.dtype != out.dtype or (trailing is not None and tuple(head.trailing) != trailing):
        want = "" if trailing is None else f" rows of {list(trailing)}"
        raise FrameRefusal(i, f"frame holds {head.dtype} {list(head.shape)}, expected "
                              f"{out.dtype}{want}", mismatch=True)
    if first + head.numel > out.numel():
        raise FrameRefusal(i, f"frame decodes to elements [{first}, {first + head.numel}), the "
                              f"output holds {out.numel()}", mismatch=True)


_NAMED_FRAME = re.compile(r"frame (\d+)")


def _batched(buffer, frames, indices, out):
    """One _C.decompress_batched_cuda call for frames (offset, bytes, first element); its
    error as the FrameRefusal of the frame it names (indices: their decode_into indices)."""
    try:
        _codec.decompress_batched_cuda(buffer, frames, out)
    except (FrameError, ValueError) as e:
        named = _NAMED_FRAME.findall(str(e))
        k = int(named[-1]) if named and int(named[-1]) < len(indices) else 0
        raise FrameRefusal(indices[k], str(e), error=type(e)) from e


def place_chunks(chunks, heads, first_rows, row_elems):
    """The frames decode_into takes for chunks (offset, bytes, rows) whose rows go to rows
    first_rows[i] on of an output of row_elems elements a row: (frames, the chunks' indices
    they are). Chunks of no rows write nothing and are left out; a frame with other rows than
    its chunk announced is a FrameRefusal (mismatch)."""
    frames, taken = [], []
    for i, ((offset, nbytes, rows), head) in enumerate(zip(chunks, heads)):
        if not rows:
            continue
        if not isinstance(head, str) and head.rows != rows:
            raise FrameRefusal(i, f"frame holds {head.rows} rows, its header announced {rows}",
                               mismatch=True)
        frames.append((int(offset), int(nbytes), int(first_rows[i]) * int(row_elems)))
        taken.append(i)
    return frames, taken


def decode_into(buffer, frames, heads, out, trailing=None):
    """Decodes device frames of ``buffer`` into the contiguous device tensor ``out``: frame i
    lies at frames[i] = (offset, bytes, first element of out), its Head (or the FrameError
    message of its prefix) heads[i]; ``trailing``: the row shape every frame must have (None:
    any). Outputs must come in order and not overlap. Every batched frame goes in one call;
    the others as ``route`` says. Raises FrameRefusal."""
    flat = out.view(-1)
    end, batch, indices = 0, [], []
    for i, ((offset, nbytes, first), head) in enumerate(zip(frames, heads)):
        if isinstance(head, str):
            raise FrameRefusal(i, head)
        _check_room(i, head, first, out, None if trailing is None else tuple(trailing))
        if first < end:
            raise ValueError(f"frame {i}'s output starts at element {first}, expected at least "
                             f"{end} (where the frame before it ends)")
        end = first + head.numel
        if route(head) == "batched":
            batch.append((int(offset), int(nbytes), int(first)))
            indices.append(i)
    if batch:
        _batched(buffer, batch, indices, flat)
    for i, ((offset, nbytes, first), head) in enumerate(zip(frames, heads)):
        way = route(head)
        if way == "batched":
            continue
        frame, into = buffer[offset:offset + nbytes], flat[first:first + head.numel]
        try:
            if way == "host":
                into.copy_(decompress(frame.cpu()).reshape(-1))
            else:
                _codec.decompress_cuda(frame, into)
        except (FrameError, ValueError) as e:
            raise FrameRefusal(i, str(e), error=type(e)) from e
    return out


def _raised(refusal):
    return refusal.error(str(refusal))


def _decode_device(buffer, frames, heads, out):
    try:
        return decode_into(buffer, frames, heads, out)
    except FrameRefusal as e:
        raise _raised(e) from None


def decompress(frame, out=None, max_output_bytes=None):
    """Decodes a frame into a tensor of its original dtype and shape, on the frame's device.

    Arguments:
        frame: a 1-D torch.uint8 tensor holding one frame.
        out: optional contiguous tensor of the frame's dtype and shape on the frame's device to
            decode into. Without it a CPU frame decodes into memory the codec owns and reuses
            once nothing references it (see :func:`set_output_cache_bytes`).
        max_output_bytes: refuse (FrameError) a frame announcing more output bytes; None: the
            limit of :func:`set_max_output_bytes`. Without ``out`` nothing is allocated first.

    Returns:
        The decoded tensor (``out`` when given).

    Raises:
        FrameError (a ValueError) if the frame is truncated, corrupted or not an hvd_lossy frame.
    """
    frame = _as_frame_bytes(frame)
    if not frame.is_cuda:
        return _codec.decompress_host(frame, out, max_output_bytes)
    _codec._check_device(frame)
    (head,) = frame_heads(frame, [(0, frame.numel())])
    if isinstance(head, str):
        raise FrameError(head)
    if out is None:
        _codec.check_output_bytes(head.numel * head.dtype.itemsize, max_output_bytes)
        out = torch.empty(head.shape, dtype=head.dtype, device=frame.device)
    else:
        _codec.check_out(out, head.dtype, head.shape, frame.device)
    return _decode_device(frame, [(0, frame.numel(), 0)], [head], out)


def split_frames(buffer):
    """Sizes of the back-to-back frames in ``buffer`` (frames are self-delimiting). A device
    buffer is copied to the host whole: a frame's size is in its header, and where the next
    header starts is known only then."""
    buffer = _as_frame_bytes(buffer)
    host = buffer.cpu() if buffer.is_cuda else buffer
    sizes, offset, total = [], 0, host.numel()
    base = host.data_ptr()
    while offset < total:
        size = _codec.frame_bytes(base + offset, total - offset)
        sizes.append(size)
        offset += size
    return sizes


def decompress_chunks(buffer, sizes=None, max_output_bytes=None):
    """Decodes back-to-back frames (as made by :func:`compress_chunks`) into a list of tensors.

    Arguments:
        buffer: 1-D ``torch.uint8`` tensor of frames.
        sizes: their sizes in bytes; None walks the frames by the sizes in their headers (a
            device buffer is then copied to the host whole: pass the sizes).
        max_output_bytes: refuse (FrameError) frames announcing more output bytes in all; None:
            the limit of :func:`set_max_output_bytes`.

    On the CPU this is one native call (headers and checksums verified first, then one block of
    memory for all pieces, then every frame decoded, threaded across frames); the pieces are
    views of that block (see :func:`set_output_cache_bytes`). On a device the frames' headers
    are copied to the host (a bounded prefix each) and every level-1 frame is decoded by one
    batched call, the pieces views of one device block a dtype.
    """
    buffer = _as_frame_bytes(buffer)
    limit = _output_limit(max_output_bytes)
    if sizes is None and not buffer.is_cuda:
        # the native call walks the frames by their headers
        return _codec._decode_new(buffer, None, limit)
    if sizes is None:
        sizes = split_frames(buffer)
    sizes = [int(s) for s in sizes]
    if sum(sizes) != buffer.numel():
        raise ValueError(f"frame sizes sum to {sum(sizes)} but the buffer holds {buffer.numel()} bytes")
    if not buffer.is_cuda:
        return _codec._decode_new(buffer, sizes, limit)
    _codec._check_device(buffer)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    heads = frame_heads(buffer, list(zip(offsets, sizes)))
    for head in heads:
        if isinstance(head, str):
            raise FrameError(head)
    _codec.check_output_bytes(sum(h.numel * h.dtype.itemsize for h in heads), limit,
                              "the frames")
    # one block and one decode call a dtype (one in practice), each piece a view of its block
    pieces = [None] * len(heads)
    for dtype in dict.fromkeys(h.dtype for h in heads):
        mine = [i for i, h in enumerate(heads) if h.dtype == dtype]
        firsts = [sum(heads[j].numel for j in mine[:k]) for k in range(len(mine) + 1)]
        block = torch.empty(firsts[-1], dtype=dtype, device=buffer.device)
        _decode_device(buffer, [(offsets[i], sizes[i], first) for i, first in zip(mine, firsts)],
                       [heads[i] for i in mine], block)
        for i, first in zip(mine, firsts):
            pieces[i] = block[first:first + heads[i].numel].view(heads[i].shape)
    return pieces
