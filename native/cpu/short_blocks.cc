// Short-block sections on the host (short_blocks.h): the widths pass and the writer, chosen at
// load time (cpu::simd_level). The widths pass sizes block packing and short blocks at once. The
// writers turn a pair of blocks (32 codes) into bit planes as block packing does a block of 32,
// one instruction a plane (AVX-512 and AVX2), or a block of 16 at a time (the portable loops).
// All write the same bytes. The decoder is short_blocks_decode.cc.
#include "short_blocks_internal.h"

namespace hl {
namespace {

using namespace short_blocks;

// The widths of pair p (codes [32 p, 32 p + count), count <= 32) and its largest code.
inline uint32_t scan_pair_scalar(const uint32_t* v, uint64_t count, uint8_t* w16, uint8_t* w32) {
  uint32_t a = 0, b = 0, m = 0;
  for (uint64_t i = 0; i < count; ++i) {
    (i < HL_SHORT_BLOCK ? a : b) |= v[i];
    m = v[i] > m ? v[i] : m;
  }
  w16[0] = (uint8_t)bit_width(a);
  if (count > HL_SHORT_BLOCK) w16[1] = (uint8_t)bit_width(b);
  *w32 = (uint8_t)bit_width(a | b);
  return m;
}

#ifdef HL_SHORT_SIMD
// Full pairs [0, pairs): both halves' ORs reduced together (the first step folds the two
// halves' upper 8 lanes into one register), the largest code kept in a vector till the end.
HL_AVX512 uint32_t scan_pairs_avx512(const uint32_t* v, uint64_t pairs, uint8_t* w16, uint8_t* w32) {
  __m512i m = _mm512_setzero_si512();
  for (uint64_t p = 0; p < pairs; ++p) {
    const __m512i lo = _mm512_loadu_si512(v + p * kPair), hi = _mm512_loadu_si512(v + p * kPair + 16);
    m = _mm512_max_epu32(m, _mm512_max_epu32(lo, hi));
    // lanes 0-7: lo's halves ORed, 8-15: hi's
    __m512i c = _mm512_or_si512(_mm512_shuffle_i64x2(lo, hi, 0x44), _mm512_shuffle_i64x2(lo, hi, 0xee));
    c = _mm512_or_si512(c, _mm512_shuffle_i64x2(c, c, 0xb1));
    c = _mm512_or_si512(c, _mm512_shuffle_epi32(c, (_MM_PERM_ENUM)0x4e));
    c = _mm512_or_si512(c, _mm512_shuffle_epi32(c, (_MM_PERM_ENUM)0xb1));
    const uint32_t a = (uint32_t)_mm512_cvtsi512_si32(c);
    const uint32_t b = (uint32_t)_mm_cvtsi128_si32(_mm512_extracti32x4_epi32(c, 2));
    w16[2 * p] = (uint8_t)bit_width(a);
    w16[2 * p + 1] = (uint8_t)bit_width(b);
    w32[p] = (uint8_t)bit_width(a | b);
  }
  return (uint32_t)_mm512_reduce_max_epu32(m);
}

HL_AVX2 inline uint32_t hor_or_avx2(__m256i x) {
  __m128i h = _mm_or_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  h = _mm_or_si128(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_or_si128(h, _mm_shuffle_epi32(h, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(h);
}

HL_AVX2 uint32_t scan_pairs_avx2(const uint32_t* v, uint64_t pairs, uint8_t* w16, uint8_t* w32) {
  __m256i m = _mm256_setzero_si256();
  for (uint64_t p = 0; p < pairs; ++p) {
    const __m256i* q = reinterpret_cast<const __m256i*>(v + p * kPair);
    const __m256i x0 = _mm256_loadu_si256(q), x1 = _mm256_loadu_si256(q + 1),
                  x2 = _mm256_loadu_si256(q + 2), x3 = _mm256_loadu_si256(q + 3);
    m = _mm256_max_epu32(m, _mm256_max_epu32(_mm256_max_epu32(x0, x1), _mm256_max_epu32(x2, x3)));
    const uint32_t a = hor_or_avx2(_mm256_or_si256(x0, x1)), b = hor_or_avx2(_mm256_or_si256(x2, x3));
    w16[2 * p] = (uint8_t)bit_width(a);
    w16[2 * p + 1] = (uint8_t)bit_width(b);
    w32[p] = (uint8_t)bit_width(a | b);
  }
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(h);
}

// Pairs [lo, hi) of the n codes at v written from out on (up to end): one test-into-mask a
// plane of the pair's 32 codes in 16-bit lanes (codes are below 2^15), its halves stored top
// plane down as write_pair_avx2 does where there is room, and near the end through masked
// stores of each block's width (the decoder's steps backwards).
HL_AVX512 uint8_t* write_pairs_avx512(const uint32_t* v, const uint8_t* w16, uint64_t lo,
                                      uint64_t hi, uint8_t* out, const uint8_t* end) {
  alignas(64) uint32_t words[16] = {};
  for (uint64_t p = lo; p < hi; ++p) {
    const uint32_t wa = w16[2 * p], wb = w16[2 * p + 1], wm = wa > wb ? wa : wb;
    const __m512i lo16 = _mm512_loadu_si512(v + p * kPair), hi16 = _mm512_loadu_si512(v + p * kPair + 16);
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo16)),
                                         _mm512_cvtepi32_epi16(hi16), 1);
    uint8_t* b = out + 2 * wa;
    if (b + 2 * wm <= end) {  // as write_pair_avx2: top plane down, block 2p's half first
      for (uint32_t j = wm; j-- > 0;) {
        const uint32_t m = _mm512_test_epi16_mask(h, _mm512_set1_epi16((short)(1u << j)));
        store_u16(out + 2 * j, (uint16_t)m);
        store_u16(b + 2 * j, (uint16_t)(m >> 16));
      }
      out = b + 2 * wb;
      continue;
    }
    for (uint32_t j = 0; j < wm; ++j)
      words[j] = _mm512_test_epi16_mask(h, _mm512_set1_epi16((short)(1u << j)));
    const __m512i w = _mm512_load_si512(words);  // words past wm: a previous pair's, masked out below
    _mm256_mask_storeu_epi16(out, (__mmask16)((1u << wa) - 1), _mm512_cvtepi32_epi16(w));
    out += 2 * wa;
    _mm256_mask_storeu_epi16(out, (__mmask16)((1u << wb) - 1),
                             _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
    out += 2 * wb;
  }
  return out;
}

// A pair's planes written from its 32 codes (wm = the larger width), inlined into
// write_pairs_avx2's loop: called once a pair from outside, it took 1.5x block packing's time
// (benchmarks/RESULTS.md). Codes held as bytes (wm <= 8): all eight planes of each block at once,
// an 8x8 bit transpose in each 64-bit lane turning byte c of eight codes into their plane c, then
// one shuffle a 128-bit lane putting block 2p's eight plane words in the low half and block
// 2p + 1's in the high one. Two 16-byte stores, block 2p's first: its planes past wa are zero and
// block 2p + 1's overwrite them, whose own zero planes the next pair overwrites, so the caller
// leaves 2 * wa + 16 bytes of room from out. No loop on the width (4-5 planes a pair in a step's
// gradients), whose exits missed: a step's gradients compress 1.09-1.11x faster.
HL_AVX2 inline uint8_t* write_byte_pair_avx2(__m256i bytes, uint32_t wa, uint32_t wb,
                                              uint8_t* out) {
  const __m256i x = transpose_bits8x8_avx2(bytes);  // code r's bit c to byte c's bit r
  // plane c of a block of 16 codes: byte c of its two 64-bit lanes, as one 16-bit word
  const __m256i words = _mm256_shuffle_epi8(
      x, _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                          0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(words));
  uint8_t* b = out + 2 * wa;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b), _mm256_extracti128_si256(words, 1));
  return b + 2 * wb;
}

// Wider than 8 bits, through block packing's kernel: plane j of both blocks is one word, its low
// half block 2p's plane j and its high half block 2p + 1's, written from the top plane down,
// block 2p's before block 2p + 1's (a block's planes past its width are zero): block 2p's extra
// planes land on block 2p + 1's lower ones, written afterwards, and block 2p + 1's on what the
// next pair overwrites, so the caller leaves 2 * wm bytes of room after block 2p + 1's start.
HL_AVX2 inline uint8_t* write_pair_avx2(const uint32_t* v, uint32_t wa, uint32_t wb, uint8_t* out) {
  const uint32_t wm = wa > wb ? wa : wb;
  uint8_t* b = out + 2 * wa;
  if (wm > 8) {
    uint32_t m[HL_SHORT_MAX_WIDTH];
    pack_block32(v, wm, reinterpret_cast<uint8_t*>(m));
    for (uint32_t j = wm; j-- > 0;) {
      store_u16(out + 2 * j, (uint16_t)m[j]);
      store_u16(b + 2 * j, (uint16_t)(m[j] >> 16));
    }
    return b + 2 * wb;
  }
  return write_byte_pair_avx2(bytes_of_block_avx2(v), wa, wb, out);
}

// write_pair_avx2 of codes held as bytes.
HL_AVX2 inline uint8_t* write_pair_avx2(const uint8_t* v, uint32_t wa, uint32_t wb, uint8_t* out) {
  return write_byte_pair_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)), wa, wb,
                              out);
}

// Full pairs from *p on while the room lasts (the loop inside the target function, so that the
// pair is inlined): returns where the planes end, *p the first pair not written. T: codes
// (uint32_t) or codes held as bytes (uint8_t).
template <class T>
HL_AVX2 uint8_t* write_pairs_avx2(const T* v, const uint8_t* w16, uint64_t* p, uint64_t full,
                                  uint8_t* out, const uint8_t* end) {
  uint64_t q = *p;
  for (; q < full; ++q) {
    const uint32_t wa = w16[2 * q], wb = w16[2 * q + 1], wm = wa > wb ? wa : wb;
    if (out + 2 * wa + (wm > 8 ? 2 * wm : 16) > end) break;
    out = write_pair_avx2(v + q * kPair, wa, wb, out);
  }
  *p = q;
  return out;
}

// scan_pairs of codes held as bytes, four pairs (eight blocks) a step: each block's bytes ORed
// down to byte 0 of a 32-bit lane (its width is that byte's), the widths from the two nibbles
// by table, then gathered into block order.
HL_AVX2 uint32_t scan_byte_pairs_avx2(const uint8_t* v, uint64_t pairs, uint8_t* w16,
                                      uint8_t* w32) {
  const __m256i width_lo = _mm256_setr_epi8(0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4,
                                            0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4);
  const __m256i width_hi = _mm256_setr_epi8(0, 5, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 8,
                                            0, 5, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 8);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  // per 128-bit lane, bytes 0, 8, 4, 12: the lane's blocks of pairs 0, 1, 2, 3
  const __m256i gather = _mm256_setr_epi8(0, 8, 4, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 8, 4, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i m = _mm256_setzero_si256();
  uint64_t p = 0;
  for (; p + 4 <= pairs; p += 4) {
    // a register a pair: block 2p in the low 128-bit lane, block 2p + 1 in the high one
    const __m256i* q = reinterpret_cast<const __m256i*>(v + p * kPair);
    const __m256i r0 = _mm256_loadu_si256(q), r1 = _mm256_loadu_si256(q + 1),
                  r2 = _mm256_loadu_si256(q + 2), r3 = _mm256_loadu_si256(q + 3);
    m = _mm256_max_epu8(m, _mm256_max_epu8(_mm256_max_epu8(r0, r1), _mm256_max_epu8(r2, r3)));
    // 64-bit lane k of a 128-bit lane: its block of pair 2k (y) or 2k + 1 (z), ORed to 8 bytes
    __m256i y = _mm256_or_si256(_mm256_unpacklo_epi64(r0, r1), _mm256_unpackhi_epi64(r0, r1));
    __m256i z = _mm256_or_si256(_mm256_unpacklo_epi64(r2, r3), _mm256_unpackhi_epi64(r2, r3));
    y = _mm256_or_si256(y, _mm256_srli_epi64(y, 32));
    z = _mm256_or_si256(z, _mm256_srli_epi64(z, 32));
    // 32-bit lanes of a 128-bit lane: pairs 0, 2, 1, 3, each block ORed to 4 bytes, then 1
    __m256i w = _mm256_blend_epi32(y, _mm256_slli_epi64(z, 32), 0xaa);
    w = _mm256_or_si256(w, _mm256_srli_epi32(w, 16));
    w = _mm256_or_si256(w, _mm256_srli_epi32(w, 8));
    w = _mm256_max_epu8(_mm256_shuffle_epi8(width_lo, _mm256_and_si256(w, nibble)),
                        _mm256_shuffle_epi8(width_hi, _mm256_and_si256(_mm256_srli_epi32(w, 4), nibble)));
    w = _mm256_shuffle_epi8(w, gather);
    const __m128i even = _mm256_castsi256_si128(w), odd = _mm256_extracti128_si256(w, 1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(w16 + 2 * p), _mm_unpacklo_epi8(even, odd));
    const uint32_t both = (uint32_t)_mm_cvtsi128_si32(_mm_max_epu8(even, odd));
    memcpy(w32 + p, &both, 4);
  }
  __m128i h = _mm_max_epu8(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu8(h, _mm_srli_si128(h, 8));
  h = _mm_max_epu8(h, _mm_srli_si128(h, 4));
  h = _mm_max_epu8(h, _mm_srli_si128(h, 2));
  h = _mm_max_epu8(h, _mm_srli_si128(h, 1));
  uint32_t mx = (uint32_t)_mm_cvtsi128_si32(h) & 0xff;
  for (; p < pairs; ++p) {
    uint32_t tmp[kPair];
    for (uint64_t i = 0; i < kPair; ++i) tmp[i] = v[p * kPair + i];
    const uint32_t pm = scan_pair_scalar(tmp, kPair, w16 + 2 * p, w32 + p);
    mx = pm > mx ? pm : mx;
  }
  return mx;
}

#endif

uint32_t scan_pairs(const uint32_t* v, uint64_t pairs, uint8_t* w16, uint8_t* w32, int simd) {
#ifdef HL_SHORT_SIMD
  if (simd >= 2) return scan_pairs_avx512(v, pairs, w16, w32);
  if (simd == 1) return scan_pairs_avx2(v, pairs, w16, w32);
#endif
  (void)simd;
  uint32_t m = 0;
  for (uint64_t p = 0; p < pairs; ++p) {
    const uint32_t pm = scan_pair_scalar(v + p * kPair, kPair, w16 + 2 * p, w32 + p);
    m = pm > m ? pm : m;
  }
  return m;
}

// scan_pairs of codes held as bytes.
uint32_t scan_pairs(const uint8_t* v, uint64_t pairs, uint8_t* w16, uint8_t* w32, int simd) {
#ifdef HL_SHORT_SIMD
  if (simd >= 1) return scan_byte_pairs_avx2(v, pairs, w16, w32);
#endif
  (void)simd;
  uint32_t m = 0;
  uint32_t tmp[kPair];
  for (uint64_t p = 0; p < pairs; ++p) {
    for (uint64_t i = 0; i < kPair; ++i) tmp[i] = v[p * kPair + i];
    const uint32_t pm = scan_pair_scalar(tmp, kPair, w16 + 2 * p, w32 + p);
    m = pm > m ? pm : m;
  }
  return m;
}

// Bit j of each of 8 bytes (x's byte k: code k) as one byte: the multiply moves byte k's bit
// to bit 56 + k without carries (frame bits 8k + 7m + 7 are distinct for k, m < 8).
inline uint32_t byte_plane(uint64_t x, uint32_t j) {
  return (uint32_t)((((x >> j) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

uint8_t* write_block16(const uint32_t* v, uint32_t w, uint8_t* out) {
  if (w <= 8) {
    uint64_t x0 = 0, x1 = 0;
    for (int i = 0; i < 8; ++i) {
      x0 |= (uint64_t)v[i] << (8 * i);
      x1 |= (uint64_t)v[8 + i] << (8 * i);
    }
    for (uint32_t j = 0; j < w; ++j, out += 2)
      store_u16(out, (uint16_t)(byte_plane(x0, j) | byte_plane(x1, j) << 8));
    return out;
  }
  for (uint32_t j = 0; j < w; ++j, out += 2) {
    uint32_t word = 0;
    for (int i = 0; i < HL_SHORT_BLOCK; ++i) word |= ((v[i] >> j) & 1u) << i;
    store_u16(out, (uint16_t)word);
  }
  return out;
}

inline uint32_t width_at(const uint8_t* w16, uint64_t nb, uint64_t b) { return b < nb ? w16[b] : 0; }

// Pairs [lo, hi) of the n codes at v, planes from `out` on (where pair lo's start) up to `end`
// (where pair hi's start): AVX-512 for every full pair; with AVX2 a pair's 32 codes go through
// the block kernel as one block whose plane j holds block 2p's plane j in its low 16 bits and
// block 2p + 1's in the high ones; otherwise (and near `end`) the portable loops.
void write_pairs(const uint32_t* v, uint64_t n, const uint8_t* w16, uint64_t lo, uint64_t hi,
                 uint8_t* out, uint8_t* end) {
  const int simd = cpu::simd_level();
#ifdef HL_SHORT_SIMD
  const uint64_t full = n / kPair < hi ? n / kPair : hi;
  if (simd >= 2 && lo < full) {
    out = write_pairs_avx512(v, w16, lo, full, out, end);
    lo = full;
  } else if (simd == 1 && lo < full) {
    out = write_pairs_avx2(v, w16, &lo, full, out, end);
  }
#endif
  const uint64_t nb = short_n_blocks(n);
  uint32_t tmp[kPair];
  for (uint64_t p = lo; p < hi; ++p) {
    const uint32_t wa = w16[2 * p], wb = width_at(w16, nb, 2 * p + 1);
    const uint64_t start = p * kPair;
    const uint32_t* src = v + start;
    if (start + kPair > n) {
      for (uint64_t i = 0; i < kPair; ++i) tmp[i] = start + i < n ? v[start + i] : 0;
      src = tmp;
    }
    out = write_block16(src, wa, out);
    out = write_block16(src + HL_SHORT_BLOCK, wb, out);
  }
  (void)simd;
  (void)end;
}

// write_pairs of codes held as bytes (the same planes): AVX2 takes the full pairs on every
// machine that has it, the portable loops the rest.
void write_pairs(const uint8_t* v, uint64_t n, const uint8_t* w16, uint64_t lo, uint64_t hi,
                 uint8_t* out, uint8_t* end) {
#ifdef HL_SHORT_SIMD
  const uint64_t full = n / kPair < hi ? n / kPair : hi;
  if (cpu::simd_level() >= 1 && lo < full) out = write_pairs_avx2(v, w16, &lo, full, out, end);
#endif
  (void)end;
  const uint64_t nb = short_n_blocks(n);
  uint32_t tmp[kPair];
  for (uint64_t p = lo; p < hi; ++p) {
    const uint64_t start = p * kPair;
    for (uint64_t i = 0; i < kPair; ++i) tmp[i] = start + i < n ? v[start + i] : 0;
    out = write_block16(tmp, w16[2 * p], out);
    out = write_block16(tmp + HL_SHORT_BLOCK, width_at(w16, nb, 2 * p + 1), out);
  }
}

// Plane bytes of pairs [0, p).
uint64_t planes_before(const uint8_t* w16, uint64_t nb, uint64_t p) {
  uint64_t s = 0;
  for (uint64_t b = 0; b < 2 * p && b < nb; ++b) s += w16[b];
  return 2 * s;
}

template <typename T>
void widths_of(const T* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
               int threads) {
  const uint64_t full = n / kPair, simd = cpu::simd_level();
  uint32_t m = omp_max(full <= kSerialPairs ? 1 : threads, [&](int part, int parts) {
    uint64_t lo, hi;
    split_pairs(full, part, parts, &lo, &hi);
    return scan_pairs(v + lo * kPair, hi - lo, w16 + 2 * lo, w32 + lo, (int)simd);
  });
  if (n > full * kPair) {
    uint32_t tmp[kPair];
    for (uint64_t i = full * kPair; i < n; ++i) tmp[i - full * kPair] = v[i];
    const uint32_t pm = scan_pair_scalar(tmp, n - full * kPair, w16 + 2 * full, w32 + full);
    m = pm > m ? pm : m;
  }
  *max_code = m;
}

}  // namespace

void level1_widths(const uint32_t* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
                   int threads) {
  widths_of(v, n, w16, w32, max_code, threads);
}

void level1_widths(const uint8_t* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
                   int threads) {
  widths_of(v, n, w16, w32, max_code, threads);
}

uint64_t short_bytes(const uint8_t* w16, uint64_t n) {
  const uint64_t nb = short_n_blocks(n);
  return short_section_bytes(n, planes_before(w16, nb, hl_div_up(nb, 2)) / 2);
}

namespace {

template <typename T>
void write_section(const T* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads) {
  const uint64_t nb = short_n_blocks(n), pairs = hl_div_up(nb, 2);
  out[0] = HL_SHORT_MARK;
  uint8_t* nibbles = out + 1;
  for (uint64_t p = 0; p < pairs; ++p)
    nibbles[p] = short_nibble_byte(w16[2 * p], width_at(w16, nb, 2 * p + 1));
  uint8_t* planes = out + short_head_bytes(n);
  if (pairs <= kSerialPairs || threads <= 1) {
    write_pairs(v, n, w16, 0, pairs, planes, planes + planes_before(w16, nb, pairs));
    return;
  }
  omp_threads(threads, [&](int part, int parts) {
    uint64_t lo, hi;
    split_pairs(pairs, part, parts, &lo, &hi);
    write_pairs(v, n, w16, lo, hi, planes + planes_before(w16, nb, lo),
                planes + planes_before(w16, nb, hi));
  });
}

}  // namespace

void short_write(const uint32_t* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads) {
  write_section(v, n, w16, out, threads);
}

void short_write(const uint8_t* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads) {
  write_section(v, n, w16, out, threads);
}

}  // namespace hl
