// Memory blocks the CPU codec keeps between calls, for both of its caches (scratch.h's pool of
// scratch per thread, output_blocks.cc's decoded outputs): how a large block is mapped, and which
// kept block a request may take. Fresh memory costs a page fault per 4 KiB page on first touch,
// about as much as coding into it, so both keep what a call let go of for the next one.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include <iterator>
#include <map>

namespace hl {

constexpr size_t kHugePage = size_t(2) << 20;

// `bytes` rounded up to whole huge pages (*cap), mapped on its own on a huge-page boundary, so
// that the kernel may back it with transparent huge pages and unmap_block gives it back to the
// system whole. With `advise_huge`, MADV_HUGEPAGE (advice only: without THP it is 4 KiB pages).
// nullptr when the system has no memory for it.
inline void* map_block(size_t bytes, bool advise_huge, size_t* cap) {
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // One huge page more than needed, trimmed at both ends to the aligned part.
  void* p = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const uintptr_t start = ((uintptr_t)p + kHugePage - 1) / kHugePage * kHugePage;
  const size_t head = start - (uintptr_t)p;
  if (head) munmap(p, head);
  if (kHugePage - head) munmap((void*)(start + size), kHugePage - head);
#ifdef MADV_HUGEPAGE
  if (advise_huge) madvise((void*)start, size, MADV_HUGEPAGE);
#endif
  *cap = size;
  return (void*)start;
}

inline void unmap_block(void* p, size_t cap) { munmap(p, cap); }

// Blocks kept for reuse, by capacity. A request takes the smallest kept block that holds it, and
// only one at most about twice its size: a larger block would stay tied up in a small use while
// a later large request maps a new one. Over a limit, the largest blocks go first.
template <class Block>
class Shelf {
 public:
  // A kept block for `bytes` into *block (and its capacity into *cap, where the block does not
  // say it), or false.
  bool take(size_t bytes, Block* block, size_t* cap = nullptr) {
    auto it = blocks_.lower_bound(bytes);
    if (it == blocks_.end() || it->first > 2 * bytes + 4096) return false;
    *block = it->second;
    if (cap) *cap = it->first;
    held_ -= it->first;
    blocks_.erase(it);
    return true;
  }

  void put(size_t cap, const Block& block) {
    blocks_.emplace(cap, block);
    held_ += cap;
  }

  // free(block, cap) for the largest blocks until what is held is within `limit`.
  template <class Free>
  void trim(size_t limit, Free free) {
    while (held_ > limit) {
      auto last = std::prev(blocks_.end());
      held_ -= last->first;
      free(last->second, last->first);
      blocks_.erase(last);
    }
  }

  size_t held() const { return held_; }

 private:
  std::multimap<size_t, Block> blocks_;
  size_t held_ = 0;
};

}  // namespace hl
