// The level-1 code section alone, radix against block packing (native/frame.h), one thread: n
// codes uniform below K = 17 (rel bound 0.03 of uniformly spread values), decoded into float32
// elements through each packer's chunked sink (as the decoder runs them) and encoded (plan and
// write). Minimum over many runs of each, the two alternating, so that a shared machine's load
// hits both alike. After `python setup.py build_ext --inplace`:
//
//   g++ -O3 -fopenmp -Inative benchmarks/radix_section_bench.cc \
//       build/temp.linux-x86_64-cpython-311/hvd_lossy._C/libhl_codec.a -o /tmp/radix_section_bench
//   /tmp/radix_section_bench                          # AVX-512 where the CPU has it
//   HVD_LOSSY_NO_AVX512=1 /tmp/radix_section_bench    # the AVX2 kernels
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels_cpu.h"
#include "radix.h"

using namespace hl;

namespace {

struct Dequantize {
  float* out;
  static void run(void* ctx, uint64_t first, const uint32_t* z, uint64_t n) {
    cpu::dequantize(HL_FLOAT32, z, n, 0.006, static_cast<Dequantize*>(ctx)->out + first);
  }
};

double ns_per_code(uint64_t n, uint64_t iters, std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters /
         n * 1e9;
}

void one(uint64_t n) {
  std::mt19937 rng(1);
  std::vector<uint32_t> codes(n);
  for (auto& c : codes) c = rng() % 17;
  codes[0] = 16;
  std::vector<uint8_t> widths((n + 31) / 32);
  uint32_t max_code = 0;
  block_widths(codes.data(), n, widths.data(), 1, &max_code);
  std::vector<uint8_t> block(widths.size() + payload_bytes(widths.data(), widths.size()));
  pack_blocks(codes.data(), n, widths.data(), block.data(), 1);
  const RadixPlan plan = radix_plan(codes.data(), n, max_code, block.size(), 1);
  if (!plan.k) {
    printf("n %lu: radix does not pay\n", (unsigned long)n);
    return;
  }
  std::vector<uint8_t> radix(plan.bytes);
  radix_write(plan, radix.data(), 1);
  std::vector<float> out(n);
  Dequantize deq{out.data()};
  const ChunkSink sink{&Dequantize::run, &deq};
  const uint64_t iters = 2000000 / n + 1, rounds = n > 1000000 ? 5 : 100;
  double best[4] = {1e9, 1e9, 1e9, 1e9};  // decode block, decode radix, encode block, radix
  std::vector<uint8_t> scratch(block.size() + radix.size());
  for (uint64_t r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < iters; ++i)
      unpack_blocks_to(block.data(), block.size(), n, 32, "code section", 1, sink);
    best[0] = std::min(best[0], ns_per_code(n, iters, t0));
    t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < iters; ++i)
      radix_unpack_to(radix.data() + plan.head_bytes, radix.size() - plan.head_bytes, n, plan.k,
                      plan.g, "code section", 1, sink);
    best[1] = std::min(best[1], ns_per_code(n, iters, t0));
    t0 = std::chrono::steady_clock::now();  // the encoder's block plan (with the max) and pack
    for (uint64_t i = 0; i < iters; ++i) {
      block_widths(codes.data(), n, widths.data(), 1, &max_code);
      pack_blocks(codes.data(), n, widths.data(), scratch.data(), 1);
    }
    best[2] = std::min(best[2], ns_per_code(n, iters, t0));
    t0 = std::chrono::steady_clock::now();  // the block plan it compares with, then radix
    for (uint64_t i = 0; i < iters; ++i) {
      block_widths(codes.data(), n, widths.data(), 1, &max_code);
      const RadixPlan p = radix_plan(codes.data(), n, max_code, block.size(), 1);
      radix_write(p, scratch.data(), 1);
    }
    best[3] = std::min(best[3], ns_per_code(n, iters, t0));
  }
  printf("n %9lu (simd %d): bytes block %8zu radix %8zu (K %u, g %u, %+.1f%%) | decode ns/code "
         "block %.3f radix %.3f (x%.2f) | encode block %.3f radix %.3f (x%.2f)\n",
         (unsigned long)n, cpu::simd_level(), block.size(), radix.size(), plan.k, plan.g,
         100.0 * ((double)radix.size() / block.size() - 1), best[0], best[1], best[1] / best[0],
         best[2], best[3], best[3] / best[2]);
}

}  // namespace

int main() {
  for (uint64_t n : {2048ull, 32768ull, 16000000ull}) one(n);
}
