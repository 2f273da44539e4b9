"""atheris harness for the hvd_lossy decoder through its Python API.

Contract under test: for any bytes, ``frame_info``, ``decompress``, ``split_frames`` and
``decompress_chunks`` either succeed, with a result that agrees with the frame header, or raise
ValueError (``hvd_lossy.FrameError`` for a bad frame); never another exception, a crash or a hang.

Modes (environment):
    HL_FUZZ_PATCH=1   before decoding, walk the input as back-to-back frames and give each one
                      whose total_bytes fits the correct CRC32C (bytes 3..6), so that mutations
                      reach the parsers behind it instead of stopping at the checksum.
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

MAGIC = b"HV\x02"
PREFIX = 7  # magic, version and the CRC32C of everything after it
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


def _varint(buf, at):
    """(value, end) of the varint at buf[at:], or None when it does not parse."""
    value = 0
    for k in range(10):
        if at + k >= len(buf):
            return None
        value |= (buf[at + k] & 0x7F) << (7 * k)
        if not buf[at + k] & 0x80:
            return value, at + k + 1
    return None


def patch_frames(buf):
    """Reseals every frame in buf (back to back) whose total_bytes fits, in place: its CRC32C
    recomputed. The walk stops at the first that is not a frame or does not fit."""
    offset = 0
    while bytes(buf[offset:offset + 3]) == MAGIC:
        total = _varint(buf, offset + PREFIX)
        if total is None or not PREFIX < total[0] <= len(buf) - offset:
            return
        size = total[0]
        view = torch.frombuffer(buf, dtype=torch.uint8)[offset + PREFIX:offset + size]
        struct.pack_into("<I", buf, offset + 3, _C.crc32c(view.data_ptr(), size - PREFIX))
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
        assert sum(sizes) == buf_t.numel() and all(n > PREFIX for n in sizes), sizes
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
