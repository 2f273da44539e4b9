// Internal to the CPU codec (the encoder stages and decode.cc): scratch
// memory reused between calls and the OpenMP work split.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <iterator>
#include <map>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace hl {

// Scratch memory kept per thread between calls. Fresh megabytes from the allocator arrive as
// untouched pages, and faulting them in cost a quarter of a 64 MB compress; an all-to-all calls
// the codec every iteration with similar sizes, so blocks are reused. At most kPoolBytes stay
// cached per thread; larger blocks go back to the system. Blocks under kSmall come from malloc,
// whose heap is reused without new faults: through the pool's map (a node allocated and a tree
// rebalanced a block) the dozens of small buffers of a small piece cost a fifth of its compress.
class ScratchPool {
 public:
  static constexpr size_t kSmall = size_t(64) << 10;
  static void* get(size_t bytes, size_t* got) {
    if (bytes < kSmall) {
      *got = bytes;
      return ::operator new(bytes);
    }
    Pool& pool = instance();
    auto it = pool.blocks.lower_bound(bytes);
    if (it != pool.blocks.end() && it->first <= 2 * bytes + 4096) {
      void* p = it->second;
      *got = it->first;
      pool.cached -= it->first;
      pool.blocks.erase(it);
      return p;
    }
    return fresh(bytes, got);
  }
  static void put(void* p, size_t bytes) {
    if (bytes < kSmall) {
      ::operator delete(p);
      return;
    }
    Pool& pool = instance();
    pool.blocks.emplace(bytes, p);
    pool.cached += bytes;
    while (pool.cached > kPoolBytes) {  // drop the largest blocks first
      auto last = std::prev(pool.blocks.end());
      pool.cached -= last->first;
      release(last->second, last->first);
      pool.blocks.erase(last);
    }
  }

 private:
  static constexpr size_t kPoolBytes = size_t(256) << 20;
  // Blocks from 2 MiB on are mapped on their own, on 2 MiB boundaries, with MADV_HUGEPAGE
  // (as output_blocks.cc's): the dedup table, the unique rows and codes are read at random, and
  // with 4 KiB pages most of those reads also miss the TLB. A block's size says how it came.
  static constexpr size_t kHuge = size_t(2) << 20;
  static void* fresh(size_t bytes, size_t* got) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= kHuge) {
      const size_t cap = (bytes + kHuge - 1) / kHuge * kHuge;
      void* p = mmap(nullptr, cap + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      const uintptr_t start = ((uintptr_t)p + kHuge - 1) / kHuge * kHuge;
      const size_t head = start - (uintptr_t)p;
      if (head) munmap(p, head);
      munmap((void*)(start + cap), kHuge - head);
      madvise((void*)start, cap, MADV_HUGEPAGE);  // advice only: without THP, 4 KiB pages
      *got = cap;
      return (void*)start;
    }
#endif
    *got = bytes;
    return ::operator new(bytes);
  }
  static void release(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= kHuge) {
      munmap(p, bytes);
      return;
    }
#endif
    ::operator delete(p);
  }
  struct Pool {
    std::multimap<size_t, void*> blocks;
    size_t cached = 0;
    ~Pool() {
      for (auto& b : blocks) release(b.second, b.first);
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
  bool empty() const { return p_ == nullptr; }  // made with no elements

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
