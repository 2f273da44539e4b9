// One element of a segment as both codecs code it (frame.h "Quantization", "Subtractive
// dither"): the rule a segment's elements share, the dither offset of element i, the code an
// element is stored with and the value a code decodes to. Each function is per element and
// HL_HD, so a GPU thread runs it for its element and the host build runs the very same function
// in the GPU's decomposition (native/testing/bindings_test.cc: elements_hd), which the tests hold
// against the CPU encoder's and decoder's bytes (tests/test_device_elements.py). The CPU codec's
// vectorized loops (cpu/kernels_avx2.cc, kernels_avx512.cc) make the same decisions with the same arithmetic:
// hl::quantize, hl::reconstruct and hl::dither_unit of codec_common.h.
#pragma once

#include "codec_common.h"

#ifdef __cplusplus
namespace hl {

// What every element of one segment is coded with. Index i is the element's row-major position
// in the segment (row r, column c: r * row_len + c), the index the dither hashes.
struct ElementRule {
  double step = 0, inv_step = 0, eb_abs = 0;
  uint32_t seed = 0;      // the segment's dither seed
  bool lossless = false;  // codes are the raw bits
  bool dithered = false;  // subtractive dither (never with lossless)
};

// The rule of a lossy segment of absolute bound eb_abs (already rounded to the 24 bits the frame
// stores), dithered with `seed` when dither is on; lossless when eb_abs is 0. A lossless segment
// is never dithered: the encoders turn dither off with the bound.
HL_HD ElementRule element_rule(double eb_abs, bool lossless, bool dither, uint32_t seed) {
  ElementRule r;
  r.lossless = lossless || eb_abs == 0;
  r.eb_abs = r.lossless ? 0 : eb_abs;
  r.step = 2.0 * r.eb_abs;
  r.inv_step = r.lossless ? 0 : 1.0 / r.step;
  r.dithered = dither && !r.lossless;
  r.seed = seed;
  return r;
}

// Element i's dither offset u_i (frame.h): 0 without dither.
HL_HD double element_offset(const ElementRule& r, uint64_t i) {
  return r.dithered ? dither_unit(r.seed, i) * r.step : 0.0;
}

// The code element i is stored with before outliers leave the code section: its raw bits when
// lossless, else its zigzag code, or kOutlierMark for an element the outlier section keeps
// (NaN, +-Inf, out of range, or a rounding that misses the bound).
template <int DT>
HL_HD uint32_t element_code(const ElementRule& r, typename Elem<DT>::raw_t raw, uint64_t i) {
  if (r.lossless) return raw;
  uint32_t z;
  return quantize<DT>(raw, r.inv_step, r.step, r.eb_abs, &z, element_offset(r, i)) ? z
                                                                                  : kOutlierMark;
}

// The value a lossy code z of element i decodes to (an outlier's value is its record's bits).
template <int DT>
HL_HD typename Elem<DT>::raw_t element_value(const ElementRule& r, uint32_t z, uint64_t i) {
  return reconstruct<DT>(unzigzag(z), r.step, element_offset(r, i));
}

}  // namespace hl
#endif
