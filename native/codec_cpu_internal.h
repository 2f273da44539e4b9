// Internal to the CPU codec (codec_cpu.cc encodes, codec_cpu_decode.cc decodes): scratch
// memory reused between calls and the OpenMP work split.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <iterator>
#include <map>
#include <new>

namespace hl {

// Scratch memory kept per thread between calls. Fresh megabytes from the allocator arrive as
// untouched pages, and faulting them in cost a quarter of a 64 MB compress; an all-to-all calls
// the codec every iteration with similar sizes, so blocks are reused. At most kPoolBytes stay
// cached per thread; larger blocks go back to the system.
class ScratchPool {
 public:
  static void* get(size_t bytes, size_t* got) {
    Pool& pool = instance();
    auto it = pool.blocks.lower_bound(bytes);
    if (it != pool.blocks.end() && it->first <= 2 * bytes + 4096) {
      void* p = it->second;
      *got = it->first;
      pool.cached -= it->first;
      pool.blocks.erase(it);
      return p;
    }
    *got = bytes;
    return ::operator new(bytes);
  }
  static void put(void* p, size_t bytes) {
    Pool& pool = instance();
    pool.blocks.emplace(bytes, p);
    pool.cached += bytes;
    while (pool.cached > kPoolBytes) {  // drop the largest blocks first
      auto last = std::prev(pool.blocks.end());
      pool.cached -= last->first;
      ::operator delete(last->second);
      pool.blocks.erase(last);
    }
  }

 private:
  static constexpr size_t kPoolBytes = size_t(256) << 20;
  struct Pool {
    std::multimap<size_t, void*> blocks;
    size_t cached = 0;
    ~Pool() {
      for (auto& b : blocks) ::operator delete(b.second);
    }
  };
  static Pool& instance() {
    static thread_local Pool pool;
    return pool;
  }
};

// A scratch array left uninitialised: every element is written before it is read, and zeroing
// tens of megabytes first costs as much as quantizing them.
template <typename T>
class Buffer {
 public:
  explicit Buffer(uint64_t n = 0) {
    if (n) p_ = static_cast<T*>(ScratchPool::get(n * sizeof(T), &bytes_));
  }
  Buffer(Buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](uint64_t i) { return p_[i]; }
  const T& operator[](uint64_t i) const { return p_[i]; }

 private:
  void release() {
    if (p_) ScratchPool::put(p_, bytes_);
    p_ = nullptr;
  }
  T* p_ = nullptr;
  size_t bytes_ = 0;
};

// A section's bytes in scratch memory.
struct Bytes {
  Buffer<uint8_t> buf;
  uint64_t n = 0;
  Bytes() = default;
  explicit Bytes(uint64_t size) : buf(size), n(size) {}
  uint8_t* data() { return buf.data(); }
  const uint8_t* data() const { return buf.data(); }
  uint64_t size() const { return n; }
  bool empty() const { return n == 0; }
};

// Work split for OpenMP: rows [lo, hi) of thread t of nt.
inline void split_range(uint64_t n, int t, int nt, uint64_t* lo, uint64_t* hi) {
  *lo = n * t / nt;
  *hi = n * (t + 1) / nt;
}

}  // namespace hl
