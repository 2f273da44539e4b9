// Level-2 entropy stage on the host: rANS over zigzag codes (layout in codec_common.h).
#pragma once

#include <vector>

#include "codec.h"

namespace hl {

// Encodes n codes into a level-2 code section: v1's layout, or (compact) format 2's.
std::vector<uint8_t> rans_encode(const uint32_t* z, uint64_t n, int threads, bool compact = false);

// Decodes a level-2 code section of exactly len bytes into n codes. Throws FrameError.
void rans_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* z, int threads,
                 bool compact = false);

}  // namespace hl
