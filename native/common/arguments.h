// The arguments of a compress call and the rules every encoder (CPU and CUDA) applies to them:
// their checks, how a shape cuts into rows, and the relative-bound rule, the last HL_HD so that
// the CUDA encoder computes a segment's bound on the device with the very same function.
#pragma once

#include <math.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "errors.h"
#include "frame.h"

namespace hl {

struct CompressParams {
  uint8_t dtype;      // HlDType
  uint8_t mode;       // HlMode
  uint8_t level;      // 1 block packing, 2 entropy coded
  bool dedup;         // drop duplicate rows
  double error_bound; // relative factor (mode rel) or absolute bound; 0 = lossless
  bool dither = false;       // subtractive dither (frame.h); turns dedup off
  uint32_t dither_seed = 0;  // < HL_DITHER_SEEDS; chunk i of compress_many uses seed + i
  // Take each piece's finite value range even when its bound does not need it, for the
  // statistics compress_into_cpu hands back (the adaptive controller's, read at no extra pass).
  bool want_range = false;
  // The caller's key of each row (dim 0), or null: rows of a piece with equal keys are taken
  // as duplicates without comparing hashes (the CPU encoder still checks their bits; the CUDA
  // encoder ignores them). Only for pieces of shape (rows, row_len), where a row is an entry
  // of dim 0; plan_pieces points each piece at its own keys.
  const int64_t* ids = nullptr;
  // With ids, or null: one byte a row (dim 0), nonzero for a row the caller has filled with +0.0
  // (hvd_lossy.reuse's references, written so by its native pass). Such rows of a piece are
  // taken as one row without being read or numbered: only the first is read (and quantized).
  // A promise, not a check, so only the codec's own callers set it; plan_pieces points each
  // piece at its own bytes.
  const uint8_t* zero_rows = nullptr;
};

// The pieces of a grouped call (compress_into_cpu, compress_into_cuda): piece i is rows[i] rows of
// `trailing` dims, coded within error_bounds[i]; groups[g] consecutive pieces make group g's
// frame, prefix_bytes left before each; ext is the transport's extension in every frame.
struct GroupedCall {
  const std::vector<int64_t>& rows;
  const std::vector<int64_t>& trailing;
  const std::vector<double>& error_bounds;
  const std::vector<int64_t>& groups;
  uint64_t prefix_bytes;
  const std::string& ext;
};

// The absolute bound of a segment whose finite values span [lo, hi] (lo > hi when none are
// finite) for the caller's bound eb_param: eb_param itself, or (rel) eb_param times the range,
// 0 for a zero or empty range. Not finite when the product overflows a double (the caller
// refuses it). The segment then codes with hl_bound_of_code(hl_bound_code(this)) (frame.h).
HL_HD double absolute_bound(bool rel, double eb_param, double lo, double hi) {
  return rel ? (hi > lo ? eb_param * (hi - lo) : 0.0) : eb_param;
}

// Throws ArgumentError unless `dtype` is one of the codec's dtype codes.
inline void check_dtype_code(uint8_t dtype) {
  if (dtype > HL_BFLOAT16)
    throw ArgumentError("unsupported dtype code " + std::to_string(dtype) +
                        ", expected float32 (0), float16 (1) or bfloat16 (2)");
}

// Checks the parameters and throws ArgumentError naming the bad value.
inline void check_params(const CompressParams& p) {
  check_dtype_code(p.dtype);
  if (p.mode != HL_MODE_ABS && p.mode != HL_MODE_REL)
    throw ArgumentError("unsupported mode code " + std::to_string(p.mode) +
                        ", expected abs (0) or rel (1)");
  if (p.level != 1 && p.level != 2)
    throw ArgumentError("unsupported level " + std::to_string(p.level) + ", expected 1 or 2");
  if (!(p.error_bound >= 0) || !isfinite(p.error_bound))
    throw ArgumentError("error_bound must be a finite number >= 0, got " +
                        std::to_string(p.error_bound));
  if (p.dither_seed >= HL_DITHER_SEEDS)
    throw ArgumentError("dither seed " + std::to_string(p.dither_seed) +
                        " is out of range, expected 0.." + std::to_string(HL_DITHER_SEEDS - 1));
}

// Rows and row length of a shape: the last dimension is a row; 0-d and 1-d tensors are one row.
// Throws ArgumentError for more than HL_MAX_NDIM dimensions or a negative one.
inline void shape_to_rows(const std::vector<int64_t>& shape, uint64_t* n_rows, uint64_t* row_len) {
  if (shape.size() > HL_MAX_NDIM)
    throw ArgumentError("tensor has " + std::to_string(shape.size()) + " dimensions, at most " +
                        std::to_string(HL_MAX_NDIM) + " supported");
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) {
    if (shape[i] < 0) throw ArgumentError("negative dimension " + std::to_string(shape[i]));
    rows *= (uint64_t)shape[i];
  }
  *n_rows = shape.size() <= 1 ? 1 : rows;
  *row_len = shape.empty() ? 1 : (uint64_t)shape.back();
}

// Checks the arguments of compress_many_* (params, one bound a chunk when given, trailing
// dimensions >= 0); returns the elements a row of dim 0 holds.
inline uint64_t check_chunk_args(const CompressParams& p, size_t n_chunks,
                          const std::vector<int64_t>& trailing,
                          const std::vector<double>& error_bounds) {
  check_params(p);
  if (!error_bounds.empty() && error_bounds.size() != n_chunks)
    throw ArgumentError("got " + std::to_string(error_bounds.size()) + " error bounds for " +
                        std::to_string(n_chunks) + " chunks");
  uint64_t row_elems = 1;
  for (int64_t s : trailing) {
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
    row_elems *= (uint64_t)s;
  }
  return row_elems;
}

// The absolute bound of p's bound (the rule above), ArgumentError when it overflows.
inline double absolute_bound(const CompressParams& p, double lo, double hi) {
  const double eb = absolute_bound(p.mode == HL_MODE_REL, p.error_bound, lo, hi);
  if (!isfinite(eb))
    throw ArgumentError("error_bound " + std::to_string(p.error_bound) +
                        " times the value range overflows a double");
  return eb;
}

}  // namespace hl
