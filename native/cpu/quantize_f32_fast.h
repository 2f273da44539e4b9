// Single-precision lanes for the AVX2 float32 quantizer (kernels_avx2.cc): eight elements a
// vector, twice the lanes of the double-precision kernel and none of its conversions, for the
// elements whose decision single precision cannot get wrong. The double kernel stays the
// definition (hl::quantize); a group of eight with any lane near an edge is redone by it, so the
// codes, the outliers and the frame are the same bits on every path.
//
// Why single precision decides exactly where it says it is sure (step in [2^-100, 2^100], so no
// intermediate is subnormal or overflows in a way that matters; t* = (x - u) / step = x / step - d
// exactly, with d = u / step = (k + 1/2) * 2^-24 for the 24 hashed bits less 2^23, k
// (hl::dither_unit)):
// - The offset in steps: d_f = fl(b * 2^-24 - (1/2 - 2^-25)), one FMA of exact operands (b the
//   24 bits, exact in float), so |d_f - d| <= 2^-26 (d_f is in [-1/2, 1/2]).
// - The scaled value: s_f = fl(x * fl(1 / step) - d_f), one FMA, is within 2^-10 of t* whenever
//   |s_f| <= L = 2^12: the reciprocal's rounding costs 2^-24 * |x| / step <= 2^-24 * (L + 1),
//   the FMA's 2^-24 * |s_f|, and d_f's 2^-26. The double kernel's t is within 2^-39 of t*.
// - So when |s_f - round(s_f)| <= 1/2 - 2^-9, the double t lies strictly within 1/2 of the same
//   integer r: rint(t) = r, and |t| <= L + 1 is in range.
// - And the bound holds with room: |x - u - r * step| <= (1/2 - 2^-9 + 2^-10) * step, the
//   decoder's rounding to float adds at most 2^-24 * (L + 1) * step < 2^-11 * step, so the error
//   stays below step / 2 = eb_abs. A sure lane is never an outlier.
// NaN and +-Inf fail |s_f| <= L and go to the double kernel, which stores them as outliers.
// Where every finite element has |x| <= M with M / step + 1 <= 4000 (the range of the segment
// says so; QuantParams::max_abs), |s_f| <= L holds for each of them, and the check is left out:
// NaN and +-Inf still fail, since s_f - round(s_f) is NaN for them.
// The margin scales with L: for |s_f| <= L (any L >= 1) the errors above are at most
// 2^-23 * L + 2^-23, and the decoder's rounding 2^-24 * (L + 1), so an edge of 1/2 - 2^-21 * L
// keeps both arguments. Such a segment takes the least power of two L above M / step + 1:
// typical lookups (L = 16) leave the fast lanes once in 2^16 elements, not once in 2^8. Without
// M (absolute bounds, reuse's residuals), each lane takes L = |s_f| + 1 for itself, at the cost
// of an FMA: one fixed L = 2^12 sent 3% of groups of eight to the double kernel, which made a
// compress as slow as a range pass and the bounded kernel together.
#pragma once

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

namespace hl {
namespace cpu {
namespace {

struct FastF32 {
  bool on = false;  // step within [2^-100, 2^100]
  bool bounded = false;  // |s_f| <= L for every finite element: no need to check it
  // bounded with L <= 128: a sure lane's code q has |q| <= 127 (|s_f| <= L - 1/2 even
  // dithered, and sure lanes are within 1/2 of q), so q fits a signed byte and its zigzag a byte
  bool byte_codes = false;
  __m256 inv, limit, edge;  // edge: the bounded kernel's (one L for all lanes)
};

__attribute__((target("avx2,fma"))) inline FastF32 fast_f32(double step, double inv_step,
                                                        double max_abs = INFINITY) {
  FastF32 f;
  f.on = step >= 0x1p-100 && step <= 0x1p100;
  f.bounded = max_abs * inv_step + 1.0 <= 4000.0;
  double l = 4096.0;  // L: a power of two, so that the edge below is exact in float
  if (f.bounded)
    for (l = 1.0; l < max_abs * inv_step + 1.0;) l *= 2.0;
  f.byte_codes = f.on && f.bounded && l <= 128.0;
  f.inv = _mm256_set1_ps((float)inv_step);
  f.limit = _mm256_set1_ps(4096.0f);
  f.edge = _mm256_set1_ps((float)(0.5 - 0x1p-21 * l));
  return f;
}

__attribute__((target("avx2"), always_inline)) inline __m256 abs_mask_ps() {
  return _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
}

// s_f of eight elements, rounded to the nearest (r) and how far it is from that (|s_f - r|):
// x * fl(1 / step), less the dither's offset in steps d_f when `bits` carries dither_bits8's
// 24-bit hashes.
struct Scaled8 {
  __m256 s, r, frac;
};
template <bool Dither>
__attribute__((target("avx2,fma"), always_inline)) inline Scaled8 scaled8(const float* x,
                                                                         const FastF32& f,
                                                                         __m256i bits) {
  const __m256 v = _mm256_loadu_ps(x);
  Scaled8 o;
  if (Dither) {
    const __m256 d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bits), _mm256_set1_ps(0x1p-24f),
                                     _mm256_set1_ps(-(0.5f - 0x1p-25f)));
    o.s = _mm256_fmsub_ps(v, f.inv, d);
  } else {
    o.s = _mm256_mul_ps(v, f.inv);
  }
  o.r = _mm256_round_ps(o.s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  o.frac = _mm256_and_ps(_mm256_sub_ps(o.s, o.r), abs_mask_ps());
  return o;
}

// Zigzag codes of eight elements (x - u when `bits` carries dither_bits8's 24-bit hashes, else
// x) into *zig; false when some lane is near an edge and the group must go to the double kernel
// (*zig then holds nothing of use).
template <bool Dither, bool Bounded = false>
__attribute__((target("avx2,fma"))) inline bool quantize8_fast(const float* x, const FastF32& f,
                                                           __m256i bits, __m256i* zig) {
  const Scaled8 q8 = scaled8<Dither>(x, f, bits);
  // ordered compares: false for NaN
  __m256 sure;
  if (Bounded) {
    sure = _mm256_cmp_ps(q8.frac, f.edge, _CMP_LE_OQ);
  } else {
    // Each lane its own margin, from L = |s_f| + 1: 1/2 - 2^-20 * L, one FMA from exact
    // operands whose rounding (2^-26 at most) stays inside the 2^-21 * L it has to spare.
    const __m256 a = _mm256_and_ps(q8.s, abs_mask_ps());
    const __m256 edge =
        _mm256_fnmadd_ps(a, _mm256_set1_ps(0x1p-20f), _mm256_set1_ps(0.5f - 0x1p-20f));
    sure = _mm256_and_ps(_mm256_cmp_ps(a, f.limit, _CMP_LE_OQ),
                         _mm256_cmp_ps(q8.frac, edge, _CMP_LE_OQ));
  }
  if (_mm256_movemask_ps(sure) != 0xff) return false;
  const __m256i q = _mm256_cvtps_epi32(q8.r);
  *zig = _mm256_xor_si256(_mm256_slli_epi32(q, 1), _mm256_srai_epi32(q, 31));
  return true;
}

// The code of eight elements (x - u with dither bits, as quantize8_fast) as the bounded kernel
// rounds it, before zigzag, and its lanes' sureness and'ed into *sure (all ones: sure).
template <bool Dither>
__attribute__((target("avx2,fma"), always_inline)) inline __m256i bounded_q8(
    const float* x, const FastF32& f, __m256i bits, __m256* sure) {
  const Scaled8 q8 = scaled8<Dither>(x, f, bits);
  *sure = _mm256_and_ps(*sure, _mm256_cmp_ps(q8.frac, f.edge, _CMP_LE_OQ));  // false for NaN
  return _mm256_cvtps_epi32(q8.r);
}

// 32 codes as bytes (FastF32::byte_codes, every lane sure): the signed codes packed to bytes
// (exact: |q| <= 127) in the order the kernels store them (the packs work within 128-bit lanes,
// the permutation restores it), then zigzagged a byte at a time (q + q, xor q's sign: AVX2 has
// no byte shift), four times the lanes of zigzag in 32 bits. The same bytes as zigzag first,
// then unsigned packs.
__attribute__((target("avx2"), always_inline)) inline __m256i zigzag_bytes32(__m256i a, __m256i b,
                                                                          __m256i c, __m256i e) {
  const __m256i q = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e)),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return _mm256_xor_si256(_mm256_add_epi8(q, q), _mm256_cmpgt_epi8(_mm256_setzero_si256(), q));
}

}  // namespace
}  // namespace cpu
}  // namespace hl
