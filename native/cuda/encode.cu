// The encoder's last stage and its driver (encode_stages.cuh): outlier records, the lossless
// decision and the results of every segment; the one scratch allocation the segments share;
// encode_segments, which runs the stages in order and codes again, lossless, the segments whose
// lossy sections broke the size bound.
#include <algorithm>

#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

// What the host reads back per segment.
struct DeviceResult {
  uint64_t total;  // the payload
  uint32_t fallback;
  uint32_t error;
  uint64_t n_unique, n_outliers, map_bytes, code_bytes;
  uint32_t bound, lossless, identity, dithered;
  double lo, hi;  // the finite range (rel mode)
};

// Places the outliers and decides the fallback.
__global__ void decide_kernel(EncodeState* st, uint64_t n_rows, uint64_t row_len, uint8_t dtype,
                              const uint64_t* out_count, const uint64_t* out_off) {
  const uint64_t n_out = n_rows ? out_off[n_rows - 1] + out_count[n_rows - 1] : 0;
  st->n_outliers = n_out;
  st->outlier_off = st->code_off + st->code_bytes;
  st->total = st->outlier_off + outlier_record_bytes(st->n_codes, dtype) * n_out;
  st->fallback = !st->lossless &&
                 lossy_exceeds_bound(n_rows, row_len, st->map_bytes, st->code_bytes, n_out);
}

// Outlier records in position order, one warp a unique row. The outlier test is repeated on
// the raw value (the codes were zeroed); it is the same pure function as in quantize_kernel,
// at the element's index in the segment (a dithered segment has no map: row u is row u).
template <int DT>
__global__ void write_outliers_kernel(const EncodeState* st, const typename Elem<DT>::raw_t* x,
                                      const uint32_t* first, uint64_t n_rows, uint64_t d,
                                      const uint64_t* out_count, const uint64_t* out_off,
                                      uint8_t* payload) {
  typedef typename Elem<DT>::raw_t raw_t;
  if (st->lossless || st->fallback) return;
  const bool identity = st->identity;
  const uint64_t nu = st->n_unique;
  const ElementRule rule = rule_of(st);
  uint8_t* rec = payload + st->outlier_off;
  const uint8_t pos_bytes = outlier_pos_bytes(nu * d);
  const uint64_t rec_bytes = pos_bytes + sizeof(raw_t);
  HL_WARP_STRIDE(u, n_rows) {
    if (u >= nu) break;
    if (out_count[u] == 0) continue;
    const uint64_t r = identity ? u : first[u];
    uint64_t k = out_off[u];
    for (uint64_t i0 = 0; i0 < d; i0 += 32) {
      const uint64_t i = i0 + lane_id();
      bool out = false;
      uint32_t raw = 0;
      if (i < d) {
        raw = x[r * d + i];
        out = element_code<DT>(rule, (raw_t)raw, r * d + i) == kOutlierMark;
      }
      const uint32_t b = __ballot_sync(kFull, out);
      if (out)
        put_outlier(rec + rec_bytes * (k + __popc(b & ((1u << lane_id()) - 1))), u * d + i,
                       raw, pos_bytes, sizeof(raw_t));
      k += __popc(b);
    }
  }
}

__global__ void finish_kernel(const EncodeState* st, DeviceResult* result) {
  result->total = st->fallback ? 0 : st->total;
  result->fallback = st->fallback;
  result->error = st->error;
  result->n_unique = st->n_unique;
  result->n_outliers = st->n_outliers;
  result->map_bytes = st->map_bytes;
  result->code_bytes = st->code_bytes;
  result->bound = st->bound;
  result->lossless = st->lossless;
  result->identity = st->identity;
  result->dithered = st->dithered;
  result->lo = from_order_key(st->lo_key);
  result->hi = from_order_key(st->hi_key);
}

void plan_encode_scratch(const std::vector<EncodeJob>& jobs, Workspace* ws, EncodeScratch* s) {
  uint64_t rows = 0, elems = 0, dedup_rows = 0, dedup_elems = 0, blocks = 0;
  uint64_t values = 0, short_blocks = 0;
  size_t cub_bytes = 0;
  for (const EncodeJob& j : jobs) {
    const uint64_t n = j.n(), nb = hl_div_up(n > j.n_rows ? n : j.n_rows, HL_BLOCK);
    rows = std::max(rows, j.n_rows);
    elems = std::max(elems, n);
    blocks = std::max(blocks, nb);
    values = std::max(values, j.max_values());
    short_blocks = std::max(short_blocks, j.max_short_blocks());
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, j.max_short_blocks(), 0);
    });
    if (j.dedups()) {
      dedup_rows = std::max(dedup_rows, j.n_rows);
      dedup_elems = std::max(dedup_elems, n);
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_sort_pairs(t, b, nullptr, nullptr, nullptr, nullptr, j.n_rows, 0);
      });
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_exclusive_sum<uint32_t>(t, b, nullptr, nullptr, j.n_rows, 0);
      });
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_prefix_max(t, b, nullptr, nullptr, j.n_rows, 0);
      });
    }
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, std::max(j.n_rows, nb), 0);
    });
  }
  ws->reserve(&s->codes, elems);
  ws->reserve(&s->gathered, dedup_elems);
  ws->reserve(&s->row_outlier, rows);
  for (uint32_t** p : {&s->keys, &s->keys_sorted, &s->rows, &s->rows_sorted, &s->run_head,
                       &s->run_start, &s->first_of, &s->flag, &s->uid, &s->map, &s->first})
    ws->reserve(p, dedup_rows);
  ws->reserve(&s->out_count, rows);
  ws->reserve(&s->out_off, rows);
  ws->reserve(&s->width, blocks);
  ws->reserve(&s->word_off, blocks);
  ws->reserve(&s->values, values);
  ws->reserve(&s->rwidth, hl_div_up(values, HL_BLOCK));
  ws->reserve(&s->rword_off, hl_div_up(values, HL_BLOCK));
  ws->reserve(&s->swidth, short_blocks);
  ws->reserve(&s->sword_off, short_blocks);
  ws->reserve_bytes(&s->cub.tmp, cub_bytes);
  s->cub.bytes = cub_bytes;
}

void enqueue_encode(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                    DeviceResult* result, bool force_lossless, cudaStream_t stream) {
  const uint64_t R = j.n_rows, d = j.row_len;
  enqueue_quantize(j, s, st, force_lossless, stream);
  enqueue_dedup(j, s, st, stream);
  enqueue_sections(j, s, st, stream);
  launch("decide", decide_kernel, 1, 1, stream, st, R, d, j.dtype, s.out_count, s.out_off);
  if (j.n())
    with_dtype(j.dtype, [&](auto dt) {
      constexpr int DT = decltype(dt)::value;
      launch("write_outliers", write_outliers_kernel<DT>, grid_for(R, kWarpsPerBlock), kThreads,
             stream, st, static_cast<const typename Elem<DT>::raw_t*>(j.x_dev), s.first, R, d,
             s.out_count, s.out_off, j.payload_dev);
    });
  launch("finish", finish_kernel, 1, 1, stream, st, result);
}

EncodeJob make_job(const SegmentJob& g) {
  EncodeJob j;
  j.x_dev = g.x_dev;
  j.dtype = g.p.dtype;
  j.mode = g.p.mode;
  j.dedup = g.p.dedup;
  j.dither = g.p.dither;
  j.seed = g.p.dither_seed;
  j.eb = g.p.error_bound;
  shape_to_rows(g.shape, &j.n_rows, &j.row_len);
  j.payload_dev = g.payload_dev;
  return j;
}

}  // namespace

uint64_t segment_slot_bytes(const std::vector<int64_t>& shape) {
  uint64_t rows, len;
  shape_to_rows(shape, &rows, &len);
  return hl_max_segment_bytes(rows, len);
}

std::vector<SegmentResult> encode_segments(const std::vector<SegmentJob>& segs,
                                           cudaStream_t stream) {
  const size_t n = segs.size();
  std::vector<EncodeJob> jobs;
  jobs.reserve(n);
  for (const SegmentJob& g : segs) jobs.push_back(make_job(g));
  if (n == 0) return {};
  Workspace ws(stream);
  EncodeScratch s;
  plan_encode_scratch(jobs, &ws, &s);
  EncodeState* states;
  DeviceResult* results;
  ws.reserve(&states, n);
  ws.reserve(&results, n);
  ws.allocate();

  for (size_t i = 0; i < n; ++i) enqueue_encode(jobs[i], s, states + i, results + i, false, stream);
  std::vector<DeviceResult> res(n);
  memcpy(res.data(), fetch(results, n * sizeof(DeviceResult), stream), n * sizeof(DeviceResult));
  bool again = false;
  for (size_t i = 0; i < n; ++i) {
    if (res[i].fallback && !res[i].error) {
      enqueue_encode(jobs[i], s, states + i, results + i, true, stream);
      again = true;
    }
  }
  if (again)
    memcpy(res.data(), fetch(results, n * sizeof(DeviceResult), stream), n * sizeof(DeviceResult));
  std::vector<SegmentResult> out(n);
  for (size_t i = 0; i < n; ++i) {
    const DeviceResult& r = res[i];
    if (!r.error && r.fallback)
      throw CodecError("CUDA encoder produced no segment for piece " + std::to_string(i));
    SegmentResult& o = out[i];
    o.payload_bytes = r.total;
    o.n_unique = r.n_unique;
    o.n_outliers = r.n_outliers;
    o.map_bytes = r.map_bytes;
    o.code_bytes = r.code_bytes;
    o.bound = r.lossless ? 0 : r.bound;
    o.lossless = r.lossless != 0;
    o.identity = r.identity != 0;
    o.dithered = r.dithered != 0;
    o.seed = jobs[i].seed;
    o.bound_overflow = r.error != 0;
    o.lo = r.lo;
    o.hi = r.hi;
  }
  return out;
}

}  // namespace gpu
}  // namespace hl
