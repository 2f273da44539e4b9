// Short-block sections on the host (short_blocks.h), chosen at load time (cpu::simd_level):
// AVX-512 moves a pair of blocks (32 codes) between bit planes and codes with one masked
// instruction a plane, as block packing does a block of 32; AVX2 joins a pair's planes into the
// 32-bit words of one block for block packing's kernels (pack_block32 / unpack_block32); the
// portable loops take a block of 16 at a time. All write the same bytes. The widths pass sizes
// block packing and short blocks at once.
#include "short_blocks.h"

#include <string>

#include "frame_v2_codec.h"
#include "kernels_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#define HL_SHORT_SIMD 1
// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised _mm512_undefined_*()
// values and then warn about them in every caller (as in pack.cc): not our variables.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define HL_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx2")))
#define HL_AVX2 __attribute__((target("avx2")))
#endif

namespace hl {
namespace {

constexpr uint64_t kPair = 2 * HL_SHORT_BLOCK;  // codes of a pair: one block of block packing
static_assert(kPair == HL_BLOCK, "a pair of short blocks is one block of block packing");

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
inline void store_u16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }

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

// Pairs [lo, hi) of a checked section into out (pair lo's first code first); off: the payload
// offset of pair lo, advanced past pair hi - 1. A pair decodes as block packing decodes a block
// of 32: two masked loads (which never touch bytes past a block's planes) and a shift put plane j
// of both blocks in one 32-bit word (block 2p + 1's in the high half), then one masked move into
// byte lanes (16-bit lanes past 8 bits) a plane. Per-block loops over each block's own planes
// were 1.75x slower: their trip counts change from block to block, and so mispredict.
HL_AVX512 void decode_pairs_avx512(const uint8_t* nibbles, const uint8_t* payload, uint64_t lo,
                                   uint64_t hi, uint64_t* off, uint32_t* out) {
  uint64_t at = *off;
  alignas(64) uint32_t words[16];
  for (uint64_t p = lo; p < hi; ++p, out += kPair) {
    const uint32_t wa = nibbles[p] & 0xf, wb = nibbles[p] >> 4, wm = wa > wb ? wa : wb;
    const uint8_t* a = payload + at;
    const __m256i pa = _mm256_maskz_loadu_epi16((__mmask16)((1u << wa) - 1), a);
    const __m256i pb = _mm256_maskz_loadu_epi16((__mmask16)((1u << wb) - 1), a + 2 * wa);
    _mm512_store_si512(words, _mm512_or_si512(_mm512_cvtepu16_epi32(pa),
                                              _mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16)));
    if (wm <= 8) {
      __m256i acc = _mm256_setzero_si256();
      for (uint32_t j = 0; j < wm; ++j)
        acc = _mm256_or_si256(acc, _mm256_maskz_mov_epi8(words[j], _mm256_set1_epi8((char)(1u << j))));
      _mm512_storeu_si512(out, _mm512_cvtepu8_epi32(_mm256_castsi256_si128(acc)));
      _mm512_storeu_si512(out + 16, _mm512_cvtepu8_epi32(_mm256_extracti128_si256(acc, 1)));
    } else {
      __m512i acc = _mm512_setzero_si512();
      for (uint32_t j = 0; j < wm; ++j)
        acc = _mm512_or_si512(acc, _mm512_maskz_mov_epi16(words[j], _mm512_set1_epi16((short)(1u << j))));
      _mm512_storeu_si512(out, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(acc)));
      _mm512_storeu_si512(out + 16, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(acc, 1)));
    }
    at += 2u * (wa + wb);
  }
  *off = at;
}

// Pairs [lo, hi) of the n codes at v written from out on, the decoder's steps backwards: one
// test-into-mask a plane of the pair's 32 codes in 16-bit lanes (codes are below 2^15), then
// each block's halves of those words stored with a masked store of its own width.
HL_AVX512 uint8_t* write_pairs_avx512(const uint32_t* v, const uint8_t* w16, uint64_t lo,
                                      uint64_t hi, uint8_t* out) {
  alignas(64) uint32_t words[16] = {};
  for (uint64_t p = lo; p < hi; ++p) {
    const uint32_t wa = w16[2 * p], wb = w16[2 * p + 1], wm = wa > wb ? wa : wb;
    const __m512i lo16 = _mm512_loadu_si512(v + p * kPair), hi16 = _mm512_loadu_si512(v + p * kPair + 16);
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo16)),
                                         _mm512_cvtepi32_epi16(hi16), 1);
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
#endif

#ifdef HL_SHORT_SIMD
// 16-bit lanes below w all ones: 32 bytes from ones16 + 16 - w.
alignas(64) const uint16_t ones16[32] = {0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff,
                                         0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff};

// Without AVX-512 (no masked loads and stores of 16-bit lanes): whole 32-byte loads and stores
// where the section has room for them (`room`: bytes from the pair's planes to the end of what
// this call may read or write), the lanes past a block's width masked off or, when stored,
// overwritten by the next pair; pairs near the end take the generic path.
HL_AVX2 inline void pair_words_avx2(const uint8_t* a, uint32_t wa, uint32_t wb, uint32_t* words) {
  const __m256i pa = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones16 + 16 - wa)));
  const __m256i pb = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2 * wa)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones16 + 16 - wb)));
  __m256i* w = reinterpret_cast<__m256i*>(words);
  _mm256_storeu_si256(w, _mm256_or_si256(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(pa)),
                                         _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(pb)), 16)));
  _mm256_storeu_si256(w + 1, _mm256_or_si256(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(pa, 1)),
                                             _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(pb, 1)), 16)));
}

HL_AVX2 inline void pair_planes_avx2(const uint32_t* words, uint32_t wa, uint8_t* out) {
  const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
  const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 8));
  const __m256i low = _mm256_set1_epi32(0xffff);
  // packus works per 128-bit lane: the permutation puts the 16 halves back in plane order
  const __m256i a = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(w0, low), _mm256_and_si256(w1, low)), 0xd8);
  const __m256i b = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_srli_epi32(w0, 16), _mm256_srli_epi32(w1, 16)), 0xd8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * wa), b);  // after a: b wins the overlap
}
#endif

// The same for any machine: a pair's planes as 32-bit words (block 2p's in the low 16 bits,
// block 2p + 1's in the high ones) for the block kernels.
// The portable loops, a block of 16 at a time. spread8[b] has byte k equal to bit k of b (a plane
// byte into 8 byte lanes), spread16[b] has 16-bit lane k equal to bit k of the nibble b.
struct Spread {
  uint64_t b8[256], b16[16];
  Spread() {
    for (int b = 0; b < 256; ++b) {
      b8[b] = 0;
      for (int k = 0; k < 8; ++k) b8[b] |= (uint64_t)((b >> k) & 1) << (8 * k);
    }
    for (int b = 0; b < 16; ++b) {
      b16[b] = 0;
      for (int k = 0; k < 4; ++k) b16[b] |= (uint64_t)((b >> k) & 1) << (16 * k);
    }
  }
};
const Spread kSpread;

void decode_block16(const uint8_t* p, uint32_t w, uint32_t* out) {
  if (w <= 8) {
    uint64_t l0 = 0, l1 = 0;
    for (uint32_t j = 0; j < w; ++j) {
      const uint32_t plane = load_u16(p + 2 * j);
      l0 |= kSpread.b8[plane & 0xff] << j;
      l1 |= kSpread.b8[plane >> 8] << j;
    }
    for (int i = 0; i < 8; ++i) {
      out[i] = (uint32_t)(l0 >> (8 * i)) & 0xff;
      out[8 + i] = (uint32_t)(l1 >> (8 * i)) & 0xff;
    }
    return;
  }
  uint64_t l[4] = {0, 0, 0, 0};
  for (uint32_t j = 0; j < w; ++j) {
    const uint32_t plane = load_u16(p + 2 * j);
    for (int k = 0; k < 4; ++k) l[k] |= kSpread.b16[(plane >> (4 * k)) & 0xf] << j;
  }
  for (int i = 0; i < 16; ++i) out[i] = (uint32_t)(l[i / 4] >> (16 * (i % 4))) & 0xffff;
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

// Pairs [lo, hi) of a checked section (its payload: payload_len bytes) into out.
void decode_pairs(const uint8_t* nibbles, const uint8_t* payload, uint64_t payload_len,
                  uint64_t lo, uint64_t hi, uint64_t* off, uint32_t* out, int simd) {
#ifdef HL_SHORT_SIMD
  if (simd >= 2) return decode_pairs_avx512(nibbles, payload, lo, hi, off, out);
#endif
  uint64_t at = *off;
  for (uint64_t p = lo; p < hi; ++p, out += kPair) {
    const uint32_t wa = nibbles[p] & 0xf, wb = nibbles[p] >> 4;
#ifdef HL_SHORT_SIMD
    if (simd == 1 && at + 2 * (wa + wb) + 32 <= payload_len) {
      alignas(32) uint32_t words[16];
      pair_words_avx2(payload + at, wa, wb, words);
      unpack_block32(reinterpret_cast<const uint8_t*>(words), wa > wb ? wa : wb, out);
    } else
#endif
    {
      decode_block16(payload + at, wa, out);
      decode_block16(payload + at + 2 * wa, wb, out + HL_SHORT_BLOCK);
    }
    at += 2u * (wa + wb);
  }
  (void)simd;
  (void)payload_len;
  *off = at;
}

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
    out = write_pairs_avx512(v, w16, lo, full, out);
    lo = full;
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
#ifdef HL_SHORT_SIMD
    if (simd == 1 && out + 2 * wa + 32 <= end) {
      alignas(32) uint32_t words[16] = {};
      pack_block32(src, wa > wb ? wa : wb, reinterpret_cast<uint8_t*>(words));
      pair_planes_avx2(words, wa, out);
      out += 2 * (wa + wb);
      continue;
    }
#endif
    out = write_block16(src, wa, out);
    out = write_block16(src + HL_SHORT_BLOCK, wb, out);
  }
  (void)simd;
  (void)end;
}

// Plane bytes of pairs [0, p).
uint64_t planes_before(const uint8_t* w16, uint64_t nb, uint64_t p) {
  uint64_t s = 0;
  for (uint64_t b = 0; b < 2 * p && b < nb; ++b) s += w16[b];
  return 2 * s;
}

// Thread t of nt takes pairs [lo, hi) of `pairs`.
void split_pairs(uint64_t pairs, int t, int nt, uint64_t* lo, uint64_t* hi) {
  *lo = pairs * t / nt;
  *hi = pairs * (t + 1) / nt;
}

// Entering an OpenMP region costs about as much as a few thousand blocks (pack.cc).
constexpr uint64_t kSerialPairs = 4096;

}  // namespace

void level1_widths(const uint32_t* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
                   int threads) {
  const uint64_t full = n / kPair, simd = cpu::simd_level();
  uint32_t m = 0;
  if (full <= kSerialPairs || threads <= 1) {
    m = scan_pairs(v, full, w16, w32, (int)simd);
  } else {
#pragma omp parallel num_threads(threads) reduction(max : m)
    {
      uint64_t lo, hi;
      split_pairs(full, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &lo, &hi);
      m = scan_pairs(v + lo * kPair, hi - lo, w16 + 2 * lo, w32 + lo, (int)simd);
    }
  }
  if (n > full * kPair) {
    const uint32_t pm = scan_pair_scalar(v + full * kPair, n - full * kPair, w16 + 2 * full, w32 + full);
    m = pm > m ? pm : m;
  }
  *max_code = m;
}

uint64_t short_bytes(const uint8_t* w16, uint64_t n) {
  const uint64_t nb = short_n_blocks(n);
  return short_head_bytes(n) + planes_before(w16, nb, hl_div_up(nb, 2));
}

void short_write(const uint32_t* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads) {
  const uint64_t nb = short_n_blocks(n), pairs = hl_div_up(nb, 2);
  out[0] = HL_SHORT_MARK;
  uint8_t* nibbles = out + 1;
  for (uint64_t p = 0; p < pairs; ++p)
    nibbles[p] = (uint8_t)(w16[2 * p] | width_at(w16, nb, 2 * p + 1) << 4);
  uint8_t* planes = out + short_head_bytes(n);
  if (pairs <= kSerialPairs || threads <= 1) {
    write_pairs(v, n, w16, 0, pairs, planes, planes + planes_before(w16, nb, pairs));
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    uint64_t lo, hi;
    split_pairs(pairs, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &lo, &hi);
    write_pairs(v, n, w16, lo, hi, planes + planes_before(w16, nb, lo),
                planes + planes_before(w16, nb, hi));
  }
}

void short_unpack_to(const uint8_t* in, uint64_t len, uint64_t n, const char* what, int threads,
                     ChunkSink sink) {
  const uint64_t nb = short_n_blocks(n), pairs = hl_div_up(nb, 2), head = short_head_bytes(n);
  auto fail = [&](const std::string& why) {
    return FrameError(std::string("frame is corrupted: the ") + what + " (short blocks of " +
                      std::to_string(n) + " codes) " + why);
  };
  if (n == 0 || len < head || in[0] != HL_SHORT_MARK)
    throw fail("holds " + std::to_string(len) + " bytes, too few for its " +
               std::to_string(nb) + " widths");
  const uint8_t* nibbles = in + 1;
  if ((nb & 1) && (nibbles[pairs - 1] >> 4) != 0)
    throw fail("has a nonzero padding nibble " + std::to_string(nibbles[pairs - 1] >> 4));
  uint64_t planes = 0;
  for (uint64_t p = 0; p < pairs; ++p) planes += (nibbles[p] & 0xf) + (nibbles[p] >> 4);
  if (head + 2 * planes != len)
    throw fail("holds " + std::to_string(len) + " bytes but its blocks take " +
               std::to_string(head + 2 * planes));
  const uint8_t* payload = in + head;
  const int simd = cpu::simd_level();
  constexpr uint64_t kChunkPairs = 64;  // 8 KiB of codes: stays in L1 for the sink
  auto run = [&](int t, int nt) {
    uint64_t lo, hi;
    split_pairs(pairs, t, nt, &lo, &hi);
    uint64_t off = 0;
    for (uint64_t p = 0; p < lo; ++p) off += 2u * ((nibbles[p] & 0xf) + (nibbles[p] >> 4));
    uint32_t chunk[kChunkPairs * kPair];
    for (uint64_t c = lo; c < hi; c += kChunkPairs) {
      const uint64_t e = c + kChunkPairs < hi ? c + kChunkPairs : hi;
      decode_pairs(nibbles, payload, 2 * planes, c, e, &off, chunk, simd);
      const uint64_t first = c * kPair, last = e * kPair < n ? e * kPair : n;
      sink.fn(sink.ctx, first, chunk, last - first);
    }
  };
  if (threads <= 1 || pairs <= kSerialPairs) {  // no OpenMP region for one thread
    run(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  run(omp_get_thread_num_safe(), omp_get_num_threads_safe());
}

}  // namespace hl
