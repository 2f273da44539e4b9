// Frames (frame.h) on the host: the layout of a frame's header and descriptors, the parser
// that validates them and the writer. The segment view is what the decoders work on.
#pragma once

#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "errors.h"
#include "frame_fields.h"  // varints, descriptors, CRC32C: shared with the CUDA codec

namespace hl {

// One segment to decode, its descriptor's fields resolved.
struct SegmentView {
  uint8_t dtype = 0, level = 1;
  bool lossless = false;  // HL_SEG_LOSSLESS
  bool identity = true;   // no row map (not HL_SEG_MAP)
  bool dithered = false;  // HL_SEG_DITHER
  bool rel = false;       // HL_SEG_REL
  uint8_t pos_bytes = 1;  // bytes of an outlier's position
  bool map_rans = false;  // the map is entropy coded (HL_SEG_MAP_RANS)
  bool map_buckets = false;  // ... as bucketed symbols and extra bits (HL_SEG_MAP_BUCKETS)
  // lossy level 1: a radix section (frame.h) with these K and g (0: block packing); its
  // block-packed values start radix_head bytes into the code section
  uint32_t radix_k = 0, radix_g = 0;
  uint64_t radix_head = 0;
  bool short_blocks = false;  // lossy level 1: a short-block section (frame.h)
  uint32_t seed = 0;
  double eb_abs = 0;
  uint64_t n_rows = 0, row_len = 0, n_unique = 0, n_outliers = 0;
  uint64_t dim0 = 0;  // dim-0 entries of the segment (rows[k] of frame.h)
  const uint8_t* map = nullptr;
  const uint8_t* code = nullptr;
  const uint8_t* outliers = nullptr;
  // level 2: the code section whose table this one borrows (frame.h), null when its own
  const uint8_t* table = nullptr;
  uint64_t table_bytes = 0;  // bytes from table to the end of its section
  uint64_t map_bytes = 0, code_bytes = 0, outlier_bytes = 0;
  uint64_t bytes = 0;  // its descriptor and payload
};

// A parsed frame: header fields and its segments, every size validated (not the CRC).
struct FrameView {
  uint64_t total_bytes = 0;
  uint32_t crc = 0;
  uint8_t dtype = 0;
  int ndim = 0;
  std::vector<int64_t> trailing;  // dims after dim 0
  bool seeded = false;
  uint32_t seed = 0;
  const uint8_t* ext = nullptr;  // the transport's extension (HL_FRAME_EXT), null when absent
  uint64_t ext_bytes = 0;
  uint64_t rows = 0;  // sum of the segments' dim0
  uint64_t header_bytes = 0;  // through the n_segments field, the extension included
  std::vector<SegmentView> segs;
  // The frame's tensor shape: (rows, *trailing), () for ndim 0.
  std::vector<int64_t> shape() const;
  uint64_t decoded_bytes() const;
};

inline bool is_frame(const uint8_t* p, uint64_t n) {
  return n >= 3 && p[0] == 'H' && p[1] == 'V' && p[2] == HL_FRAME_VERSION;
}

// Size of the frame at p, from its total_bytes; FrameError unless it fits in avail.
uint64_t checked_frame_bytes(const uint8_t* p, uint64_t avail);

// Validates the header, every descriptor and every section size of the frame of exactly size
// bytes. Throws FrameError. Allocates only after a size is checked against the bytes present.
FrameView parse_frame(const uint8_t* frame, uint64_t size);

// The header and descriptors of a frame of `size` bytes of which only the first `avail` are at
// frame (a device frame's prefix copied to the host): parse_frame's checks of them, none of the
// payloads (no section pointers or map sizes, no radix or short-block marks). *need is the
// bytes that hold them whatever they say; when it exceeds avail the view is empty and the
// caller copies *need bytes and asks again. Throws FrameError.
FrameView parse_frame_head(const uint8_t* frame, uint64_t avail, uint64_t size, uint64_t* need);

// CRC32C of the frame against its header. Throws FrameError.
void verify_frame(const FrameView& f, const uint8_t* frame);
// FrameError naming both when a frame's computed CRC32C is not the one its header stores.
void check_crc(uint32_t computed, uint32_t stored);

// ---- writing ------------------------------------------------------------------------------

// A segment as the writer lays it out: descriptor fields and payload size.
struct SegmentDesc {
  uint8_t flags = 0;  // HL_SEG_*
  uint64_t rows = 0;
  uint32_t bound = 0;  // hl_bound_code, lossy only
  uint64_t n_unique = 0, n_outliers = 0, code_bytes = 0;
  uint64_t map_bytes = 0;      // stored only with HL_SEG_MAP_RANS
  uint64_t payload_bytes = 0;  // map + code + outliers
  uint64_t descriptor_bytes() const;
};

struct FrameHead {
  uint8_t dtype = 0;
  int ndim = 0;
  std::vector<int64_t> trailing;
  bool seeded = false;
  uint32_t seed = 0;
  // The transport's extension (HL_FRAME_EXT; empty: none, at most HL_FRAME_MAX_EXT bytes): the
  // protocol fields of hvd_lossy's all-to-all. Any writer (CPU or CUDA) sets it before
  // frame_size; frame_size and write_frame_head count and write it, seal_frame covers it.
  std::string ext;
};

// Total size of the frame, and where the header ends (before the descriptors). ArgumentError
// for an extension longer than HL_FRAME_MAX_EXT.
uint64_t frame_size(const FrameHead& h, const std::vector<SegmentDesc>& segs,
                       uint64_t* header_bytes);
// Writes the header and descriptors of a frame of `total` bytes at out; returns where the
// first payload goes.
uint8_t* write_frame_head(const FrameHead& h, const std::vector<SegmentDesc>& segs, uint64_t total,
                       uint8_t* out);
// Stores the CRC32C of the written frame.
void seal_frame(uint8_t* frame, uint64_t total);
// A whole sealed frame of no segments (a destination that gets no rows, or a header that
// travels alone) at out, frame_size(h, {}, nullptr) bytes; returns its size.
uint64_t write_empty_frame(const FrameHead& h, uint8_t* out);

}  // namespace hl
