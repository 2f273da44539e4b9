// Device helpers shared by the CUDA encoder's stages and the decoder: grid-stride loops,
// unaligned little-endian access, block reductions, the cub calls with their scratch-size
// queries, and the dtype switch.
#pragma once

#include <cub/cub.cuh>

#include <type_traits>

#include "codec_cuda.cuh"

namespace hl {
namespace gpu {

// ---- device helpers ------------------------------------------------------------------------

constexpr uint32_t kFull = 0xffffffffu;

#define HL_GRID_STRIDE(i, n)                                                     \
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (uint64_t)gridDim.x * blockDim.x)
// Every lane of a warp gets the same w, so warp collectives inside the loop are safe.
#define HL_WARP_STRIDE(w, n)                                                          \
  for (uint64_t w = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < (n); \
       w += ((uint64_t)gridDim.x * blockDim.x) >> 5)
#define HL_BLOCK_STRIDE(b, n) for (uint64_t b = blockIdx.x; b < (n); b += gridDim.x)

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31; }

// Frames have no alignment (sections start anywhere), so multi-byte fields go byte by byte.
__device__ __forceinline__ void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
__device__ __forceinline__ uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

// Doubles mapped to unsigned integers of the same order, for atomicMin/atomicMax.
__device__ __forceinline__ unsigned long long order_key(double d) {
  unsigned long long u = (unsigned long long)__double_as_longlong(d);
  return (u >> 63) ? ~u : (u | (1ull << 63));
}
__device__ __forceinline__ double from_order_key(unsigned long long k) {
  unsigned long long u = (k >> 63) ? (k & ~(1ull << 63)) : ~k;
  return __longlong_as_double((long long)u);
}

// Reduces v over the block (blockDim.x == kThreads); the result is valid in thread 0.
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, Op op) {
  __shared__ T partial[kWarpsPerBlock];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(kFull, v, o));
  const unsigned warp = threadIdx.x >> 5;
  if (lane_id() == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane_id() < kWarpsPerBlock ? partial[lane_id()] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(kFull, v, o));
  }
  return v;
}

struct MaxOp {
  template <typename T>
  __host__ __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// ---- the cub calls (each also asked for its scratch size with a null pointer) ----------------

// Keys sort on their low end_bit bits (dedup_key_bits); the sort is stable.
inline cudaError_t cub_sort_pairs(void* tmp, size_t& bytes, const uint64_t* keys_in,
                                  uint64_t* keys_out, const uint32_t* vals_in, uint32_t* vals_out,
                                  uint64_t n, int end_bit, cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys_in, keys_out, vals_in, vals_out,
                                         (int64_t)n, 0, end_bit, s);
}
template <typename T>
cudaError_t cub_exclusive_sum(void* tmp, size_t& bytes, const T* in, T* out, uint64_t n,
                              cudaStream_t s) {
  return cub::DeviceScan::ExclusiveSum(tmp, bytes, in, out, (int64_t)n, s);
}
template <typename T>
cudaError_t cub_prefix_max(void* tmp, size_t& bytes, const T* in, T* out, uint64_t n,
                           cudaStream_t s) {
  return cub::DeviceScan::InclusiveScan(tmp, bytes, in, out, MaxOp(), (int64_t)n, s);
}

struct CubScratch {
  void* tmp = nullptr;
  size_t bytes = 0;
};

// Size query: bytes = max(bytes, what call needs).
template <typename F>
void cub_need(size_t* bytes, F call) {
  size_t b = 0;
  check_cuda(call(nullptr, b), "cub size query");
  if (b > *bytes) *bytes = b;
}
template <typename F>
void cub_run(const char* name, const CubScratch& c, F call) {
  size_t b = c.bytes;
  check_cuda(call(c.tmp, b), name);
}

// One switch from the dtype code to the element type.
template <typename F>
void with_dtype(uint8_t dtype, F&& f) {
  switch (dtype) {
    case HL_FLOAT32: f(std::integral_constant<int, HL_FLOAT32>()); return;
    case HL_FLOAT16: f(std::integral_constant<int, HL_FLOAT16>()); return;
    case HL_BFLOAT16: f(std::integral_constant<int, HL_BFLOAT16>()); return;
  }
  throw ArgumentError("unsupported dtype code " + std::to_string(dtype) +
                      ", expected float32, float16 or bfloat16");
}

}  // namespace gpu
}  // namespace hl
