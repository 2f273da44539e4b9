// Radix-packed level-1 code sections on the host (frame.h "Radix section"): the encoder's plan
// and writer, and a decoder that unpacks the values and splits their digits a chunk at a time
// (through unpack_blocks_to), so no array of all codes is made. The rule for g and the division
// by K are in frame_fields.h, shared with the CUDA decoder.
#pragma once

#include <stdint.h>

#include "frame_fields.h"
#include "pack.h"
#include "scratch.h"

namespace hl {

struct RadixPlan {
  uint32_t k = 0, g = 0;  // k = 0: radix packing does not apply or does not pay
  uint64_t n_values = 0;  // G = ceil(n / g)
  // From the scratch pool: fresh megabytes a call were faulted in page by page every time.
  Buffer<uint32_t> values;
  Buffer<uint8_t> widths;  // block widths of the values
  uint64_t head_bytes = 0;            // mark, K and g
  uint64_t bytes = 0;                 // the whole section
};

// The radix section of the n codes at v, the largest of which is max_code, when it is smaller
// than below_bytes (their block packing); a plan with k = 0 otherwise. code_widths: the codes'
// block widths (HL_BLOCK codes a block), when known; they only save time.
RadixPlan radix_plan(const uint32_t* v, uint64_t n, uint32_t max_code, uint64_t below_bytes,
                     int threads, const uint8_t* code_widths = nullptr);
// The same of codes held as bytes.
RadixPlan radix_plan(const uint8_t* v, uint64_t n, uint32_t max_code, uint64_t below_bytes,
                     int threads, const uint8_t* code_widths = nullptr);

// Writes a plan's section (k != 0): plan.bytes bytes at out.
void radix_write(const RadixPlan& p, uint8_t* out, int threads);

// Decodes the block-packed values of a radix section ([in, in + len), after its head) of n
// codes with radix k and group g (get_radix_head), handing runs of consecutive codes to sink
// (sink(index of the run's first code, codes, count), from several threads when threaded).
// FrameError, naming `what`, for a malformed block section, a value >= K^g or a nonzero
// padding digit; the sink never sees an index at or past n.
void radix_unpack_to(const uint8_t* in, uint64_t len, uint64_t n, uint32_t k, uint32_t g,
                     const char* what, int threads, ChunkSink sink);

// What a reader of a radix section of n codes with radix k and group g works from: G groups,
// each value below span (K^g). radix_layout checks them first: FrameError, naming `what`, where
// they cannot describe a section.
struct RadixLayout {
  uint64_t n, G, span;
  uint32_t g;
  RadixDiv div;
  int simd;  // cpu::simd_level()
  const char* what;

  // FrameError where the reader met a value at or past span or a nonzero digit past the n
  // codes (`bad`).
  void check(bool bad) const;
};
RadixLayout radix_layout(uint32_t k, uint32_t g, uint64_t n, const char* what);

}  // namespace hl

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace hl {

// radix_div (frame_fields.h) of eight lanes with AVX2: the encoder's split and the decoder's
// digit lookup divide by K the same way.
__attribute__((target("avx2"), always_inline)) inline __m256i radix_div8(__m256i v,
                                                                         RadixDiv div) {
  const __m256i lo = _mm256_set1_epi64x(div.lo);
  const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(v, lo), 32);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(v, 32), lo);
  const __m256i t = _mm256_blend_epi32(even, odd, 0xAA);
  return _mm256_srl_epi32(_mm256_add_epi32(_mm256_srli_epi32(_mm256_sub_epi32(v, t), 1), t),
                          _mm_cvtsi32_si128((int)div.shift));
}

// The same of sixteen lanes with AVX-512F: t = v * lo >> 32 from two even-lane multiplies (even
// lanes, and odd lanes shifted down) merged by a blend, then ((v - t) >> 1 + t) >> shift.
__attribute__((target("avx512f,avx2"), always_inline)) inline __m512i radix_div16(__m512i v,
                                                                                RadixDiv div) {
  const __m512i lo = _mm512_set1_epi64(div.lo);
  const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(v, lo), 32);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(v, 32), lo);
  const __m512i t = _mm512_mask_blend_epi32((__mmask16)0xAAAA, even, odd);
  return _mm512_srl_epi32(_mm512_add_epi32(_mm512_srli_epi32(_mm512_sub_epi32(v, t), 1), t),
                          _mm_cvtsi32_si128((int)div.shift));
}

}  // namespace hl
#endif
