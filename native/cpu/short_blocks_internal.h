// What the short-block encoder (short_blocks.cc) and decoder (short_blocks_decode.cc) share:
// the kernel targets, a pair of blocks, 16-bit plane words, how threads split the pairs.
#pragma once

#include <stdint.h>
#include <string.h>

#include "frame_fields.h"
#include "kernels_cpu.h"
#include "level1_sections.h"
#include "pack_avx2.h"
#include "short_blocks.h"

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
namespace short_blocks {

constexpr uint64_t kPair = 2 * HL_SHORT_BLOCK;  // codes of a pair: one block of block packing
static_assert(kPair == HL_BLOCK, "a pair of short blocks is one block of block packing");

// Entering an OpenMP region costs about as much as a few thousand blocks (pack.cc).
constexpr uint64_t kSerialPairs = 4096;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
inline void store_u16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }

// Thread t of nt takes pairs [lo, hi) of `pairs`.
inline void split_pairs(uint64_t pairs, int t, int nt, uint64_t* lo, uint64_t* hi) {
  *lo = pairs * t / nt;
  *hi = pairs * (t + 1) / nt;
}

}  // namespace short_blocks
}  // namespace hl
