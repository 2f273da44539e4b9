// Memory for tensors the codec decodes into and hands to Python (decompress without `out`,
// decompress_chunks). Fresh memory costs a page fault per 4 KiB page on first touch (about as
// much as decoding into it), so blocks the caller has let go of are kept, up to a settable
// total, for the next call (and the largest mapped with transparent huge pages advised).
#pragma once

#include <stddef.h>

namespace hl {

struct OutputBlock {
  void* data = nullptr;
  size_t capacity = 0;  // bytes usable at data (at least what was asked)
  bool mapped = false;  // from mmap (large blocks), else from operator new
};

// A block of at least `bytes` (64-byte aligned): a cached one whose capacity is at most twice
// `bytes`, else a new one. Throws CodecError when the system has no memory for it.
OutputBlock acquire_output(size_t bytes);

// Gives a block back: kept in the cache while the cache stays within its limit, else freed.
// Only called when nothing references the block any more (the owning array's destructor).
void release_output(const OutputBlock& block);

// Limit of the cache in bytes (0 disables it; lowering it frees blocks at once) and what it
// holds now.
void set_output_cache_limit(size_t bytes);
size_t output_cache_limit();
size_t output_cache_held();

}  // namespace hl
