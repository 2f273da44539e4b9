// The portable kernels of kernels_cpu.h, element by element: the definition every SIMD variant
// (kernels_avx2.cc, kernels_avx512.cc) must match bit for bit, and the tails those variants
// leave to them. Internal to native/cpu.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "codec_common.h"
#include "kernels_cpu.h"

#define HL_INLINE inline __attribute__((always_inline))

namespace hl {
namespace cpu {


// rint for |t| <= 2^30 without SSE4.1's roundsd: adding 1.5 * 2^52 leaves no fraction bits,
// so round-to-nearest-even does the rounding. The build passes -fno-fast-math, so the compiler
// may not fold (t + m) - m. Same result as rint() on the device.
HL_INLINE double round_even(double t) {
  const double magic = 6755399441055744.0;
  return (t + magic) - magic;
}

// A quantizer's row r + k, fetched while it works on row r. Rows picked by idx (the first
// occurrences of distinct rows) lie anywhere in the tensor: each is a cache miss unless fetched
// ahead; kGatherAhead rows ahead covers the miss latency of a few hundred bytes of work per row,
// and the first 1 KiB suffices for the hardware prefetcher to carry on through longer rows. Rows
// in order are fetched kStreamAhead bytes ahead: with the hardware prefetcher alone the
// quantizers waited on memory at about half a read pass's speed (RESULTS, "CPU codec, one
// core"); 4 and 16 KiB ahead were mostly slower than 8. Rows longer than kStreamAhead / 4 bytes (a
// tile quantized as one run) fetch ahead within the row instead (prefetch_within). The SIMD
// range passes fetch as far ahead: 0.59-0.75 of their time (medians of 3-4 rounds, every dtype,
// both kernel paths).
constexpr uint64_t kGatherAhead = 4;
constexpr uint64_t kStreamAhead = 8192;

// A pass over n bytes at p, at byte `at`: the line kStreamAhead bytes on, while there is one.
// The range passes call it once a line; prefetch_within and prefetch_ahead build on it.
HL_INLINE void prefetch_stream(const void* p, uint64_t at, uint64_t n) {
  if (at + kStreamAhead < n) __builtin_prefetch(static_cast<const char*>(p) + at + kStreamAhead);
}

HL_INLINE void prefetch_ahead(const void* base, const uint64_t* idx, uint64_t r, uint64_t rows,
                              uint64_t row_bytes) {
  if (!idx) {
    if (row_bytes == 0 || row_bytes > kStreamAhead / 4) return;
    // kStreamAhead bytes on, in bytes rather than rows: no division a row
    const uint64_t ahead = r * row_bytes + kStreamAhead;
    if (ahead + row_bytes > rows * row_bytes) return;
    // the lines that begin within those row_bytes: each line once, rows under 64 bytes included
    const uintptr_t start = reinterpret_cast<uintptr_t>(base) + ahead;
    for (uintptr_t line = (start + 63) & ~(uintptr_t)63; line < start + row_bytes; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line));
    return;
  }
  if (r + kGatherAhead >= rows) return;
  const char* p = static_cast<const char*>(base) + idx[r + kGatherAhead] * row_bytes;
  const uint64_t n = row_bytes < 1024 ? row_bytes : 1024;
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off);
}

// Within a long row (more than kStreamAhead / 4 bytes, which prefetch_ahead leaves alone):
// the line kStreamAhead bytes past byte `at`, where the row still has it.
HL_INLINE void prefetch_within(const void* row, uint64_t at, uint64_t row_bytes) {
  if (row_bytes > kStreamAhead / 4) prefetch_stream(row, at, row_bytes);
}

template <int DT>
HL_INLINE void range_impl(const void* xv, uint64_t n, double* lo_out, double* hi_out) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* x = static_cast<const raw_t*>(xv);
  // min/max of the values as float is exact, and float lanes vectorize twice as wide as double.
  float lo = INFINITY, hi = -INFINITY;
  for (uint64_t i = 0; i < n; ++i) {
    float v = (float)Elem<DT>::to_double(x[i]);
    bool finite = (f32_bits(v) & 0x7f800000u) != 0x7f800000u;
    float a = finite ? v : INFINITY, b = finite ? v : -INFINITY;
    lo = a < lo ? a : lo;
    hi = b > hi ? b : hi;
  }
  *lo_out = lo;
  *hi_out = hi;
}

// A row hash's eight lanes join as the xor of their 64-bit products with kFoldMul (an odd
// lane's with its halves swapped, so that its low bits reach the table's slot index), in the
// form of the AVX2 quantizer's fold_lanes (two widening multiplies a vector rather than eight
// extracts and four 64-bit multiplies: d32 compress 1.03-1.06x faster, benchmarks/RESULTS.md).
constexpr uint32_t kFoldMul[8] = {0x9e3779b1u, 0x85ebca77u, 0xc2b2ae3du, 0x27d4eb2fu,
                                  0x165667b1u, 0xd3a2646du, 0xfd7046c5u, 0xb55a4f09u};

HL_INLINE uint64_t fold_lane(uint32_t lane, int k) {
  const uint64_t p = (uint64_t)lane * kFoldMul[k];
  return (k & 1) ? (p >> 32 | p << 32) : p;
}

// hash_codes from its eight lanes after the row's full groups of eight (the rest, d % 8 codes,
// still to mix in): independent multiplies, then one finalizer (a chain of mix64 calls per
// row would make the hash latency-bound).
HL_INLINE uint64_t hash_finish(uint32_t* lane, const uint32_t* rest, uint64_t n_rest, uint64_t d) {
  for (uint64_t k = 0; k < n_rest; ++k) lane[k] = (lane[k] ^ rest[k]) * 0x85ebca6bu;
  uint64_t h = d;
  for (int k = 0; k < 8; ++k) h ^= fold_lane(lane[k], k);
  return mix64(h);
}

// Lanes of a multiplicative hash: eight independent chains vectorize; mix64 joins them. The
// lanes' start and multiplier, shared by hash_codes, narrow_hash and the AVX2 quantizer's.
constexpr uint32_t kHashLanes[8] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                    0xa4093822u, 0x299f31d0u, 0x082efa98u, 0xec4e6c89u};
constexpr uint32_t kHashMul = 0x9e3779b1u;

HL_INLINE uint64_t hash_codes(const uint32_t* z, uint64_t d) {
  uint32_t lane[8];
  memcpy(lane, kHashLanes, sizeof lane);
  uint64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] = (lane[k] ^ z[i + k]) * kHashMul;
  return hash_finish(lane, z + i, d - i, d);
}

// narrow_hash from its lanes after the row's whole blocks of 32 codes: the n < 32 bytes left
// at rest, as zero-padded words.
HL_INLINE uint64_t narrow_hash_finish(uint32_t* lane, const uint8_t* rest, uint64_t n,
                                      uint64_t d) {
  uint32_t words[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  memcpy(words, rest, n);
  return hash_finish(lane, words, (n + 3) / 4, d) & ~(1ull << 32);
}

// The dedup hash of a narrow row (every code below 256, no outlier) from its codes as bytes,
// the form its repeats are compared in: hash_codes' lanes over the bytes four to a word
// (little-endian), a multiply a lane per 32 codes. The AVX2 quantizer hashes the 32 bytes it
// has just packed for their store. Bit 32 (the table's tag) is clear (wide_hash sets it), so
// only rows of one kind are ever compared.
HL_INLINE uint64_t narrow_hash(const uint8_t* b, uint64_t d) {
  uint32_t lane[8];
  memcpy(lane, kHashLanes, sizeof lane);
  uint64_t i = 0;
  for (; i + 32 <= d; i += 32)
    for (int k = 0; k < 8; ++k) {
      uint32_t w;
      memcpy(&w, b + i + 4 * k, 4);
      lane[k] = (lane[k] ^ w) * kHashMul;
    }
  return narrow_hash_finish(lane, b + i, d - i, d);
}

// Rows made mostly of outliers share their codes (all marks); mixing the outliers' raw bits
// into the hash keeps such rows from all colliding in the dedup table. x: the row's raw bits (a
// float converted instead would hash every NaN alike, and NaN to an integer is undefined).
template <typename raw_t>
HL_INLINE uint64_t mix_outliers(uint64_t h, const raw_t* x, const uint32_t* z, uint64_t d) {
  static_assert(std::is_integral<raw_t>::value, "mix_outliers takes raw bits");
  for (uint64_t i = 0; i < d; ++i)
    if (z[i] == kOutlierMark) h = mix64(h ^ ((uint64_t)x[i] << 32 | i));
  return h;
}

// A row's hash from its codes (quantize_rows' hashes): hash_codes, and its outliers' raw bits
// where it has any.
template <typename raw_t>
HL_INLINE uint64_t codes_hash(const raw_t* x, const uint32_t* z, uint64_t d, bool outlier) {
  return outlier ? mix_outliers(hash_codes(z, d), x, z, d) : hash_codes(z, d);
}

// The dedup hash of a wide row of quantize_rows_narrow (a code of 256 or more, or an outlier):
// codes_hash with bit 32 (the table's tag) set, which narrow_hash leaves clear.
template <typename raw_t>
HL_INLINE uint64_t wide_hash(const raw_t* x, const uint32_t* z, uint64_t d, bool outlier) {
  return codes_hash(x, z, d, outlier) | (1ull << 32);
}

template <int DT>
HL_INLINE void quantize_impl(const void* xv, const uint64_t* idx, uint64_t rows, uint64_t d,
                             const QuantParams& qp, uint32_t* codes, uint8_t* row_outlier,
                             uint64_t* hashes) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* xs = static_cast<const raw_t*>(xv);
  const double step = qp.step, inv_step = qp.inv_step, eb_abs = qp.eb_abs;
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_ahead(xs, idx, r, rows, d * sizeof(raw_t));
    const raw_t* x = xs + (idx ? idx[r] : r) * d;
    uint32_t* z = codes + r * d;
    uint32_t any = 0;
    for (uint64_t i = 0; i < d; ++i) {
      // Same decisions as hl::quantize (codec_common.h), written without branches.
      const double u = qp.dither ? dither_unit(qp.seed, qp.first + r * d + i) * step : 0.0;
      double v = Elem<DT>::to_double(x[i]);
      double s = (v - u) * inv_step;
      bool in_range = fabs(s) <= HL_QMAX;
      int32_t q = (int32_t)round_even(in_range ? s : 0.0);
      double back = Elem<DT>::to_double(reconstruct<DT>(q, step, u));
      bool ok = in_range & (fabs(v - back) <= eb_abs);
      z[i] = ok ? zigzag(q) : kOutlierMark;
      any |= !ok;
    }
    row_outlier[r] = (uint8_t)any;
    if (hashes) hashes[r] = codes_hash(x, z, d, any);
  }
}

template <int DT>
HL_INLINE void raw_impl(const void* xv, const uint64_t* idx, uint64_t rows, uint64_t d,
                        uint32_t* codes) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* xs = static_cast<const raw_t*>(xv);
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_ahead(xs, idx, r, rows, d * sizeof(raw_t));
    const raw_t* x = xs + (idx ? idx[r] : r) * d;
    for (uint64_t i = 0; i < d; ++i) codes[r * d + i] = x[i];
  }
}

template <int DT>
HL_INLINE void dequantize_dithered_impl(const uint32_t* z, uint64_t n, double step, uint32_t seed,
                                        uint64_t first, void* outv) {
  typedef typename Elem<DT>::raw_t raw_t;
  raw_t* out = static_cast<raw_t*>(outv);
  for (uint64_t i = 0; i < n; ++i)
    out[i] = reconstruct<DT>(unzigzag(z[i]), step, dither_unit(seed, first + i) * step);
}

template <int DT>
HL_INLINE void dequantize_impl(const uint32_t* z, uint64_t n, double step, void* outv) {
  typedef typename Elem<DT>::raw_t raw_t;
  raw_t* out = static_cast<raw_t*>(outv);
  for (uint64_t i = 0; i < n; ++i) out[i] = reconstruct<DT>(unzigzag(z[i]), step);
}

// Where float32's reconstruct (codec_common.h: float((double)q * step + u)) can be formed in
// single precision with the same bits: returns the bits a zigzag code may have (any other set
// sends it to the double form), 0 when step allows none. For step a float of p significant bits
// in [2^-100, 2^100] (a frame's step has at most 16: frame.h's bound code), q * step is exact
// in float while |q| <= 2^(24 - p) and rounds once, as the double form does, while |q| <= 2^24;
// a dither offset u is k * step * 2^-25 with k odd and |k| < 2^24 (dither_unit), so
// q * step + u is exact in double (at most 50 bits) and its rounding to float is the one
// rounding of fma(k, step * 2^-25, q * step) in single precision. No subnormal arises.
HL_INLINE uint32_t f32_exact_codes(double step, bool dithered) {
  if (!(step >= 0x1p-100 && step <= 0x1p100)) return 0;
  const float f = (float)step;
  if ((double)f != step) return 0;
  const int p = dithered ? 24 - __builtin_ctz((f32_bits(f) & 0x7fffffu) | 0x800000u) : 0;
  return (1u << (25 - p)) - 1;  // zigzag codes below 2^(25 - p): -2^(24 - p) <= q < 2^(24 - p)
}

// The high half of the element index enters the dither hash through one mix32 that is the same
// for 2^32 elements in a row: computed again only when that half changes.
struct DitherInner {
  uint32_t seed;
  uint64_t high = ~0ull;
  uint32_t inner = 0;
  uint32_t of(uint64_t first) {
    if ((first >> 32) != high) {
      high = first >> 32;
      inner = mix32((uint32_t)high ^ (seed * 0x9e3779b9u));
    }
    return inner;
  }
};

}  // namespace cpu
}  // namespace hl
