// Rows keyed by id: see keyed.h.
#include "keyed.h"

#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "arguments.h"
#include "codec_common.h"
#include "errors.h"
#include "kernels_cpu.h"
#include "scratch.h"

namespace hl {
namespace keyed {
namespace {

// A number's first row into its sum: 0 + x, as index_add_ into zeros makes it (-0 becomes +0).
HL_AVX2_CLONES void start_f32(float* acc, const float* x, uint64_t d) {
  for (uint64_t i = 0; i < d; ++i) acc[i] = 0.0f + x[i];
}
HL_AVX2_CLONES void add_f32(float* acc, const float* x, uint64_t d) {
  for (uint64_t i = 0; i < d; ++i) acc[i] += x[i];
}

// Every dtype is added in float, as index_add_ adds (the 16-bit ones rounded once, at the end).
template <int DT>
void widen(const typename Elem<DT>::raw_t* x, uint64_t d, float* f) {
  for (uint64_t i = 0; i < d; ++i) f[i] = (float)Elem<DT>::to_double(x[i]);
}

template <int DT>
void sum_dt(const void* rowsv, uint64_t d, const int64_t* inverse,
            const std::vector<int64_t>& seg_rows, uint64_t n_unique, void* outv, double* spans) {
  using raw_t = typename Elem<DT>::raw_t;
  constexpr bool kF32 = DT == HL_FLOAT32;
  const raw_t* rows = static_cast<const raw_t*>(rowsv);
  // float32 sums straight into out; the 16-bit ones in float, each row widened on the way
  Buffer<float> wide(kF32 ? 0 : n_unique * d), row(kF32 ? 0 : d);
  float* acc = kF32 ? static_cast<float*>(outv) : wide.data();
  // Numbers come in order of first occurrence: the next new one is `next`, and any other is
  // one met already (a larger one is not number_keys' numbering).
  uint64_t start = 0, next = 0;
  for (size_t k = 0; k < seg_rows.size(); ++k) {
    const uint64_t n = (uint64_t)seg_rows[k];
    if (spans) {
      double lo = INFINITY, hi = -INFINITY;
      if (n && d) cpu::finite_range(DT, rows + start * d, n * d, &lo, &hi);
      spans[k] = lo <= hi ? hi - lo : NAN;
    }
    for (uint64_t r = start; r < start + n; ++r) {
      const uint64_t u = (uint64_t)inverse[r];
      if (u > next || u >= n_unique)
        throw ArgumentError("row " + std::to_string(r) + " has number " +
                            std::to_string(inverse[r]) + ", expected a number met before or " +
                            std::to_string(next) + " (numbered by first occurrence, below " +
                            std::to_string(n_unique) + ")");
      const float* x = kF32 ? reinterpret_cast<const float*>(rows + r * d) : row.data();
      if constexpr (!kF32) widen<DT>(rows + r * d, d, row.data());
      if (u == next) {
        start_f32(acc + u * d, x, d);
        ++next;
      } else {
        add_f32(acc + u * d, x, d);
      }
    }
    start += n;
  }
  if (next != n_unique)
    throw ArgumentError("the rows have " + std::to_string(next) + " numbers, expected " +
                        std::to_string(n_unique));
  if constexpr (!kF32) {
    raw_t* out = static_cast<raw_t*>(outv);
    for (uint64_t i = 0; i < n_unique * d; ++i) out[i] = Elem<DT>::from_float(acc[i]);
  }
}

}  // namespace

std::vector<uint64_t> number_keys(const int64_t* keys, const std::vector<int64_t>& seg_rows,
                                  int64_t* inverse, int64_t* first) {
  int64_t most = 0;
  for (size_t k = 0; k < seg_rows.size(); ++k) {
    if (seg_rows[k] < 0 || seg_rows[k] > (int64_t)UINT32_MAX)  // numbers fit 32 bits
      throw ArgumentError("segment " + std::to_string(k) + " has " +
                          std::to_string(seg_rows[k]) + " rows, expected 0 to 2^32 - 1");
    most = std::max(most, seg_rows[k]);
  }
  // A segment's keys in an open-addressing table at a load under one half, sized for it: a
  // training step's segments (hundreds of rows) stay in L1. The codec's row numbering, general
  // over rows, took 18-24 ns a key here, this 7-11.
  constexpr uint32_t kFree = UINT32_MAX;
  uint64_t most_cap = 16;
  while (most_cap < 2 * (uint64_t)most) most_cap *= 2;
  Buffer<int64_t> slot_key(most_cap);
  Buffer<uint32_t> slot_number(most_cap);
  std::vector<uint64_t> counts;
  counts.reserve(seg_rows.size());
  uint64_t start = 0, base = 0;
  for (size_t k = 0; k < seg_rows.size(); ++k) {
    const uint64_t n = (uint64_t)seg_rows[k];
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    std::fill(slot_number.data(), slot_number.data() + cap, kFree);
    uint32_t count = 0;
    for (uint64_t r = 0; r < n; ++r) {
      const int64_t key = keys[start + r];
      uint64_t s = mix64((uint64_t)key) & (cap - 1);
      while (slot_number[s] != kFree && slot_key[s] != key) s = (s + 1) & (cap - 1);
      if (slot_number[s] == kFree) {
        slot_key[s] = key;
        slot_number[s] = count;
        first[base + count++] = (int64_t)(start + r);
      }
      inverse[start + r] = (int64_t)(base + slot_number[s]);
    }
    counts.push_back(count);
    start += n;
    base += count;
  }
  return counts;
}

void sum_rows(uint8_t dtype, const void* rows, uint64_t row_len, const int64_t* inverse,
              const std::vector<int64_t>& seg_rows, uint64_t n_unique, void* out, double* spans) {
  check_dtype_code(dtype);
  for (size_t k = 0; k < seg_rows.size(); ++k)
    if (seg_rows[k] < 0)
      throw ArgumentError("segment " + std::to_string(k) + " has " +
                          std::to_string(seg_rows[k]) + " rows, expected 0 or more");
#define CALL(DT) sum_dt<DT>(rows, row_len, inverse, seg_rows, n_unique, out, spans)
  switch (dtype) {
    case HL_FLOAT32: CALL(HL_FLOAT32); break;
    case HL_FLOAT16: CALL(HL_FLOAT16); break;
    default: CALL(HL_BFLOAT16);
  }
#undef CALL
}

void expand_rows(uint8_t dtype, const void* sums, uint64_t row_len, const int64_t* inverse,
                 const int64_t* first, uint64_t n_rows, uint64_t n_unique, void* out) {
  check_dtype_code(dtype);
  const uint64_t row_bytes = row_len * hl_elem_bytes(dtype);
  const uint8_t* from = static_cast<const uint8_t*>(sums);
  uint8_t* to = static_cast<uint8_t*>(out);
  for (uint64_t r = 0; r < n_rows; ++r) {
    const uint64_t u = (uint64_t)inverse[r];
    if (u >= n_unique)
      throw ArgumentError("row " + std::to_string(r) + " has number " +
                          std::to_string(inverse[r]) + ", expected one below " +
                          std::to_string(n_unique));
    if ((uint64_t)first[u] == r)
      memcpy(to + r * row_bytes, from + u * row_bytes, row_bytes);
    else
      memset(to + r * row_bytes, 0, row_bytes);
  }
}

}  // namespace keyed
}  // namespace hl
