// The CUDA encoder of format-2 segments at level 1 (frame.h), one file a stage, every stage
// enqueued on the caller's stream with no host sync inside:
//   encode_quantize.cu  finite range (rel mode) -> the absolute bound on the device, rounded to
//                       the 24 bits format 2 stores -> codes (zigzag, or kOutlierMark) and row
//                       outlier flags
//   encode_dedup.cu     row content hash, radix sort of (hash, row), first identical row within
//                       each hash run, exclusive scan of "first of its kind" flags = unique ids in
//                       first-occurrence order -> dedup_pays -> gather unique rows -> outlier
//                       counts per unique row, their scan, codes at outliers zeroed
//   encode_sections.cu  block packing of the map (warp OR for widths, scan, ballot bit planes);
//                       the code section sized three ways (block packing, radix, short blocks),
//                       level1_packing picks and only the chosen one is written
//   encode.cu           outlier records, the lossless decision, the results; the one scratch
//                       allocation and the order of the stages (encode_segments)
// A segment's payload (map, code, outliers) goes to offset 0 of its slot; frames.cu writes the
// frame around the payloads. Every size the host cannot know yet (n_unique, section sizes, the
// packing) lives in an EncodeState on the device; kernels are launched over worst-case counts
// known on the host and read the real counts from the state. The host learns the sizes with one
// copy at the end. A lossy segment whose sections break the size bound (lossy_exceeds_bound) is
// not finished on the device (its outliers are skipped); the host then encodes it again,
// lossless (a second copy).
#pragma once

#include "codec_cuda_device.cuh"
#include "elements.h"
#include "level1_sections.h"

namespace hl {
namespace gpu {

// What the device knows about one segment. Offsets are from the payload's first byte.
struct alignas(16) EncodeState {
  unsigned long long lo_key, hi_key;  // finite range, order_key encoded
  double eb_abs, step, inv_step;
  uint32_t lossless;  // codes are raw bits
  uint32_t dithered;  // subtractive dither with `seed` (lossy segments only)
  uint32_t seed;
  uint32_t error;     // kEncodeBoundOverflow
  uint32_t identity;  // no map section
  uint32_t fallback;  // lossy segment too large: encode again lossless
  uint32_t bound;     // hl_bound_code of the bound the codes use
  uint32_t max_code;  // largest stored code: radix K and whether short blocks apply
  uint32_t packing;   // Level1Packing of the code section
  uint32_t radix_k, radix_g;
  uint64_t radix_G, radix_head, radix_vals_bytes;
  uint64_t n_unique_found;  // distinct rows before the dedup_pays rule
  uint64_t n_unique, n_codes, map_count, n_outliers;
  uint64_t map_bytes, code_off, code_bytes, outlier_off, total;
  uint32_t* ucodes;  // codes of the unique rows: the quantized codes themselves, or gathered
};

// The per-element rule (elements.h) of the segment whose bound prepare has set.
__device__ inline ElementRule rule_of(const EncodeState* st) {
  ElementRule r;
  r.step = st->step;
  r.inv_step = st->inv_step;
  r.eb_abs = st->eb_abs;
  r.seed = st->seed;
  r.lossless = st->lossless;
  r.dithered = st->dithered;
  return r;
}

constexpr uint32_t kEncodeBoundOverflow = 1;

// One segment to encode: a tensor of n_rows x row_len elements.
struct EncodeJob {
  const void* x_dev;
  uint8_t dtype, mode;
  bool dedup;
  bool dither;     // subtractive dither with `seed` (turns dedup off, as on the CPU)
  uint32_t seed;
  double eb;
  uint64_t n_rows, row_len;
  uint8_t* payload_dev;  // room for segment_slot_bytes

  uint64_t n() const { return n_rows * row_len; }
  // Map entries are uint32; the CPU codec has the same limit in practice (4 billion rows).
  // Dithered rows never repeat (each element has its own offset): no dedup, as cpu/encode.cc.
  bool dedups() const { return dedup_applies(dedup && !dither, n_rows, row_len); }
  // radix values (g >= 2: at most half the codes) and short blocks of the code section
  uint64_t max_values() const { return hl_div_up(n(), 2); }
  uint64_t max_short_blocks() const { return short_n_blocks(n()); }
};

// Scratch sized for the largest job; jobs run one after another on the stream and share it.
struct EncodeScratch {
  uint32_t *codes, *gathered;
  uint8_t* row_outlier;
  uint32_t *keys, *keys_sorted, *rows, *rows_sorted, *run_head, *run_start;
  uint32_t *first_of, *flag, *uid, *map, *first;
  uint64_t *out_count, *out_off;
  uint64_t *width, *word_off;      // block widths of the map or the codes, their scan
  uint32_t* values;                // radix values
  uint64_t *rwidth, *rword_off;    // ... their block widths
  uint64_t *swidth, *sword_off;    // short-block widths
  CubScratch cub;
};

// The stages, in the order encode.cu enqueues them.
// The bound, the codes and the row outlier flags; force_lossless: code the raw bits.
void enqueue_quantize(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                      bool force_lossless, cudaStream_t stream);
// The unique rows and the map (when j.dedups()), the stored codes, the outlier counts.
void enqueue_dedup(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                   cudaStream_t stream);
// The map and code sections.
void enqueue_sections(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                      cudaStream_t stream);

}  // namespace gpu
}  // namespace hl
