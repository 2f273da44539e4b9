// The batched decoder's table of segments: every level-1 segment of the frames of one received
// buffer in one array, so that each stage of the decode is one pass over all segments (the
// encoder's piece_table.h, the other way). The frames' headers and descriptors are parsed on the
// host (parse_frame: they are small, and the exact FrameError text comes from there); the
// payloads are only addressed, by offsets into the received buffer. The call's scratch arrays
// are the segments' arrays back to back: a segment's blocks start at block_base (one
// device-wide scan of the widths serves every section, read back with scan_local) and its
// unique rows at uniq_base. Every per-item step (a block's width, a value of a packed block, a
// radix value's digits, an outlier record, a map entry, the size checks) is an HL_HD function
// here, run one thread an item on the device and in the same decomposition by the host's
// emulation (native/testing/decode_batch_ref.h), which the tests hold against the CPU decoder.
#pragma once

#include <stdint.h>

#include "elements.h"
#include "frame_fields.h"
#include "level1_sections.h"  // the section sizes

#ifdef __cplusplus
#include <string>
#include <vector>

#include "frame_io.h"
#include "frame_walk.h"  // FramePlace

namespace hl {

// Error bits of a segment, in the order the CPU decoder checks them (the first set one is
// reported by raise_segment_error). Both CUDA decoders set them (kSegEntropy: decode.cu's rANS).
enum SegmentError : uint32_t {
  kSegCodeSection = 1u << 0,
  kSegEntropy = 1u << 1,
  kSegLosslessRange = 1u << 2,
  kSegOutlier = 1u << 3,
  kSegMapSection = 1u << 4,
  kSegMapEntry = 1u << 5,
};

// How a section's codes are laid out (frame.h): block packing, a radix head then block
// packing of the radix values, or short blocks.
enum SectionKind : uint8_t { kSecBlocks = 0, kSecRadix = 1, kSecShort = 2 };

// One packed section of a segment: where it lies in the received buffer, the values it packs
// and where its blocks' widths and word offsets start in the call's block arrays.
struct DeviceSection {
  uint64_t off = 0, bytes = 0;  // in the received buffer
  uint64_t n_values = 0;        // packed values (radix: G values for n codes)
  uint64_t block_base = 0;      // first of its blocks in the call's width array
  uint8_t kind = kSecBlocks;
  uint32_t radix_k = 0, radix_g = 0;
  uint64_t head = 0;  // bytes before the first width (radix head, short-block mark)
  HL_HD uint64_t n_blocks() const {
    return kind == kSecShort ? short_n_blocks(n_values) : hl_div_up(n_values, HL_BLOCK);
  }
};

// One segment of the call.
struct DeviceSegment {
  DeviceSection code, map;  // map.n_values = 0 for an identity segment
  uint64_t outlier_off = 0, n_outliers = 0;  // records in the received buffer
  uint8_t pos_bytes = 1;
  uint64_t n_rows = 0, row_len = 0, n_unique = 0;
  uint64_t out_elem = 0;    // first element of its rows in the call's output
  uint64_t uniq_base = 0;   // first element of its unique rows in the call's scratch
  uint64_t map_base = 0;    // first entry of its map in the call's map array
  ElementRule rule;         // bound, lossless, dither and seed
  bool identity = true;
  HL_HD uint64_t n_codes() const { return n_unique * row_len; }
};

// ---- per-item steps ---------------------------------------------------------------------------

// Width of block b of section s at sec (its first byte); a width over the packing's maximum is
// flagged in *err and read as 0 so that the offsets stay inside the section.
HL_HD uint32_t section_width(const DeviceSection& s, const uint8_t* sec, uint64_t b,
                             uint32_t bit, uint32_t* err) {
  if (s.kind == kSecShort) return short_width(sec + 1, b);
  const uint32_t w = sec[s.head + b];
  if (w > 32) {
    *err |= bit;
    return 0;
  }
  return w;
}

// Whether section s is exactly its head, widths and planes, given the exclusive word offset
// and width of its last block (0, 0 when it has no blocks). A short section's padding nibble
// after an odd block count must be 0.
HL_HD bool section_size_ok(const DeviceSection& s, const uint8_t* sec, uint64_t last_off,
                           uint64_t last_width) {
  const uint64_t nb = s.n_blocks();
  if (s.kind == kSecShort)
    return short_section_bytes(s.n_values, last_off + last_width) == s.bytes &&
           (!(nb & 1) || (sec[1 + nb / 2] >> 4) == 0);
  return s.head + block_section_bytes(nb, nb ? last_off + last_width : 0) == s.bytes;
}

// Value `lane` of block b, whose w planes start at word offset word_off: bit j of the value is
// bit `lane` of plane j (block_plane reversed). A warp on the device takes each plane once and
// shares it; here every lane reads what it needs.
HL_HD uint32_t section_value(const DeviceSection& s, const uint8_t* sec, uint64_t word_off,
                             uint32_t w, uint32_t lane) {
  const bool short_blocks = s.kind == kSecShort;
  const int word_bytes = short_blocks ? 2 : 4;
  const uint64_t planes =
      short_blocks ? short_head_bytes(s.n_values) : s.head + s.n_blocks();
  const uint8_t* p = sec + planes + (uint64_t)word_bytes * word_off;
  uint32_t v = 0;
  for (uint32_t j = 0; j < w; ++j)
    v |= (((uint32_t)get_fixed_le(p + (uint64_t)word_bytes * j, word_bytes) >> lane) & 1u) << j;
  return v;
}

// Codes per block of a section's kind.
HL_HD uint32_t section_block_size(const DeviceSection& s) {
  return s.kind == kSecShort ? HL_SHORT_BLOCK : HL_BLOCK;
}

// The digits of radix value j of section c (n codes; frame.h "Radix section": g digits of base
// K, the lowest first, digit i the code radix_code_of(G, g, j, i)) handed to sink(pos, digit).
// Digits past the n codes must be 0 and what is left after g - 1 splits (the top digit) below
// K; anything else sets kSegCodeSection in *err.
template <class Sink>
HL_HD void radix_digits(const DeviceSection& c, uint64_t n, uint64_t j, uint32_t v,
                        uint32_t* err, Sink& sink) {
  const RadixDiv div = radix_div_of(c.radix_k);
  for (uint32_t i = 0; i < c.radix_g; ++i) {
    const bool top = i + 1 == c.radix_g;
    const uint32_t q = top ? 0 : radix_div(v, div), d = top ? v : v - q * div.k;
    const uint64_t pos = radix_code_of(c.n_values, c.radix_g, j, i);
    if ((top && d >= div.k) || (pos >= n && d))
      *err |= kSegCodeSection;
    else if (pos < n)
      sink(pos, d);
    v = q;
  }
}

// Map entry m of segment s keyed for one prefix max over the call's whole map array: a
// segment's keys are above every earlier segment's, so the running max restarts at each
// segment and its low 32 bits are the segment's own running max.
HL_HD uint64_t map_key(uint64_t s, uint32_t m) { return (s << 32) | m; }

// What a code (or raw bits, lossless) of unique-row element i decodes to.
template <int DT>
HL_HD typename Elem<DT>::raw_t code_value(const ElementRule& r, uint32_t v, uint64_t i,
                                          uint32_t* err) {
  typedef typename Elem<DT>::raw_t raw_t;
  if (!r.lossless) return element_value<DT>(r, v, i);
  if (sizeof(raw_t) == 2 && v > 0xffffu) *err |= kSegLosslessRange;
  return (raw_t)v;
}

// Outlier record k of a segment at rec: its position and raw bits. Records must be in range
// and strictly increasing (so no two threads write one element) and 16-bit raw bits must fit.
HL_HD bool outlier_record(const uint8_t* rec, uint64_t k, uint8_t pos_bytes, int elem_bytes,
                          uint64_t n_codes, uint64_t* pos, uint32_t* raw) {
  const uint64_t size = (uint64_t)pos_bytes + (uint64_t)elem_bytes;
  *pos = get_fixed_le(rec + size * k, pos_bytes);
  *raw = (uint32_t)get_fixed_le(rec + size * k + pos_bytes, elem_bytes);
  const bool ordered = k == 0 || *pos > get_fixed_le(rec + size * (k - 1), pos_bytes);
  return *pos < n_codes && ordered && (elem_bytes == 4 || *raw <= 0xffffu);
}

// Whether map entry r of a segment is valid, from the keyed running max (map_key) pm of its
// entries: rows are numbered by first occurrence, and the largest entry is n_unique - 1.
HL_HD bool map_entry_ok(const uint64_t* pm, uint64_t r, uint32_t m, uint64_t n_rows,
                        uint64_t n_unique) {
  const uint64_t allowed = r ? (pm[r - 1] & 0xffffffffu) + 1 : 0;
  if (m > allowed || m >= n_unique) return false;
  return r + 1 != n_rows || (pm[r] & 0xffffffffu) + 1 == n_unique;
}

// ---- the table, built on the host from the parsed frames ---------------------------------

// Why segment v has no batched decoder yet (empty when it has one): level 2 and entropy-coded
// maps keep the per-segment rANS path of decompress_cuda, bucketed maps the CPU decoder.
inline std::string batch_unsupported(const SegmentView& v) {
  if (v.level == 2) return "a level-2 segment (rANS codes)";
  if (v.map_rans) return "an entropy-coded row map";
  if (v.map_buckets) return "a bucketed row map";
  return "";
}

// The call's table and the lengths of its scratch arrays.
struct SegmentTable {
  std::vector<DeviceSegment> segs;
  std::vector<std::string> names;  // "frame f, segment j" a segment, for the errors
  uint64_t n_blocks = 0, uniq_elems = 0, map_entries = 0, out_elems = 0;
};

// The widths a section's blocks must find before its end (the kernels read them unchecked).
inline void check_widths_fit(const DeviceSection& s, const char* what) {
  const uint64_t need = s.kind == kSecShort ? (s.n_values ? short_head_bytes(s.n_values) : 0)
                                            : s.head + s.n_blocks();
  if (need > s.bytes)
    throw FrameError(std::string("frame is corrupted: ") + what + " of " +
                     std::to_string(s.bytes) + " bytes is too small for the widths of " +
                     std::to_string(s.n_blocks()) + " blocks");
}

// Appends the segments of the parsed frame f (frame frame_index of the received buffer at base,
// into which f's pointers point), its rows from element t->out_elems of the output on.
// ArgumentError naming the segment and the frame when one has no batched decoder
// (batch_unsupported).
inline void append_frame(SegmentTable* t, const FrameView& f, const uint8_t* base,
                         uint64_t frame_index) {
  for (size_t k = 0; k < f.segs.size(); ++k) {
    const SegmentView& v = f.segs[k];
    const std::string why = batch_unsupported(v);
    if (!why.empty())
      throw ArgumentError("frame " + std::to_string(frame_index) + ", segment " +
                          std::to_string(k) + ": " + why +
                          " has no batched device decoder; expected level 1 with a packed map");
    DeviceSegment s;
    s.n_rows = v.n_rows;
    s.row_len = v.row_len;
    s.n_unique = v.n_unique;
    s.identity = v.identity;
    s.rule = element_rule(v.eb_abs, v.lossless, v.dithered, v.seed);
    s.pos_bytes = v.pos_bytes;
    s.n_outliers = v.n_outliers;
    s.outlier_off = v.outliers ? (uint64_t)(v.outliers - base) : 0;
    DeviceSection& c = s.code;
    c.off = v.code ? (uint64_t)(v.code - base) : 0;
    c.bytes = v.code_bytes;
    c.n_values = s.n_codes();
    if (v.radix_k) {
      c.kind = kSecRadix;
      c.radix_k = v.radix_k;
      c.radix_g = v.radix_g;
      c.head = v.radix_head;
      c.n_values = hl_div_up(s.n_codes(), v.radix_g);
    } else if (v.short_blocks) {
      c.kind = kSecShort;
    }
    check_widths_fit(c, "a code section");
    c.block_base = t->n_blocks;
    t->n_blocks += c.n_blocks();
    if (!v.identity) {
      s.map.off = (uint64_t)(v.map - base);
      s.map.bytes = v.map_bytes;
      s.map.n_values = v.n_rows;
      check_widths_fit(s.map, "a row map");
      s.map.block_base = t->n_blocks;
      t->n_blocks += s.map.n_blocks();
      s.map_base = t->map_entries;
      t->map_entries += v.n_rows;
      s.uniq_base = t->uniq_elems;
      t->uniq_elems += s.n_codes();
    }
    s.out_elem = t->out_elems;
    t->out_elems += v.n_rows * v.row_len;
    t->segs.push_back(s);
    t->names.push_back("frame " + std::to_string(frame_index) + ", segment " + std::to_string(k));
  }
}

// The frames at places[i] of a buffer of len bytes, parsed from its image (frame_walk.h: the
// prefixes and walked bytes at their offsets; or the buffer itself) into one table, their
// CRC32C checked against crcs[i] (computed over the buffer; null: not checked); their dtype in
// *dtype. Their outputs must come in order without overlapping: the table's out_elems is
// where the last one ends. FrameError for a bad frame (its text ends "(frame i)" where the
// parser does not name the segment), ArgumentError for a frame past the buffer, outputs out of
// order, frames of different dtypes or a segment without a batched decoder.
inline SegmentTable segment_table(const uint8_t* image, uint64_t len,
                                  const std::vector<FramePlace>& places, const uint32_t* crcs,
                                  uint8_t* dtype) {
  check_places(places, len);
  SegmentTable t;
  for (uint64_t i = 0; i < places.size(); ++i) {
    const FramePlace& p = places[i];
    const std::string name = "frame " + std::to_string(i);
    if (p.out_elem != FramePlace::kFollows && p.out_elem < t.out_elems)
      throw ArgumentError(name + "'s output starts at element " + std::to_string(p.out_elem) +
                          ", expected at least " + std::to_string(t.out_elems) +
                          " (where the frame before it ends)");
    FrameView f;
    try {
      f = parse_frame(image + p.offset, p.size);
      if (crcs) check_crc(crcs[i], f.crc);
    } catch (const FrameError& e) {
      throw FrameError(std::string(e.what()) + " (" + name + ")");
    }
    if (i == 0) *dtype = f.dtype;
    if (f.dtype != *dtype)
      throw ArgumentError(name + " has dtype " + std::to_string(f.dtype) +
                          ", expected the first frame's " + std::to_string(*dtype));
    if (p.out_elem != FramePlace::kFollows) t.out_elems = p.out_elem;
    append_frame(&t, f, image, i);
  }
  return t;
}

// The FrameError of the first error bit set in a segment (named: "segment k", or "frame f,
// segment k" in a batch), whose sections have these sizes.
[[noreturn]] inline void raise_segment_error(uint32_t err, const std::string& segment,
                                             uint64_t code_bytes, uint64_t n_codes,
                                             uint64_t map_bytes) {
  std::string what = "the row map does not number rows by first occurrence";
  if (err & kSegCodeSection)
    what = "the code section's blocks do not match its " + std::to_string(code_bytes) + " bytes";
  else if (err & kSegEntropy)
    what = "an entropy-coded stream does not decode";
  else if (err & kSegLosslessRange)
    what = "a lossless code exceeds the dtype's bits";
  else if (err & kSegOutlier)
    what = "an outlier is out of order or out of range (" + std::to_string(n_codes) +
           " elements)";
  else if (err & kSegMapSection)
    what = "the row map's blocks do not match its " + std::to_string(map_bytes) + " bytes";
  throw FrameError("frame is corrupted: " + what + " (" + segment + ")");
}
// ... of segment k of the table.
[[noreturn]] inline void raise_segment_error(uint32_t err, const SegmentTable& t, uint64_t k) {
  const DeviceSegment& s = t.segs[k];
  raise_segment_error(err, t.names[k], s.code.bytes, s.n_codes(), s.map.bytes);
}

}  // namespace hl
#endif
