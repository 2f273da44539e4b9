// The parse of a device buffer's frames without copying their payloads to the host. Besides a
// frame's header and descriptors (a bounded prefix, parse_frame_head), parse_frame reads only a
// few payload bytes: a block-packed map's width bytes (the map's length follows from them) and
// the first bytes of each code section (the short-block mark, the radix head, a level-2
// section's table byte). Where those lie depends on every earlier map's length, so the walk
// finds them on the device, one thread a frame (walk_frame, HL_HD: the tests run it on the
// host), and copies them out; the host puts them and the prefixes into an image of the buffer,
// zero elsewhere, at their own offsets. parse_frame reads exactly the same bytes from the image
// as from the buffer (the walk stops where it would throw), so the table built from the image
// is the one the buffer gives, with every check and message of the parser.
#pragma once

#include <stdint.h>

#include "frame_fields.h"

#ifdef __cplusplus
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "frame_io.h"

namespace hl {

// Where a frame of a call lies in the received buffer and where its rows go: the receive
// path decodes every sender's frame straight into its rows of one output (an all-to-all's
// own rows, copied, lie between), skipping frames it reads otherwise.
struct FramePlace {
  static constexpr uint64_t kFollows = ~0ull;  // out_elem: where the frame before it ends
  uint64_t offset = 0, size = 0;               // bytes in the buffer
  uint64_t out_elem = kFollows;                // its first element in the output
};

// Frames of these sizes back to back, decoding one after another into the output.
inline std::vector<FramePlace> back_to_back(const uint64_t* sizes, uint64_t n_frames) {
  std::vector<FramePlace> places(n_frames);
  uint64_t at = 0;
  for (uint64_t i = 0; i < n_frames; ++i) {
    places[i].offset = at;
    places[i].size = sizes[i];
    at += sizes[i];
  }
  return places;
}

// ArgumentError naming the first frame that runs past a buffer of len bytes.
inline void check_places(const std::vector<FramePlace>& places, uint64_t len) {
  for (size_t i = 0; i < places.size(); ++i) {
    const FramePlace& p = places[i];
    if (p.offset > len || p.size > len - p.offset)
      throw ArgumentError("frame " + std::to_string(i) + " of " + std::to_string(p.size) +
                          " bytes at " + std::to_string(p.offset) + " runs past the buffer's " +
                          std::to_string(len) + " bytes");
  }
}

// Bytes of every frame read first for its header and descriptors (hvd_lossy/_decode.py's
// PREFIX_BYTES): a frame of up to ~90 segments as the encoders write them.
constexpr uint64_t kPrefixBytes = 1024;

// A code section's bytes that parse_frame may read: the radix mark and two varints of at most
// 10 bytes (a short-block mark and a level-2 table byte are fewer).
constexpr uint64_t kCodeHead = 24;
constexpr uint64_t kNowhere = ~0ull;

// A segment's sizes from its descriptor, and where the walk found its sections.
struct WalkSegment {
  uint64_t map_blocks = 0;  // a block-packed map's width bytes (0: no map or a rANS one)
  uint64_t map_bytes = 0;   // a rANS map's bytes (its descriptor holds them)
  uint64_t code_bytes = 0, outlier_bytes = 0;
  uint64_t widths_at = 0;   // where its width bytes go among the call's
  uint64_t map_off = kNowhere, code_off = kNowhere;  // in its frame; kNowhere: not reached
};

// A frame to walk: its bytes in the buffer, where its payloads start (its descriptors' end)
// and its segments among the call's.
struct WalkFrame {
  uint64_t offset = 0, size = 0, payload_at = 0;
  uint64_t first_seg = 0, n_segs = 0;
};

// Walks the payloads of frame w (its bytes at frame) as parse_frame does, copying each map's
// width bytes to widths and each code section's first kCodeHead bytes (fewer at the frame's
// end) to heads, kCodeHead a segment; stops where parse_frame would find a section past the
// frame's end.
HL_HD void walk_frame(const uint8_t* frame, const WalkFrame& w, WalkSegment* segs,
                      uint8_t* widths, uint8_t* heads) {
  uint64_t at = w.payload_at;
  for (uint64_t k = 0; k < w.n_segs && at <= w.size; ++k) {
    WalkSegment& s = segs[w.first_seg + k];
    uint64_t map = s.map_bytes;
    if (s.map_blocks) {
      if (s.map_blocks > w.size - at) return;
      map = s.map_blocks;
      for (uint64_t b = 0; b < s.map_blocks; ++b) {
        widths[s.widths_at + b] = frame[at + b];
        map += 4ull * frame[at + b];
      }
    }
    s.map_off = at;
    if (map > w.size - at) return;
    at += map;
    s.code_off = at;
    const uint64_t head = w.size - at < kCodeHead ? w.size - at : kCodeHead;
    for (uint64_t i = 0; i < head; ++i) heads[(w.first_seg + k) * kCodeHead + i] = frame[at + i];
    if (s.code_bytes > w.size - at) return;
    at += s.code_bytes;
    if (s.outlier_bytes > w.size - at) return;
    at += s.outlier_bytes;
  }
}

// The walk of a call's frames: its inputs, built from the frames' heads.
struct Walk {
  std::vector<WalkFrame> frames;
  std::vector<WalkSegment> segs;
  uint64_t width_bytes = 0;  // all maps' width bytes
};

// The walk of frames whose heads (parse_frame_head's views) lie at offsets[i], sizes[i] bytes.
inline Walk walk_plan(const std::vector<FrameView>& heads, const std::vector<uint64_t>& offsets,
                      const std::vector<uint64_t>& sizes) {
  Walk w;
  for (size_t i = 0; i < heads.size(); ++i) {
    const FrameView& f = heads[i];
    WalkFrame fr;
    fr.offset = offsets[i];
    fr.size = sizes[i];
    fr.payload_at = f.header_bytes;
    fr.first_seg = w.segs.size();
    fr.n_segs = f.segs.size();
    for (const SegmentView& v : f.segs) {
      fr.payload_at += v.bytes;  // the descriptor's bytes: no payload is counted yet
      WalkSegment s;
      const uint64_t n_codes = v.n_unique * v.row_len;
      if (!v.identity && !v.map_rans) s.map_blocks = hl_div_up(v.n_rows, HL_BLOCK);
      if (v.map_rans) s.map_bytes = v.map_bytes;
      s.code_bytes = v.code_bytes;
      // past any frame where parse_frame refuses the count anyway
      s.outlier_bytes = v.n_outliers > n_codes ? kNowhere
                                               : v.n_outliers * (outlier_pos_bytes(n_codes) +
                                                                 hl_elem_bytes(f.dtype));
      s.widths_at = w.width_bytes;
      w.width_bytes += s.map_blocks;
      w.segs.push_back(s);
    }
    w.frames.push_back(fr);
  }
  return w;
}

// A host image of a buffer of len bytes, zero where nothing was put (calloc: untouched pages
// cost nothing), and the frames' walked bytes put into it at their own offsets.
struct BufferImage {
  std::unique_ptr<uint8_t, void (*)(void*)> bytes;
  explicit BufferImage(uint64_t len)
      : bytes(static_cast<uint8_t*>(calloc(len ? len : 1, 1)), free) {
    if (!bytes) throw std::bad_alloc();
  }
  uint8_t* data() const { return bytes.get(); }
  // What the walk read (widths and heads as walk_frame wrote them).
  void put_walked(const Walk& w, const uint8_t* widths, const uint8_t* heads) {
    for (const WalkFrame& f : w.frames)
      for (uint64_t k = 0; k < f.n_segs; ++k) {
        const WalkSegment& s = w.segs[f.first_seg + k];
        if (s.map_off != kNowhere && s.map_blocks)
          memcpy(data() + f.offset + s.map_off, widths + s.widths_at, s.map_blocks);
        if (s.code_off != kNowhere)
          memcpy(data() + f.offset + s.code_off, heads + (f.first_seg + k) * kCodeHead,
                 f.size - s.code_off < kCodeHead ? f.size - s.code_off : kCodeHead);
      }
  }
};

// The heads (parse_frame_head) of the frames at places, read from bounded prefixes that also
// go into the image: fetch(reads) returns the (offset, bytes) reads of the buffer back to back
// in host memory (on the device: one gather launch and one copy). A round of kPrefixBytes a
// frame, then one of what the descriptors of the frames that need more may take. Throws
// FrameError naming the frame. The places are checked (check_places) against the image.
template <class Fetch>
std::vector<FrameView> read_heads(const std::vector<FramePlace>& places, BufferImage* image,
                                  Fetch fetch) {
  std::vector<FrameView> heads(places.size());
  std::vector<uint64_t> avail(places.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < places.size(); ++i) {
    avail[i] = places[i].size < kPrefixBytes ? places[i].size : kPrefixBytes;
    pending.push_back(i);
  }
  for (int round = 0; !pending.empty(); ++round) {
    if (round == 2) throw std::logic_error("frame heads not read in two rounds");
    std::vector<std::pair<uint64_t, uint64_t>> reads;
    for (size_t i : pending) reads.push_back({places[i].offset, avail[i]});
    const uint8_t* got = fetch(reads);
    std::vector<size_t> more;
    uint64_t at = 0;
    for (size_t i : pending) {
      uint8_t* frame = image->data() + places[i].offset;
      memcpy(frame, got + at, avail[i]);
      at += avail[i];
      uint64_t need = 0;
      try {
        heads[i] = parse_frame_head(frame, avail[i], places[i].size, &need);
      } catch (const FrameError& e) {
        throw FrameError(std::string(e.what()) + " (frame " + std::to_string(i) + ")");
      }
      if (need > avail[i]) {
        avail[i] = need;
        more.push_back(i);
      }
    }
    pending = more;
  }
  return heads;
}

}  // namespace hl
#endif
