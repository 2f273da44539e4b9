// The SIMD variants of kernels_cpu.h's float32 (AVX2) and float32/16-bit (AVX-512) kernels, which
// kernels_cpu.cc dispatches to by simd_level(). Every operation is the IEEE one the portable
// code (kernels_scalar.h) performs, so each variant writes the same bits; tests/test_codec.py
// compares the three paths' frames. Internal to native/cpu.
#pragma once

#include <stdint.h>

#include "kernels_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#define HL_HAVE_AVX2_PATH 1
// Declarations carry their definitions' target so that GCC sees one function, not versions.
// FMA comes with AVX2 on every x86 CPU that has it (simd_level checks both); with
// -ffp-contract=off only the fused operations written out (quantize_f32_fast.h) use it.
#define HL_AVX2 __attribute__((target("avx2,fma")))
#define HL_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2")))
#define HL_AVX512_F16 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,f16c")))

namespace hl {
namespace cpu {

// AVX2, float32 (kernels_avx2.cc).
HL_AVX2 void range_f32_avx2(const float* x, uint64_t n, double* lo_out, double* hi_out);
HL_AVX2 void quantize_f32_avx2(const float* xs, const uint64_t* idx, uint64_t rows, uint64_t d,
                               const QuantParams& qp, uint32_t* codes, uint8_t* row_outlier,
                               uint64_t* hashes);
HL_AVX2 void quantize_narrow_f32_avx2(const float* xs, const uint64_t* idx, uint64_t rows,
                                      uint64_t d, const QuantParams& qp, uint32_t* codes,
                                      uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                                      uint8_t* bytes);
HL_AVX2 void dequantize_f32_avx2(const uint32_t* z, uint64_t n, double step, float* out);
HL_AVX2 void dequantize_dithered_f32_avx2(const uint32_t* z, uint64_t n, double step,
                                          uint32_t seed, uint64_t first, float* out);
HL_AVX2 int coded_row_f32_avx2(const float* x, const float* p, uint64_t d,
                               const QuantParams& qp, double eb, float* r, float* xh,
                               bool* same, bool* as_held);
// Copies whole 32-byte blocks with streaming stores; dst must be 32-byte aligned. Not fenced.
HL_AVX2 void stream_copy_avx2(uint8_t* dst, const uint8_t* src, uint64_t bytes);

// AVX-512, float32, float16 and bfloat16 (kernels_avx512.cc).
HL_AVX512_F16 void range_avx512(uint8_t dtype, const void* x, uint64_t n, double* lo_out,
                                double* hi_out);
// float16 and bfloat16 only (float32 quantizes with the AVX2 kernels at every level).
HL_AVX512_F16 void quantize_avx512(uint8_t dtype, const void* x, const uint64_t* idx,
                                   uint64_t rows, uint64_t d, const QuantParams& qp,
                                   uint32_t* codes, uint8_t* row_outlier, uint64_t* hashes);
HL_AVX512_F16 void dequantize_avx512(uint8_t dtype, const uint32_t* z, uint64_t n, double step,
                                     bool dithered, uint32_t seed, uint64_t first, void* out);
// Copies whole 64-byte lines with streaming stores; dst must be 64-byte aligned. Not fenced.
HL_AVX512 void stream_copy_avx512(uint8_t* dst, const uint8_t* src, uint64_t bytes);

// hl::dither_unit's 24 hashed bits of eight consecutive elements (low index half lo, lo + 7
// below 2^32), eight 32-bit lanes at once; the AVX2 and AVX-512 generators share it.
// dither_mix8 takes the lanes' low index halves already xor'ed with the inner hash.
__attribute__((target("avx2"))) inline __m256i dither_mix8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return _mm256_srli_epi32(h, 8);
}
__attribute__((target("avx2"))) inline __m256i dither_bits8(uint32_t lo, uint32_t inner) {
  return dither_mix8(_mm256_xor_si256(
      _mm256_add_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
      _mm256_set1_epi32((int)inner)));
}

}  // namespace cpu
}  // namespace hl
#endif
