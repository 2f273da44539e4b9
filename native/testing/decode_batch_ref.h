// The batched CUDA decoder's decomposition (segment_table.h, cuda/decode_batch.cu) emulated
// on the host, for the tests: the frames of a received buffer parsed into one table of
// segments, then each stage one pass over every owner (a segment, or a segment's code or map
// section) the way its grid would visit it (a few blocks an owner, a thread or a warp an item,
// strided): the widths of every section's blocks, one call-wide scan of them read back with
// scan_local, the size checks (a thread a section), the unpacking (a warp a block, a lane a
// value) into the codes' values, radix digits or map entries, the outlier records, the map
// checks over one running max of the call's keyed map entries (map_key: it restarts at every
// segment) and the row gather. A stage skips a segment flagged before it (the kernels'
// segment_stopped). Slow; the tests compare its output with the CPU decoder's.
#pragma once

#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "batch_ref.h"
#include "crc32c.h"
#include "frame_walk.h"
#include "segment_table.h"

namespace hl {
namespace decoderef {

// f(owner, item) for every item < count(owner) of n_owners owners (segments, or sections:
// 2 s + 0 the code, 2 s + 1 the map of segment s), in the order of a grid of batchref::kBlocks
// blocks an owner of `per_block` items each.
template <class Count, class F>
void each_item(uint64_t n_owners, uint64_t per_block, Count count, F f) {
  using batchref::kBlocks;
  for (uint64_t o = 0; o < n_owners; ++o) {
    const uint64_t n = count(o);
    for (uint64_t blk = 0; blk < kBlocks; ++blk)
      for (uint64_t th = 0; th < per_block; ++th)
        for (uint64_t i = blk * per_block + th; i < n; i += kBlocks * per_block) f(o, i);
  }
}

template <int DT>
struct Decode {
  typedef typename Elem<DT>::raw_t raw_t;
  const SegmentTable& t;
  const uint8_t* buf;
  std::vector<raw_t> out, uniq;
  std::vector<uint64_t> width, word_off;
  std::vector<uint32_t> map, err;
  std::vector<uint64_t> keyed, prefix_max;

  Decode(const SegmentTable& table, const uint8_t* b)
      : t(table), buf(b), out(t.out_elems), uniq(t.uniq_elems), width(t.n_blocks),
        map(t.map_entries), err(t.segs.size(), 0), keyed(t.map_entries),
        prefix_max(t.map_entries) {}

  const DeviceSection& section(uint64_t s, bool is_map) const {
    return is_map ? t.segs[s].map : t.segs[s].code;
  }
  raw_t* codes_of(uint64_t s) {
    const DeviceSegment& g = t.segs[s];
    return g.identity ? out.data() + g.out_elem : uniq.data() + g.uniq_base;
  }

  // Code i of segment s (or its map entry) as the sinks of the unpack kernel store it.
  void store(uint64_t s, bool is_map, uint64_t i, uint32_t v) {
    const DeviceSegment& g = t.segs[s];
    if (is_map) {
      map[g.map_base + i] = v;
      keyed[g.map_base + i] = map_key(s, v);
    } else {
      codes_of(s)[i] = code_value<DT>(g.rule, v, i, &err[s]);
    }
  }

  // The code sections and maps of every segment, each stage over both at once: widths, the
  // call's scan, sizes, values.
  void unpack() {
    const uint64_t n_sections = 2 * t.segs.size();
    auto section_of = [&](uint64_t sec) -> const DeviceSection& {
      return section(sec >> 1, sec & 1);
    };
    auto bit_of = [](uint64_t sec) { return sec & 1 ? kSegMapSection : kSegCodeSection; };
    auto blocks = [&](uint64_t sec) { return section_of(sec).n_blocks(); };
    each_item(n_sections, batchref::kThreads, blocks, [&](uint64_t sec, uint64_t b) {
      const DeviceSection& c = section_of(sec);
      width[c.block_base + b] = section_width(c, buf + c.off, b, bit_of(sec), &err[sec >> 1]);
    });
    word_off = batchref::exclusive_sum(width);
    for (uint64_t sec = 0; sec < n_sections; ++sec) {
      const DeviceSection& c = section_of(sec);
      const uint64_t nb = c.n_blocks(), last = c.block_base + nb - 1;
      if (nb && !section_size_ok(c, buf + c.off, scan_local(word_off.data(), c.block_base, nb - 1),
                                 width[last]))
        err[sec >> 1] |= bit_of(sec);
    }
    const std::vector<uint32_t> stopped = err;  // as each block reads it at the kernel's start
    each_item(n_sections, batchref::kWarps, blocks, [&](uint64_t sec, uint64_t b) {
      const uint64_t s = sec >> 1;
      if (stopped[s]) return;
      const DeviceSection& c = section_of(sec);
      const uint64_t off = scan_local(word_off.data(), c.block_base, b);
      const uint32_t w = (uint32_t)width[c.block_base + b];
      const uint32_t size = section_block_size(c);
      for (uint32_t lane = 0; lane < size; ++lane) {
        const uint64_t j = b * size + lane;
        if (j >= c.n_values) break;
        const uint32_t v = section_value(c, buf + c.off, off, w, lane);
        auto code = [&](uint64_t pos, uint32_t d) { store(s, false, pos, d); };
        if (c.kind == kSecRadix)
          radix_digits(c, t.segs[s].n_codes(), j, v, &err[s], code);
        else
          store(s, sec & 1, j, v);
      }
    });
  }

  void scatter_outliers() {
    each_item(t.segs.size(), batchref::kThreads, [&](uint64_t s) { return t.segs[s].n_outliers; },
              [&](uint64_t s, uint64_t k) {
                if (err[s]) return;
                const DeviceSegment& g = t.segs[s];
                uint64_t pos;
                uint32_t raw;
                if (outlier_record(buf + g.outlier_off, k, g.pos_bytes, (int)sizeof(raw_t),
                                   g.n_codes(), &pos, &raw))
                  codes_of(s)[pos] = (raw_t)raw;
                else
                  err[s] |= kSegOutlier;
              });
  }

  // One running max (cub's) over the call's keyed map entries, then a thread an entry.
  void check_maps() {
    uint64_t m = 0;
    for (uint64_t e = 0; e < keyed.size(); ++e) prefix_max[e] = m = std::max(m, keyed[e]);
    auto rows = [&](uint64_t s) { return t.segs[s].identity ? 0 : t.segs[s].n_rows; };
    each_item(t.segs.size(), batchref::kThreads, rows, [&](uint64_t s, uint64_t r) {
      if (err[s]) return;
      const DeviceSegment& g = t.segs[s];
      if (!map_entry_ok(prefix_max.data() + g.map_base, r, map[g.map_base + r], g.n_rows,
                        g.n_unique))
        err[s] |= kSegMapEntry;
    });
  }

  void gather_rows() {
    auto rows = [&](uint64_t s) { return t.segs[s].identity ? 0 : t.segs[s].n_rows; };
    each_item(t.segs.size(), batchref::kWarps, rows, [&](uint64_t s, uint64_t r) {
      if (err[s]) return;
      const DeviceSegment& g = t.segs[s];
      const uint64_t m = map[g.map_base + r], d = g.row_len;
      const raw_t* u = uniq.data() + g.uniq_base;
      for (uint64_t c = 0; c < d; ++c) out[g.out_elem + r * d + c] = u[m * d + c];
    });
  }

  void run() {
    unpack();
    scatter_outliers();
    check_maps();
    gather_rows();
    for (uint64_t s = 0; s < t.segs.size(); ++s)
      if (err[s]) raise_segment_error(err[s], t, s);
  }
};

// The table of the frames at places of buf (len bytes) as decompress_batched_cuda builds it
// without the payloads on the host (frame_walk.h): heads from prefixes, the walk a frame at a
// time as its threads run it, the image of both, each frame's CRC32C (here by the host's
// crc32c; check.cu's piecewise form is tested with the encoder), the table parsed from the
// image.
inline SegmentTable walked_table(const uint8_t* buf, uint64_t len,
                                 const std::vector<FramePlace>& places, uint8_t* dtype) {
  check_places(places, len);
  BufferImage image(len);
  std::vector<uint8_t> got;
  const std::vector<FrameView> heads =
      read_heads(places, &image, [&](const std::vector<std::pair<uint64_t, uint64_t>>& reads) {
        got.clear();
        for (const auto& r : reads) got.insert(got.end(), buf + r.first, buf + r.first + r.second);
        return got.data();
      });
  std::vector<uint64_t> offsets, sizes;
  for (const FramePlace& p : places) {
    offsets.push_back(p.offset);
    sizes.push_back(p.size);
  }
  Walk w = walk_plan(heads, offsets, sizes);
  std::vector<uint8_t> widths(w.width_bytes), code_heads(w.segs.size() * kCodeHead);
  for (const WalkFrame& f : w.frames)
    walk_frame(buf + f.offset, f, w.segs.data(), widths.data(), code_heads.data());
  image.put_walked(w, widths.data(), code_heads.data());
  std::vector<uint32_t> crcs;
  for (const FramePlace& p : places)
    crcs.push_back(crc32c(buf + p.offset + HL_FRAME_PREFIX, p.size - HL_FRAME_PREFIX));
  return segment_table(image.data(), len, places, crcs.data(), dtype);
}

}  // namespace decoderef
}  // namespace hl
