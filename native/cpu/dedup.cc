// Encoder stage 1: a piece's finite value range and its rows repeated bit for bit, in one pass
// (found by content, or from the caller's ids and confirmed).
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "dedup.h"
#include "encode_stages.h"
#include "kernels_cpu.h"
#include "parallel.h"

namespace hl {
namespace enc {

template <int DT>
void finite_range(const Tensor<DT>& t, int threads, double* lo_out, double* hi_out) {
  const uint64_t n = t.size();
  const int nt = n > 65536 ? threads : 1;
  std::vector<double> lo(nt, INFINITY), hi(nt, -INFINITY);
  omp_threads(nt, [&](int k, int parts) {
    uint64_t a, b;
    split_range(n, k, parts, &a, &b);
    cpu::finite_range(DT, t.x + a, b - a, &lo[k], &hi[k]);
  });
  *lo_out = *std::min_element(lo.begin(), lo.end());
  *hi_out = *std::max_element(hi.begin(), hi.end());
}

template <int DT>
DistinctRows distinct_raw_rows(const Tensor<DT>& t, bool need_range, int threads, double* lo,
                               double* hi) {
  typedef typename Elem<DT>::raw_t raw_t;
  const uint64_t rows = t.n_rows, d = t.row_len, row_bytes = d * sizeof(raw_t);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(t.x);
  DistinctRows out;
  out.map = Buffer<uint32_t>(rows);
  Buffer<uint64_t> hashes(rows);
  Numbering num(hashes.data());
  auto same = [&](uint64_t a, uint64_t b) {
    return rows_equal(t.x + a * d, t.x + b * d, row_bytes);
  };
  const uint64_t block = std::max<uint64_t>(1, (256u << 10) / std::max<uint64_t>(row_bytes, 1));
  double lo_all = INFINITY, hi_all = -INFINITY;
  for (uint64_t b0 = 0; b0 < rows; b0 += block) {
    const uint64_t b1 = std::min(rows, b0 + block);
    const int nt = (b1 - b0) * d > 65536 ? threads : 1;
    double lo_t[64], hi_t[64];
    omp_threads(nt < 64 ? nt : 64, [&](int k, int parts) {
      uint64_t a, e;
      split_range(b1 - b0, k, parts, &a, &e);
      cpu::hash_raw_rows(bytes + (b0 + a) * row_bytes, e - a, row_bytes, hashes.data() + b0 + a);
      lo_t[k] = INFINITY;
      hi_t[k] = -INFINITY;
      if (need_range) cpu::finite_range(DT, t.x + (b0 + a) * d, (e - a) * d, &lo_t[k], &hi_t[k]);
    });
    for (int k = 0; k < (nt < 64 ? nt : 64); ++k) {
      lo_all = std::min(lo_all, lo_t[k]);
      hi_all = std::max(hi_all, hi_t[k]);
    }
    num.add_range(b0, b1, same, [&](uint64_t f) { prefetch_row(t.x + f * d, row_bytes); },
                  out.map.data());
  }
  out.first = std::move(num.first);
  if (need_range) {
    *lo = lo_all;
    *hi = hi_all;
  }
  return out;
}

template <int DT>
DistinctRows distinct_rows_by_id(const Tensor<DT>& t, const int64_t* ids,
                                 const uint8_t* zero_rows, bool need_range, double* lo,
                                 double* hi) {
  typedef typename Elem<DT>::raw_t raw_t;
  const uint64_t rows = t.n_rows, d = t.row_len, row_bytes = d * sizeof(raw_t);
  Buffer<uint64_t> keys(rows);  // a row hashes as its id: no row is read to number it
  for (uint64_t r = 0; r < rows; ++r) keys[r] = mix64((uint64_t)ids[r]);
  DistinctRows out;
  out.map = Buffer<uint32_t>(rows);
  // A row joins the first earlier row with its id's hash whose bits it repeats, and the ids are
  // never compared: equal bits are a repeat whatever the ids say, and a row that differs from
  // its id's first row (ids that lie) goes on probing and becomes a distinct row of its own. So
  // lies cost speed, never the bound, and a probe reads no other row's id or class. Sized for
  // every row distinct: the table never doubles (a rehash read as much as the numbering itself).
  Numbering num(keys.data(), rows);
  auto same = [&](uint64_t a, uint64_t b) {
    return rows_equal(t.x + a * d, t.x + b * d, row_bytes);
  };
  auto fetch = [&](uint64_t f) { prefetch_row(t.x + f * d, row_bytes); };
  // Blocks of rows, as distinct_raw_rows takes them; the range from a whole block (a repeat has
  // its first row's values, so it cannot widen it), one call a block rather than one a run of
  // distinct rows.
  const uint64_t block = std::max<uint64_t>(1, (256u << 10) / std::max<uint64_t>(row_bytes, 1));
  double lo_all = INFINITY, hi_all = -INFINITY;
  uint32_t* map = out.map.data();
  constexpr uint32_t kNoZero = ~0u;
  uint32_t zero_u = kNoZero;  // the zero rows' unique row, once the first is met
  for (uint64_t b0 = 0; b0 < rows; b0 += block) {
    const uint64_t b1 = std::min(rows, b0 + block);
    if (need_range) {  // zero rows hold +0.0 (the caller's promise): read with the others
      double l, h;
      cpu::finite_range(DT, t.x + b0 * d, (b1 - b0) * d, &l, &h);
      lo_all = std::min(lo_all, l);
      hi_all = std::max(hi_all, h);
    }
    if (!zero_rows) {
      num.add_range(b0, b1, same, fetch, map);
      continue;
    }
    // Runs of other rows numbered as above, zero rows settled between them in row order, so
    // the unique rows come in the same order as if the zero rows had been compared.
    for (uint64_t r = b0; r < b1;) {
      if (zero_rows[r]) {
        if (zero_u == kNoZero)
          zero_u = num.add_apart(r, map);
        else
          map[r] = zero_u;
        ++r;
        continue;
      }
      uint64_t e = r + 1;
      while (e < b1 && !zero_rows[e]) ++e;
      num.add_range(r, e, same, fetch, map);
      r = e;
    }
  }
  if (need_range) {
    *lo = lo_all;
    *hi = hi_all;
  }
  // Numbered by first occurrence in row order, as distinct_raw_rows numbers them, up to rows
  // repeated under different ids, which code_distinct_rows' merging of equal codes joins again:
  // the frame is the same bytes.
  out.first = std::move(num.first);
  return out;
}

template void finite_range<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, int, double*, double*);
template void finite_range<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, int, double*, double*);
template void finite_range<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, int, double*, double*);
template DistinctRows distinct_raw_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, bool, int, double*, double*);
template DistinctRows distinct_raw_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, bool, int, double*, double*);
template DistinctRows distinct_raw_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, bool, int, double*, double*);
template DistinctRows distinct_rows_by_id<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, const int64_t*, const uint8_t*, bool, double*, double*);
template DistinctRows distinct_rows_by_id<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, const int64_t*, const uint8_t*, bool, double*, double*);
template DistinctRows distinct_rows_by_id<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, const int64_t*, const uint8_t*, bool, double*, double*);

}  // namespace enc
}  // namespace hl
