// Block packing's AVX2 kernels for blocks of 32 values below 256 (lossy codes of a few bits, the
// usual case), inline so that other loops compiled for AVX2 take them without a call: pack.cc's
// blocks and short_blocks{,_decode}.cc's pairs of short blocks, which are such blocks too; and a
// block's reduction to its OR or largest value, which radix.cc's spans take their widths from.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define HL_HAVE_PACK_AVX2 1
#define HL_PACK_AVX2 __attribute__((target("avx2")))

namespace hl {

// The 32 values at v, each below 256, as 32 bytes in value order: values < 256 survive the
// saturating packs, which work per 128-bit lane, and the dword permutation restores the order.
HL_PACK_AVX2 inline __m256i bytes_of_block_avx2(const uint32_t* v) {
  const __m256i* p = reinterpret_cast<const __m256i*>(v);
  const __m256i ab = _mm256_packs_epi32(_mm256_loadu_si256(p), _mm256_loadu_si256(p + 1));
  const __m256i cd = _mm256_packs_epi32(_mm256_loadu_si256(p + 2), _mm256_loadu_si256(p + 3));
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// An 8x8 bit matrix in each 64-bit lane transposed (three delta swaps): bit 8r + c to bit 8c + r.
// Byte r holding bit c of eight values becomes byte c holding plane c of those values, and back.
HL_PACK_AVX2 inline __m256i transpose_bits8x8_avx2(__m256i x) {
  __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 7)),
                               _mm256_set1_epi64x(0x00AA00AA00AA00AALL));
  x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 7)));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 14)),
                       _mm256_set1_epi64x(0x0000CCCC0000CCCCLL));
  x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 14)));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 28)),
                       _mm256_set1_epi64x(0x00000000F0F0F0F0LL));
  return _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, 28)));
}

// Bit plane j (< 8) of those bytes: bit j of each byte moved to its sign bit, then movemask.
HL_PACK_AVX2 inline uint32_t byte_plane_avx2(__m256i bytes, uint32_t j) {
  return (uint32_t)_mm256_movemask_epi8(_mm256_sll_epi16(bytes, _mm_cvtsi32_si128((int)(7 - j))));
}

// Block packing's w <= 8 bit planes of 32 values held as bytes.
HL_PACK_AVX2 inline void pack_bytes_avx2(const uint8_t* v, uint32_t w, uint8_t* out) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  for (uint32_t j = 0; j < w; ++j) {
    const uint32_t plane = byte_plane_avx2(bytes, j);
    memcpy(out + 4 * j, &plane, 4);
  }
}

// 32 bytes widened to 32 uint32 values at v.
HL_PACK_AVX2 inline void store_bytes_u32_avx2(__m256i bytes, uint32_t* v) {
  const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
  __m256i* o = reinterpret_cast<__m256i*>(v);
  _mm256_storeu_si256(o, _mm256_cvtepu8_epi32(lo));
  _mm256_storeu_si256(o + 1, _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  _mm256_storeu_si256(o + 2, _mm256_cvtepu8_epi32(hi));
  _mm256_storeu_si256(o + 3, _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

// 32 values from w <= 8 bit planes of 4 bytes at `in` (bit i of plane j = bit j of value i),
// into 32 byte lanes: byte i of a broadcast plane word picks byte i / 8 of the word, then tests
// bit i % 8.
HL_PACK_AVX2 inline void unpack_narrow_block_avx2(const uint8_t* in, uint32_t w, uint32_t* v) {
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  __m256i acc = _mm256_setzero_si256();
  for (uint32_t j = 0; j < w; ++j) {
    uint32_t word;
    memcpy(&word, in + 4 * j, 4);
    const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32((int)word), pick);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
    acc = _mm256_or_si256(acc, _mm256_and_si256(set, _mm256_set1_epi8((char)(1u << j))));
  }
  store_bytes_u32_avx2(acc, v);
}

// Two vectors of a block's values reduced lane by lane: their largest (kMax) or their OR.
template <bool kMax>
HL_PACK_AVX2 inline __m256i reduce8_avx2(__m256i a, __m256i b) {
  return kMax ? _mm256_max_epu32(a, b) : _mm256_or_si256(a, b);
}
template <bool kMax>
HL_PACK_AVX2 inline __m128i reduce4_avx2(__m128i a, __m128i b) {
  return kMax ? _mm_max_epu32(a, b) : _mm_or_si128(a, b);
}

// The 32 values of a block held in four vectors reduced to one: their largest (kMax) or their
// OR (as wide as the largest): block packing's widths and largest codes, and the widths of the
// radix spans built in registers (radix.cc).
template <bool kMax>
HL_PACK_AVX2 inline uint32_t block_reduce4_avx2(__m256i a, __m256i b, __m256i c, __m256i e) {
  const __m256i m = reduce8_avx2<kMax>(reduce8_avx2<kMax>(a, b), reduce8_avx2<kMax>(c, e));
  __m128i h = reduce4_avx2<kMax>(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = reduce4_avx2<kMax>(h, _mm_shuffle_epi32(h, 0x4e));
  h = reduce4_avx2<kMax>(h, _mm_shuffle_epi32(h, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(h);
}

}  // namespace hl
#endif
