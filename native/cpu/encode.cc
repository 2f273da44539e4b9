// The CPU encoder (C++17, OpenMP): frames of frame.h from the pieces of a tensor, each piece
// through the stages of encode_stages.h, every group's frame written once, in place.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "codec.h"
#include "encode_stages.h"
#include "frame_io.h"
#include "level1_sections.h"
#include "parallel.h"
#include "pieces.h"

namespace hl {
namespace {

using enc::Coded;
using enc::DistinctRows;
using enc::Dither;
using enc::Outlier;
using enc::PieceThreads;
using enc::Sections;
using enc::Tensor;

// A segment built in scratch memory but not yet written out: its descriptor's fields and
// sections. Building and writing are apart so that a call of many pieces can build them all in
// parallel, then write each straight to its final, gap-free place.
struct Prepared {
  std::vector<int64_t> shape;
  Sections s;
  uint64_t n_rows = 0, row_len = 0;
  bool lossless = false, dithered = false;
  uint32_t bound = 0;  // hl_bound_code of the bound coded with (lossy)
  double lo = NAN, hi = NAN;  // finite range, when it was taken
  bool deduped = false;       // s.n_unique counts distinct rows (not just n_rows)
};

template <int DT>
Prepared prepare(const Tensor<DT>& t, const CompressParams& p, const std::vector<int64_t>& shape,
                 int threads, bool force_lossless) {
  const bool need_range = (p.mode == HL_MODE_REL && p.error_bound > 0) || p.want_range;
  // Dithered rows never repeat (each element has its own offset), so dither skips dedup.
  const bool dedup = dedup_applies(p.dedup && !p.dither, t.n_rows, t.row_len);
  double lo = 0, hi = 0;
  // With the caller's ids, the rows they claim repeated are found without quantizing them
  // (each one's bits compared with its id's first row), and the range from the rest.
  DistinctRows by_id;
  const bool use_ids = dedup && p.ids;
  if (use_ids)
    by_id = enc::distinct_rows_by_id(t, p.ids, p.zero_rows, need_range, &lo, &hi);
  else if (need_range)
    enc::finite_range(t, threads, &lo, &hi);
  // The frame stores 24 bits of the bound: code with exactly that, rounded down, value.
  const uint32_t bound = hl_bound_code(absolute_bound(p, lo, hi));
  const double eb_abs = hl_bound_of_code(bound);
  const bool lossless = force_lossless || eb_abs == 0;
  Dither dither;
  dither.on = p.dither && !lossless;
  dither.seed = p.dither_seed;
  // |x| of every finite element is at most this (lets the quantizer skip a check)
  const double max_abs = need_range && lo <= hi ? std::max(fabs(lo), fabs(hi)) : INFINITY;
  Prepared f;
  {
    // Lossy rows are deduplicated by their codes (only the distinct rows the ids left, when
    // given), lossless ones (codes are the raw bits) by their bytes, hashed and compared in
    // place or found by id.
    Coded coded;
    if (dedup && !lossless) {
      coded = enc::code_distinct_rows(t, use_ids ? &by_id : nullptr, eb_abs, threads,
                                      p.level == 1, max_abs);
    } else {
      DistinctRows distinct;
      if (use_ids) distinct = std::move(by_id);
      else if (dedup) distinct = enc::distinct_raw_rows(t, false, threads, &lo, &hi);
      coded = enc::code_rows(t, dedup ? &distinct : nullptr, lossless, eb_abs, dither, threads,
                             p.level == 1, max_abs);
    }
    by_id = DistinctRows();  // back to the pool before the sections take theirs
    f.s = enc::build_sections(t, coded, lossless, p.level, threads);
  }
  const Sections& s = f.s;
  if (!lossless && lossy_exceeds_bound(t.n_rows, t.row_len, s.map.size(), s.code_bytes(),
                                       s.outliers.size()))
    return prepare(t, p, shape, threads, true);
  f.n_rows = t.n_rows;
  f.row_len = t.row_len;
  f.lossless = lossless;
  f.dithered = dither.on;
  f.shape = shape;
  f.bound = lossless ? 0 : bound;
  if (need_range && t.n_rows * t.row_len > 0 && lo <= hi) {  // lo > hi: no finite element
    f.lo = lo;
    f.hi = hi;
  }
  f.deduped = dedup;
  return f;
}

// The descriptor of a prepared piece.
SegmentDesc segment_desc(const Prepared& f, uint8_t mode, uint8_t dtype) {
  const Sections& s = f.s;
  SegmentDesc d;
  // the CUDA encoder's descriptors take their flags from the same function (common/device_frames.h)
  d.flags = segment_flags(s.level == 2, f.lossless, s.n_unique == f.n_rows,
                             s.outliers.size(), mode == HL_MODE_REL, f.dithered, s.map_rans,
                             s.map_buckets);
  d.map_bytes = s.map.size();
  d.rows = f.shape.empty() ? 1 : (uint64_t)f.shape[0];
  d.bound = f.lossless ? 0 : f.bound;
  d.n_unique = s.n_unique;
  d.n_outliers = s.outliers.size();
  d.code_bytes = s.code_bytes();
  d.payload_bytes = d.map_bytes + d.code_bytes +
                    d.n_outliers * outlier_record_bytes(s.n_unique * f.row_len, dtype);
  return d;
}

// Writes a prepared piece's payload (map, code, outliers) at w; returns its end.
uint8_t* write_payload(const Prepared& f, uint64_t elem_bytes, int threads, uint8_t* w) {
  const Sections& s = f.s;
  if (!s.map.empty()) memcpy(w, s.map.data(), s.map.size());
  w += s.map.size();
  enc::write_code(s, threads, w);
  w += s.code_bytes();
  const uint8_t pb = outlier_pos_bytes(s.n_unique * f.row_len);
  for (const Outlier& o : s.outliers) {
    memcpy(w, &o.pos, pb);  // little-endian: the low bytes
    memcpy(w + pb, &o.raw, elem_bytes);
    w += pb + elem_bytes;
  }
  return w;
}

Prepared prepare_one(const void* input, const CompressParams& p, const std::vector<int64_t>& shape,
                     int threads) {
  uint64_t rows, len;
  shape_to_rows(shape, &rows, &len);
  switch (p.dtype) {
    case HL_FLOAT32:
      return prepare(Tensor<HL_FLOAT32>{static_cast<const uint32_t*>(input), rows, len}, p, shape,
                     threads, false);
    case HL_FLOAT16:
      return prepare(Tensor<HL_FLOAT16>{static_cast<const uint16_t*>(input), rows, len}, p, shape,
                     threads, false);
    case HL_BFLOAT16:
      return prepare(Tensor<HL_BFLOAT16>{static_cast<const uint16_t*>(input), rows, len}, p,
                     shape, threads, false);
  }
  throw ArgumentError("unsupported dtype code " + std::to_string(p.dtype));
}

}  // namespace

uint64_t max_grouped_bytes(const std::vector<int64_t>& rows, const std::vector<int64_t>& trailing,
                           const std::vector<int64_t>& groups, uint64_t prefix_bytes) {
  CompressParams p{HL_FLOAT32, HL_MODE_ABS, 1, false, 0.0};
  check_groups(groups, rows.size());
  return grouped_bound(plan_pieces(p, rows, trailing, {}), groups.size(), prefix_bytes);
}

namespace {


// Every piece quantized, deduplicated and packed into its sections, in parallel.
std::vector<Prepared> prepare_pieces(const void* input, const CompressParams& p, const Pieces& c,
                                     PieceThreads t, double* stats) {
  const size_t n = c.shapes.size();
  const uint8_t* in = static_cast<const uint8_t*>(input);
  const uint64_t eb = hl_elem_bytes(p.dtype);
  std::vector<Prepared> frames(n);
  parallel::parallel_items(n, t.across, [&](size_t i) {
    frames[i] = prepare_one(in + c.in_off[i] * eb, c.params[i], c.shapes[i], t.inner);
    if (stats) {
      double* s = stats + i * HL_STATS_PER_PIECE;
      s[HL_STAT_MIN] = frames[i].lo;
      s[HL_STAT_MAX] = frames[i].hi;
      const bool counted = frames[i].deduped || frames[i].n_rows <= 1;
      s[HL_STAT_UNIQUE] = counted ? (double)frames[i].s.n_unique : NAN;
      s[HL_STAT_FINITE] = s[HL_STAT_SUM] = s[HL_STAT_SUMSQ] = NAN;
    }
  });
  return frames;
}

// Builds every piece in parallel, then one frame a non-empty group, asking place(total) for
// the memory of the whole layout and writing each frame once, at its final place in it; with
// an extension (ext, the transport's: frame.h) every group's frame carries it, and an
// empty group gets a frame of no segments (ndim and trailing from `trailing`). Returns a size
// a piece: its segment, the group's first piece also counting the frame header; *group_bytes
// (when given) gets each group's frame size (0 for an empty group without extension).
std::vector<uint64_t> build_and_place(const void* input, const CompressParams& p,
                                         const Pieces& c, const std::vector<int64_t>& groups,
                                         uint64_t prefix_bytes,
                                         const std::function<uint8_t*(uint64_t)>& place,
                                         int threads, const std::string& ext = std::string(),
                                         const std::vector<int64_t>& trailing = {},
                                         std::vector<uint64_t>* group_bytes = nullptr,
                                         double* stats = nullptr) {
  const size_t n = c.shapes.size();
  const PieceThreads t = enc::piece_threads(n, threads);
  const uint64_t eb = hl_elem_bytes(p.dtype);
  std::vector<Prepared> frames = prepare_pieces(input, p, c, t, stats);
  {
    size_t at = 0;
    for (int64_t g : groups) {
      std::vector<Sections*> group;
      for (size_t i = at; i < at + (size_t)g; ++i) group.push_back(&frames[i].s);
      enc::encode_deferred(group, threads);
      at += (size_t)g;
    }
  }
  std::vector<SegmentDesc> descs(n);
  for (size_t i = 0; i < n; ++i) descs[i] = segment_desc(frames[i], p.mode, p.dtype);
  struct Group {
    size_t first, count;
    FrameHead head;
    uint64_t at = 0, total = 0, header = 0;
  };
  std::vector<Group> gs;
  std::vector<uint64_t> sizes(n, 0);
  if (group_bytes) group_bytes->assign(groups.size(), 0);
  uint64_t w = 0, first = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int64_t g = groups[gi];
    w += prefix_bytes;
    Group grp{first, (size_t)g, FrameHead()};
    first += (uint64_t)g;
    if (g == 0 && ext.empty()) continue;  // an empty group sends no frame
    grp.head.dtype = p.dtype;
    grp.head.ext = ext;
    if (g == 0) {
      grp.head.ndim = 1 + (int)trailing.size();
      grp.head.trailing = trailing;
    } else {
      grp.head.ndim = (int)c.shapes[grp.first].size();
      if (grp.head.ndim > 1)
        grp.head.trailing.assign(c.shapes[grp.first].begin() + 1, c.shapes[grp.first].end());
    }
    for (size_t i = grp.first; i < grp.first + grp.count; ++i)
      grp.head.seeded |= (descs[i].flags & HL_SEG_DITHER) != 0;
    grp.head.seed = grp.head.seeded ? c.params[grp.first].dither_seed : 0;
    const std::vector<SegmentDesc> mine(descs.begin() + grp.first,
                                        descs.begin() + grp.first + grp.count);
    grp.total = frame_size(grp.head, mine, &grp.header);
    grp.at = w;
    w += grp.total;
    if (group_bytes) (*group_bytes)[gi] = grp.total;
    for (size_t i = grp.first; i < grp.first + grp.count; ++i)
      sizes[i] = descs[i].descriptor_bytes() + descs[i].payload_bytes;
    if (g > 0) sizes[grp.first] += grp.header;
    gs.push_back(std::move(grp));
  }
  uint8_t* out = place(w);
  parallel::parallel_items(gs.size(), t.across, [&](size_t k) {
    const Group& g = gs[k];
    const std::vector<SegmentDesc> mine(descs.begin() + g.first, descs.begin() + g.first + g.count);
    uint8_t* frame = out + g.at;
    uint8_t* pw = write_frame_head(g.head, mine, g.total, frame);
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      pw = write_payload(frames[i], eb, t.inner, pw);
      frames[i] = Prepared();
    }
    if (pw != frame + g.total) throw CodecError("frame layout is inconsistent");
    seal_frame(frame, g.total);
  });
  return sizes;
}

// One tensor as a frame of one segment.
uint64_t write_single(const void* input, const CompressParams& p,
                         const std::vector<int64_t>& shape,
                         const std::function<uint8_t*(uint64_t)>& alloc, int threads) {
  Pieces c;
  c.params = {p};
  c.shapes = {shape};
  c.in_off = {0, 0};
  uint64_t size = 0;
  build_and_place(input, p, c, {1}, 0, [&](uint64_t bytes) {
    size = bytes;
    return alloc(bytes);
  }, threads);
  return size;
}
}  // namespace

std::vector<uint64_t> compress_into_cpu(const void* input, const CompressParams& p,
                                        const GroupedCall& call, uint8_t* out, uint64_t out_cap,
                                        int threads, std::vector<uint64_t>* group_bytes,
                                        double* stats) {
  CompressParams q = p;
  q.want_range = q.want_range || stats != nullptr;
  const Pieces c = plan_grouped(q, call, out_cap);
  auto place = [&](uint64_t) { return out; };
  return build_and_place(input, q, c, call.groups, call.prefix_bytes, place,
                         resolve_threads(threads), call.ext, call.trailing, group_bytes, stats);
}

std::vector<uint64_t> compress_alloc_cpu(const void* input, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         const std::function<uint8_t*(uint64_t)>& alloc,
                                         int threads) {
  const Pieces c = plan_pieces(p, rows, trailing, error_bounds);
  return build_and_place(input, p, c, {(int64_t)rows.size()}, 0, alloc,
                         resolve_threads(threads));
}

uint64_t compress_shape_alloc_cpu(const void* input, const CompressParams& p,
                                  const std::vector<int64_t>& shape,
                                  const std::function<uint8_t*(uint64_t)>& alloc, int threads) {
  check_params(p);
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  threads = resolve_threads(threads);
  return write_single(input, p, shape, alloc, threads);
}


}  // namespace hl
