// Reuse across iterations (issue 24): the sender's and the receiver's per-row work in one native
// pass over all of a call's pieces (hvd_lossy.reuse drives it; the frames are the codec's own).
//
// For each (peer, segment) both ends hold a direct-mapped cache of decoded rows keyed by id: the
// sender's mirror and the receiver's cache. For a held row the prediction P is the held row,
// the sender codes R = X - P and the receiver forms X^ = P + R^. The sender computes R^ with the
// codec's own quantizer and dequantizer (kernels_cpu.h) at the bound the codec will code R with,
// so R^ is bit for bit what the receiver decodes, and X^ with the one function both ends use
// (reconstruct_row in reuse.cc); every element of a predicted row is checked against X in the
// same sweep, and a peer with a row that would miss is coded fresh (P = 0) instead.
#pragma once

#include <stdint.h>

#include <vector>

namespace hl {
namespace reuse {

// One (peer, segment) cache: `capacity` slots, each one record of `stride` bytes that holds the
// slot's tag (the id, int64 at byte 0), its valid byte (at byte 8), the row's largest magnitude
// (the bits of its largest |element|, uint32 at byte 12, written with the row) and its row of
// row_len elements of the call's dtype (at kRecordHead): a lookup is one random read of one
// cache line, not three (tag, flag and row apart), and not the whole row. Memory the caller owns
// (a torch tensor).
constexpr uint64_t kRecordHead = 16;

struct Cache {
  uint8_t* records;
  uint64_t capacity, stride;
};

// Rows [start, start + rows) of the call: one segment of the frame to (or from) peer `group`,
// predicted from caches[cache]. eb_param is the caller's bound for the segment (rel or abs);
// lossless says the codec stored the segment's residual exactly (then R^ = R).
struct Piece {
  uint64_t start = 0, rows = 0;
  int64_t group = 0, cache = 0;
  double eb_param = 0;
  bool lossless = false;
};

// Every call below takes the call's n_rows (one id a row) to check its pieces against, and
// threads (<= 0: all cores) to work on that many groups at once.

// The slot of an id: (id * 2^64/phi, xor its bits >> 29) mod capacity, non-negative, as
// hvd_lossy.reuse.DirectMappedCache.slots computes it in int64.
uint64_t slot_of(int64_t id, uint64_t capacity);

// What encode says of each row in `hit`: coded fresh, coded against its held row, or that and
// decoded to the held row's bits (its record then needs no store), and of those the references
// whose residual it wrote as +0.0 (the codec's CompressParams::zero_rows).
constexpr uint8_t kHitFresh = 0, kHitResidual = 1, kHitHeld = 2, kHitReference = 3;

// What encode learnt, a piece (eb: X's absolute bound as the frame stores it; code_eb: the bound
// R is coded at; references / residuals: predicted rows decoded to the held row itself / to a
// corrected one) and a group (predicted: whether its frame codes residuals).
struct EncodeResult {
  std::vector<double> eb, code_eb;
  std::vector<uint64_t> references, residuals;
  std::vector<uint8_t> predicted;
};

// The sender's pass: for every piece, the prediction from its cache (as the caches are before
// this call), R into `residual` and X^ into `x_hat` (both shaped like x), one hit byte a row
// (kHit*: fresh, predicted, or predicted with X^ the held row's bits). A float32 row whose R
// surely codes to zeros is a reference: its R is written as zeros, which is what the receiver
// decodes (so the codec takes all such rows for one, unread: hvd_lossy.reuse.zero_rows), and
// kHitReference; its X^ is the held row, and its row of x_hat is left as it was (store() reads
// no kHitHeld or kHitReference row).
// A group whose `allow[g]` is 0 is coded fresh; so is one whose predicted rows would miss their
// bound. Rows of no group (the own chunk) are not pieces. Changes no cache: store() does, once
// the frames are final.
EncodeResult encode(uint8_t dtype, const void* x, const int64_t* ids, uint64_t row_len, bool rel,
                    const std::vector<Piece>& pieces, const std::vector<Cache>& caches,
                    const std::vector<uint8_t>& allow, void* residual, void* x_hat,
                    uint8_t* hit, uint64_t n_rows, int threads);

// Every piece's rows of `rows` (X^) replace what its cache holds for their ids; rows of one call
// that share a slot resolve by one rule, the last such row wins. `hit`: encode's for these rows
// (rows marked kHitHeld or kHitReference are not written: their records hold them already), or
// null.
void store(uint8_t dtype, const void* rows, const int64_t* ids, uint64_t row_len,
           const std::vector<Piece>& pieces, const std::vector<Cache>& caches, uint64_t n_rows,
           const uint8_t* hit);

// The receiver's pass: `rows` hold the decoded residuals R^ of every piece; rows whose id its
// cache holds become P + R^ where predicted[group] (exactly as the sender formed them), and then
// every piece's rows replace what its cache holds (store).
void apply(uint8_t dtype, void* rows, const int64_t* ids, uint64_t row_len,
           const std::vector<Piece>& pieces, const std::vector<Cache>& caches,
           const std::vector<uint8_t>& predicted, uint64_t n_rows, int threads);

}  // namespace reuse
}  // namespace hl
