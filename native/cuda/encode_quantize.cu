// The encoder's first stage (encode_stages.cuh): the segment's bound and its codes.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

__global__ void init_state_kernel(EncodeState* st) {
  uint64_t* w = reinterpret_cast<uint64_t*>(st);
  for (uint64_t i = threadIdx.x; i < sizeof(EncodeState) / 8; i += blockDim.x) w[i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    st->lo_key = order_key(INFINITY);
    st->hi_key = order_key(-INFINITY);
  }
}

template <int DT>
__global__ void finite_range_kernel(const typename Elem<DT>::raw_t* x, uint64_t n,
                                    EncodeState* st) {
  double lo = INFINITY, hi = -INFINITY;
  HL_GRID_STRIDE(i, n) {
    double v = Elem<DT>::to_double(x[i]);
    if (isfinite(v)) {
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  lo = block_reduce(lo, (double)INFINITY, [](double a, double b) { return b < a ? b : a; });
  __syncthreads();  // block_reduce's shared partials are reused
  hi = block_reduce(hi, (double)-INFINITY, [](double a, double b) { return b > a ? b : a; });
  if (threadIdx.x == 0 && lo <= hi) {
    atomicMin(&st->lo_key, order_key(lo));
    atomicMax(&st->hi_key, order_key(hi));
  }
}

// The bound on the device by the CPU encoder's rule (absolute_bound, arguments.h), rounded to
// the 24 bits the frame stores (the codes use exactly the stored bound, as the CPU encoder's
// do), and the lossless decision.
__global__ void prepare_kernel(EncodeState* st, double eb_param, bool rel, bool ranged,
                               bool force_lossless, bool dither, uint32_t seed) {
  double lo = 0, hi = 0;
  if (ranged) {
    lo = from_order_key(st->lo_key);
    hi = from_order_key(st->hi_key);
  }
  double eb = absolute_bound(rel, eb_param, lo, hi);
  if (!isfinite(eb)) {
    st->error |= kEncodeBoundOverflow;
    eb = 0;
  }
  st->bound = hl_bound_code(eb);
  eb = hl_bound_of_code(st->bound);
  const ElementRule r = element_rule(eb, force_lossless, dither, seed);
  st->eb_abs = eb;
  st->step = 2.0 * eb;
  st->inv_step = 1.0 / st->step;
  st->lossless = r.lossless;
  st->dithered = r.dithered;
  st->seed = seed;
}

// Codes (zigzag, or kOutlierMark) and row outlier flags exactly as quantize_all, element i
// offset by its dither when the segment is dithered; raw bits when lossless (element_code of
// elements.h). row_outlier must be zeroed.
template <int DT>
__global__ void quantize_kernel(const typename Elem<DT>::raw_t* x, uint64_t n, uint64_t row_len,
                                const EncodeState* st, uint32_t* codes, uint8_t* row_outlier) {
  const ElementRule rule = rule_of(st);
  HL_GRID_STRIDE(i, n) {
    const uint32_t z = element_code<DT>(rule, x[i], i);
    codes[i] = z;
    if (!rule.lossless && z == kOutlierMark) row_outlier[i / row_len] = 1;
  }
}

// A 32-bit hash of each row's content: its codes and, at outliers, the raw bits (two rows that
// differ only in outlier values would otherwise always collide). Summing per-element mixes

}  // namespace

void enqueue_quantize(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                      bool force_lossless, cudaStream_t stream) {
  const uint64_t n = j.n(), elem_grid = grid_for(n, kThreads);
  launch("init_state", init_state_kernel, 1, kThreads, stream, st);
  const bool ranged = j.mode == HL_MODE_REL && j.eb > 0;
  with_dtype(j.dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    const auto* x = static_cast<const typename Elem<DT>::raw_t*>(j.x_dev);
    if (ranged)
      launch("finite_range", finite_range_kernel<DT>, elem_grid, kThreads, stream, x, n, st);
    launch("prepare", prepare_kernel, 1, 1, stream, st, j.eb, j.mode == HL_MODE_REL, ranged,
           force_lossless, j.dither, j.seed);
    if (j.n_rows) HL_CUDA_CHECK(cudaMemsetAsync(s.row_outlier, 0, j.n_rows, stream));
    launch("quantize", quantize_kernel<DT>, elem_grid, kThreads, stream, x, n, j.row_len, st,
           s.codes, s.row_outlier);
  });
}

}  // namespace gpu
}  // namespace hl
