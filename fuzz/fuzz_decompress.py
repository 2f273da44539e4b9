"""atheris harness for the hvd_lossy decoder through its Python API.

Contract under test: for any bytes, ``frame_info``, ``decompress``, ``split_frames`` and
``decompress_chunks`` either succeed, with a result that agrees with the frame header, or raise
ValueError (``hvd_lossy.FrameError`` for a bad frame); never another exception, a crash or a hang.

Modes (environment):
    HL_FUZZ_PATCH=1   before decoding, walk the input as back-to-back frames and give each one a
                      consistent total_bytes and the correct checksum (``_C.checksum`` written at
                      header offset 12), so that mutations reach the section parsers instead of
                      stopping at the checksum.
    HL_FUZZ_C=PATH    load this build of the extension as ``hvd_lossy._C`` instead of the
                      installed one: fuzz/run.sh builds one instrumented for coverage (and ASan),
                      so that libFuzzer's feedback sees the native parsers, not only Python lines.

Frames whose header asks for more than HL_FUZZ_MAX_OUTPUT bytes of output (default 64 MiB) are
not decoded: a valid frame can legitimately expand that much (duplicate rows cost a few bits
each), and the allocation would only trip the fuzzer's memory limit.

Usage: python fuzz/fuzz_decompress.py [libFuzzer flags] CORPUS_DIR [SEED_DIR...]
"""
import importlib.machinery
import importlib.util
import os
import struct
import sys

import atheris

HEADER_BYTES = 96  # a format-1 frame's header
V1_MAGIC = b"HVDL"
CHECKSUM_OFFSET = 12
TOTAL_BYTES_OFFSET = 88
PATCH = os.environ.get("HL_FUZZ_PATCH") == "1"
MAX_OUTPUT = int(os.environ.get("HL_FUZZ_MAX_OUTPUT", str(64 << 20)))


def _load_native_override():
    path = os.environ.get("HL_FUZZ_C")
    if not path:
        return
    loader = importlib.machinery.ExtensionFileLoader("hvd_lossy._C", path)
    spec = importlib.util.spec_from_file_location("hvd_lossy._C", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["hvd_lossy._C"] = module


with atheris.instrument_imports(include=["hvd_lossy"]):
    import torch

    _load_native_override()
    import hvd_lossy
    from hvd_lossy import _C


def patch_frames(buf):
    """Makes every frame in buf (back to back) self-consistent in size and checksum, in place.
    Format-1 frames only: the walk stops at the first that is not one (format-2 frames, their
    varint header and CRC32C, are patched by the native decode_v2_patched harness)."""
    offset = 0
    while len(buf) - offset >= 16 and bytes(buf[offset:offset + 4]) == V1_MAGIC:
        left = len(buf) - offset
        size = left
        if left >= HEADER_BYTES:
            (claimed,) = struct.unpack_from("<Q", buf, offset + TOTAL_BYTES_OFFSET)
            if HEADER_BYTES <= claimed <= left:
                size = claimed
            struct.pack_into("<Q", buf, offset + TOTAL_BYTES_OFFSET, size)
        view = torch.frombuffer(buf, dtype=torch.uint8)[offset:offset + size]
        struct.pack_into("<I", buf, offset + CHECKSUM_OFFSET, _C.checksum(view.data_ptr(), size))
        offset += size


def as_tensor(buf):
    if not buf:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buf, dtype=torch.uint8)


def output_bytes_or_none(frame):
    """Output size the header announces, or None when frame_info rejects the frame."""
    try:
        info = hvd_lossy.frame_info(frame)
    except ValueError:
        return None, None
    return info["raw_bytes"], info


def check_one_frame(frame):
    out_bytes, info = output_bytes_or_none(frame)
    if info is None or out_bytes > MAX_OUTPUT:
        return
    try:
        y = hvd_lossy.decompress(frame)
    except ValueError:
        return
    assert y.dtype == info["dtype"] and tuple(y.shape) == info["shape"], (y.dtype, y.shape, info)


def check_frame_buffer(buf_t):
    try:
        sizes = hvd_lossy.split_frames(buf_t)
    except ValueError:
        sizes = None
    if sizes is not None:
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        v1 = [bytes(buf_t[a:a + 4].tolist()) == V1_MAGIC for a in starts]
        assert sum(sizes) == buf_t.numel() and all(n > 0 for n in sizes), sizes
        assert all(n >= HEADER_BYTES for n, is_v1 in zip(sizes, v1) if is_v1), sizes
    if not sizes:
        return
    # decompress_chunks must fail iff some frame fails; skip buffers with an oversized frame.
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    expect_error = False
    for lo, hi in zip(offsets, offsets[1:]):
        out_bytes, info = output_bytes_or_none(buf_t[lo:hi])
        if info is None:
            expect_error = True
        elif out_bytes > MAX_OUTPUT:
            return
    try:
        parts = hvd_lossy.decompress_chunks(buf_t)
    except ValueError:
        return
    assert not expect_error, "decompress_chunks decoded a buffer holding a frame frame_info rejects"
    assert len(parts) == len(sizes)


def TestOneInput(data):
    buf = bytearray(data)
    if PATCH:
        patch_frames(buf)
    t = as_tensor(buf)
    check_one_frame(t)
    check_frame_buffer(t)


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
