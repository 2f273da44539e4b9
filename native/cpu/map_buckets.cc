// The bucketed row map: encoder and decoder (layout in frame.h).
#include "map_buckets.h"

#include <string.h>

#include <string>

#include "codec.h"
#include "codec_common.h"
#include "rans.h"
#include "reader.h"
#include "varint.h"

namespace hl {

std::vector<uint8_t> map_buckets_encode(const uint32_t* map, uint64_t n, int threads) {
  std::vector<uint32_t> sym(n);
  std::vector<uint8_t> bits;
  uint64_t acc = 0;
  int used = 0;
  uint64_t next = 0;
  for (uint64_t r = 0; r < n; ++r) {
    if (map[r] == next) {
      sym[r] = 0;
      ++next;
      continue;
    }
    const uint32_t v = map[r] + 1;
    const uint32_t b = bit_width(v);
    sym[r] = b;
    for (uint32_t i = 0; i + 1 < b; ++i) {  // the bits below the implied top one, LSB first
      acc |= (uint64_t)((v >> i) & 1) << used;
      if (++used == 8) {
        bits.push_back((uint8_t)acc);
        acc = 0;
        used = 0;
      }
    }
  }
  if (used) bits.push_back((uint8_t)acc);
  const std::vector<uint8_t> coded = rans_encode(sym.data(), n, threads);
  std::vector<uint8_t> out(varint_bytes(coded.size()));
  put_varint(out.data(), coded.size());
  out.insert(out.end(), coded.begin(), coded.end());
  out.insert(out.end(), bits.begin(), bits.end());
  return out;
}

void map_buckets_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* map,
                        int threads) {
  Reader r(in, len, "bucketed row map");
  const uint64_t rans_bytes = r.varint("bucketed row map's rANS size");
  const uint64_t at = r.pos();
  if (rans_bytes > len - at)
    throw FrameError("frame is corrupted: a bucketed row map's rANS section of " +
                     std::to_string(rans_bytes) + " bytes in " + std::to_string(len - at));
  rans_decode(in + at, rans_bytes, n, map, threads);
  const uint8_t* bits = in + at + rans_bytes;
  const uint64_t n_bytes = len - at - rans_bytes, n_bits = 8 * n_bytes;
  uint64_t pos = 0, seen = 0;
  for (uint64_t r = 0; r < n; ++r) {
    const uint32_t b = map[r];
    if (b == 0) {
      map[r] = (uint32_t)seen++;
      continue;
    }
    if (b > 32 || pos + (b - 1) > n_bits)
      throw FrameError("frame is corrupted: bucketed row map entry " + std::to_string(r) +
                       (b > 32 ? " has bucket " + std::to_string(b) : " runs past its bits"));
    // The b - 1 bits from pos on in one little-endian load of the 8 bytes at pos / 8 (at most
    // 31 + 7 bits), fewer bytes at the section's end; bit by bit, a repeat cost a dozen steps.
    uint64_t word = 0;
    const uint64_t byte = pos >> 3;
    if (n_bytes - byte >= 8)
      memcpy(&word, bits + byte, 8);
    else
      memcpy(&word, bits + byte, n_bytes - byte);
    const uint64_t low = (word >> (pos & 7)) & ((1ull << (b - 1)) - 1);
    pos += b - 1;
    map[r] = (uint32_t)(((1ull << (b - 1)) | low) - 1);
  }
  // Canonical: the section ends at the byte of the last bit, its padding zero.
  if ((pos + 7) / 8 != n_bits / 8 || (pos % 8 && (bits[pos >> 3] >> (pos % 8))))
    throw FrameError("frame is corrupted: a bucketed row map with stray bits or bytes");
}

}  // namespace hl
