// The statistics of pieces without coding them (piece_stats_cpu, codec.h), by the passes the
// encoder itself uses.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "codec.h"
#include "encode_stages.h"
#include "parallel.h"
#include "pieces.h"

namespace hl {
namespace {

using enc::Tensor;

template <int DT>
void one_piece_stats(const Tensor<DT>& t, int threads, bool range_only, double* s) {
  double lo = INFINITY, hi = -INFINITY;
  if (range_only) {
    if (t.n_rows * t.row_len > 0) enc::finite_range(t, threads, &lo, &hi);
    for (int k = 0; k < HL_STATS_PER_PIECE; ++k) s[k] = NAN;
    s[HL_STAT_MIN] = lo <= hi ? lo : NAN;
    s[HL_STAT_MAX] = lo <= hi ? hi : NAN;
    return;
  }
  if (dedup_applies(true, t.n_rows, t.row_len)) {
    s[HL_STAT_UNIQUE] = (double)enc::distinct_raw_rows(t, true, threads, &lo, &hi).first.size();
  } else {
    s[HL_STAT_UNIQUE] = (double)t.n_rows;
    if (t.n_rows * t.row_len > 0) enc::finite_range(t, threads, &lo, &hi);
  }
  s[HL_STAT_MIN] = lo <= hi ? lo : NAN;
  s[HL_STAT_MAX] = lo <= hi ? hi : NAN;
  // Moments in double, as the float64 reference would take them; non-finite elements left out
  // as the range leaves them out.
  // Branch-free so that the loop vectorises (a piece is one thread's: pieces run in parallel).
  const uint64_t n = t.n_rows * t.row_len;
  double n_fin = 0, sum = 0, sumsq = 0;
#pragma omp simd reduction(+ : n_fin, sum, sumsq)
  for (uint64_t i = 0; i < n; ++i) {
    const double v = Elem<DT>::to_double(t.x[i]);
    const bool finite = v - v == 0;  // false for NaN and +-inf
    const double m = finite ? v : 0.0;
    n_fin += finite ? 1.0 : 0.0;
    sum += m;
    sumsq += m * m;
  }
  s[HL_STAT_FINITE] = n_fin;
  s[HL_STAT_SUM] = sum;
  s[HL_STAT_SUMSQ] = sumsq;
}
}  // namespace

void piece_stats_cpu(const void* input, uint8_t dtype, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& trailing, double* stats, int threads,
                     bool range_only) {
  CompressParams p{};
  p.dtype = dtype;
  p.mode = HL_MODE_ABS;
  p.level = 1;
  const Pieces c = plan_pieces(p, rows, trailing, {});
  const uint8_t* in = static_cast<const uint8_t*>(input);
  const uint64_t eb = hl_elem_bytes(dtype);
  const enc::PieceThreads pt = enc::piece_threads(c.shapes.size(), resolve_threads(threads));
  parallel::parallel_items(c.shapes.size(), pt.across, [&](size_t i) {
    uint64_t n_rows, len;
    shape_to_rows(c.shapes[i], &n_rows, &len);
    const void* x = in + c.in_off[i] * eb;
    double* s = stats + i * HL_STATS_PER_PIECE;
    switch (dtype) {
      case HL_FLOAT32:
        return one_piece_stats(Tensor<HL_FLOAT32>{static_cast<const uint32_t*>(x), n_rows, len},
                               pt.inner, range_only, s);
      case HL_FLOAT16:
        return one_piece_stats(Tensor<HL_FLOAT16>{static_cast<const uint16_t*>(x), n_rows, len},
                               pt.inner, range_only, s);
      case HL_BFLOAT16:
        return one_piece_stats(Tensor<HL_BFLOAT16>{static_cast<const uint16_t*>(x), n_rows, len},
                               pt.inner, range_only, s);
    }
  });
}

}  // namespace hl
