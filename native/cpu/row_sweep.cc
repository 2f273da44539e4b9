// The row sweep's checks and copies (row_sweep.h).
#include "row_sweep.h"

#include "kernels_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#define HL_SWEEP_AVX2 1
#endif

namespace hl {

void check_row_map(const uint32_t* map, uint64_t rows, uint64_t n_unique, uint8_t* repeated) {
  if (repeated) memset(repeated, 0, n_unique);
  uint64_t next = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint32_t v = map[r];
    if (v > next || v >= n_unique)
      throw FrameError("frame is corrupted: row map entry " + std::to_string(r) + " is " +
                       std::to_string(v) + ", expected at most " + std::to_string(next));
    // Without branches: whether a row is a first occurrence is a coin flip in real lookups.
    const bool first = v == next;
    if (repeated) repeated[v] |= (uint8_t)!first;
    next += first;
  }
  if (next != n_unique)
    throw FrameError("frame is corrupted: row map uses " + std::to_string(next) + " of " +
                     std::to_string(n_unique) + " unique rows");
}

void check_outliers(const SegmentView& h, uint64_t n, int raw_bytes) {
  uint64_t prev = 0;
  for (uint64_t k = 0; k < h.n_outliers; ++k) {
    uint64_t pos;
    uint32_t raw;
    read_outlier(h, raw_bytes, k, &pos, &raw);
    if (pos >= n || (k > 0 && pos <= prev) || (raw_bytes == 2 && raw > 0xffffu))
      throw FrameError("frame is corrupted: outlier " + std::to_string(k) + " at position " +
                       std::to_string(pos) + " is out of order or out of range (" +
                       std::to_string(n) + " elements)");
    prev = pos;
  }
}

namespace {

// Rows ahead whose source is prefetched: a repeat's source is a random read.
constexpr uint64_t kAhead = 24;

// a if pick else b, as a mask rather than a branch (compilers turn the ternary into one): whether
// a row is a repeat is a coin flip in real lookups, and a mispredicted branch a row cost as
// much as copying it.
inline uintptr_t pick(bool c, uintptr_t a, uintptr_t b) {
  const uintptr_t m = (uintptr_t)0 - (uintptr_t)c;
  return (a & m) | (b & ~m);
}

// Where unique row v is: in the stage when it is at least done, else kept at its slot.
inline const uint8_t* source(const SweepRows& s, uint32_t v, uint64_t done) {
  const uintptr_t stage0 = (uintptr_t)s.stage - done * s.row_bytes;  // unique row 0's place
  const bool staged = v >= done;
  return reinterpret_cast<const uint8_t*>(pick(staged, stage0, (uintptr_t)s.kept) +
                                          pick(staged, v, s.slot[v]) * s.row_bytes);
}

// What to prefetch for row r + kAhead: its source when it repeats an earlier chunk's row, else
// the stage (in L1 anyway: a prefetch of a kept row that is never written is a memory read
// for nothing).
inline const uint8_t* ahead(const SweepRows& s, uint64_t r, uint64_t done) {
  // slot[] (a word a unique row: past L2 at d16) of the row twice as far on, so that this row's
  // address does not wait on it (with the 64-byte copies, d16 decode into 1.14-1.20x faster:
  // benchmarks/RESULTS.md)
  __builtin_prefetch(&s.slot[s.map[r + 2 * kAhead < s.rows ? r + 2 * kAhead : s.rows - 1]]);
  const uint32_t v = s.map[r + kAhead < s.rows ? r + kAhead : s.rows - 1];
  return reinterpret_cast<const uint8_t*>(
      pick(v < done, (uintptr_t)s.kept + (uint64_t)s.slot[v] * s.row_bytes, (uintptr_t)s.stage));
}

uint64_t sweep_rows_portable(const SweepRows& sweep, uint64_t r, uint64_t done, uint64_t end) {
  const SweepRows s = sweep;  // a local copy: the stores below could alias its fields
  const uint64_t b = s.row_bytes;
  for (; r < s.rows && s.map[r] < end; ++r) {
    const uint8_t* p = ahead(s, r, done);
    for (uint64_t k = 0; k < b && k < 1024; k += 64) __builtin_prefetch(p + k);
    memcpy(s.out + r * b, source(s, s.map[r], done), b);
  }
  return r;
}

#ifdef HL_SWEEP_AVX2
// Rows of B bytes (a multiple of 32; B = 0: s.row_bytes) with 32-byte moves, streamed into a
// 32-byte aligned output when Stream.
template <uint64_t B, bool Stream>
__attribute__((target("avx2"))) uint64_t sweep_rows_avx2(const SweepRows& sweep, uint64_t r,
                                                         uint64_t done, uint64_t end) {
  const SweepRows s = sweep;  // a local copy: the stores below could alias its fields
  const uint64_t b = B ? B : s.row_bytes;
  for (; r < s.rows && s.map[r] < end; ++r) {
    const uint8_t* p = ahead(s, r, done);
    for (uint64_t k = 0; k < b && k < 1024; k += 64) __builtin_prefetch(p + k);
    const __m256i* from = reinterpret_cast<const __m256i*>(source(s, s.map[r], done));
    __m256i* to = reinterpret_cast<__m256i*>(s.out + r * b);
    for (uint64_t k = 0; k < b / 32; ++k) {
      const __m256i x = _mm256_loadu_si256(from + k);
      if (Stream)
        _mm256_stream_si256(to + k, x);
      else
        _mm256_storeu_si256(to + k, x);
    }
  }
  return r;
}

template <bool Stream>
uint64_t sweep_rows_avx2_by_size(const SweepRows& s, uint64_t r, uint64_t done, uint64_t end) {
  switch (s.row_bytes) {  // the usual rows at a fixed size: their copies unrolled
    case 64: return sweep_rows_avx2<64, Stream>(s, r, done, end);
    case 128: return sweep_rows_avx2<128, Stream>(s, r, done, end);
    case 512: return sweep_rows_avx2<512, Stream>(s, r, done, end);
    default: return sweep_rows_avx2<0, Stream>(s, r, done, end);
  }
}
#endif

}  // namespace

uint64_t sweep_rows(const SweepRows& s, uint64_t first, uint64_t done, uint64_t end) {
#ifdef HL_SWEEP_AVX2
  if (cpu::simd_level() >= 1 && s.row_bytes % 32 == 0) {
    if (s.stream && (uintptr_t)s.out % 32 == 0)
      return sweep_rows_avx2_by_size<true>(s, first, done, end);
    return sweep_rows_avx2_by_size<false>(s, first, done, end);
  }
#endif
  return sweep_rows_portable(s, first, done, end);
}

void sweep_fence() {
#ifdef HL_SWEEP_AVX2
  _mm_sfence();
#endif
}

}  // namespace hl
