#include "output_blocks.h"

#include <stdint.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <new>
#include <string>

#include "codec.h"

namespace hl {
namespace {

// Blocks from this size on are mapped on their own, 2 MiB aligned, so that the cache's trim
// gives them back to the system.
constexpr size_t kMapFrom = size_t(2) << 20;
constexpr size_t kHuge = size_t(2) << 20;
// ... and from this size on with MADV_HUGEPAGE. A transparent huge page is one fault instead of
// 512, but on a VM a huge page the guest had not used before cost 5-15 ms to touch first: a
// training's outputs (a few MB a call) filled 5.5 MB of fresh block in 14-45 ms against 3.2-3.4
// on 4 KiB pages, which put 55-105 ms (medians) on a lossy run's first step. The cache makes
// that a one-off either way; what huge pages keep buying is TLB reach, which 4 KiB pages lack
// only for blocks beyond the second-level TLB's (6-12 MiB): a 64 MB decode into a cached block
// ran at 4.6x the cast back on huge pages, 4.2x on small ones (benchmarks/RESULTS.md).
constexpr size_t kHugeFrom = size_t(16) << 20;
// Default cache: a few decoded all-to-all outputs of 64 MB, a small share of a training host.
constexpr size_t kDefaultLimit = size_t(256) << 20;

struct Cache {
  std::mutex lock;
  std::multimap<size_t, OutputBlock> blocks;  // by capacity
  size_t held = 0;
  size_t limit = kDefaultLimit;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: arrays may be freed at interpreter exit
  return *c;
}

void free_block(const OutputBlock& b) {
  if (b.mapped)
    munmap(b.data, b.capacity);
  else
    ::operator delete(b.data, std::align_val_t(64));
}

OutputBlock new_block(size_t bytes) {
  OutputBlock b;
  if (bytes < kMapFrom) {
    b.capacity = bytes ? bytes : 1;
    b.data = ::operator new(b.capacity, std::align_val_t(64), std::nothrow);
  } else {
    // Map one huge page more than needed and trim, so the block starts on a huge page.
    const size_t cap = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = mmap(nullptr, cap + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      const uintptr_t start = ((uintptr_t)p + kHuge - 1) / kHuge * kHuge;
      const size_t head = start - (uintptr_t)p;
      if (head) munmap(p, head);
      if (kHuge - head) munmap((void*)(start + cap), kHuge - head);
#ifdef MADV_HUGEPAGE
      if (cap >= kHugeFrom)  // advice only: without THP it is 4 KiB pages
        madvise((void*)start, cap, MADV_HUGEPAGE);
#endif
      b.data = (void*)start;
      b.capacity = cap;
      b.mapped = true;
    }
  }
  if (!b.data)
    throw CodecError("cannot allocate " + std::to_string(bytes) + " bytes for decoded frames");
  return b;
}

void trim_locked(Cache& c) {
  while (c.held > c.limit) {  // the largest blocks go first
    auto last = std::prev(c.blocks.end());
    c.held -= last->first;
    free_block(last->second);
    c.blocks.erase(last);
  }
}

}  // namespace

OutputBlock acquire_output(size_t bytes) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> g(c.lock);
    auto it = c.blocks.lower_bound(bytes ? bytes : 1);
    if (it != c.blocks.end() && it->first <= 2 * bytes + 4096) {
      OutputBlock b = it->second;
      c.held -= it->first;
      c.blocks.erase(it);
      return b;
    }
  }
  return new_block(bytes);
}

void release_output(const OutputBlock& block) {
  if (!block.data) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  if (block.capacity > c.limit) {
    free_block(block);
    return;
  }
  c.blocks.emplace(block.capacity, block);
  c.held += block.capacity;
  trim_locked(c);
}

void set_output_cache_limit(size_t bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  c.limit = bytes;
  trim_locked(c);
}

size_t output_cache_limit() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  return c.limit;
}

size_t output_cache_held() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  return c.held;
}

}  // namespace hl
