// The CPU encoder's stages, in the order a segment goes through them (encode.cc runs them):
// the value range and, for lossless frames and rows with ids, the rows repeated bit for bit
// (dedup.cc); quantization and the rows that share codes, which for lossy frames without ids
// is the whole dedup (quantize.cc); the map, code and outlier sections and the level-2 coding of
// a frame's small segments together (sections.cc). Each stage is instantiated for the three
// dtypes of frame.h.
#pragma once

#include <math.h>
#include <stdint.h>

#include <vector>

#include "codec_common.h"
#include "radix.h"
#include "scratch.h"

namespace hl {
namespace enc {

// A piece's elements: n_rows rows of row_len raw values of dtype DT.
template <int DT>
struct Tensor {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* x;
  uint64_t n_rows, row_len;
  uint64_t size() const { return n_rows * row_len; }
};

// How a call's pieces share the threads (encode.cc and stats.cc). Many small pieces: one thread each (parallel_items,
// which never waits for a helper that has no core). Few large ones: each piece uses all
// threads in turn.
struct PieceThreads {
  int across;  // threads over the pieces
  int inner;   // threads within one piece
};

inline PieceThreads piece_threads(size_t n, int threads) {
  const bool across = (int)n >= threads && n > 1;
  return {across ? threads : 1, across ? 1 : threads};
}

// ---- dedup.cc ----------------------------------------------------------------------------

// Smallest and largest finite value, as double (lo > hi when there is none).
template <int DT>
void finite_range(const Tensor<DT>& t, int threads, double* lo_out, double* hi_out);

// Rows repeated bit for bit, found in one pass over the tensor: blocks of rows are hashed (in
// parallel) and numbered while still in cache, and the finite value range is taken from the
// same blocks when the bound is relative.
struct DistinctRows {
  Buffer<uint32_t> map;         // row -> distinct row
  std::vector<uint64_t> first;  // distinct row -> its first row
};

template <int DT>
DistinctRows distinct_raw_rows(const Tensor<DT>& t, bool need_range, int threads, double* lo,
                               double* hi);

// The same from the caller's ids (one a row): a row is compared only with the earlier rows
// whose id hashes as its own, and is their repeat when its bits are the same, so ids that lie
// cost speed, never the bound (a row that differs is a distinct row of its own). The result
// equals distinct_raw_rows' up to rows repeated under different ids, which code_distinct_rows'
// merging of equal codes joins again in lossy frames: the frame is the same bytes. One thread:
// what is left is the serial part of distinct_raw_rows (its numbering and comparisons), whose
// parallel part (hashing every row) it skips. zero_rows (or null): CompressParams::zero_rows,
// rows taken as one distinct row, the first of them, with no read and no probe.
template <int DT>
DistinctRows distinct_rows_by_id(const Tensor<DT>& t, const int64_t* ids,
                                 const uint8_t* zero_rows, bool need_range, double* lo,
                                 double* hi);

// ---- quantize.cc --------------------------------------------------------------------------

// Subtractive dither of a frame (frame.h); on only for lossy frames, which then skip dedup.
struct Dither {
  bool on = false;
  uint32_t seed = 0;
};

// The rows a frame stores, coded: unique rows in order of first occurrence.
struct Coded {
  uint64_t n_unique = 0;
  Buffer<uint32_t> codes;        // n_unique x row_len: zigzag codes, kOutlierMark, or raw bits
  // Lossy level-1 codes that all fit a byte (no code of 256 or more, no outlier's mark: rel
  // bounds above ~0.004) come as bytes instead, and `codes` is empty: the sections then read a
  // quarter of the memory.
  Buffer<uint8_t> bytes;
  Buffer<uint8_t> row_outlier;   // per unique row (lossy frames)
  Buffer<uint64_t> source;  // tensor row of each unique row; empty when it is the identity
  Buffer<uint32_t> map;          // tensor row -> unique row; only when n_unique < n_rows
  // The codes' level-1 widths and largest code (short_blocks.h level1_widths), when the
  // quantizing took them (w32 not empty); they hold as long as no code is an outlier's mark,
  // which the sections turn into 0.
  Buffer<uint8_t> w16, w32;
  uint32_t max_code = 0;
};

// Quantizes every row (distinct null), or stores the raw bits of a lossless piece's distinct
// rows once each (distinct from distinct_raw_rows or distinct_rows_by_id). With `widths`, lossy
// codes come with their level-1 widths (Coded::w16), for level-1 frames.
// max_abs: at least every finite element's |x|, where the range says so (it only helps the
// quantizer skip a check: cpu::QuantParams::max_abs).
template <int DT>
Coded code_rows(const Tensor<DT>& t, DistinctRows* distinct, bool lossless, double eb_abs,
                const Dither& dither, int threads, bool widths = false,
                double max_abs = INFINITY);

// Lossy frames with dedup: every row quantized, a block at a time, and numbered by its codes
// (and its outliers' raw bits) while the block is still in cache, against the unique rows'
// codes kept as bytes where they fit one (hot rows' codes are small). One streaming pass over
// the tensor, and a repeated row is compared with a compact copy rather than with its first
// occurrence somewhere in the tensor. With `repeats` (distinct_rows_by_id), only the distinct
// rows it leaves are quantized and numbered, and every other row takes its distinct row's unique
// row: the same unique rows in the same order, so the same frame. With `widths`, the unique
// codes come with their level-1 widths (Coded::w16), taken after each block over the unique rows
// it added.
template <int DT>
Coded code_distinct_rows(const Tensor<DT>& t, const DistinctRows* repeats, double eb_abs,
                         int threads, bool widths = false, double max_abs = INFINITY);

// ---- sections.cc --------------------------------------------------------------------------

struct Outlier {
  uint64_t pos;
  uint32_t raw;
};

// Block packing in two steps, so that level 2 can compare sizes before packing anything.
// Lossy level-1 codes may be radix packed or in short blocks instead (radix.h,
// short_blocks.h), whichever is smallest (level1_packing).
struct Packing {
  Buffer<uint8_t> widths;
  uint64_t bytes = 0;
  RadixPlan radix;  // radix.k != 0: the section is radix.bytes of radix packing
  bool short_blocks = false;  // the section is bytes of short blocks of widths16
  Buffer<uint8_t> widths16;
};

struct Sections {
  bool map_rans = false;  // the map is a compact rANS section of rans_map_symbols
  bool map_buckets = false;  // ... of bucketed symbols (map_buckets.h)
  Bytes map;
  Bytes code;
  std::vector<Outlier> outliers;
  uint8_t level = 1;
  uint64_t n_unique = 0;
  // Level 2, small: codes whose entropy coding waits for the frame's other segments
  // (encode_deferred), so that they may share one table; plan packs them if that is smaller.
  Buffer<uint32_t> deferred;
  uint64_t n_deferred = 0;
  Packing plan;
  // Level 1: n_pending codes (bytes or codes, or neither for a radix plan, which holds its
  // values) that write_code packs by plan straight into the frame: built here first, a
  // section of megabytes was copied there whole.
  Buffer<uint8_t> pending_bytes;
  Buffer<uint32_t> pending_codes;
  uint64_t n_pending = 0;
  // (a deferred section ends up no larger than its packing)
  uint64_t code_bytes() const { return n_deferred || n_pending ? plan.bytes : code.size(); }
};

// Writes a section's code (code_bytes() bytes) at out.
void write_code(const Sections& s, int threads, uint8_t* out);

// Builds the map, code and outlier sections of coded rows (outliers' raw bits from t); a
// small level-2 code section waits in Sections::deferred for encode_deferred.
template <int DT>
Sections build_sections(const Tensor<DT>& t, Coded& c, bool lossless, uint8_t level,
                        int threads);

// Entropy codes the deferred code sections among one frame's segments: with one table the first
// of them carries and the others borrow (frame.h) when every level-2 segment of the frame is
// deferred and that is estimated smaller, else each with its own; packed where that is smaller.
void encode_deferred(const std::vector<Sections*>& segs, int threads);

}  // namespace enc
}  // namespace hl
