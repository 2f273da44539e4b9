// Short-block sections on the host (short_blocks.h): the decoder, chosen at load time
// (cpu::simd_level). A pair of blocks (32 codes) decodes as block packing decodes a block of 32,
// one instruction a plane (AVX-512; AVX2 for codes over 8 bits), all eight planes at once
// through a bit transpose (AVX2, codes of up to 8 bits), or a block of 16 at a time (the portable
// loops); codes go to the caller's sink a chunk at a time. The encoder is short_blocks.cc.
#include <string>

#include "pack.h"
#include "short_blocks_internal.h"

namespace hl {
namespace {

using namespace short_blocks;

#ifdef HL_SHORT_SIMD
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

inline __m128i loadu128(const void* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// A pair of codes of up to 8 bits (the usual case), all eight planes of each block at once, as
// the writer writes them (short_blocks.cc): each block's plane words (those past its width
// masked off), one shuffle a 128-bit lane making byte c of each 64-bit lane plane c of eight
// codes, then the 8x8 bit transpose turning those into the codes' bytes. No loop on the width,
// whose trip count changes from pair to pair.
HL_AVX2 inline void decode_byte_pair_avx2(const uint8_t* a, uint32_t wa, uint32_t wb,
                                          uint32_t* out) {
  const __m128i pa = _mm_and_si128(loadu128(a), loadu128(ones16 + 16 - wa));
  const __m128i pb = _mm_and_si128(loadu128(a + 2 * wa), loadu128(ones16 + 16 - wb));
  // word c of a block: plane c of its codes 0-7 (low byte) and 8-15 (high byte)
  const __m256i planes = _mm256_shuffle_epi8(
      _mm256_inserti128_si256(_mm256_castsi128_si256(pa), pb, 1),
      _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                       0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  store_bytes_u32_avx2(transpose_bits8x8_avx2(planes), out);  // plane c's bit r: code r's bit c
}

// Pairs from *p to hi while the section has room for whole-vector loads (the loop inside the
// target function, as the writer's): *p and *off advance past the pairs decoded.
HL_AVX2 uint32_t* decode_pairs_avx2(const uint8_t* nibbles, const uint8_t* payload,
                                    uint64_t payload_len, uint64_t* p, uint64_t hi, uint64_t* off,
                                    uint32_t* out) {
  uint64_t q = *p, at = *off;
  alignas(32) uint32_t words[16];
  for (; q < hi; ++q, out += kPair) {
    const uint32_t wa = nibbles[q] & 0xf, wb = nibbles[q] >> 4, wm = wa > wb ? wa : wb;
    if (at + 2 * (wa + wb) + 32 > payload_len) break;
    if (wm <= 8) {
      decode_byte_pair_avx2(payload + at, wa, wb, out);
    } else {
      pair_words_avx2(payload + at, wa, wb, words);
      unpack_block32(reinterpret_cast<const uint8_t*>(words), wm, out);
    }
    at += 2u * (wa + wb);
  }
  *p = q;
  *off = at;
  return out;
}
#endif

// The portable loops, a block of 16 at a time, through pack.h's spread tables.

void decode_block16(const uint8_t* p, uint32_t w, uint32_t* out) {
  if (w <= 8) {
    uint64_t l0 = 0, l1 = 0;
    for (uint32_t j = 0; j < w; ++j) {
      const uint32_t plane = load_u16(p + 2 * j);
      l0 |= kSpread8.t[plane & 0xff] << j;
      l1 |= kSpread8.t[plane >> 8] << j;
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
    for (int k = 0; k < 4; ++k) l[k] |= kSpread16.t[(plane >> (4 * k)) & 0xf] << j;
  }
  for (int i = 0; i < 16; ++i) out[i] = (uint32_t)(l[i / 4] >> (16 * (i % 4))) & 0xffff;
}

// Pairs [lo, hi) of a checked section (its payload: payload_len bytes) into out.
void decode_pairs(const uint8_t* nibbles, const uint8_t* payload, uint64_t payload_len,
                  uint64_t lo, uint64_t hi, uint64_t* off, uint32_t* out, int simd) {
#ifdef HL_SHORT_SIMD
  if (simd >= 2) return decode_pairs_avx512(nibbles, payload, lo, hi, off, out);
#endif
#ifdef HL_SHORT_SIMD
  if (simd == 1) out = decode_pairs_avx2(nibbles, payload, payload_len, &lo, hi, off, out);
#endif
  uint64_t at = *off;
  for (uint64_t p = lo; p < hi; ++p, out += kPair) {  // the portable loops, and the last pairs
    const uint32_t wa = nibbles[p] & 0xf, wb = nibbles[p] >> 4;
    decode_block16(payload + at, wa, out);
    decode_block16(payload + at + 2 * wa, wb, out + HL_SHORT_BLOCK);
    at += 2u * (wa + wb);
  }
  (void)simd;
  (void)payload_len;
  *off = at;
}

}  // namespace

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
  omp_threads(pairs <= kSerialPairs ? 1 : threads, run);
}

}  // namespace hl
