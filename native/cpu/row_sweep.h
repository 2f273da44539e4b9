// The CPU decoder's one sweep over a deduplicated segment's output rows (decode.cc): unique rows
// arrive a chunk of codes at a time in their order, and each is written straight into its first
// occurrence, followed at once by the repeats that come before the next unique row's first
// occurrence. Only unique rows that occur again are also kept (in scratch indexed by unique
// row), for their repeats. The output is written once, front to back.
//
// Decoding every unique row into an array and then copying each output row from it wrote and
// read that array (a third to a half of the output) through memory; most unique rows of real
// lookups occur once (a fifth repeat in the realistic sets), and those that repeat fit in the
// caches when kept side by side: numbered among themselves, they are written front to back and
// read from a fifth of the memory that indexing them by unique row spread them over. Writing
// each unique row into its first occurrence and copying repeats from the output
// (benchmarks/HISTORY.md) lost: the repeats read back from the 4 KiB-paged output, scattered.
#pragma once

#include <stdint.h>
#include <string.h>

#include <string>

#include "errors.h"
#include "frame_io.h"
#include "scratch.h"

namespace hl {

// Checks a decoded row map of `rows` entries against n_unique unique rows: unique rows are
// numbered by first occurrence, so entry r is at most the count of unique rows before it, and
// every unique row occurs. With repeated (n_unique bytes), marks the unique rows that occur
// more than once (1) and the others (0). Throws FrameError naming the first bad entry.
void check_row_map(const uint32_t* map, uint64_t rows, uint64_t n_unique, uint8_t* repeated);

// Checks a segment's outlier records (increasing positions below n, values that fit the
// dtype: raw_bytes of them); FrameError naming the first bad one.
void check_outliers(const SegmentView& h, uint64_t n, int raw_bytes);

// An outlier record's position and raw bits.
inline void read_outlier(const SegmentView& h, int raw_bytes, uint64_t k, uint64_t* pos,
                         uint32_t* raw) {
  const uint64_t rec = h.pos_bytes + (uint64_t)raw_bytes;
  *pos = 0;
  *raw = 0;
  memcpy(pos, h.outliers + rec * k, h.pos_bytes);  // little-endian: the low bytes
  memcpy(raw, h.outliers + rec * k + h.pos_bytes, raw_bytes);
}

// Where a sweep's rows come from and go.
struct SweepRows {
  uint8_t* out;
  const uint8_t* stage;
  const uint8_t* kept;   // unique row u at slot[u] * row_bytes: those that repeat, once written
  const uint32_t* slot;  // of each unique row, the repeating unique rows before it
  const uint32_t* map;   // checked by check_row_map
  uint64_t rows, row_bytes;
  bool stream;  // write out with streaming stores (cpu::kStreamFrom)
};
// The rows a chunk of unique rows completes: rows r from `first` on, while map[r] < end, each a
// copy of unique row map[r], found in the stage when it is at least `done` (the stage's row k is
// unique row done + k) and in kept otherwise. Returns the first row not written.
uint64_t sweep_rows(const SweepRows& s, uint64_t first, uint64_t done, uint64_t end);

// Ends a sweep that streamed: non-temporal stores are weakly ordered, so they are made visible
// before anyone reads the output.
void sweep_fence();

template <typename raw_t>
class RowSweep {
 public:
  // Elements the caller may decode into stage() at once.
  static constexpr uint64_t kStage = 4096;

  // out: rows x d elements; map: checked by check_row_map, which filled repeated. stream: the
  // call's output is at least cpu::kStreamFrom bytes: it is written with streaming stores,
  // which also keep it from evicting the rows kept for repeats.
  RowSweep(const SegmentView& h, raw_t* out, const uint32_t* map, const uint8_t* repeated,
           bool stream)
      : h_(h), repeated_(repeated), d_(h.row_len), slot_(h.n_unique), stage_(kStage + h.row_len) {
    uint32_t kept = 0;
    for (uint64_t u = 0; u < h.n_unique; ++u) {
      slot_[u] = kept;
      kept += repeated[u];
    }
    kept_ = Buffer<raw_t>((uint64_t)kept * d_);
    rows_.out = reinterpret_cast<uint8_t*>(out);
    rows_.kept = reinterpret_cast<const uint8_t*>(kept_.data());
    rows_.slot = slot_.data();
    rows_.map = map;
    rows_.rows = h.n_rows;
    rows_.row_bytes = d_ * sizeof(raw_t);
    rows_.stream = stream;
  }

  // Where the next count (<= kStage) elements of the unique rows go before commit(count).
  raw_t* stage() { return stage_.data() + held_; }

  // The next count elements of the unique rows (one row after another) are in stage(): the
  // rows they complete are written out, with the repeats that follow each.
  void commit(uint64_t count) {
    raw_t* s = stage_.data();
    const uint64_t first = done_ * d_, end = first + held_ + count;  // elements in the stage
    for (uint64_t pos; outlier_ < h_.n_outliers; ++outlier_) {
      uint32_t raw;
      read_outlier(h_, sizeof(raw_t), outlier_, &pos, &raw);
      if (pos >= end) break;
      s[pos - first] = (raw_t)raw;
    }
    const uint64_t rows = (held_ + count) / d_;
    // Those that repeat are kept for their later repeats; then the output rows they complete.
    const size_t bytes = d_ * sizeof(raw_t);
    for (uint64_t k = 0; k < rows; ++k)
      if (repeated_[done_ + k]) memcpy(kept_.data() + slot_[done_ + k] * d_, s + k * d_, bytes);
    rows_.stage = reinterpret_cast<const uint8_t*>(s);
    cursor_ = sweep_rows(rows_, cursor_, done_, done_ + rows);
    done_ += rows;
    held_ = held_ + count - rows * d_;  // a row begun: to the front, finished by the next call
    if (rows && held_) memmove(s, s + rows * d_, held_ * sizeof(raw_t));
  }

  // Every row written: the codes covered every unique row.
  void finish() const {
    if (rows_.stream) sweep_fence();
    if (cursor_ != rows_.rows || held_ != 0)
      throw CodecError("row sweep ended at row " + std::to_string(cursor_) + " of " +
                       std::to_string(rows_.rows));
  }

 private:
  const SegmentView& h_;
  const uint8_t* repeated_;
  const uint64_t d_;
  Buffer<uint32_t> slot_;  // SweepRows::slot
  Buffer<raw_t> kept_;     // the unique rows that repeat, at slot_ * d_
  Buffer<raw_t> stage_;    // decoded elements not yet written: held_ of a row begun, then new ones
  SweepRows rows_;
  uint64_t held_ = 0;
  uint64_t done_ = 0;     // unique rows written
  uint64_t cursor_ = 0;   // next output row to write
  uint64_t outlier_ = 0;  // next outlier record to apply
};

}  // namespace hl
