// Internal to the CPU codec (the encoder stages and decode.cc): scratch
// memory reused between calls and the OpenMP work split.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <new>

#include "blocks.h"

namespace hl {

// Scratch memory kept per thread between calls, on blocks.h's shelf: fresh megabytes faulted in
// cost a quarter of a 64 MB compress, and an all-to-all calls the codec every iteration with
// similar sizes. At most kPoolBytes stay cached per thread; larger blocks go back to the system. Blocks
// under kSmall come from malloc, whose heap is reused without new faults: through the shelf (a
// node allocated and a tree rebalanced a block) the dozens of small buffers of a small piece
// cost a fifth of its compress.
class ScratchPool {
 public:
  static constexpr size_t kSmall = size_t(64) << 10;
  static void* get(size_t bytes, size_t* got) {
    if (bytes < kSmall) {
      *got = bytes;
      return ::operator new(bytes);
    }
    void* p;
    if (instance().shelf.take(bytes, &p, got)) return p;
    return fresh(bytes, got);
  }
  static void put(void* p, size_t bytes) {
    if (bytes < kSmall) {
      ::operator delete(p);
      return;
    }
    Shelf<void*>& shelf = instance().shelf;
    shelf.put(bytes, p);
    shelf.trim(kPoolBytes, release);
  }

 private:
  static constexpr size_t kPoolBytes = size_t(256) << 20;
  // Blocks from a huge page on are mapped on their own with MADV_HUGEPAGE, from 2 MiB where
  // output_blocks.cc waits for 16: the dedup table, the unique rows and codes are read at
  // random, and with 4 KiB pages most of those reads also miss the TLB; the pool keeps them, so
  // a fresh huge page's slow first touch on a VM is paid once. A block's size says how it came.
  static void* fresh(size_t bytes, size_t* got) {
    if (bytes >= kHugePage) {
      void* p = map_block(bytes, true, got);
      if (!p) throw std::bad_alloc();
      return p;
    }
    *got = bytes;
    return ::operator new(bytes);
  }
  static void release(void* p, size_t bytes) {
    if (bytes >= kHugePage)
      unmap_block(p, bytes);
    else
      ::operator delete(p);
  }
  struct Pool {
    Shelf<void*> shelf;
    ~Pool() { shelf.trim(0, release); }
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
