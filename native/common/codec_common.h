// Bit-level pieces shared by the CPU and CUDA codecs, so the two cannot drift apart: dtype
// conversion, quantization and its exact reconstruction, zigzag, bit widths and the level-2
// (rANS) constants. Everything here is __host__ __device__ on nvcc.
#pragma once

#include <math.h>
#include <string.h>

#include "frame.h"

namespace hl {

// ---- dtype bits <-> float ------------------------------------------------------------------
// Written with integer arithmetic rather than compiler intrinsics so that the host and the
// device round identically (round to nearest, ties to even, subnormals kept).

HL_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
HL_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

HL_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    // zero or subnormal: value = man * 2^-24, exact in float
    float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

HL_HD uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {
    // result is subnormal (or zero) in fp16: shift the 24-bit significand into place
    if (ax < 0x33000000u) return (uint16_t)sign;  // below half the smallest subnormal
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24 bits dropped
    uint32_t kept = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1))) kept++;
    return (uint16_t)(sign | kept);
  }
  uint32_t kept = (ax >> 13) - (112u << 10);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (kept & 1))) kept++;
  return (uint16_t)(sign | kept);
}

HL_HD float bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

HL_HD uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  // quiet nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)((x + rounding) >> 16);
}

// Element access by dtype. Raw bits travel as uint32 (fp16/bf16 in the low half).
template <int DT>
struct Elem;
template <>
struct Elem<HL_FLOAT32> {
  typedef uint32_t raw_t;
  static HL_HD double to_double(raw_t r) { return (double)bits_f32(r); }
  static HL_HD raw_t from_float(float f) { return f32_bits(f); }
};
template <>
struct Elem<HL_FLOAT16> {
  typedef uint16_t raw_t;
  static HL_HD double to_double(raw_t r) { return (double)f16_to_f32(r); }
  static HL_HD raw_t from_float(float f) { return f32_to_f16(f); }
};
template <>
struct Elem<HL_BFLOAT16> {
  typedef uint16_t raw_t;
  static HL_HD double to_double(raw_t r) { return (double)bf16_to_f32(r); }
  static HL_HD raw_t from_float(float f) { return f32_to_bf16(f); }
};

// ---- quantization ---------------------------------------------------------------------------

HL_HD uint32_t zigzag(int32_t q) { return ((uint32_t)q << 1) ^ (uint32_t)(q >> 31); }
HL_HD int32_t unzigzag(uint32_t z) { return (int32_t)(z >> 1) ^ -(int32_t)(z & 1); }

// The decoder's exact arithmetic: q * step + u in double (u: the element's dither offset, 0
// without dither), rounded to float, then to the dtype. Adding u = 0 changes no bit: q * step is
// never -0 (an integer times a positive step).
template <int DT>
HL_HD typename Elem<DT>::raw_t reconstruct(int32_t q, double step, double u = 0.0) {
  return Elem<DT>::from_float((float)((double)q * step + u));
}

// Quantizes one element (x - u with a dither offset u, else x). Returns true with *z set to its
// zigzag code when the reconstruction is within eb_abs; false when the element must be stored as
// an outlier (NaN, +-Inf, code out of range, or rounding that would miss the bound).
template <int DT>
HL_HD bool quantize(typename Elem<DT>::raw_t raw, double inv_step, double step, double eb_abs,
                    uint32_t* z, double u = 0.0) {
  double x = Elem<DT>::to_double(raw);
  double t = (x - u) * inv_step;
  if (!(fabs(t) <= HL_QMAX)) return false;  // also catches NaN
  int32_t q = (int32_t)rint(t);
  double xh = Elem<DT>::to_double(reconstruct<DT>(q, step, u));
  if (!(fabs(x - xh) <= eb_abs)) return false;
  *z = zigzag(q);
  return true;
}

// ---- subtractive dither (HL_SEG_DITHER) -------------------------------------------------------

// murmur3's 32-bit finalizer, a bijection.
HL_HD uint32_t mix32(uint32_t h) {
  h = (h ^ (h >> 16)) * 0x85ebca6bu;
  h = (h ^ (h >> 13)) * 0xc2b2ae35u;
  return h ^ (h >> 16);
}

// Offset of element i as a fraction of the step, in (-1/2, 1/2): 24 hashed bits, centred, exact
// in double on any IEEE machine, so the host and the device agree to the bit.
HL_HD double dither_unit(uint32_t seed, uint64_t i) {
  const uint32_t h = mix32((uint32_t)i ^ mix32((uint32_t)(i >> 32) ^ (seed * 0x9e3779b9u)));
  return ((double)(h >> 8) + 0.5) * (1.0 / 16777216.0) - 0.5;
}

// ---- integers -----------------------------------------------------------------------------

HL_HD uint32_t bit_width(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return 32 - __clz(v);
#else
  return v ? 32 - __builtin_clz(v) : 0;
#endif
}

// murmur3's 64-bit finalizer, a bijection (the row hashes of duplicate removal).
HL_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
  z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return z ^ (z >> 33);
}

// ---- encoder rules both codecs apply (frames depend on them) ---------------------------------

// Code of an element bound for the outlier section while codes are built; zigzag codes stay
// below 2^31, so it never collides with one.
constexpr uint32_t kOutlierMark = 0xffffffffu;

// Whether the encoder looks for duplicate rows at all: map entries are 32-bit.
HL_HD bool dedup_applies(bool dedup, uint64_t n_rows, uint64_t row_len) {
  return dedup && n_rows > 1 && row_len > 0 && n_rows <= 0xffffffffull;
}

// Dropping duplicates pays when the codes it saves (counted at 2 bits, a low estimate for lossy
// codes) outweigh the map it adds. Decided from counts alone.
HL_HD bool dedup_pays(uint64_t n_rows, uint64_t n_unique, uint64_t row_len) {
  const uint64_t map_bits = n_rows * bit_width((uint32_t)(n_unique - 1));
  return 2 * (n_rows - n_unique) * row_len >= map_bits;
}

// ---- level 2: rANS over zigzag codes ---------------------------------------------------------
// A level-2 section (frame.h "Compact rANS section") codes its n codes in streams of
// HL_RANS_CHUNK symbols: stream k codes symbols [k*CHUNK, min(n,(k+1)*CHUNK)); it starts with
// its final 32-bit encoder state, then the bytes the encoder emitted, in the order the decoder
// reads them. Codes >= 255 are the escape symbol 255, their values stored apart.
// The coder is the byte-wise 32-bit rANS of ryg_rans: state in [L, 256 L), L = 2^23.
// Frequencies are normalized with hl::normalize_freqs, identical on host and device.
#define HL_RANS_BITS 12
#define HL_RANS_L (1u << 23)
#define HL_RANS_CHUNK 4096
#define HL_RANS_ESC 255

// Level-2 symbol of a code: codes >= 255 are escaped.
HL_HD uint32_t rans_symbol(uint32_t z) { return z < HL_RANS_ESC ? z : HL_RANS_ESC; }

// counts[256] -> freqs[256] summing to 1 << HL_RANS_BITS; every present symbol gets >= 1.
// Deterministic: the remainder goes to (or comes from) the largest entries, lowest symbol first.
HL_HD void normalize_freqs(const uint64_t* counts, uint32_t* freqs) {
  uint64_t total = 0;
  for (int s = 0; s < 256; ++s) total += counts[s];
  const uint32_t target = 1u << HL_RANS_BITS;
  int64_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    uint32_t f = 0;
    if (counts[s]) {
      f = (uint32_t)((counts[s] * (uint64_t)target) / total);
      if (f == 0) f = 1;
    }
    freqs[s] = f;
    sum += f;
  }
  while (sum != (int64_t)target) {
    int best = -1;
    for (int s = 0; s < 256; ++s)
      if (freqs[s] > 1 && (best < 0 || freqs[s] > freqs[best])) best = s;
    if (best < 0) {  // only when every present symbol sits at 1 and sum < target
      for (int s = 0; s < 256; ++s)
        if (freqs[s]) { best = s; break; }
    }
    if (sum < (int64_t)target) {
      freqs[best] += (uint32_t)((int64_t)target - sum);
      sum = target;
    } else {
      freqs[best] -= 1;
      sum -= 1;
    }
  }
}

}  // namespace hl
