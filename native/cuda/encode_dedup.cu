// The encoder's second stage (encode_stages.cuh): duplicate rows found and dropped, and the
// outliers of the rows that stay counted.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

// A 32-bit hash of each row's content: its codes and, at outliers, the raw bits (two rows that
// differ only in outlier values would otherwise always collide). Summing per-element mixes
// makes it independent of how lanes split the row. Rows with equal hashes are compared in
// full, so collisions cost time, never correctness.
// A warp hashes kHashRows rows at once, so that several loads are in flight per lane.
constexpr int kHashRows = 4;

template <int DT>
__global__ void row_hash_kernel(const typename Elem<DT>::raw_t* x, const uint32_t* codes,
                                uint64_t n_rows, uint64_t d, const EncodeState* st,
                                uint32_t* keys, uint32_t* rows) {
  const bool lossy = !st->lossless;
  const uint64_t groups = hl_div_up(n_rows, kHashRows);
  HL_WARP_STRIDE(g, groups) {
    uint32_t h[kHashRows];
    for (int k = 0; k < kHashRows; ++k) h[k] = 0;
    for (uint64_t i = lane_id(); i < d; i += 32) {
      uint32_t c[kHashRows];
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        c[k] = r < n_rows ? codes[r * d + i] : 0u;
      }
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        if (r >= n_rows) continue;
        h[k] += mix32(c[k] ^ ((uint32_t)i * 0x9e3779b9u));
        if (lossy && c[k] == kOutlierMark)
          h[k] += mix32((uint32_t)x[r * d + i] ^ ((uint32_t)i * 0x7f4a7c15u + 1));
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
        keys[r] = mix32(mine ^ (uint32_t)d);
        rows[r] = (uint32_t)r;
      }
    }
  }
}

// The CPU's rule for rows that share codes (cpu/quantize.cc), one warp: codes equal and, where
// a row holds outliers (lossy only), raw bits equal at the outlier positions.
template <int DT>
__device__ bool rows_equal(const typename Elem<DT>::raw_t* x, const uint32_t* codes, uint64_t d,
                           uint64_t a, uint64_t b, bool lossy) {
  for (uint64_t i0 = 0; i0 < d; i0 += 32) {
    const uint64_t i = i0 + lane_id();
    bool eq = true;
    if (i < d) {
      uint32_t ca = codes[a * d + i], cb = codes[b * d + i];
      eq = ca == cb && (!lossy || ca != kOutlierMark || x[a * d + i] == x[b * d + i]);
    }
    if (!__all_sync(kFull, eq)) return false;
  }
  return true;
}

// Each sorted position's run head: its own index where the hash changes, else 0; a prefix max
// then gives every position the start of its run of equal hashes.
__global__ void run_heads_kernel(const uint32_t* keys_sorted, uint64_t n_rows, uint32_t* head) {
  HL_GRID_STRIDE(p, n_rows) head[p] = (p == 0 || keys_sorted[p] != keys_sorted[p - 1]) ? (uint32_t)p : 0u;
}

// For each row, the smallest row with identical content. Rows sorted by (hash, row) by a stable
// radix sort: identical rows share a hash run and the run lists rows in ascending order, so the
// first identical row met from the run's start is the first occurrence.
template <int DT>
__global__ void first_occurrence_kernel(const typename Elem<DT>::raw_t* x, const uint32_t* codes,
                                        uint64_t n_rows, uint64_t d, const EncodeState* st,
                                        const uint32_t* run_start, const uint32_t* rows_sorted,
                                        uint32_t* first_of) {
  const bool lossy = !st->lossless;
  HL_WARP_STRIDE(p, n_rows) {
    const uint32_t r = rows_sorted[p];
    const uint64_t lo = run_start[p];
    uint32_t first = r;
    for (uint64_t q = lo; q < p; ++q) {
      uint32_t c = rows_sorted[q];
      if (rows_equal<DT>(x, codes, d, c, r, lossy)) {
        first = c;
        break;
      }
    }
    if (lane_id() == 0) first_of[r] = first;
  }
}

__global__ void unique_flags_kernel(const uint32_t* first_of, uint64_t n_rows, uint32_t* flag) {
  HL_GRID_STRIDE(r, n_rows) flag[r] = first_of[r] == r;
}

// uid = exclusive scan of the flags numbers unique rows in order of first occurrence.
__global__ void row_map_kernel(const uint32_t* first_of, const uint32_t* flag, const uint32_t* uid,
                               uint64_t n_rows, uint32_t* map, uint32_t* first, EncodeState* st) {
  HL_GRID_STRIDE(r, n_rows) {
    map[r] = uid[first_of[r]];
    if (flag[r]) first[uid[r]] = (uint32_t)r;
    if (r == n_rows - 1) st->n_unique_found = (uint64_t)uid[r] + flag[r];
  }
}

// Applies dedup_pays and fixes the row layout: which codes are stored, and the map's size.
__global__ void rows_layout_kernel(EncodeState* st, uint64_t n_rows, uint64_t d, bool deduped,
                                   uint32_t* codes, uint32_t* gathered) {
  uint64_t nu = n_rows;
  if (deduped) {
    nu = st->n_unique_found;
    if (!dedup_pays(n_rows, nu, d)) nu = n_rows;
  }
  const bool identity = nu == n_rows;
  st->n_unique = nu;
  st->identity = identity;
  st->n_codes = nu * d;
  st->map_count = identity ? 0 : n_rows;
  st->ucodes = identity ? codes : gathered;
}

__global__ void gather_unique_kernel(const EncodeState* st, const uint32_t* codes,
                                     const uint32_t* first, uint64_t d, uint32_t* gathered) {
  if (st->identity) return;
  const uint64_t nu = st->n_unique;
  HL_WARP_STRIDE(u, nu) {
    const uint32_t* src = codes + (uint64_t)first[u] * d;
    uint32_t* dst = gathered + u * d;
    for (uint64_t i = lane_id(); i < d; i += 32) dst[i] = src[i];
  }
}

// Outliers per unique row (0 past n_unique, so a scan over all rows gives record offsets), and
// their codes zeroed as the format stores them.
__global__ void count_outliers_kernel(const EncodeState* st, const uint8_t* row_outlier,
                                      const uint32_t* first, uint64_t n_rows, uint64_t d,
                                      uint64_t* count) {
  const bool lossless = st->lossless, identity = st->identity;
  const uint64_t nu = st->n_unique;
  uint32_t* uc = st->ucodes;
  HL_WARP_STRIDE(u, n_rows) {
    uint64_t c = 0;
    if (!lossless && u < nu && row_outlier[identity ? u : first[u]]) {
      uint32_t* row = uc + u * d;
      for (uint64_t i0 = 0; i0 < d; i0 += 32) {
        const uint64_t i = i0 + lane_id();
        const bool mark = i < d && row[i] == kOutlierMark;
        const uint32_t b = __ballot_sync(kFull, mark);
        if (mark) row[i] = 0;
        c += __popc(b);
      }
    }
    if (lane_id() == 0) count[u] = c;
  }
}

// Each row's first occurrence (first_of), by content hash and a stable sort.
void enqueue_first_occurrence(const EncodeJob& j, const EncodeScratch& s, const EncodeState* st,
                              cudaStream_t stream) {
  const uint64_t R = j.n_rows, d = j.row_len;
  with_dtype(j.dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    const auto* x = static_cast<const typename Elem<DT>::raw_t*>(j.x_dev);
    launch("row_hash", row_hash_kernel<DT>, grid_for(hl_div_up(R, kHashRows), kWarpsPerBlock),
           kThreads, stream, x, s.codes, R, d, st, s.keys, s.rows);
    cub_run("sort of row hashes", s.cub, [&](void* t, size_t& b) {
      return cub_sort_pairs(t, b, s.keys, s.keys_sorted, s.rows, s.rows_sorted, R, stream);
    });
    launch("run_heads", run_heads_kernel, grid_for(R, kThreads), kThreads, stream, s.keys_sorted,
           R, s.run_head);
    cub_run("prefix max of run heads", s.cub, [&](void* t, size_t& b) {
      return cub_prefix_max(t, b, s.run_head, s.run_start, R, stream);
    });
    launch("first_occurrence", first_occurrence_kernel<DT>, grid_for(R, kWarpsPerBlock),
           kThreads, stream, x, s.codes, R, d, st, s.run_start, s.rows_sorted, s.first_of);
  });
}

}  // namespace

void enqueue_dedup(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                   cudaStream_t stream) {
  const uint64_t R = j.n_rows, d = j.row_len;
  const uint64_t row_grid = grid_for(R, kWarpsPerBlock), flat_grid = grid_for(R, kThreads);
  const bool dedup = j.dedups();
  if (dedup) {
    enqueue_first_occurrence(j, s, st, stream);
    launch("unique_flags", unique_flags_kernel, flat_grid, kThreads, stream, s.first_of, R,
           s.flag);
    cub_run("scan of unique flags", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint32_t>(t, b, s.flag, s.uid, R, stream);
    });
    launch("row_map", row_map_kernel, flat_grid, kThreads, stream, s.first_of, s.flag, s.uid, R,
           s.map, s.first, st);
  }
  launch("rows_layout", rows_layout_kernel, 1, 1, stream, st, R, d, dedup, s.codes, s.gathered);
  if (dedup)
    launch("gather_unique", gather_unique_kernel, row_grid, kThreads, stream, st, s.codes,
           s.first, d, s.gathered);
  if (!R) return;
  launch("count_outliers", count_outliers_kernel, row_grid, kThreads, stream, st, s.row_outlier,
         s.first, R, d, s.out_count);
  cub_run("scan of outlier counts", s.cub, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, s.out_count, s.out_off, R, stream);
  });
}

}  // namespace gpu
}  // namespace hl
