// Device helpers shared by the CUDA encoder (codec_cuda.cu) and decoder (codec_cuda_decode.cu):
// grid-stride loops, unaligned little-endian access, block reductions, the v1 checksum's
// per-thread share, the cub calls with their scratch-size queries, the dtype switch, and the
// rANS stream layout both sides of the coder use.
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

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __host__ __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// Word i of a frame of `total` bytes, the tail zero-padded (as checksum_with_zero_field reads).
template <bool kAligned>
__device__ __forceinline__ uint64_t frame_word(const uint8_t* f, uint64_t i, uint64_t total) {
  const uint64_t off = 8 * i;
  if (off + 8 <= total)
    return kAligned ? *reinterpret_cast<const uint64_t*>(f + off) : get_le(f + off, 8);
  return get_le(f + off, (int)(total - off));
}

// The checksum field lies in word 1 (bytes 8..15); this mask clears it.
static_assert(offsetof(HlFrameHeader, checksum) >= 8 && offsetof(HlFrameHeader, checksum) <= 12,
              "the checksum field must lie within word 1");
constexpr uint64_t kChecksumFieldClear =
    ~(0xffffffffull << (8 * (offsetof(HlFrameHeader, checksum) - 8)));

// This thread's share of the checksum sum over the frame's words. zero_field: read the
// checksum field as zero.
template <bool kAligned>
__device__ uint64_t checksum_share(const uint8_t* f, uint64_t total, bool zero_field) {
  uint64_t sum = 0;
  const uint64_t words = hl_div_up(total, 8);
  HL_GRID_STRIDE(i, words) {
    uint64_t w = frame_word<kAligned>(f, i, total);
    if (zero_field && i == 1) w &= kChecksumFieldClear;
    sum += checksum_term(w, i);
  }
  return sum;
}

// ---- the cub calls (each also asked for its scratch size with a null pointer) ----------------

inline cudaError_t cub_sort_pairs(void* tmp, size_t& bytes, const uint32_t* keys_in, uint32_t* keys_out,
                           const uint32_t* vals_in, uint32_t* vals_out, uint64_t n,
                           cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys_in, keys_out, vals_in, vals_out,
                                         (int64_t)n, 0, 32, s);
}
template <typename T>
cudaError_t cub_exclusive_sum(void* tmp, size_t& bytes, const T* in, T* out, uint64_t n,
                              cudaStream_t s) {
  return cub::DeviceScan::ExclusiveSum(tmp, bytes, in, out, (int64_t)n, s);
}
inline cudaError_t cub_prefix_max(void* tmp, size_t& bytes, const uint32_t* in, uint32_t* out,
                           uint64_t n, cudaStream_t s) {
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

// ---- rANS streams (encoder and decoder) ----------------------------------------------------

// Streams encoded by one block of the encoder, and the shared-memory stride of one stream's
// symbols: 4 bytes of padding put the lanes' reads of the same position in different banks.
constexpr unsigned kEncodeStreams = 32;
constexpr unsigned kEncodeThreads = 512;  // all copy symbols in; the first kEncodeStreams encode
constexpr uint64_t kSymStride = HL_RANS_CHUNK + 4;
constexpr size_t kEncodeSmem = kEncodeStreams * kSymStride;
static_assert(HL_RANS_CHUNK % 4 == 0 && kSymStride % 4 == 0, "symbols move 4 at a time");

}  // namespace gpu
}  // namespace hl
