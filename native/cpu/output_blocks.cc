#include "output_blocks.h"

#include <mutex>
#include <new>
#include <string>

#include "blocks.h"
#include "codec.h"

namespace hl {
namespace {

// Blocks from a huge page on are mapped on their own (blocks.h), so that the cache's trim gives
// them back to the system; from kHugeFrom on with MADV_HUGEPAGE. A transparent huge page is one
// fault instead of 512, but on a VM a huge page the guest had not used before cost 5-15 ms to
// touch first: a training's outputs (a few MB a call) filled 5.5 MB of fresh block in 14-45 ms
// against 3.2-3.4 on 4 KiB pages, which put 55-105 ms (medians) on a lossy run's first step. The
// cache makes that a one-off either way; what huge pages keep buying is TLB reach, which 4 KiB
// pages lack only for blocks beyond the second-level TLB's (6-12 MiB): a 64 MB decode into a
// cached block ran at 4.6x the cast back on huge pages, 4.2x on small ones
// (benchmarks/RESULTS.md).
constexpr size_t kHugeFrom = size_t(16) << 20;
// Default cache: a few decoded all-to-all outputs of 64 MB, a small share of a training host.
constexpr size_t kDefaultLimit = size_t(256) << 20;

struct Cache {
  std::mutex lock;
  Shelf<OutputBlock> shelf;
  size_t limit = kDefaultLimit;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: arrays may be freed at interpreter exit
  return *c;
}

void free_block(const OutputBlock& b, size_t = 0) {
  if (b.mapped)
    unmap_block(b.data, b.capacity);
  else
    ::operator delete(b.data, std::align_val_t(64));
}

OutputBlock new_block(size_t bytes) {
  OutputBlock b;
  if (bytes < kHugePage) {
    b.capacity = bytes ? bytes : 1;
    b.data = ::operator new(b.capacity, std::align_val_t(64), std::nothrow);
  } else {
    b.data = map_block(bytes, bytes >= kHugeFrom, &b.capacity);
    b.mapped = true;
  }
  if (!b.data)
    throw CodecError("cannot allocate " + std::to_string(bytes) + " bytes for decoded frames");
  return b;
}

}  // namespace

OutputBlock acquire_output(size_t bytes) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> g(c.lock);
    OutputBlock b;
    if (c.shelf.take(bytes ? bytes : 1, &b)) return b;
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
  c.shelf.put(block.capacity, block);
  c.shelf.trim(c.limit, free_block);
}

void set_output_cache_limit(size_t bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  c.limit = bytes;
  c.shelf.trim(c.limit, free_block);
}

size_t output_cache_limit() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  return c.limit;
}

size_t output_cache_held() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.lock);
  return c.shelf.held();
}

}  // namespace hl
