// The CUDA codec's host runtime: the device scope of a call, the per-device caching pool that
// a Workspace draws from in stream order when the caller gives neither memory nor an
// allocator, and the pinned staging buffer of the few device-to-host copies (codec_cuda.cuh).
#include <string.h>

#include <map>
#include <mutex>

#include "codec_cuda.cuh"

namespace hl {
namespace gpu {

DeviceScope::DeviceScope(const void* ptr, const char* what) {
  cudaPointerAttributes attr;
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();  // clear the sticky-free error of a failed query
    throw ArgumentError(std::string(what) + " is not CUDA device memory");
  }
  HL_CUDA_CHECK(cudaGetDevice(&previous_));
  device_ = attr.device;
  if (device_ != previous_) HL_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

namespace {

// Freed scratch stays in the pool up to this many bytes, so that steady-state calls allocate
// without going to the driver; memory beyond it goes back at the next synchronization.
constexpr uint64_t kPoolKeepBytes = 2ull << 30;

cudaMemPool_t device_pool(int device) {
  static std::mutex mu;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool;
  HL_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep = kPoolKeepBytes;
  HL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  pools[device] = pool;
  return pool;
}

struct PinnedBuffer {
  void* p = nullptr;
  uint64_t cap = 0;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};
thread_local PinnedBuffer t_staging;

// The pinned buffer of this thread's uploads to a device and the event of its last copy (an
// event belongs to one device): a pageable host-to-device copy would wait for the caller's
// whole stream first, this waits (rarely) only for the previous upload out of the same buffer.
struct UploadBuffer : PinnedBuffer {
  cudaEvent_t done = nullptr;
  ~UploadBuffer() {
    if (done) cudaEventDestroy(done);
  }
};
thread_local std::map<int, UploadBuffer> t_uploads;

// Grows buf to hold `bytes` (its contents are not kept).
void reserve_pinned(PinnedBuffer* buf, uint64_t bytes) {
  if (buf->cap >= bytes) return;
  if (buf->p) HL_CUDA_CHECK(cudaFreeHost(buf->p));
  buf->p = nullptr;
  buf->cap = 0;
  const uint64_t cap = bytes < 4096 ? 4096 : bytes;
  HL_CUDA_CHECK(cudaMallocHost(&buf->p, cap));
  buf->cap = cap;
}

}  // namespace

void* pool_alloc(uint64_t bytes, cudaStream_t stream) {
  int device;
  HL_CUDA_CHECK(cudaGetDevice(&device));
  void* p = nullptr;
  HL_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, device_pool(device), stream));
  return p;
}

Workspace::~Workspace() {
  if (base_ && owned_) cudaFreeAsync(base_, stream_);
}

void Workspace::allocate() {
  if (given_) {
    if (given_bytes_ < bytes_)
      throw ArgumentError("scratch of " + std::to_string(given_bytes_) +
                          " bytes, the call needs " + std::to_string(bytes_));
    base_ = given_;
  } else if (alloc_) {
    base_ = alloc_(bytes_);
    // Pieces sit at 256-byte offsets from the base (torch allocates at 512-byte alignment).
    if (!base_ || reinterpret_cast<uintptr_t>(base_) % 256)
      throw ArgumentError("the scratch allocator returned " +
                          std::to_string(reinterpret_cast<uintptr_t>(base_)) + " for " +
                          std::to_string(bytes_) +
                          " bytes, expected a non-null 256-byte aligned device pointer");
  } else {
    base_ = pool_alloc(bytes_, stream_);
    owned_ = true;
  }
  for (const Piece& p : pieces_) *p.target = static_cast<uint8_t*>(base_) + p.offset;
}

void upload(void* dst_dev, const void* src, uint64_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  int device;
  HL_CUDA_CHECK(cudaGetDevice(&device));
  UploadBuffer& up = t_uploads[device];
  if (!up.done) HL_CUDA_CHECK(cudaEventCreateWithFlags(&up.done, cudaEventDisableTiming));
  HL_CUDA_CHECK(cudaEventSynchronize(up.done));  // the buffer's previous copy
  reserve_pinned(&up, bytes);
  memcpy(up.p, src, bytes);
  HL_CUDA_CHECK(cudaMemcpyAsync(dst_dev, up.p, bytes, cudaMemcpyHostToDevice, stream));
  HL_CUDA_CHECK(cudaEventRecord(up.done, stream));
}

const void* fetch(const void* src_dev, uint64_t bytes, cudaStream_t stream) {
  reserve_pinned(&t_staging, bytes);
  HL_CUDA_CHECK(cudaMemcpyAsync(t_staging.p, src_dev, bytes, cudaMemcpyDeviceToHost, stream));
  HL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return t_staging.p;
}

}  // namespace gpu
}  // namespace hl
