// Short-block sections on the host (short_blocks.h). Two blocks of 16 codes are one block of
// 32 for the bit-plane kernels (pack_block32 / unpack_block32: AVX-512, AVX2 or portable, chosen
// at load time): plane j of the pair is block 2p's plane j in the low 16 bits and block 2p + 1's
// in the high ones, so this file adds no kernel of its own beyond the widths pass.
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
#define HL_AVX512 __attribute__((target("avx512f,avx2")))
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

inline uint32_t width_at(const uint8_t* w16, uint64_t nb, uint64_t b) { return b < nb ? w16[b] : 0; }

// Pairs [lo, hi) of the n codes at v, planes from `out` on (where pair lo's start).
void write_pairs(const uint32_t* v, uint64_t n, const uint8_t* w16, uint64_t lo, uint64_t hi,
                 uint8_t* out) {
  const uint64_t nb = short_n_blocks(n);
  uint32_t tmp[kPair];
  uint8_t words[4 * HL_SHORT_MAX_WIDTH];
  for (uint64_t p = lo; p < hi; ++p) {
    const uint32_t wa = w16[2 * p], wb = width_at(w16, nb, 2 * p + 1), wm = wa > wb ? wa : wb;
    if (wm == 0) continue;
    const uint64_t start = p * kPair;
    const uint32_t* src = v + start;
    if (start + kPair > n) {
      for (uint64_t i = 0; i < kPair; ++i) tmp[i] = start + i < n ? v[start + i] : 0;
      src = tmp;
    }
    pack_block32(src, wm, words);
    for (uint32_t j = 0; j < wa; ++j, out += 2) store_u16(out, (uint16_t)load_u32(words + 4 * j));
    for (uint32_t j = 0; j < wb; ++j, out += 2) store_u16(out, (uint16_t)(load_u32(words + 4 * j) >> 16));
  }
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
    write_pairs(v, n, w16, 0, pairs, planes);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    uint64_t lo, hi;
    split_pairs(pairs, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &lo, &hi);
    write_pairs(v, n, w16, lo, hi, planes + planes_before(w16, nb, lo));
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
  constexpr uint64_t kChunkPairs = 64;  // 8 KiB of codes: stays in L1 for the sink
  auto run = [&](int t, int nt) {
    uint64_t lo, hi;
    split_pairs(pairs, t, nt, &lo, &hi);
    uint64_t off = 0;
    for (uint64_t p = 0; p < lo; ++p) off += 2u * ((nibbles[p] & 0xf) + (nibbles[p] >> 4));
    uint32_t chunk[kChunkPairs * kPair];
    uint8_t words[4 * HL_SHORT_MAX_WIDTH];
    for (uint64_t c = lo; c < hi; c += kChunkPairs) {
      const uint64_t e = c + kChunkPairs < hi ? c + kChunkPairs : hi;
      for (uint64_t p = c; p < e; ++p) {
        const uint32_t wa = nibbles[p] & 0xf, wb = nibbles[p] >> 4, wm = wa > wb ? wa : wb;
        uint32_t* dst = chunk + (p - c) * kPair;
        if (wm == 0) {
          memset(dst, 0, kPair * sizeof(uint32_t));
          continue;
        }
        const uint8_t* a = payload + off;
        const uint8_t* b = a + 2 * wa;
        for (uint32_t j = 0; j < wm; ++j)
          store_u32(words + 4 * j, (j < wa ? load_u16(a + 2 * j) : 0u) |
                                       (uint32_t)(j < wb ? load_u16(b + 2 * j) : 0u) << 16);
        unpack_block32(words, wm, dst);
        off += 2u * (wa + wb);
      }
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
