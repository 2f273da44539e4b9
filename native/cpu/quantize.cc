// Encoder stage 2: quantization (or raw bits) of the rows a piece stores, and the merging of
// rows that differ in bits but share codes.
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
namespace {

template <int DT>
void code_rows_into(const Tensor<DT>& t, const uint64_t* idx, uint64_t rows, bool lossless,
                    double eb_abs, const Dither& dither, int threads, uint32_t* codes,
                    uint8_t* row_outlier, uint64_t* hashes) {
  cpu::QuantParams base;
  base.step = 2.0 * eb_abs;
  base.inv_step = 1.0 / base.step;
  base.eb_abs = eb_abs;
  base.dither = dither.on;
  base.seed = dither.seed;
  const uint64_t d = t.row_len;
  const int nt = rows * d > 65536 ? threads : 1;
#pragma omp parallel num_threads(nt)
  {
    uint64_t a, b;
    split_range(rows, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &a, &b);
    const uint64_t* ia = idx ? idx + a : nullptr;
    const void* x = idx ? (const void*)t.x : (const void*)(t.x + a * d);
    cpu::QuantParams qp = base;
    qp.first = a * d;  // dithered frames are never deduplicated: idx is null
    if (lossless)
      cpu::raw_rows(DT, x, ia, b - a, d, codes + a * d);
    else
      cpu::quantize_rows(DT, x, ia, b - a, d, qp, codes + a * d, row_outlier + a,
                         hashes ? hashes + a : nullptr);
  }
}

}  // namespace

template <int DT>
Coded code_rows(const Tensor<DT>& t, DistinctRows* distinct, bool lossless, double eb_abs,
                const Dither& dither, int threads) {
  typedef typename Elem<DT>::raw_t raw_t;
  const uint64_t rows = t.n_rows, d = t.row_len;
  Coded c;
  if (!distinct) {
    c.n_unique = rows;
    c.codes = Buffer<uint32_t>(rows * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
    code_rows_into(t, nullptr, rows, lossless, eb_abs, dither, threads, c.codes.data(),
                   c.row_outlier.data(), nullptr);
    return c;
  }
  // Pass 1 (distinct_raw_rows): rows repeated bit for bit.
  const Buffer<uint32_t>& map1 = distinct->map;
  const std::vector<uint64_t>& first1 = distinct->first;
  const uint64_t n1 = first1.size();

  // Pass 2: codes of the distinct raw rows, merged where codes (and outlier bits) agree.
  Buffer<uint32_t> codes1(n1 * d);
  Buffer<uint8_t> out1(lossless ? 0 : n1);
  Buffer<uint64_t> h2(lossless ? 0 : n1);
  code_rows_into(t, first1.data(), n1, lossless, eb_abs, Dither(), threads, codes1.data(),
                 out1.data(), h2.data());
  Buffer<uint32_t> map2;
  std::vector<uint64_t> first2;
  uint64_t n2 = n1;
  if (!lossless) {
    map2 = Buffer<uint32_t>(n1);
    auto same = [&](uint64_t a, uint64_t b) {
      if (memcmp(&codes1[a * d], &codes1[b * d], d * 4) != 0) return false;
      if (!out1[a]) return true;
      // The mark alone says nothing of the value: outliers must match bit for bit.
      const raw_t* xa = t.x + first1[a] * d;
      const raw_t* xb = t.x + first1[b] * d;
      for (uint64_t i = 0; i < d; ++i)
        if (codes1[a * d + i] == kOutlierMark && xa[i] != xb[i]) return false;
      return true;
    };
    auto row = [&](uint64_t f) { prefetch_row(&codes1[f * d], d * 4); };
    n2 = number_rows(n1, h2.data(), same, row, map2.data(), &first2);
  }
  auto unique_of = [&](uint64_t r) -> uint32_t { return n2 < n1 ? map2[map1[r]] : map1[r]; };
  auto distinct_of = [&](uint64_t u) -> uint64_t { return n2 < n1 ? first2[u] : u; };

  if (!dedup_pays(rows, n2, d)) {
    c.n_unique = rows;
    if (n1 == rows) {  // no row repeated bit for bit: the codes are already in row order
      c.codes = std::move(codes1);
      c.row_outlier = std::move(out1);
      return c;
    }
    // Store every row: expand the distinct rows' codes back to all rows.
    c.codes = Buffer<uint32_t>(rows * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * d > 65536)
    for (int64_t r = 0; r < (int64_t)rows; ++r) {
      memcpy(&c.codes[r * d], &codes1[(uint64_t)map1[r] * d], d * 4);
      if (!lossless) c.row_outlier[r] = out1[map1[r]];
    }
    return c;
  }
  c.n_unique = n2;
  c.source.resize(n2);
  for (uint64_t u = 0; u < n2; ++u) c.source[u] = first1[distinct_of(u)];
  if (n2 < n1) {
    c.codes = Buffer<uint32_t>(n2 * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : n2);
    for (uint64_t u = 0; u < n2; ++u) {
      memcpy(&c.codes[u * d], &codes1[first2[u] * d], d * 4);
      if (!lossless) c.row_outlier[u] = out1[first2[u]];
    }
  } else {
    c.codes = std::move(codes1);
    c.row_outlier = std::move(out1);
  }
  if (n2 < rows) {
    c.map = Buffer<uint32_t>(rows);
    for (uint64_t r = 0; r < rows; ++r) c.map[r] = unique_of(r);
  } else {
    c.source.clear();  // every row distinct: the identity
  }
  return c;
}

template Coded code_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, DistinctRows*, bool, double, const Dither&, int);
template Coded code_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, DistinctRows*, bool, double, const Dither&, int);
template Coded code_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, DistinctRows*, bool, double, const Dither&, int);

}  // namespace enc
}  // namespace hl
