// Level-2 entropy stage on the host: rANS over zigzag codes (layout in codec_common.h).
#pragma once

#include <vector>

#include "codec.h"

namespace hl {

// Encodes n codes into a level-2 code section: v1's layout, or (compact) format 2's.
std::vector<uint8_t> rans_encode(const uint32_t* z, uint64_t n, int threads, bool compact = false);

// The parts of a level-2 section of len bytes for n codes before its streams, read and
// validated (both layouts): frequencies and their cumulative sums (summing to 2^HL_RANS_BITS),
// the escaped values in code order, and stream k at [data_off + start[k], data_off +
// start[k + 1]) of the section. The CUDA decoder reads v2 sections with it. Throws FrameError.
struct RansLayout {
  uint32_t freq[256];
  uint32_t cum[257];
  std::vector<uint32_t> escapes;
  std::vector<uint64_t> start;  // n_streams + 1
  uint64_t data_off = 0;
};
RansLayout rans_layout(const uint8_t* in, uint64_t len, uint64_t n, bool compact);

// Decodes a level-2 code section of exactly len bytes into n codes. Throws FrameError.
void rans_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* z, int threads,
                 bool compact = false);

}  // namespace hl
