// Bit-plane block packing on the host, chosen at load time (cpu::simd_level): with AVX-512BW one
// instruction moves a whole bit plane of 32 values between a mask and byte, 16- or 32-bit lanes;
// with AVX2, blocks of values below 256 (the usual case: lossy codes of a few bits) take 32
// values a plane; otherwise an SSE2 path extracts a bit plane of 16 byte-sized values per
// movemask, and wider values take the portable loop. All write the same bytes.
#include "pack.h"

#include "kernels_cpu.h"
#include "pack_avx2.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#define HL_HAVE_AVX512_PACK 1
// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised _mm512_undefined_*()
// values and then warn about them in every caller: not our variables, so not our warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define HL_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2")))
#endif

namespace hl {

const SpreadTable<8, 8> kSpread8;
const SpreadTable<4, 16> kSpread16;

namespace {

inline uint32_t block_max(const uint32_t* v, uint64_t count) {
  uint32_t m = 0;
  for (uint64_t i = 0; i < count; ++i) m |= v[i];  // OR has the same bit width as max
  return m;
}

void pack_block(const uint32_t* v, uint32_t w, uint8_t* out) {
#if defined(__SSE2__)
  if (w <= 8) {
    // Narrow to bytes (values < 256 fit the signed saturations), then bit j of 16 bytes is the
    // sign bit of each byte after shifting its 16-bit lane left by 7 - j.
    const __m128i* p = reinterpret_cast<const __m128i*>(v);
    __m128i lo = _mm_packus_epi16(_mm_packs_epi32(_mm_loadu_si128(p), _mm_loadu_si128(p + 1)),
                                  _mm_packs_epi32(_mm_loadu_si128(p + 2), _mm_loadu_si128(p + 3)));
    __m128i hi = _mm_packus_epi16(_mm_packs_epi32(_mm_loadu_si128(p + 4), _mm_loadu_si128(p + 5)),
                                  _mm_packs_epi32(_mm_loadu_si128(p + 6), _mm_loadu_si128(p + 7)));
    for (uint32_t j = 0; j < w; ++j) {
      __m128i sh = _mm_cvtsi32_si128((int)(7 - j));
      uint32_t a = (uint32_t)_mm_movemask_epi8(_mm_sll_epi16(lo, sh));
      uint32_t b = (uint32_t)_mm_movemask_epi8(_mm_sll_epi16(hi, sh));
      store_u32(out + 4 * j, a | (b << 16));
    }
    return;
  }
  if (w <= 16) {
    // 16-bit lanes: bias by 2^15 so the signed saturating pack keeps every value, unbias, then
    // bit j is the sign bit after shifting left by 15 - j.
    const __m128i bias32 = _mm_set1_epi32(0x8000);
    const __m128i bias16 = _mm_set1_epi16((short)0x8000);
    const __m128i* p = reinterpret_cast<const __m128i*>(v);
    __m128i h[4];
    for (int k = 0; k < 4; ++k)
      h[k] = _mm_xor_si128(_mm_packs_epi32(_mm_sub_epi32(_mm_loadu_si128(p + 2 * k), bias32),
                                           _mm_sub_epi32(_mm_loadu_si128(p + 2 * k + 1), bias32)),
                           bias16);
    for (uint32_t j = 0; j < w; ++j) {
      __m128i sh = _mm_cvtsi32_si128((int)(15 - j));
      __m128i a = _mm_packs_epi16(_mm_srai_epi16(_mm_sll_epi16(h[0], sh), 15),
                                  _mm_srai_epi16(_mm_sll_epi16(h[1], sh), 15));
      __m128i b = _mm_packs_epi16(_mm_srai_epi16(_mm_sll_epi16(h[2], sh), 15),
                                  _mm_srai_epi16(_mm_sll_epi16(h[3], sh), 15));
      store_u32(out + 4 * j, (uint32_t)_mm_movemask_epi8(a) | ((uint32_t)_mm_movemask_epi8(b) << 16));
    }
    return;
  }
#endif
  for (uint32_t j = 0; j < w; ++j) {
    uint32_t word = 0;
    for (uint32_t i = 0; i < HL_BLOCK; ++i) word |= ((v[i] >> j) & 1u) << i;
    store_u32(out + 4 * j, word);
  }
}



void unpack_block(const uint8_t* in, uint32_t w, uint32_t* v) {
  if (w <= 8) {
    uint64_t lanes[4] = {0, 0, 0, 0};  // 32 byte lanes
    for (uint32_t j = 0; j < w; ++j) {
      uint32_t word = load_u32(in + 4 * j);
      for (int k = 0; k < 4; ++k) lanes[k] |= kSpread8.t[(word >> (8 * k)) & 0xff] << j;
    }
    uint8_t bytes[32];
    memcpy(bytes, lanes, 32);  // little-endian: byte i of the lanes is value i
    for (int i = 0; i < HL_BLOCK; ++i) v[i] = bytes[i];
    return;
  }
  if (w <= 16) {
    uint64_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 32 lanes of 16 bits
    for (uint32_t j = 0; j < w; ++j) {
      uint32_t word = load_u32(in + 4 * j);
      for (int k = 0; k < 8; ++k) lanes[k] |= kSpread16.t[(word >> (4 * k)) & 0xf] << j;
    }
    uint16_t halves[32];
    memcpy(halves, lanes, 64);
    for (int i = 0; i < HL_BLOCK; ++i) v[i] = halves[i];
    return;
  }
  for (int i = 0; i < HL_BLOCK; ++i) v[i] = 0;
  for (uint32_t j = 0; j < w; ++j) {
    uint32_t word = load_u32(in + 4 * j);
    for (int i = 0; i < HL_BLOCK; ++i) v[i] |= ((word >> i) & 1u) << j;
  }
}

#ifdef HL_HAVE_AVX512_PACK
// AVX-512BW versions of pack_block and unpack_block: narrow the block to bytes or 16-bit lanes
// as wide as its width allows, then one test-into-mask (pack) or masked move (unpack) per bit
// plane handles all 32 values. Same bits as the loops above by construction; the tests compare
// the frames of both.
HL_AVX512 void pack_block_avx512(const uint32_t* v, uint32_t w, uint8_t* out) {
  const __m512i lo = _mm512_loadu_si512(v), hi = _mm512_loadu_si512(v + 16);
  if (w <= 8) {
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(lo)),
                                              _mm512_cvtepi32_epi8(hi), 1);
    for (uint32_t j = 0; j < w; ++j)
      store_u32(out + 4 * j, _mm256_test_epi8_mask(b, _mm256_set1_epi8((char)(1u << j))));
  } else if (w <= 16) {
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)),
                                         _mm512_cvtepi32_epi16(hi), 1);
    for (uint32_t j = 0; j < w; ++j)
      store_u32(out + 4 * j, _mm512_test_epi16_mask(h, _mm512_set1_epi16((short)(1u << j))));
  } else {
    // The values' low and high 16 bits as two sets of 32 16-bit lanes: one test a bit plane.
    const __m512i l16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)),
                                           _mm512_cvtepi32_epi16(hi), 1);
    const __m512i h16 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16))),
        _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)), 1);
    for (uint32_t j = 0; j < 16; ++j)
      store_u32(out + 4 * j, _mm512_test_epi16_mask(l16, _mm512_set1_epi16((short)(1u << j))));
    for (uint32_t j = 16; j < w; ++j)
      store_u32(out + 4 * j,
                _mm512_test_epi16_mask(h16, _mm512_set1_epi16((short)(1u << (j - 16)))));
  }
}

HL_AVX512 void unpack_block_avx512(const uint8_t* in, uint32_t w, uint32_t* v) {
  if (w <= 8) {
    __m256i b = _mm256_setzero_si256();
    for (uint32_t j = 0; j < w; ++j)
      b = _mm256_or_si256(b, _mm256_maskz_mov_epi8(load_u32(in + 4 * j),
                                                    _mm256_set1_epi8((char)(1u << j))));
    _mm512_storeu_si512(v, _mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)));
    _mm512_storeu_si512(v + 16, _mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)));
  } else if (w <= 16) {
    __m512i h = _mm512_setzero_si512();
    for (uint32_t j = 0; j < w; ++j)
      h = _mm512_or_si512(h, _mm512_maskz_mov_epi16(load_u32(in + 4 * j),
                                                     _mm512_set1_epi16((short)(1u << j))));
    _mm512_storeu_si512(v, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)));
    _mm512_storeu_si512(v + 16, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)));
  } else {
    // Bits 0-15 and 16..w-1 as two sets of 32 16-bit lanes (one masked move a plane, half the
    // moves of 32-bit lanes: radix-packed values are 17 to 32 bits wide), joined at the end.
    __m512i l16 = _mm512_setzero_si512(), h16 = _mm512_setzero_si512();
    for (uint32_t j = 0; j < 16; ++j)
      l16 = _mm512_or_si512(l16, _mm512_maskz_mov_epi16(load_u32(in + 4 * j),
                                                         _mm512_set1_epi16((short)(1u << j))));
    for (uint32_t j = 16; j < w; ++j)
      h16 = _mm512_or_si512(h16, _mm512_maskz_mov_epi16(load_u32(in + 4 * j),
                                                         _mm512_set1_epi16((short)(1u << (j - 16)))));
    const __m512i lo = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(l16)),
                                       _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h16)), 16));
    const __m512i hi = _mm512_or_si512(
        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(l16, 1)),
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h16, 1)), 16));
    _mm512_storeu_si512(v, lo);
    _mm512_storeu_si512(v + 16, hi);
  }
}

HL_AVX512 uint32_t block_max_avx512(const uint32_t* v) {
  return (uint32_t)_mm512_reduce_or_epi32(
      _mm512_or_si512(_mm512_loadu_si512(v), _mm512_loadu_si512(v + 16)));
}
#endif

#ifdef HL_HAVE_AVX512_PACK
// AVX2 versions for machines without AVX-512: unpacking any width eight planes at a time,
// packing any width 32 values a plane (one movemask of a register of byte lanes).
#define HL_AVX2 __attribute__((target("avx2")))

// Plane J of 32 byte lanes: an immediate shift and a movemask.
template <int J>
HL_AVX2 inline void byte_plane_to(__m256i bytes, uint8_t* out) {
  store_u32(out + 4 * J, (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(bytes, 7 - J)));
}

// Planes 0 to planes - 1 (at most 8) of 32 byte lanes, for blocks over 8 bits, whose groups of
// planes are mostly whole: a loop over the planes with the count in a register (a move to a
// vector register and a shift by it, a plane) held packing radix values to about 3 cycles a
// plane. Narrow blocks keep the loop: their widths change from block to block, and the same
// switch tried in the short blocks' pair writer, whose jumps then missed, made gradients
// compress 1.02-1.03x slower (that writer now transposes: short_blocks.cc).
HL_AVX2 inline void byte_planes_avx2(__m256i bytes, uint32_t planes, uint8_t* out) {
  switch (planes) {
    case 8: byte_plane_to<7>(bytes, out); [[fallthrough]];
    case 7: byte_plane_to<6>(bytes, out); [[fallthrough]];
    case 6: byte_plane_to<5>(bytes, out); [[fallthrough]];
    case 5: byte_plane_to<4>(bytes, out); [[fallthrough]];
    case 4: byte_plane_to<3>(bytes, out); [[fallthrough]];
    case 3: byte_plane_to<2>(bytes, out); [[fallthrough]];
    case 2: byte_plane_to<1>(bytes, out); [[fallthrough]];
    case 1: byte_plane_to<0>(bytes, out); [[fallthrough]];
    default: break;
  }
}

HL_AVX2 void pack_block_avx2(const uint32_t* v, uint32_t w, uint8_t* out) {
  if (w > 8) {
    // Blocks over 8 bits (radix sections' values are 17 to 32): the values' bytes regrouped so
    // that one register holds byte k of all 32 values in value order; then each bit plane is
    // one shift and one movemask, as for byte-sized blocks (four of each a plane before, with
    // 32-bit lanes: a tenth of the dithered encoder's time, packing radix values).
    const __m256i* p = reinterpret_cast<const __m256i*>(v);
    // within each 128-bit lane, dword k of a register: byte k of its 4 values
    const __m256i by_byte = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i a = _mm256_shuffle_epi8(_mm256_loadu_si256(p), by_byte),
                  b = _mm256_shuffle_epi8(_mm256_loadu_si256(p + 1), by_byte),
                  c = _mm256_shuffle_epi8(_mm256_loadu_si256(p + 2), by_byte),
                  d = _mm256_shuffle_epi8(_mm256_loadu_si256(p + 3), by_byte);
    const __m256i ab_lo = _mm256_unpacklo_epi32(a, b), ab_hi = _mm256_unpackhi_epi32(a, b),
                  cd_lo = _mm256_unpacklo_epi32(c, d), cd_hi = _mm256_unpackhi_epi32(c, d);
    // byte k of values 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31: into value order
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i bytes[4] = {
        _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(ab_lo, cd_lo), order),
        _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(ab_lo, cd_lo), order),
        _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(ab_hi, cd_hi), order),
        _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(ab_hi, cd_hi), order)};
    for (uint32_t q = 0; q * 8 < w; ++q)
      byte_planes_avx2(bytes[q], w - q * 8 < 8 ? w - q * 8 : 8, out + 32 * q);
    return;
  }
  const __m256i bytes = bytes_of_block_avx2(v);
  for (uint32_t j = 0; j < w; ++j) store_u32(out + 4 * j, byte_plane_avx2(bytes, j));
}

// Eight bit planes of a block wider than 8 bits (radix sections' values, row maps), as four 8x8
// bit matrices, one a byte of the plane words: matrix k, rows the planes' byte k, moved into
// 64-bit lane k, then transposed in three delta swaps, leaves byte i of the register holding
// those eight bits of value i. `planes` of them (1 to 8) are read, none past the block.
HL_AVX2 inline __m256i byte_group_avx2(const uint8_t* in, uint32_t planes) {
  __m256i x;
  if (planes == 8) {
    x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  } else {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    x = _mm256_maskload_epi32(reinterpret_cast<const int*>(in),
                              _mm256_cmpgt_epi32(_mm256_set1_epi32((int)planes), lane));
  }
  // within each 128-bit lane (four planes), dword k: byte k of each of its planes
  const __m256i by_byte = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                           0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  x = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x, by_byte),
                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return transpose_bits8x8_avx2(x);  // plane r, value c of the eight: bit 8r + c to 8c + r
}

HL_AVX2 void unpack_block_avx2(const uint8_t* in, uint32_t w, uint32_t* v) {
  if (w <= 8) return unpack_narrow_block_avx2(in, w, v);  // one group: the usual case
  // Byte g of every value from planes 8g to 8g + 7, then the four bytes interleaved into values.
  // (Testing each plane's bits into byte lanes, as the narrow blocks do, took twice as many
  // instructions at the 29 bits of the usual radix values.)
  __m256i g[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()};
  for (uint32_t base = 0; base < w; base += 8)
    g[base / 8] = byte_group_avx2(in + 4 * base, w - base < 8 ? w - base : 8);
  // per 128-bit lane: 16-bit values 0-7 | 16-23 (lo) and 8-15 | 24-31 (hi) of bytes 0 and 1...
  const __m256i lo01 = _mm256_unpacklo_epi8(g[0], g[1]), hi01 = _mm256_unpackhi_epi8(g[0], g[1]);
  const __m256i lo23 = _mm256_unpacklo_epi8(g[2], g[3]), hi23 = _mm256_unpackhi_epi8(g[2], g[3]);
  // ...then 32-bit values 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31
  const __m256i a = _mm256_unpacklo_epi16(lo01, lo23), b = _mm256_unpackhi_epi16(lo01, lo23);
  const __m256i c = _mm256_unpacklo_epi16(hi01, hi23), d = _mm256_unpackhi_epi16(hi01, hi23);
  __m256i* o = reinterpret_cast<__m256i*>(v);
  _mm256_storeu_si256(o, _mm256_permute2x128_si256(a, b, 0x20));
  _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(c, d, 0x20));
  _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(a, b, 0x31));
  _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(c, d, 0x31));
}

HL_AVX512 uint32_t block_umax_avx512(const uint32_t* v) {
  return _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_loadu_si512(v), _mm512_loadu_si512(v + 16)));
}

// A block's 32 values reduced to one: their largest (kMax) or their OR (as wide as the largest).
template <bool kMax>
HL_AVX2 uint32_t block_reduce_avx2(const uint32_t* v) {
  const __m256i* p = reinterpret_cast<const __m256i*>(v);
  return block_reduce4_avx2<kMax>(_mm256_loadu_si256(p), _mm256_loadu_si256(p + 1),
                                  _mm256_loadu_si256(p + 2), _mm256_loadu_si256(p + 3));
}
#endif

// Kernels level (cpu::simd_level): 2 AVX-512, 1 AVX2, 0 SSE2 and portable loops.
int simd() { return cpu::simd_level(); }

void pack_one(const uint32_t* v, uint32_t w, uint8_t* out, int level) {
#ifdef HL_HAVE_AVX512_PACK
  if (level >= 2) return pack_block_avx512(v, w, out);
  if (level == 1) return pack_block_avx2(v, w, out);
#endif
  (void)level;
  pack_block(v, w, out);
}

void unpack_one(const uint8_t* in, uint32_t w, uint32_t* v, int level) {
#ifdef HL_HAVE_AVX512_PACK
  if (level >= 2) return unpack_block_avx512(in, w, v);
  if (level == 1) return unpack_block_avx2(in, w, v);
#endif
  (void)level;
  unpack_block(in, w, v);
}

// The largest of count values (max, where block_max is their OR).
uint32_t values_max(const uint32_t* v, uint64_t count, int level) {
#ifdef HL_HAVE_AVX512_PACK
  if (count == HL_BLOCK && level >= 2) return block_umax_avx512(v);
  if (count == HL_BLOCK && level == 1) return block_reduce_avx2<true>(v);
#endif
  (void)level;
  uint32_t m = 0;
  for (uint64_t i = 0; i < count; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

uint32_t full_block_max(const uint32_t* v, int level) {
#ifdef HL_HAVE_AVX512_PACK
  if (level >= 2) return block_max_avx512(v);
  if (level == 1) return block_reduce_avx2<false>(v);
#endif
  (void)level;
  return block_max(v, HL_BLOCK);
}

}  // namespace

void pack_block32(const uint32_t* v, uint32_t w, uint8_t* out) { pack_one(v, w, out, simd()); }
void unpack_block32(const uint8_t* in, uint32_t w, uint32_t* v) { unpack_one(in, w, v, simd()); }

void block_widths(const uint32_t* v, uint64_t n, uint8_t* widths, int threads,
                  uint32_t* max_out) {
  const int64_t nb = (int64_t)hl_div_up(n, HL_BLOCK);
  const int wide = simd();
  auto width = [&](int64_t b) {
    uint64_t start = (uint64_t)b * HL_BLOCK;
    uint64_t count = n - start < HL_BLOCK ? n - start : HL_BLOCK;
    widths[b] = (uint8_t)bit_width(count == HL_BLOCK ? full_block_max(v + start, wide)
                                                     : block_max(v + start, count));
    // the block was just loaded: its max costs little more (radix packing's K)
    return max_out ? values_max(v + start, count, wide) : 0u;
  };
  // one thread up to a few hundred blocks: entering a region costs as much
  const uint32_t m = omp_max(nb <= 4096 ? 1 : threads, [&](int part, int parts) {
    uint32_t pm = 0;
    for (int64_t b = nb * part / parts; b < nb * (part + 1) / parts; ++b) {
      const uint32_t bm = width(b);
      pm = bm > pm ? bm : pm;
    }
    return pm;
  });
  if (max_out) *max_out = m;
}

namespace {

// One block of 32 codes held as bytes (w <= 8): with AVX2 straight from the bytes, else widened
// for the machine's block kernel.
void pack_bytes_one(const uint8_t* v, uint32_t w, uint8_t* out, int level) {
#ifdef HL_HAVE_PACK_AVX2
  if (level == 1) return pack_bytes_avx2(v, w, out);
#endif
  uint32_t tmp[HL_BLOCK];
  for (int i = 0; i < HL_BLOCK; ++i) tmp[i] = v[i];
  pack_one(tmp, w, out, level);
}

}  // namespace

uint64_t payload_bytes(const uint8_t* widths, uint64_t n_blocks) {
  uint64_t s = 0;
  for (uint64_t b = 0; b < n_blocks; ++b) s += widths[b];
  return block_payload_bytes(s);
}

namespace {

inline void pack_one_of(const uint32_t* v, uint32_t w, uint8_t* out, int level) {
  pack_one(v, w, out, level);
}
inline void pack_one_of(const uint8_t* v, uint32_t w, uint8_t* out, int level) {
  pack_bytes_one(v, w, out, level);
}

// pack_blocks for codes of either width: each thread packs a contiguous range of blocks from
// its start offset; the last block is padded with zeros.
template <typename T>
void pack_blocks_of(const T* v, uint64_t n, const uint8_t* widths, uint8_t* out, int threads) {
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  memcpy(out, widths, nb);
  uint8_t* payload = out + nb;
  const int wide = simd();
  const int nt = threads > 1 && nb > 4096 ? threads : 1;
  omp_threads(nt, [&](int part, int parts) {
    const uint64_t lo = nb * part / parts, hi = nb * (part + 1) / parts;
    uint64_t off = payload_bytes(widths, lo);
    T tmp[HL_BLOCK];
    for (uint64_t b = lo; b < hi; ++b) {
      const T* src = v + b * HL_BLOCK;
      if ((b + 1) * HL_BLOCK > n) {
        for (uint64_t i = 0; i < HL_BLOCK; ++i) tmp[i] = b * HL_BLOCK + i < n ? src[i] : 0;
        src = tmp;
      }
      pack_one_of(src, widths[b], payload + off, wide);
      off += 4u * widths[b];
    }
  });
}

}  // namespace

void pack_blocks(const uint8_t* v, uint64_t n, const uint8_t* widths, uint8_t* out,
                 int threads) {
  pack_blocks_of(v, n, widths, out, threads);
}

void pack_blocks(const uint32_t* v, uint64_t n, const uint8_t* widths, uint8_t* out,
                 int threads) {
  pack_blocks_of(v, n, widths, out, threads);
}

namespace {

// Validates a block-packed section of n values: widths of at most max_width, and exactly the
// bytes they announce. Returns the payload.
const uint8_t* check_blocks(const uint8_t* in, uint64_t len, uint64_t n, uint32_t max_width,
                            const char* what) {
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  if (nb > len) {
    throw FrameError(std::string("frame is corrupted: the ") + what + " holds " +
                     std::to_string(len) + " bytes, too few for the widths of " +
                     std::to_string(nb) + " blocks");
  }
  const uint8_t* widths = in;
  for (uint64_t b = 0; b < nb; ++b) {
    if (widths[b] > max_width) {
      throw FrameError(std::string("frame is corrupted: the ") + what + " has a block of " +
                       std::to_string(widths[b]) + " bits, at most " +
                       std::to_string(max_width) + " expected");
    }
  }
  uint64_t need = nb + payload_bytes(widths, nb);
  if (need != len) {
    throw FrameError(std::string("frame is corrupted: the ") + what + " holds " +
                     std::to_string(len) + " bytes but its blocks take " + std::to_string(need));
  }
  return in + nb;
}

// Blocks [lo, hi) of a checked section into v (value lo * 32 first; the last block cut at n).
// off: the payload offset of block lo.
void unpack_range(const uint8_t* widths, const uint8_t* payload, uint64_t n, uint64_t lo,
                  uint64_t hi, uint64_t off, uint32_t* v, int wide) {
  uint32_t tmp[HL_BLOCK];
  for (uint64_t b = lo; b < hi; ++b) {
    const uint64_t start = b * HL_BLOCK, at = start - lo * HL_BLOCK;
    const bool full = start + HL_BLOCK <= n;
    unpack_one(payload + off, widths[b], full ? v + at : tmp, wide);
    if (!full)
      for (uint64_t i = start; i < n; ++i) v[at + i - start] = tmp[i - start];
    off += 4u * widths[b];
  }
}

// Thread t of nt takes blocks [lo, hi) and finds its payload offset by summing the widths
// before lo.
void split_blocks(const uint8_t* widths, uint64_t nb, int t, int nt, uint64_t* lo, uint64_t* hi,
                  uint64_t* off) {
  *lo = nb * t / nt;
  *hi = nb * (t + 1) / nt;
  uint64_t s = 0;
  for (uint64_t b = 0; b < *lo; ++b) s += widths[b];
  *off = 4 * s;
}

}  // namespace

void unpack_blocks(const uint8_t* in, uint64_t len, uint64_t n, uint32_t max_width, uint32_t* v,
                   const char* what, int threads) {
  const uint8_t* payload = check_blocks(in, len, n, max_width, what);
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  const int wide = simd();
  if (threads <= 1 || nb <= 4096) {
    unpack_range(in, payload, n, 0, nb, 0, v, wide);
    return;
  }
  omp_threads(threads, [&](int part, int parts) {
    uint64_t lo, hi, off;
    split_blocks(in, nb, part, parts, &lo, &hi, &off);
    unpack_range(in, payload, n, lo, hi, off, v + lo * HL_BLOCK, wide);
  });
}

void unpack_blocks_to(const uint8_t* in, uint64_t len, uint64_t n, uint32_t max_width,
                      const char* what, int threads, ChunkSink sink) {
  const uint8_t* payload = check_blocks(in, len, n, max_width, what);
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  const int wide = simd();
  constexpr uint64_t kChunkBlocks = 64;  // 8 KiB of codes: stays in L1 for the sink
  const int nt = threads > 1 && nb > 4096 ? threads : 1;
  auto run = [&](int t, int nt_) {
    uint64_t lo, hi, off;
    split_blocks(in, nb, t, nt_, &lo, &hi, &off);
    uint32_t chunk[kChunkBlocks * HL_BLOCK];
    for (uint64_t b = lo; b < hi; b += kChunkBlocks) {
      const uint64_t e = b + kChunkBlocks < hi ? b + kChunkBlocks : hi;
      unpack_range(in, payload, n, b, e, off, chunk, wide);
      const uint64_t first = b * HL_BLOCK;
      const uint64_t last = e * HL_BLOCK < n ? e * HL_BLOCK : n;
      sink.fn(sink.ctx, first, chunk, last - first);
      for (uint64_t k = b; k < e; ++k) off += 4u * in[k];
    }
  };
  omp_threads(nt, run);
}

}  // namespace hl
