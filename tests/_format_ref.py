"""frame.h's building blocks written again from the spec, for tests that compare the codec's
bytes with what the format describes (benchmarks/gpu_check_v2.py keeps its own copy: it runs on
a machine without the tests)."""
import struct


def varint(v):
    """LEB128: 7 bits a byte, low first, the high bit set on every byte but the last."""
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def block_packed(values):
    """frame.h "Packed integer arrays": a width byte a block of 32, then its bit planes."""
    values = list(values) + [0] * (-len(values) % 32)
    blocks = [values[i:i + 32] for i in range(0, len(values), 32)]
    widths = bytes(max(b).bit_length() for b in blocks)
    payload = bytearray()
    for w, b in zip(widths, blocks):
        for j in range(w):
            payload += struct.pack("<I", sum(((v >> j) & 1) << i for i, v in enumerate(b)))
    return widths + bytes(payload)
