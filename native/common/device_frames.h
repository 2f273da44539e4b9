// The host side of the CUDA encoder's frames, kept apart from the CUDA calls so that the CPU
// build runs it too (native/testing/bindings_test.cc: tests/test_level1_shared.py assembles the
// CPU encoder's segments with it and compares with the CPU encoder's frames). Given what the device
// found of each segment (SegmentFound), it makes the descriptors, lays out compress_into's
// groups ([prefix][frame]..., as build_and_place in cpu/encode.cc) and writes every frame's
// header and descriptors with frame_io.h's writer, an empty group's whole frame sealed.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "codec.h"
#include "frame_io.h"
#include "level1_sections.h"

namespace hl {

// What an encoder found of one segment: the descriptor's fields and the payload's size.
struct SegmentFound {
  uint64_t payload_bytes = 0, n_unique = 0, n_outliers = 0, map_bytes = 0, code_bytes = 0;
  uint32_t bound = 0;  // hl_bound_code, 0 when lossless
  bool lossless = false, identity = true;
  bool dithered = false;  // subtractive dither (lossy only) with the piece's seed
  uint32_t seed = 0;      // the piece's dither seed (CompressParams::dither_seed of pieces.h)
};

// The descriptor of a level-1 segment of the given shape (segment_desc in cpu/encode.cc for
// what the CUDA encoder writes).
inline SegmentDesc descriptor_of(const SegmentFound& r, uint8_t mode,
                              const std::vector<int64_t>& shape) {
  SegmentDesc d;
  d.flags = segment_flags(false, r.lossless, r.identity, r.n_outliers, mode == HL_MODE_REL,
                             r.dithered && !r.lossless, false, false);
  d.rows = shape.empty() ? 1 : (uint64_t)shape[0];
  d.bound = r.lossless ? 0 : r.bound;
  d.n_unique = r.n_unique;
  d.n_outliers = r.n_outliers;
  d.code_bytes = r.code_bytes;
  d.map_bytes = r.map_bytes;
  d.payload_bytes = r.payload_bytes;
  return d;
}

// One frame of the layout: segments [first, first + count), at byte `at` of the output.
struct FramePlan {
  size_t first = 0, count = 0;
  uint64_t at = 0, total = 0;
  uint64_t head_len = 0;  // header and descriptors (an empty frame: all of it)
  uint64_t head_at = 0;   // where they lie in FramesPlan::heads
};

struct FramesPlan {
  std::vector<FramePlan> frames;
  std::vector<uint64_t> sizes;        // a piece: its segment, a group's first also the header
  std::vector<uint64_t> group_bytes;  // a group: its frame (0 when it has none)
  uint64_t end = 0;                   // bytes of the whole layout
  std::vector<uint8_t> heads;         // every frame's head_len bytes, back to back
};

// The layout of compress_into for segments of these descriptors and shapes: groups[g]
// consecutive segments a frame, prefix_bytes before each group, ext in every frame (then an
// empty group has a frame of no segments, of 1 + empty_trailing.size() dims). seeds: each
// piece's dither seed (empty when none is dithered); a frame with a dithered segment carries
// its first piece's seed, as cpu/encode.cc writes it (segment k's is that + k).
inline FramesPlan plan_device_frames(const std::vector<SegmentDesc>& descs,
                                 const std::vector<std::vector<int64_t>>& shapes,
                                 const std::vector<int64_t>& groups, uint64_t prefix_bytes,
                                 const std::string& ext,
                                 const std::vector<int64_t>& empty_trailing, uint8_t dtype,
                                 const std::vector<uint32_t>& seeds = {}) {
  FramesPlan plan;
  plan.sizes.assign(descs.size(), 0);
  plan.group_bytes.assign(groups.size(), 0);
  std::vector<FrameHead> heads;
  uint64_t w = 0;
  size_t first = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const size_t g = (size_t)groups[gi];
    w += prefix_bytes;
    FramePlan f;
    f.first = first;
    f.count = g;
    first += g;
    if (g == 0 && ext.empty()) continue;  // an empty group sends no frame
    FrameHead h;
    h.dtype = dtype;
    h.ext = ext;
    if (g == 0) {
      h.ndim = 1 + (int)empty_trailing.size();
      h.trailing = empty_trailing;
    } else {
      const std::vector<int64_t>& s0 = shapes[f.first];
      h.ndim = (int)s0.size();
      if (h.ndim > 1) h.trailing.assign(s0.begin() + 1, s0.end());
    }
    const std::vector<SegmentDesc> mine(descs.begin() + f.first, descs.begin() + f.first + g);
    for (const SegmentDesc& d : mine) h.seeded |= (d.flags & HL_SEG_DITHER) != 0;
    if (h.seeded) {
      if (f.first >= seeds.size())
        throw ArgumentError("a dithered segment but no seed for piece " + std::to_string(f.first));
      h.seed = seeds[f.first];
    }
    uint64_t header = 0;
    f.total = frame_size(h, mine, &header);
    f.head_len = header;
    for (const SegmentDesc& d : mine) f.head_len += d.descriptor_bytes();
    if (g == 0) f.head_len = f.total;
    f.at = w;
    w += f.total;
    plan.group_bytes[gi] = f.total;
    for (size_t i = f.first; i < f.first + g; ++i)
      plan.sizes[i] = descs[i].descriptor_bytes() + descs[i].payload_bytes;
    if (g > 0) plan.sizes[f.first] += header;
    f.head_at = plan.heads.size();
    plan.heads.resize(plan.heads.size() + f.head_len);
    uint8_t* out = plan.heads.data() + f.head_at;
    if (g == 0) {
      write_empty_frame(h, out);
    } else if ((uint64_t)(write_frame_head(h, mine, f.total, out) - out) != f.head_len) {
      throw CodecError("frame header size is inconsistent");
    }
    plan.frames.push_back(f);
  }
  plan.end = w;
  return plan;
}

// The moves that put the plan's frames together, for one pass over all of them (the CUDA
// encoder uploads the list once and one kernel runs every copy, one CRC launch and one seal
// launch take every frame): each frame's head from plan.heads, then its segments' payloads from
// their slots, back to back behind the descriptors; then frame k's CRC32C over seals[k] once
// its bytes are in place (an empty frame comes sealed in its head and has no seal).
struct FrameCopy {
  uint64_t src;        // offset in plan.heads (from_heads) or in the payload slots
  uint64_t dst, len;   // in the output
  uint64_t from_heads;
};
struct FrameSeal {
  uint64_t at, total;  // the frame's offset in the output and its size
};
struct FrameMoves {
  std::vector<FrameCopy> copies;
  std::vector<FrameSeal> seals;
};

// slot[i]: where segment i's payload (payload_bytes[i]) lies among the slots.
inline FrameMoves frame_moves(const FramesPlan& plan, const std::vector<uint64_t>& payload_bytes,
                              const std::vector<uint64_t>& slot) {
  FrameMoves m;
  for (const FramePlan& f : plan.frames) {
    m.copies.push_back({f.head_at, f.at, f.head_len, 1});
    if (f.count == 0) continue;
    uint64_t at = f.head_len;
    for (size_t i = f.first; i < f.first + f.count; ++i) {
      if (payload_bytes[i]) m.copies.push_back({slot[i], f.at + at, payload_bytes[i], 0});
      at += payload_bytes[i];
    }
    if (at != f.total) throw CodecError("frame layout is inconsistent");
    m.seals.push_back({f.at, f.total});
  }
  return m;
}

// Worst case of a plan's heads for n_pieces segments in n_groups frames: each frame's header and
// extension (HL_FRAME_MAX_HEADER) and each segment's descriptor (a flags byte, a 3-byte bound
// and at most five 10-byte varints).
inline uint64_t max_heads_bytes(uint64_t n_pieces, uint64_t n_groups) {
  return n_groups * HL_FRAME_MAX_HEADER + n_pieces * 54;
}

}  // namespace hl
