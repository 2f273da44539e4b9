// The encoder's second stage (encode_stages.cuh): duplicate rows found and dropped, and the
// outliers of the rows that stay counted, for every piece at once.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

// A warp hashes kHashRows rows at once, so that several loads are in flight per lane.
constexpr int kHashRows = 4;

// Every row's sort key and index in its piece: dedup_key of its content hash (row_hash_term
// summed over the row) for a piece that dedups, of hash 0 for the others, which are sorted
// along (their rows stay in order) but never read.
template <int DT>
__global__ void row_hash_kernel(Batch b, uint64_t bpp, const uint32_t* codes, uint64_t* keys,
                                uint32_t* rows) {
  HL_PIECE_OF_BLOCK
  const uint64_t n_rows = e.n_rows, d = e.row_len;
  uint64_t* k_out = keys + e.row_base;
  uint32_t* r_out = rows + e.row_base;
  if (!e.dedups) {
    HL_PIECE_STRIDE(r, n_rows) {
      k_out[r] = dedup_key(pb.piece, 0);
      r_out[r] = (uint32_t)r;
    }
    return;
  }
  const auto* x = static_cast<const typename Elem<DT>::raw_t*>(b.x) + e.in_off;
  const uint32_t* c = codes + e.elem_base;
  const bool lossy = !st->rule.lossless;
  HL_PIECE_WARP_STRIDE(g, hl_div_up(n_rows, kHashRows)) {
    uint32_t h[kHashRows];
    for (int k = 0; k < kHashRows; ++k) h[k] = 0;
    for (uint64_t i = lane_id(); i < d; i += 32) {
      uint32_t ck[kHashRows];
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        ck[k] = r < n_rows ? c[r * d + i] : 0u;
      }
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        if (r < n_rows) h[k] += row_hash_term(ck[k], (uint32_t)x[r * d + i], i, lossy);
      }
    }
#pragma unroll
    for (int k = 0; k < kHashRows; ++k)
      for (int o = 16; o > 0; o >>= 1) h[k] += __shfl_xor_sync(kFull, h[k], o);
    if (lane_id() < kHashRows) {
      uint32_t mine = h[0];
#pragma unroll
      for (int k = 1; k < kHashRows; ++k)
        if (lane_id() == (unsigned)k) mine = h[k];
      const uint64_t r = g * kHashRows + lane_id();
      if (r < n_rows) {
        k_out[r] = dedup_key(pb.piece, row_hash_key(mine, d));
        r_out[r] = (uint32_t)r;
      }
    }
  }
}

// The CPU's rule for rows that share codes (cpu/quantize.cc), one warp: codes equal and, where
// a row holds outliers (lossy only), raw bits equal at the outlier positions.
template <int DT>
__device__ bool rows_equal(const typename Elem<DT>::raw_t* x, const uint32_t* codes, uint64_t d,
                           uint64_t a, uint64_t c, bool lossy) {
  for (uint64_t i0 = 0; i0 < d; i0 += 32) {
    const uint64_t i = i0 + lane_id();
    bool eq = true;
    if (i < d) {
      uint32_t ca = codes[a * d + i], cc = codes[c * d + i];
      eq = ca == cc && (!lossy || ca != kOutlierMark || x[a * d + i] == x[c * d + i]);
    }
    if (!__all_sync(kFull, eq)) return false;
  }
  return true;
}

// run_head of every sorted position of the call (piece_table.h).
__global__ void run_heads_kernel(const uint64_t* keys_sorted, uint64_t n, uint64_t* head) {
  HL_GRID_STRIDE(p, n) head[p] = run_head(keys_sorted, p);
}

// For each row, the smallest row of its piece with identical content, and whether it is that
// row itself (flag). The stable sort keeps a piece's rows of one hash in ascending order, so
// the first identical row met from the run's start is the first occurrence.
template <int DT>
__global__ void first_occurrence_kernel(Batch b, uint64_t bpp, const uint32_t* codes,
                                        const uint64_t* run_start, const uint32_t* rows_sorted,
                                        uint32_t* first_of, uint32_t* flag) {
  HL_PIECE_OF_BLOCK
  const uint64_t base = e.row_base;
  if (!e.dedups) {  // flags of 0 keep the call-wide scan of the flags exact
    HL_PIECE_STRIDE(r, e.n_rows) flag[base + r] = 0;
    return;
  }
  const auto* x = static_cast<const typename Elem<DT>::raw_t*>(b.x) + e.in_off;
  const uint32_t* c = codes + e.elem_base;
  const bool lossy = !st->rule.lossless;
  HL_PIECE_WARP_STRIDE(p, e.n_rows) {
    const uint32_t r = rows_sorted[base + p];
    uint32_t first = r;
    for (uint64_t q = run_start[base + p] - base; q < p; ++q) {
      const uint32_t o = rows_sorted[base + q];
      if (rows_equal<DT>(x, c, e.row_len, o, r, lossy)) {
        first = o;
        break;
      }
    }
    if (lane_id() == 0) {
      first_of[base + r] = first;
      flag[base + r] = first == r;
    }
  }
}

// uid, the scan of the flags, numbers a piece's unique rows in order of first occurrence.
__global__ void row_map_kernel(Batch b, uint64_t bpp, const uint32_t* first_of,
                               const uint32_t* flag, const uint32_t* uid, uint32_t* map,
                               uint32_t* first) {
  HL_PIECE_OF_BLOCK
  if (!e.dedups) return;
  const uint64_t base = e.row_base, R = e.n_rows;
  HL_PIECE_STRIDE(r, R) {
    map[base + r] = scan_local(uid, base, first_of[base + r]);
    const uint32_t u = scan_local(uid, base, r);
    if (flag[base + r]) first[base + u] = (uint32_t)r;
    if (r == R - 1) st->n_unique_found = (uint64_t)u + flag[base + r];
  }
}

__global__ void rows_layout_kernel(Batch b, uint32_t* codes, uint32_t* gathered) {
  HL_EACH_PIECE
  rows_layout(st, e, codes + e.elem_base, gathered + e.elem_base);
}

__global__ void gather_unique_kernel(Batch b, uint64_t bpp, const uint32_t* codes,
                                     const uint32_t* first, uint32_t* gathered) {
  HL_PIECE_OF_BLOCK
  if (st->identity) return;
  const uint64_t d = e.row_len;
  const uint32_t* fr = first + e.row_base;
  HL_PIECE_WARP_STRIDE(u, st->n_unique) {
    const uint32_t* src = codes + e.elem_base + (uint64_t)fr[u] * d;
    uint32_t* dst = gathered + e.elem_base + u * d;
    for (uint64_t i = lane_id(); i < d; i += 32) dst[i] = src[i];
  }
}

// Outliers per unique row (0 past n_unique, so the scan over all rows gives record offsets),
// and their codes zeroed as the format stores them.
__global__ void count_outliers_kernel(Batch b, uint64_t bpp, const uint8_t* row_outlier,
                                      const uint32_t* first, uint64_t* count) {
  HL_PIECE_OF_BLOCK
  const bool lossless = st->rule.lossless, identity = st->identity;
  const uint64_t nu = st->n_unique, d = e.row_len, base = e.row_base;
  uint32_t* uc = st->ucodes;
  HL_PIECE_WARP_STRIDE(u, e.n_rows) {
    uint64_t c = 0;
    if (!lossless && u < nu && row_outlier[base + (identity ? u : first[base + u])]) {
      uint32_t* row = uc + u * d;
      for (uint64_t i0 = 0; i0 < d; i0 += 32) {
        const uint64_t i = i0 + lane_id();
        const bool mark = i < d && row[i] == kOutlierMark;
        const uint32_t bits = __ballot_sync(kFull, mark);
        if (mark) row[i] = 0;
        c += __popc(bits);
      }
    }
    if (lane_id() == 0) count[base + u] = c;
  }
}

// Each row's first occurrence (first_of) and flag, by content hash and one stable sort.
void enqueue_first_occurrence(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                              cudaStream_t stream) {
  const uint64_t rows = plan.table.rows;
  const uint64_t row_bpp = piece_blocks(plan.max_rows, kWarpsPerBlock, b.n_pieces);
  with_dtype(b.dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    launch_pieces("row_hash", row_hash_kernel<DT>,
                  piece_blocks(hl_div_up(plan.max_rows, kHashRows), kWarpsPerBlock, b.n_pieces),
                  b, stream, s.codes, s.keys, s.rows);
    cub_run("sort of row hashes", s.cub, [&](void* t, size_t& bytes) {
      return cub_sort_pairs(t, bytes, s.keys, s.keys_sorted, s.rows, s.rows_sorted, rows,
                            dedup_key_bits(b.n_pieces), stream);
    });
    launch("run_heads", run_heads_kernel, grid_for(rows, kThreads), kThreads, stream,
           s.keys_sorted, rows, s.run_head);
    cub_run("prefix max of run heads", s.cub, [&](void* t, size_t& bytes) {
      return cub_prefix_max(t, bytes, s.run_head, s.run_start, rows, stream);
    });
    launch_pieces("first_occurrence", first_occurrence_kernel<DT>, row_bpp, b, stream, s.codes,
                  s.run_start, s.rows_sorted, s.first_of, s.flag);
  });
}

}  // namespace

void enqueue_dedup(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                   cudaStream_t stream) {
  const uint64_t rows = plan.table.rows;
  const uint64_t warp_bpp = piece_blocks(plan.max_rows, kWarpsPerBlock, b.n_pieces);
  const uint64_t flat_bpp = piece_blocks(plan.max_rows, kThreads, b.n_pieces);
  if (plan.any_dedup) {
    enqueue_first_occurrence(plan, b, s, stream);
    cub_run("scan of unique flags", s.cub, [&](void* t, size_t& bytes) {
      return cub_exclusive_sum<uint32_t>(t, bytes, s.flag, s.uid, rows, stream);
    });
    launch_pieces("row_map", row_map_kernel, flat_bpp, b, stream, s.first_of, s.flag, s.uid,
                  s.map, s.first);
  }
  launch_each_piece("rows_layout", rows_layout_kernel, b, stream, s.codes, s.gathered);
  if (plan.any_dedup)
    launch_pieces("gather_unique", gather_unique_kernel, warp_bpp, b, stream, s.codes, s.first,
                  s.gathered);
  if (!rows) return;
  launch_pieces("count_outliers", count_outliers_kernel, warp_bpp, b, stream, s.row_outlier,
                s.first, s.out_count);
  cub_run("scan of outlier counts", s.cub, [&](void* t, size_t& bytes) {
    return cub_exclusive_sum<uint64_t>(t, bytes, s.out_count, s.out_off, rows, stream);
  });
}

}  // namespace gpu
}  // namespace hl
