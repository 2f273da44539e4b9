// Short-block level-1 code sections on the host (frame.h "Short-block section"): the widths of
// blocks of 16 and of 32 codes from one pass over the codes (so sizing every packing costs the
// encoder what sizing block packing did), the writer, and a decoder that hands the codes to a
// sink a chunk at a time (as unpack_blocks_to), so no array of all codes is made.
#pragma once

#include <stdint.h>

#include "pack.h"

namespace hl {

// One pass over n codes: w16[b] the bit width of short block b (16 codes), w32[b] that of block
// packing's block b (32 codes; the larger of its two halves), and the largest code.
void level1_widths(const uint32_t* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
                   int threads);
// The same of codes held as bytes (lossy codes below 256: the encoder's usual case, a quarter of
// the memory traffic).
void level1_widths(const uint8_t* v, uint64_t n, uint8_t* w16, uint8_t* w32, uint32_t* max_code,
                   int threads);

// Bytes of the short-block section of n >= 1 codes with these widths (all at most
// HL_SHORT_MAX_WIDTH: the largest code below 2^15).
uint64_t short_bytes(const uint8_t* w16, uint64_t n);

// Writes the section: short_bytes(w16, n) bytes at out.
void short_write(const uint32_t* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads);
void short_write(const uint8_t* v, uint64_t n, const uint8_t* w16, uint8_t* out, int threads);

// Decodes the short-block section [in, in + len) of n >= 1 codes (its first byte the mark),
// handing runs of consecutive codes to sink (from several threads when threaded). FrameError,
// naming `what`, for a nonzero padding nibble or a length other than the widths announce.
void short_unpack_to(const uint8_t* in, uint64_t len, uint64_t n, const char* what, int threads,
                     ChunkSink sink);

}  // namespace hl
