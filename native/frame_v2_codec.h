// The bytes of format-2 frames (frame.h) that the CPU and CUDA codecs must write and read alike:
// varints, fixed-width little-endian fields, the info byte, the segment descriptor, the width of
// an outlier position, and CRC32C. Everything here is HL_HD (host and device) and allocation
// free, so the CPU build (frame_v2.cc, crc32c.cc, and the tests through them) runs the very
// functions the CUDA codec runs.
//
// CRC32C in pieces: the CRC is linear over GF(2), so a frame can be checksummed by many threads
// at once. With raw(piece) the register after feeding the piece into a zero register, and
// shift(c, n) the register c after n zero bytes (c * x^(8n) mod P):
//   crc32c(M) = ~( shift(~0, |M|) ^ XOR_k shift(raw(piece_k), bytes of M after piece_k) )
// crc32c_piece_term and crc32c_finish compute the two parts; the order of the XOR is free.
#pragma once

#include "frame.h"

#ifdef __cplusplus
namespace hl {

// ---- varints (unsigned LEB128, at most 10 bytes, no overlong form) --------------------------

HL_HD uint64_t varint_bytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

HL_HD uint8_t* put_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

// What get_varint found; the reader that throws maps each to a message naming the field.
enum VarintStatus : int {
  HL_VARINT_OK = 0,
  HL_VARINT_TRUNCATED = 1,  // the bytes end inside it
  HL_VARINT_OVERFLOW = 2,   // more than 64 bits
  HL_VARINT_OVERLONG = 3,   // a final zero byte after the first
  HL_VARINT_TOO_LONG = 4,   // more than 10 bytes
};

// Reads the varint at p (avail bytes there) into *v and the bytes it took into *used.
HL_HD int get_varint(const uint8_t* p, uint64_t avail, uint64_t* v, uint64_t* used) {
  uint64_t x = 0, pos = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= avail) return HL_VARINT_TRUNCATED;
    const uint8_t b = p[pos++];
    if (shift == 63 && b > 1) return HL_VARINT_OVERFLOW;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (b == 0 && shift > 0) return HL_VARINT_OVERLONG;
      *v = x;
      *used = pos;
      return HL_VARINT_OK;
    }
  }
  return HL_VARINT_TOO_LONG;
}

// ---- fixed fields ----------------------------------------------------------------------------

HL_HD uint8_t* put_fixed_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) *p++ = (uint8_t)(v >> (8 * i));
  return p;
}
HL_HD uint64_t get_fixed_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

HL_HD uint8_t v2_info_byte(uint8_t dtype, int ndim, bool seeded) {
  return (uint8_t)(dtype | (ndim << 2) | (seeded ? HL_V2_SEEDED : 0));
}

// Bytes of an outlier position in a segment of n_codes codes.
HL_HD uint8_t v2_pos_bytes(uint64_t n_codes) {
  uint8_t b = 1;
  for (uint64_t m = n_codes > 0 ? n_codes - 1 : 0; m > 0xff; m >>= 8) ++b;
  return b;
}

// ---- the segment descriptor (frame.h "descriptor[n_segments]") ----------------------------

HL_HD uint64_t v2_descriptor_bytes(uint8_t flags, uint64_t rows, uint64_t n_unique,
                                   uint64_t map_bytes, uint64_t n_outliers, uint64_t code_bytes) {
  uint64_t n = 1 + varint_bytes(rows) + varint_bytes(code_bytes);
  if (!(flags & HL_SEG_LOSSLESS)) n += 3;
  if (flags & HL_SEG_MAP) n += varint_bytes(n_unique);
  if (flags & HL_SEG_MAP_RANS) n += varint_bytes(map_bytes);
  if (flags & HL_SEG_OUTLIERS) n += varint_bytes(n_outliers);
  return n;
}

// Writes a descriptor at w; returns its end (v2_descriptor_bytes past w).
HL_HD uint8_t* v2_put_descriptor(uint8_t* w, uint8_t flags, uint64_t rows, uint32_t bound,
                                 uint64_t n_unique, uint64_t map_bytes, uint64_t n_outliers,
                                 uint64_t code_bytes) {
  *w++ = flags;
  w = put_varint(w, rows);
  if (!(flags & HL_SEG_LOSSLESS)) w = put_fixed_le(w, bound, 3);
  if (flags & HL_SEG_MAP) w = put_varint(w, n_unique);
  if (flags & HL_SEG_MAP_RANS) w = put_varint(w, map_bytes);
  if (flags & HL_SEG_OUTLIERS) w = put_varint(w, n_outliers);
  return put_varint(w, code_bytes);
}

// The frame's size and CRC from its first bytes (the prefix and the total's varint: at most
// HL_V2_PREFIX + 10 bytes), without reading further. Returns false when they are not there or
// not a v2 frame; a caller then has the full parser (parse_v2) name the fault.
HL_HD bool v2_peek_total(const uint8_t* p, uint64_t avail, uint64_t* total, uint32_t* crc) {
  if (avail < HL_V2_PREFIX + 1 || p[0] != 'H' || p[1] != 'V' || p[2] != HL_V2_VERSION) return false;
  uint64_t used = 0;
  if (get_varint(p + HL_V2_PREFIX, avail - HL_V2_PREFIX, total, &used) != HL_VARINT_OK)
    return false;
  *crc = (uint32_t)get_fixed_le(p + 3, 4);
  return *total >= HL_V2_PREFIX + used;
}

// ---- CRC32C (Castagnoli, reflected, init and final xor ~0) ---------------------------------

#define HL_CRC32C_POLY 0x82f63b78u
#define HL_CRC32C_ONE 0x80000000u  // the polynomial 1 in the reflected representation

// Entry i of the byte-at-a-time table.
HL_HD uint32_t crc32c_table_entry(uint32_t i) {
  uint32_t c = i;
  for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (HL_CRC32C_POLY & (0u - (c & 1)));
  return c;
}

// The register c after the n bytes at p, with the 256-entry table.
HL_HD uint32_t crc32c_update(uint32_t c, const uint8_t* p, uint64_t n, const uint32_t* table) {
  for (uint64_t i = 0; i < n; ++i) c = (c >> 8) ^ table[(c ^ p[i]) & 0xff];
  return c;
}

// a * b mod P (reflected).
HL_HD uint32_t crc32c_mulmod(uint32_t a, uint32_t b) {
  uint32_t prod = 0;
  for (uint32_t m = HL_CRC32C_ONE; m != 0; m >>= 1) {
    if (a & m) {
      prod ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    b = (b & 1) ? (b >> 1) ^ HL_CRC32C_POLY : b >> 1;
  }
  return prod;
}

// x^(2^k) mod P for k = 0..63 (table[k]); x^1 is 0x40000000 reflected.
HL_HD void crc32c_x2k_table(uint32_t* table) {
  uint32_t p = HL_CRC32C_ONE >> 1;
  for (int k = 0; k < 64; ++k) {
    table[k] = p;
    p = crc32c_mulmod(p, p);
  }
}

// The register c after n zero bytes: c * x^(8n) mod P, with x2k from crc32c_x2k_table.
HL_HD uint32_t crc32c_shift(uint32_t c, uint64_t n, const uint32_t* x2k) {
  uint32_t p = HL_CRC32C_ONE;
  for (int k = 3; n != 0 && k < 64; ++k, n >>= 1)
    if (n & 1) p = crc32c_mulmod(x2k[k], p);
  return crc32c_mulmod(p, c);
}

// A piece's share of the frame's CRC: raw is its register from zero (crc32c_update(0, ...)),
// after the bytes of the message that follow it.
HL_HD uint32_t crc32c_piece_term(uint32_t raw, uint64_t after, const uint32_t* x2k) {
  return crc32c_shift(raw, after, x2k);
}

// The CRC32C of a message of `total` bytes whose piece terms XOR to `terms`.
HL_HD uint32_t crc32c_finish(uint32_t terms, uint64_t total, const uint32_t* x2k) {
  return ~(crc32c_shift(~0u, total, x2k) ^ terms);
}

// crc32c(A || B) from crc32c(A), crc32c(B) and |B|.
HL_HD uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b, const uint32_t* x2k) {
  return crc32c_shift(crc_a, len_b, x2k) ^ crc_b;
}

}  // namespace hl
#endif
