// Radix sections straight into a row sweep (radix_sweep.h). The values come block-unpacked from
// unpack_blocks_to a span at a time; each lane of digits goes from the split to the stage of the
// sweep as elements, looked up in a table of the K codes' elements (built by cpu::dequantize,
// so every element is the bits the general decoder writes).
#include "radix_sweep.h"

#include <string.h>

#include <string>

#include "frame_fields.h"
#include "kernels_cpu.h"
#include "pack.h"
#include "radix.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_AVX2_PATH)
#include <immintrin.h>
#define HL_RADIX_SWEEP_AVX2 1
// GCC 12's AVX-512 intrinsics warn about their own self-initialised undefined values in every
// caller (as in kernels_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace hl {
namespace {

// The table of elements: four registers of eight (two of sixteen).
constexpr uint32_t kMaxK = 32;
constexpr uint64_t kSpan = HL_RADIX_SPAN;

struct Table {
  alignas(32) uint32_t t[kMaxK];  // the element of code c (c < K; zero past K), as its bits
};

// The portable loops: lane digits to elements, one value at a time. A digit of K or more (only
// a corrupted top digit) reads entry digit % kMaxK; the caller rejects the section.
void lane_portable(const uint32_t* in, uint32_t* quot, uint64_t count, RadixDiv div,
                   const Table& tab, uint32_t* out) {
  for (uint64_t j = 0; j < count; ++j) {
    const uint32_t v = in[j], q = radix_div(v, div);
    quot[j] = q;
    out[j] = tab.t[(v - q * div.k) % kMaxK];
  }
}
// The last lane: the values left are the top digits, below K unless the section is corrupted;
// returns the largest.
uint32_t top_portable(const uint32_t* in, uint64_t count, const Table& tab, uint32_t* out) {
  uint32_t top = 0;
  for (uint64_t j = 0; j < count; ++j) {
    out[j] = tab.t[in[j] % kMaxK];
    top = in[j] > top ? in[j] : top;
  }
  return top;
}

#ifdef HL_RADIX_SWEEP_AVX2
#define HL_AVX2 __attribute__((target("avx2")))

// The table in registers, eight entries each.
struct TableRegs {
  __m256 r[4];
};
HL_AVX2 inline TableRegs table_regs(const Table& tab) {
  TableRegs t;
  for (int i = 0; i < 4; ++i)
    t.r[i] = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab.t) + i));
  return t;
}

// The elements of eight digits below 8 * NT: one permute a register of the table, blended on
// the digits' bits 3 and 4 (moved to the sign bit, which blendv tests).
template <int NT>
HL_AVX2 inline __m256i lookup(const TableRegs& t, __m256i d) {
  __m256 r = _mm256_permutevar8x32_ps(t.r[0], d);
  if (NT > 1) {
    const __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(d, 28));
    r = _mm256_blendv_ps(r, _mm256_permutevar8x32_ps(t.r[1], d), b3);
    if (NT > 2) {
      __m256 hi = _mm256_permutevar8x32_ps(t.r[2], d);
      if (NT > 3) hi = _mm256_blendv_ps(hi, _mm256_permutevar8x32_ps(t.r[3], d), b3);
      r = _mm256_blendv_ps(r, hi, _mm256_castsi256_ps(_mm256_slli_epi32(d, 27)));
    }
  }
  return _mm256_castps_si256(r);
}

// radix.cc's split_avx2 (radix_div in 32-bit lanes), the digit looked up instead of stored.
template <int NT>
HL_AVX2 void lane_avx2(const uint32_t* in, uint32_t* quot, uint64_t count, RadixDiv div,
                       const Table& tab, uint32_t* out) {
  const TableRegs t = table_regs(tab);
  const __m256i k = _mm256_set1_epi32((int)div.k);
  uint64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
    const __m256i q = radix_div8(v, div);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quot + j), q);
    const __m256i d = _mm256_sub_epi32(v, _mm256_mullo_epi32(q, k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), lookup<NT>(t, d));
  }
  lane_portable(in + j, quot + j, count - j, div, tab, out + j);
}

// The same sixteen lanes wide (radix.h's radix_div16): the table is two registers, one
// two-source permute indexed by the digit's low five bits (entry digit % kMaxK, as the portable
// loop reads).
#define HL_AVX512 __attribute__((target("avx512f,avx2")))

HL_AVX512 void lane_avx512(const uint32_t* in, uint32_t* quot, uint64_t count, RadixDiv div,
                           const Table& tab, uint32_t* out) {
  const __m512i t0 = _mm512_loadu_si512(tab.t), t1 = _mm512_loadu_si512(tab.t + 16);
  const __m512i k = _mm512_set1_epi32((int)div.k);
  uint64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512i v = _mm512_loadu_si512(in + j);
    const __m512i q = radix_div16(v, div);
    _mm512_storeu_si512(quot + j, q);
    const __m512i d = _mm512_sub_epi32(v, _mm512_mullo_epi32(q, k));
    _mm512_storeu_si512(out + j, _mm512_permutex2var_epi32(t0, d, t1));
  }
  lane_portable(in + j, quot + j, count - j, div, tab, out + j);
}

HL_AVX512 uint32_t top_avx512(const uint32_t* in, uint64_t count, const Table& tab,
                              uint32_t* out) {
  const __m512i t0 = _mm512_loadu_si512(tab.t), t1 = _mm512_loadu_si512(tab.t + 16);
  __m512i top = _mm512_setzero_si512();
  uint64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512i d = _mm512_loadu_si512(in + j);
    top = _mm512_max_epu32(top, d);
    _mm512_storeu_si512(out + j, _mm512_permutex2var_epi32(t0, d, t1));
  }
  const uint32_t m = top_portable(in + j, count - j, tab, out + j);
  const uint32_t v = _mm512_reduce_max_epu32(top);
  return v > m ? v : m;
}

template <int NT>
HL_AVX2 uint32_t top_avx2(const uint32_t* in, uint64_t count, const Table& tab, uint32_t* out) {
  const TableRegs t = table_regs(tab);
  __m256i top = _mm256_setzero_si256();
  uint64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
    top = _mm256_max_epu32(top, d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), lookup<NT>(t, d));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  uint32_t m = top_portable(in + j, count - j, tab, out + j);
  for (uint32_t x : lanes) m = x > m ? x : m;
  return m;
}
#endif

// The ChunkSink of the section's values: whole spans (a chunk of unpack_blocks_to is one when
// it starts on a span; any other is gathered into one first), each lane by lane into the sweep.
struct Spans : RadixLayout {
  RowSweep<uint32_t>* sweep;
  Table tab;
  int nt;    // table registers: ceil(K / 8)
  uint32_t stray = 0, top = 0;  // padding digits (must be 0), largest top digit (below K)
  uint32_t gathered[kSpan];     // a span's values arriving in pieces
  uint64_t have = 0;
  uint32_t quot[kSpan];

  uint64_t span_len(uint64_t a) const { return G - a < kSpan ? G - a : kSpan; }

  // Lane i's digits of the L values at in: elements into the sweep's stage, quotients to quot.
  void lane(const uint32_t* in, uint64_t L, uint32_t* out) {
#ifdef HL_RADIX_SWEEP_AVX2
    if (simd >= 2) return lane_avx512(in, quot, L, div, tab, out);
    if (simd >= 1) {
      switch (nt) {
        case 1: return lane_avx2<1>(in, quot, L, div, tab, out);
        case 2: return lane_avx2<2>(in, quot, L, div, tab, out);
        case 3: return lane_avx2<3>(in, quot, L, div, tab, out);
        default: return lane_avx2<4>(in, quot, L, div, tab, out);
      }
    }
#endif
    lane_portable(in, quot, L, div, tab, out);
  }
  uint32_t top_lane(const uint32_t* in, uint64_t L, uint32_t* out) {
#ifdef HL_RADIX_SWEEP_AVX2
    if (simd >= 2) return top_avx512(in, L, tab, out);
    if (simd >= 1) {
      switch (nt) {
        case 1: return top_avx2<1>(in, L, tab, out);
        case 2: return top_avx2<2>(in, L, tab, out);
        case 3: return top_avx2<3>(in, L, tab, out);
        default: return top_avx2<4>(in, L, tab, out);
      }
    }
#endif
    return top_portable(in, L, tab, out);
  }

  // Span starting at value a, its L values at v: lane i is codes radix_code_of(G, g, a, i) on,
  // those below n to the sweep in order (lane after lane), the others padding.
  void sweep_span(uint64_t a, const uint32_t* v, uint64_t L) {
    const uint32_t* in = v;
    for (uint32_t i = 0; i < g; ++i) {
      const uint64_t start = radix_code_of(G, g, a, i);
      const uint64_t keep = start >= n ? 0 : (n - start < L ? n - start : L);
      uint32_t* out = sweep->stage();
      const bool last = i + 1 == g;
      if (keep == L && last) {
        const uint32_t m = top_lane(in, L, out);
        top = m > top ? m : top;
      } else if (keep == L) {
        lane(in, L, out);
      } else {  // the section's last span: its padding digits are checked one by one
        for (uint64_t j = 0; j < L; ++j) {
          const uint32_t q = last ? 0 : radix_div(in[j], div), d = in[j] - q * div.k;
          if (!last) quot[j] = q;
          if (last) top = d > top ? d : top;
          if (j < keep)
            out[j] = tab.t[d % kMaxK];
          else
            stray |= d;
        }
      }
      if (keep) sweep->commit(keep);
      in = quot;
    }
  }

  static void run(void* ctx, uint64_t first, const uint32_t* v, uint64_t count) {
    Spans& s = *static_cast<Spans*>(ctx);
    while (count) {
      const uint64_t a = first - s.have;  // the span's first value
      const uint64_t L = s.span_len(a);
      if (s.have == 0 && count >= L) {  // a whole span in place
        s.sweep_span(first, v, L);
        first += L;
        v += L;
        count -= L;
        continue;
      }
      const uint64_t take = L - s.have < count ? L - s.have : count;
      memcpy(s.gathered + s.have, v, take * 4);
      s.have += take;
      first += take;
      v += take;
      count -= take;
      if (s.have == L) {
        s.have = 0;
        s.sweep_span(a, s.gathered, L);
      }
    }
  }
};

}  // namespace

bool radix_sweep_applies(const SegmentView& h) {
  return h.dtype == HL_FLOAT32 && !h.dithered && h.radix_k && h.radix_k <= kMaxK;
}

void radix_sweep_f32(const SegmentView& h, double step, RowSweep<uint32_t>* sweep) {
  const uint32_t k = h.radix_k, g = h.radix_g;
  Spans s;
  static_cast<RadixLayout&>(s) = radix_layout(k, g, h.n_unique * h.row_len, "code section");
  s.sweep = sweep;
  s.nt = (int)hl_div_up(k, 8);
  uint32_t codes[kMaxK] = {};
  for (uint32_t c = 0; c < k; ++c) codes[c] = c;
  float elements[kMaxK] = {};
  cpu::dequantize(HL_FLOAT32, codes, k, step, elements);
  memcpy(s.tab.t, elements, sizeof(elements));
  unpack_blocks_to(h.code + h.radix_head, h.code_bytes - h.radix_head, s.G,
                   bit_width((uint32_t)(s.span - 1)), s.what, 1, ChunkSink{&Spans::run, &s});
  s.check(s.stray || s.top >= k);
}

}  // namespace hl
