// The CUDA codec's host runtime: the device scope of a call, the per-device caching pool that
// every Workspace draws from in stream order, and the pinned staging buffer of the few
// device-to-host copies (codec_cuda.cuh).
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

}  // namespace

void* pool_alloc(uint64_t bytes, cudaStream_t stream) {
  int device;
  HL_CUDA_CHECK(cudaGetDevice(&device));
  void* p = nullptr;
  HL_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, device_pool(device), stream));
  return p;
}

Workspace::~Workspace() {
  if (base_) cudaFreeAsync(base_, stream_);
}

void Workspace::allocate() {
  base_ = pool_alloc(bytes_, stream_);
  for (const Piece& p : pieces_) *p.target = static_cast<uint8_t*>(base_) + p.offset;
}

const void* fetch(const void* src_dev, uint64_t bytes, cudaStream_t stream) {
  if (t_staging.cap < bytes) {
    if (t_staging.p) HL_CUDA_CHECK(cudaFreeHost(t_staging.p));
    t_staging.p = nullptr;
    t_staging.cap = 0;
    uint64_t cap = bytes < 4096 ? 4096 : bytes;
    HL_CUDA_CHECK(cudaMallocHost(&t_staging.p, cap));
    t_staging.cap = cap;
  }
  HL_CUDA_CHECK(cudaMemcpyAsync(t_staging.p, src_dev, bytes, cudaMemcpyDeviceToHost, stream));
  HL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return t_staging.p;
}

}  // namespace gpu
}  // namespace hl
