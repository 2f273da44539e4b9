// The encoder's last stage and its driver (encode_stages.cuh): outlier records, the lossless
// decision and the results of every piece; the scratch plan of a call; encode_batch, which runs
// the stages once for all pieces and again, lossless, for the pieces whose lossy sections broke
// the size bound.
#include <algorithm>

#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

__global__ void decide_kernel(Batch b, const uint64_t* out_count, const uint64_t* out_off) {
  HL_EACH_PIECE
  decide_piece(st, e, b.dtype, scan_total(out_off, out_count, e.row_base, e.n_rows));
}

// Outlier records in position order, one warp a unique row. The outlier test is repeated on
// the raw value (the codes were zeroed); it is the same pure function as in quantize_kernel,
// at the element's index in the piece (a dithered piece has no map: row u is row u).
template <int DT>
__global__ void write_outliers_kernel(Batch b, uint64_t bpp, const uint32_t* first,
                                      const uint64_t* out_count, const uint64_t* out_off) {
  typedef typename Elem<DT>::raw_t raw_t;
  HL_PIECE_OF_BLOCK
  if (st->rule.lossless || st->fallback || !st->n_outliers) return;
  const raw_t* x = static_cast<const raw_t*>(b.x) + e.in_off;
  const bool identity = st->identity;
  const uint64_t nu = st->n_unique, d = e.row_len, base = e.row_base;
  const ElementRule rule = st->rule;
  uint8_t* rec = b.slots + e.slot + st->outlier_off;
  const uint8_t pos_bytes = outlier_pos_bytes(nu * d);
  const uint64_t rec_bytes = pos_bytes + sizeof(raw_t);
  HL_PIECE_WARP_STRIDE(u, nu) {
    if (out_count[base + u] == 0) continue;
    const uint64_t r = identity ? u : first[base + u];
    uint64_t k = scan_local(out_off, base, u);
    for (uint64_t i0 = 0; i0 < d; i0 += 32) {
      const uint64_t i = i0 + lane_id();
      bool out = false;
      uint32_t raw = 0;
      if (i < d) {
        raw = x[r * d + i];
        out = element_code<DT>(rule, (raw_t)raw, r * d + i) == kOutlierMark;
      }
      const uint32_t bits = __ballot_sync(kFull, out);
      if (out)
        put_outlier(rec + rec_bytes * (k + __popc(bits & ((1u << lane_id()) - 1))), u * d + i,
                    raw, pos_bytes, sizeof(raw_t));
      k += __popc(bits);
    }
  }
}

__global__ void finish_kernel(Batch b, PieceResult* results) {
  HL_EACH_PIECE
  (void)e;
  results[p] = piece_result(*st, from_order_key(st->lo_key), from_order_key(st->hi_key));
}

void enqueue_batch(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                   PieceResult* results, cudaStream_t stream) {
  enqueue_quantize(plan, b, s, stream);
  enqueue_dedup(plan, b, s, stream);
  enqueue_sections(plan, b, s, stream);
  launch_each_piece("decide", decide_kernel, b, stream, s.out_count, s.out_off);
  with_dtype(b.dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    launch_pieces("write_outliers", write_outliers_kernel<DT>,
                  piece_blocks(plan.max_rows, kWarpsPerBlock, b.n_pieces), b, stream, s.first,
                  s.out_count, s.out_off);
  });
  launch_each_piece("finish", finish_kernel, b, stream, results);
}

SegmentResult result_of(const PieceResult& r, uint32_t seed) {
  SegmentResult o;
  static_cast<SegmentFound&>(o) = r.found;
  o.seed = seed;
  o.bound_overflow = r.error != 0;
  o.lo = r.lo;
  o.hi = r.hi;
  return o;
}

}  // namespace

BatchPlan batch_plan(PieceTable table) {
  BatchPlan plan;
  for (const DevicePiece& e : table.pieces) {
    plan.max_rows = std::max(plan.max_rows, e.n_rows);
    plan.max_elems = std::max(plan.max_elems, e.n());
    plan.max_blocks = std::max(plan.max_blocks, e.max_blocks());
    plan.max_values = std::max(plan.max_values, e.max_values());
    plan.max_short_blocks = std::max(plan.max_short_blocks, e.max_short_blocks());
  }
  plan.any_dedup = table.dedup_rows > 0;
  plan.table = std::move(table);
  return plan;
}

void EncodeBuffers::reserve(const BatchPlan& plan, Workspace* ws) {
  const PieceTable& t = plan.table;
  const uint64_t n = t.pieces.size();
  EncodeScratch& s = scratch;
  size_t cub_bytes = 0;
  cub_need(&cub_bytes, [&](void* tmp, size_t& b) {
    return cub_exclusive_sum<uint64_t>(tmp, b, nullptr, nullptr,
                                       std::max({t.rows, t.blocks, t.rblocks, t.sblocks}), 0);
  });
  const uint64_t dedup_rows = plan.any_dedup ? t.rows : 0;
  if (plan.any_dedup) {
    cub_need(&cub_bytes, [&](void* tmp, size_t& b) {
      return cub_sort_pairs(tmp, b, nullptr, nullptr, nullptr, nullptr, t.rows,
                            dedup_key_bits(n), 0);
    });
    cub_need(&cub_bytes, [&](void* tmp, size_t& b) {
      return cub_exclusive_sum<uint32_t>(tmp, b, nullptr, nullptr, t.rows, 0);
    });
    cub_need(&cub_bytes, [&](void* tmp, size_t& b) {
      return cub_prefix_max<uint64_t>(tmp, b, nullptr, nullptr, t.rows, 0);
    });
  }
  ws->reserve(&slots, t.slots);
  ws->reserve(&pieces, n);
  ws->reserve(&states, n);
  ws->reserve(&results, n * sizeof(PieceResult));
  ws->reserve(&s.codes, t.elems);
  ws->reserve(&s.gathered, plan.any_dedup ? t.elems : 0);
  ws->reserve(&s.row_outlier, t.rows);
  for (uint64_t** p : {&s.keys, &s.keys_sorted, &s.run_head, &s.run_start})
    ws->reserve(p, dedup_rows);
  for (uint32_t** p : {&s.rows, &s.rows_sorted, &s.first_of, &s.flag, &s.uid, &s.map, &s.first})
    ws->reserve(p, dedup_rows);
  ws->reserve(&s.out_count, t.rows);
  ws->reserve(&s.out_off, t.rows);
  ws->reserve(&s.width, t.blocks);
  ws->reserve(&s.word_off, t.blocks);
  ws->reserve(&s.values, t.values);
  ws->reserve(&s.rwidth, t.rblocks);
  ws->reserve(&s.rword_off, t.rblocks);
  ws->reserve(&s.swidth, t.sblocks);
  ws->reserve(&s.sword_off, t.sblocks);
  ws->reserve_bytes(&s.cub.tmp, cub_bytes);
  s.cub.bytes = cub_bytes;
}

std::vector<SegmentResult> encode_batch(BatchPlan& plan, const EncodeBuffers& buf,
                                        const void* x_dev, uint8_t dtype, cudaStream_t stream) {
  std::vector<DevicePiece>& table = plan.table.pieces;
  const size_t n = table.size();
  if (n == 0) return {};
  Batch b{buf.pieces, buf.states, n, x_dev, buf.slots, dtype};
  PieceResult* results = buf.results;
  upload(buf.pieces, table.data(), n * sizeof(DevicePiece), stream);
  enqueue_batch(plan, b, buf.scratch, results, stream);
  std::vector<PieceResult> res(n);
  memcpy(res.data(), fetch(results, n * sizeof(PieceResult), stream), n * sizeof(PieceResult));
  // The rare second round: only the pieces that fell back, lossless, with the same launches.
  bool again = false;
  for (size_t i = 0; i < n; ++i) {
    const bool redo = res[i].fallback && !res[i].error;
    table[i].active = redo;
    table[i].force_lossless = redo;
    again |= redo;
  }
  if (again) {
    upload(buf.pieces, table.data(), n * sizeof(DevicePiece), stream);
    enqueue_batch(plan, b, buf.scratch, results, stream);
    memcpy(res.data(), fetch(results, n * sizeof(PieceResult), stream),
           n * sizeof(PieceResult));
  }
  std::vector<SegmentResult> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (!res[i].error && res[i].fallback)
      throw CodecError("CUDA encoder produced no segment for piece " + std::to_string(i));
    out[i] = result_of(res[i], table[i].seed);
  }
  return out;
}

}  // namespace gpu
}  // namespace hl
