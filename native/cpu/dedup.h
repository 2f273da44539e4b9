// The row numbering of duplicate removal (dedup.cc and quantize.cc's second pass): rows
// numbered by first occurrence of their content in an open-addressing table of hashes, and the
// one test of a repeat that every numbering shares (rows_equal).
#pragma once

#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "scratch.h"

namespace hl {
namespace enc {

// Numbers rows by first occurrence of their content: map[r] = unique index,
// first[u] = first row holding unique u. same(a, b) decides equality of rows with equal hashes
// (hashes[] is indexed by row and must be filled up to the row added). The table starts small
// (or at a size for `expected` unique rows) and doubles, so data with few distinct rows (hot
// lookups) probes a table that stays in cache. A slot holds the first row of its unique row
// (rows fit 32 bits: dedup_applies), not the unique index: the row to compare against comes
// straight from the slot, and its unique index from map[] of that row, which is read only on a
// match, where the row is read anyway; an index would cost one more random read (first[u])
// before the row could even be fetched.
class Numbering {
 public:
  explicit Numbering(const uint64_t* hashes, uint64_t expected = 0) : hashes_(hashes) {
    uint64_t cap = 1024;
    while (cap < 2 * expected) cap *= 2;
    resize(cap);
    first.reserve(expected);
  }

  template <class Same>
  void add(uint64_t r, Same same, uint32_t* map) {
    const uint64_t h = hashes_[r];
    uint64_t s = h & (cap_ - 1);
    for (;;) {
      const uint64_t e = slots_[s];
      if (e == kEmpty) {
        map[r] = (uint32_t)first.size();
        slots_[s] = (h & kTag) | r;
        first.push_back(r);
        if (2 * first.size() > cap_) grow();  // keep the load under one half
        return;
      }
      const uint64_t f = e & ~kTag;
      if ((e & kTag) == (h & kTag) && same(f, r)) {
        map[r] = map[f];
        return;
      }
      s = (s + 1) & (cap_ - 1);
    }
  }

  // add(r) for every row of [lo, hi), a block at a time in two sweeps, as the code table of
  // quantize.cc: first every row's candidate (the first row of the unique row add() would most
  // likely find), read branch-free from the first two slots of its probe so that the misses of
  // many rows overlap, and its row and map entry prefetched; then each row confirmed against
  // its candidate, or added the slow way (new rows, rows whose first occurrence is in the same
  // block, tag collisions). One row at a time, a row's probe ended on a branch that waited for
  // its slot, and that branch (new or repeat) is a coin toss: a mispredict exposed the miss
  // that prefetches a fixed distance ahead had not yet brought in (numbering 524,288 rows of
  // d32 by id, 55% distinct: 22 against 17 ms). A candidate stays right whatever the rows
  // between add to the table, and through a grow too: it is a row, not a slot, and each unique
  // row has one slot.
  template <class Same, class Row>
  void add_range(uint64_t lo, uint64_t hi, Same same, Row row, uint32_t* map) {
    uint64_t cand[kBlock];
    for (uint64_t b0 = lo; b0 < hi; b0 += kBlock) {
      const uint64_t nb = hi - b0 < kBlock ? hi - b0 : kBlock;
      for (uint64_t i = 0; i < nb; ++i) {
        if (i + kSlotAhead < nb)
          __builtin_prefetch(&slots_[hashes_[b0 + i + kSlotAhead] & (cap_ - 1)]);
        const uint64_t c = candidate(hashes_[b0 + i]);
        cand[i] = c;
        const uint64_t at = c == kNone ? b0 : c;  // no branch: a row without one fetches its own
        row(at);
        __builtin_prefetch(&map[at]);
      }
      for (uint64_t i = 0; i < nb; ++i) {
        const uint64_t r = b0 + i, c = cand[i];
        if (c != kNone && same(c, r))
          map[r] = map[c];
        else
          add(r, same, map);
      }
    }
  }

  // Row r as a unique row whose repeats the caller settles itself (zero rows): numbered in
  // order with the others but not put in the table, so no row is compared with it (a grow puts
  // it in; a row it then proposes is still confirmed by its bits).
  uint32_t add_apart(uint64_t r, uint32_t* map) {
    map[r] = (uint32_t)first.size();
    first.push_back(r);
    if (2 * first.size() > cap_) grow();
    return map[r];
  }

  std::vector<uint64_t> first;

 private:
  static constexpr uint64_t kBlock = 1024, kSlotAhead = 16;
  static constexpr uint64_t kEmpty = ~0ull, kTag = 0xffffffff00000000ull, kNone = ~0ull;

  // The first row of the first slot along h's probe, of the first two, whose tag is h's, or
  // kNone (past them too: add() decides). Selected with masks, not branches: a compiler's branch
  // on a slot waits for its miss, and mispredicted, makes the next rows' wait too.
  uint64_t candidate(uint64_t h) const {
    const uint64_t s = h & (cap_ - 1);
    const uint64_t e0 = slots_[s], e1 = slots_[(s + 1) & (cap_ - 1)];
    const bool full0 = e0 != kEmpty, full1 = e1 != kEmpty;
    const bool hit0 = full0 & (((e0 ^ h) & kTag) == 0);
    const bool hit1 = full0 & full1 & (((e1 ^ h) & kTag) == 0);
    uint64_t c = kNone;
    c ^= ((e1 & ~kTag) ^ c) & (0 - (uint64_t)hit1);
    c ^= ((e0 & ~kTag) ^ c) & (0 - (uint64_t)hit0);
    return c;
  }

  void resize(uint64_t cap) {
    cap_ = cap;
    slots_ = Buffer<uint64_t>(cap);
    std::fill(slots_.data(), slots_.data() + cap, kEmpty);
  }

  void grow() {
    resize(2 * cap_);
    const uint64_t mask = cap_ - 1;
    for (uint64_t f : first) {  // rows in increasing order: their hashes are read in order
      const uint64_t hv = hashes_[f];
      uint64_t t = hv & mask;
      while (slots_[t] != kEmpty) t = (t + 1) & mask;
      slots_[t] = (hv & kTag) | f;
    }
  }

  const uint64_t* hashes_;
  Buffer<uint64_t> slots_;  // (hash high 32 bits) | first row of a unique row
  uint64_t cap_ = 0;
};

// Whether `bytes` bytes at a and b are equal: the one test that makes a row a repeat, whichever
// table proposed it (content hash, id or code). Rows up to 128 bytes 16 bytes at a time and one
// branch (a proposed row almost always is a repeat: its hash's tag matched); a tail under 16
// bytes is the last 16 again, overlapping. perf put 5.6% of a d32 compress in calls of memcmp
// for the tail, mostly empty. Longer rows (raw float32 rows of d > 32) go to memcmp, as they
// did before this function: its wider loads suit them, though a reused d128 call, whose
// references are 512 bytes each, timed the same either way.
inline bool rows_equal(const void* a, const void* b, uint64_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(a);
  const uint8_t* q = static_cast<const uint8_t*>(b);
#if defined(__SSE2__)
  if (bytes < 16 || bytes > 128) return memcmp(p, q, bytes) == 0;
  auto eq16 = [&](uint64_t i) {
    return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
  };
  __m128i eq = eq16(0);
  for (uint64_t i = 16; i + 16 <= bytes; i += 16) eq = _mm_and_si128(eq, eq16(i));
  if (bytes % 16) eq = _mm_and_si128(eq, eq16(bytes - 16));
  return _mm_movemask_epi8(eq) == 0xffff;
#else
  return memcmp(p, q, bytes) == 0;
#endif
}

// Prefetches the start of a row that is about to be compared (or quantized): its first 1 KiB,
// enough for the hardware prefetcher to carry on through longer rows.
inline void prefetch_row(const void* p, uint64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const uint64_t n = bytes < 1024 ? bytes : 1024;
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(c + off, 0, 2);
}

template <class Same, class Row>
uint64_t number_rows(uint64_t rows, const uint64_t* hashes, Same same, Row row, uint32_t* map,
                     std::vector<uint64_t>* first) {
  Numbering num(hashes, rows);  // at most `rows` unique: no doubling on the way
  num.add_range(0, rows, same, row, map);
  *first = std::move(num.first);
  return first->size();
}

}  // namespace enc
}  // namespace hl
