// libFuzzer harness for the hvd_lossy frame decoder (native only, no Python).
//
// Contract under test: whatever the bytes, hl::parse_header and hl::decompress_cpu either decode
// or throw hl::FrameError (a corrupt, truncated or foreign frame) / hl::ArgumentError; they never
// read or write out of bounds, hit undefined behaviour, hang or throw anything else.
//
// Built twice from this file (see fuzz/run.sh):
//   fuzz_decode          the bytes are decoded as they are. Random mutations almost always break
//                        the checksum, so this mode mostly tests parse_header and the checksum.
//   fuzz_decode_patched  -DHL_FUZZ_PATCH=1: before decoding, the harness writes the input's size
//                        into total_bytes and the correct checksum (hl::frame_checksum) into the
//                        header, so mutated frames get past both and reach the section parsers
//                        (block unpacking, rANS, outliers, row map).
//
// A frame may legitimately decode to far more bytes than it holds (duplicate rows cost a few bits
// each in the row map), so outputs above kMaxOutputBytes are not decoded: that is allocation
// size, not a parser property, and would only trip libFuzzer's memory limit.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cstddef>
#include <vector>

#include "codec.h"

#ifndef HL_FUZZ_PATCH
#define HL_FUZZ_PATCH 0
#endif

namespace {

constexpr uint64_t kMaxOutputBytes = 64ull << 20;

// Byte offsets of the header fields the patched mode rewrites (frame.h, HlFrameHeader).
constexpr size_t kChecksumOffset = offsetof(HlFrameHeader, checksum);      // 12
constexpr size_t kTotalBytesOffset = offsetof(HlFrameHeader, total_bytes);  // 88

void patch(std::vector<uint8_t>* frame) {
  const uint64_t size = frame->size();
  if (size >= HL_HEADER_BYTES) memcpy(frame->data() + kTotalBytesOffset, &size, 8);
  if (size >= 16) {
    uint32_t sum = hl::frame_checksum(frame->data(), size);
    memcpy(frame->data() + kChecksumOffset, &sum, 4);
  }
}

void decode(const uint8_t* data, uint64_t size) {
  std::vector<int64_t> shape;
  HlFrameHeader h;
  try {
    h = hl::parse_header(data, size, &shape);
  } catch (const hl::FrameError&) {
    return;
  }
  // parse_header accepted the frame: its header must describe the shape it returned.
  uint64_t rows = 1, len = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= (uint64_t)shape[i];
  if (!shape.empty()) len = (uint64_t)shape.back();
  if (shape.size() != h.ndim || h.n_rows != rows || h.row_len != len || h.total_bytes != size) {
    fprintf(stderr, "parse_header returned a header that disagrees with its shape\n");
    abort();
  }
  const uint64_t out_bytes = h.n_rows * h.row_len * hl_elem_bytes(h.dtype);
  if (out_bytes > kMaxOutputBytes) return;
  // An exact-size heap block, so ASan flags a write one element past the output.
  uint8_t* out = static_cast<uint8_t*>(malloc(out_bytes ? out_bytes : 1));
  bool ok = true;
  try {
    hl::decompress_cpu(data, size, out, out_bytes, /*threads=*/1);
  } catch (const hl::FrameError&) {
    ok = false;
  } catch (const hl::ArgumentError&) {
    ok = false;
  }
  // Sections of more than 4096 packed blocks take unpack_blocks' multithreaded branch, which
  // has its own offset arithmetic (one thread when built without OpenMP, as here). It must
  // accept the same frames and decode the same bytes.
  const uint64_t kThreadedCodes = 4096ull * HL_BLOCK;
  if (h.n_unique * h.row_len > kThreadedCodes || h.n_rows > kThreadedCodes) {
    uint8_t* again = static_cast<uint8_t*>(malloc(out_bytes ? out_bytes : 1));
    bool ok_again = true;
    try {
      hl::decompress_cpu(data, size, again, out_bytes, /*threads=*/4);
    } catch (const hl::FrameError&) {
      ok_again = false;
    }
    if (ok != ok_again || (ok && memcmp(out, again, out_bytes) != 0)) {
      fprintf(stderr, "decoding with 1 and 4 threads disagrees\n");
      abort();
    }
    free(again);
  }
  free(out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: ASan then catches any read past the frame's end, which a
  // pointer into libFuzzer's own (larger) buffer might hide.
  std::vector<uint8_t> frame(data, data + size);
  if (HL_FUZZ_PATCH) patch(&frame);
  decode(frame.data(), frame.size());
  return 0;
}
