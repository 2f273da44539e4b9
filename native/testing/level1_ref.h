// A serial, host-only walk through level1_sections.h cut as the CUDA encoder cuts it: a width
// per block, an exclusive scan of the widths, sizes from the scans, level1_packing, then one
// writer call per block, value and nibble byte. It is slow and exists for the tests
// (bindings_test.cc): its bytes are compared with the CPU encoder's, so the functions the GPU
// runs are checked on a machine without one.
#pragma once

#include <stdint.h>

#include <vector>

#include "level1_sections.h"

namespace hl {
namespace l1ref {

template <typename T>
std::vector<T> exclusive_scan(const std::vector<T>& w, T* total) {
  std::vector<T> off(w.size());
  T s = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    off[i] = s;
    s += w[i];
  }
  *total = s;
  return off;
}

// Widths of blocks of `block` values (bit width of each block's OR, as the warp reduction).
inline std::vector<uint64_t> widths(const uint32_t* v, uint64_t n, uint64_t block) {
  std::vector<uint64_t> w(hl_div_up(n, block));
  for (uint64_t b = 0; b < w.size(); ++b) {
    uint32_t m = 0;
    for (uint64_t i = b * block; i < n && i < (b + 1) * block; ++i) m |= v[i];
    w[b] = bit_width(m);
  }
  return w;
}

inline void write_blocks(const uint32_t* v, uint64_t n, const std::vector<uint64_t>& w,
                         const std::vector<uint64_t>& off, uint8_t* sec) {
  const uint64_t nb = w.size();
  for (uint64_t b = 0; b < nb; ++b) {
    sec[b] = (uint8_t)w[b];
    const uint64_t count = n - b * HL_BLOCK < HL_BLOCK ? n - b * HL_BLOCK : HL_BLOCK;
    for (uint32_t j = 0; j < w[b]; ++j)
      put_fixed_le(sec + nb + 4 * (off[b] + j), block_plane(v + b * HL_BLOCK, count, j), 4);
  }
}

// The level-1 code section of n codes at v (outlier positions already 0). lossy_level1: the
// segment may take radix or short blocks (lossy, level 1); *packing gets the Level1Packing.
inline std::vector<uint8_t> code_section(const uint32_t* v, uint64_t n, bool lossy_level1,
                                         int* packing) {
  uint32_t max_code = 0;
  for (uint64_t i = 0; i < n; ++i) max_code = v[i] > max_code ? v[i] : max_code;
  uint64_t sum = 0;
  const std::vector<uint64_t> bw = widths(v, n, HL_BLOCK);
  const std::vector<uint64_t> boff = exclusive_scan(bw, &sum);
  const uint64_t block_bytes = block_section_bytes(bw.size(), sum);

  uint64_t radix_bytes = 0, G = 0;
  uint32_t k = 0, g = 0;
  std::vector<uint32_t> values;
  std::vector<uint64_t> rw, roff;
  if (lossy_level1 && radix_applies(n, max_code)) {
    k = max_code + 1;
    g = radix_group(k, n);
    G = hl_div_up(n, g);
    values.resize(G);
    for (uint64_t j = 0; j < G; ++j) values[j] = radix_value(v, n, G, g, k, j);
    rw = widths(values.data(), G, HL_BLOCK);
    uint64_t rsum = 0;
    roff = exclusive_scan(rw, &rsum);
    radix_bytes = radix_section_bytes(k, g, G, rsum);
  }
  uint64_t short_bytes = 0;
  std::vector<uint64_t> sw, soff;
  if (lossy_level1 && short_applies(n, max_code)) {
    sw = widths(v, n, HL_SHORT_BLOCK);
    uint64_t ssum = 0;
    soff = exclusive_scan(sw, &ssum);
    short_bytes = short_section_bytes(n, ssum);
  }
  *packing = level1_packing(block_bytes, radix_bytes, short_bytes);
  std::vector<uint8_t> out;
  if (*packing == HL_PACK_BLOCK) {
    out.resize(block_bytes);
    write_blocks(v, n, bw, boff, out.data());
  } else if (*packing == HL_PACK_RADIX) {
    out.resize(radix_bytes);
    uint8_t* w = radix_put_head(out.data(), k, g);
    write_blocks(values.data(), G, rw, roff, w);
  } else {
    out.resize(short_bytes);
    out[0] = HL_SHORT_MARK;
    const uint64_t nb = sw.size(), head = short_head_bytes(n);
    for (uint64_t p = 0; 2 * p < nb; ++p)
      out[1 + p] = short_nibble_byte((uint32_t)sw[2 * p], 2 * p + 1 < nb ? (uint32_t)sw[2 * p + 1] : 0);
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t count = n - b * HL_SHORT_BLOCK < HL_SHORT_BLOCK ? n - b * HL_SHORT_BLOCK
                                                                     : HL_SHORT_BLOCK;
      for (uint32_t j = 0; j < sw[b]; ++j)
        put_fixed_le(out.data() + head + 2 * (soff[b] + j),
                     short_plane(v + b * HL_SHORT_BLOCK, count, j), 2);
    }
  }
  return out;
}

}  // namespace l1ref
}  // namespace hl
