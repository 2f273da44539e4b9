// The frame's varints (frame.h: unsigned LEB128, 7 bits a byte, low first, at most 10 bytes, no
// overlong form): the one writer and the one strict reader every native reader and writer uses,
// HL_HD so that the CUDA codec runs the very same functions.
#pragma once

#include <stdint.h>

#include "frame.h"

#ifdef __cplusplus
namespace hl {

HL_HD uint64_t varint_bytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Writes v at p; returns its end (varint_bytes(v) past p).
HL_HD uint8_t* put_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

// What get_varint found; a reader maps each to a message naming the field (Reader::varint).
enum VarintStatus : int {
  HL_VARINT_OK = 0,
  HL_VARINT_TRUNCATED = 1,  // the bytes end inside it
  HL_VARINT_OVERFLOW = 2,   // more than 64 bits
  HL_VARINT_OVERLONG = 3,   // a final zero byte after the first
  HL_VARINT_TOO_LONG = 4,   // more than 10 bytes
};

// Reads the varint at p (avail bytes there) into *v and the bytes it took into *used.
HL_HD int get_varint(const uint8_t* p, uint64_t avail, uint64_t* v, uint64_t* used) {
  uint64_t x = 0, pos = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= avail) return HL_VARINT_TRUNCATED;
    const uint8_t b = p[pos++];
    if (shift == 63 && b > 1) return HL_VARINT_OVERFLOW;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (b == 0 && shift > 0) return HL_VARINT_OVERLONG;
      *v = x;
      *used = pos;
      return HL_VARINT_OK;
    }
  }
  return HL_VARINT_TOO_LONG;
}

}  // namespace hl
#endif
