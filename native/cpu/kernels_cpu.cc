// kernels_cpu.h's entry points: each picks the widest kernel simd_level() allows (kernels_avx512.cc,
// kernels_avx2.cc) and falls back to the portable loops (kernels_scalar.h); float32 quantizes
// with the AVX2 kernels on AVX-512 CPUs too (kernels_avx512.cc says why).
#include "kernels_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "kernels_scalar.h"
#include "kernels_simd.h"

namespace hl {
namespace cpu {
namespace {

#ifdef HL_HAVE_AVX2_PATH
bool cpu_has_avx2() { return simd_level() >= 1; }
bool cpu_has_avx512() { return simd_level() >= 2; }
#endif

constexpr uint64_t kExpandAhead = 8;

#ifdef HL_HAVE_AVX2_PATH
// Whole lines (bytes a multiple of 64, dst 64-byte aligned) with streaming stores, not fenced.
void stream_lines(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  if (cpu_has_avx512()) return stream_copy_avx512(dst, src, bytes);
  stream_copy_avx2(dst, src, bytes);
}
#endif

}  // namespace

void stream_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
#ifdef HL_HAVE_AVX2_PATH
  if (cpu_has_avx2() && bytes >= 128) {
    const uint64_t head = (64 - ((uintptr_t)dst & 63)) & 63;
    const uint64_t body = (bytes - head) & ~uint64_t(63);
    memcpy(dst, src, head);
    stream_lines(dst + head, src + head, body);
    _mm_sfence();  // streaming stores are weakly ordered: finish them before anyone reads dst
    memcpy(dst + head + body, src + head + body, bytes - head - body);
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

void copy_output(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  if (bytes >= kStreamFrom) return stream_copy(dst, src, bytes);
  if (bytes) memcpy(dst, src, bytes);
}

void expand_rows(uint8_t* out, const uint8_t* uniq, const uint32_t* map, uint64_t rows,
                 uint64_t row_bytes, bool stream) {
  const uint64_t ahead = row_bytes < 1024 ? row_bytes : 1024;
#ifdef HL_HAVE_AVX2_PATH
  if (stream && cpu_has_avx2() && row_bytes % 64 == 0 && (uintptr_t)out % 64 == 0) {
    for (uint64_t r = 0; r < rows; ++r) {
      if (r + kExpandAhead < rows)
        for (uint64_t off = 0; off < ahead; off += 64)
          __builtin_prefetch(uniq + (uint64_t)map[r + kExpandAhead] * row_bytes + off);
      stream_lines(out + r * row_bytes, uniq + (uint64_t)map[r] * row_bytes, row_bytes);
    }
    _mm_sfence();  // streaming stores are weakly ordered: finish them before anyone reads out
    return;
  }
#endif
  (void)stream;
  for (uint64_t r = 0; r < rows; ++r) {
    if (r + kExpandAhead < rows)
      for (uint64_t off = 0; off < ahead; off += 64)
        __builtin_prefetch(uniq + (uint64_t)map[r + kExpandAhead] * row_bytes + off);
    memcpy(out + r * row_bytes, uniq + (uint64_t)map[r] * row_bytes, row_bytes);
  }
}

// A forcing variable counts when set to anything but "" or "0": HVD_LOSSY_NO_AVX512=0 reads as
// "do not force", not as the variable's presence.
static bool env_forces(const char* name) {
  const char* v = getenv(name);
  return v && v[0] && !(v[0] == '0' && v[1] == 0);
}

int simd_forced() {
  static const int forced = (env_forces(kForcing[0]) ? 1 : 0) | (env_forces(kForcing[1]) ? 2 : 0);
  return forced;
}

int simd_level() {
#ifdef HL_HAVE_AVX2_PATH
  static const int level = [] {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        (simd_forced() & 1))
      return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
#if !defined(__clang__) || __clang_major__ >= 15
        // (clang 14, which builds the fuzzers, knows no "f16c" here; every CPU with
        // AVX-512F has F16C)
        __builtin_cpu_supports("f16c") &&
#endif
        !(simd_forced() & 2))
      return 2;
    return 1;
  }();
  return level;
#else
  return 0;
#endif
}

#define HL_DISPATCH(dtype, CALL)                 \
  switch (dtype) {                               \
    case HL_FLOAT32: CALL(HL_FLOAT32); break;    \
    case HL_FLOAT16: CALL(HL_FLOAT16); break;    \
    case HL_BFLOAT16: CALL(HL_BFLOAT16); break;  \
  }

HL_AVX2_CLONES void finite_range(uint8_t dtype, const void* x, uint64_t n, double* lo, double* hi) {
#ifdef HL_HAVE_AVX2_PATH
  if (cpu_has_avx512()) return range_avx512(dtype, x, n, lo, hi);
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return range_f32_avx2(static_cast<const float*>(x), n, lo, hi);
#endif
#define CALL(DT) range_impl<DT>(x, n, lo, hi)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_AVX2_CLONES void quantize_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                             uint64_t row_len, const QuantParams& qp, uint32_t* z,
                             uint8_t* row_outlier, uint64_t* hashes) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return quantize_f32_avx2(static_cast<const float*>(x), idx, rows, row_len, qp, z, row_outlier,
                             hashes);
  if (cpu_has_avx512())
    return quantize_avx512(dtype, x, idx, rows, row_len, qp, z, row_outlier, hashes);
#endif
#define CALL(DT) quantize_impl<DT>(x, idx, rows, row_len, qp, z, row_outlier, hashes)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

namespace {

// quantize_rows_narrow's bytes, flags and hashes from codes already in z.
template <int DT>
HL_INLINE void narrow_impl(const void* xv, const uint64_t* idx, uint64_t rows, uint64_t d,
                           const uint32_t* codes,
                           const uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                           uint8_t* bytes) {
  typedef typename Elem<DT>::raw_t raw_t;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint32_t* z = codes + r * d;
    uint8_t* b = bytes + r * d;
    uint32_t any = 0;
    for (uint64_t k = 0; k < d; ++k) any |= z[k];
    const bool ok = (any >> 8) == 0;
    narrow[r] = (uint8_t)ok;
    if (ok)
      for (uint64_t k = 0; k < d; ++k) b[k] = (uint8_t)z[k];
    if (hashes)
      hashes[r] = ok ? narrow_hash(b, d)
                     : wide_hash(static_cast<const raw_t*>(xv) + (idx ? idx[r] : r) * d, z, d,
                                 row_outlier[r]);
  }
}

}  // namespace

HL_AVX2_CLONES void quantize_rows_narrow(uint8_t dtype, const void* x, const uint64_t* idx,
                                    uint64_t rows, uint64_t row_len, const QuantParams& qp,
                                    uint32_t* z, uint8_t* row_outlier, uint64_t* hashes,
                                    uint8_t* narrow, uint8_t* bytes) {
#ifdef HL_HAVE_AVX2_PATH
  if (dtype == HL_FLOAT32 && simd_level() >= 1 && !(qp.dither && hashes))
    return quantize_narrow_f32_avx2(static_cast<const float*>(x), idx, rows, row_len, qp, z,
                                    row_outlier, hashes, narrow, bytes);
#endif
  quantize_rows(dtype, x, idx, rows, row_len, qp, z, row_outlier, nullptr);
#define CALL(DT) narrow_impl<DT>(x, idx, rows, row_len, z, row_outlier, hashes, narrow, bytes)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

int coded_row_f32(const float* x, const float* p, uint64_t d, const QuantParams& qp, double eb,
                  float* r, float* xh, bool* same, bool* as_held) {
#ifdef HL_HAVE_AVX2_PATH
  if (simd_level() >= 1 && !qp.dither)
    return coded_row_f32_avx2(x, p, d, qp, eb, r, xh, same, as_held);
#endif
  return kRowUnsure;
}

HL_AVX2_CLONES void raw_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                        uint64_t row_len, uint32_t* z) {
#define CALL(DT) raw_impl<DT>(x, idx, rows, row_len, z)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_AVX2_CLONES void hash_raw_rows(const uint8_t* x, uint64_t rows, uint64_t row_bytes,
                             uint64_t* hashes) {
  const uint64_t words = row_bytes / 4;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = x + r * row_bytes;
    uint64_t h = row_bytes;
    if (row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 4 == 0) {
      h = mix64(h ^ hash_codes(reinterpret_cast<const uint32_t*>(row), words));
    } else {
      uint32_t buf[256];  // unaligned rows (odd fp16 lengths) are hashed in aligned chunks
      for (uint64_t w = 0; w < words; w += 256) {
        uint64_t n = words - w < 256 ? words - w : 256;
        memcpy(buf, row + 4 * w, 4 * n);
        h = mix64(h ^ hash_codes(buf, n));
      }
    }
    uint32_t tail = 0;
    memcpy(&tail, row + 4 * words, row_bytes - 4 * words);
    hashes[r] = mix64(h ^ tail);
  }
}

HL_AVX2_CLONES void dequantize(uint8_t dtype, const uint32_t* z, uint64_t n, double step,
                               void* out) {
#ifdef HL_HAVE_AVX2_PATH
  if (cpu_has_avx512()) return dequantize_avx512(dtype, z, n, step, false, 0, 0, out);
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return dequantize_f32_avx2(z, n, step, static_cast<float*>(out));
#endif
#define CALL(DT) dequantize_impl<DT>(z, n, step, out)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

HL_AVX2_CLONES void dequantize_dithered(uint8_t dtype, const uint32_t* z, uint64_t n, double step,
                                   uint32_t seed, uint64_t first, void* out) {
#ifdef HL_HAVE_AVX2_PATH
  if (cpu_has_avx512()) return dequantize_avx512(dtype, z, n, step, true, seed, first, out);
  if (dtype == HL_FLOAT32 && cpu_has_avx2())
    return dequantize_dithered_f32_avx2(z, n, step, seed, first, static_cast<float*>(out));
#endif
#define CALL(DT) dequantize_dithered_impl<DT>(z, n, step, seed, first, out)
  HL_DISPATCH(dtype, CALL)
#undef CALL
}

}  // namespace cpu
}  // namespace hl
