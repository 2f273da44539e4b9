// Level-2 entropy stage on the host: rANS over zigzag codes (frame.h, codec_common.h).
#pragma once

#include <vector>

#include "codec.h"

namespace hl {

// Encodes n codes into a compact rANS section (frame.h). shared: code with these frequencies (normalized, 1 << HL_RANS_BITS, every
// present symbol nonzero) instead of the codes' own; the section then carries them when
// write_table, else starts with the two zero bytes of a borrowed table (frame.h).
std::vector<uint8_t> rans_encode(const uint32_t* z, uint64_t n, int threads,
                                 const uint32_t* shared = nullptr, bool write_table = true);

// The parts of a level-2 section of len bytes for n codes before its streams, read and
// validated: frequencies and their cumulative sums (summing to 2^HL_RANS_BITS),
// the escaped values in code order, and stream k at [data_off + start[k], data_off +
// start[k + 1]) of the section. The CUDA decoder reads sections with it. table: as for
// rans_decode. Throws FrameError.
struct RansLayout {
  uint32_t freq[256];
  uint32_t cum[257];
  std::vector<uint32_t> escapes;
  std::vector<uint64_t> start;  // n_streams + 1
  uint64_t data_off = 0;
};
RansLayout rans_layout(const uint8_t* in, uint64_t len, uint64_t n,
                       const uint8_t* table = nullptr, uint64_t table_len = 0);

// Decodes a level-2 code section of exactly len bytes into n codes. Throws FrameError.
// table: the section whose table a borrowing section uses (table_len bytes
// from it on), or null when borrowing is not allowed.
void rans_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* z, int threads,
                 const uint8_t* table = nullptr, uint64_t table_len = 0);

// Normalized frequencies of symbol counts (as rans_encode builds them) and the bytes of a
// compact table of them (K - 1, w, the w-bit frequencies).
void rans_freqs(const uint64_t* counts, uint32_t* freq);
uint64_t rans_table_bytes(const uint32_t* freq);
// Symbol counts of n codes (codes >= 255 count as the escape symbol).
void rans_counts(const uint32_t* z, uint64_t n, uint64_t* counts);

}  // namespace hl
