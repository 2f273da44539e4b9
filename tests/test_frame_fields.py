"""The frame's byte functions the CPU and CUDA codecs share (native/frame_fields.h), run here
through the CPU build: the piecewise CRC32C the CUDA decoder computes, and the varint and
descriptor rules the frame parser and writer take from the same header."""
import random
import struct

import pytest
import torch

import hvd_lossy
from hvd_lossy import FrameError
import _hl_test  # the test-only native hooks (tests/_hooks.py)


def as_tensor(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def crc32c(data):
    buf = as_tensor(data)
    return _hl_test.crc32c(buf.data_ptr(), len(data), False)


def crc32c_in_pieces(data, piece):
    buf = as_tensor(data)
    return _hl_test.crc32c_in_pieces(buf.data_ptr(), len(data), piece)


def test_piecewise_crc32c_has_the_standard_check_value():
    assert crc32c_in_pieces(b"123456789", 1) == 0xE3069283
    assert crc32c_in_pieces(b"123456789", 4) == 0xE3069283
    assert crc32c_in_pieces(b"", 1024) == crc32c(b"") == 0


@pytest.mark.parametrize("piece", [1, 3, 8, 64, 1000, 1024, 4096])
def test_piecewise_crc32c_equals_crc32c_for_any_length_and_piece_size(piece):
    rng = random.Random(piece)
    for n in [0, 1, 2, 7, 8, 9, 1023, 1024, 1025, 4097, rng.randrange(5000, 70000)]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert crc32c_in_pieces(data, piece) == crc32c(data), (n, piece)


def test_piecewise_crc32c_verifies_the_crc_the_cpu_encoder_stores():
    x = torch.randn(300, 32)
    x[::7] = x[0]  # duplicate rows: a map section
    x[5, 3] = float("nan")
    for level in (1, 2):
        frame = bytes(hvd_lossy.compress(x, 0.01, level=level).numpy())
        stored = struct.unpack("<I", frame[3:7])[0]
        assert crc32c_in_pieces(frame[7:], 1024) == stored


def test_piecewise_crc32c_detects_every_single_bit_flip():
    data = bytes(random.Random(1).getrandbits(8) for _ in range(3000))
    good = crc32c_in_pieces(data, 1024)
    for at in (0, 1, 1023, 1024, 2047, 2999):
        for bit in (0, 7):
            bad = bytearray(data)
            bad[at] ^= 1 << bit
            assert crc32c_in_pieces(bytes(bad), 1024) != good


def _frame_with_rows_varint(rows_varint):
    """A one-segment lossless f32 1-d frame whose segment-rows field is the given bytes."""
    body = bytes([0 | (1 << 2)]) + b"\x01" + bytes([0x02]) + rows_varint + b"\x01" + b"\x00"
    total = 7 + 1 + len(body)
    assert total < 0x80  # a one-byte total
    rest = bytes([total]) + body
    return as_tensor(b"HV\x02" + struct.pack("<I", crc32c(rest)) + rest)


@pytest.mark.parametrize("varint, match", [
    (b"\x81\x00", "overlong varint in its segment rows"),
    (b"\xff" * 9 + b"\x02", "segment rows overflows 64 bits"),
])
def test_varints_are_read_by_the_shared_rules_and_faults_name_the_field(varint, match):
    with pytest.raises(FrameError, match=match):
        hvd_lossy.frame_info(_frame_with_rows_varint(varint))


def _level2_frame_with_escape_count(count_varint):
    """A frame of one lossless level-2 f32 element 0.0 whose rANS section (frame.h "Compact rANS
    section": one symbol of frequency 4096 in 13 bits, the escape count, one stream holding
    just the state 2^23) writes its escape count as the given bytes."""
    code = b"\x00\x0d\x00\x10" + count_varint + (1 << 23).to_bytes(4, "little")
    body = bytes([1 << 2]) + b"\x01" + bytes([0x03]) + b"\x01" + bytes([len(code)]) + code
    rest = bytes([7 + 1 + len(body)]) + body
    return as_tensor(b"HV\x02" + struct.pack("<I", crc32c(rest)) + rest)


def test_the_entropy_coded_sections_read_varints_by_the_same_strict_rule():
    assert hvd_lossy.decompress(_level2_frame_with_escape_count(b"\x00")).tolist() == [0.0]
    with pytest.raises(FrameError, match="overlong varint in its entropy-coded section's escape"):
        hvd_lossy.decompress(_level2_frame_with_escape_count(b"\x80\x00"))


def test_descriptor_bytes_written_are_those_the_frame_info_counts():
    # segment_bytes (descriptor and payload) as frame_info reports them add up to the frame.
    x = torch.randn(96, 16)
    x[40:50] = x[3]
    buf, sizes = hvd_lossy.compress_chunks(x, [30, 10, 56], [0.01, 0.0, 0.03], level=2)
    info = hvd_lossy.frame_info(buf)
    assert info["header_bytes"] + sum(s["segment_bytes"] for s in info["segments"]) == buf.numel()
    assert [s["lossless"] for s in info["segments"]] == [False, True, False]
