// kernels_cpu.h's kernels with AVX-512 intrinsics: the range pass and dequantizers of every
// dtype, and the float16/bfloat16 quantizer (with F16C). Same IEEE operations element by
// element as the portable code, so the same bits. float32 quantizes with the AVX2 kernels at
// this level too: their single-precision lanes (quantize_f32_fast.h) beat this file's double
// lanes by 1.3-1.6x on an AVX-512 Xeon (benchmarks/RESULTS.md). HVD_LOSSY_NO_AVX512=1 forces
// the AVX2 kernels.
#include "kernels_simd.h"

#ifdef HL_HAVE_AVX2_PATH
#include "kernels_scalar.h"

// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised _mm512_undefined_*()
// values and then warn about them in every caller: not our variables, so not our warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace hl {
namespace cpu {
namespace {


// The AVX2 kernels' arithmetic eight lanes wide: the same IEEE operations element by element
// (double multiply, compare, round-to-nearest-even conversions), so the same bits.
HL_AVX512 void range_f32_avx512(const float* x, uint64_t n, double* lo_out, double* hi_out) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512 pinf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
  __m512 lo = pinf, hi = ninf;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_stream(x, i * 4, n * 4);  // sixteen floats: one line
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

// dither_mix8 sixteen lanes wide: mix32 of each lane (hl::dither_unit), its top 24 bits.
HL_AVX512 inline __m512i dither_mix16(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xc2b2ae35u));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  return _mm512_srli_epi32(h, 8);
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
  h = dither_mix16(h);
  const __m512d half = _mm512_set1_pd(0.5), scale = _mm512_set1_pd(1.0 / 16777216.0);
  __m512d a = _mm512_cvtepi32_pd(_mm512_castsi512_si256(h));
  __m512d b = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h, 1));
  *u0 = _mm512_mul_pd(_mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(a, half), scale), half), step);
  *u1 = _mm512_mul_pd(_mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(b, half), scale), half), step);
  return true;
}

HL_AVX512 inline __m512i unzigzag16(__m512i c) {
  return _mm512_xor_si512(_mm512_srli_epi32(c, 1),
                          _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_and_si512(c, _mm512_set1_epi32(1))));
}

// Where single precision gives the double form's bits (f32_exact_codes, kernels_scalar.h): the
// AVX2 kernels' single-precision lanes sixteen wide, the same operations lane by lane (one
// conversion, one multiply), so the same bits. A group with a code too wide for them hands the
// rest to the AVX2 kernel, which takes the double form group by group.
HL_AVX512 void dequantize_f32_avx512(const uint32_t* z, uint64_t n, double step, float* out) {
  const uint32_t fits = f32_exact_codes(step, false);
  uint64_t i = 0;
  if (fits) {
    const __m512i wide = _mm512_set1_epi32((int)~fits);
    const __m512 stf = _mm512_set1_ps((float)step);
    for (; i + 16 <= n; i += 16) {
      const __m512i c = _mm512_loadu_si512(z + i);
      if (_mm512_test_epi32_mask(c, wide)) break;
      _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_cvtepi32_ps(unzigzag16(c)), stf));
    }
    return dequantize_f32_avx2(z + i, n - i, step, out + i);
  }
  const __m512d st = _mm512_set1_pd(step);
  for (; i + 16 <= n; i += 16) {
    const __m512i q = unzigzag16(_mm512_loadu_si512(z + i));
    __m256 a = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(q)), st));
    __m256 b = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(q, 1)), st));
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
  }
  dequantize_f32_avx2(z + i, n - i, step, out + i);
}

// dequantize_dithered_f32_avx2's single-precision run sixteen wide: within one run of 2^32
// indices, the offset (2b - 2^24 + 1) * (step * 2^-25) of each lane's 24 hashed bits b fused
// with its code times step, the same operations lane by lane, so the same bits. Whatever the
// run cannot take (a code too wide, a crossing of 2^32, the tail) goes to the AVX2 kernel.
HL_AVX512 uint64_t dequantize_dithered_run_avx512(const uint32_t* z, uint64_t n, double step,
                                                  uint32_t seed, uint64_t first, float* out) {
  const uint32_t fits = f32_exact_codes(step, true);
  if (!fits || n < 16 || (first >> 32) != ((first + n - 1) >> 32) || !(step >= 0x1p-990))
    return 0;
  DitherInner di{seed};
  const __m512i inner = _mm512_set1_epi32((int)di.of(first)), sixteen = _mm512_set1_epi32(16),
                odd = _mm512_set1_epi32((1 << 24) - 1), wide = _mm512_set1_epi32((int)~fits);
  const __m512 stf = _mm512_set1_ps((float)step), st25f = _mm512_set1_ps((float)(step * 0x1p-25));
  __m512i lo = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)first),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                  14, 15));
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i c = _mm512_loadu_si512(z + i);
    if (_mm512_test_epi32_mask(c, wide)) break;
    const __m512i a =
        _mm512_sub_epi32(_mm512_slli_epi32(dither_mix16(_mm512_xor_si512(lo, inner)), 1), odd);
    lo = _mm512_add_epi32(lo, sixteen);
    const __m512 qs = _mm512_mul_ps(_mm512_cvtepi32_ps(unzigzag16(c)), stf);
    _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), st25f, qs));
  }
  return i;
}

HL_AVX512 void dequantize_dithered_f32_avx512(const uint32_t* z, uint64_t n, double step,
                                              uint32_t seed, uint64_t first, float* out) {
  if (f32_exact_codes(step, true)) {
    const uint64_t i = dequantize_dithered_run_avx512(z, n, step, seed, first, out);
    return dequantize_dithered_f32_avx2(z + i, n - i, step, seed, first + i, out + i);
  }
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

// Element lanes of the 16-bit quantizer: eight elements widened to double, the double an
// element holds after rounding a float through the element type, and the scalar code for a
// row's last d % 8 elements. One quantizer for both dtypes, so they cannot drift apart.
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
HL_AVX512_F16 void quantize_lanes_avx512(const typename L::T* xs, const uint64_t* idx, uint64_t rows,
                                   uint64_t d, const QuantParams& qp, uint32_t* codes,
                                   uint8_t* row_outlier, uint64_t* hashes) {
  const __m512d inv = _mm512_set1_pd(qp.inv_step), step = _mm512_set1_pd(qp.step),
                eb = _mm512_set1_pd(qp.eb_abs);
  DitherInner di{qp.seed};
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_ahead(xs, idx, r, rows, d * sizeof(typename L::T));
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
      hashes[r] = codes_hash(x, z, d, row_outlier[r]);
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
    if (i % 32 == 0) prefetch_stream(x, i * 2, n * 2);  // once a line
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


}  // namespace

HL_AVX512_F16 void range_avx512(uint8_t dtype, const void* x, uint64_t n, double* lo_out,
                                double* hi_out) {
  if (dtype == HL_FLOAT32) return range_f32_avx512(static_cast<const float*>(x), n, lo_out, hi_out);
  if (dtype == HL_FLOAT16)
    return range_half_avx512<HL_FLOAT16>(static_cast<const uint16_t*>(x), n, lo_out, hi_out);
  range_half_avx512<HL_BFLOAT16>(static_cast<const uint16_t*>(x), n, lo_out, hi_out);
}

HL_AVX512_F16 void quantize_avx512(uint8_t dtype, const void* x, const uint64_t* idx,
                                   uint64_t rows, uint64_t d, const QuantParams& qp,
                                   uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes) {
  if (dtype == HL_FLOAT16)
    return quantize_lanes_avx512<HalfLanes<HL_FLOAT16>>(static_cast<const uint16_t*>(x), idx, rows,
                                                        d, qp, codes, row_outlier, hashes);
  quantize_lanes_avx512<HalfLanes<HL_BFLOAT16>>(static_cast<const uint16_t*>(x), idx, rows, d, qp,
                                                codes, row_outlier, hashes);
}

HL_AVX512_F16 void dequantize_avx512(uint8_t dtype, const uint32_t* z, uint64_t n, double step,
                                     bool dithered, uint32_t seed, uint64_t first, void* out) {
  if (dtype == HL_FLOAT32) {
    if (dithered)
      return dequantize_dithered_f32_avx512(z, n, step, seed, first, static_cast<float*>(out));
    return dequantize_f32_avx512(z, n, step, static_cast<float*>(out));
  }
  if (dtype == HL_FLOAT16)
    return dequantize_half_avx512<HL_FLOAT16>(z, n, step, seed, first, dithered,
                                              static_cast<uint16_t*>(out));
  dequantize_half_avx512<HL_BFLOAT16>(z, n, step, seed, first, dithered,
                                      static_cast<uint16_t*>(out));
}

HL_AVX512 void stream_copy_avx512(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
}

}  // namespace cpu
}  // namespace hl
#endif
