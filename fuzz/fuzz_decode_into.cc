// libFuzzer harness for the transport's decoder, hl::decompress_into_cpu (native only): what a
// receiver runs on the bytes its peers sent, so it sees the most hostile input.
//
// Contract under test: whatever the bytes and whatever the sources claim, decompress_into_cpu
// returns one message per source (empty when it decoded) or throws hl::ArgumentError for bad
// arguments; it never reads or writes out of bounds (the output is an exact-size heap block),
// hits undefined behaviour, hangs or throws anything else.
//
// The input is a receive buffer. The harness walks it by the frames' total_bytes fields (under
// -DHL_FUZZ_PATCH=1 it first reseals each frame so walked: CRC32C recomputed), cuts the frames
// into two sources, takes dtype and row shape from the first frame and asks for the rows the
// headers announce, then again for one row fewer (a peer announcing what its frames do not
// hold).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "codec.h"
#include "crc32c.h"

#ifndef HL_FUZZ_PATCH
#define HL_FUZZ_PATCH 0
#endif

namespace {

constexpr uint64_t kMaxOutputBytes = 64ull << 20;

// Frame boundaries by total_bytes (the rest of the buffer is one frame once a total does not
// fit); each walked frame resealed in the patched build.
std::vector<uint64_t> walk(std::vector<uint8_t>* buf) {
  std::vector<uint64_t> starts;
  uint64_t at = 0;
  while (at + HL_FRAME_PREFIX < buf->size() && starts.size() < 64) {
    uint64_t total = 0;
    uint32_t crc = 0;
    const uint64_t left = buf->size() - at;
    if (!hl::peek_frame_total(buf->data() + at, left, &total, &crc) || total > left) total = left;
    if (HL_FUZZ_PATCH) {
      const uint32_t sum = hl::crc32c(buf->data() + at + HL_FRAME_PREFIX, total - HL_FRAME_PREFIX);
      hl::put_fixed_le(buf->data() + at + 3, sum, 4);
    }
    starts.push_back(at);
    at += total;
  }
  starts.push_back(at);
  return starts;
}

void run(const std::vector<uint8_t>& buf, const std::vector<uint64_t>& starts, int64_t less) {
  if (starts.size() < 2) return;
  hl::FrameView first;
  try {
    first = hl::parse_frame(buf.data(), starts[1]);
  } catch (const hl::FrameError&) {
    return;
  }
  if (first.ndim == 0) return;  // a 0-d frame is not a piece of rows
  const std::vector<int64_t>& trailing = first.trailing;
  uint64_t row_bytes = hl_elem_bytes(first.dtype);
  for (int64_t t : trailing) row_bytes *= (uint64_t)t;
  // Two sources: the first frame, then every other one; rows as the headers say.
  const size_t n = starts.size() - 1;
  std::vector<hl::DecodeSource> sources;
  int64_t total_rows = 0;
  for (size_t s = 0; s < 2; ++s) {
    size_t lo = s == 0 ? 0 : 1, hi = s == 0 ? 1 : n;
    if (lo >= hi) break;
    int64_t rows = 0;
    for (size_t k = lo; k < hi; ++k) {
      try {
        const hl::FrameView f = hl::parse_frame(buf.data() + starts[k], starts[k + 1] - starts[k]);
        rows += f.ndim == 0 ? 1 : (int64_t)f.rows;
      } catch (const hl::FrameError&) {
        rows += 1;
      }
    }
    rows = rows > less ? rows - less : 0;
    sources.push_back({starts[lo], starts[hi] - starts[lo], rows});
    total_rows += rows;
  }
  if (row_bytes && (uint64_t)total_rows > kMaxOutputBytes / row_bytes) return;
  const uint64_t out_bytes = (uint64_t)total_rows * row_bytes;
  uint8_t* out = static_cast<uint8_t*>(malloc(out_bytes ? out_bytes : 1));
  try {
    std::vector<uint8_t> mismatched;
    auto errors = hl::decompress_into_cpu(buf.data(), buf.size(), sources, first.dtype, trailing,
                                          out_bytes ? out : nullptr, out_bytes, /*threads=*/2,
                                          &mismatched);
    if (errors.size() != sources.size()) {
      fprintf(stderr, "decompress_into_cpu returned %zu results for %zu sources\n",
              errors.size(), sources.size());
      abort();
    }
  } catch (const hl::ArgumentError&) {
  }
  free(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf(data, data + size);  // exact size: ASan sees any read past the end
  std::vector<uint64_t> starts = walk(&buf);
  run(buf, starts, 0);
  run(buf, starts, 1);
  return 0;
}
