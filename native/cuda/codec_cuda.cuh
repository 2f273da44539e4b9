// Internal host-side pieces of the CUDA codec (native/cuda/): error checks, kernel launches,
// the stream-ordered workspace and pinned staging for the few device-to-host copies (runtime.cu),
// and what the stages call of each other.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>
#include <utility>
#include <vector>

#include "codec.h"
#include "codec_common.h"
#include "codec_cuda.h"
#include "device_frames.h"

namespace hl {
namespace gpu {

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

// ---- segments (encode.cu), framed by frames.cu ----------------------------------------------

// One segment for the device encoder: a tensor of `shape` at x_dev coded with p (level 1, no
// dither: the host codec writes the others), its payload (map, code, outliers) written at
// payload_dev, which has room for segment_slot_bytes(shape).
struct SegmentJob {
  const void* x_dev;
  CompressParams p;
  std::vector<int64_t> shape;
  uint8_t* payload_dev;
};
// What the device found of a segment (the descriptor's fields and the payload's size), and
// whether a relative bound times the finite range [lo, hi] overflowed a double.
struct SegmentResult : SegmentFound {
  bool bound_overflow = false;
  double lo = 0, hi = 0;
};
uint64_t segment_slot_bytes(const std::vector<int64_t>& shape);
// Enqueues every segment on the stream and returns once their results are on the host (one
// device-to-host copy, two when a lossy segment had to be coded again lossless).
std::vector<SegmentResult> encode_segments(const std::vector<SegmentJob>& segs,
                                           cudaStream_t stream);

// ---- checks (check.cu) -----------------------------------------------------------------------

// XORs the piece terms (frame_fields.h) of the n device bytes at p_dev into *terms_dev, on
// the stream; crc32c_finish(terms, n) is their CRC32C.
void crc32c_terms_dev(const uint8_t* p_dev, uint64_t n, uint32_t* terms_dev, cudaStream_t stream);
// CRC32C of n device bytes.
uint32_t crc32c_dev(const uint8_t* p_dev, uint64_t n, cudaStream_t stream);
// FrameError ("truncated", as the CPU decoder says) for fewer bytes than any frame has, before
// anything is read from the device.
void check_frame_size(uint64_t size);
// The CRC32C a frame of `size` bytes stores, from its first head_len bytes; FrameError unless
// they are a frame's and its total is `size`.
uint32_t stored_crc(const uint8_t* head, uint64_t head_len, uint64_t size);
// FrameError naming both CRCs, as verify_frame (frame_io.h) does.
[[noreturn]] void crc_mismatch(uint32_t computed, uint32_t stored);

}  // namespace gpu
}  // namespace hl
