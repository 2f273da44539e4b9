// The bytes of frames (frame.h) that the CPU and CUDA codecs must write and read alike, beside
// varint.h's varints: fixed-width little-endian fields, the info byte, the segment descriptor,
// the width of an outlier position, and CRC32C. Everything here is HL_HD (host and device) and allocation
// free, so the CPU build (frame_io.cc, crc32c.cc, and the tests through them) runs the very
// functions the CUDA codec runs.
//
// CRC32C in pieces: the CRC is linear over GF(2), so a frame can be checksummed by many threads
// at once. With raw(piece) the register after feeding the piece into a zero register, and
// shift(c, n) the register c after n zero bytes (c * x^(8n) mod P):
//   crc32c(M) = ~( shift(~0, |M|) ^ XOR_k shift(raw(piece_k), bytes of M after piece_k) )
// crc32c_piece_term and crc32c_finish compute the two parts; the order of the XOR is free.
#pragma once

#include "frame.h"
#include "varint.h"

#ifdef __cplusplus
namespace hl {

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

HL_HD uint8_t frame_info_byte(uint8_t dtype, int ndim, bool seeded) {
  return (uint8_t)(dtype | (ndim << 2) | (seeded ? HL_FRAME_SEEDED : 0));
}

// Bytes of an outlier position in a segment of n_codes codes.
HL_HD uint8_t outlier_pos_bytes(uint64_t n_codes) {
  uint8_t b = 1;
  for (uint64_t m = n_codes > 0 ? n_codes - 1 : 0; m > 0xff; m >>= 8) ++b;
  return b;
}

// ---- the segment descriptor (frame.h "descriptor[n_segments]") ----------------------------

HL_HD uint64_t segment_descriptor_bytes(uint8_t flags, uint64_t rows, uint64_t n_unique,
                                   uint64_t map_bytes, uint64_t n_outliers, uint64_t code_bytes) {
  uint64_t n = 1 + varint_bytes(rows) + varint_bytes(code_bytes);
  if (!(flags & HL_SEG_LOSSLESS)) n += 3;
  if (flags & HL_SEG_MAP) n += varint_bytes(n_unique);
  if (flags & HL_SEG_MAP_RANS) n += varint_bytes(map_bytes);
  if (flags & HL_SEG_OUTLIERS) n += varint_bytes(n_outliers);
  return n;
}

// Writes a descriptor at w; returns its end (segment_descriptor_bytes past w).
HL_HD uint8_t* put_descriptor(uint8_t* w, uint8_t flags, uint64_t rows, uint32_t bound,
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

// ---- radix-packed level-1 code sections (frame.h "Radix packing") --------------------------

#define HL_RADIX_MARK 0xff  // first byte of a radix section; a block width byte is at most 32

// K^g when it is below 2^32, else 0 (g >= 1, K >= 2).
HL_HD uint64_t radix_span(uint32_t k, uint32_t g) {
  uint64_t p = 1;
  for (uint32_t i = 0; i < g; ++i) {
    p *= k;
    if (p >= (1ull << 32)) return 0;
  }
  return p;
}

// Whether codes in [0, K) may be radix packed: K >= 3 and not a power of two (a power of two
// packs into whole bits already; it also has no 32-bit magic below), K * K < 2^32.
HL_HD bool radix_k_ok(uint64_t k) { return k >= 3 && k <= 65535 && (k & (k - 1)) != 0; }

// The group size the encoder uses for n >= 1 codes in [0, K) (radix_k_ok): the g >= 2 that
// minimizes the section's worst case, ceil(ceil(n / g) / 32) blocks of 1 + 4 b bytes with
// b = bit width of K^g - 1 (a value's bits); the smallest such g on ties. Whole blocks count
// because a short last block is padded to 32 values: at 2048 codes of K = 17 that picks g = 4
// (1104 bytes) over g = 7 (1170), which wins only on long sections (4.18 bits a code against
// 4.31). Integer arithmetic only, so every encoder picks the same g.
HL_HD uint32_t radix_group(uint32_t k, uint64_t n) {
  uint32_t best_g = 0;
  uint64_t best = 0;
  for (uint32_t g = 2;; ++g) {
    const uint64_t span = radix_span(k, g);
    if (span == 0) break;
    uint32_t b = 0;
    for (uint64_t m = span - 1; m; m >>= 1) ++b;
    const uint64_t bytes = hl_div_up(hl_div_up(n, g), HL_BLOCK) * (1 + 4 * (uint64_t)b);
    if (best_g == 0 || bytes < best) {
      best_g = g;
      best = bytes;
    }
  }
  return best_g;
}

// v / K for every v < 2^32 as a multiply, a subtract and shifts (for K of radix_k_ok), so that
// CPU loops vectorize (32 x 32 -> 64-bit lane multiplies) and the GPU needs one __umulhi.
// With l = floor(log2 K) and m = floor(2^(33+l) / K) + 1:
//  * 2^32 < m < 2^33: K lies strictly between 2^l and 2^(l+1), so 2^(33+l) / K lies strictly
//    between 2^32 and 2^33, and it is no integer (K has an odd factor); m = 2^33 would need
//    K <= 2^(33+l) / (2^33 - 1) < 2^l + 1. So m = 2^32 + lo with 0 < lo < 2^32.
//  * floor(v * m / 2^(33+l)) = floor(v / K): v * m / 2^(33+l) = v / K + v * (m - 2^(33+l)/K)
//    / 2^(33+l), and 0 < m - 2^(33+l)/K <= 1, so the excess is below 2^32 / 2^(33+l) =
//    2^-(l+1) < 1 / K; the fraction of v / K is at most (K-1) / K, so the sum stays below the
//    next integer.
//  * Evaluated without a 65-bit product: with t = floor(v * lo / 2^32) <= v,
//    floor(v * m / 2^(33+l)) = floor((v + t) / 2^(l+1)) = (((v - t) >> 1) + t) >> l.
struct RadixDiv {
  uint32_t k, lo, shift;
};
HL_HD RadixDiv radix_div_of(uint32_t k) {
  uint32_t l = 0;
  while ((k >> (l + 1)) != 0) ++l;
  RadixDiv d;
  d.k = k;
  d.lo = (uint32_t)(((1ull << (33 + l)) / k + 1) - (1ull << 32));
  d.shift = l;
  return d;
}
HL_HD uint32_t radix_div(uint32_t v, RadixDiv d) {
  const uint32_t t = (uint32_t)(((uint64_t)v * d.lo) >> 32);
  return (((v - t) >> 1) + t) >> d.shift;
}

// Values of a radix section come in spans of HL_RADIX_SPAN (the last one shorter), and a span's
// digits cover that span's own run of codes: digit i of value j is code radix_code_of(G, g, j, i)
// (frame.h). A decoder that splits a span's values lane by lane thus writes one region of
// codes, nearly in order.
#define HL_RADIX_SPAN 2048
HL_HD uint64_t radix_code_of(uint64_t G, uint32_t g, uint64_t j, uint32_t i) {
  const uint64_t base = j / HL_RADIX_SPAN * HL_RADIX_SPAN;
  const uint64_t span = G - base < HL_RADIX_SPAN ? G - base : HL_RADIX_SPAN;
  return base * g + (uint64_t)i * span + (j - base);
}

// What get_radix_head found.
enum RadixStatus : int {
  HL_RADIX_NONE = 0,       // no radix mark: a plain block-packed section
  HL_RADIX_OK = 1,
  HL_RADIX_TRUNCATED = 2,  // the section ends inside K or g
  HL_RADIX_BAD_K = 3,      // K fails radix_k_ok
  HL_RADIX_BAD_G = 4,      // g = 0, or K^g >= 2^32
};

// Reads the head of a level-1 code section at p (len bytes): K, g and the bytes they take.
HL_HD int get_radix_head(const uint8_t* p, uint64_t len, uint32_t* k, uint32_t* g,
                         uint64_t* used) {
  if (len == 0 || p[0] != HL_RADIX_MARK) return HL_RADIX_NONE;
  uint64_t kv = 0, gv = 0, a = 0, b = 0;
  if (get_varint(p + 1, len - 1, &kv, &a) != HL_VARINT_OK) return HL_RADIX_TRUNCATED;
  if (get_varint(p + 1 + a, len - 1 - a, &gv, &b) != HL_VARINT_OK) return HL_RADIX_TRUNCATED;
  if (!radix_k_ok(kv)) return HL_RADIX_BAD_K;
  if (gv == 0 || gv > 32 || radix_span((uint32_t)kv, (uint32_t)gv) == 0) return HL_RADIX_BAD_G;
  *k = (uint32_t)kv;
  *g = (uint32_t)gv;
  *used = 1 + a + b;
  return HL_RADIX_OK;
}

// ---- short-block level-1 code sections (frame.h "Short-block section") ---------------------

#define HL_SHORT_MARK 0xfd   // first byte of a short-block section
#define HL_SHORT_BLOCK 16    // codes a block
#define HL_SHORT_MAX_WIDTH 15

HL_HD uint64_t short_n_blocks(uint64_t n) { return hl_div_up(n, HL_SHORT_BLOCK); }
// The mark and the width nibbles: the bytes before block 0's planes.
HL_HD uint64_t short_head_bytes(uint64_t n) { return 1 + hl_div_up(short_n_blocks(n), 2); }
// Width of block b from the nibbles (the section's bytes after the mark).
HL_HD uint32_t short_width(const uint8_t* nibbles, uint64_t b) {
  return (nibbles[b >> 1] >> ((b & 1) * 4)) & 0xf;
}

// Which packing a lossy level-1 code section gets: the smallest of block packing, radix
// packing and short blocks (0: that packing does not apply), block packing before radix before
// short blocks on ties, so that every encoder writes the same bytes.
enum Level1Packing : int { HL_PACK_BLOCK = 0, HL_PACK_RADIX = 1, HL_PACK_SHORT = 2 };
HL_HD int level1_packing(uint64_t block_bytes, uint64_t radix_bytes, uint64_t short_bytes) {
  int pick = HL_PACK_BLOCK;
  uint64_t best = block_bytes;
  if (radix_bytes != 0 && radix_bytes < best) {
    pick = HL_PACK_RADIX;
    best = radix_bytes;
  }
  if (short_bytes != 0 && short_bytes < best) pick = HL_PACK_SHORT;
  return pick;
}

// The frame's size and CRC from its first bytes (the prefix and the total's varint: at most
// HL_FRAME_PREFIX + 10 bytes), without reading further. Returns false when they are not there or
// not a frame; a caller then has the full parser (parse_frame) name the fault.
HL_HD bool peek_frame_total(const uint8_t* p, uint64_t avail, uint64_t* total, uint32_t* crc) {
  if (avail < HL_FRAME_PREFIX + 1 || p[0] != 'H' || p[1] != 'V' || p[2] != HL_FRAME_VERSION) return false;
  uint64_t used = 0;
  if (get_varint(p + HL_FRAME_PREFIX, avail - HL_FRAME_PREFIX, total, &used) != HL_VARINT_OK)
    return false;
  *crc = (uint32_t)get_fixed_le(p + 3, 4);
  return *total >= HL_FRAME_PREFIX + used;
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
