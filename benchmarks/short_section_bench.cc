// The level-1 code section alone, short blocks against block packing (native/frame.h), one
// thread: 2^20 codes whose width changes from block of 16 to block of 16 (3 to 6 bits, as
// dithered gradients in the README main job), unpacked through each packer's chunked sink (as
// the decoder runs them, the sink only touching the codes) and packed (the writer; the widths
// pass is shared). Minimum over 30 runs of each, the two alternating, so that a shared
// machine's load hits both alike. After `python setup.py build_ext --inplace`:
//
//   g++ -O3 -fopenmp -Inative benchmarks/short_section_bench.cc \
//       build/temp.linux-x86_64-cpython-311/hvd_lossy._C/libhl_codec.a -o /tmp/short_section_bench
//   /tmp/short_section_bench                          # AVX-512 where the CPU has it
//   HVD_LOSSY_NO_AVX512=1 /tmp/short_section_bench    # the AVX2 kernels
//   HVD_LOSSY_NO_AVX2=1 /tmp/short_section_bench      # the portable loops
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "pack.h"
#include "short_blocks.h"

using namespace hl;

namespace {
uint64_t touched = 0;
void sink(void*, uint64_t first, const uint32_t* v, uint64_t c) { touched += v[0] + v[c - 1] + first; }
double ns_a_code(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
                 uint64_t n) {
  return std::chrono::duration<double>(b - a).count() * 1e9 / (double)n;
}
}  // namespace

int main() {
  const uint64_t n = 1 << 20;
  std::mt19937 rng(1);
  std::vector<uint32_t> v(n);
  for (uint64_t b = 0; b < n / 16; ++b) {
    const int w = 3 + rng() % 4;
    for (int i = 0; i < 16; ++i) v[b * 16 + i] = rng() & ((1u << w) - 1);
  }
  std::vector<uint8_t> w32((n + 31) / 32), w16((n + 15) / 16);
  uint32_t max_code;
  level1_widths(v.data(), n, w16.data(), w32.data(), &max_code, 1);
  std::vector<uint8_t> block(w32.size() + payload_bytes(w32.data(), w32.size()));
  std::vector<uint8_t> shorts(short_bytes(w16.data(), n));
  printf("%llu codes: block packing %zu bytes, short blocks %zu (%+.1f%%)\n",
         (unsigned long long)n, block.size(), shorts.size(),
         100.0 * ((double)shorts.size() / (double)block.size() - 1));
  pack_blocks(v.data(), n, w32.data(), block.data(), 1);
  short_write(v.data(), n, w16.data(), shorts.data(), 1);
  double ub = 1e9, us = 1e9, pb = 1e9, ps = 1e9;
  for (int r = 0; r < 30; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    unpack_blocks_to(block.data(), block.size(), n, 32, "codes", 1, ChunkSink{&sink, nullptr});
    auto t1 = std::chrono::steady_clock::now();
    short_unpack_to(shorts.data(), shorts.size(), n, "codes", 1, ChunkSink{&sink, nullptr});
    auto t2 = std::chrono::steady_clock::now();
    pack_blocks(v.data(), n, w32.data(), block.data(), 1);
    auto t3 = std::chrono::steady_clock::now();
    short_write(v.data(), n, w16.data(), shorts.data(), 1);
    auto t4 = std::chrono::steady_clock::now();
    ub = std::min(ub, ns_a_code(t0, t1, n));
    us = std::min(us, ns_a_code(t1, t2, n));
    pb = std::min(pb, ns_a_code(t2, t3, n));
    ps = std::min(ps, ns_a_code(t3, t4, n));
  }
  printf("ns a code  unpack: block %.3f  short %.3f (%.2fx)   pack: block %.3f  short %.3f (%.2fx)\n",
         ub, us, us / ub, pb, ps, ps / pb);
  return (int)(touched & 1);
}
