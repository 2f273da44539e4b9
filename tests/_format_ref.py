"""frame.h's building blocks written again from the spec, for tests that compare the codec's
bytes with what the format describes. Written apart from hvd_lossy/_bytes.py on purpose: a
reference that shared the product's code could not catch its mistakes."""
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


def short_packed(values):
    """frame.h "Short-block section": the mark 0xFD, a width nibble a block of 16 (low nibble
    first, a zero nibble after an odd count), then each block's uint16 bit planes."""
    values = list(values)
    values += [0] * (-len(values) % 16)
    blocks = [values[i:i + 16] for i in range(0, len(values), 16)]
    widths = [max(b).bit_length() for b in blocks]
    assert max(widths) <= 15
    nibbles = bytes(widths[i] | (widths[i + 1] if i + 1 < len(widths) else 0) << 4
                    for i in range(0, len(widths), 2))
    payload = bytearray()
    for w, b in zip(widths, blocks):
        for j in range(w):
            payload += struct.pack("<H", sum(((v >> j) & 1) << i for i, v in enumerate(b)))
    return b"\xfd" + nibbles + bytes(payload)


def reference_group(k, n):
    """frame.h: the g >= 2 minimizing ceil(ceil(n / g) / 32) * (1 + 4 b), b the bit width of
    K^g - 1; the smallest on ties."""
    best = None
    g = 2
    while k ** g < 2 ** 32:
        size = -(-(-(-n // g)) // 32) * (1 + 4 * (k ** g - 1).bit_length())
        if best is None or size < best[1]:
            best = (g, size)
        g += 1
    return best[0]


SPAN = 2048  # HL_RADIX_SPAN


def code_of(G, g, j, i):
    """frame.h: digit i of value j is code s * S * g + i * L + t (span s, j = s * S + t)."""
    base = j // SPAN * SPAN
    return base * g + i * min(G - base, SPAN) + (j - base)


def radix_section(codes):
    """frame.h "Radix section" of codes (K = largest + 1, g = reference_group(K, n))."""
    k = max(codes) + 1
    n = len(codes)
    g = reference_group(k, n)
    G = -(-n // g)
    values = []
    for j in range(G):
        pos = [code_of(G, g, j, i) for i in range(g)]
        values.append(sum((codes[p] if p < n else 0) * k ** i for i, p in enumerate(pos)))
    return b"\xff" + varint(k) + varint(g) + block_packed(values)


def level1_section(codes):
    """(kind, bytes) of the lossy level-1 code section frame.h's encoders write for these
    codes: the smallest of block packing, radix packing (K = largest + 1 from 3 to 65535 and no
    power of two) and short blocks (codes below 2^15), earlier in that order on ties."""
    best = ("block", block_packed(codes))
    k = max(codes) + 1
    if 3 <= k <= 65535 and k & (k - 1):
        radix = radix_section(codes)
        if len(radix) < len(best[1]):
            best = ("radix", radix)
    if k <= 2 ** 15:
        short = short_packed(codes)
        if len(short) < len(best[1]):
            best = ("short", short)
    return best
