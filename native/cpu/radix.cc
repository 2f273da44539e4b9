// Radix packing on the host (radix.h). The encoder's loops are plain element-wise code built for
// AVX-512, AVX2 and the baseline (target_clones), which the compiler vectorizes. The digit split
// is written with intrinsics (AVX-512 16 values a step, AVX2 8), since the compiler widens
// radix_div's 32 x 32 -> 64-bit products to 64-bit lanes (8 values a step at best); all paths
// compute radix_div exactly (frame_fields.h) and write the same digits.
#include "radix.h"

#include <atomic>
#include <string>

#include "frame_fields.h"
#include "level1_sections.h"
#include "kernels_cpu.h"
#include "pack_avx2.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_CLONES) && \
    defined(HL_HAVE_PACK_AVX2)  // whole_span_avx2 takes its widths from pack_avx2.h
#include <immintrin.h>
#define HL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define HL_RADIX_SIMD 1
// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised _mm512_undefined_*()
// values and then warn about them in every caller (as in pack.cc): not our variables.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define HL_AVX512 __attribute__((target("avx512f,avx2")))
#define HL_AVX2 __attribute__((target("avx2")))
#else
#define HL_CLONES
#endif

namespace hl {
namespace {

// Values a step of the loops below handles, the format's span (frame_fields.h): 8 KiB of
// values and 8 KiB of digits stay in L1.
constexpr uint64_t kSpan = HL_RADIX_SPAN;

HL_CLONES uint32_t max_of(const uint32_t* v, uint64_t n) {
  uint32_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

HL_CLONES uint32_t or_of(const uint32_t* v, uint64_t n) {
  uint32_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m |= v[i];
  return m;
}

// The payload bytes that `count` values whose top digits are the first `real` of `top` (the
// rest 0) need at least, block by block: a value is at least its top digit times K^(g-1) =
// `power`, so its block is at least as wide as that product.
template <typename T>
inline __attribute__((always_inline)) uint64_t top_digit_bytes_of(const T* top, uint64_t real,
                                                                   uint64_t count, uint64_t power) {
  uint64_t bytes = 0;
  // m < K, so m * K^(g-1) < K^g < 2^32 (radix_span)
  auto add = [&](uint32_t m) { bytes += block_payload_bytes(bit_width((uint32_t)(m * power))); };
  uint64_t b = 0;
  for (; b + HL_BLOCK <= real; b += HL_BLOCK) {  // whole blocks: a fixed trip count, vectorized
    uint32_t m = 0;
    for (uint64_t j = 0; j < HL_BLOCK; ++j) m = top[b + j] > m ? top[b + j] : m;
    add(m);
  }
  if (b < count) {  // the block with the last real digits (the rest of the span is padding)
    uint32_t m = 0;
    for (uint64_t j = b; j < real; ++j) m = top[j] > m ? top[j] : m;
    add(m);
  }
  return bytes;
}
// (overloads, not a template: clang's target_clones takes no function templates)
HL_CLONES uint64_t top_digit_bytes(const uint32_t* top, uint64_t real, uint64_t count,
                                   uint64_t power) {
  return top_digit_bytes_of(top, real, count, power);
}
HL_CLONES uint64_t top_digit_bytes(const uint8_t* top, uint64_t real, uint64_t count,
                                   uint64_t power) {
  return top_digit_bytes_of(top, real, count, power);
}

// value += digit * K^i for the first `len` of the values (the digit is 0 after them).
HL_CLONES void add_digits(uint32_t* value, const uint32_t* digit, uint64_t len, uint32_t power) {
  for (uint64_t j = 0; j < len; ++j) value[j] += digit[j] * power;
}
HL_CLONES void add_digits(uint32_t* value, const uint8_t* digit, uint64_t len, uint32_t power) {
  for (uint64_t j = 0; j < len; ++j) value[j] += digit[j] * power;
}

// digit = in mod K, quotient = in / K, for `count` values (in may be quotient).
void split_scalar(const uint32_t* in, uint32_t* quotient, uint32_t* digit, uint64_t count,
                  RadixDiv div) {
  for (uint64_t j = 0; j < count; ++j) {
    const uint32_t v = in[j], q = radix_div(v, div);
    digit[j] = v - q * div.k;
    quotient[j] = q;
  }
}

#ifdef HL_RADIX_SIMD
// split sixteen lanes at a time: radix.h's division, then v - q * K.
HL_AVX512 void split_avx512(const uint32_t* in, uint32_t* quotient, uint32_t* digit,
                            uint64_t count, RadixDiv div) {
  const __m512i k = _mm512_set1_epi32((int)div.k);
  uint64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512i v = _mm512_loadu_si512(in + j);
    const __m512i q = radix_div16(v, div);
    _mm512_storeu_si512(digit + j, _mm512_sub_epi32(v, _mm512_mullo_epi32(q, k)));
    _mm512_storeu_si512(quotient + j, q);
  }
  split_scalar(in + j, quotient + j, digit + j, count - j, div);
}

HL_AVX2 void split_avx2(const uint32_t* in, uint32_t* quotient, uint32_t* digit, uint64_t count,
                        RadixDiv div) {
  const __m256i k = _mm256_set1_epi32((int)div.k);
  uint64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
    const __m256i q = radix_div8(v, div);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(digit + j),
                        _mm256_sub_epi32(v, _mm256_mullo_epi32(q, k)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quotient + j), q);
  }
  split_scalar(in + j, quotient + j, digit + j, count - j, div);
}

// Eight digits of a lane as 32-bit lanes.
HL_AVX2 inline __m256i digits8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
HL_AVX2 inline __m256i digits8(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// A span whose g lanes are all whole (every span but the last; count a multiple of HL_BLOCK):
// its values by Horner's rule from the top lane down, a block of 32 (four vectors) at a time in
// registers, and each block's width from their OR while it is there. Zeroing the values, then
// adding lane after lane into them (add_digits), went through the span's values g + 1 times:
// the zeroing alone was 70% of radix_plan's own time. Exact integer arithmetic (every partial
// sum is below K^g < 2^32), so the values are add_digits' bits.
template <typename T>
HL_AVX2 void whole_span_avx2(const T* const* lane, uint32_t g, uint32_t k, uint64_t count,
                             uint32_t* out, uint8_t* widths) {
  const __m256i kv = _mm256_set1_epi32((int)k);
  for (uint64_t t = 0; t < count; t += HL_BLOCK) {
    const T* top = lane[g - 1] + t;
    __m256i a = digits8(top), b = digits8(top + 8), c = digits8(top + 16), e = digits8(top + 24);
    for (uint32_t i = g - 1; i-- > 0;) {
      const T* p = lane[i] + t;
      a = _mm256_add_epi32(_mm256_mullo_epi32(a, kv), digits8(p));
      b = _mm256_add_epi32(_mm256_mullo_epi32(b, kv), digits8(p + 8));
      c = _mm256_add_epi32(_mm256_mullo_epi32(c, kv), digits8(p + 16));
      e = _mm256_add_epi32(_mm256_mullo_epi32(e, kv), digits8(p + 24));
    }
    __m256i* o = reinterpret_cast<__m256i*>(out + t);
    _mm256_storeu_si256(o, a);
    _mm256_storeu_si256(o + 1, b);
    _mm256_storeu_si256(o + 2, c);
    _mm256_storeu_si256(o + 3, e);
    widths[t / HL_BLOCK] = (uint8_t)bit_width(block_reduce4_avx2<false>(a, b, c, e));
  }
}
#endif

void split(const uint32_t* in, uint32_t* quotient, uint32_t* digit, uint64_t count, RadixDiv div,
           int simd) {
#ifdef HL_RADIX_SIMD
  if (simd >= 2) return split_avx512(in, quotient, digit, count, div);
  if (simd == 1) return split_avx2(in, quotient, digit, count, div);
#endif
  (void)simd;
  split_scalar(in, quotient, digit, count, div);
}

// Of `count` codes from code `start` on, how many lie below n (the rest is padding).
inline uint64_t codes_below(uint64_t n, uint64_t start, uint64_t count) {
  if (start >= n) return 0;
  return n - start < count ? n - start : count;
}

}  // namespace

namespace {

template <typename T>
RadixPlan plan_of(const T* v, uint64_t n, uint32_t max_code, uint64_t below_bytes, int threads,
                  const uint8_t* code_widths) {
  RadixPlan p;
  if (n == 0) return p;
  const uint64_t k = (uint64_t)max_code + 1;
  if (!radix_k_ok(k)) return p;
  const uint32_t g = radix_group((uint32_t)k, n);
  const uint64_t G = hl_div_up(n, g);
  const uint64_t head = radix_head_bytes((uint32_t)k, g);
  const uint64_t nb = hl_div_up(G, HL_BLOCK);
  if (head + nb >= below_bytes) return p;  // cannot pay, whatever the values
  // Nor when the top digits alone say so: a pass over 1/g of the codes, where building the values
  // reads all of them g times over. The example's training segments mostly pack smaller in
  // short blocks (every gradient segment and most lookup ones: their largest code, so K, comes
  // from a tail), and this bound shows it at a fraction of the values' cost. It never drops a
  // plan the values would keep: the section is at least this large.
  {
    uint64_t power = 1;  // K^(g-1) < K^g < 2^32
    for (uint32_t i = 0; i + 1 < g; ++i) power *= k;
    // With the codes' block widths (the quantizer's), first a bound from them: a block of top
    // digits whose codes are w bits wide holds one of at least 2^(w-1), so its value block is
    // at most a bit narrower than the pass below finds (a whole span's top lane starts on a
    // block; the last span, which may not, is taken exactly). The pass reads 1/g of the codes
    // a span apart, a stride the hardware prefetchers lose at every jump: it waited on memory.
    // A block's width from it is at least bit_width(K^(g-1)) = b, so the pass's is at most
    // (b + 1) / b of it: where this bound is below `below` by that much, so is the pass's, which
    // is skipped; the section's own size still decides.
    bool sure = false;
    if (code_widths) {
      uint64_t bound = head + nb;
      for (uint64_t a = 0; a < G && bound < below_bytes; a += kSpan) {
        const uint64_t count = G - a < kSpan ? G - a : kSpan;
        const uint64_t start = radix_code_of(G, g, a, g - 1), keep = codes_below(n, start, count);
        if (count < kSpan) {
          bound += top_digit_bytes(v + start, keep, count, power);
          continue;
        }
        for (uint64_t b = start / HL_BLOCK; b < (start + keep + HL_BLOCK - 1) / HL_BLOCK; ++b) {
          const uint32_t w = code_widths[b], least = w ? 1u << (w - 1) : 0;
          bound += block_payload_bytes(bit_width((uint32_t)(least * power)));
        }
      }
      if (bound >= below_bytes) return p;
      const uint64_t b = bit_width((uint32_t)power);
      sure = bound * (b + 1) < below_bytes * b;
    }
    uint64_t bound = head + nb;
    for (uint64_t a = 0; a < G && bound < below_bytes && !sure; a += kSpan) {
      const uint64_t count = G - a < kSpan ? G - a : kSpan;
      const uint64_t start = radix_code_of(G, g, a, g - 1);
      bound += top_digit_bytes(v + start, codes_below(n, start, count), count, power);
    }
    if (bound >= below_bytes) return p;
  }
  Buffer<uint32_t> values(G);
  Buffer<uint8_t> widths(nb);
  // Span s: values a.. and codes a * g.. (frame.h); its blocks' widths while its values are in
  // L1 (a span is whole blocks but the last): a pass of its own read them all back from memory.
  const int simd = cpu::simd_level();
  auto span_values = [&](int64_t s) {
    const uint64_t a = (uint64_t)s * kSpan, count = G - a < kSpan ? G - a : kSpan;
    uint32_t* out = values.data() + a;
#ifdef HL_RADIX_SIMD
    if (simd >= 1 && count == kSpan && a * g + (uint64_t)g * count <= n) {  // every lane whole
      const T* lane[32];  // g <= 20: K >= 3 and K^g < 2^32
      for (uint32_t i = 0; i < g; ++i) lane[i] = v + radix_code_of(G, g, a, i);
      return whole_span_avx2(lane, g, (uint32_t)k, count, out, widths.data() + a / HL_BLOCK);
    }
#endif
    (void)simd;
    for (uint64_t j = 0; j < count; ++j) out[j] = 0;
    uint32_t power = 1;  // K^i < K^g < 2^32
    for (uint32_t i = 0; i < g; ++i, power *= (uint32_t)k) {  // lanes in memory order: one stream
      const uint64_t start = radix_code_of(G, g, a, i);
      add_digits(out, v + start, codes_below(n, start, count), power);
    }
    block_widths(out, count, widths.data() + a / HL_BLOCK, 1);
  };
  static_assert(kSpan % HL_BLOCK == 0, "a span is whole blocks");
  const int64_t spans = (int64_t)hl_div_up(G, kSpan);
  // an OpenMP region costs about as much as a small segment's values
  omp_threads(n > (1u << 20) ? threads : 1, [&](int part, int parts) {
    for (int64_t s = spans * part / parts; s < spans * (part + 1) / parts; ++s) span_values(s);
  });
  const uint64_t bytes = head + nb + payload_bytes(widths.data(), nb);
  if (bytes >= below_bytes) return p;
  p.k = (uint32_t)k;
  p.g = g;
  p.n_values = G;
  p.values = std::move(values);
  p.widths = std::move(widths);
  p.head_bytes = head;
  p.bytes = bytes;
  return p;
}

}  // namespace

RadixPlan radix_plan(const uint32_t* v, uint64_t n, uint32_t max_code, uint64_t below_bytes,
                     int threads, const uint8_t* code_widths) {
  return plan_of(v, n, max_code, below_bytes, threads, code_widths);
}

RadixPlan radix_plan(const uint8_t* v, uint64_t n, uint32_t max_code, uint64_t below_bytes,
                     int threads, const uint8_t* code_widths) {
  return plan_of(v, n, max_code, below_bytes, threads, code_widths);
}

void radix_write(const RadixPlan& p, uint8_t* out, int threads) {
  if (p.k == 0) throw CodecError("radix_write of a plan that does not apply");
  uint8_t* w = radix_put_head(out, p.k, p.g);
  pack_blocks(p.values.data(), p.n_values, p.widths.data(), w, threads);
}

namespace {

struct Split : RadixLayout {
  ChunkSink inner;
  std::atomic<bool> bad{false};

  // Values [first, first + count) of the section: their digits, lane by lane, to the inner sink,
  // a span at a time (a chunk may start or end inside one). g - 1 splits; what is left of a
  // value is its top digit, which must be below K.
  static void run(void* ctx, uint64_t first, const uint32_t* values, uint64_t count) {
    Split& s = *static_cast<Split*>(ctx);
    uint32_t value[kSpan], digit[kSpan];
    uint32_t stray = 0, top = 0;  // padding digits (must be 0), largest top digit (below K)
    for (uint64_t off = 0; off < count;) {
      const uint64_t a = first + off, end_of_span = (a / kSpan + 1) * kSpan;
      const uint64_t c = (end_of_span < first + count ? end_of_span : first + count) - a;
      const uint32_t* rest = values + off;  // the values' digits not yet split off
      for (uint32_t i = 0; i + 1 < s.g; ++i) {
        split(rest, value, digit, c, s.div, s.simd);
        rest = value;
        const uint64_t start = radix_code_of(s.G, s.g, a, i), keep = codes_below(s.n, start, c);
        if (keep) s.inner.fn(s.inner.ctx, start, digit, keep);
        stray |= or_of(digit + keep, c - keep);
      }
      const uint64_t start = radix_code_of(s.G, s.g, a, s.g - 1), keep = codes_below(s.n, start, c);
      const uint32_t m = max_of(rest, c);
      top = m > top ? m : top;
      if (keep) s.inner.fn(s.inner.ctx, start, rest, keep);
      stray |= or_of(rest + keep, c - keep);
      off += c;
    }
    if (stray || top >= s.div.k) s.bad.store(true, std::memory_order_relaxed);
  }
};

}  // namespace

RadixLayout radix_layout(uint32_t k, uint32_t g, uint64_t n, const char* what) {
  const uint64_t span = radix_span(k, g);
  if (!radix_k_ok(k) || g == 0 || span == 0 || n == 0)
    throw FrameError(std::string("frame is corrupted: the ") + what + " has radix " +
                     std::to_string(k) + " in groups of " + std::to_string(g) + " for " +
                     std::to_string(n) + " codes");
  RadixLayout l;
  l.n = n;
  l.G = hl_div_up(n, g);
  l.span = span;
  l.g = g;
  l.div = radix_div_of(k);
  l.simd = cpu::simd_level();
  l.what = what;
  return l;
}

void RadixLayout::check(bool bad) const {
  if (bad)
    throw FrameError(std::string("frame is corrupted: the ") + what + " (radix " +
                     std::to_string(div.k) + ", groups of " + std::to_string(g) +
                     ") holds a value of " + std::to_string(span) + " or more, or a " +
                     "nonzero digit past its " + std::to_string(n) + " codes");
}

void radix_unpack_to(const uint8_t* in, uint64_t len, uint64_t n, uint32_t k, uint32_t g,
                     const char* what, int threads, ChunkSink sink) {
  Split s;
  static_cast<RadixLayout&>(s) = radix_layout(k, g, n, what);
  s.inner = sink;
  unpack_blocks_to(in, len, s.G, bit_width((uint32_t)(s.span - 1)), what, threads,
                   ChunkSink{&Split::run, &s});
  s.check(s.bad.load());
}

}  // namespace hl
