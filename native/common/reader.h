// The host's bounds-checked reader of a frame's bytes: every parser (frame_io.cc's header and
// descriptors, the rANS sections, the bucketed map) reads through it, so a truncated or
// corrupted field always surfaces as a FrameError that names it.
#pragma once

#include <stdint.h>
#include <string.h>

#include <string>

#include "errors.h"
#include "varint.h"

namespace hl {

class Reader {
 public:
  // what: the bytes read (a section, the frame), named when take() runs past them.
  Reader(const uint8_t* p, uint64_t len, const char* what) : p_(p), len_(len), what_(what) {}

  const uint8_t* take(uint64_t n) {
    if (n > len_ - pos_)
      throw FrameError(std::string("frame is truncated or corrupted: the ") + what_ + " needs " +
                       std::to_string(n) + " more bytes at offset " + std::to_string(pos_) +
                       " but holds " + std::to_string(len_));
    const uint8_t* r = p_ + pos_;
    pos_ += n;
    return r;
  }
  template <typename T>
  T read() {
    T v;
    memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  // A little-endian field of `bytes` bytes (at most 4).
  uint32_t fixed(int bytes, const char* field) {
    if (len_ - pos_ < (uint64_t)bytes)
      throw FrameError(std::string("frame is truncated inside its ") + field);
    uint32_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint32_t)p_[pos_++] << (8 * i);
    return v;
  }
  // The strict varint (get_varint) of `field`.
  uint64_t varint(const char* field) {
    uint64_t v = 0, used = 0;
    switch (get_varint(p_ + pos_, len_ - pos_, &v, &used)) {
      case HL_VARINT_OK:
        pos_ += used;
        return v;
      case HL_VARINT_TRUNCATED:
        throw FrameError(std::string("frame is truncated inside its ") + field);
      case HL_VARINT_OVERFLOW:
        throw FrameError(std::string("frame is corrupted: ") + field + " overflows 64 bits");
      case HL_VARINT_OVERLONG:
        throw FrameError(std::string("frame is corrupted: overlong varint in its ") + field);
      default:
        throw FrameError(std::string("frame is corrupted: ") + field + " is longer than 10 bytes");
    }
  }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return len_ - pos_; }
  // Past n bytes the caller has checked are there.
  void skip(uint64_t n) { pos_ += n; }

 private:
  const uint8_t* p_;
  uint64_t len_;
  uint64_t pos_ = 0;
  const char* what_;
};

}  // namespace hl
