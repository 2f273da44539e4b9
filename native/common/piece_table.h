// The device encoder's table of pieces: every (destination, segment) piece of one call in one
// device-side array, read by one launch of each stage for all pieces (cuda/encode*.cu). A
// kernel's grid is blocks_per_piece x n_pieces (piece_of_block), every block of a piece strides
// over that piece alone. The call's scratch arrays are the pieces' arrays back to back: piece
// p's rows start at row_base, its codes at elem_base, and so on, so that one device-wide scan
// serves every piece (scan_local: a piece's exclusive scan is the global one minus its first
// entry) and one radix sort of (piece, hash) keys sorts every piece's rows at once
// (dedup_key). The per-piece decisions between stages (the bound, the row layout, the radix
// plan, the packing, the lossless fallback) are HL_HD functions of the piece's EncodeState, run
// by one thread a piece on the device and by the host's emulation of the batch
// (native/testing/batch_ref.h), which the tests hold against the CPU encoder's frames.
#pragma once

#include <stdint.h>

#include "arguments.h"
#include "elements.h"
#include "level1_sections.h"

#ifdef __cplusplus
#include <vector>

#include "device_frames.h"
#include "pieces.h"

namespace hl {

// One piece of the call. Bases index the call's concatenated scratch arrays.
struct DevicePiece {
  uint64_t in_off;       // first element in the call's input
  uint64_t n_rows, row_len;
  uint64_t row_base;     // rows: outlier flags, hashes, map, outlier counts
  uint64_t elem_base;    // codes (== in_off: the pieces tile the input)
  uint64_t block_base;   // 32-value blocks of the map or the codes (their widths and scan)
  uint64_t value_base;   // radix values
  uint64_t rblock_base;  // blocks of the radix values
  uint64_t sblock_base;  // short blocks of the codes
  uint64_t slot;         // the payload's worst-case slot in the call's payload buffer
  double eb;             // the caller's bound (rel: a fraction of the range)
  uint32_t seed;         // dither seed
  uint8_t mode;
  uint8_t dedups;          // dedup_applies, with dither off
  uint8_t dither;
  uint8_t force_lossless;  // the second round of a lossy piece that broke the size bound
  uint8_t active;          // 0: the stages skip the piece (the fallback round's others)

  HL_HD uint64_t n() const { return n_rows * row_len; }
  // radix values (g >= 2: at most half the codes) and short blocks of the code section
  HL_HD uint64_t max_values() const { return hl_div_up(n(), 2); }
  HL_HD uint64_t max_short_blocks() const { return short_n_blocks(n()); }
  // blocks of the map (n_rows entries) or of the codes, whichever is more
  HL_HD uint64_t max_blocks() const {
    return hl_div_up(n() > n_rows ? n() : n_rows, HL_BLOCK);
  }
};

// What the device knows about one piece between stages. Offsets are from the payload's first
// byte.
struct alignas(16) EncodeState {
  unsigned long long lo_key, hi_key;  // finite range, order_key encoded (device atomics)
  ElementRule rule;  // what every element is coded with (lossless: raw bits; dither)
  uint32_t error;     // kEncodeBoundOverflow
  uint32_t identity;  // no map section
  uint32_t fallback;  // lossy piece too large: encode again lossless
  uint32_t bound;     // hl_bound_code of the bound the codes use
  uint32_t max_code;  // largest stored code: radix K and whether short blocks apply
  uint32_t packing;   // Level1Packing of the code section
  uint32_t radix_k, radix_g;
  uint64_t radix_G, radix_head, radix_vals_bytes;
  uint64_t n_unique_found;  // distinct rows before the dedup_pays rule
  uint64_t n_unique, n_codes, map_count, n_outliers;
  uint64_t map_bytes, code_off, code_bytes, outlier_off, total;
  uint32_t* ucodes;  // codes of the unique rows: the quantized codes themselves, or gathered
};

constexpr uint32_t kEncodeBoundOverflow = 1;

// ---- the table's index arithmetic -----------------------------------------------------------

// Piece and block within it of grid block `block` of a launch of blocks_per_piece blocks a piece
// (a one-dimensional grid: no 65,535 limit on pieces).
struct PieceBlock {
  uint64_t piece, block;
};
HL_HD PieceBlock piece_of_block(uint64_t block, uint64_t blocks_per_piece) {
  return {block / blocks_per_piece, block % blocks_per_piece};
}

// Entry i of a piece's exclusive scan from the device-wide exclusive scan g of the call's
// concatenated array: sums restart at every piece's base.
template <typename T>
HL_HD T scan_local(const T* g, uint64_t base, uint64_t i) {
  return g[base + i] - g[base];
}
// The sum of a piece's `count` entries w[base..] from the device-wide exclusive scan g.
template <typename T>
HL_HD T scan_total(const T* g, const T* w, uint64_t base, uint64_t count) {
  return count ? g[base + count - 1] + w[base + count - 1] - g[base] : 0;
}

// The sort key of a row of piece p with content hash h: one stable radix sort over
// dedup_key_bits(n_pieces) bits groups every piece's rows together, by hash, rows ascending.
HL_HD uint64_t dedup_key(uint64_t piece, uint32_t hash) { return (piece << 32) | hash; }
inline int dedup_key_bits(uint64_t n_pieces) {
  return 32 + (n_pieces > 1 ? (int)bit_width((uint32_t)(n_pieces - 1)) : 0);
}

// Position p (call-wide) of the sorted keys starts a run of equal keys: then its value is p,
// else 0, so a device-wide prefix max gives every position its run's start. A piece's first
// position always starts a run (its key's piece bits differ from the previous one's).
HL_HD uint64_t run_head(const uint64_t* keys_sorted, uint64_t p) {
  return (p == 0 || keys_sorted[p] != keys_sorted[p - 1]) ? p : 0;
}

// A 32-bit hash of a row's content: the sum over its elements of row_hash_term (its code and,
// at an outlier, its raw bits: two rows that differ only in outlier values would otherwise
// always collide), finished by row_hash_key. A sum does not depend on how lanes split the row;
// rows of equal hashes are compared in full, so collisions cost time, never correctness.
HL_HD uint32_t row_hash_term(uint32_t code, uint32_t raw, uint64_t i, bool lossy) {
  uint32_t h = mix32(code ^ ((uint32_t)i * 0x9e3779b9u));
  if (lossy && code == kOutlierMark) h += mix32(raw ^ ((uint32_t)i * 0x7f4a7c15u + 1));
  return h;
}
HL_HD uint32_t row_hash_key(uint32_t sum, uint64_t row_len) {
  return mix32(sum ^ (uint32_t)row_len);
}

// ---- a piece's decisions between stages (one thread a piece) --------------------------------

// The bound by the CPU encoder's rule (absolute_bound), rounded to the 24 bits the frame stores
// (the codes use exactly the stored bound, as the CPU encoder's do), and the lossless decision.
// lo > hi: no finite value (or abs mode). A product that overflows sets kEncodeBoundOverflow.
HL_HD void prepare_piece(EncodeState* st, const DevicePiece& e, double lo, double hi) {
  double eb = absolute_bound(e.mode == HL_MODE_REL, e.eb, lo, hi);
  if (!isfinite(eb)) {
    st->error |= kEncodeBoundOverflow;
    eb = 0;
  }
  st->bound = hl_bound_code(eb);
  eb = hl_bound_of_code(st->bound);
  st->rule = element_rule(eb, e.force_lossless, e.dither, e.seed);
}

// Applies dedup_pays to the distinct rows found and fixes which codes are stored: the
// quantized ones (identity) or the unique rows gathered.
HL_HD void rows_layout(EncodeState* st, const DevicePiece& e, uint32_t* codes,
                       uint32_t* gathered) {
  uint64_t nu = e.n_rows;
  if (e.dedups) {
    nu = st->n_unique_found;
    if (!dedup_pays(e.n_rows, nu, e.row_len)) nu = e.n_rows;
  }
  const bool identity = nu == e.n_rows;
  st->n_unique = nu;
  st->identity = identity;
  st->n_codes = nu * e.row_len;
  st->map_count = identity ? 0 : e.n_rows;
  st->ucodes = identity ? codes : gathered;
}

// K, g and G of the piece's radix section, G = 0 when radix packing does not apply.
HL_HD void radix_plan(EncodeState* st) {
  const uint64_t n = st->n_codes;
  st->radix_G = 0;
  if (st->rule.lossless || !radix_applies(n, st->max_code)) return;
  const uint32_t k = st->max_code + 1, g = radix_group(k, n);
  st->radix_k = k;
  st->radix_g = g;
  st->radix_G = hl_div_up(n, g);
  st->radix_head = radix_head_bytes(k, g);
}

// level1_packing over the three sizes (code_bytes holds block packing's, short_widths the sum
// of the short blocks' widths); the code section's size becomes the chosen one's.
HL_HD void choose_packing(EncodeState* st, uint64_t short_widths) {
  const uint64_t n = st->n_codes;
  uint64_t radix = 0, shorts = 0;
  if (!st->rule.lossless && st->radix_G) radix = st->radix_head + st->radix_vals_bytes;
  if (!st->rule.lossless && short_applies(n, st->max_code)) shorts = short_section_bytes(n, short_widths);
  st->packing = (uint32_t)level1_packing(st->code_bytes, radix, shorts);
  if (st->packing == HL_PACK_RADIX) st->code_bytes = radix;
  if (st->packing == HL_PACK_SHORT) st->code_bytes = shorts;
}

// Places the outliers after the code section and decides the lossless fallback.
HL_HD void decide_piece(EncodeState* st, const DevicePiece& e, uint8_t dtype, uint64_t n_out) {
  st->n_outliers = n_out;
  st->outlier_off = st->code_off + st->code_bytes;
  st->total = st->outlier_off + outlier_record_bytes(st->n_codes, dtype) * n_out;
  st->fallback = !st->rule.lossless &&
                 lossy_exceeds_bound(e.n_rows, e.row_len, st->map_bytes, st->code_bytes, n_out);
}

// What the host reads back of a piece once the batch is done: what the encoder found (the
// descriptor's fields and the payload's size, 0 when the piece fell back; the seed is the
// host's), whether it fell back or its bound overflowed, and the finite range where it was
// taken.
struct PieceResult {
  SegmentFound found;
  uint32_t fallback, error;
  double lo, hi;
};
HL_HD PieceResult piece_result(const EncodeState& st, double lo, double hi) {
  PieceResult r;
  r.found.payload_bytes = st.fallback ? 0 : st.total;
  r.found.n_unique = st.n_unique;
  r.found.n_outliers = st.n_outliers;
  r.found.map_bytes = st.map_bytes;
  r.found.code_bytes = st.code_bytes;
  r.found.bound = st.rule.lossless ? 0 : st.bound;
  r.found.lossless = st.rule.lossless;
  r.found.identity = st.identity;
  r.found.dithered = st.rule.dithered;
  r.fallback = st.fallback;
  r.error = st.error;
  r.lo = lo;
  r.hi = hi;
  return r;
}

// ---- the table on the host ------------------------------------------------------------------

// The table of a call's pieces and the sizes of the concatenated arrays its bases index.
struct PieceTable {
  std::vector<DevicePiece> pieces;
  uint64_t rows = 0, elems = 0, blocks = 0, values = 0, rblocks = 0, sblocks = 0;
  uint64_t dedup_rows = 0;  // rows of the pieces that look for duplicates
  uint64_t slots = 0;       // the payload buffer: every piece's worst case
};

// The table of the checked pieces c (pieces.h) coded with dedup (the call's flag).
inline PieceTable piece_table(const Pieces& c, bool dedup) {
  PieceTable t;
  t.pieces.resize(c.shapes.size());
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    DevicePiece& e = t.pieces[i];
    const CompressParams& p = c.params[i];
    shape_to_rows(c.shapes[i], &e.n_rows, &e.row_len);
    e.in_off = c.in_off[i];
    e.eb = p.error_bound;
    e.seed = p.dither_seed;
    e.mode = p.mode;
    e.dither = p.dither;
    // Dithered rows never repeat (each element has its own offset): no dedup, as cpu/encode.cc.
    e.dedups = dedup_applies(dedup && !p.dither, e.n_rows, e.row_len);
    e.force_lossless = 0;
    e.active = 1;
    e.row_base = t.rows;
    e.elem_base = t.elems;
    e.block_base = t.blocks;
    e.value_base = t.values;
    e.rblock_base = t.rblocks;
    e.sblock_base = t.sblocks;
    e.slot = t.slots;
    t.rows += e.n_rows;
    t.elems += e.n();
    t.blocks += e.max_blocks();
    t.values += e.max_values();
    t.rblocks += hl_div_up(e.max_values(), HL_BLOCK);
    t.sblocks += e.max_short_blocks();
    t.slots += hl_max_segment_bytes(e.n_rows, e.row_len);
    if (e.dedups) t.dedup_rows += e.n_rows;
  }
  // Row ids, map entries and the scan of the unique flags are 32-bit call-wide.
  if (t.rows > 0xffffffffull)
    throw ArgumentError("a device call of " + std::to_string(t.rows) +
                        " rows, expected at most 2^32 - 1: split it into calls");
  return t;
}

}  // namespace hl
#endif
