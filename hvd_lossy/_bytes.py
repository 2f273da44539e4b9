"""The one reader and writer of frame.h's byte forms on the Python side: LEB128 varints (and
their zigzag form for signed values) and little-endian fixed fields.

The reader is as strict as the native one (frame_fields.h, get_varint): a varint takes at
most 10 bytes, holds at most 64 bits and has no overlong form (a final zero byte after the
first), so every value has exactly one encoding and bytes that are not the writer's are
refused rather than read as something else. It raises FrameError, naming what it read and why.
"""
import struct

from hvd_lossy._codec import FrameError

_U32 = struct.Struct("<I")
MAX_VARINT_BYTES = 10


def uvarint(value):
    """The LEB128 bytes of an int in [0, 2**64)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"a varint holds an int in [0, 2**64), got {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value):
    """The zigzag LEB128 bytes of an int in [-2**63, 2**63): -1 stays one byte."""
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"a signed varint holds an int in [-2**63, 2**63), got {value}")
    return uvarint(((value << 1) ^ (value >> 63)) & ((1 << 64) - 1))


def u32(value):
    return _U32.pack(value)


class ByteReader:
    """Reads `data` (bytes, bytearray or a uint8 numpy array) from byte `at` on; `what` names
    the bytes in errors ("a frame extension")."""

    def __init__(self, data, at=0, what="the bytes"):
        self.data, self.at, self.what = data, at, what

    def left(self):
        return len(self.data) - self.at

    def fail(self, why):
        return FrameError(f"{self.what} {why} (at byte {self.at} of {len(self.data)})")

    def u8(self):
        if self.left() < 1:
            raise self.fail("ends where a byte was expected")
        self.at += 1
        return int(self.data[self.at - 1])

    def uvarint(self):
        value, i = 0, 0
        while True:
            if self.at >= len(self.data):
                raise self.fail("ends inside a varint")
            b = int(self.data[self.at])
            self.at += 1
            if i == MAX_VARINT_BYTES - 1 and b > 1:  # the 10th byte holds bit 63 only
                raise self.fail(f"holds a varint longer than {MAX_VARINT_BYTES} bytes"
                                if b & 0x80 else "holds a varint of more than 64 bits")
            value |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                if b == 0 and i > 0:
                    raise self.fail("holds a varint in an overlong form (a final zero byte)")
                return value
            i += 1

    def varint(self):
        z = self.uvarint()
        return (z >> 1) ^ -(z & 1)

    def u32(self):
        if self.left() < 4:
            raise self.fail("ends inside a 4-byte field")
        self.at += 4
        return _U32.unpack_from(bytes(self.data[self.at - 4:self.at]))[0]
