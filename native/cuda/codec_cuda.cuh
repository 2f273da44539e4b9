// Internal pieces of the CUDA codec (codec_cuda.cu): error checks, kernel launches, the
// stream-ordered workspace, pinned staging for the few device-to-host copies, little-endian byte
// access.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>
#include <utility>
#include <vector>

#include "codec.h"
#include "codec_common.h"

namespace hl {
namespace gpu {

// The encoder rules shared with the CPU codec (kOutlierMark, dedup_applies, dedup_pays,
// rans_symbol) live in codec_common.h.

// Worst case of one entropy-coded stream: its 4-byte state, then at most 2 bytes a code (a
// renormalization emits bytes while x >= 2^19 * freq >= 2^19, and x < 2^31).
constexpr uint64_t kRansSlotBytes = 4 + 2 * (uint64_t)HL_RANS_CHUNK;

// ---- errors and launches --------------------------------------------------------------------

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CodecError(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" +
                     cudaGetErrorString(e) + ")");
}
#define HL_CUDA_CHECK(call) ::hl::gpu::check_cuda((call), #call)

// Threads a block for most kernels; warp-per-item kernels get kThreads / 32 items a block.
constexpr unsigned kThreads = 256;
constexpr unsigned kWarpsPerBlock = kThreads / 32;
// Grid-stride loops cover any count; more blocks than this only add scheduling.
constexpr uint64_t kMaxGrid = 4096;

inline uint64_t grid_for(uint64_t items, uint64_t items_per_block) {
  uint64_t g = hl_div_up(items, items_per_block);
  return g < kMaxGrid ? g : kMaxGrid;
}

// Launches kernel<<<grid, block, 0, stream>>>(args...) unless grid is 0 (an empty launch is a
// CUDA error) and turns a launch failure into CodecError naming the kernel.
template <typename... KArgs, typename... Args>
void launch(const char* name, void (*kernel)(KArgs...), uint64_t grid, unsigned block,
            cudaStream_t stream, Args&&... args) {
  if (grid == 0) return;
  kernel<<<(unsigned)grid, block, 0, stream>>>(std::forward<Args>(args)...);
  check_cuda(cudaGetLastError(), name);
}

// launch() with dynamic shared memory; allows more than the default 48 KB where asked.
template <typename... KArgs, typename... Args>
void launch_smem(const char* name, void (*kernel)(KArgs...), uint64_t grid, unsigned block,
                 size_t smem, cudaStream_t stream, Args&&... args) {
  if (grid == 0) return;
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               name);
  kernel<<<(unsigned)grid, block, smem, stream>>>(std::forward<Args>(args)...);
  check_cuda(cudaGetLastError(), name);
}

// Makes the device that owns `ptr` current for the scope (the caller's current device may be
// another one) and restores the previous device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(const void* ptr, const char* what);
  ~DeviceScope();
  int device() const { return device_; }

 private:
  int previous_ = -1;
  int device_ = -1;
};

// One device allocation per call, carved into named pieces: reserve() each piece with its
// element count, allocate() once (stream-ordered, from a per-device caching pool), and the
// destructor frees it in stream order. Pieces are 256-byte aligned.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  template <typename T>
  void reserve(T** p, uint64_t count) {
    *p = nullptr;
    pieces_.push_back({reinterpret_cast<void**>(p), bytes_});
    bytes_ += (count * sizeof(T) + 255) & ~(uint64_t)255;
  }
  void reserve_bytes(void** p, uint64_t bytes) {
    *p = nullptr;
    pieces_.push_back({p, bytes_});
    bytes_ += (bytes + 255) & ~(uint64_t)255;
  }
  void allocate();

 private:
  struct Piece {
    void** target;
    uint64_t offset;
  };
  cudaStream_t stream_;
  std::vector<Piece> pieces_;
  uint64_t bytes_ = 0;
  void* base_ = nullptr;
};

// Allocates `bytes` in stream order from the device's caching pool (freed with cudaFreeAsync).
void* pool_alloc(uint64_t bytes, cudaStream_t stream);

// Copies `bytes` from the device into this thread's pinned staging buffer and waits for the
// stream: the one blocking point of each entry point. Returns the staging buffer.
const void* fetch(const void* src_dev, uint64_t bytes, cudaStream_t stream);

// ---- format-2 segments (codec_cuda.cu), framed by codec_cuda_v2.cu --------------------------

// One segment for the device encoder: a tensor of `shape` at x_dev coded with p (level 1, no
// dither: the host codec writes the others), its payload (map, code, v2 outliers) written at
// payload_dev, which has room for segment_slot_bytes(shape).
struct SegmentJob {
  const void* x_dev;
  CompressParams p;
  std::vector<int64_t> shape;
  uint8_t* payload_dev;
};
// What the device found: the descriptor's fields and the payload's size.
struct SegmentResult {
  uint64_t payload_bytes = 0, n_unique = 0, n_outliers = 0, map_bytes = 0, code_bytes = 0;
  uint32_t bound = 0;  // hl_bound_code, 0 when lossless
  bool lossless = false, identity = true;
  bool bound_overflow = false;  // a relative bound times the range overflowed a double
  int packing = 0;              // Level1Packing of the code section
};
uint64_t segment_slot_bytes(const std::vector<int64_t>& shape);
// Enqueues every segment on the stream and returns once their results are on the host (one
// device-to-host copy, two when a lossy segment had to be coded again lossless).
std::vector<SegmentResult> encode_segments(const std::vector<SegmentJob>& segs,
                                           cudaStream_t stream);

// compress_cuda of format 2 (codec_cuda_v2.cu): one tensor as a v2 frame of one segment.
uint64_t compress_v2_cuda(const void* input_dev, const CompressParams& p,
                          const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                          cudaStream_t stream);

// hl_checksum of a v1 frame on the device, its checksum field read as zero (codec_cuda.cu).
uint32_t frame_checksum_dev(const uint8_t* frame_dev, uint64_t size, cudaStream_t stream);
// XORs the piece terms (frame_v2_codec.h) of the n device bytes at p_dev into *terms_dev, on
// the stream; crc32c_finish(terms, n) is their CRC32C (codec_cuda_check.cu).
void crc32c_terms_dev(const uint8_t* p_dev, uint64_t n, uint32_t* terms_dev, cudaStream_t stream);
// CRC32C of n device bytes (codec_cuda_check.cu).
uint32_t crc32c_dev(const uint8_t* p_dev, uint64_t n, cudaStream_t stream);

}  // namespace gpu
}  // namespace hl
