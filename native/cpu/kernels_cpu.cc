#include "kernels_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#include "quantize_f32_fast.h"
#define HL_HAVE_AVX2_PATH 1
// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised _mm512_undefined_*()
// values and then warn about them in every caller: not our variables, so not our warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_CLONES)
#define HL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HL_CLONES
#endif
#define HL_INLINE inline __attribute__((always_inline))
#define HL_AVX2_LAMBDA __attribute__((target("avx2"), always_inline))

namespace hl {
namespace cpu {
namespace {

// rint for |t| <= 2^30 without SSE4.1's roundsd: adding 1.5 * 2^52 leaves no fraction bits,
// so round-to-nearest-even does the rounding. The build passes -fno-fast-math, so the compiler
// may not fold (t + m) - m. Same result as rint() on the device.
HL_INLINE double round_even(double t) {
  const double magic = 6755399441055744.0;
  return (t + magic) - magic;
}

// Rows picked by idx (the first occurrences of distinct rows) lie anywhere in the tensor: each
// is a cache miss unless fetched ahead. kGatherAhead rows ahead covers the miss latency of a
// few hundred bytes of work per row; the first 1 KiB suffices for the hardware prefetcher to
// carry on through longer rows.
constexpr uint64_t kGatherAhead = 4;

HL_INLINE void prefetch_gathered(const void* base, const uint64_t* idx, uint64_t r, uint64_t rows,
                                 uint64_t row_bytes) {
  if (!idx || r + kGatherAhead >= rows) return;
  const char* p = static_cast<const char*>(base) + idx[r + kGatherAhead] * row_bytes;
  const uint64_t n = row_bytes < 1024 ? row_bytes : 1024;
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off);
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

// Lanes of a multiplicative hash: eight independent chains vectorize; mix64 joins them.
HL_INLINE uint64_t hash_codes(const uint32_t* z, uint64_t d) {
  uint32_t lane[8] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                      0xa4093822u, 0x299f31d0u, 0x082efa98u, 0xec4e6c89u};
  uint64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] = (lane[k] ^ z[i + k]) * 0x9e3779b1u;
  for (int k = 0; i < d; ++i, ++k) lane[k] = (lane[k] ^ z[i]) * 0x85ebca6bu;
  // Independent multiplies, then one finalizer: a chain of mix64 calls per row would make the
  // hash latency-bound.
  uint64_t h = d;
  h ^= ((uint64_t)lane[0] | ((uint64_t)lane[1] << 32)) * 0x9e3779b97f4a7c15ull;
  h ^= ((uint64_t)lane[2] | ((uint64_t)lane[3] << 32)) * 0xc2b2ae3d27d4eb4full;
  h ^= ((uint64_t)lane[4] | ((uint64_t)lane[5] << 32)) * 0x165667b19e3779f9ull;
  h ^= ((uint64_t)lane[6] | ((uint64_t)lane[7] << 32)) * 0xd6e8feb86659fd93ull;
  return mix64(h);
}

// Rows made mostly of outliers share their codes (all marks); mixing the outliers' raw bits
// into the hash keeps such rows from all colliding in the dedup table.
template <typename raw_t>
HL_INLINE uint64_t mix_outliers(uint64_t h, const raw_t* x, const uint32_t* z, uint64_t d) {
  for (uint64_t i = 0; i < d; ++i)
    if (z[i] == kOutlierMark) h = mix64(h ^ ((uint64_t)x[i] << 32 | i));
  return h;
}

// hash_codes from its eight lanes after the row's full groups of eight (the rest, d % 8 codes,
// still to mix in).
HL_INLINE uint64_t hash_finish(uint32_t* lane, const uint32_t* rest, uint64_t n_rest, uint64_t d) {
  for (uint64_t k = 0; k < n_rest; ++k) lane[k] = (lane[k] ^ rest[k]) * 0x85ebca6bu;
  uint64_t h = d;
  h ^= ((uint64_t)lane[0] | ((uint64_t)lane[1] << 32)) * 0x9e3779b97f4a7c15ull;
  h ^= ((uint64_t)lane[2] | ((uint64_t)lane[3] << 32)) * 0xc2b2ae3d27d4eb4full;
  h ^= ((uint64_t)lane[4] | ((uint64_t)lane[5] << 32)) * 0x165667b19e3779f9ull;
  h ^= ((uint64_t)lane[6] | ((uint64_t)lane[7] << 32)) * 0xd6e8feb86659fd93ull;
  return mix64(h);
}

// The dedup hash of a row of quantize_rows_narrow: hash_codes of its codes, and its outliers'
// bits, with bit 32 (the table's tag) set for a wide row, so that only rows of one kind are
// ever compared.
template <typename raw_t>
HL_INLINE uint64_t row_hash(const raw_t* x, const uint32_t* z, uint64_t d, bool narrow,
                            bool outlier) {
  if (narrow) return hash_codes(z, d) & ~(1ull << 32);
  const uint64_t h = outlier ? mix_outliers(hash_codes(z, d), x, z, d) : hash_codes(z, d);
  return h | (1ull << 32);
}

template <int DT>
HL_INLINE void quantize_impl(const void* xv, const uint64_t* idx, uint64_t rows, uint64_t d,
                             const QuantParams& qp, uint32_t* codes, uint8_t* row_outlier,
                             uint64_t* hashes) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* xs = static_cast<const raw_t*>(xv);
  const double step = qp.step, inv_step = qp.inv_step, eb_abs = qp.eb_abs;
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_gathered(xs, idx, r, rows, d * sizeof(raw_t));
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
    if (hashes) hashes[r] = any ? mix_outliers(hash_codes(z, d), x, z, d) : hash_codes(z, d);
  }
}

template <int DT>
HL_INLINE void raw_impl(const void* xv, const uint64_t* idx, uint64_t rows, uint64_t d,
                        uint32_t* codes) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* xs = static_cast<const raw_t*>(xv);
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_gathered(xs, idx, r, rows, d * sizeof(raw_t));
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


#ifdef HL_HAVE_AVX2_PATH
// float32 fast paths with AVX2 (and below, AVX-512) intrinsics. Compilers do not vectorize the portable loops (IEEE
// min/max and selects), so these spell out the same arithmetic: every operation is the IEEE one
// the scalar code performs (double multiply, round-to-nearest-even conversions), so results are
// identical bit for bit; tests/test_codec.py compares both paths.
// HVD_LOSSY_NO_AVX2=1 forces the portable loops, HVD_LOSSY_NO_AVX512=1 the AVX2 ones (the
// tests compare the three paths' frames).
bool cpu_has_avx2() { return simd_level() >= 1; }
bool cpu_has_avx512() { return simd_level() >= 2; }

__attribute__((target("avx2"))) void range_f32_avx2(const float* x, uint64_t n, double* lo_out,
                                                    double* hi_out) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
  __m256 lo = pinf, hi = ninf;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 bad = _mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp_mask), exp_mask));
    lo = _mm256_min_ps(lo, _mm256_blendv_ps(v, pinf, bad));
    hi = _mm256_max_ps(hi, _mm256_blendv_ps(v, ninf, bad));
  }
  float l[8], h[8];
  _mm256_storeu_ps(l, lo);
  _mm256_storeu_ps(h, hi);
  double tl, th;
  range_impl<HL_FLOAT32>(x + i, n - i, &tl, &th);
  for (int k = 0; k < 8; ++k) {
    tl = l[k] < tl ? l[k] : tl;
    th = h[k] > th ? h[k] : th;
  }
  *lo_out = tl;
  *hi_out = th;
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

// hl::dither_unit's 24 hashed bits of eight consecutive elements (low index half lo, lo + 7
// below 2^32), eight 32-bit lanes at once; the AVX2 and AVX-512 generators share it.
__attribute__((target("avx2"))) inline __m256i dither_bits8(uint32_t lo, uint32_t inner) {
  __m256i h = _mm256_xor_si256(
      _mm256_add_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
      _mm256_set1_epi32((int)inner));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return _mm256_srli_epi32(h, 8);
}

// Dither offsets (hl::dither_unit(seed, first + k) * step) of four elements from their hashed
// bits, with the scalar arithmetic: the 24 bits convert to double exactly, then one multiply.
__attribute__((target("avx2"))) inline __m256d dither_offsets4(__m128i bits, __m256d step) {
  const __m256d unit = _mm256_sub_pd(
      _mm256_mul_pd(_mm256_add_pd(_mm256_cvtepi32_pd(bits), _mm256_set1_pd(0.5)),
                    _mm256_set1_pd(1.0 / 16777216.0)),
      _mm256_set1_pd(0.5));
  return _mm256_mul_pd(unit, step);
}

// The offsets of eight consecutive elements as two vectors of four: the hash eight lanes wide
// (half the integer work a lane of four-wide hashing, and the high half's mix32 once per call
// rather than once per four elements). Returns false when the eight indices cross a 2^32
// boundary (the caller goes scalar).
__attribute__((target("avx2"))) inline bool dither8_avx2(DitherInner& di, uint64_t first,
                                                         __m256d step, __m256d* u0, __m256d* u1) {
  const uint32_t lo = (uint32_t)first;
  if (lo > 0xfffffff8u) return false;
  const __m256i bits = dither_bits8(lo, di.of(first));
  *u0 = dither_offsets4(_mm256_castsi256_si128(bits), step);
  *u1 = dither_offsets4(_mm256_extracti128_si256(bits, 1), step);
  return true;
}

// Four elements: zigzag codes (or the outlier mark) and the lanes that miss (all ones). Codes
// x - u and reconstructs q * step + u (hl::quantize); plain frames pass u = 0, which changes no
// bit. The miss mask is built from the complements of hl::quantize's tests (NLE_UQ is true for
// NaN, as !(a <= b) is), so a code is its zigzag or'ed with the mask, and a row's misses are
// or'ed into one vector: one movemask a row rather than one a vector.
__attribute__((target("avx2"))) inline __m256d quantize4_f32(const float* x, __m256d inv,
                                                             __m256d step, __m256d eb, __m256d u,
                                                             uint32_t* z) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m256d qmax = _mm256_set1_pd(HL_QMAX);
  const __m256d magic = _mm256_set1_pd(6755399441055744.0);
  __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x));
  __m256d s = _mm256_mul_pd(_mm256_sub_pd(v, u), inv);
  __m256d out_of_range = _mm256_cmp_pd(_mm256_and_pd(s, abs_mask), qmax, _CMP_NLE_UQ);
  __m256d r = _mm256_sub_pd(_mm256_add_pd(_mm256_andnot_pd(out_of_range, s), magic), magic);
  __m128i q = _mm256_cvttpd_epi32(r);
  __m256d back = _mm256_cvtps_pd(
      _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(q), step), u)));
  __m256d err = _mm256_and_pd(_mm256_sub_pd(v, back), abs_mask);
  __m256d bad = _mm256_or_pd(out_of_range, _mm256_cmp_pd(err, eb, _CMP_NLE_UQ));
  __m128i bad32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(bad), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
  __m128i zig = _mm_xor_si128(_mm_slli_epi32(q, 1), _mm_srai_epi32(q, 31));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(z), _mm_or_si128(zig, bad32));
  return bad;
}

template <bool Narrow>
__attribute__((target("avx2"))) void quantize_f32_avx2_rows(const float* xs, const uint64_t* idx,
                                                            uint64_t rows, uint64_t d,
                                                            const QuantParams& qp, uint32_t* codes,
                                                            uint8_t* row_outlier, uint64_t* hashes,
                                                            uint8_t* narrow, uint8_t* bytes);

// quantize_rows for float32 with AVX2.
template <>
__attribute__((target("avx2"))) void quantize_f32_avx2_rows<false>(
    const float* xs, const uint64_t* idx, uint64_t rows, uint64_t d, const QuantParams& qp,
    uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes, uint8_t*, uint8_t*) {
  const __m256d inv = _mm256_set1_pd(qp.inv_step), step = _mm256_set1_pd(qp.step),
                eb = _mm256_set1_pd(qp.eb_abs), zero = _mm256_setzero_pd();
  const FastF32 fast = fast_f32(qp.step, qp.inv_step, qp.max_abs);
  DitherInner di{qp.seed};
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_gathered(xs, idx, r, rows, d * 4);
    const float* x = xs + (idx ? idx[r] : r) * d;
    uint32_t* z = codes + r * d;
    __m256d bad = _mm256_setzero_pd();
    uint64_t i = 0;
    if (qp.dither) {  // dithered frames are never deduplicated: idx is null, row r is element r*d
      for (; i + 8 <= d; i += 8) {
        const uint64_t e = qp.first + r * d + i;
        if ((uint32_t)e > 0xfffffff8u) break;  // the eight indices cross 2^32: scalar tail
        const __m256i bits = dither_bits8((uint32_t)e, di.of(e));
        __m256i zig;
        if (fast.on && quantize8_fast<true>(x + i, fast, bits, &zig)) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(z + i), zig);
          continue;
        }
        const __m256d u0 = dither_offsets4(_mm256_castsi256_si128(bits), step);
        const __m256d u1 = dither_offsets4(_mm256_extracti128_si256(bits, 1), step);
        bad = _mm256_or_pd(bad, quantize4_f32(x + i, inv, step, eb, u0, z + i));
        bad = _mm256_or_pd(bad, quantize4_f32(x + i + 4, inv, step, eb, u1, z + i + 4));
      }
    } else {
      const __m256i none = _mm256_setzero_si256();
      for (; i + 8 <= d; i += 8) {
        __m256i zig;
        if (fast.on && quantize8_fast<false>(x + i, fast, none, &zig)) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(z + i), zig);
          continue;
        }
        bad = _mm256_or_pd(bad, quantize4_f32(x + i, inv, step, eb, zero, z + i));
        bad = _mm256_or_pd(bad, quantize4_f32(x + i + 4, inv, step, eb, zero, z + i + 4));
      }
      for (; i + 4 <= d; i += 4)
        bad = _mm256_or_pd(bad, quantize4_f32(x + i, inv, step, eb, zero, z + i));
    }
    const int miss = _mm256_movemask_pd(bad);
    uint8_t tail = 0;
    if (i < d) {
      QuantParams rest = qp;
      rest.first = qp.first + r * d + i;
      quantize_impl<HL_FLOAT32>(x + i, nullptr, 1, d - i, rest, z + i, &tail, nullptr);
    }
    row_outlier[r] = (uint8_t)((miss != 0) | tail);
    if (hashes)
      hashes[r] = row_outlier[r] ? mix_outliers(hash_codes(z, d), x, z, d) : hash_codes(z, d);
  }
}

// Eight codes: the fast lanes where they are sure, else the double kernel's (into z, which it
// writes; outliers get the mark, 2^32 - 1).
template <bool Dither, bool Bounded>
__attribute__((target("avx2"))) inline __m256i codes8_avx2(const float* x, const FastF32& fast,
                                                           __m256i bits, __m256d inv, __m256d step,
                                                           __m256d eb, uint32_t* z) {
  __m256i zig;
  if (fast.on && quantize8_fast<Dither, Bounded>(x, fast, bits, &zig)) return zig;
  __m256d u0 = _mm256_setzero_pd(), u1 = u0;
  if (Dither) {
    u0 = dither_offsets4(_mm256_castsi256_si128(bits), step);
    u1 = dither_offsets4(_mm256_extracti128_si256(bits, 1), step);
  }
  quantize4_f32(x, inv, step, eb, u0, z);
  quantize4_f32(x + 4, inv, step, eb, u1, z + 4);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z));
}

// quantize_rows_narrow for float32 with AVX2, in one pass: each row's codes go to bytes (32 a
// store) and into its hash (hash_codes, eight lanes a vector) as they come out of the quantizer,
// and only a row found wide (a code of 256 or more: an outlier's mark too) is quantized again
// into z by the kernel above, for its codes, outlier flag and hash. z holds nothing of use for a
// narrow row.
template <bool Dither, bool Bounded, bool Hash>
__attribute__((target("avx2"))) void narrow_f32_avx2(const float* xs, uint64_t rows, uint64_t d,
                                                     const QuantParams& qp, uint32_t* codes,
                                                     uint8_t* row_outlier, uint64_t* hashes,
                                                     uint8_t* narrow, uint8_t* bytes) {
  const __m256d inv = _mm256_set1_pd(qp.inv_step), step = _mm256_set1_pd(qp.step),
                eb = _mm256_set1_pd(qp.eb_abs);
  const FastF32 fast = fast_f32(qp.step, qp.inv_step, qp.max_abs);
  const __m256i mul = _mm256_set1_epi32((int)0x9e3779b1u), none = _mm256_setzero_si256();
  const __m256i lanes0 = _mm256_setr_epi32((int)0x243f6a88u, (int)0x85a308d3u, (int)0x13198a2eu,
                                           (int)0x03707344u, (int)0xa4093822u, (int)0x299f31d0u,
                                           (int)0x082efa98u, (int)0xec4e6c89u);
  DitherInner di{qp.seed};
  for (uint64_t r = 0; r < rows; ++r) {
    const float* x = xs + r * d;
    uint32_t* z = codes + r * d;
    uint8_t* b = bytes + r * d;
    __m256i any = _mm256_setzero_si256(), lanes = lanes0;
    bool redo = false;  // dither indices that cross 2^32: the row goes to the kernel above
    auto group = [&](uint64_t i) HL_AVX2_LAMBDA -> __m256i {
      __m256i zig;
      if (Dither) {
        const uint64_t e = qp.first + r * d + i;
        redo |= (uint32_t)e > 0xfffffff8u;
        zig = codes8_avx2<true, Bounded>(x + i, fast, dither_bits8((uint32_t)e, di.of(e)), inv,
                                         step, eb, z + i);
      } else {
        zig = codes8_avx2<false, Bounded>(x + i, fast, none, inv, step, eb, z + i);
      }
      any = _mm256_or_si256(any, zig);
      if (Hash) lanes = _mm256_mullo_epi32(_mm256_xor_si256(lanes, zig), mul);
      return zig;
    };
    uint64_t i = 0;
    for (; i + 32 <= d; i += 32) {
      const __m256i a = group(i), c = group(i + 8), e = group(i + 16), f = group(i + 24);
      // signed saturation keeps codes below 256 (a larger one makes the row wide anyway);
      // the packs work within 128-bit lanes, the permutation restores the order
      const __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(a, c), _mm256_packs_epi32(e, f));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + i),
                          _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    for (; i + 8 <= d; i += 8) {
      const __m256i zig = group(i);
      const __m128i w =
          _mm_packus_epi32(_mm256_castsi256_si128(zig), _mm256_extracti128_si256(zig, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(b + i), _mm_packus_epi16(w, w));
    }
    uint32_t rest = 0;
    if (i < d) {
      QuantParams part = qp;
      part.first = qp.first + r * d + i;
      uint8_t miss;
      quantize_impl<HL_FLOAT32>(x + i, nullptr, 1, d - i, part, z + i, &miss, nullptr);
      for (uint64_t k = i; k < d; ++k) {
        rest |= z[k];
        b[k] = (uint8_t)z[k];
      }
    }
    const bool wide = redo || (rest >> 8) != 0 ||
                      _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_srli_epi32(any, 8), none)) !=
                          (int)0xffffffff;
    narrow[r] = (uint8_t)!wide;
    if (wide) {
      QuantParams row = qp;
      row.first = qp.first + r * d;
      quantize_f32_avx2_rows<false>(x, nullptr, 1, d, row, z, row_outlier + r, nullptr, nullptr,
                                    nullptr);
      if (Hash) hashes[r] = row_hash(x, z, d, false, row_outlier[r]);
      continue;
    }
    row_outlier[r] = 0;
    if (Hash) {
      alignas(32) uint32_t lane[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lane), lanes);
      hashes[r] = hash_finish(lane, z + i, d - i, d) & ~(1ull << 32);
    }
  }
}

template <>
__attribute__((target("avx2"))) void quantize_f32_avx2_rows<true>(
    const float* xs, const uint64_t*, uint64_t rows, uint64_t d, const QuantParams& qp,
    uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow, uint8_t* bytes) {
  const bool bounded = fast_f32(qp.step, qp.inv_step, qp.max_abs).bounded;
#define HL_NARROW(D, B, H) \
  return narrow_f32_avx2<D, B, H>(xs, rows, d, qp, codes, row_outlier, hashes, narrow, bytes)
  if (qp.dither) {  // never deduplicated: no hashes
    if (bounded) HL_NARROW(true, true, false);
    HL_NARROW(true, false, false);
  }
  if (bounded) {
    if (hashes) HL_NARROW(false, true, true);
    HL_NARROW(false, true, false);
  }
  if (hashes) HL_NARROW(false, false, true);
  HL_NARROW(false, false, false);
#undef HL_NARROW
}

__attribute__((target("avx2"))) void quantize_f32_avx2(const float* xs, const uint64_t* idx,
                                                       uint64_t rows, uint64_t d,
                                                       const QuantParams& qp, uint32_t* codes,
                                                       uint8_t* row_outlier, uint64_t* hashes) {
  quantize_f32_avx2_rows<false>(xs, idx, rows, d, qp, codes, row_outlier, hashes, nullptr, nullptr);
}

__attribute__((target("avx2"))) void dequantize_f32_avx2(const uint32_t* z, uint64_t n, double step,
                                                         float* out) {
  const __m256d st = _mm256_set1_pd(step);
  const __m256i one = _mm256_set1_epi32(1);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + i));
    __m256i q = _mm256_xor_si256(_mm256_srli_epi32(c, 1),
                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(c, one)));
    __m128 a = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), st));
    __m128 b = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), st));
    _mm256_storeu_ps(out + i, _mm256_set_m128(b, a));
  }
  dequantize_impl<HL_FLOAT32>(z + i, n - i, step, out + i);
}

__attribute__((target("avx2"))) void dequantize_dithered_f32_avx2(const uint32_t* z, uint64_t n,
                                                                  double step, uint32_t seed,
                                                                  uint64_t first, float* out) {
  const __m256d st = _mm256_set1_pd(step);
  const __m256i one = _mm256_set1_epi32(1);
  uint64_t i = 0;
  __m256d u0, u1;
  DitherInner di{seed};
  for (; i + 8 <= n && dither8_avx2(di, first + i, st, &u0, &u1); i += 8) {
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + i));
    __m256i q = _mm256_xor_si256(_mm256_srli_epi32(c, 1),
                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(c, one)));
    __m128 a = _mm256_cvtpd_ps(
        _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), st), u0));
    __m128 b = _mm256_cvtpd_ps(
        _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), st), u1));
    _mm256_storeu_ps(out + i, _mm256_set_m128(b, a));
  }
  dequantize_dithered_impl<HL_FLOAT32>(z + i, n - i, step, seed, first + i, out + i);
}

#define HL_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2")))

// The AVX2 kernels' arithmetic eight lanes wide: the same IEEE operations element by element
// (double multiply, compare, round-to-nearest-even conversions), so the same bits.
HL_AVX512 void range_f32_avx512(const float* x, uint64_t n, double* lo_out, double* hi_out) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512 pinf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
  __m512 lo = pinf, hi = ninf;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __mmask16 finite = _mm512_cmpneq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(v), exp_mask), exp_mask);
    lo = _mm512_mask_min_ps(lo, finite, lo, v);
    hi = _mm512_mask_max_ps(hi, finite, hi, v);
  }
  double tl, th;
  range_f32_avx2(x + i, n - i, &tl, &th);
  const double l = _mm512_reduce_min_ps(lo), h = _mm512_reduce_max_ps(hi);
  *lo_out = l < tl ? l : tl;
  *hi_out = h > th ? h : th;
}

// Dither offsets of eight consecutive elements (dither8_avx2 in one vector). False when the
// indices cross a 2^32 boundary.
HL_AVX512 inline bool dither8(DitherInner& di, uint64_t first, __m512d step, __m512d* u) {
  const uint32_t lo = (uint32_t)first;
  if (lo > 0xfffffff8u) return false;
  __m512d unit = _mm512_cvtepi32_pd(dither_bits8(lo, di.of(first)));
  unit = _mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(unit, _mm512_set1_pd(0.5)),
                                     _mm512_set1_pd(1.0 / 16777216.0)),
                       _mm512_set1_pd(0.5));
  *u = _mm512_mul_pd(unit, step);
  return true;
}

// dither8 for sixteen elements: the hash in one 512-bit pass (half the integer work a lane),
// the offsets as two vectors of eight. False when the indices cross a 2^32 boundary.
HL_AVX512 inline bool dither16(DitherInner& di, uint64_t first, __m512d step, __m512d* u0,
                               __m512d* u1) {
  const uint32_t lo = (uint32_t)first;
  if (lo > 0xfffffff0u) return false;
  const uint32_t inner = di.of(first);
  __m512i h = _mm512_xor_si512(
      _mm512_add_epi32(_mm512_set1_epi32((int)lo),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
      _mm512_set1_epi32((int)inner));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xc2b2ae35u));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_srli_epi32(h, 8);
  const __m512d half = _mm512_set1_pd(0.5), scale = _mm512_set1_pd(1.0 / 16777216.0);
  __m512d a = _mm512_cvtepi32_pd(_mm512_castsi512_si256(h));
  __m512d b = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h, 1));
  *u0 = _mm512_mul_pd(_mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(a, half), scale), half), step);
  *u1 = _mm512_mul_pd(_mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(b, half), scale), half), step);
  return true;
}

HL_AVX512 void dequantize_f32_avx512(const uint32_t* z, uint64_t n, double step, float* out) {
  const __m512d st = _mm512_set1_pd(step);
  const __m512i one = _mm512_set1_epi32(1);
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i c = _mm512_loadu_si512(z + i);
    __m512i q = _mm512_xor_si512(_mm512_srli_epi32(c, 1),
                                 _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_and_si512(c, one)));
    __m256 a = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(q)), st));
    __m256 b = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(q, 1)), st));
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
  }
  dequantize_f32_avx2(z + i, n - i, step, out + i);
}

HL_AVX512 void dequantize_dithered_f32_avx512(const uint32_t* z, uint64_t n, double step,
                                              uint32_t seed, uint64_t first, float* out) {
  const __m512d st = _mm512_set1_pd(step);
  const __m256i one = _mm256_set1_epi32(1);
  uint64_t i = 0;
  __m512d u, u1;
  DitherInner di{seed};
  auto eight = [&](uint64_t at, __m512d off) HL_AVX512 {
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + at));
    __m256i q = _mm256_xor_si256(_mm256_srli_epi32(c, 1),
                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(c, one)));
    _mm256_storeu_ps(out + at,
                     _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(q), st), off)));
  };
  for (; i + 16 <= n && dither16(di, first + i, st, &u, &u1); i += 16) {
    eight(i, u);
    eight(i + 8, u1);
  }
  for (; i + 8 <= n && dither8(di, first + i, st, &u); i += 8) eight(i, u);
  dequantize_dithered_f32_avx2(z + i, n - i, step, seed, first + i, out + i);
}

// ---- float16 / bfloat16, AVX-512 (with F16C) --------------------------------------------------
// The same decisions as quantize_impl for 16-bit elements, eight lanes wide. Element to float:
// F16C's vcvtph2ps (exact, subnormals included) or a 16-bit shift for bfloat16; float to
// element: vcvtps2ph with round-to-nearest-even, or f32_to_bf16's integer rounding lane by lane
// (NaN quieted as it does). Conversions between float and double are IEEE as in the scalar code.
#define HL_AVX512_F16 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,f16c")))

template <int DT>
HL_AVX512_F16 inline __m256 half8_to_ps(__m128i h) {
  if (DT == HL_FLOAT16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int DT>
HL_AVX512_F16 inline __m128i ps_to_half8(__m256 f) {
  if (DT == HL_FLOAT16) return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i x = _mm256_castps_si256(f);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i rounding = _mm256_add_epi32(
      _mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, rounding), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_cvtepi32_epi16(_mm256_blendv_epi8(rounded, quiet, nan));
}

// Element lanes of the AVX-512 quantizer: eight elements widened to double, the double an
// element holds after rounding a float through the element type, and the scalar/AVX2 code for
// a row's last d % 8 elements. One quantizer for every dtype, so the dtypes cannot drift apart.
struct F32Lanes {
  using T = float;
  static HL_AVX512_F16 __m512d load(const float* x) { return _mm512_cvtps_pd(_mm256_loadu_ps(x)); }
  static HL_AVX512_F16 __m512d stored(__m256 f) { return _mm512_cvtps_pd(f); }
  static void tail(const float* x, uint64_t n, const QuantParams& qp, uint32_t* z, uint8_t* miss) {
    quantize_f32_avx2(x, nullptr, 1, n, qp, z, miss, nullptr);
  }
};

template <int DT>
struct HalfLanes {
  using T = uint16_t;
  static HL_AVX512_F16 __m512d load(const uint16_t* x) {
    return _mm512_cvtps_pd(half8_to_ps<DT>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
  }
  static HL_AVX512_F16 __m512d stored(__m256 f) {
    return _mm512_cvtps_pd(half8_to_ps<DT>(ps_to_half8<DT>(f)));
  }
  static void tail(const uint16_t* x, uint64_t n, const QuantParams& qp, uint32_t* z,
                   uint8_t* miss) {
    quantize_impl<DT>(x, nullptr, 1, n, qp, z, miss, nullptr);
  }
};

// quantize4_f32 eight wide: codes (or the outlier mark) of eight elements; returns the mask of
// misses.
template <class L>
HL_AVX512_F16 inline unsigned quantize8(const typename L::T* x, __m512d inv, __m512d step,
                                        __m512d eb, __m512d u, uint32_t* z) {
  const __m512d qmax = _mm512_set1_pd(HL_QMAX);
  const __m512d magic = _mm512_set1_pd(6755399441055744.0);
  __m512d v = L::load(x);
  __m512d s = _mm512_mul_pd(_mm512_sub_pd(v, u), inv);
  __mmask8 in_range = _mm512_cmp_pd_mask(_mm512_abs_pd(s), qmax, _CMP_LE_OQ);
  __m512d r = _mm512_sub_pd(_mm512_add_pd(_mm512_maskz_mov_pd(in_range, s), magic), magic);
  __m256i q = _mm512_cvttpd_epi32(r);
  __m512d back =
      L::stored(_mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(q), step), u)));
  __mmask8 ok = _mm512_mask_cmp_pd_mask(in_range, _mm512_abs_pd(_mm512_sub_pd(v, back)), eb,
                                        _CMP_LE_OQ);
  __m256i zig = _mm256_xor_si256(_mm256_slli_epi32(q, 1), _mm256_srai_epi32(q, 31));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(z),
                      _mm256_mask_mov_epi32(_mm256_set1_epi32(-1), ok, zig));
  return (unsigned)(uint8_t)~ok;
}

template <class L>
HL_AVX512_F16 void quantize_avx512(const typename L::T* xs, const uint64_t* idx, uint64_t rows,
                                   uint64_t d, const QuantParams& qp, uint32_t* codes,
                                   uint8_t* row_outlier, uint64_t* hashes) {
  const __m512d inv = _mm512_set1_pd(qp.inv_step), step = _mm512_set1_pd(qp.step),
                eb = _mm512_set1_pd(qp.eb_abs);
  DitherInner di{qp.seed};
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_gathered(xs, idx, r, rows, d * sizeof(typename L::T));
    const typename L::T* x = xs + (idx ? idx[r] : r) * d;
    uint32_t* z = codes + r * d;
    unsigned miss = 0;
    uint64_t i = 0;
    if (qp.dither) {  // never deduplicated: idx is null, row r is element r*d
      __m512d u, u1;
      for (; i + 16 <= d && dither16(di, qp.first + r * d + i, step, &u, &u1); i += 16) {
        miss |= quantize8<L>(x + i, inv, step, eb, u, z + i);
        miss |= quantize8<L>(x + i + 8, inv, step, eb, u1, z + i + 8);
      }
      for (; i + 8 <= d && dither8(di, qp.first + r * d + i, step, &u); i += 8)
        miss |= quantize8<L>(x + i, inv, step, eb, u, z + i);
    } else {
      const __m512d zero = _mm512_setzero_pd();
      for (; i + 8 <= d; i += 8) miss |= quantize8<L>(x + i, inv, step, eb, zero, z + i);
    }
    uint8_t tail = 0;
    if (i < d) {
      QuantParams rest = qp;
      rest.first = qp.first + r * d + i;
      L::tail(x + i, d - i, rest, z + i, &tail);
    }
    row_outlier[r] = (uint8_t)((miss != 0) | tail);
    if (hashes)
      hashes[r] = row_outlier[r] ? mix_outliers(hash_codes(z, d), x, z, d) : hash_codes(z, d);
  }
}

template <int DT>
HL_AVX512_F16 void dequantize_half_avx512(const uint32_t* z, uint64_t n, double step,
                                          uint32_t seed, uint64_t first, bool dithered,
                                          uint16_t* out) {
  const __m512d st = _mm512_set1_pd(step);
  const __m256i one = _mm256_set1_epi32(1);
  DitherInner di{seed};
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512d u = _mm512_setzero_pd();
    if (dithered && !dither8(di, first + i, st, &u)) break;
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + i));
    __m256i q = _mm256_xor_si256(_mm256_srli_epi32(c, 1),
                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(c, one)));
    __m256 f = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(q), st), u));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), ps_to_half8<DT>(f));
  }
  if (dithered)
    dequantize_dithered_impl<DT>(z + i, n - i, step, seed, first + i, out + i);
  else
    dequantize_impl<DT>(z + i, n - i, step, out + i);
}

// range_f32_avx512 of 16-bit elements, widened to float eight at a time (exact).
template <int DT>
HL_AVX512_F16 void range_half_avx512(const uint16_t* x, uint64_t n, double* lo_out,
                                     double* hi_out) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = half8_to_ps<DT>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    __mmask8 finite = _mm256_cmpneq_epi32_mask(
        _mm256_and_si256(_mm256_castps_si256(v), exp_mask), exp_mask);
    lo = _mm256_mask_min_ps(lo, finite, lo, v);
    hi = _mm256_mask_max_ps(hi, finite, hi, v);
  }
  double tl, th;
  range_impl<DT>(x + i, n - i, &tl, &th);
  float l[8], h[8];
  _mm256_storeu_ps(l, lo);
  _mm256_storeu_ps(h, hi);
  for (int k = 0; k < 8; ++k) {
    tl = l[k] < tl ? l[k] : tl;
    th = h[k] > th ? h[k] : th;
  }
  *lo_out = tl;
  *hi_out = th;
}

// Copies whole 64-byte lines with non-temporal stores; dst must be 64-byte aligned.
HL_AVX512 void stream_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
}
#endif

constexpr uint64_t kExpandAhead = 8;

}  // namespace

void expand_rows(uint8_t* out, const uint8_t* uniq, const uint32_t* map, uint64_t rows,
                 uint64_t row_bytes, bool stream) {
  const uint64_t ahead = row_bytes < 1024 ? row_bytes : 1024;
#ifdef HL_HAVE_AVX2_PATH
  if (stream && cpu_has_avx512() && row_bytes % 64 == 0 && (uintptr_t)out % 64 == 0) {
    for (uint64_t r = 0; r < rows; ++r) {
      if (r + kExpandAhead < rows)
        for (uint64_t off = 0; off < ahead; off += 64)
          __builtin_prefetch(uniq + (uint64_t)map[r + kExpandAhead] * row_bytes + off);
      stream_copy(out + r * row_bytes, uniq + (uint64_t)map[r] * row_bytes, row_bytes);
    }
    _mm_sfence();  // streaming stores are weakly ordered: finish them before anyone reads out
    return;
  }
#endif
  (void)stream;
  for (uint64_t r = 0; r < rows; ++r) {
    if (r + kExpandAhead < rows)
      for (uint64_t off = 0; off < ahead; off += 64)
        __builtin_prefetch(uniq + (uint64_t)map[r + kExpandAhead] * row_bytes + off);
    memcpy(out + r * row_bytes, uniq + (uint64_t)map[r] * row_bytes, row_bytes);
  }
}

int simd_level() {
#ifdef HL_HAVE_AVX2_PATH
  static const int level = [] {
    if (!__builtin_cpu_supports("avx2") || getenv("HVD_LOSSY_NO_AVX2")) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
#if !defined(__clang__) || __clang_major__ >= 15
        // (clang 14, which builds the fuzzers, knows no "f16c" here; every CPU with
        // AVX-512F has F16C)
        __builtin_cpu_supports("f16c") &&
#endif
        !getenv("HVD_LOSSY_NO_AVX512"))
      return 2;
    return 1;
  }();
  return level;
#else
  return 0;
#endif
}

#define HL_DISPATCH(dtype, CALL)                 \
  switch (dtype) {                               \
    case HL_FLOAT32: CALL(HL_FLOAT32); break;    \
    case HL_FLOAT16: CALL(HL_FLOAT16); break;    \
    case HL_BFLOAT16: CALL(HL_BFLOAT16); break;  \
  }

HL_CLONES void finite_range(uint8_t dtype, const void* x, uint64_t n, double* lo, double* hi) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && cpu_has_avx512())
    return range_f32_avx512(static_cast<const float*>(x), n, lo, hi);
  if (dtype == HL_FLOAT16 && cpu_has_avx512())
    return range_half_avx512<HL_FLOAT16>(static_cast<const uint16_t*>(x), n, lo, hi);
  if (dtype == HL_BFLOAT16 && cpu_has_avx512())
    return range_half_avx512<HL_BFLOAT16>(static_cast<const uint16_t*>(x), n, lo, hi);
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return range_f32_avx2(static_cast<const float*>(x), n, lo, hi);
#endif
#define CALL(DT) range_impl<DT>(x, n, lo, hi)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_CLONES void quantize_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                             uint64_t row_len, const QuantParams& qp, uint32_t* z,
                             uint8_t* row_outlier, uint64_t* hashes) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && cpu_has_avx512())
    return quantize_avx512<F32Lanes>(static_cast<const float*>(x), idx, rows, row_len, qp, z,
                                     row_outlier, hashes);
  if (dtype == HL_FLOAT16 && cpu_has_avx512())
    return quantize_avx512<HalfLanes<HL_FLOAT16>>(static_cast<const uint16_t*>(x), idx, rows,
                                                  row_len, qp, z, row_outlier, hashes);
  if (dtype == HL_BFLOAT16 && cpu_has_avx512())
    return quantize_avx512<HalfLanes<HL_BFLOAT16>>(static_cast<const uint16_t*>(x), idx, rows,
                                                   row_len, qp, z, row_outlier, hashes);
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return quantize_f32_avx2(static_cast<const float*>(x), idx, rows, row_len, qp, z, row_outlier,
                             hashes);
#endif
#define CALL(DT) quantize_impl<DT>(x, idx, rows, row_len, qp, z, row_outlier, hashes)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

namespace {

// quantize_rows_narrow's bytes, flags and hashes from codes already in z.
template <int DT>
HL_INLINE void narrow_impl(const void* xv, uint64_t rows, uint64_t d, const uint32_t* codes,
                           const uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                           uint8_t* bytes) {
  typedef typename Elem<DT>::raw_t raw_t;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint32_t* z = codes + r * d;
    uint8_t* b = bytes + r * d;
    uint32_t any = 0;
    for (uint64_t k = 0; k < d; ++k) any |= z[k];
    const bool ok = (any >> 8) == 0;
    narrow[r] = (uint8_t)ok;
    if (ok)
      for (uint64_t k = 0; k < d; ++k) b[k] = (uint8_t)z[k];
    if (hashes)
      hashes[r] = row_hash(static_cast<const raw_t*>(xv) + r * d, z, d, ok, row_outlier[r]);
  }
}

}  // namespace

HL_CLONES void quantize_rows_narrow(uint8_t dtype, const void* x, uint64_t rows, uint64_t row_len,
                                    const QuantParams& qp, uint32_t* z, uint8_t* row_outlier,
                                    uint64_t* hashes, uint8_t* narrow, uint8_t* bytes) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && simd_level() == 1 && !(qp.dither && hashes))
    return quantize_f32_avx2_rows<true>(static_cast<const float*>(x), nullptr, rows, row_len, qp,
                                        z, row_outlier, hashes, narrow, bytes);
#endif
  quantize_rows(dtype, x, nullptr, rows, row_len, qp, z, row_outlier, nullptr);
#define CALL(DT) narrow_impl<DT>(x, rows, row_len, z, row_outlier, hashes, narrow, bytes)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_CLONES void raw_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                        uint64_t row_len, uint32_t* z) {
#define CALL(DT) raw_impl<DT>(x, idx, rows, row_len, z)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_CLONES void hash_raw_rows(const uint8_t* x, uint64_t rows, uint64_t row_bytes,
                             uint64_t* hashes) {
  const uint64_t words = row_bytes / 4;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = x + r * row_bytes;
    uint64_t h = row_bytes;
    if (row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 4 == 0) {
      h = mix64(h ^ hash_codes(reinterpret_cast<const uint32_t*>(row), words));
    } else {
      uint32_t buf[256];  // unaligned rows (odd fp16 lengths) are hashed in aligned chunks
      for (uint64_t w = 0; w < words; w += 256) {
        uint64_t n = words - w < 256 ? words - w : 256;
        memcpy(buf, row + 4 * w, 4 * n);
        h = mix64(h ^ hash_codes(buf, n));
      }
    }
    uint32_t tail = 0;
    memcpy(&tail, row + 4 * words, row_bytes - 4 * words);
    hashes[r] = mix64(h ^ tail);
  }
}

HL_CLONES void dequantize(uint8_t dtype, const uint32_t* z, uint64_t n, double step, void* out) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && cpu_has_avx512())
    return dequantize_f32_avx512(z, n, step, static_cast<float*>(out));
  if (dtype == HL_FLOAT16 && cpu_has_avx512())
    return dequantize_half_avx512<HL_FLOAT16>(z, n, step, 0, 0, false, static_cast<uint16_t*>(out));
  if (dtype == HL_BFLOAT16 && cpu_has_avx512())
    return dequantize_half_avx512<HL_BFLOAT16>(z, n, step, 0, 0, false, static_cast<uint16_t*>(out));
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return dequantize_f32_avx2(z, n, step, static_cast<float*>(out));
#endif
#define CALL(DT) dequantize_impl<DT>(z, n, step, out)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_CLONES void dequantize_dithered(uint8_t dtype, const uint32_t* z, uint64_t n, double step,
                                   uint32_t seed, uint64_t first, void* out) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && cpu_has_avx512())
    return dequantize_dithered_f32_avx512(z, n, step, seed, first, static_cast<float*>(out));
  if (dtype == HL_FLOAT16 && cpu_has_avx512())
    return dequantize_half_avx512<HL_FLOAT16>(z, n, step, seed, first, true,
                                              static_cast<uint16_t*>(out));
  if (dtype == HL_BFLOAT16 && cpu_has_avx512())
    return dequantize_half_avx512<HL_BFLOAT16>(z, n, step, seed, first, true,
                                               static_cast<uint16_t*>(out));
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return dequantize_dithered_f32_avx2(z, n, step, seed, first, static_cast<float*>(out));
#endif
#define CALL(DT) dequantize_dithered_impl<DT>(z, n, step, seed, first, out)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

}  // namespace cpu
}  // namespace hl
