// libFuzzer harness for the format-2 decoder (native only, no Python).
//
// Contract under test: whatever the bytes, hl::parse_frame, hl::decompress_cpu and
// hl::decompress_into_cpu either decode or throw hl::FrameError / hl::ArgumentError (or report
// a source's failure); they never read or write out of bounds, hit undefined behaviour, hang or
// throw anything else, and the two decoders agree.
//
// Built twice from this file (see fuzz/run.sh):
//   fuzz_decode_frame          the bytes are decoded as they are (mostly tests the header and CRC).
//   fuzz_decode_frame_patched  -DHL_FUZZ_PATCH=1: the input is the frame's body (everything after
//                           total_bytes; a seed that is a whole frame has its prefix dropped)
//                           and the harness puts the magic, the correct total and CRC32C in
//                           front, so mutations reach the descriptor, map, rANS and outlier
//                           parsers.
// Outputs above kMaxOutputBytes are not decoded (allocation size, not a parser property).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "codec.h"
#include "crc32c.h"
#include "frame_io.h"

#ifndef HL_FUZZ_PATCH
#define HL_FUZZ_PATCH 0
#endif

namespace {

constexpr uint64_t kMaxOutputBytes = 64ull << 20;

// A whole frame around `body`, as the encoder seals it.
std::vector<uint8_t> seal(const uint8_t* body, size_t n) {
  uint64_t len = 1;
  while (hl::varint_bytes(HL_FRAME_PREFIX + len + n) > len) ++len;
  const uint64_t total = HL_FRAME_PREFIX + len + n;
  std::vector<uint8_t> f(total);
  f[0] = 'H';
  f[1] = 'V';
  f[2] = HL_FRAME_VERSION;
  uint8_t* w = hl::put_varint(f.data() + HL_FRAME_PREFIX, total);
  if (n) memcpy(w, body, n);
  const uint32_t crc = hl::crc32c(f.data() + HL_FRAME_PREFIX, total - HL_FRAME_PREFIX);
  memcpy(f.data() + 3, &crc, 4);
  return f;
}

void decode(const uint8_t* data, uint64_t size) {
  hl::FrameView f;
  try {
    f = hl::parse_frame(data, size);
  } catch (const hl::FrameError&) {
    return;
  }
  const uint64_t out_bytes = f.decoded_bytes();
  if (out_bytes > kMaxOutputBytes) return;
  uint8_t* out = static_cast<uint8_t*>(malloc(out_bytes ? out_bytes : 1));
  bool ok = true;
  try {
    hl::decompress_cpu(data, size, out, out_bytes, /*threads=*/1);
  } catch (const hl::FrameError&) {
    ok = false;
  }
  if (f.ndim >= 1) {  // the transport's path: one source of this frame, its rows and trailing
    uint8_t* again = static_cast<uint8_t*>(malloc(out_bytes ? out_bytes : 1));
    std::vector<hl::DecodeSource> src{{0, size, (int64_t)f.rows}};
    std::vector<std::string> errors;
    errors = hl::decompress_into_cpu(data, size, src, f.dtype, f.trailing, again, out_bytes, 1);
    const bool ok_again = errors[0].empty();
    if (ok != ok_again || (ok && memcmp(out, again, out_bytes) != 0)) {
      fprintf(stderr, "decompress_cpu and decompress_into_cpu disagree: %s\n", errors[0].c_str());
      abort();
    }
    free(again);
  }
  free(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> frame;
  if (HL_FUZZ_PATCH) {
    size_t skip = 0;
    if (hl::is_frame(data, size) && size > HL_FRAME_PREFIX) {
      skip = HL_FRAME_PREFIX;
      while (skip < size && (data[skip] & 0x80)) ++skip;
      skip = skip < size ? skip + 1 : size;
    }
    frame = seal(data + skip, size - skip);
  } else {
    // A copy of exactly `size` bytes: ASan then catches any read past the frame's end.
    frame.assign(data, data + size);
  }
  decode(frame.data(), frame.size());
  return 0;
}
