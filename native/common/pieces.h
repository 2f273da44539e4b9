// The pieces of a compress call (dim-0 slices of one tensor, a frame's segments) and their
// grouping into frames: the one planning rule the CPU and CUDA encoders share (host code; the
// CUDA encoder's host side calls it too).
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "arguments.h"
#include "frame.h"

namespace hl {

// The pieces of a compress_many/compress_into call, checked: parameters, shape, input offset
// and worst-case segment size of each.
struct Pieces {
  std::vector<CompressParams> params;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint64_t> in_off;  // elements
  uint64_t max_segments = 0;     // sum of hl_max_segment_bytes
};

// The pieces of dim 0 of rows[i] rows each and trailing dims: error_bounds[i] (when given)
// overrides p.error_bound, piece i's dither seed is p.dither_seed + i (mod HL_DITHER_SEEDS),
// its ids and zero rows (when given) start at its first row.
// Throws ArgumentError for a bad argument.
inline Pieces plan_pieces(const CompressParams& p, const std::vector<int64_t>& rows,
                          const std::vector<int64_t>& trailing,
                          const std::vector<double>& error_bounds) {
  const size_t n = rows.size();
  const uint64_t row_elems = check_chunk_args(p, n, trailing, error_bounds);
  if (p.ids && trailing.size() != 1)
    throw ArgumentError("ids need pieces of shape (rows, row_len), got pieces of " +
                        std::to_string(trailing.size() + 1) + " dimensions");
  Pieces c;
  c.params.assign(n, p);
  c.shapes.resize(n);
  c.in_off.assign(n + 1, 0);
  uint64_t first_row = 0;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] < 0)
      throw ArgumentError("chunk " + std::to_string(i) + " has " + std::to_string(rows[i]) +
                          " rows, expected >= 0");
    if (!error_bounds.empty()) {
      c.params[i].error_bound = error_bounds[i];
      check_params(c.params[i]);
    }
    c.params[i].dither_seed = (uint32_t)((p.dither_seed + i) % HL_DITHER_SEEDS);
    if (p.ids) c.params[i].ids = p.ids + first_row;
    if (p.zero_rows) c.params[i].zero_rows = p.zero_rows + first_row;
    first_row += (uint64_t)rows[i];
    c.shapes[i].push_back(rows[i]);
    c.shapes[i].insert(c.shapes[i].end(), trailing.begin(), trailing.end());
    uint64_t r, len;
    shape_to_rows(c.shapes[i], &r, &len);
    c.in_off[i + 1] = c.in_off[i] + (uint64_t)rows[i] * row_elems;
    c.max_segments += hl_max_segment_bytes(r, len);
  }
  return c;
}

// Checks that groups[g] >= 0 pieces a frame add up to the n_pieces.
inline void check_groups(const std::vector<int64_t>& groups, size_t n_pieces) {
  uint64_t sum = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g] < 0)
      throw ArgumentError("group " + std::to_string(g) + " has " + std::to_string(groups[g]) +
                          " frames, expected >= 0");
    sum += (uint64_t)groups[g];
  }
  if (sum != n_pieces)
    throw ArgumentError("groups hold " + std::to_string(sum) + " frames, expected one per piece (" +
                        std::to_string(n_pieces) + ")");
}

// Worst case of the grouped layout of c's pieces: every prefix and frame header, every segment.
inline uint64_t grouped_bound(const Pieces& c, size_t n_groups, uint64_t prefix_bytes) {
  return n_groups * (prefix_bytes + HL_FRAME_MAX_HEADER) + c.max_segments;
}

// compress_into's plan, the same for the CPU and CUDA encoders: the pieces, with the groups, the
// transport's extension and the output's capacity checked against the layout's worst case.
inline Pieces plan_grouped(const CompressParams& p, const GroupedCall& g, uint64_t out_cap) {
  Pieces c = plan_pieces(p, g.rows, g.trailing, g.error_bounds);
  check_groups(g.groups, g.rows.size());
  if (g.ext.size() > HL_FRAME_MAX_EXT)
    throw ArgumentError("a frame extension of " + std::to_string(g.ext.size()) +
                        " bytes, at most " + std::to_string(HL_FRAME_MAX_EXT) + " fit");
  const uint64_t need = grouped_bound(c, g.groups.size(), g.prefix_bytes);
  if (need > out_cap)
    throw ArgumentError("output buffer holds " + std::to_string(out_cap) +
                        " bytes, the frames may need " + std::to_string(need));
  return c;
}

}  // namespace hl
