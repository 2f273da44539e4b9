// The batched CUDA decoder's decomposition (segment_table.h) emulated on the host, for the
// tests: the frames of a received buffer parsed into one table of segments, then each stage
// one pass over every segment the way its grid would visit it (a few blocks a segment, a
// thread or a warp an item, strided): the widths of every section's blocks, one call-wide scan
// of them read back with scan_local, the size checks (a thread a section), the unpacking (a
// warp a block, a lane a value) into the codes' values, radix digits or map entries, the
// outlier records, the map checks over one running max of the call's keyed map entries
// (map_key: it restarts at every segment) and the row gather. A stage skips a segment whose error word is set, as a
// kernel's block_stopped does. Slow; the tests compare its output with the CPU decoder's.
#pragma once

#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "batch_ref.h"
#include "segment_table.h"

namespace hl {
namespace decoderef {

// f(segment, item) for every item < count(segment), in the order of a grid of
// batchref::kBlocks blocks a segment of `per_block` items each.
template <class Count, class F>
void each_item(const SegmentTable& t, uint64_t per_block, Count count, F f) {
  using batchref::kBlocks;
  for (uint64_t s = 0; s < t.segs.size(); ++s) {
    const uint64_t n = count(s);
    for (uint64_t blk = 0; blk < kBlocks; ++blk)
      for (uint64_t th = 0; th < per_block; ++th)
        for (uint64_t i = blk * per_block + th; i < n; i += kBlocks * per_block) f(s, i);
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

  // The code sections and maps of every segment: widths, the call's scan, sizes, values.
  void unpack(bool is_map) {
    const uint32_t bit = is_map ? kSegMapSection : kSegCodeSection;
    auto blocks = [&](uint64_t s) { return section(s, is_map).n_blocks(); };
    each_item(t, batchref::kThreads, blocks, [&](uint64_t s, uint64_t b) {
      const DeviceSection& c = section(s, is_map);
      width[c.block_base + b] = section_width(c, buf + c.off, b, bit, &err[s]);
    });
    word_off = batchref::exclusive_sum(width);
    for (uint64_t s = 0; s < t.segs.size(); ++s) {
      const DeviceSection& c = section(s, is_map);
      const uint64_t nb = c.n_blocks(), last = c.block_base + nb - 1;
      if (nb && !section_size_ok(c, buf + c.off, scan_local(word_off.data(), c.block_base, nb - 1),
                                 width[last]))
        err[s] |= bit;
    }
    each_item(t, batchref::kWarps, blocks, [&](uint64_t s, uint64_t b) {
      if (err[s]) return;
      const DeviceSection& c = section(s, is_map);
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
          store(s, is_map, j, v);
      }
    });
  }

  void scatter_outliers() {
    each_item(t, batchref::kThreads, [&](uint64_t s) { return t.segs[s].n_outliers; },
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
    each_item(t, batchref::kThreads, rows, [&](uint64_t s, uint64_t r) {
      if (err[s]) return;
      const DeviceSegment& g = t.segs[s];
      if (!map_entry_ok(prefix_max.data() + g.map_base, r, map[g.map_base + r], g.n_rows,
                        g.n_unique))
        err[s] |= kSegMapEntry;
    });
  }

  void gather_rows() {
    auto rows = [&](uint64_t s) { return t.segs[s].identity ? 0 : t.segs[s].n_rows; };
    each_item(t, batchref::kWarps, rows, [&](uint64_t s, uint64_t r) {
      if (err[s]) return;
      const DeviceSegment& g = t.segs[s];
      const uint64_t m = map[g.map_base + r], d = g.row_len;
      const raw_t* u = uniq.data() + g.uniq_base;
      for (uint64_t c = 0; c < d; ++c) out[g.out_elem + r * d + c] = u[m * d + c];
    });
  }

  void run() {
    unpack(false);
    scatter_outliers();
    unpack(true);
    check_maps();
    gather_rows();
    for (uint64_t s = 0; s < t.segs.size(); ++s)
      if (err[s]) raise_segment_error(err[s], s, t.segs[s]);
  }
};

}  // namespace decoderef
}  // namespace hl
