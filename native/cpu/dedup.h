// The row numbering of duplicate removal (dedup.cc and quantize.cc's second pass): rows
// numbered by first occurrence of their content in an open-addressing table of hashes.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <vector>

#include "scratch.h"

namespace hl {
namespace enc {

// Numbers rows by first occurrence of their content, one row at a time: map[r] = unique index,
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

  // The probes of add(r) miss the cache: the table outgrows L1 and a repeated row's first
  // occurrence lies anywhere in the tensor. Numbering calls these some rows ahead of add():
  // prefetch_slot(r) brings row r's home slot in; prefetch_candidate(r, row) then reads that
  // slot and, when its tag matches, prefetches the row add(r) will compare against and its map
  // entry. Hints only: the table may change in between, and add() decides on the real contents.
  void prefetch_slot(uint64_t r) const { __builtin_prefetch(&slots_[hashes_[r] & (cap_ - 1)]); }

  template <class Row>
  void prefetch_candidate(uint64_t r, Row row, const uint32_t* map) const {
    const uint64_t h = hashes_[r];
    // A third or more of the home slots hold another row at this load: follow the probe a few
    // slots (mostly the same cache line) as add() will.
    for (uint64_t k = 0, s = h & (cap_ - 1); k < kProbeAhead; ++k, s = (s + 1) & (cap_ - 1)) {
      const uint64_t e = slots_[s];
      if (e == kEmpty) return;
      if ((e & kTag) == (h & kTag)) {
        row(e & ~kTag);
        __builtin_prefetch(&map[e & ~kTag]);
        return;
      }
    }
  }

  // add(r) for every row of [lo, hi), with the prefetches above kSlotAhead and kRowAhead rows
  // ahead.
  template <class Same, class Row>
  void add_range(uint64_t lo, uint64_t hi, Same same, Row row, uint32_t* map) {
    for (uint64_t r = lo; r < hi; ++r) {
      if (r + kSlotAhead < hi) prefetch_slot(r + kSlotAhead);
      if (r + kRowAhead < hi) prefetch_candidate(r + kRowAhead, row, map);
      add(r, same, map);
    }
  }

  std::vector<uint64_t> first;

 private:
  static constexpr uint64_t kSlotAhead = 24, kRowAhead = 12, kProbeAhead = 4;
  static constexpr uint64_t kEmpty = ~0ull, kTag = 0xffffffff00000000ull;

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
