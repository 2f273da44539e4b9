// hvd_lossy frame format, version 1: the one byte format shared by the CPU and CUDA codecs.
//
// A frame is self-describing: decompress needs nothing but its bytes. All integers and floats
// are little-endian. Layout, each part starting right after the previous one:
//
//   FrameHeader           96 bytes, fields below
//   shape                 int64[ndim]
//   map section           map_bytes    row -> unique-row index (empty when HL_FLAG_IDENTITY_MAP)
//   code section          code_bytes   quantization codes of the unique rows
//   outlier section       outlier_bytes
//
// Rows: the last dimension of the tensor is a row (one embedding vector); everything before it
// counts rows. A 0-d tensor is one row of one element, a 1-d tensor one row.
//
// Quantization (lossy frames): step = 2 * eb_abs, computed in double.
//   t = double(x) * (1.0 / step);   q = rint(t) (ties to even)   when |t| <= HL_QMAX, else outlier
//   x_hat = to_dtype(float(double(q) * step))   (both roundings to nearest-even)
// The encoder checks |double(x) - double(x_hat)| <= eb_abs for every element with exactly this
// arithmetic (hl_reconstruct in codec_common.h) and stores every element that misses, plus NaN,
// +-Inf and |t| > HL_QMAX, losslessly in the outlier section. The code stored at an outlier
// position is 0.
// Lossless frames (HL_FLAG_LOSSLESS, from eb == 0, a zero range in rel mode, or whenever the
// lossy frame would exceed hl_max_frame_bytes, e.g. when most elements are outliers): the codes are the raw bit patterns of the elements
// (uint16 for fp16/bf16, uint32 for fp32) and there are no outliers.
//
// Subtractive dither (HL_FLAG_DITHER, lossy frames only): element i (row-major index into the
// tensor) is quantized as x - u_i and decoded as q * step + u_i, where
//   u_i = hl::dither_unit(seed, i) * step  in (-step/2, step/2)     (codec_common.h)
// and seed is the 24-bit little-endian value in reserved[0..2]. The reconstruction error is then
// uniform in [-eb_abs, eb_abs] and independent of x, so it averages out (unbiased) instead of
// rounding every |x| < eb_abs to zero; the bound check and outliers work as above. A dithered
// frame has no duplicate rows (HL_FLAG_IDENTITY_MAP): equal rows get different offsets.
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
// Level 2 codes (entropy stage) are described in codec_common.h next to the coder. An encoder
// asked for level 2 stores level 1 whenever the entropy-coded section would not be smaller.
//
// Outlier section: n_outliers records of 12 bytes, sorted by position:
//   uint64 position (index into the unique-row code matrix, row-major), uint32 raw bits
//   (fp16/bf16 in the low 16 bits, upper bits zero).
//
// Checksum: hl_checksum over the whole frame with the checksum field read as zero. It is a sum
// of a bijective mix of each 8-byte word and its index, so a GPU can compute it as a reduction.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define HL_MAGIC 0x4C445648u  // "HVDL" as read little-endian
#define HL_VERSION 1
#define HL_MAX_NDIM 8
#define HL_BLOCK 32
#define HL_QMAX 1073741823.0  // 2^30 - 1: zigzag codes fit 31 bits
#define HL_HEADER_BYTES 96
#define HL_OUTLIER_BYTES 12

enum HlDType : uint8_t { HL_FLOAT32 = 0, HL_FLOAT16 = 1, HL_BFLOAT16 = 2 };
enum HlMode : uint8_t { HL_MODE_ABS = 0, HL_MODE_REL = 1 };

// flags bit layout
#define HL_FLAG_REL 0x01           // eb_param was relative to the tensor's finite value range
#define HL_FLAG_LOSSLESS 0x02      // codes are raw bits; decoded tensor is bit-identical
#define HL_FLAG_IDENTITY_MAP 0x04  // no duplicate rows: map section empty, n_unique == n_rows
#define HL_FLAG_DITHER 0x08        // subtractive dither, seed in reserved[0..2]
#define HL_DITHER_SEEDS (1u << 24) // dither seeds are 24-bit

struct HlFrameHeader {
  uint32_t magic;          // HL_MAGIC
  uint8_t version;         // HL_VERSION
  uint8_t dtype;           // HlDType
  uint8_t level;           // how the codes are stored: 1 block packing, 2 entropy coded
  uint8_t flags;           // HL_FLAG_*
  uint8_t ndim;            // 0..HL_MAX_NDIM
  uint8_t reserved[3];     // dither seed (little-endian) with HL_FLAG_DITHER, else zero
  uint32_t checksum;       // hl_checksum of the frame with this field as zero
  double eb_param;         // the bound as the caller gave it (relative factor or absolute)
  double eb_abs;           // the absolute bound every element satisfies
  uint64_t n_rows;         // rows in the tensor
  uint64_t row_len;        // elements per row (last dimension)
  uint64_t n_unique;       // distinct rows stored
  uint64_t n_outliers;     // records in the outlier section
  uint64_t map_bytes;      // section sizes in bytes
  uint64_t code_bytes;
  uint64_t outlier_bytes;
  uint64_t total_bytes;    // the whole frame, header included
};
static_assert(sizeof(HlFrameHeader) == HL_HEADER_BYTES, "frame header must be 96 bytes");

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

// Upper bound of any frame for a tensor of n_rows x row_len elements with ndim dims, so that
// all-to-all buffers can be sized before compressing. Holds because the encoder falls back to a
// lossless frame whenever the lossy one would be larger, and a lossless frame packs at most
// elem_bytes*8 <= 32 bits a value, plus the map (absent without duplicates).
HL_HD uint64_t hl_max_frame_bytes(uint64_t n_rows, uint64_t row_len, int ndim) {
  return HL_HEADER_BYTES + 8ull * (uint64_t)ndim + hl_packed_max_bytes(n_rows) +
         hl_packed_max_bytes(n_rows * row_len);
}
#endif
