// What the CPU and CUDA encoders of format 2 must compute alike for a segment, below the frame
// header (frame.h): the size rules and byte writers of the three level-1 code sections (block
// packing, radix, short blocks) cut the way a GPU computes them (one block, one value, one
// nibble byte at a time), the compact outlier record, the descriptor's flags, and the rule that
// turns a lossy segment lossless. Everything is HL_HD and allocation free: the CUDA encoder runs
// these per thread, and the host build runs the very same functions in hl::l1 reference loops
// (native/testing/bindings_test.cc) that the tests compare with the CPU encoder's bytes.
#pragma once

#include "codec_common.h"
#include "frame_fields.h"

#ifdef __cplusplus
namespace hl {

// ---- block packing (frame.h "Packed integer arrays") ----------------------------------------

// Bytes of a block-packed section of nb blocks whose widths add up to sum_widths.
HL_HD uint64_t block_section_bytes(uint64_t nb, uint64_t sum_widths) {
  return nb + 4 * sum_widths;
}

// Word j of block packing's block of `count` (<= HL_BLOCK) values at v: bit i = bit j of v[i].
// (The GPU takes it as one warp ballot.)
HL_HD uint32_t block_plane(const uint32_t* v, uint64_t count, uint32_t j) {
  uint32_t word = 0;
  for (uint64_t i = 0; i < count; ++i) word |= ((v[i] >> j) & 1u) << i;
  return word;
}

// ---- radix sections (frame.h "Radix section") -----------------------------------------------

// Radix packing applies to a lossy level-1 section of n codes whose largest is max_code when
// K = max_code + 1 passes radix_k_ok; then g = radix_group(K, n) (the encoders' one rule).
HL_HD bool radix_applies(uint64_t n, uint32_t max_code) {
  return n > 0 && radix_k_ok((uint64_t)max_code + 1);
}
HL_HD uint64_t radix_head_bytes(uint32_t k, uint32_t g) {
  return 1 + varint_bytes(k) + varint_bytes(g);
}
HL_HD uint8_t* radix_put_head(uint8_t* w, uint32_t k, uint32_t g) {
  *w++ = HL_RADIX_MARK;
  w = put_varint(w, k);
  return put_varint(w, g);
}
// Value j of the G = ceil(n / g) values of n codes at v: sum_i d(i, j) * K^i, digit d(i, j)
// the code radix_code_of(G, g, j, i), 0 past n (the last span's padding). Below K^g < 2^32,
// so the uint32 sum is exact.
HL_HD uint32_t radix_value(const uint32_t* v, uint64_t n, uint64_t G, uint32_t g, uint32_t k,
                           uint64_t j) {
  uint32_t value = 0, power = 1;
  for (uint32_t i = 0; i < g; ++i, power *= k) {
    const uint64_t c = radix_code_of(G, g, j, i);
    if (c < n) value += v[c] * power;
  }
  return value;
}
// The whole section: its head and the block packing of its G values.
HL_HD uint64_t radix_section_bytes(uint32_t k, uint32_t g, uint64_t G, uint64_t sum_widths) {
  return radix_head_bytes(k, g) + block_section_bytes(hl_div_up(G, HL_BLOCK), sum_widths);
}

// ---- short-block sections (frame.h "Short-block section") ----------------------------------

// Short blocks apply to a lossy level-1 section of n >= 1 codes all below 2^15 (a width fits a
// nibble).
HL_HD bool short_applies(uint64_t n, uint32_t max_code) {
  return n > 0 && max_code < (1u << HL_SHORT_MAX_WIDTH);
}
HL_HD uint64_t short_section_bytes(uint64_t n, uint64_t sum_widths) {
  return short_head_bytes(n) + 2 * sum_widths;
}
// Byte p of the width nibbles from the widths of blocks 2p and 2p + 1 (w_odd = 0 past the last
// block): one writer a byte, so no two GPU threads share one.
HL_HD uint8_t short_nibble_byte(uint32_t w_even, uint32_t w_odd) {
  return (uint8_t)((w_even & 0xf) | ((w_odd & 0xf) << 4));
}
// Word j of a short block of `count` (<= HL_SHORT_BLOCK) codes at v: bit i = bit j of v[i].
HL_HD uint16_t short_plane(const uint32_t* v, uint64_t count, uint32_t j) {
  return (uint16_t)block_plane(v, count, j);
}

// ---- the segment around the code section --------------------------------------------------

// One outlier record of a segment: the position in pos_bytes, then the raw bits in
// elem_bytes, both little-endian. Returns its end.
HL_HD uint8_t* put_outlier(uint8_t* w, uint64_t pos, uint32_t raw, uint8_t pos_bytes,
                              uint64_t elem_bytes) {
  w = put_fixed_le(w, pos, pos_bytes);
  return put_fixed_le(w, raw, (int)elem_bytes);
}
HL_HD uint64_t outlier_record_bytes(uint64_t n_codes, uint8_t dtype) {
  return outlier_pos_bytes(n_codes) + hl_elem_bytes(dtype);
}

// The descriptor flags (HL_SEG_*) of a segment.
HL_HD uint8_t segment_flags(bool level2, bool lossless, bool identity, uint64_t n_outliers,
                               bool rel, bool dither, bool map_rans, bool map_buckets) {
  return (uint8_t)((level2 ? HL_SEG_LEVEL2 : 0) | (lossless ? HL_SEG_LOSSLESS : 0) |
                   (identity ? 0 : HL_SEG_MAP) | (n_outliers ? HL_SEG_OUTLIERS : 0) |
                   (rel ? HL_SEG_REL : 0) | (dither ? HL_SEG_DITHER : 0) |
                   (map_rans ? HL_SEG_MAP_RANS : 0) | (map_buckets ? HL_SEG_MAP_BUCKETS : 0));
}

// A lossy segment is coded again lossless when its map, code and outliers (each counted at
// HL_OUTLIER_WORST bytes) outgrow the worst case of its sections, so that hl_max_segment_bytes
// bounds every segment (the CPU encoder's prepare(), the CUDA encoder alike).
HL_HD bool lossy_exceeds_bound(uint64_t n_rows, uint64_t row_len, uint64_t map_bytes,
                               uint64_t code_bytes, uint64_t n_outliers) {
  return map_bytes + code_bytes + (uint64_t)HL_OUTLIER_WORST * n_outliers >
         hl_packed_max_bytes(n_rows) + hl_packed_max_bytes(n_rows * row_len);
}

}  // namespace hl
#endif
