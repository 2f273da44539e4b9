// hvd_lossy's frame format: the one byte format shared by the CPU and CUDA codecs. A frame
// carries a tensor of shape (R, *trailing) cut along dim 0 into row segments, each with its own
// bound, level, mode, map and outliers: an all-to-all sends one frame a destination, its pieces
// the segments. Frames are messages between ranks that run one version; nothing stores them.
//
// Rows: the last dimension of a segment is a row (one embedding vector); everything before it
// counts rows. ndim 1: segment k is one row of rows[k] elements; ndim 0: exactly one segment of
// one element. Fixed-width integers are little-endian.
//
// Quantization (lossy segments): step = 2 * eb_abs, computed in double.
//   t = double(x) * (1.0 / step);   q = rint(t) (ties to even)   when |t| <= HL_QMAX, else outlier
//   x_hat = to_dtype(float(double(q) * step))   (both roundings to nearest-even)
// The encoder checks |double(x) - double(x_hat)| <= eb_abs for every element with exactly this
// arithmetic (reconstruct in codec_common.h) and stores every element that misses, plus NaN,
// +-Inf and |t| > HL_QMAX, losslessly in the outlier section. The code stored at an outlier
// position is 0.
// Lossless segments (HL_SEG_LOSSLESS: eb == 0, a zero range in rel mode, or a lossy segment
// whose sections would outgrow its worst case, lossy_exceeds_bound in level1_sections.h, e.g.
// when most elements are outliers): the codes are the raw bit patterns of the elements (uint16
// for fp16/bf16, uint32 for fp32) and there are no outliers.
//
// Subtractive dither (HL_SEG_DITHER, lossy segments only): element i (row-major index into the
// segment) is quantized as x - u_i and decoded as q * step + u_i, where
//   u_i = hl::dither_unit(seed, i) * step  in (-step/2, step/2)     (codec_common.h)
// with the segment's seed. The reconstruction error is then uniform in [-eb_abs, eb_abs] and
// independent of x, so it averages out (unbiased) instead of rounding every |x| < eb_abs to
// zero; the bound check and outliers work as above. A dithered segment has no row map: equal
// rows get different offsets.
//
// Duplicate rows: rows whose code vectors and outlier values are identical are stored once.
// The encoder keeps the map only when 2 * (n_rows - n_unique) * row_len >= n_rows *
// bit_width(n_unique - 1), i.e. when the codes it saves (counted at 2 bits) outweigh it.
// Unique rows are numbered in order of first occurrence, so the map starts 0, and every entry
// is at most one more than the largest before it (the decoder checks this).
//
// Packed integer arrays ("block packing", used for the map and for level-1 codes): the array of
// uint32 values is cut into blocks of HL_BLOCK = 32 values (the last one padded with zeros).
//   uint8  width[n_blocks]            bits per value in the block, 0..32 (the bit width of its max)
//   block payloads, back to back       block b takes 4 * width[b] bytes: width[b] uint32 words,
//                                      word j holds bit j of the block's 32 values, value i in
//                                      bit i (bit planes: one warp ballot per word on the GPU).
// Lossy codes are zigzag-encoded (q = 0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) before packing.
//
// Level 2 codes (entropy stage): the compact rANS section below, over the coder described in
// codec_common.h. An encoder asked for level 2 stores level 1 whenever the entropy-coded
// section would not be smaller.
//
// ---- the frame ----
// Varints are unsigned LEB128 (7 bits a byte, low first, at most 10 bytes, no overlong form:
// varint.h).
//
//   uint8  'H', 'V', 2              magic and version
//   uint32 crc32c                   CRC32C (Castagnoli, reflected, init/final ~0) of bytes
//                                   [7, total): everything after this field
//   varint total_bytes              the whole frame
//   uint8  info                     bits 0-1 dtype, bits 2-5 ndim (0..8), bit 6 HL_FRAME_EXT,
//                                   bit 7 HL_FRAME_SEEDED
//   uint24 seed                     only with HL_FRAME_SEEDED: segment k's dither seed is
//                                   (seed + k) mod 2^24
//   varint ext_bytes, ext[ext_bytes]  only with HL_FRAME_EXT (1 <= ext_bytes <= HL_FRAME_MAX_EXT):
//                                   the transport's extension, bytes the codec neither makes
//                                   nor reads but the CRC covers. hvd_lossy's all-to-all puts
//                                   its protocol fields there (sender, settings digest, status;
//                                   hvd_lossy/chunk_header.py), so a destination's chunk is one
//                                   frame with one header. A frame may have no segments (a
//                                   destination sent no rows, or only the extension travels).
//   varint dims[ndim - 1]           the trailing dims (none for ndim <= 1)
//   varint n_segments
//   descriptor[n_segments], each:
//     uint8  flags                  HL_SEG_*
//     varint rows
//     uint24 bound                  lossy only: eb_abs = float32 with bits (bound << 8); the
//                                   encoder rounds its bound down to such a value and codes
//                                   with exactly it (step = 2 * eb_abs in double)
//     varint n_unique               HL_SEG_MAP only (1 <= n_unique < rows)
//     varint map_bytes              HL_SEG_MAP_RANS only
//     varint n_outliers             HL_SEG_OUTLIERS only (>= 1)
//     varint code_bytes
//   payload[n_segments], each, back to back:
//     map                           HL_SEG_MAP only: block-packed row -> unique row
//                                   (its length follows from its width bytes), or with
//                                   HL_SEG_MAP_RANS a compact rANS section of map_bytes over
//                                   one symbol a row: 0 for a row not seen before (it gets the
//                                   next unique index), u + 1 for a repeat of unique row u.
//                                   With HL_SEG_MAP_BUCKETS as well (the symbols' alphabet
//                                   cut to 33, so its table stays small on few rows):
//                                     varint rans_bytes, then a compact rANS section of that
//                                     many bytes over one bucket a row: 0 for a row not seen
//                                     before, else b = bit width of u + 1 (1..32);
//                                     then, for each repeat in row order, the b - 1 low bits
//                                     of u + 1 (its top bit is implied), LSB first, packed
//                                     back to back; the section ends at the byte holding the
//                                     last bit (padding bits zero).
//                                   At level 2 the encoder picks whichever of the three is
//                                   smallest; level 1 always packs (decoding speed).
//     code                          code_bytes: level 1 block packing, or a radix
//                                   section (lossy level 1, below), or (HL_SEG_LEVEL2) the
//                                   compact rANS section below
//     outliers                      n_outliers records of pos_bytes + elem_bytes bytes:
//                                   position (little-endian, ascending, pos_bytes = bytes of
//                                   n_unique * row_len - 1, at least 1), raw bits
// Radix section (a lossy level-1 code section of n >= 1 codes; its first byte tells it from
// block packing, whose first width byte is at most 32). Codes that all lie in [0, K) with K not
// a power of two waste bits in whole-bit packing (K = 17, rel bound 0.03: 5 bits a code for
// log2 17 = 4.09); g of them as the base-K digits of one value waste less:
//   uint8  0xff                     HL_RADIX_MARK
//   varint K                        3 <= K <= 65535, not a power of two
//   varint g                        1 <= g, K^g < 2^32
//   values                          G = ceil(n / g) values, block-packed, each < K^g:
//                                   value j = sum_i d(i, j) * K^i, i = 0..g-1
// Digits to codes: the values come in spans of S = HL_RADIX_SPAN = 2048 (span s: values
// [s * S, s * S + L), L = S but for the last span, L = G - s * S), and span s carries codes
// [s * S * g, s * S * g + L * g) in g lanes of L: digit d(i, j) of its value j = s * S + t is
// code s * S * g + i * L + t, and must be 0 where that is >= n (padding: the last span's last
// lanes only). Lanes rather than groups of neighbours: splitting values lane by lane gives runs
// of consecutive codes, so the split and the stores are contiguous, vector-friendly loops on
// the CPU and coalesced on the GPU; spans keep a decoder's writes within one region of codes at
// a time. (A section of up to S values, n <= S * g, is one span: code i * G + j.) A decoder
// rejects a value >= K^g and a nonzero padding digit. The encoder (CPU and CUDA alike) takes
// K = largest code + 1, g = radix_group(K, n)
// (frame_fields.h: the g minimizing the section's worst-case bytes), and stores the section
// only when it is the smallest packing (level1_packing, after the short-block section), in
// segments coded at level 1 (a level-2 segment's packed fallback stays block packed); lossless
// segments never have one.
//
// Short-block section (a lossy level-1 code section of n >= 1 codes, every code below 2^15;
// first byte 0xFD): block packing with blocks of HL_SHORT_BLOCK = 16 codes and 4-bit widths.
// Trained lookups and gradients change scale from row to row (a row's norm, a sample's loss)
// and have long tails; a block is as wide as its largest code, so blocks of 16 follow those
// scales where blocks of 32 carry the wider neighbour's width (the README main job: 14% fewer
// code bytes), and a nibble a block costs what a byte per 32 does.
//   uint8  0xfd                     HL_SHORT_MARK
//   uint8  widths[ceil(nb / 2)]     nb = ceil(n / 16) blocks; block b's width (0..15) is the low
//                                   nibble of byte b / 2 for even b, the high one for odd b; the
//                                   high nibble after an odd nb's last block is 0
//   planes, back to back            block b: 2 * w[b] bytes, w[b] uint16 words, word j bit i =
//                                   bit j of code 16 * b + i (the last block padded with zeros)
// A decoder rejects a nonzero padding nibble and a section of any other length than
// 1 + ceil(nb / 2) + 2 * (sum of the widths). The encoder (CPU and CUDA alike, with
// level1_packing in frame_fields.h and the size rules and writers of level1_sections.h)
// sizes block packing, radix packing and short blocks and stores the smallest, in segments
// coded at level 1 (a level-2 segment's packed fallback stays block packed); lossless segments
// never have one.
// Compact rANS section (the coder and streams of codec_common.h):
//   uint8  K - 1                    symbols 0..K-1 can occur (K = largest present + 1)
//   uint8  w                        bits a frequency, 1..13
//   freq[K]                         w bits each, LSB first, ceil(K * w / 8) bytes; 0 = absent;
//                                   they sum to 1 << HL_RANS_BITS
//                                   A code section (not a map) may borrow its table instead:
//                                   K - 1 = 0 and w = 0, no freq, and the section codes with
//                                   the table of the frame's nearest earlier level-2 code
//                                   section that has its own. The encoder does so for small
//                                   segments (up to 2^15 codes) when one table for all of a
//                                   frame's level-2 segments is estimated smaller.
//   varint n_escapes, varint (escape - 255)[n_escapes]
//   varint stream_bytes[n_streams - 1]   the last stream takes the rest of the section
//   streams, back to back (codec_common.h)
#pragma once

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HL_MAX_NDIM 8
#define HL_BLOCK 32
#define HL_QMAX 1073741823.0  // 2^30 - 1: zigzag codes fit 31 bits
// Bytes an outlier counts for in lossy_exceeds_bound (level1_sections.h), whatever it takes in
// the frame: the rule that turns segments lossless, so changing it changes frames.
#define HL_OUTLIER_WORST 12

enum HlDType : uint8_t { HL_FLOAT32 = 0, HL_FLOAT16 = 1, HL_BFLOAT16 = 2 };
enum HlMode : uint8_t { HL_MODE_ABS = 0, HL_MODE_REL = 1 };

#define HL_DITHER_SEEDS (1u << 24) // dither seeds are 24-bit

#define HL_FRAME_VERSION 2
#define HL_FRAME_PREFIX 7          // magic, version and CRC32C
#define HL_FRAME_SEEDED 0x80       // info bit: a dither seed follows
#define HL_FRAME_EXT 0x40          // info bit: a transport extension follows (the seed)
#define HL_FRAME_MAX_EXT 127       // bytes of an extension at most (its length is one byte)
#define HL_FRAME_MAX_HEADER 256    // frame header without descriptors, worst case (extension too)
#define HL_FRAME_MAX_SEGMENT 48    // one descriptor, worst case
#define HL_SEG_LEVEL2 0x01      // code section is compact rANS (else block packing)
#define HL_SEG_LOSSLESS 0x02    // raw bits, no bound stored
#define HL_SEG_MAP 0x04         // duplicate rows dropped: a map section and n_unique
#define HL_SEG_OUTLIERS 0x08    // an outlier section and n_outliers
#define HL_SEG_REL 0x10         // the bound was relative to the segment's value range
#define HL_SEG_DITHER 0x20      // subtractive dither with the segment's seed
#define HL_SEG_MAP_RANS 0x40    // the map is a compact rANS section (with HL_SEG_MAP only)
#define HL_SEG_MAP_BUCKETS 0x80 // that section codes bucketed symbols (with HL_SEG_MAP_RANS)
#define HL_SEG_KNOWN 0xff

#ifdef __cplusplus
#if defined(__CUDACC__)
#define HL_HD __host__ __device__ __forceinline__
#else
#define HL_HD inline
#endif

HL_HD size_t hl_elem_bytes(uint8_t dtype) { return dtype == HL_FLOAT32 ? 4 : 2; }

HL_HD uint64_t hl_div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Worst case of a block-packed array of n values: one width byte and 32 full words a block.
HL_HD uint64_t hl_packed_max_bytes(uint64_t n) {
  return hl_div_up(n, HL_BLOCK) * (1 + 4 * HL_BLOCK);
}

// Upper bound of one segment (descriptor and payload) of n_rows x row_len elements, so that
// all-to-all buffers can be sized before compressing. Holds because the encoder falls back to a
// lossless segment whenever the lossy one would be larger (lossy_exceeds_bound), and a lossless
// segment packs at most elem_bytes*8 <= 32 bits a value, plus the map (absent without
// duplicates).
HL_HD uint64_t hl_max_segment_bytes(uint64_t n_rows, uint64_t row_len) {
  return HL_FRAME_MAX_SEGMENT + hl_packed_max_bytes(n_rows) + hl_packed_max_bytes(n_rows * row_len);
}

// Upper bound of a frame of one segment of n_rows x row_len elements (any ndim).
HL_HD uint64_t hl_max_frame_bytes(uint64_t n_rows, uint64_t row_len) {
  return HL_FRAME_MAX_HEADER + hl_max_segment_bytes(n_rows, row_len);
}

// The bound a segment stores for a wanted absolute bound: the largest float32 with the low
// 8 bits of its significand zero that is <= eb (0 when eb is below the smallest one).
HL_HD uint32_t hl_bound_code(double eb) {
  if (!(eb > 0)) return 0;
  float f = (float)eb;
  if ((double)f > eb) f = nextafterf(f, 0.0f);
  if (f > 3.4028234e38f) f = 3.4028234e38f;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (u >> 8) & 0xffffffu;
}
HL_HD double hl_bound_of_code(uint32_t code) {
  const uint32_t u = code << 8;
  float f;
  memcpy(&f, &u, 4);
  return (double)f;
}
#endif
