// Rows keyed by id (hvd_lossy.grad_ids): a chunk's rows numbered by (segment, key), their
// gradients summed per number and put back on each number's first row. Both ends of a reusing
// all-to-all number one chunk alike (they see its rows in one order), so the sums travel one row
// an id and the owner of the tables puts them back where an embedding's backward sums them.
#pragma once

#include <stdint.h>

#include <vector>

namespace hl {
namespace keyed {

// The distinct (segment, key) of a call's rows, numbered by first occurrence (both ends of a
// pair see one chunk's rows in one order, so they number them alike). Segment k holds
// seg_rows[k] consecutive rows of keys. inverse[r] is the number of row r's (segment, key),
// first[u] the first row of number u (room for every row); returns each segment's count.
// ArgumentError for a negative segment.
std::vector<uint64_t> number_keys(const int64_t* keys, const std::vector<int64_t>& seg_rows,
                                  int64_t* inverse, int64_t* first);

// out[u] = the sum of the rows r with inverse[r] == u (the segments' rows, row_len elements of
// the codec dtype `dtype` each), added in row order in float (a 16-bit dtype rounded to it once,
// at the end) as torch's index_add_ into zeros adds them, bit for bit: every u in [0, n_unique)
// has a row (number_keys' numbering; other numbers are an ArgumentError). With spans
// non-null, also each segment's finite range max - min in spans[k] (NaN without a finite
// element), as the codec's range pass finds it: seg_rows cut the rows as number_keys' did.
// One pass, a segment at a time: its range, then its sums while its rows are in cache.
void sum_rows(uint8_t dtype, const void* rows, uint64_t row_len, const int64_t* inverse,
              const std::vector<int64_t>& seg_rows, uint64_t n_unique, void* out, double* spans);

// out (n_rows rows) = sums[inverse[r]] on each number's first row (first[inverse[r]] == r), +0
// elsewhere: what sum_rows summed, back where an embedding's backward sums it again.
void expand_rows(uint8_t dtype, const void* sums, uint64_t row_len, const int64_t* inverse,
                 const int64_t* first, uint64_t n_rows, uint64_t n_unique, void* out);

}  // namespace keyed
}  // namespace hl
