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
// element count, allocate() once, and the destructor frees it in stream order. The memory is
// the caller's when it gives some (hvd_lossy passes a tensor from PyTorch's caching allocator,
// sized by a first call that only reserves: bytes()) or an allocator (the batched decoder,
// whose sizes follow its host parse), else it comes stream-ordered from a per-device caching
// pool. Pieces are 256-byte aligned.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream, void* given = nullptr, uint64_t given_bytes = 0)
      : stream_(stream), given_(given), given_bytes_(given_bytes) {}
  // Memory from the caller's allocator at allocate() (an empty one: the pool).
  Workspace(cudaStream_t stream, const DeviceAlloc& alloc) : stream_(stream), alloc_(alloc) {}
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
  uint64_t bytes() const { return bytes_; }

 private:
  struct Piece {
    void** target;
    uint64_t offset;
  };
  cudaStream_t stream_;
  std::vector<Piece> pieces_;
  uint64_t bytes_ = 0;
  void* base_ = nullptr;
  void* given_ = nullptr;
  uint64_t given_bytes_ = 0;
  DeviceAlloc alloc_;
  bool owned_ = false;
};

// Allocates `bytes` in stream order from the device's caching pool (freed with cudaFreeAsync).
void* pool_alloc(uint64_t bytes, cudaStream_t stream);

// Copies `bytes` at src to the device in stream order through this thread's pinned upload
// buffer: returns without waiting for the stream (only, rarely, for the buffer's previous copy).
void upload(void* dst_dev, const void* src, uint64_t bytes, cudaStream_t stream);

// Copies `bytes` from the device into this thread's pinned staging buffer and waits for the
// stream: the one blocking point of each entry point. Returns the staging buffer.
const void* fetch(const void* src_dev, uint64_t bytes, cudaStream_t stream);

// ---- segments (encode.cu), framed by frames.cu ----------------------------------------------

// What the device found of a segment (the descriptor's fields and the payload's size), and
// whether a relative bound times the finite range [lo, hi] overflowed a double.
struct SegmentResult : SegmentFound {
  bool bound_overflow = false;
  double lo = 0, hi = 0;
};

// ---- checks (check.cu) -----------------------------------------------------------------------

// Runs the n moves at copies_dev (device_frames.h's frame_moves; the longest is `longest`
// bytes) from the heads or the payload slots into the output, one launch.
void copy_moves_dev(const FrameCopy* copies_dev, uint64_t n, uint64_t longest,
                    const uint8_t* heads_dev, const uint8_t* slots_dev, uint8_t* out_dev,
                    cudaStream_t stream);
// Takes the CRC32C of the n frames at seals_dev (the largest `largest` bytes) in the output and
// stores it in each, one launch for the terms (frame_fields.h's piecewise form: terms_dev holds
// n words) and one for the seals.
void seal_frames_dev(uint8_t* out_dev, const FrameSeal* seals_dev, uint64_t n, uint64_t largest,
                     uint32_t* terms_dev, cudaStream_t stream);
// The piecewise CRC32C terms (frame_fields.h) of the n frames at seals_dev (the largest
// `largest` bytes) of the buffer into terms_dev, one launch: crc32c_finish(terms[k], total - 7)
// is frame k's CRC32C.
void frame_terms_dev(const uint8_t* buf_dev, const FrameSeal* seals_dev, uint64_t n,
                     uint64_t largest, uint32_t* terms_dev, cudaStream_t stream);
// CRC32C of n device bytes.
uint32_t crc32c_dev(const uint8_t* p_dev, uint64_t n, cudaStream_t stream);
// FrameError ("truncated", as the CPU decoder says) for fewer bytes than any frame has, before
// anything is read from the device.
void check_frame_size(uint64_t size);
// The CRC32C a frame of `size` bytes stores, from its first head_len bytes; FrameError unless
// they are a frame's and its total is `size`.
uint32_t stored_crc(const uint8_t* head, uint64_t head_len, uint64_t size);

}  // namespace gpu
}  // namespace hl
