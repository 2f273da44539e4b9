// The encoder's first stage (encode_stages.cuh): every piece's bound and codes.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

__global__ void init_state_kernel(Batch b) {
  HL_EACH_PIECE
  (void)e;
  *st = EncodeState();
  st->lo_key = order_key(INFINITY);
  st->hi_key = order_key(-INFINITY);
}

// Only a relative bound needs the range, and only when it is not 0.
HL_HD bool ranged(const DevicePiece& e) { return e.mode == HL_MODE_REL && e.eb > 0; }

template <int DT>
__global__ void finite_range_kernel(Batch b, uint64_t bpp) {
  HL_PIECE_OF_BLOCK
  if (!ranged(e)) return;
  const auto* x = static_cast<const typename Elem<DT>::raw_t*>(b.x) + e.in_off;
  double lo = INFINITY, hi = -INFINITY;
  HL_PIECE_STRIDE(i, e.n()) {
    double v = Elem<DT>::to_double(x[i]);
    if (isfinite(v)) {
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  lo = block_reduce(lo, (double)INFINITY, [](double a, double c) { return c < a ? c : a; });
  __syncthreads();  // block_reduce's shared partials are reused
  hi = block_reduce(hi, (double)-INFINITY, [](double a, double c) { return c > a ? c : a; });
  if (threadIdx.x == 0 && lo <= hi) {
    atomicMin(&st->lo_key, order_key(lo));
    atomicMax(&st->hi_key, order_key(hi));
  }
}

__global__ void prepare_kernel(Batch b) {
  HL_EACH_PIECE
  double lo = INFINITY, hi = -INFINITY;  // no range: absolute_bound's empty case
  if (ranged(e)) {
    lo = from_order_key(st->lo_key);
    hi = from_order_key(st->hi_key);
  }
  prepare_piece(st, e, lo, hi);
}

// Codes (zigzag, or kOutlierMark) and row outlier flags exactly as quantize_all, element i
// offset by its dither when the piece is dithered; raw bits when lossless (element_code of
// elements.h). row_outlier must be zeroed.
template <int DT>
__global__ void quantize_kernel(Batch b, uint64_t bpp, uint32_t* codes, uint8_t* row_outlier) {
  HL_PIECE_OF_BLOCK
  const auto* x = static_cast<const typename Elem<DT>::raw_t*>(b.x) + e.in_off;
  uint32_t* c = codes + e.elem_base;
  uint8_t* ro = row_outlier + e.row_base;
  const ElementRule rule = st->rule;
  HL_PIECE_STRIDE(i, e.n()) {
    const uint32_t z = element_code<DT>(rule, x[i], i);
    c[i] = z;
    if (!rule.lossless && z == kOutlierMark) ro[i / e.row_len] = 1;
  }
}

}  // namespace

void enqueue_quantize(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                      cudaStream_t stream) {
  const uint64_t bpp = piece_blocks(plan.max_elems, kThreads, b.n_pieces);
  launch_each_piece("init_state", init_state_kernel, b, stream);
  with_dtype(b.dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    launch_pieces("finite_range", finite_range_kernel<DT>, bpp, b, stream);
    launch_each_piece("prepare", prepare_kernel, b, stream);
    if (plan.table.rows)
      HL_CUDA_CHECK(cudaMemsetAsync(s.row_outlier, 0, plan.table.rows, stream));
    launch_pieces("quantize", quantize_kernel<DT>, bpp, b, stream, s.codes, s.row_outlier);
  });
}

}  // namespace gpu
}  // namespace hl
