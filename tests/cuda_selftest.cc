// Standalone check of the CUDA codec against the CPU codec, without Python or torch: random
// tensors of every dtype, shape, bound, mode, level and dedup setting; at level 1 the CUDA
// encoder's frames against the CPU's byte for byte, one tensor a frame and compress_into's
// grouped layout (prefixes, the protocol extension, empty groups); the CUDA decoder on the CPU's
// frames of both levels; tampered payloads (CRC32C made valid again) must get the same verdict
// from both decoders; the device CRC32C against the CPU's, and verify_cuda on intact, corrupted
// and truncated frames.
//
// Build (no GPU needed; the binary needs only the driver's libcuda at run time): any CMake build
// with CUDA makes build/cuda_selftest (target cuda_selftest).
// Run: build/cuda_selftest [cases (default 3000)] [seed (1)] [tampered frames a level (300)].
// Exit status 0 when everything agrees.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "codec.h"
#include "codec_common.h"
#include "codec_cuda.h"
#include "crc32c.h"

namespace {

int g_failures = 0;
// Frames the CUDA decoder refuses by design (hvd_lossy decodes them on the host: bucketed row
// maps): counted, not failures, when the CPU decodes them.
int g_host_only = 0;

void fail(const std::string& what) {
  if (++g_failures <= 30) fprintf(stderr, "FAIL %s\n", what.c_str());
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    exit(2);
  }
}

// Device buffer with host staging.
struct Dev {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  void put(const void* src, size_t bytes) { check(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice), "H2D"); }
  std::vector<uint8_t> get(size_t bytes) const {
    std::vector<uint8_t> v(bytes);
    check(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), "D2H");
    return v;
  }
};

struct Case {
  uint8_t dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // raw elements
  hl::CompressParams p;
  std::string describe() const {
    std::string s = "dtype " + std::to_string(dtype) + " shape (";
    for (int64_t d : shape) s += std::to_string(d) + ",";
    char buf[160];
    snprintf(buf, sizeof(buf), ") eb %g mode %d level %d dedup %d dither %d seed %u",
             p.error_bound, p.mode, p.level, (int)p.dedup, (int)p.dither, p.dither_seed);
    return s + buf;
  }
};

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= (uint64_t)d;
  return n;
}

// The worst-case size of a frame of one tensor: compress_into's bound for one piece.
uint64_t max_frame(const std::vector<int64_t>& shape) {
  const std::vector<int64_t> trailing(shape.empty() ? shape.end() : shape.begin() + 1,
                                      shape.end());
  return hl::max_grouped_bytes({shape.empty() ? 1 : shape[0]}, trailing, {1}, 0);
}

// The CPU encoder's frame of one tensor into out (capacity cap), as the CUDA one writes it.
uint64_t compress_cpu(const void* in, const hl::CompressParams& p,
                      const std::vector<int64_t>& shape, uint8_t* out, uint64_t cap) {
  return hl::compress_shape_alloc_cpu(
      in, p, shape,
      [&](uint64_t n) {
        if (n > cap) throw std::runtime_error("frame of " + std::to_string(n) +
                                              " bytes exceeds max_frame's " + std::to_string(cap));
        return out;
      },
      1);
}

uint32_t raw_of(uint8_t dtype, double v) {
  float f = (float)v;
  if (dtype == HL_FLOAT32) return hl::f32_bits(f);
  if (dtype == HL_FLOAT16) return hl::f32_to_f16(f);
  return hl::f32_to_bf16(f);
}

void store(Case& c, uint64_t i, uint32_t raw) {
  const size_t eb = hl_elem_bytes(c.dtype);
  memcpy(c.data.data() + i * eb, &raw, eb);
}

Case random_case(std::mt19937_64& rng, uint64_t max_elems) {
  static const double kSpecials[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, 3.4e38, -3.4e38, 1e-45,
                                     -1e-40, 1e-8, 65504.0, 1.0, -1.0};
  static const double kBounds[] = {0.0, 1e-6, 1e-3, 0.01, 0.03, 0.05, 0.3, 1.0};
  std::uniform_int_distribution<int> pick(0, 1 << 30);
  Case c;
  c.dtype = (uint8_t)(pick(rng) % 3);
  const int ndim = pick(rng) % 4;
  for (int i = 0; i < ndim; ++i) c.shape.push_back(pick(rng) % (i + 1 == ndim ? 70 : 50));
  while (numel(c.shape) > max_elems) c.shape[0] /= 2;
  const uint64_t n = numel(c.shape);
  c.data.resize(n * hl_elem_bytes(c.dtype));
  std::normal_distribution<double> normal;
  const double scales[] = {1e-30, 1e-3, 1.0, 1e3, 1e30};
  const double scale = scales[pick(rng) % 5];
  // Embedding-like: a few distinct rows reused (duplicates), or plain noise.
  const uint64_t d = c.shape.empty() ? 1 : (uint64_t)c.shape.back();
  const uint64_t rows = d ? n / d : 0;
  const uint64_t distinct = 1 + pick(rng) % (rows + 1);
  const bool reuse = rows > 1 && pick(rng) % 2;
  std::vector<double> table(distinct * d);
  for (double& v : table) v = normal(rng) * scale;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t src = reuse ? pick(rng) % distinct : r % distinct;
    for (uint64_t i = 0; i < d; ++i)
      store(c, r * d + i, raw_of(c.dtype, reuse ? table[src * d + i] : normal(rng) * scale));
  }
  for (int k = pick(rng) % 5; k > 0 && n; --k)
    store(c, pick(rng) % n, raw_of(c.dtype, kSpecials[pick(rng) % 13]));
  c.p.dtype = c.dtype;
  c.p.mode = (uint8_t)(pick(rng) % 2);
  c.p.level = (uint8_t)(1 + pick(rng) % 2);
  c.p.dedup = pick(rng) % 4 != 0;
  c.p.error_bound = kBounds[pick(rng) % 8];
  c.p.dither = pick(rng) % 3 == 0;  // the gradient recipe: the CUDA encoder and decoder code it
  c.p.dither_seed = (uint32_t)(pick(rng) % HL_DITHER_SEEDS);
  return c;
}

std::string first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " (CPU) vs " + std::to_string(b.size()) + " (CUDA)";
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      return "first difference at byte " + std::to_string(i) + " of " + std::to_string(a.size());
  return "";
}

// Decodes on both sides; returns "" when they agree (same bits, or both reject).
std::string compare_decoders(const std::vector<uint8_t>& frame, uint64_t out_bytes) {
  std::vector<uint8_t> cpu(out_bytes);
  std::string cpu_err, gpu_err;
  try {
    hl::decompress_cpu(frame.data(), frame.size(), cpu.data(), out_bytes, 1);
  } catch (const std::exception& e) {
    cpu_err = e.what();
  }
  Dev f(frame.size()), o(out_bytes);
  f.put(frame.data(), frame.size());
  try {
    hl::decompress_cuda(f.p, frame.size(), o.p, out_bytes, nullptr);
  } catch (const std::exception& e) {
    gpu_err = e.what();
  }
  // The batched decoder (decode_batch.cu) on the same frame, where it takes the frame's
  // segments (level 1 with block-packed maps): it must accept and reject as the CPU does.
  std::string batch_err;
  Dev b(out_bytes);
  const uint64_t size = frame.size();
  try {
    hl::decompress_batched_cuda(f.p, size, hl::back_to_back(&size, 1), b.p, out_bytes, nullptr);
  } catch (const std::exception& e) {
    batch_err = e.what();
  }
  if (batch_err.find("no batched device decoder") == std::string::npos) {
    if (cpu_err.empty() != batch_err.empty())
      return "CPU decoder says \"" + (cpu_err.empty() ? "ok" : cpu_err) +
             "\", batched CUDA decoder says \"" + (batch_err.empty() ? "ok" : batch_err) + "\"";
    if (cpu_err.empty() && b.get(out_bytes) != cpu) return "batched decoder's tensors differ";
  }
  if (cpu_err.empty() && gpu_err.find("no CUDA decoder yet") != std::string::npos) {
    ++g_host_only;
    return "";
  }
  if (cpu_err.empty() != gpu_err.empty())
    return "CPU decoder says \"" + (cpu_err.empty() ? "ok" : cpu_err) + "\", CUDA decoder says \"" +
           (gpu_err.empty() ? "ok" : gpu_err) + "\"";
  if (cpu_err.empty() && o.get(out_bytes) != cpu) return "decoded tensors differ";
  return "";
}

// Level 1: the CUDA encoder's frame against the CPU's, byte for byte (and the same errors);
// both levels: the CUDA decoder on the CPU's frame.
void run_case(const Case& c) {
  const uint64_t cap = max_frame(c.shape);
  std::vector<uint8_t> cpu(cap);
  std::string cpu_err, gpu_err;
  uint64_t cpu_size = 0, gpu_size = 0;
  try {
    cpu_size = compress_cpu(c.data.data(), c.p, c.shape, cpu.data(), cap);
  } catch (const std::exception& e) {
    cpu_err = e.what();
  }
  Dev in(c.data.size()), out(cap);
  in.put(c.data.data(), c.data.size());
  if (c.p.level == 1) {
    try {
      gpu_size = hl::compress_cuda(in.p, c.p, c.shape, out.p, cap, nullptr);
    } catch (const std::exception& e) {
      gpu_err = e.what();
    }
    if (cpu_err != gpu_err)
      return fail(c.describe() + ": CPU error \"" + cpu_err + "\", CUDA error \"" + gpu_err + "\"");
  }
  if (!cpu_err.empty()) return;
  cpu.resize(cpu_size);
  if (c.p.level == 1) {
    const std::string diff = first_difference(cpu, out.get(gpu_size));
    if (!diff.empty()) return fail(c.describe() + ": frames differ, " + diff);
  }
  const std::string diff = compare_decoders(cpu, numel(c.shape) * hl_elem_bytes(c.dtype));
  if (!diff.empty()) fail(c.describe() + ": " + diff);
}

// compress_into on the device against the CPU's: random groups (some empty), a
// prefix before each (left untouched: both buffers start filled with 0xab), the extension.
void run_grouped(std::mt19937_64& rng) {
  Case c = random_case(rng, 20000);
  while (c.shape.empty()) c = random_case(rng, 20000);
  c.p.level = 1;
  std::vector<int64_t> trailing(c.shape.begin() + 1, c.shape.end());
  std::vector<int64_t> rows, groups;
  std::vector<double> ebs;
  int64_t left = c.shape[0];
  while (left > 0) {
    const int64_t r = std::min<int64_t>(left, (int64_t)(rng() % 60));
    rows.push_back(r);
    ebs.push_back((rng() % 4) ? 0.02 : 0.0);
    left -= r;
  }
  for (size_t k = 0; k < rows.size();) {
    const int64_t g = std::min<int64_t>((int64_t)(rows.size() - k), (int64_t)(rng() % 4));
    groups.push_back(g);
    k += (size_t)g;
  }
  const uint64_t prefix = rng() % 9;
  const std::string ext = (rng() % 2) ? std::string("\x01proto", 6) : std::string();
  const uint64_t cap = hl::max_grouped_bytes(rows, trailing, groups, prefix);
  std::vector<uint8_t> cpu(cap, 0xab);
  std::vector<uint64_t> cpu_groups, gpu_groups;
  const hl::GroupedCall call{rows, trailing, ebs, groups, prefix, ext};
  std::vector<uint64_t> cs =
      hl::compress_into_cpu(c.data.data(), c.p, call, cpu.data(), cap, 1, &cpu_groups);
  Dev in(c.data.size()), out(cap);
  in.put(c.data.data(), c.data.size());
  check(cudaMemset(out.p, 0xab, cap), "cudaMemset");
  std::vector<uint64_t> gs;
  try {
    gs = hl::compress_into_cuda(in.p, c.p, call, out.p, cap, nullptr, &gpu_groups);
  } catch (const std::exception& e) {
    return fail(c.describe() + ": compress_into_cuda error \"" + std::string(e.what()) + "\"");
  }
  if (cs != gs || cpu_groups != gpu_groups) return fail(c.describe() + ": compress_into sizes differ");
  std::string diff = first_difference(cpu, out.get(cap));
  if (!diff.empty()) fail(c.describe() + ": compress_into buffers differ, " + diff);
}

// Payload bytes of frames of both levels changed and the CRC32C made valid again: the decoders
// must agree (the same tensor, or both refuse).
void run_tampered(std::mt19937_64& rng, int trials) {
  Case c = random_case(rng, 30000);
  c.shape = {600, 24};
  c.dtype = c.p.dtype = HL_FLOAT32;
  c.data.resize(600 * 24 * 4);
  std::normal_distribution<double> normal;
  std::vector<double> table(50 * 24);
  for (double& v : table) v = normal(rng) * 0.1;
  for (uint64_t r = 0; r < 600; ++r)
    for (uint64_t i = 0; i < 24; ++i) store(c, r * 24 + i, raw_of(HL_FLOAT32, table[(r % 50) * 24 + i]));
  store(c, 7 * 24 + 3, raw_of(HL_FLOAT32, INFINITY));
  store(c, 9 * 24 + 1, raw_of(HL_FLOAT32, 1e20));
  for (uint8_t level = 1; level <= 2; ++level) {
    c.p.mode = HL_MODE_ABS;
    c.p.error_bound = 1e-3;
    c.p.level = level;
    c.p.dedup = true;
    c.p.dither = false;
    std::vector<uint8_t> frame(max_frame(c.shape));
    frame.resize(compress_cpu(c.data.data(), c.p, c.shape, frame.data(), frame.size()));
    for (int t = 0; t < trials; ++t) {
      std::vector<uint8_t> bad = frame;
      for (int k = 1 + (int)(rng() % 4); k > 0; --k)
        bad[HL_FRAME_PREFIX + rng() % (bad.size() - HL_FRAME_PREFIX)] = (uint8_t)rng();
      const uint32_t crc = hl::crc32c(bad.data() + HL_FRAME_PREFIX, bad.size() - HL_FRAME_PREFIX);
      memcpy(bad.data() + 3, &crc, 4);
      std::string diff = compare_decoders(bad, 600 * 24 * 4);
      if (!diff.empty()) fail("tampered level " + std::to_string(level) + " trial " + std::to_string(t) + ": " + diff);
    }
  }
}

// The device CRC32C at random lengths and alignments, then verify_cuda: intact frames pass,
// any flipped byte or a missing one raises FrameError.
void run_checks(std::mt19937_64& rng, int trials) {
  std::vector<uint8_t> data(3 << 20);
  for (uint8_t& b : data) b = (uint8_t)rng();
  Dev d(data.size());
  d.put(data.data(), data.size());
  for (int t = 0; t < trials; ++t) {
    const uint64_t start = rng() % 16;
    const uint64_t n = t == 0 ? 0 : rng() % (t % 10 == 0 ? data.size() - start : 5000);
    if (hl::crc32c_cuda(d.p + start, n, nullptr) != hl::crc32c(data.data() + start, n))
      fail("crc32c of " + std::to_string(n) + " bytes at offset " + std::to_string(start));
  }
  Case c = random_case(rng, 20000);
  while (c.shape.empty()) c = random_case(rng, 20000);
  c.p.dither = false;
  std::vector<uint8_t> frame(max_frame(c.shape));
  frame.resize(compress_cpu(c.data.data(), c.p, c.shape, frame.data(), frame.size()));
  Dev f(frame.size());
  auto verdict = [&](const std::vector<uint8_t>& bytes, uint64_t size) {
    f.put(bytes.data(), bytes.size());
    try {
      hl::verify_cuda(f.p, size, nullptr);
      return std::string();
    } catch (const hl::FrameError& e) {
      return std::string(e.what());
    }
  };
  const std::string what = c.describe();
  std::string err = verdict(frame, frame.size());
  if (!err.empty()) fail(what + ": intact frame refused: " + err);
  if (verdict(frame, frame.size() - 1).empty()) fail(what + ": truncated frame accepted");
  for (int t = 0; t < trials; ++t) {
    std::vector<uint8_t> bad = frame;
    const uint64_t at = rng() % bad.size();
    bad[at] ^= (uint8_t)(1 + rng() % 255);
    if (verdict(bad, bad.size()).empty())
      fail(what + ": byte " + std::to_string(at) + " changed, frame accepted");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? atoi(argv[1]) : 3000;
  const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1;
  const int tampered = argc > 3 ? atoi(argv[3]) : 300;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device: nothing to check\n");
    return 3;
  }
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) run_case(random_case(rng, i % 50 == 0 ? 2000000 : 5000));
  printf("random tensors: %d cases, %d failures\n", cases, g_failures);
  const int before_grouped = g_failures;
  for (int i = 0; i < cases / 20; ++i) run_grouped(rng);
  printf("compress_into: %d cases, %d failures\n", cases / 20,
         g_failures - before_grouped);
  const int before_tamper = g_failures;
  run_tampered(rng, tampered);
  printf("tampered frames: %d trials, %d disagreements\n", 2 * tampered, g_failures - before_tamper);
  const int before_checks = g_failures;
  run_checks(rng, 200);
  printf("crc32c and verify_cuda: %d failures\n", g_failures - before_checks);
  check(cudaDeviceSynchronize(), "final synchronize");
  printf("frames left to the host decoder (bucketed maps): %d\n", g_host_only);
  printf("%s\n", g_failures ? "FAILED" : "all agree");
  return g_failures ? 1 : 0;
}
