// Format 2's bucketed row map (frame.h, HL_SEG_MAP_BUCKETS): a repeat of unique row u is coded
// as the bit width b of u + 1 (rANS over at most 33 symbols, so the table stays small on a few
// hundred rows) and the b - 1 bits below its top bit, raw.
#pragma once

#include <stdint.h>

#include <vector>

namespace hl {

// The section of a map (row -> unique row, first-occurrence order) of n rows.
std::vector<uint8_t> map_buckets_encode(const uint32_t* map, uint64_t n, int threads);

// Decodes a section of exactly len bytes into n map entries (not yet checked against the
// unique-row count: the caller validates the map). Throws FrameError.
void map_buckets_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* map, int threads);

}  // namespace hl
