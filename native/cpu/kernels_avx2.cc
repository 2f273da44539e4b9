// kernels_cpu.h's float32 kernels with AVX2 intrinsics. Compilers do not vectorize the portable
// loops (IEEE min/max and selects), so these spell out the same arithmetic: every operation is
// the IEEE one the scalar code performs (double multiply, round-to-nearest-even conversions), so
// results are identical bit for bit. HVD_LOSSY_NO_AVX2=1 forces the portable loops.
#include "kernels_simd.h"

#ifdef HL_HAVE_AVX2_PATH
#include "kernels_scalar.h"
#include "quantize_f32_fast.h"

#define HL_AVX2_LAMBDA __attribute__((target("avx2,fma"), always_inline))

namespace hl {
namespace cpu {

namespace {

// The finite range with the infinities' masks: where range_f32_avx2 finds an infinity.
HL_AVX2 void masked_range_f32_avx2(const float* x, uint64_t n, double* lo_out, double* hi_out) {
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

}  // namespace

// Plain min and max, four chains of each: the masked loop's one chain of blends and min/max
// held it to about 15 GB/s on data in the caches, where this runs at about 38 (0.38-0.42 of the
// time at 2.9-8 MB on an AVX2 EPYC; the same at 64 MB, where memory sets the pace;
// benchmarks/results/session_2026-12-07c.txt). NaN is left out by operand order (min_ps returns
// its second operand when either is NaN, and the chains never hold one); an infinity is not,
// so a result with one (rare: a tensor holding an infinity) is taken again by the masked pass.
// Zeros' signs may differ from it, which no user of the range sees (it is a width and a
// largest magnitude).
HL_AVX2 void range_f32_avx2(const float* x, uint64_t n, double* lo_out, double* hi_out) {
  const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
  __m256 lo0 = pinf, lo1 = pinf, lo2 = pinf, lo3 = pinf;
  __m256 hi0 = ninf, hi1 = ninf, hi2 = ninf, hi3 = ninf;
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_stream(x, i * 4, n * 4);
    prefetch_stream(x, i * 4 + 64, n * 4);
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8),
                 c = _mm256_loadu_ps(x + i + 16), e = _mm256_loadu_ps(x + i + 24);
    lo0 = _mm256_min_ps(a, lo0);
    hi0 = _mm256_max_ps(a, hi0);
    lo1 = _mm256_min_ps(b, lo1);
    hi1 = _mm256_max_ps(b, hi1);
    lo2 = _mm256_min_ps(c, lo2);
    hi2 = _mm256_max_ps(c, hi2);
    lo3 = _mm256_min_ps(e, lo3);
    hi3 = _mm256_max_ps(e, hi3);
  }
  const __m256 lo = _mm256_min_ps(_mm256_min_ps(lo0, lo1), _mm256_min_ps(lo2, lo3));
  const __m256 hi = _mm256_max_ps(_mm256_max_ps(hi0, hi1), _mm256_max_ps(hi2, hi3));
  float l[8], h[8];
  _mm256_storeu_ps(l, lo);
  _mm256_storeu_ps(h, hi);
  double tl, th;
  range_impl<HL_FLOAT32>(x + i, n - i, &tl, &th);  // the tail: finite values only
  for (int k = 0; k < 8; ++k) {
    tl = l[k] < tl ? l[k] : tl;
    th = h[k] > th ? h[k] : th;
  }
  if (tl == -INFINITY || th == INFINITY) return masked_range_f32_avx2(x, n, lo_out, hi_out);
  *lo_out = tl;
  *hi_out = th;
}

namespace {

// Dither offsets (hl::dither_unit(seed, first + k) * step) of four elements from their hashed
// bits, with the scalar arithmetic: the 24 bits convert to double exactly, then one multiply.
HL_AVX2 inline __m256d dither_offsets4(__m128i bits, __m256d step) {
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
HL_AVX2 inline bool dither8_avx2(DitherInner& di, uint64_t first,
                                 __m256d step, __m256d* u0, __m256d* u1) {
  const uint32_t lo = (uint32_t)first;
  if (lo > 0xfffffff8u) return false;
  const __m256i bits = dither_bits8(lo, di.of(first));
  *u0 = dither_offsets4(_mm256_castsi256_si128(bits), step);
  *u1 = dither_offsets4(_mm256_extracti128_si256(bits, 1), step);
  return true;
}

// fold_lane (kernels_scalar.h) of each 128-bit half's four lanes, with kFoldMul[First0..+3] in
// the low half and kFoldMul[First1..+3] in the high, as four 64-bit words still to xor: <0, 4>
// a whole row's eight lanes, <0, 0> two d16 rows' lanes 0-3, a row a half.
template <int First0, int First1>
HL_AVX2 inline __m256i fold_words(__m256i v) {
  const __m256i even = _mm256_mul_epu32(
      v, _mm256_setr_epi32((int)kFoldMul[First0], 0, (int)kFoldMul[First0 + 2], 0,
                           (int)kFoldMul[First1], 0, (int)kFoldMul[First1 + 2], 0));
  const __m256i odd = _mm256_mul_epu32(
      _mm256_srli_epi64(v, 32),
      _mm256_setr_epi32((int)kFoldMul[First0 + 1], 0, (int)kFoldMul[First0 + 3], 0,
                        (int)kFoldMul[First1 + 1], 0, (int)kFoldMul[First1 + 3], 0));
  return _mm256_xor_si256(even, _mm256_shuffle_epi32(odd, _MM_SHUFFLE(2, 3, 0, 1)));
}

// hash_finish's fold of the eight lanes (kernels_scalar.h), with no words left to mix in.
HL_AVX2 inline uint64_t fold_lanes(__m256i v) {
  const __m256i x = fold_words<0, 4>(v);
  const __m128i y = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  return (uint64_t)_mm_cvtsi128_si64(_mm_xor_si128(y, _mm_unpackhi_epi64(y, y)));
}

// Four elements: zigzag codes (or the outlier mark) and the lanes that miss (all ones). Codes
// x - u and reconstructs q * step + u (hl::quantize); plain frames pass u = 0, which changes no
// bit. The miss mask is built from the complements of hl::quantize's tests (NLE_UQ is true for
// NaN, as !(a <= b) is), so a code is its zigzag or'ed with the mask, and a row's misses are
// or'ed into one vector: one movemask a row rather than one a vector.
HL_AVX2 inline __m256d quantize4_f32(const float* x, __m256d inv,
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
HL_AVX2 void quantize_f32_avx2_rows(const float* xs, const uint64_t* idx,
                                    uint64_t rows, uint64_t d,
                                    const QuantParams& qp, uint32_t* codes,
                                    uint8_t* row_outlier, uint64_t* hashes,
                                    uint8_t* narrow, uint8_t* bytes);

// quantize_rows for float32 with AVX2.
template <>
HL_AVX2 void quantize_f32_avx2_rows<false>(
    const float* xs, const uint64_t* idx, uint64_t rows, uint64_t d, const QuantParams& qp,
    uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes, uint8_t*, uint8_t*) {
  const __m256d inv = _mm256_set1_pd(qp.inv_step), step = _mm256_set1_pd(qp.step),
                eb = _mm256_set1_pd(qp.eb_abs), zero = _mm256_setzero_pd();
  const FastF32 fast = fast_f32(qp.step, qp.inv_step, qp.max_abs);
  DitherInner di{qp.seed};
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_ahead(xs, idx, r, rows, d * 4);
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
      hashes[r] = codes_hash(reinterpret_cast<const uint32_t*>(x), z, d, row_outlier[r]);
  }
}

// Eight codes: the fast lanes where they are sure, else the double kernel's (into z, which it
// writes; outliers get the mark, 2^32 - 1).
template <bool Dither, bool Bounded>
HL_AVX2 inline __m256i codes8_avx2(const float* x, const FastF32& fast,
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
// store) as they come out of the quantizer, and those 32 bytes into its hash (narrow_hash, eight
// lanes a vector); only a row found wide (a code of 256 or more: an outlier's mark too) is
// quantized again into z by the kernel above, for its codes, outlier flag and hash. z holds
// nothing of use for a narrow row.
template <bool Dither, bool Bounded, bool Hash>
HL_AVX2 void narrow_f32_avx2(const float* xs, const uint64_t* idx, uint64_t rows, uint64_t d,
                             const QuantParams& qp, uint32_t* codes,
                             uint8_t* row_outlier, uint64_t* hashes,
                             uint8_t* narrow, uint8_t* bytes) {
  const __m256d inv = _mm256_set1_pd(qp.inv_step), step = _mm256_set1_pd(qp.step),
                eb = _mm256_set1_pd(qp.eb_abs);
  const FastF32 fast = fast_f32(qp.step, qp.inv_step, qp.max_abs);
  const __m256i mul = _mm256_set1_epi32((int)kHashMul), none = _mm256_setzero_si256();
  const __m256i lanes0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kHashLanes));
  DitherInner di{qp.seed};
  // Within one run of 2^32 element indices (nearly every call) the hash's inner mix is one value
  // and a group's low index halves are the last group's plus eight.
  const uint64_t n = rows * d;
  const bool one_run = Dither && n != 0 && (qp.first >> 32) == ((qp.first + n - 1) >> 32);
  const __m256i inner = _mm256_set1_epi32(one_run ? (int)di.of(qp.first) : 0),
                eight = _mm256_set1_epi32(8), lanes07 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // Segments of byte codes (FastF32::byte_codes: bounded, and every sure code fits a byte, as
  // lookups' and gradients' do at the usual bounds) take runs of elements with one test each:
  // codes packed as signed bytes and zigzagged there, with no `any` to keep. A run with a lane
  // that was not sure (NaN, Inf, a value within 2^-21 L of an edge: about one in 2^16 at L = 16)
  // is done again the general way.
  const bool byte_rows = Bounded && fast.byte_codes && (!Dither || one_run);
  constexpr uint64_t kByteRun = 256;
  const __m256 all_sure = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (uint64_t r = 0; r < rows; ++r) {
    prefetch_ahead(xs, idx, r, rows, d * 4);
    const float* x = xs + (idx ? idx[r] : r) * d;  // with idx never dithered (dedup)
    uint32_t* z = codes + r * d;
    uint8_t* b = bytes + r * d;
    __m256i any = _mm256_setzero_si256(), lanes = lanes0;
    __m256i lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)(qp.first + r * d)), lanes07);
    bool redo = false;  // dither indices that cross 2^32: the row goes to the kernel above
    auto group = [&](uint64_t i) HL_AVX2_LAMBDA -> __m256i {
      __m256i zig;
      if (Dither) {
        __m256i bits;
        if (one_run) {  // groups come in order: i is the last one's plus eight
          bits = dither_mix8(_mm256_xor_si256(lo, inner));
          lo = _mm256_add_epi32(lo, eight);
        } else {
          const uint64_t e = qp.first + r * d + i;
          redo |= (uint32_t)e > 0xfffffff8u;
          bits = dither_bits8((uint32_t)e, di.of(e));
        }
        zig = codes8_avx2<true, Bounded>(x + i, fast, bits, inv, step, eb, z + i);
      } else {
        zig = codes8_avx2<false, Bounded>(x + i, fast, none, inv, step, eb, z + i);
      }
      any = _mm256_or_si256(any, zig);
      return zig;
    };
    const uint64_t whole = d / 32 * 32;
    uint64_t i = 0, general_to = byte_rows ? 0 : whole;  // a run from general_to on: all fast
    for (;;) {
      if (byte_rows) {
        // runs of up to kByteRun elements, each tested once at its end (one test every 32
        // elements: 0.29 ns an element where one a row took 0.25; benchmarks/RESULTS.md); a run
        // with a lane not sure is done the general way below, and the runs go on after it
        __m256i l = lo, h = lanes;
        __m256 sure;
        auto q8 = [&](uint64_t k) HL_AVX2_LAMBDA -> __m256i {
          __m256i bits = none;
          if (Dither) {  // one run: the inner mix is one value, the indices step by eight
            bits = dither_mix8(_mm256_xor_si256(l, inner));
            l = _mm256_add_epi32(l, eight);
          }
          return bounded_q8<Dither>(x + k, fast, bits, &sure);
        };
        while (i < whole) {
          const uint64_t end = whole - i > kByteRun ? i + kByteRun : whole;
          const __m256i l0 = l, h0 = h;
          sure = all_sure;
          for (uint64_t j = i; j < end; j += 32) {
            prefetch_within(x, j * 4, d * 4);
            prefetch_within(x, j * 4 + 64, d * 4);
            const __m256i a = q8(j), c = q8(j + 8), e = q8(j + 16), f = q8(j + 24);
            const __m256i w = zigzag_bytes32(a, c, e, f);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + j), w);
            if (Hash) h = _mm256_mullo_epi32(_mm256_xor_si256(h, w), mul);
          }
          if (_mm256_movemask_ps(sure) != 0xff) {
            l = l0;
            h = h0;
            general_to = end;
            break;
          }
          i = end;
        }
        lo = l;
        lanes = h;
      }
      for (; i < general_to; i += 32) {
        prefetch_within(x, i * 4, d * 4);
        prefetch_within(x, i * 4 + 64, d * 4);
        const __m256i a = group(i), c = group(i + 8), e = group(i + 16), f = group(i + 24);
        // signed saturation keeps codes below 256 (a larger one makes the row wide anyway);
        // the packs work within 128-bit lanes, the permutation restores the order
        const __m256i w = _mm256_permutevar8x32_epi32(
            _mm256_packus_epi16(_mm256_packs_epi32(a, c), _mm256_packs_epi32(e, f)),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + i), w);
        // a wide row's saturated bytes hash to nothing of use: it is hashed again below
        if (Hash) lanes = _mm256_mullo_epi32(_mm256_xor_si256(lanes, w), mul);
      }
      if (i >= whole) break;
    }
    if (byte_rows && general_to == 0 && i == d) {  // every run fast: no `any`, no tail
      narrow[r] = 1;
      row_outlier[r] = 0;
      if (Hash) hashes[r] = mix64(d ^ fold_lanes(lanes)) & ~(1ull << 32);  // narrow_hash
      continue;
    }
    const uint64_t hashed = i;  // narrow_hash's rest: the bytes from here on
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
      if (Hash) hashes[r] = wide_hash(reinterpret_cast<const uint32_t*>(x), z, d, row_outlier[r]);
      continue;
    }
    row_outlier[r] = 0;
    if (Hash) {
      alignas(32) uint32_t lane[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lane), lanes);
      hashes[r] = narrow_hash_finish(lane, b + hashed, d - hashed, d);
    }
  }
}

// quantize_rows_narrow of rows of D = 16 or 32 float32 elements (16: the DLRM example's default
// width) as groups of 32 byte codes, two rows or one a group, one sureness test each, and each
// row's hash folded in registers: narrow_f32_avx2 takes a d16 row the general way, eight elements
// a test, with a scalar hash finish (28 ns a d16 row against 16 for a d32 row), and a d32 row
// with a run's bookkeeping. For bounded segments of byte codes without dither (dedup's rows); a
// group with a lane not sure, and an odd last d16 row, go to narrow_f32_avx2. The hashes follow
// narrow_hash (kernels_scalar.h): a d32 row's eight words one multiply into the lanes, a d16
// row's four words mixed into lanes 0-3 as hash_finish's rest, lanes 4-7 as they start.
template <uint64_t D, bool Hash>
HL_AVX2 void narrow_small_avx2(const float* xs, const uint64_t* idx, uint64_t rows,
                               const QuantParams& qp, const FastF32& fast, uint32_t* codes,
                               uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                               uint8_t* bytes) {
  static_assert(D == 16 || D == 32, "rows of 16 or 32 elements");
  constexpr uint64_t per = 32 / D;  // rows a group
  const __m256i none = _mm256_setzero_si256();
  const __m256 all_sure = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256i lanes0 = D == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kHashLanes))
                                 : _mm256_setr_epi32((int)kHashLanes[0], (int)kHashLanes[1],
                                                     (int)kHashLanes[2], (int)kHashLanes[3],
                                                     (int)kHashLanes[0], (int)kHashLanes[1],
                                                     (int)kHashLanes[2], (int)kHashLanes[3]);
  const __m256i word_mul = _mm256_set1_epi32(D == 32 ? (int)kHashMul : (int)0x85ebca6bu);
  // d16: the fold of d and of lanes 4-7, which a 16-byte row leaves as they start
  uint64_t high = D;
  if (D == 16)
    for (int k = 4; k < 8; ++k) high ^= fold_lane(kHashLanes[k], k);
  auto general = [&](uint64_t r, uint64_t n) HL_AVX2_LAMBDA {
    narrow_f32_avx2<false, true, Hash>(idx ? xs : xs + r * D, idx ? idx + r : nullptr, n, D, qp,
                                       codes + r * D, row_outlier + r,
                                       Hash ? hashes + r : nullptr, narrow + r, bytes + r * D);
  };
  uint64_t r = 0;
  for (; r + per <= rows; r += per) {
    prefetch_ahead(xs, idx, r, rows, D * 4);
    if (per == 2) prefetch_ahead(xs, idx, r + 1, rows, D * 4);
    const float* a = xs + (idx ? idx[r] : r) * D;
    const float* b = per == 2 ? xs + (idx ? idx[r + 1] : r + 1) * D : a + 16;
    __m256 sure = all_sure;
    const __m256i q0 = bounded_q8<false>(a, fast, none, &sure);
    const __m256i q1 = bounded_q8<false>(a + 8, fast, none, &sure);
    const __m256i q2 = bounded_q8<false>(b, fast, none, &sure);
    const __m256i q3 = bounded_q8<false>(b + 8, fast, none, &sure);
    if (_mm256_movemask_ps(sure) != 0xff) {
      general(r, per);
      continue;
    }
    const __m256i w = zigzag_bytes32(q0, q1, q2, q3);  // d16: row r's 16 bytes, then row r + 1's
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bytes + r * D), w);
    for (uint64_t k = 0; k < per; ++k) {
      narrow[r + k] = 1;
      row_outlier[r + k] = 0;
    }
    if (!Hash) continue;
    const __m256i l = _mm256_mullo_epi32(_mm256_xor_si256(lanes0, w), word_mul);
    if (D == 32) {
      hashes[r] = mix64(D ^ fold_lanes(l)) & ~(1ull << 32);
      continue;
    }
    const __m256i x = fold_words<0, 0>(l);
    const __m256i y = _mm256_xor_si256(x, _mm256_unpackhi_epi64(x, x));  // a row a half
    hashes[r] = mix64(high ^ (uint64_t)_mm256_extract_epi64(y, 0)) & ~(1ull << 32);
    hashes[r + 1] = mix64(high ^ (uint64_t)_mm256_extract_epi64(y, 2)) & ~(1ull << 32);
  }
  if (r < rows) general(r, rows - r);
}

template <>
HL_AVX2 void quantize_f32_avx2_rows<true>(
    const float* xs, const uint64_t* idx, uint64_t rows, uint64_t d, const QuantParams& qp,
    uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow, uint8_t* bytes) {
  const FastF32 fast = fast_f32(qp.step, qp.inv_step, qp.max_abs);
  const bool bounded = fast.bounded;
#define HL_NARROW(D, B, H) \
  return narrow_f32_avx2<D, B, H>(xs, idx, rows, d, qp, codes, row_outlier, hashes, narrow, bytes)
  if (qp.dither) {  // never deduplicated: no hashes
    if (bounded) HL_NARROW(true, true, false);
    HL_NARROW(true, false, false);
  }
#define HL_SMALL(D, H) \
  return narrow_small_avx2<D, H>(xs, idx, rows, qp, fast, codes, row_outlier, hashes, narrow, bytes)
  if (d == 16 && fast.byte_codes) {
    if (hashes) HL_SMALL(16, true);
    HL_SMALL(16, false);
  }
  if (d == 32 && fast.byte_codes) {
    if (hashes) HL_SMALL(32, true);
    HL_SMALL(32, false);
  }
#undef HL_SMALL
  if (bounded) {
    if (hashes) HL_NARROW(false, true, true);
    HL_NARROW(false, true, false);
  }
  if (hashes) HL_NARROW(false, false, true);
  HL_NARROW(false, false, false);
#undef HL_NARROW
}

}  // namespace

HL_AVX2 void quantize_f32_avx2(const float* xs, const uint64_t* idx,
                               uint64_t rows, uint64_t d,
                               const QuantParams& qp, uint32_t* codes,
                               uint8_t* row_outlier, uint64_t* hashes) {
  quantize_f32_avx2_rows<false>(xs, idx, rows, d, qp, codes, row_outlier, hashes, nullptr, nullptr);
}

namespace {
HL_AVX2 inline __m256i unzigzag8(__m256i c) {
  return _mm256_xor_si256(_mm256_srli_epi32(c, 1),
                          _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_and_si256(c, _mm256_set1_epi32(1))));
}
}  // namespace

// Eight lanes of single precision where f32_exact_codes allows (kernels_scalar.h): one
// conversion and one multiply, where the double form takes four conversions and two.
HL_AVX2 void dequantize_f32_avx2(const uint32_t* z, uint64_t n, double step,
                                 float* out) {
  const __m256d st = _mm256_set1_pd(step);
  const uint32_t fits = f32_exact_codes(step, false);
  const __m256i wide = _mm256_set1_epi32((int)~fits);
  const __m256 stf = _mm256_set1_ps((float)step);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + i));
    __m256i q = unzigzag8(c);
    if (fits && _mm256_testz_si256(c, wide)) {
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), stf));
      continue;
    }
    __m128 a = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), st));
    __m128 b = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), st));
    _mm256_storeu_ps(out + i, _mm256_set_m128(b, a));
  }
  dequantize_impl<HL_FLOAT32>(z + i, n - i, step, out + i);
}

// Eight elements a step: the residual, its code by quantize8_fast (the general quantizer's code
// wherever it is sure), the reconstruction as dequantize_f32_avx2 forms it where the code fits,
// and for a held row the sum and the check, in single precision where that is sure and in
// double (four lanes a half) for a group of eight where it is not.
template <bool Held>
HL_AVX2 inline int coded_row8_f32(const float* x, const float* p, uint64_t d,
                                  const QuantParams& qp, double eb, float* r, float* xh,
                                  bool* same, bool* as_held) {
  const uint32_t fits = f32_exact_codes(qp.step, false);
  const FastF32 f = fast_f32(qp.step, qp.inv_step);
  if (d % 8 || !fits || !f.on) return kRowUnsure;
  const __m256i wide = _mm256_set1_epi32((int)~fits);
  const __m256 stf = _mm256_set1_ps((float)qp.step);
  const __m256d ebv = _mm256_set1_pd(eb);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  const __m256 abs_maskf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // The check in single precision where it cannot be wrong: |fl(X^ - X)| is within a factor
  // (1 +- 2^-24) of |X^ - X| (exactly it where the difference is subnormal; NaN where either is
  // Inf, which no ordered compare passes), so at most eb (1 - 2^-23) is within eb for sure. A
  // group of eight with any lane above that takes the double check, the definition.
  const double lo_d = eb * (1 - 0x1p-23);
  float lo_f = (float)lo_d;
  if ((double)lo_f > lo_d) lo_f = nextafterf(lo_f, 0.0f);
  const __m256 eb_lo = _mm256_set1_ps(lo_f);
  int within = 0xf, equal = 0xff, bits = 0xff;
  for (uint64_t i = 0; i < d; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 pv = Held ? _mm256_loadu_ps(p + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(r + i, Held ? _mm256_sub_ps(xv, pv) : xv);
    __m256i zig;
    if (!quantize8_fast<false>(r + i, f, _mm256_setzero_si256(), &zig) ||
        !_mm256_testz_si256(zig, wide))
      return kRowUnsure;
    const __m256 rh = _mm256_mul_ps(_mm256_cvtepi32_ps(unzigzag8(zig)), stf);
    if (!Held) {  // X^ is R^, within the bound R is coded at
      _mm256_storeu_ps(xh + i, rh);
      continue;
    }
    const __m256 xhv = _mm256_add_ps(pv, rh);
    _mm256_storeu_ps(xh + i, xhv);
    bits &= _mm256_movemask_ps(_mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_castps_si256(xhv), _mm256_castps_si256(pv))));
    equal &= _mm256_movemask_ps(_mm256_cmp_ps(xhv, pv, _CMP_EQ_OQ));  // as in double: exact
    const __m256 err_f = _mm256_and_ps(_mm256_sub_ps(xhv, xv), abs_maskf);
    if (_mm256_movemask_ps(_mm256_cmp_ps(err_f, eb_lo, _CMP_LE_OQ)) == 0xff) continue;
    for (int half = 0; half < 2; ++half) {
      const __m128 b4 = half ? _mm256_extractf128_ps(xhv, 1) : _mm256_castps256_ps128(xhv);
      const __m128 x4 = half ? _mm256_extractf128_ps(xv, 1) : _mm256_castps256_ps128(xv);
      const __m256d err = _mm256_and_pd(
          _mm256_sub_pd(_mm256_cvtps_pd(b4), _mm256_cvtps_pd(x4)), abs_mask);
      within &= _mm256_movemask_pd(_mm256_cmp_pd(err, ebv, _CMP_LE_OQ));  // false for NaN
    }
  }
  *same = Held && equal == 0xff;
  *as_held = Held && bits == 0xff;
  return within == 0xf ? kRowWithin : kRowMiss;
}

HL_AVX2 int coded_row_f32_avx2(const float* x, const float* p, uint64_t d,
                               const QuantParams& qp, double eb, float* r, float* xh,
                               bool* same, bool* as_held) {
  return p ? coded_row8_f32<true>(x, p, d, qp, eb, r, xh, same, as_held)
           : coded_row8_f32<false>(x, p, d, qp, eb, r, xh, same, as_held);
}

HL_AVX2 void dequantize_dithered_f32_avx2(const uint32_t* z, uint64_t n,
                                          double step, uint32_t seed,
                                          uint64_t first, float* out) {
  const __m256d st = _mm256_set1_pd(step);
  uint64_t i = 0;
  __m256d u0, u1;
  DitherInner di{seed};
  auto group = [&](uint64_t k) HL_AVX2_LAMBDA {
    __m256i q = unzigzag8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + k)));
    __m128 a = _mm256_cvtpd_ps(
        _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), st), u0));
    __m128 b = _mm256_cvtpd_ps(
        _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), st), u1));
    _mm256_storeu_ps(out + k, _mm256_set_m128(b, a));
  };
  if (n >= 8 && (first >> 32) == ((first + n - 1) >> 32) && step >= 0x1p-990) {
    // One run of 2^32 indices: one inner hash, and the lanes' low halves step by eight (no
    // per-group crossing check), which frees the loop to overlap its groups. The offset
    // ((b + 1/2) * 2^-24 - 1/2) * step of 24 bits b is the same double as
    // (2b - 2^24 + 1) * (step * 2^-25): the unit is exact either way, and scaling step by a
    // power of two is exact while it stays normal, so both round the same product once.
    const __m256i inner = _mm256_set1_epi32((int)di.of(first)), eight = _mm256_set1_epi32(8),
                  odd = _mm256_set1_epi32((1 << 24) - 1);
    const __m256d st25 = _mm256_set1_pd(step * 0x1p-25);
    // the single-precision form (f32_exact_codes) for groups of codes it allows
    const uint32_t fits = f32_exact_codes(step, true);
    const __m256i wide = _mm256_set1_epi32((int)~fits);
    const __m256 stf = _mm256_set1_ps((float)step), st25f = _mm256_set1_ps((float)(step * 0x1p-25));
    __m256i lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)first),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (; i + 8 <= n; i += 8) {
      const __m256i a =
          _mm256_sub_epi32(_mm256_slli_epi32(dither_mix8(_mm256_xor_si256(lo, inner)), 1), odd);
      lo = _mm256_add_epi32(lo, eight);
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + i));
      if (fits && _mm256_testz_si256(c, wide)) {
        const __m256 qs = _mm256_mul_ps(_mm256_cvtepi32_ps(unzigzag8(c)), stf);
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), st25f, qs));
        continue;
      }
      u0 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(a)), st25);
      u1 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)), st25);
      group(i);
    }
  }
  for (; i + 8 <= n && dither8_avx2(di, first + i, st, &u0, &u1); i += 8) group(i);
  dequantize_dithered_impl<HL_FLOAT32>(z + i, n - i, step, seed, first + i, out + i);
}

HL_AVX2 void quantize_narrow_f32_avx2(const float* xs, const uint64_t* idx, uint64_t rows,
                                      uint64_t d, const QuantParams& qp, uint32_t* codes,
                                      uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                                      uint8_t* bytes) {
  quantize_f32_avx2_rows<true>(xs, idx, rows, d, qp, codes, row_outlier, hashes, narrow, bytes);
}

HL_AVX2 void stream_copy_avx2(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
}

}  // namespace cpu
}  // namespace hl
#endif
