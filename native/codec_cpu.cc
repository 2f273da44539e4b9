// Reference CPU codec (C++17, OpenMP): the format of frame.h, templated on the element type.
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec.h"
#include "codec_common.h"
#include "codec_cpu_internal.h"
#include "crc32c.h"
#include "frame_v2.h"
#include "kernels_cpu.h"
#include "level1_sections.h"
#include "map_buckets.h"
#include "pack.h"
#include "parallel.h"
#include "pieces.h"
#include "radix.h"
#include "short_blocks.h"
#include "rans.h"

namespace hl {
namespace {

template <int DT>
struct Tensor {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* x;
  uint64_t n_rows, row_len;
  uint64_t size() const { return n_rows * row_len; }
};

// Smallest and largest finite value, as double (lo > hi when there is none).
template <int DT>
void finite_range(const Tensor<DT>& t, int threads, double* lo_out, double* hi_out) {
  const uint64_t n = t.size();
  const int nt = n > 65536 ? threads : 1;
  std::vector<double> lo(nt, INFINITY), hi(nt, -INFINITY);
#pragma omp parallel num_threads(nt)
  {
    int k = omp_get_thread_num_safe();
    uint64_t a, b;
    split_range(n, k, omp_get_num_threads_safe(), &a, &b);
    cpu::finite_range(DT, t.x + a, b - a, &lo[k], &hi[k]);
  }
  *lo_out = *std::min_element(lo.begin(), lo.end());
  *hi_out = *std::max_element(hi.begin(), hi.end());
}

// Numbers rows by first occurrence of their content, one row at a time: map[r] = unique index,
// first[u] = first row holding unique u. same(a, b) decides equality of rows with equal hashes
// (hashes[] is indexed by row and must be filled up to the row added). The table starts small
// and doubles, so data with few distinct rows (hot lookups) probes a table that stays in cache.
class Numbering {
 public:
  explicit Numbering(const uint64_t* hashes) : hashes_(hashes) { resize(1024); }

  template <class Same>
  void add(uint64_t r, Same same, uint32_t* map) {
    const uint64_t h = hashes_[r];
    uint64_t s = h & (cap_ - 1);
    for (;;) {
      const uint64_t e = slots_[s];
      if (e == kEmpty) {
        map[r] = (uint32_t)first.size();
        slots_[s] = (h & kTag) | first.size();
        first.push_back(r);
        if (2 * first.size() > cap_) grow();  // keep the load under one half
        return;
      }
      const uint64_t u = e & ~kTag;
      if ((e & kTag) == (h & kTag) && same(first[u], r)) {
        map[r] = (uint32_t)u;
        return;
      }
      s = (s + 1) & (cap_ - 1);
    }
  }

  // The probes of add(r) miss the cache: the table outgrows L1 and a repeated row's first
  // occurrence lies anywhere in the tensor. Numbering calls these some rows ahead of add():
  // prefetch_slot(r) brings row r's home slot in; prefetch_candidate(r, row) then reads that
  // slot and, when its tag matches, prefetches the row add(r) will compare against. Hints only:
  // the table may change in between, and add() decides on the real contents.
  void prefetch_slot(uint64_t r) const { __builtin_prefetch(&slots_[hashes_[r] & (cap_ - 1)]); }

  template <class Row>
  void prefetch_candidate(uint64_t r, Row row) const {
    const uint64_t h = hashes_[r];
    const uint64_t e = slots_[h & (cap_ - 1)];
    if (e != kEmpty && (e & kTag) == (h & kTag) && (e & ~kTag) < first.size())
      row(first[e & ~kTag]);
  }

  // add(r) for every row of [lo, hi), with the prefetches above kSlotAhead and kRowAhead rows
  // ahead.
  template <class Same, class Row>
  void add_range(uint64_t lo, uint64_t hi, Same same, Row row, uint32_t* map) {
    for (uint64_t r = lo; r < hi; ++r) {
      if (r + kSlotAhead < hi) prefetch_slot(r + kSlotAhead);
      if (r + kRowAhead < hi) prefetch_candidate(r + kRowAhead, row);
      add(r, same, map);
    }
  }

  std::vector<uint64_t> first;

 private:
  static constexpr uint64_t kSlotAhead = 24, kRowAhead = 12;
  static constexpr uint64_t kEmpty = ~0ull, kTag = 0xffffffff00000000ull;

  void resize(uint64_t cap) {
    cap_ = cap;
    slots_ = Buffer<uint64_t>(cap);
    std::fill(slots_.data(), slots_.data() + cap, kEmpty);
  }

  void grow() {
    resize(2 * cap_);
    const uint64_t mask = cap_ - 1;
    for (uint64_t v = 0; v < first.size(); ++v) {
      const uint64_t hv = hashes_[first[v]];
      uint64_t t = hv & mask;
      while (slots_[t] != kEmpty) t = (t + 1) & mask;
      slots_[t] = (hv & kTag) | v;
    }
  }

  const uint64_t* hashes_;
  Buffer<uint64_t> slots_;  // (hash high 32 bits) | unique index
  uint64_t cap_ = 0;
};

// Prefetches the start of a row that is about to be compared (or quantized): its first 1 KiB,
// enough for the hardware prefetcher to carry on through longer rows.
inline void prefetch_row(const void* p, uint64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const uint64_t n = bytes < 1024 ? bytes : 1024;
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(c + off, 0, 2);
}

template <class Same, class Row>
uint64_t number_rows(uint64_t rows, const uint64_t* hashes, Same same, Row row, uint32_t* map,
                     std::vector<uint64_t>* first) {
  Numbering num(hashes);
  num.add_range(0, rows, same, row, map);
  *first = std::move(num.first);
  return first->size();
}

// Rows repeated bit for bit, found in one pass over the tensor: blocks of rows are hashed (in
// parallel) and numbered while still in cache, and the finite value range is taken from the
// same blocks when the bound is relative.
struct DistinctRows {
  Buffer<uint32_t> map;         // row -> distinct row
  std::vector<uint64_t> first;  // distinct row -> its first row
};

template <int DT>
DistinctRows distinct_raw_rows(const Tensor<DT>& t, bool need_range, int threads, double* lo,
                               double* hi) {
  typedef typename Elem<DT>::raw_t raw_t;
  const uint64_t rows = t.n_rows, d = t.row_len, row_bytes = d * sizeof(raw_t);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(t.x);
  DistinctRows out;
  out.map = Buffer<uint32_t>(rows);
  Buffer<uint64_t> hashes(rows);
  Numbering num(hashes.data());
  auto same = [&](uint64_t a, uint64_t b) {
    return memcmp(t.x + a * d, t.x + b * d, row_bytes) == 0;
  };
  const uint64_t block = std::max<uint64_t>(1, (256u << 10) / std::max<uint64_t>(row_bytes, 1));
  double lo_all = INFINITY, hi_all = -INFINITY;
  for (uint64_t b0 = 0; b0 < rows; b0 += block) {
    const uint64_t b1 = std::min(rows, b0 + block);
    const int nt = (b1 - b0) * d > 65536 ? threads : 1;
    double lo_t[64], hi_t[64];
#pragma omp parallel num_threads(nt < 64 ? nt : 64)
    {
      const int k = omp_get_thread_num_safe();
      uint64_t a, e;
      split_range(b1 - b0, k, omp_get_num_threads_safe(), &a, &e);
      cpu::hash_raw_rows(bytes + (b0 + a) * row_bytes, e - a, row_bytes, hashes.data() + b0 + a);
      lo_t[k] = INFINITY;
      hi_t[k] = -INFINITY;
      if (need_range) cpu::finite_range(DT, t.x + (b0 + a) * d, (e - a) * d, &lo_t[k], &hi_t[k]);
    }
    for (int k = 0; k < (nt < 64 ? nt : 64); ++k) {
      lo_all = std::min(lo_all, lo_t[k]);
      hi_all = std::max(hi_all, hi_t[k]);
    }
    num.add_range(b0, b1, same, [&](uint64_t f) { prefetch_row(t.x + f * d, row_bytes); },
                  out.map.data());
  }
  out.first = std::move(num.first);
  if (need_range) {
    *lo = lo_all;
    *hi = hi_all;
  }
  return out;
}

// Subtractive dither of a frame (frame.h); on only for lossy frames, which then skip dedup.
struct Dither {
  bool on = false;
  uint32_t seed = 0;
};

// The rows a frame stores, coded: unique rows in order of first occurrence.
struct Coded {
  uint64_t n_unique = 0;
  Buffer<uint32_t> codes;        // n_unique x row_len: zigzag codes, kOutlierMark, or raw bits
  Buffer<uint8_t> row_outlier;   // per unique row (lossy frames)
  std::vector<uint64_t> source;  // tensor row of each unique row; empty when it is the identity
  Buffer<uint32_t> map;          // tensor row -> unique row; only when n_unique < n_rows
};

template <int DT>
void code_rows_into(const Tensor<DT>& t, const uint64_t* idx, uint64_t rows, bool lossless,
                    double eb_abs, const Dither& dither, int threads, uint32_t* codes,
                    uint8_t* row_outlier, uint64_t* hashes) {
  cpu::QuantParams base;
  base.step = 2.0 * eb_abs;
  base.inv_step = 1.0 / base.step;
  base.eb_abs = eb_abs;
  base.dither = dither.on;
  base.seed = dither.seed;
  const uint64_t d = t.row_len;
  const int nt = rows * d > 65536 ? threads : 1;
#pragma omp parallel num_threads(nt)
  {
    uint64_t a, b;
    split_range(rows, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &a, &b);
    const uint64_t* ia = idx ? idx + a : nullptr;
    const void* x = idx ? (const void*)t.x : (const void*)(t.x + a * d);
    cpu::QuantParams qp = base;
    qp.first = a * d;  // dithered frames are never deduplicated: idx is null
    if (lossless)
      cpu::raw_rows(DT, x, ia, b - a, d, codes + a * d);
    else
      cpu::quantize_rows(DT, x, ia, b - a, d, qp, codes + a * d, row_outlier + a,
                         hashes ? hashes + a : nullptr);
  }
}

// Quantizes and deduplicates. Rows repeated bit for bit (hot embedding lookups) are found
// first, on their raw bytes, so each distinct row is quantized once; rows that differ in bits
// but share codes are merged in a second pass over the distinct rows' codes. Numbering both
// passes by first occurrence gives the same unique order as one pass over all codes.
template <int DT>
Coded code_rows(const Tensor<DT>& t, DistinctRows* distinct, bool lossless, double eb_abs,
                const Dither& dither, int threads) {
  typedef typename Elem<DT>::raw_t raw_t;
  const uint64_t rows = t.n_rows, d = t.row_len;
  Coded c;
  if (!distinct) {
    c.n_unique = rows;
    c.codes = Buffer<uint32_t>(rows * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
    code_rows_into(t, nullptr, rows, lossless, eb_abs, dither, threads, c.codes.data(),
                   c.row_outlier.data(), nullptr);
    return c;
  }
  // Pass 1 (distinct_raw_rows): rows repeated bit for bit.
  const Buffer<uint32_t>& map1 = distinct->map;
  const std::vector<uint64_t>& first1 = distinct->first;
  const uint64_t n1 = first1.size();

  // Pass 2: codes of the distinct raw rows, merged where codes (and outlier bits) agree.
  Buffer<uint32_t> codes1(n1 * d);
  Buffer<uint8_t> out1(lossless ? 0 : n1);
  Buffer<uint64_t> h2(lossless ? 0 : n1);
  code_rows_into(t, first1.data(), n1, lossless, eb_abs, Dither(), threads, codes1.data(),
                 out1.data(), h2.data());
  Buffer<uint32_t> map2;
  std::vector<uint64_t> first2;
  uint64_t n2 = n1;
  if (!lossless) {
    map2 = Buffer<uint32_t>(n1);
    auto same = [&](uint64_t a, uint64_t b) {
      if (memcmp(&codes1[a * d], &codes1[b * d], d * 4) != 0) return false;
      if (!out1[a]) return true;
      // The mark alone says nothing of the value: outliers must match bit for bit.
      const raw_t* xa = t.x + first1[a] * d;
      const raw_t* xb = t.x + first1[b] * d;
      for (uint64_t i = 0; i < d; ++i)
        if (codes1[a * d + i] == kOutlierMark && xa[i] != xb[i]) return false;
      return true;
    };
    auto row = [&](uint64_t f) { prefetch_row(&codes1[f * d], d * 4); };
    n2 = number_rows(n1, h2.data(), same, row, map2.data(), &first2);
  }
  auto unique_of = [&](uint64_t r) -> uint32_t { return n2 < n1 ? map2[map1[r]] : map1[r]; };
  auto distinct_of = [&](uint64_t u) -> uint64_t { return n2 < n1 ? first2[u] : u; };

  if (!dedup_pays(rows, n2, d)) {
    c.n_unique = rows;
    if (n1 == rows) {  // no row repeated bit for bit: the codes are already in row order
      c.codes = std::move(codes1);
      c.row_outlier = std::move(out1);
      return c;
    }
    // Store every row: expand the distinct rows' codes back to all rows.
    c.codes = Buffer<uint32_t>(rows * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * d > 65536)
    for (int64_t r = 0; r < (int64_t)rows; ++r) {
      memcpy(&c.codes[r * d], &codes1[(uint64_t)map1[r] * d], d * 4);
      if (!lossless) c.row_outlier[r] = out1[map1[r]];
    }
    return c;
  }
  c.n_unique = n2;
  c.source.resize(n2);
  for (uint64_t u = 0; u < n2; ++u) c.source[u] = first1[distinct_of(u)];
  if (n2 < n1) {
    c.codes = Buffer<uint32_t>(n2 * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : n2);
    for (uint64_t u = 0; u < n2; ++u) {
      memcpy(&c.codes[u * d], &codes1[first2[u] * d], d * 4);
      if (!lossless) c.row_outlier[u] = out1[first2[u]];
    }
  } else {
    c.codes = std::move(codes1);
    c.row_outlier = std::move(out1);
  }
  if (n2 < rows) {
    c.map = Buffer<uint32_t>(rows);
    for (uint64_t r = 0; r < rows; ++r) c.map[r] = unique_of(r);
  } else {
    c.source.clear();  // every row distinct: the identity
  }
  return c;
}

struct Outlier {
  uint64_t pos;
  uint32_t raw;
};

// Block packing in two steps, so that level 2 can compare sizes before packing anything.
// Lossy level-1 codes may be radix packed or in short blocks instead (radix.h,
// short_blocks.h), whichever is smallest (level1_packing).
struct Packing {
  Buffer<uint8_t> widths;
  uint64_t bytes = 0;
  RadixPlan radix;  // radix.k != 0: the section is radix.bytes of radix packing
  bool short_blocks = false;  // the section is bytes of short blocks of widths16
  Buffer<uint8_t> widths16;
};

struct Sections {
  bool map_rans = false;  // the map is a compact rANS section of rans_map_symbols
  bool map_buckets = false;  // ... of bucketed symbols (map_buckets.h)
  Bytes map;
  Bytes code;
  std::vector<Outlier> outliers;
  uint8_t level = 1;
  uint64_t n_unique = 0;
  // Level 2, small: codes whose entropy coding waits for the frame's other segments
  // (encode_deferred), so that they may share one table; plan packs them if that is smaller.
  Buffer<uint32_t> deferred;
  uint64_t n_deferred = 0;
  Packing plan;
};

Packing plan_packing(const uint32_t* v, uint64_t n, int threads, uint32_t* max_out = nullptr) {
  Packing p;
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  p.widths = Buffer<uint8_t>(nb);
  block_widths(v, n, p.widths.data(), threads, max_out);
  p.bytes = nb + payload_bytes(p.widths.data(), nb);
  return p;
}

// The code section's plan: block packing, or for lossy level-1 codes (`level1`) the smallest of block packing, radix packing and short blocks (level1_packing).
Packing plan_codes(const uint32_t* v, uint64_t n, bool level1, int threads) {
  if (!level1 || n == 0) return plan_packing(v, n, threads);
  Packing p;
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  p.widths = Buffer<uint8_t>(nb);
  Buffer<uint8_t> w16(short_n_blocks(n));
  uint32_t max_code = 0;
  level1_widths(v, n, w16.data(), p.widths.data(), &max_code, threads);
  const uint64_t block = nb + payload_bytes(p.widths.data(), nb);
  const uint64_t shorts = short_applies(n, max_code) ? short_bytes(w16.data(), n) : 0;
  // radix_plan builds its values only when they can beat `below`: radix wins ties with short
  // blocks, so short + 1
  const uint64_t below = shorts && shorts + 1 < block ? shorts + 1 : block;
  p.radix = radix_plan(v, n, max_code, below, threads);
  switch (level1_packing(block, p.radix.k ? p.radix.bytes : 0, shorts)) {
    case HL_PACK_RADIX:
      p.bytes = p.radix.bytes;
      break;
    case HL_PACK_SHORT:
      p.radix = RadixPlan();
      p.short_blocks = true;
      p.widths16 = std::move(w16);
      p.bytes = shorts;
      break;
    default:
      p.radix = RadixPlan();
      p.bytes = block;
  }
  return p;
}

Bytes pack(const uint32_t* v, uint64_t n, const Packing& p, int threads) {
  Bytes out(p.bytes);
  if (p.radix.k)
    radix_write(p.radix, out.data(), threads);
  else if (p.short_blocks)
    short_write(v, n, p.widths16.data(), out.data(), threads);
  else
    pack_blocks(v, n, p.widths.data(), out.data(), threads);
  return out;
}

Bytes packed(const uint32_t* v, uint64_t n, int threads) {
  return pack(v, n, plan_packing(v, n, threads), threads);
}

// The entropy-coded row map: symbol 0 for a row seen first, u + 1 for a repeat of
// unique row u (hot rows come first, so their symbols are small and frequent), rANS coded.
std::vector<uint8_t> rans_map_encode(const uint32_t* map, uint64_t n, int threads) {
  Buffer<uint32_t> sym(n);
  uint64_t next = 0;
  for (uint64_t r = 0; r < n; ++r) {
    if (map[r] == next) {
      sym[r] = 0;
      ++next;
    } else {
      sym[r] = map[r] + 1;
    }
  }
  return rans_encode(sym.data(), n, threads);
}

// Segments of at most this many codes defer their entropy coding to the frame: on
// small segments one table a frame costs less than one a segment (encode_deferred).
constexpr uint64_t kShareCodes = uint64_t(1) << 15;

// Builds the map, code and outlier sections.
template <int DT>
Sections build_sections(const Tensor<DT>& t, Coded& c, bool lossless, uint8_t level,
                        int threads) {
  Sections s;
  const uint64_t d = t.row_len;
  const uint64_t n_unique = c.n_unique;
  s.n_unique = n_unique;
  uint32_t* ucodes = c.codes.data();
  if (n_unique < t.n_rows) {
    s.map = packed(c.map.data(), t.n_rows, threads);
    // Level 2 may store the map entropy coded, when that is smaller. Level 1 keeps block
    // packing: decoding a coded map costs as much as decoding level-2 codes.
    if (level == 2) {
      std::vector<uint8_t> coded = rans_map_encode(c.map.data(), t.n_rows, threads);
      std::vector<uint8_t> buckets = map_buckets_encode(c.map.data(), t.n_rows, threads);
      const bool bucketed = buckets.size() < coded.size();
      if (bucketed) coded.swap(buckets);
      if (coded.size() + 2 < s.map.size()) {  // its size in the descriptor: ~2 bytes
        s.map = Bytes(coded.size());
        memcpy(s.map.data(), coded.data(), coded.size());
        s.map_rans = true;
        s.map_buckets = bucketed;
      }
    }
  }
  if (!lossless) {
    for (uint64_t u = 0; u < n_unique; ++u) {
      if (!c.row_outlier[u]) continue;
      const uint64_t r = c.source.empty() ? u : c.source[u];
      for (uint64_t i = 0; i < d; ++i) {
        if (ucodes[u * d + i] != kOutlierMark) continue;
        s.outliers.push_back({u * d + i, (uint32_t)t.x[r * d + i]});
        ucodes[u * d + i] = 0;
      }
    }
  }
  const uint64_t n_codes = n_unique * d;
  // Radix packing and short blocks only where level 1 was asked for: level 2's choices between
  // rANS, shared tables and its packed fallback are weighed against block packing.
  Packing plan = plan_codes(ucodes, n_codes, !lossless && level == 1, threads);
  if (level == 2 && n_codes > 0 && n_codes <= kShareCodes) {
    s.deferred = std::move(c.codes);
    s.n_deferred = n_codes;
    s.plan = std::move(plan);
    s.level = 2;  // until encode_deferred finds packing smaller
    return s;
  }
  if (level == 2 && n_codes > 0) {
    std::vector<uint8_t> entropy = rans_encode(ucodes, n_codes, threads);
    if (entropy.size() < plan.bytes) {  // the packed section is never built
      s.code = Bytes(entropy.size());
      memcpy(s.code.data(), entropy.data(), entropy.size());
      s.level = 2;
      return s;
    }
  }
  s.code = pack(ucodes, n_codes, plan, threads);
  return s;
}

// A segment built in scratch memory but not yet written out: its descriptor's fields and
// sections. Building and writing are apart so that a call of many pieces can build them all in
// parallel, then write each straight to its final, gap-free place.
struct Prepared {
  std::vector<int64_t> shape;
  Sections s;
  uint64_t n_rows = 0, row_len = 0;
  bool lossless = false, dithered = false;
  uint32_t bound = 0;  // hl_bound_code of the bound coded with (lossy)
  double lo = NAN, hi = NAN;  // finite range, when it was taken
  bool deduped = false;       // s.n_unique counts distinct rows (not just n_rows)
  // a deferred code section ends up no larger than its packing
  uint64_t code_bytes() const { return s.n_deferred ? s.plan.bytes : s.code.size(); }
};

template <int DT>
Prepared prepare(const Tensor<DT>& t, const CompressParams& p, const std::vector<int64_t>& shape,
                 int threads, bool force_lossless) {
  const bool need_range = (p.mode == HL_MODE_REL && p.error_bound > 0) || p.want_range;
  // Dithered rows never repeat (each element has its own offset), so dither skips dedup.
  const bool dedup = dedup_applies(p.dedup && !p.dither, t.n_rows, t.row_len);
  double lo = 0, hi = 0;
  DistinctRows distinct;
  if (dedup)
    distinct = distinct_raw_rows(t, need_range, threads, &lo, &hi);
  else if (need_range)
    finite_range(t, threads, &lo, &hi);
  // The frame stores 24 bits of the bound: code with exactly that, rounded down, value.
  const uint32_t bound = hl_bound_code(absolute_bound(p, lo, hi));
  const double eb_abs = hl_bound_of_code(bound);
  const bool lossless = force_lossless || eb_abs == 0;
  Dither dither;
  dither.on = p.dither && !lossless;
  dither.seed = p.dither_seed;
  Prepared f;
  {
    Coded coded = code_rows(t, dedup ? &distinct : nullptr, lossless, eb_abs, dither, threads);
    distinct = DistinctRows();  // back to the pool before the sections take theirs
    f.s = build_sections(t, coded, lossless, p.level, threads);
  }
  const Sections& s = f.s;
  if (!lossless && lossy_exceeds_bound(t.n_rows, t.row_len, s.map.size(), f.code_bytes(),
                                       s.outliers.size()))
    return prepare(t, p, shape, threads, true);
  f.n_rows = t.n_rows;
  f.row_len = t.row_len;
  f.lossless = lossless;
  f.dithered = dither.on;
  f.shape = shape;
  f.bound = lossless ? 0 : bound;
  if (need_range && t.n_rows * t.row_len > 0 && lo <= hi) {  // lo > hi: no finite element
    f.lo = lo;
    f.hi = hi;
  }
  f.deduped = dedup;
  return f;
}

namespace share {

// Bits of coding `counts` with `freq` (of 1 << HL_RANS_BITS).
double bits(const uint64_t* counts, const uint32_t* freq) {
  double b = 0;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) b += (double)counts[s] * (HL_RANS_BITS - log2((double)freq[s]));
  return b;
}

void set_code(Prepared& f, std::vector<uint8_t>&& code) {
  Sections& s = f.s;
  if (code.size() < s.plan.bytes) {
    s.code = Bytes(code.size());
    memcpy(s.code.data(), code.data(), code.size());
    s.level = 2;
  } else {
    s.code = pack(s.deferred.data(), s.n_deferred, s.plan, 1);
    s.level = 1;
  }
}

}  // namespace share

// Entropy codes the deferred segments of frames[first, first + count) (one v2 frame): with
// one table the first of them carries and the others borrow (frame.h) when every level-2
// segment of the frame is deferred and that is estimated smaller, else each with its own.
void encode_deferred(std::vector<Prepared>& frames, size_t first, size_t count, int threads) {
  std::vector<size_t> idx;
  bool all = true;
  for (size_t i = first; i < first + count; ++i) {
    if (frames[i].s.n_deferred) idx.push_back(i);
    else if (frames[i].s.level == 2) all = false;
  }
  if (idx.empty()) return;
  std::vector<std::vector<uint64_t>> counts(idx.size(), std::vector<uint64_t>(256));
  uint64_t pooled[256] = {0};
  for (size_t j = 0; j < idx.size(); ++j) {
    const Sections& s = frames[idx[j]].s;
    rans_counts(s.deferred.data(), s.n_deferred, counts[j].data());
    for (int k = 0; k < 256; ++k) pooled[k] += counts[j][k];
  }
  uint32_t shared[256];
  rans_freqs(pooled, shared);
  bool use = all && idx.size() > 1;
  if (use) {  // estimated bytes of the codes and tables either way (streams cost the same)
    double own = 0, one = 8.0 * (rans_table_bytes(shared) + 2 * (idx.size() - 1));
    for (size_t j = 0; j < idx.size(); ++j) {
      uint32_t freq[256];
      rans_freqs(counts[j].data(), freq);
      own += share::bits(counts[j].data(), freq) + 8.0 * rans_table_bytes(freq);
      one += share::bits(counts[j].data(), shared);
    }
    use = one < own;
  }
  std::vector<std::vector<uint8_t>> codes(idx.size());
  auto encode_all = [&](bool with_shared) {
    parallel::parallel_items(idx.size(), threads, [&](size_t j) {
      const Sections& s = frames[idx[j]].s;
      codes[j] = rans_encode(s.deferred.data(), s.n_deferred, 1, with_shared ? shared : nullptr,
                             j == 0);
    });
  };
  encode_all(use);
  if (use) {  // the table's carrier and every borrower must stay entropy coded
    for (size_t j = 0; j < idx.size(); ++j)
      if (codes[j].size() >= frames[idx[j]].s.plan.bytes) {
        encode_all(false);
        break;
      }
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    share::set_code(frames[idx[j]], std::move(codes[j]));
    frames[idx[j]].s.deferred = Buffer<uint32_t>();
    frames[idx[j]].s.n_deferred = 0;
  }
}

// The descriptor of a prepared piece.
SegmentDesc segment_desc(const Prepared& f, uint8_t mode, uint8_t dtype) {
  const Sections& s = f.s;
  SegmentDesc d;
  // the CUDA encoder's descriptors take their flags from the same function (codec_cuda_v2.cu)
  d.flags = v2_segment_flags(s.level == 2, f.lossless, s.n_unique == f.n_rows,
                             s.outliers.size(), mode == HL_MODE_REL, f.dithered, s.map_rans,
                             s.map_buckets);
  d.map_bytes = s.map.size();
  d.rows = f.shape.empty() ? 1 : (uint64_t)f.shape[0];
  d.bound = f.lossless ? 0 : f.bound;
  d.n_unique = s.n_unique;
  d.n_outliers = s.outliers.size();
  d.code_bytes = f.code_bytes();
  d.payload_bytes = d.map_bytes + d.code_bytes +
                    d.n_outliers * v2_outlier_record_bytes(s.n_unique * f.row_len, dtype);
  return d;
}

// Writes a prepared piece's payload (map, code, outliers) at w; returns its end.
uint8_t* write_payload(const Prepared& f, uint64_t elem_bytes, uint8_t* w) {
  const Sections& s = f.s;
  if (!s.map.empty()) memcpy(w, s.map.data(), s.map.size());
  w += s.map.size();
  if (!s.code.empty()) memcpy(w, s.code.data(), s.code.size());
  w += s.code.size();
  const uint8_t pb = v2_pos_bytes(s.n_unique * f.row_len);
  for (const Outlier& o : s.outliers) {
    memcpy(w, &o.pos, pb);  // little-endian: the low bytes
    memcpy(w + pb, &o.raw, elem_bytes);
    w += pb + elem_bytes;
  }
  return w;
}

Prepared prepare_one(const void* input, const CompressParams& p, const std::vector<int64_t>& shape,
                     int threads) {
  uint64_t rows, len;
  shape_to_rows(shape, &rows, &len);
  switch (p.dtype) {
    case HL_FLOAT32:
      return prepare(Tensor<HL_FLOAT32>{static_cast<const uint32_t*>(input), rows, len}, p, shape,
                     threads, false);
    case HL_FLOAT16:
      return prepare(Tensor<HL_FLOAT16>{static_cast<const uint16_t*>(input), rows, len}, p, shape,
                     threads, false);
    case HL_BFLOAT16:
      return prepare(Tensor<HL_BFLOAT16>{static_cast<const uint16_t*>(input), rows, len}, p,
                     shape, threads, false);
  }
  throw ArgumentError("unsupported dtype code " + std::to_string(p.dtype));
}

}  // namespace

namespace {
uint64_t write_single(const void* input, const CompressParams& p,
                      const std::vector<int64_t>& shape,
                      const std::function<uint8_t*(uint64_t)>& alloc, int threads);
}  // namespace

uint64_t compress_cpu(const void* input, const CompressParams& p,
                      const std::vector<int64_t>& shape, uint8_t* out, uint64_t out_cap,
                      int threads) {
  check_params(p);
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  uint64_t size = 0;
  write_single(input, p, shape, [&](uint64_t bytes) {
    if (bytes > out_cap)
      throw ArgumentError("output buffer holds " + std::to_string(out_cap) +
                          " bytes, the frame needs " + std::to_string(bytes));
    size = bytes;
    return out;
  }, resolve_threads(threads));
  return size;
}

uint64_t max_grouped_bytes(const std::vector<int64_t>& rows, const std::vector<int64_t>& trailing,
                           const std::vector<int64_t>& groups, uint64_t prefix_bytes) {
  CompressParams p{HL_FLOAT32, HL_MODE_ABS, 1, false, 0.0};
  check_groups(groups, rows.size());
  return grouped_bound(plan_pieces(p, rows, trailing, {}), groups.size(), prefix_bytes);
}

namespace {

// How a call's pieces share the threads. Many small pieces: one thread each (parallel_items,
// which never waits for a helper that has no core). Few large ones: each piece uses all
// threads in turn.
struct PieceThreads {
  int across;  // threads over the pieces
  int inner;   // threads within one piece
};

PieceThreads piece_threads(size_t n, int threads) {
  const bool across = (int)n >= threads && n > 1;
  return {across ? threads : 1, across ? 1 : threads};
}

// Every piece quantized, deduplicated and packed into its sections, in parallel.
std::vector<Prepared> prepare_pieces(const void* input, const CompressParams& p, const Pieces& c,
                                     PieceThreads t, double* stats) {
  const size_t n = c.shapes.size();
  const uint8_t* in = static_cast<const uint8_t*>(input);
  const uint64_t eb = hl_elem_bytes(p.dtype);
  std::vector<Prepared> frames(n);
  parallel::parallel_items(n, t.across, [&](size_t i) {
    frames[i] = prepare_one(in + c.in_off[i] * eb, c.params[i], c.shapes[i], t.inner);
    if (stats) {
      double* s = stats + i * HL_STATS_PER_PIECE;
      s[HL_STAT_MIN] = frames[i].lo;
      s[HL_STAT_MAX] = frames[i].hi;
      const bool counted = frames[i].deduped || frames[i].n_rows <= 1;
      s[HL_STAT_UNIQUE] = counted ? (double)frames[i].s.n_unique : NAN;
      s[HL_STAT_FINITE] = s[HL_STAT_SUM] = s[HL_STAT_SUMSQ] = NAN;
    }
  });
  return frames;
}

// Builds every piece in parallel, then one frame a non-empty group, asking place(total) for
// the memory of the whole layout and writing each frame once, at its final place in it; with
// an extension (ext, the transport's: frame.h) every group's frame carries it, and an
// empty group gets a frame of no segments (ndim and trailing from `trailing`). Returns a size
// a piece: its segment, the group's first piece also counting the frame header; *group_bytes
// (when given) gets each group's frame size (0 for an empty group without extension).
std::vector<uint64_t> build_and_place(const void* input, const CompressParams& p,
                                         const Pieces& c, const std::vector<int64_t>& groups,
                                         uint64_t prefix_bytes,
                                         const std::function<uint8_t*(uint64_t)>& place,
                                         int threads, const std::string& ext = std::string(),
                                         const std::vector<int64_t>& trailing = {},
                                         std::vector<uint64_t>* group_bytes = nullptr,
                                         double* stats = nullptr) {
  const size_t n = c.shapes.size();
  const PieceThreads t = piece_threads(n, threads);
  const uint64_t eb = hl_elem_bytes(p.dtype);
  std::vector<Prepared> frames = prepare_pieces(input, p, c, t, stats);
  {
    size_t at = 0;
    for (int64_t g : groups) {
      encode_deferred(frames, at, (size_t)g, threads);
      at += (size_t)g;
    }
  }
  std::vector<SegmentDesc> descs(n);
  for (size_t i = 0; i < n; ++i) descs[i] = segment_desc(frames[i], p.mode, p.dtype);
  struct Group {
    size_t first, count;
    HeadV2 head;
    uint64_t at = 0, total = 0, header = 0;
  };
  std::vector<Group> gs;
  std::vector<uint64_t> sizes(n, 0);
  if (group_bytes) group_bytes->assign(groups.size(), 0);
  uint64_t w = 0, first = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int64_t g = groups[gi];
    w += prefix_bytes;
    Group grp{first, (size_t)g, HeadV2()};
    first += (uint64_t)g;
    if (g == 0 && ext.empty()) continue;  // an empty group sends no frame
    grp.head.dtype = p.dtype;
    grp.head.ext = ext;
    if (g == 0) {
      grp.head.ndim = 1 + (int)trailing.size();
      grp.head.trailing = trailing;
    } else {
      grp.head.ndim = (int)c.shapes[grp.first].size();
      if (grp.head.ndim > 1)
        grp.head.trailing.assign(c.shapes[grp.first].begin() + 1, c.shapes[grp.first].end());
    }
    for (size_t i = grp.first; i < grp.first + grp.count; ++i)
      grp.head.seeded |= (descs[i].flags & HL_SEG_DITHER) != 0;
    grp.head.seed = grp.head.seeded ? c.params[grp.first].dither_seed : 0;
    const std::vector<SegmentDesc> mine(descs.begin() + grp.first,
                                        descs.begin() + grp.first + grp.count);
    grp.total = v2_frame_size(grp.head, mine, &grp.header);
    grp.at = w;
    w += grp.total;
    if (group_bytes) (*group_bytes)[gi] = grp.total;
    for (size_t i = grp.first; i < grp.first + grp.count; ++i)
      sizes[i] = descs[i].descriptor_bytes() + descs[i].payload_bytes;
    if (g > 0) sizes[grp.first] += grp.header;
    gs.push_back(std::move(grp));
  }
  uint8_t* out = place(w);
  parallel::parallel_items(gs.size(), t.across, [&](size_t k) {
    const Group& g = gs[k];
    const std::vector<SegmentDesc> mine(descs.begin() + g.first, descs.begin() + g.first + g.count);
    uint8_t* frame = out + g.at;
    uint8_t* pw = v2_write_head(g.head, mine, g.total, frame);
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      pw = write_payload(frames[i], eb, pw);
      frames[i] = Prepared();
    }
    if (pw != frame + g.total) throw CodecError("v2 frame layout is inconsistent");
    v2_seal(frame, g.total);
  });
  return sizes;
}

// One tensor as a frame of one segment.
uint64_t write_single(const void* input, const CompressParams& p,
                         const std::vector<int64_t>& shape,
                         const std::function<uint8_t*(uint64_t)>& alloc, int threads) {
  Pieces c;
  c.params = {p};
  c.shapes = {shape};
  c.in_off = {0, 0};
  uint64_t size = 0;
  build_and_place(input, p, c, {1}, 0, [&](uint64_t bytes) {
    size = bytes;
    return alloc(bytes);
  }, threads);
  return size;
}
}  // namespace

std::vector<uint64_t> compress_into_cpu(const void* input, const CompressParams& p,
                                        const std::vector<int64_t>& rows,
                                        const std::vector<int64_t>& trailing,
                                        const std::vector<double>& error_bounds,
                                        const std::vector<int64_t>& groups, uint64_t prefix_bytes,
                                        uint8_t* out, uint64_t out_cap, int threads,
                                        const std::string& ext,
                                        std::vector<uint64_t>* group_bytes, double* stats) {
  CompressParams q = p;
  q.want_range = q.want_range || stats != nullptr;
  const Pieces c = plan_pieces(q, rows, trailing, error_bounds);
  check_groups(groups, rows.size());
  if (ext.size() > HL_V2_MAX_EXT)
    throw ArgumentError("a frame extension of " + std::to_string(ext.size()) +
                        " bytes, at most " + std::to_string(HL_V2_MAX_EXT) + " fit");
  const uint64_t need = grouped_bound(c, groups.size(), prefix_bytes);
  if (need > out_cap)
    throw ArgumentError("output buffer holds " + std::to_string(out_cap) +
                        " bytes, the frames may need " + std::to_string(need));
  auto place = [&](uint64_t) { return out; };
  return build_and_place(input, q, c, groups, prefix_bytes, place, resolve_threads(threads), ext,
                         trailing, group_bytes, stats);
}

namespace {
template <int DT>
void one_piece_stats(const Tensor<DT>& t, int threads, double* s) {
  double lo = INFINITY, hi = -INFINITY;
  if (dedup_applies(true, t.n_rows, t.row_len)) {
    s[HL_STAT_UNIQUE] = (double)distinct_raw_rows(t, true, threads, &lo, &hi).first.size();
  } else {
    s[HL_STAT_UNIQUE] = (double)t.n_rows;
    if (t.n_rows * t.row_len > 0) finite_range(t, threads, &lo, &hi);
  }
  s[HL_STAT_MIN] = lo <= hi ? lo : NAN;
  s[HL_STAT_MAX] = lo <= hi ? hi : NAN;
  // Moments in double, as the float64 reference would take them; non-finite elements left out
  // as the range leaves them out.
  // Branch-free so that the loop vectorises (a piece is one thread's: pieces run in parallel).
  const uint64_t n = t.n_rows * t.row_len;
  double n_fin = 0, sum = 0, sumsq = 0;
#pragma omp simd reduction(+ : n_fin, sum, sumsq)
  for (uint64_t i = 0; i < n; ++i) {
    const double v = Elem<DT>::to_double(t.x[i]);
    const bool finite = v - v == 0;  // false for NaN and +-inf
    const double m = finite ? v : 0.0;
    n_fin += finite ? 1.0 : 0.0;
    sum += m;
    sumsq += m * m;
  }
  s[HL_STAT_FINITE] = n_fin;
  s[HL_STAT_SUM] = sum;
  s[HL_STAT_SUMSQ] = sumsq;
}
}  // namespace

void piece_stats_cpu(const void* input, uint8_t dtype, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& trailing, double* stats, int threads) {
  CompressParams p{};
  p.dtype = dtype;
  p.mode = HL_MODE_ABS;
  p.level = 1;
  const Pieces c = plan_pieces(p, rows, trailing, {});
  const uint8_t* in = static_cast<const uint8_t*>(input);
  const uint64_t eb = hl_elem_bytes(dtype);
  const PieceThreads pt = piece_threads(c.shapes.size(), resolve_threads(threads));
  parallel::parallel_items(c.shapes.size(), pt.across, [&](size_t i) {
    uint64_t n_rows, len;
    shape_to_rows(c.shapes[i], &n_rows, &len);
    const void* x = in + c.in_off[i] * eb;
    double* s = stats + i * HL_STATS_PER_PIECE;
    switch (dtype) {
      case HL_FLOAT32:
        return one_piece_stats(Tensor<HL_FLOAT32>{static_cast<const uint32_t*>(x), n_rows, len},
                               pt.inner, s);
      case HL_FLOAT16:
        return one_piece_stats(Tensor<HL_FLOAT16>{static_cast<const uint16_t*>(x), n_rows, len},
                               pt.inner, s);
      case HL_BFLOAT16:
        return one_piece_stats(Tensor<HL_BFLOAT16>{static_cast<const uint16_t*>(x), n_rows, len},
                               pt.inner, s);
    }
  });
}

std::vector<uint64_t> compress_alloc_cpu(const void* input, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         const std::function<uint8_t*(uint64_t)>& alloc,
                                         int threads) {
  const Pieces c = plan_pieces(p, rows, trailing, error_bounds);
  return build_and_place(input, p, c, {(int64_t)rows.size()}, 0, alloc,
                         resolve_threads(threads));
}

uint64_t compress_shape_alloc_cpu(const void* input, const CompressParams& p,
                                  const std::vector<int64_t>& shape,
                                  const std::function<uint8_t*(uint64_t)>& alloc, int threads) {
  check_params(p);
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  threads = resolve_threads(threads);
  return write_single(input, p, shape, alloc, threads);
}

std::vector<uint64_t> compress_many_cpu(const void* input, const CompressParams& p,
                                        const std::vector<int64_t>& rows,
                                        const std::vector<int64_t>& trailing,
                                        const std::vector<double>& error_bounds, uint8_t* out,
                                        uint64_t out_cap, int threads) {
  return compress_into_cpu(input, p, rows, trailing, error_bounds,
                           {(int64_t)rows.size()}, 0, out, out_cap, threads);
}

}  // namespace hl
