"""Python face of the native codec: tensors in, frames (torch.uint8 tensors) out.

The only module that imports the compiled extension ``hvd_lossy._C``.
"""
import numbers
import os

import numpy as np
import torch

from . import _C

FrameError = _C.FrameError
CodecError = _C.CodecError
# Columns of piece_stats and compress_grouped's stats.
STATS_PER_PIECE, STAT_MIN, STAT_MAX, STAT_UNIQUE, STAT_FINITE, STAT_SUM, STAT_SUMSQ = (
    _C.STATS_PER_PIECE, _C.STAT_MIN, _C.STAT_MAX, _C.STAT_UNIQUE, _C.STAT_FINITE, _C.STAT_SUM,
    _C.STAT_SUMSQ)

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
_MODES = {"abs": 0, "rel": 1}
_LEVELS = (1, 2)
_threads = 0  # 0: all cores (OpenMP's default)


def set_num_threads(n):
    """Sets how many CPU threads the codec uses; 0 means all cores."""
    global _threads
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"number of threads must be an int >= 0, got {n!r}")
    _threads = n


def get_num_threads():
    """CPU threads the codec uses (0: all cores)."""
    return _threads


def _dtype_code(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    try:
        return _DTYPE_CODES[tensor.dtype]
    except KeyError:
        raise ValueError(
            f"unsupported dtype {tensor.dtype}, expected torch.float32, torch.float16 or torch.bfloat16"
        ) from None


def _mode_code(mode):
    try:
        return _MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported mode {mode!r}, expected 'rel' or 'abs'") from None


def _check_level(level):
    if level not in _LEVELS:
        raise ValueError(f"unsupported level {level!r}, expected 1 (fast bit packing) or 2 (entropy coded)")
    return int(level)


def check_error_bound(value, name="error_bound", positive=False):
    """The one rule for every error bound hvd_lossy accepts (codec, compressors, adaptive
    controller): a real number (not a bool, a string or a tensor), finite and >= 0 (> 0 when
    `positive`). Returns it as a float; raises TypeError for a non-number, ValueError for a
    value out of range, both naming the value."""
    if type(value) is float and (value > 0 if positive else value >= 0) and value != _INF:
        return value  # the common case without the ABC check (a call checks every piece's bound)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not (number > 0 if positive else number >= 0) or number == float("inf"):
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0, "
                         f"got {value!r}")
    return number


_check_bound = check_error_bound
_INF = float("inf")


def _check_device(tensor):
    if tensor.device.type == "cuda" and not getattr(_C, "WITH_CUDA", False):
        raise ValueError("tensor is on a CUDA device but hvd_lossy was built without CUDA; "
                         "rebuild with HVD_LOSSY_WITH_CUDA=ON")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {tensor.device}, expected cpu or cuda")


def _stream(tensor):
    return torch.cuda.current_stream(tensor.device).cuda_stream


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return 1 << 40


# A frame announcing more output than the machine has memory cannot decode here, however valid
# its checksum: duplicate rows let a few KiB announce terabytes, so decoders of bytes from
# elsewhere (the collectives) refuse it as a bad frame instead of trying to allocate.
_max_output_bytes = _physical_memory()


def set_max_output_bytes(n):
    """Sets the most bytes one decoding call may produce (default: the machine's physical
    memory). decompress/decompress_chunks, and the collectives of hvd_lossy.torch for what the
    headers they receive announce, raise FrameError (a RankError in a collective) above it,
    before allocating. Use it to bound what a corrupt or hostile peer can make a receiver
    allocate."""
    global _max_output_bytes
    _max_output_bytes = _check_output_limit(n)


def max_output_bytes():
    """The decode limit in bytes (see :func:`set_max_output_bytes`)."""
    return _max_output_bytes


def _check_output_limit(n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"max_output_bytes must be an int >= 0 (bytes), got {n!r}")
    return int(n)


def _output_limit(n):
    return _max_output_bytes if n is None else _check_output_limit(n)


def check_output_bytes(nbytes, limit=None, what="the frame"):
    """Raises FrameError (the message the native decoder gives too) when `what` announces more than `limit` (default the module's) bytes
    of output."""
    limit = _output_limit(limit)
    if nbytes > limit:
        raise FrameError(f"{what} announces {nbytes} bytes of output, more than max_output_bytes "
                         f"({limit}; hvd_lossy.set_max_output_bytes changes it)")


DITHER_SEEDS = 1 << 24


def _check_dither(dither):
    """None (no dither) or a seed in [0, 2**24) as the native -1 / seed."""
    if dither is None:
        return -1
    if isinstance(dither, bool) or not isinstance(dither, int) or not 0 <= dither < DITHER_SEEDS:
        raise ValueError(f"dither must be None or an int seed in [0, {DITHER_SEEDS}), got {dither!r}")
    return dither


def check_ids(ids, tensor):
    """The one rule for row ids (compress_chunks, compress_grouped and the collectives'
    ``ids=``): an int64 tensor of one key per row of a 2-D ``tensor`` (rows, dim), on any
    device. Returns them; raises TypeError or ValueError naming what was given and what was
    expected."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be an int64 torch.Tensor with one key per row, got "
                        f"{type(ids).__name__}")
    if ids.dtype != torch.int64:
        raise TypeError(f"ids must be an int64 tensor, got {ids.dtype}")
    if tensor.dim() != 2:
        raise ValueError(f"ids need a 2-D tensor (rows, dim), got one of shape "
                         f"{tuple(tensor.shape)}")
    if tuple(ids.shape) != (tensor.shape[0],):
        raise ValueError(f"ids must have shape ({tensor.shape[0]},), one key per row, got "
                         f"{tuple(ids.shape)}")
    return ids


def _host_ids(ids):
    """Checked ids as the CPU encoder reads them: contiguous on the CPU (None stays None)."""
    return None if ids is None else ids.to("cpu").contiguous()


def _ids_address(host_ids):
    return 0 if host_ids is None or not host_ids.numel() else host_ids.data_ptr()


def _zero_rows_address(zero_rows, ids, tensor):
    """The address of `_zero_rows` for the CPU encoder (0 without): hvd_lossy.reuse's one byte
    a row, nonzero for a row it filled with +0.0 (a reference), which the codec takes with the
    other such rows of its piece for one row, unread (CompressParams::zero_rows). A promise the
    codec cannot check, so it is no public argument. It needs ids (the rows' numbering)."""
    if zero_rows is None:
        return 0
    if ids is None:
        raise ValueError("_zero_rows needs ids (the numbering it takes part in)")
    if (zero_rows.dtype != torch.uint8 or zero_rows.device.type != "cpu"
            or not zero_rows.is_contiguous() or tuple(zero_rows.shape) != (tensor.shape[0],)):
        raise ValueError(f"_zero_rows must be a contiguous CPU uint8 tensor of shape "
                         f"({tensor.shape[0]},), got {zero_rows.dtype} of shape "
                         f"{tuple(zero_rows.shape)} on {zero_rows.device}")
    return zero_rows.data_ptr() if zero_rows.numel() else 0


def max_frame_bytes(rows, row_len, ndim):
    """Worst-case size in bytes of the frame of a tensor of ``ndim`` (0..8) dimensions with
    ``rows`` rows of ``row_len`` elements (the frame's header holds up to 8 dimensions)."""
    if not 0 <= int(ndim) <= 8:
        raise ValueError(f"ndim must be 0..8, got {ndim!r}")
    return _C.max_frame_bytes(int(rows), int(row_len))


def compress(tensor, error_bound, mode="rel", level=1, dedup=True, dither=None):
    """Compresses a tensor into one self-describing frame (native/frame.h) of one segment.

    Arguments:
        tensor: float32, float16 or bfloat16 tensor, CPU or CUDA, any shape and strides. Its last
            dimension is a row (one embedding vector); a 1-D tensor is one row.
        error_bound: ``mode="rel"``: a fraction of the tensor's finite value range (max - min);
            ``mode="abs"``: the absolute bound, in the tensor's units. 0 means lossless.
        mode: ``"rel"`` or ``"abs"``.
        level: 1 (quantize, drop duplicate rows, bit-pack; fastest) or 2 (adds an entropy coder).
        dedup: store identical rows once.
        dither: None, or an int seed in [0, 2**24): subtractive dither. The decoded error is then
            uniform in [-eb, eb] and independent of the value (unbiased, e.g. for gradients)
            instead of rounding every |x| < eb to 0, at the same bound; the seed travels in the
            frame. Turns dedup off.
        The frame's bound is the requested one rounded down to 24 bits. Device tensors are coded
        by the CUDA encoder at level 1, dithered or not, and on the CPU at level 2 (the same
        bytes either way).

    Returns:
        A 1-D ``torch.uint8`` tensor on the input's device. Every finite element decodes within
        the absolute bound: ``|float64(x) - float64(x_hat)| <= eb_abs``; NaN and +-Inf are kept.
    """
    code = _dtype_code(tensor)
    eb = _check_bound(error_bound)
    m, lv = _mode_code(mode), _check_level(level)
    seed = _check_dither(dither)
    _check_device(tensor)
    if tensor.is_cuda and not _on_device_encoder(seed, lv):
        return compress(tensor.cpu(), eb, mode, level, dedup, dither).to(tensor.device)
    src = tensor.contiguous()
    shape = list(src.shape)
    if not src.is_cuda:  # the frame built first, then written once into memory of its size
        return torch.from_numpy(_C.compress_new(src.data_ptr(), code, shape, eb, m, lv, bool(dedup),
                                                _threads, seed))
    # a frame of one segment, bounded as compress_into bounds one piece
    cap = max_grouped_bytes([shape[0] if shape else 1], shape[1:], [1], 0)
    out = torch.empty(cap, dtype=torch.uint8, device=src.device)
    with torch.cuda.device(src.device):  # the scratch size is the device's (cub's queries)
        need = _C.compress_cuda_scratch(code, shape, m, bool(dedup), seed)
    scratch = _device_scratch(need, src)
    size = _C.compress_cuda(src.data_ptr(), code, shape, eb, m, bool(dedup), out.data_ptr(), cap,
                            _stream(src), seed, scratch.data_ptr(), scratch.numel())
    return out[:size].clone() if size < cap // 2 else out[:size]


def _device_scratch(nbytes, like):
    """Device scratch of a CUDA codec call from PyTorch's caching allocator, on ``like``'s
    device: freed when the call returns, it goes back to the cache in the order of the current
    stream, which the codec works on, so later work reuses it safely."""
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=like.device)


def _compress_into_cuda(src, code, rows, ebs, m, dedup, groups, prefix_bytes, out_ptr, cap, ext,
                        seed):
    """_C.compress_into_cuda of the contiguous device tensor src (its pieces coded in one batch)
    with scratch from PyTorch's allocator: (sizes a piece, frame bytes a group)."""
    trailing = list(src.shape[1:])
    with torch.cuda.device(src.device):  # the scratch size is the device's (cub's queries)
        need = _C.compress_into_cuda_scratch(code, rows, trailing, ebs, m, bool(dedup),
                                             len(groups), seed)
    scratch = _device_scratch(need, src)
    return _C.compress_into_cuda(src.data_ptr() if src.numel() else 0, code, rows, trailing, ebs,
                                 m, bool(dedup), groups, prefix_bytes, out_ptr, cap, _stream(src),
                                 ext, seed, scratch.data_ptr(), scratch.numel())


def compress_chunks(tensor, rows, error_bounds, mode="rel", level=1, dedup=True, dither=None,
                    ids=None, _zero_rows=None):
    """Compresses consecutive pieces of dim 0 into ONE frame whose segments they are, each with
    its own bound, in one native call.

    Arguments:
        tensor: as for :func:`compress`; dim 0 is split into ``len(rows)`` pieces.
        rows: rows (dim-0 entries) of each piece; they must sum to ``tensor.shape[0]``.
        error_bounds: one bound for all pieces, or a list with one per piece.
        mode, level, dedup: as for :func:`compress`.
        dither: None, or the seed of piece 0; piece i uses ``(dither + i) % 2**24``.
        ids: None, or an int64 tensor of one key per row of a 2-D tensor: rows of a piece with
            equal keys are stored once, found without hashing rows (not faster today); each
            such row's bits are still compared with its key's first row, so wrong keys cost
            speed, never the bound. A lossy frame is the same bytes as without ids; a lossless
            one keeps a row repeated under another key apart (the same values). The CUDA
            encoder does not use them (it finds the same duplicates by content).
        Device tensors: as for :func:`compress`.

    Returns:
        ``(buffer, sizes)``: a 1-D ``torch.uint8`` tensor holding the frame and ``[its size]``
        (buffers of several frames, back to back, decode with :func:`decompress_chunks`).
    """
    code = _dtype_code(tensor)
    m, lv = _mode_code(mode), _check_level(level)
    seed = _check_dither(dither)
    _check_device(tensor)
    if tensor.dim() == 0:
        raise ValueError("compress_chunks needs a tensor with at least one dimension, got a 0-d tensor")
    rows = [int(r) for r in rows]
    for i, r in enumerate(rows):
        if r < 0:
            raise ValueError(f"rows[{i}] is {r}, expected >= 0")
    if sum(rows) != tensor.shape[0]:
        raise ValueError(f"rows sum to {sum(rows)} but the tensor has {tensor.shape[0]} rows in dim 0")
    if isinstance(error_bounds, (list, tuple)):
        if len(error_bounds) != len(rows):
            raise ValueError(f"got {len(error_bounds)} error bounds for {len(rows)} pieces")
        ebs = [_check_bound(e) for e in error_bounds]
    else:
        ebs = [_check_bound(error_bounds)] * len(rows)
    keys = None if ids is None else check_ids(ids, tensor)
    if tensor.is_cuda and not _on_device_encoder(seed, lv):
        buffer, sizes = compress_chunks(tensor.cpu(), rows, ebs, mode, level, dedup, dither, keys)
        return buffer.to(tensor.device), sizes
    src = tensor.contiguous()
    trailing = list(src.shape[1:])
    if not src.is_cuda:  # the frame built first, then written once into memory of its size
        keys = _host_ids(keys)
        block, _ = _C.compress_many_new(src.data_ptr(), code, rows, trailing, ebs, m, lv,
                                        bool(dedup), _threads, seed, _ids_address(keys),
                                        _zero_rows_address(_zero_rows, keys, src))
        return torch.from_numpy(block), [block.size]
    # ONE frame of all the pieces: compress_into of one group
    cap = max_grouped_bytes(rows, trailing, [len(rows)], 0)
    out = torch.empty(cap, dtype=torch.uint8, device=src.device)
    sizes, _ = _compress_into_cuda(src, code, rows, ebs, m, dedup, [len(rows)], 0,
                                   out.data_ptr(), cap, b"", seed)
    total = sum(sizes)
    buffer = out[:total].clone() if total < cap // 2 else out[:total]
    return buffer, [total]


# Set to "1", dithered device tensors and frames are coded on the host by the CPU codec, as
# before the CUDA dither kernels (the same bytes): the reference a GPU run compares the device
# path with (benchmarks/gpu/run.sh). Read at each call.
HOST_DITHER_VARIABLE = "HVD_LOSSY_HOST_DITHER"


def _host_dither():
    return os.environ.get(HOST_DITHER_VARIABLE) == "1"


def _on_device_encoder(seed, level):
    """Whether the CUDA encoder (native/cuda/) codes a device tensor itself: at level 1, dithered
    or not (unless HVD_LOSSY_HOST_DITHER=1 sends dithered ones to the host). Level 2 is coded on
    the host by the CPU encoder, which writes the bytes the CUDA one would (the same format
    rules)."""
    return level == 1 and (seed < 0 or not _host_dither())


def _as_frame_bytes(frame):
    if not isinstance(frame, torch.Tensor) or frame.dtype != torch.uint8:
        got = frame.dtype if isinstance(frame, torch.Tensor) else type(frame).__name__
        raise TypeError(f"a frame is a torch.uint8 tensor, got {got}")
    if frame.dim() != 1:
        raise ValueError(f"a frame is a 1-D tensor, got shape {tuple(frame.shape)}")
    return frame.contiguous()


def _host_header(frame):
    """Header fields of a frame; a CUDA frame is validated whole on the host (its CRC covers
    it all)."""
    host = frame.cpu() if frame.is_cuda else frame
    return _C.frame_info(host.data_ptr(), frame.numel())


# Reuse's native passes (native/cpu/reuse.h): hvd_lossy.reuse calls them with the addresses
# of CPU tensors it has checked.
reuse_encode, reuse_store, reuse_apply, reuse_slot = (
    _C.reuse_encode, _C.reuse_store, _C.reuse_apply, _C.reuse_slot)


def segments_lossless(buffer, frames):
    """Whether each segment of each (offset, bytes) frame of a uint8 CPU buffer is lossless,
    one flat list in frame order."""
    return [f for segs in _C.segments_lossless(buffer.data_ptr(), frames) for f in segs]


def frame_info(frame):
    """Describes a frame without decoding it.

    Returns:
        dict with ``format`` (2), ``dtype`` (torch dtype), ``shape``, ``frame_bytes``,
        ``header_bytes``, ``checksum``, ``extension`` (bytes or None), ``n_outliers``,
        ``raw_bytes``, ``ratio`` (raw over frame bytes) and ``segments``: one dict a segment
        with its ``rows``, ``level``, ``mode``, ``lossless``, ``dither_seed`` (None when not
        dithered), ``eb_abs`` (absolute bound, float64), ``n_rows``, ``row_len``,
        ``n_unique``, ``n_outliers``, ``map_bytes``, ``map_coded``, ``map_bucketed``,
        ``table_borrowed``, ``code_bytes``, ``radix`` and ``radix_group`` (K and g of a
        radix-packed level-1 code section, else None), ``short_blocks`` (whether the level-1
        codes are in blocks of 16), ``outlier_bytes`` and ``segment_bytes`` (descriptor and
        payload). A frame of one segment (what :func:`compress` writes) also has that
        segment's fields at the top level.
    """
    frame = _as_frame_bytes(frame)
    info = _host_header(frame)
    if len(info["segments"]) == 1:
        info = {**info["segments"][0], **info}
    info["dtype"] = _CODE_DTYPES[info.pop("dtype_code")]
    info["shape"] = tuple(info["shape"])
    numel = 1
    for s in info["shape"]:
        numel *= s
    info["raw_bytes"] = numel * info["dtype"].itemsize
    info["ratio"] = info["raw_bytes"] / info["frame_bytes"]
    return info


def decompress_host(frame, out=None, max_output_bytes=None):
    """hvd_lossy.decompress of a CPU frame (hvd_lossy._decode has the device path)."""
    if out is None:
        # One native call: header, checksum (before anything is allocated: a corrupted header
        # could ask for terabytes), the limit, memory, decode.
        return _decode_new(frame, [frame.numel()], max_output_bytes)[0]
    if (isinstance(out, torch.Tensor) and not out.is_cuda and out.dtype in _DTYPE_CODES
            and out.is_contiguous()):
        # One native call too: the header is matched against out there, not parsed into a
        # dict first; a mismatch decodes nothing and goes on below for its message.
        if _C.decompress_as(frame.data_ptr(), frame.numel(), _DTYPE_CODES[out.dtype],
                            list(out.shape), out.data_ptr(), out.numel() * out.element_size(),
                            _threads):
            return out
    info = frame_info(frame)
    check_out(out, info["dtype"], info["shape"], frame.device)
    _C.decompress(frame.data_ptr(), frame.numel(), out.data_ptr(),
                  out.numel() * out.element_size(), _threads)
    return out


def check_out(out, dtype, shape, device):
    """That ``out`` can take a decoded frame of this dtype and shape on this device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if (out.dtype != dtype or tuple(out.shape) != tuple(shape) or out.device != device
            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(shape)} "
                         f"on {device}, got {out.dtype} {tuple(out.shape)} on {out.device}"
                         f"{'' if out.is_contiguous() else ' (non-contiguous)'}")


def frame_bytes(address, avail):
    """The size of the frame at host ``address`` from its header (FrameError unless it fits
    in ``avail`` bytes)."""
    return _C.frame_bytes(address, avail)


def frame_heads(host, chunks):
    """_C.frame_heads of the (offset, bytes present, chunk bytes) chunks of the CPU uint8
    tensor ``host``: a tuple, an int (the bytes its descriptors need) or a str each."""
    return _C.frame_heads(host.data_ptr() if host.numel() else 0, host.numel(),
                          [(int(o), int(a), int(n)) for o, a, n in chunks])


def _scratch_allocator(like):
    """(alloc, held): alloc(nbytes) -> the address of new device scratch from PyTorch's
    caching allocator on ``like``'s device, each tensor kept in ``held``. The batched decoder
    learns its scratch sizes only from its host parse, inside the call, so it asks as it goes;
    the caller keeps ``held`` until the call returns, after which the tensors go back to the
    cache in the current stream's order, as _device_scratch's do."""
    held = []

    def alloc(nbytes):
        held.append(_device_scratch(nbytes, like))
        return held[-1].data_ptr()

    return alloc, held


def decompress_batched_cuda(buffer, frames, out):
    """The device frames (offset, bytes, first element of out) of ``buffer`` decoded into the
    contiguous device tensor ``out`` by one launch set of the batched CUDA decoder (level 1,
    block-packed maps), on the current stream with scratch from PyTorch's allocator; their
    checksums checked."""
    alloc, held = _scratch_allocator(buffer)
    _C.decompress_batched_cuda(buffer.data_ptr(), buffer.numel(), frames,
                               out.data_ptr() if out.numel() else 0,
                               out.numel() * out.element_size(), _stream(buffer), True, alloc)
    del held  # only now: the call has returned and its work is ordered on the stream


def decompress_cuda(frame, out):
    """One device frame decoded into the contiguous device tensor ``out`` (exactly its
    values) by the per-frame CUDA decoder (level 2 and coded maps), its checksum checked."""
    _C.decompress_cuda(frame.data_ptr(), frame.numel(), out.data_ptr() if out.numel() else 0,
                       out.numel() * out.element_size(), _stream(frame))


def _decode_new(buffer, sizes, max_output_bytes=None):
    """Decodes the CPU frames of ``buffer`` (of these sizes, or walked by their headers when
    None) in one native call into one new block of memory; the tensors returned are views of it,
    so the block lives while any of them does. Pieces of one tensor (one dtype and row shape)
    lie back to back; other mixes start each piece on a 64-byte boundary."""
    block, parts, trailing = _C.decompress_frames(buffer.data_ptr(), buffer.numel(), sizes, _threads,
                                                  _output_limit(max_output_bytes))
    base = torch.from_numpy(block)
    if trailing is not None and parts:
        # Pieces of one tensor lie back to back: one typed view and one split cut them all.
        typed = base.view(_CODE_DTYPES[parts[0][0]])
        rows = [shape[0] for _, shape, _ in parts]
        if trailing:  # the rows given, not -1: no rows and a 0 among the trailing dims cannot be inferred
            if _numel((sum(rows), *trailing)) == 0:
                return [_shaped(typed, (r, *trailing)) for r in rows]
            typed = typed.view(sum(rows), *trailing)
        return list(typed.split(rows))
    typed, tensors = {}, []  # one typed view of the block per dtype: two ops a piece, not three
    for code, shape, offset in parts:
        dtype = _CODE_DTYPES[code]
        view = typed.get(code)
        if view is None:  # parts start on 64-byte boundaries: the block's length is a multiple
            view = typed[code] = base.view(dtype)
        start = offset // dtype.itemsize
        tensors.append(_shaped(view[start:start + _numel(shape)], shape))
    return tensors


def _shaped(flat, shape):
    """`flat` (1-D) viewed as `shape`. A shape that holds no element gets zero strides: its
    other dims can be too large for torch's strides (a header may say (0, 26, 2^60), which
    neither a view nor torch.empty can make), and a tensor of no element steps over nothing."""
    if _numel(shape) == 0:
        return flat[:0].as_strided(tuple(shape), (0,) * len(shape))
    return flat.view(shape)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def max_grouped_bytes(rows, trailing, groups, prefix_bytes):
    """Capacity ``_C.compress_into`` needs for pieces of ``rows`` (dim-0 entries) x ``trailing``
    in ``groups`` (pieces per group) with ``prefix_bytes`` before each group: every group's
    prefix and worst-case frame header, and every piece's worst-case segment."""
    return _C.max_grouped_bytes([int(r) for r in rows], [int(t) for t in trailing],
                                [int(g) for g in groups], int(prefix_bytes))


def set_output_cache_bytes(n):
    """Bounds the memory kept for reuse by decompress/decompress_chunks without ``out``.

    Decoding into new memory pays a page fault per page on first touch, about as much as the
    decoding itself. So the codec allocates decoded tensors itself (those from 16 MiB on transparent
    huge pages where the kernel allows) and, once every tensor using a block is gone, keeps the block
    for the next call, up to ``n`` bytes in all (default 256 MiB; 0 keeps nothing). A block is
    reused only after nothing references it any more."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"output cache size must be an int >= 0 (bytes), got {n!r}")
    _C.set_output_cache_bytes(n)


def output_cache_bytes():
    """``(limit, held)``: the output cache's limit and the bytes it holds now."""
    return tuple(_C.output_cache_bytes())


def compress_grouped(tensor, rows, error_bounds, groups, prefix_bytes, out, offset=0, mode="rel",
                     level=1, dedup=True, dither=None, extension=None, stats=None, ids=None,
                     _zero_rows=None):
    """Compresses pieces of dim 0 of a tensor straight into a send buffer, in groups.

    The bytes written at ``out[offset:]`` are ``[prefix][frame of group 0][prefix][frame of
    group 1]...`` with no gaps: ``groups[g]`` consecutive pieces form group g, ONE frame whose
    segments they are (an empty group has no frame), and ``prefix_bytes`` bytes before each
    group are left for the caller (a per-destination header).

    Arguments:
        tensor: tensor as for :func:`compress_chunks`; dim 0 is cut into pieces of ``rows``
            rows. A CUDA tensor is coded by the CUDA encoder (level 1, dithered or not, no
            stats); otherwise it is copied to the host and coded by the CPU encoder, and the
            frames are copied into ``out`` (the same bytes either way).
        error_bounds: one bound per piece.
        out: 1-D ``torch.uint8`` tensor on the tensor's device with at least
            :func:`max_grouped_bytes` bytes after ``offset``.
        mode, level, dedup: as for :func:`compress`; dither: None, or the seed of piece 0 (piece
            i uses ``(dither + i) % 2**24``); ids: as for :func:`compress_chunks`.
        stats: None, or a C-contiguous float64 numpy array of shape (len(rows),
            STATS_PER_PIECE) that the codec fills with what it learnt of each piece while coding
            it, at no extra pass: columns STAT_MIN and STAT_MAX, the finite value range, and
            STAT_UNIQUE, the distinct rows (NaN where duplicate removal did not run, e.g.
            dithered pieces); the range is NaN for a piece without finite elements; the moments
            (STAT_FINITE, STAT_SUM, STAT_SUMSQ) are NaN: see :func:`piece_stats`.

        extension: None, or up to ``_C.MAX_EXTENSION_BYTES`` bytes the transport
            puts in every group's frame header (frame.h, HL_FRAME_EXT: hvd_lossy's all-to-all
            carries its protocol fields there); every group then has a frame, an empty group
            one of no segments.

    Returns:
        one size a piece: its segment, the first piece of a group also counting the frame
        header, so a group's sizes add up to its bytes; the group
        layout ends at ``offset + len(groups) * prefix_bytes + sum(sizes)``. With an extension:
        ``(sizes, group_bytes)``, group_bytes[g] the size of group g's frame (the layout ends
        at ``offset + len(groups) * prefix_bytes + sum(group_bytes)``).
    """
    code = _dtype_code(tensor)
    seed = _check_dither(dither)
    src = tensor.contiguous()
    if stats is not None:
        _check_stats(stats, len(rows))
    ext = b"" if extension is None else bytes(extension)
    if extension is not None and not ext:
        raise ValueError("extension must be None or 1 to "
                         f"{_C.MAX_EXTENSION_BYTES} bytes, got an empty one")
    if src.device != out.device:
        raise ValueError(f"out must be on the tensor's device {src.device}, got {out.device}")
    keys = None if ids is None else check_ids(ids, src)
    if src.is_cuda:
        _check_device(src)
        lv = _check_level(level)
        if stats is None and _on_device_encoder(seed, lv):
            sizes, group_bytes = _compress_into_cuda(
                src, code, [int(r) for r in rows], [_check_bound(e) for e in error_bounds],
                _mode_code(mode), dedup, [int(g) for g in groups], int(prefix_bytes),
                out.data_ptr() + offset, out.numel() - offset, ext, seed)
            return (list(sizes), list(group_bytes)) if ext else list(sizes)
        return _compress_grouped_on_host(src, rows, error_bounds, groups, prefix_bytes, out,
                                         offset, mode, level, dedup, dither, extension,
                                         stats, keys)
    keys = _host_ids(keys)
    sizes = list(_C.compress_into(src.data_ptr() if src.numel() else 0, code,
                                  [int(r) for r in rows], list(src.shape[1:]),
                                  [_check_bound(e) for e in error_bounds], _mode_code(mode),
                                  _check_level(level), bool(dedup), [int(g) for g in groups],
                                  int(prefix_bytes), out.data_ptr() + offset,
                                  out.numel() - offset, _threads, seed, ext,
                                  0 if stats is None else stats.ctypes.data, _ids_address(keys),
                                  _zero_rows_address(_zero_rows, keys, src)))
    if not ext:
        return sizes
    return sizes[:len(sizes) - len(groups)], sizes[len(sizes) - len(groups):]


def _compress_grouped_on_host(tensor, rows, error_bounds, groups, prefix_bytes, out, offset,
                              mode, level, dedup, dither, extension, stats, ids):
    """compress_grouped of a device tensor by the CPU encoder (level 2, dither or stats: no
    device encoder writes those), each group's frame then copied into ``out`` so
    that the prefixes stay as the caller left them."""
    host = torch.empty(out.numel() - offset, dtype=torch.uint8)
    got = compress_grouped(tensor.cpu(), rows, error_bounds, groups, prefix_bytes, host, 0, mode,
                           level, dedup, dither, extension, stats, ids)
    sizes, group_bytes = got if extension is not None else (got, None)
    if group_bytes is None:
        group_bytes, k = [], 0
        for g in groups:
            group_bytes.append(sum(sizes[k:k + int(g)]))
            k += int(g)
    at = 0
    for nbytes in group_bytes:
        at += int(prefix_bytes)
        if nbytes:
            out[offset + at:offset + at + nbytes].copy_(host[at:at + nbytes])
        at += nbytes
    return got


def _check_stats(stats, n):
    if (not isinstance(stats, np.ndarray) or stats.dtype != np.float64
            or stats.shape != (n, STATS_PER_PIECE) or not stats.flags.c_contiguous
            or not stats.flags.writeable):
        got = (f"{stats.dtype} {stats.shape}" if isinstance(stats, np.ndarray)
               else type(stats).__name__)
        raise ValueError(f"stats must be a writeable C-contiguous float64 array of shape "
                         f"({n}, {STATS_PER_PIECE}), got {got}")


def piece_stats(tensor, rows, ranges_only=False):
    """What the codec would learn of each piece of dim 0 of a CPU tensor, without coding it.

    Returns:
        float64 numpy array (len(rows), STATS_PER_PIECE): STAT_MIN, STAT_MAX (finite range, NaN
        without finite elements), STAT_UNIQUE (distinct rows, by the codec's own row equality),
        STAT_FINITE, STAT_SUM, STAT_SUMSQ (finite elements and their moments, in float64).
        Rows are the last dimension, as the codec cuts them. ranges_only: STAT_MIN and STAT_MAX
        alone, in one pass (the codec's range pass), the other columns NaN.
    """
    code = _dtype_code(tensor)
    src = tensor.contiguous()
    out = np.empty((len(rows), STATS_PER_PIECE))
    _C.piece_stats(src.data_ptr() if src.numel() else 0, code, [int(r) for r in rows],
                   list(src.shape[1:]), out.ctypes.data, _threads, bool(ranges_only))
    return out


def chunk_heads(buffer, chunks, verify=False):
    """The frame header of each ``(offset, length)`` chunk of the 1-D CPU uint8 tensor
    ``buffer`` that one frame fills exactly: ``(dtype code, ndim, trailing, rows, frame
    bytes, header bytes, extension or None)``, or a str saying why it is not one (FrameError's
    message). ``verify`` also checks each frame's CRC32C (decoding does anyway). One native
    call for all chunks."""
    return _C.chunk_heads(buffer.data_ptr() if buffer.numel() else 0, buffer.numel(),
                          [(int(o), int(n)) for o, n in chunks], bool(verify))


def empty_frame(dtype, trailing, extension):
    """The bytes of a sealed frame of no segments, ``dtype`` x ``(0, *trailing)``,
    whose header carries ``extension`` (1 to ``_C.MAX_EXTENSION_BYTES`` bytes)."""
    ext = bytes(extension)
    if not ext:
        raise ValueError("extension must have 1 to "
                         f"{_C.MAX_EXTENSION_BYTES} bytes, got none")
    code = _DTYPE_CODES.get(dtype) if isinstance(dtype, torch.dtype) else dtype
    if code is None:
        raise TypeError(f"dtype {dtype} has no frame code (float32, float16 or bfloat16)")
    return _C.empty_frame(int(code), [int(t) for t in trailing], ext)


def decompress_into(buffer, sources, out):
    """Decodes several sources' frames from ``buffer`` straight into consecutive rows of ``out``.

    Arguments:
        buffer: 1-D CPU ``torch.uint8`` tensor.
        sources: list of ``(offset, length, rows)``: the bytes ``[offset, offset + length)`` of
            ``buffer`` are one source's back-to-back frames, which must decode to exactly
            ``rows`` rows of ``out``'s dtype and trailing shape (source 0's rows come first).
        out: contiguous CPU tensor that the sources' rows fill exactly.

    Returns:
        one entry per source: None, or a :class:`SourceRefusal` saying why its frames were
        refused (checksum or format error, wrong dtype or row shape, rows that do not add up).
        A refused source may leave its rows of ``out`` partly written. One native call,
        threaded across frames.
    """
    errors = _C.decompress_into(buffer.data_ptr(), buffer.numel(),
                                [(int(o), int(n), int(r)) for o, n, r in sources],
                                _dtype_code(out), list(out.shape[1:]),
                                out.data_ptr() if out.numel() else 0,
                                out.numel() * out.element_size(), _threads)
    return [None if e is None else SourceRefusal(*e) for e in errors]


class SourceRefusal(str):
    """Why :func:`decompress_into` refused a source (the message), and ``mismatch``: True when
    its frames were well formed but disagree with the dtype, row shape or rows asked for, False
    when they were corrupt or truncated."""

    def __new__(cls, message, mismatch):
        refusal = super().__new__(cls, message)
        refusal.mismatch = bool(mismatch)
        return refusal


def copy_rows(out, src):
    """``out.copy_(src)`` for CPU tensors of one dtype and shape, ``out`` contiguous, written
    as the decoder writes: with streaming stores from the size where it uses them (an
    all-to-all's output is cold, its own rows a large part of it on few ranks)."""
    if (out.device.type != "cpu" or src.device.type != "cpu" or out.dtype != src.dtype
            or out.shape != src.shape or not out.is_contiguous() or not src.is_contiguous()):
        out.copy_(src)
        return out
    _C.copy_into(out.data_ptr(), src.data_ptr(), out.numel() * out.element_size())
    return out


def empty(shape, dtype):
    """A new uninitialised CPU tensor, like ``torch.empty``, on memory from the codec's output
    cache (see :func:`set_output_cache_bytes`): once the cache holds a block of its size,
    decoding into it pays no page faults. Its storage cannot be resized."""
    shape = tuple(int(s) for s in shape)
    nbytes = _numel(shape) * dtype.itemsize
    block = _C.empty_block(max(nbytes, 1))
    like = _NUMPY_DTYPES.get(dtype)
    if like is not None:  # viewed in numpy: torch's three views took 10 us of a small call
        return torch.from_numpy(block[:nbytes].view(like).reshape(shape))
    return torch.from_numpy(block)[:nbytes].view(dtype).view(shape)


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.uint8: np.uint8}
