// Encoder stage 2: quantization (or raw bits) of the rows a piece stores, and the merging of
// rows that share codes: after dedup.cc's rows repeated bit for bit, or, for lossy frames
// without ids, as the only dedup (code_distinct_rows).
#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "dedup.h"
#include "encode_stages.h"
#include "kernels_cpu.h"
#include "parallel.h"
#include "short_blocks.h"

namespace hl {
namespace enc {
namespace {

// Codes held as bytes as codes.
HL_AVX2_CLONES void widen_codes(const uint8_t* b, uint64_t n, uint32_t* z) {
  for (uint64_t i = 0; i < n; ++i) z[i] = b[i];
}

template <int DT>
void code_rows_into(const Tensor<DT>& t, const uint64_t* idx, uint64_t rows, bool lossless,
                    double eb_abs, const Dither& dither, int threads, uint32_t* codes,
                    uint8_t* row_outlier, uint64_t* hashes) {
  const cpu::QuantParams base = cpu::quant_params(eb_abs, dither.on, dither.seed);
  const uint64_t d = t.row_len;
  const int nt = rows * d > 65536 ? threads : 1;
  omp_threads(nt, [&](int part, int parts) {
    uint64_t a, b;
    split_range(rows, part, parts, &a, &b);
    const uint64_t* ia = idx ? idx + a : nullptr;
    const void* x = idx ? (const void*)t.x : (const void*)(t.x + a * d);
    cpu::QuantParams qp = base;
    qp.first = a * d;  // dithered frames are never deduplicated: idx is null
    if (lossless)
      cpu::raw_rows(DT, x, ia, b - a, d, codes + a * d);
    else
      cpu::quantize_rows(DT, x, ia, b - a, d, qp, codes + a * d, row_outlier + a,
                         hashes ? hashes + a : nullptr);
  });
}

// code_rows_into for every row of a lossy piece, with level1_widths taken a tile at a time right
// after the tile is quantized, while its codes are still in L2: a separate widths pass read all
// of them back from memory (tens of MB). Tiles are runs of 32 rows, so every tile starts on a
// pair of short blocks (32 codes) and the widths are the same as one pass's. A tile whose codes
// all fit a byte is stored as bytes (Coded::bytes): the codes of a rel bound above ~0.004 do, and
// then neither this pass nor the sections move four bytes a code. The first tile that does not
// fit (a code of 256 or more, an outlier's mark) puts the codes in Coded::codes, where its
// thread writes every later tile directly; at the end the byte tiles are widened into it.
template <int DT>
void code_rows_with_widths(const Tensor<DT>& t, double eb_abs, const Dither& dither, int threads,
                           double max_abs, Coded* c) {
  const uint64_t rows = t.n_rows, d = t.row_len, n = rows * d;
  c->w16 = Buffer<uint8_t>(short_n_blocks(n));
  c->w32 = Buffer<uint8_t>(hl_div_up(n, HL_BLOCK));
  c->bytes = Buffer<uint8_t>(n);
  cpu::QuantParams base = cpu::quant_params(eb_abs, dither.on, dither.seed);
  base.max_abs = max_abs;
  constexpr uint64_t kTileCodes = 1u << 15;  // 128 KiB of codes and as much input
  const uint64_t tile = std::max<uint64_t>(1, kTileCodes / 32 / d) * 32;  // rows
  const uint64_t tiles = hl_div_up(rows, tile);
  Buffer<uint8_t> in_codes(tiles);  // 1: the tile's codes are in c->codes, 0: in c->bytes
  const int nt = n > 65536 ? threads : 1;
  c->max_code = omp_max(nt, [&](int part, int parts) {
    uint64_t ta, tb;
    split_range(tiles, part, parts, &ta, &tb);
    uint32_t m = 0;
    const uint64_t tile_rows = std::min(tile, rows);
    Buffer<uint32_t> tmp(tile_rows * d);
    uint32_t* wide = nullptr;  // c->codes, once this thread has met a tile that needs it
    cpu::QuantParams qp = base;
    for (uint64_t ti = ta; ti < tb; ++ti) {
      const uint64_t r0 = ti * tile, r1 = std::min(r0 + tile, rows), k = (r1 - r0) * d;
      uint8_t* w16 = c->w16.data() + r0 * d / HL_SHORT_BLOCK;
      uint8_t* w32 = c->w32.data() + r0 * d / HL_BLOCK;
      uint32_t* z = wide ? wide + r0 * d : tmp.data();
      uint32_t tm;
      qp.first = r0 * d;
      in_codes[ti] = 1;
      if (wide) {
        cpu::quantize_rows(DT, t.x + r0 * d, nullptr, r1 - r0, d, qp, z,
                           c->row_outlier.data() + r0, nullptr);
      } else {
        uint8_t* bytes = c->bytes.data() + r0 * d;
        // Rows matter here only for their outlier flags, and a tile of byte codes has no
        // outlier: it is quantized as one run of k elements, without a row's setup and tail
        // every d elements. A run that is not bytes leaves all its codes in z, and its rows'
        // flags are read off them (an outlier's code is its mark).
        uint8_t all, run_outlier;
        cpu::quantize_rows_narrow(DT, t.x + r0 * d, nullptr, 1, k, qp, z, &run_outlier, nullptr,
                                  &all, bytes);
        if (all) {
          std::fill(c->row_outlier.data() + r0, c->row_outlier.data() + r1, 0);
          level1_widths(bytes, k, w16, w32, &tm, 1);
          m = tm > m ? tm : m;
          in_codes[ti] = 0;
          continue;
        }
        for (uint64_t r = 0; r < r1 - r0; ++r)
          c->row_outlier[r0 + r] = run_outlier && std::find(z + r * d, z + (r + 1) * d,
                                                            kOutlierMark) != z + (r + 1) * d;
#pragma omp critical(hl_code_rows_wide)
        {
          if (c->codes.empty()) c->codes = Buffer<uint32_t>(n);
          wide = c->codes.data();
        }
        memcpy(wide + r0 * d, z, k * 4);
        z = wide + r0 * d;
      }
      level1_widths(z, k, w16, w32, &tm, 1);
      m = tm > m ? tm : m;
    }
    return m;
  });
  if (c->codes.empty()) return;
  uint32_t* wide = c->codes.data();
  omp_threads(nt, [&](int part, int parts) {
    uint64_t ta, tb;
    split_range(tiles, part, parts, &ta, &tb);
    for (uint64_t ti = ta; ti < tb; ++ti) {
      if (in_codes[ti]) continue;
      const uint64_t r0 = ti * tile, r1 = std::min(r0 + tile, rows);
      widen_codes(c->bytes.data() + r0 * d, (r1 - r0) * d, wide + r0 * d);
    }
  });
  c->bytes = Buffer<uint8_t>();
}

// Rows whose codes are equal are one unique row only if their outliers are the same bits too:
// the mark alone says nothing of the value.
template <typename raw_t>
bool outliers_match(const uint32_t* codes, const raw_t* xa, const raw_t* xb, uint64_t d) {
  for (uint64_t i = 0; i < d; ++i)
    if (codes[i] == kOutlierMark && xa[i] != xb[i]) return false;
  return true;
}

// The Coded of every row (dedup does not pay): each row's codes and outlier flag copied from
// its unique row (map), outlier flags only for lossy codes (outlier not null).
Coded every_row(const uint32_t* codes, const uint8_t* outlier, const uint32_t* map,
                uint64_t rows, uint64_t d, int threads) {
  Coded c;
  c.n_unique = rows;
  c.codes = Buffer<uint32_t>(rows * d);
  c.row_outlier = Buffer<uint8_t>(outlier ? rows : 0);
  omp_threads(rows * d > 65536 ? threads : 1, [&](int part, int parts) {
    uint64_t a, b;
    split_range(rows, part, parts, &a, &b);
    for (uint64_t r = a; r < b; ++r) {
      memcpy(&c.codes[r * d], &codes[(uint64_t)map[r] * d], d * 4);
      if (outlier) c.row_outlier[r] = outlier[map[r]];
    }
  });
  return c;
}

// every_row of unique rows held as bytes (narrow: no outliers).
Coded every_row(const uint8_t* bytes, const uint32_t* map, uint64_t rows, uint64_t d,
                int threads) {
  Coded c;
  c.n_unique = rows;
  c.bytes = Buffer<uint8_t>(rows * d);
  c.row_outlier = Buffer<uint8_t>(rows);
  omp_threads(rows * d > 65536 ? threads : 1, [&](int part, int parts) {
    uint64_t a, b;
    split_range(rows, part, parts, &a, &b);
    for (uint64_t r = a; r < b; ++r) {
      memcpy(&c.bytes[r * d], &bytes[(uint64_t)map[r] * d], d);
      c.row_outlier[r] = 0;
    }
  });
  return c;
}

}  // namespace

template <int DT>
Coded code_rows(const Tensor<DT>& t, DistinctRows* distinct, bool lossless, double eb_abs,
                const Dither& dither, int threads, bool widths, double max_abs) {
  const uint64_t rows = t.n_rows, d = t.row_len;
  Coded c;
  if (!distinct) {
    c.n_unique = rows;
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
    if (widths && !lossless && rows * d > 0) {
      code_rows_with_widths(t, eb_abs, dither, threads, max_abs, &c);
      return c;
    }
    c.codes = Buffer<uint32_t>(rows * d);
    code_rows_into(t, nullptr, rows, lossless, eb_abs, dither, threads, c.codes.data(),
                   c.row_outlier.data(), nullptr);
    return c;
  }
  // Lossless rows repeated bit for bit (distinct): each distinct row's raw bits, once.
  const Buffer<uint32_t>& map1 = distinct->map;
  const std::vector<uint64_t>& first1 = distinct->first;
  const uint64_t n1 = first1.size();
  Buffer<uint32_t> codes1(n1 * d);
  Buffer<uint8_t> none;  // lossless: no outlier flags
  code_rows_into(t, first1.data(), n1, true, 0, Dither(), threads, codes1.data(), none.data(),
                 nullptr);
  if (!dedup_pays(rows, n1, d)) {
    c.n_unique = rows;
    if (n1 == rows) {  // no row repeated: the codes are already in row order
      c.codes = std::move(codes1);
      return c;
    }
    return every_row(codes1.data(), nullptr, map1.data(), rows, d, threads);  // every row
  }
  c.n_unique = n1;
  c.codes = std::move(codes1);
  if (n1 < rows) {
    c.source = Buffer<uint64_t>(n1);
    std::copy(first1.begin(), first1.end(), c.source.data());
    c.map = std::move(distinct->map);
  }
  return c;
}

namespace {


// The rows of code_distinct_rows's current block, from cpu::quantize_rows_narrow: their codes,
// outlier flags, narrow flags and bytes (the form unique rows are compared in) and hashes.
struct Block {
  Buffer<uint32_t> z;
  Buffer<uint8_t> outlier, narrow, bytes;
  Buffer<uint64_t> hash;
  Buffer<uint32_t> cand;  // CodeTable::candidate of each row
  Block(uint64_t rows, uint64_t d)
      : z(rows * d), outlier(rows), narrow(rows), bytes(rows * d), hash(rows), cand(rows) {}
};

inline void copy_bytes(uint8_t* to, const uint8_t* from, uint64_t d) {
#if defined(__SSE2__)
  uint64_t i = 0;
  for (; i + 16 <= d; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
  if (i < d) memcpy(to + i, from + i, d - i);
#else
  memcpy(to, from, d);
#endif
}

// Unique rows numbered by first occurrence of their codes (and outliers' raw bits) in an
// open-addressing table of (hash high half | unique index): the index leads straight to the
// unique row's compact codes, which a repeated row is compared with.
class CodeTable {
 public:
  // Sized for `expected` unique rows, so that a tensor with as many does not rehash on the way
  // (and no larger: a piece of 64 rows filled 8 KiB of slots for 128 used).
  CodeTable(const Buffer<uint64_t>& uhash, uint64_t expected) : uhash_(uhash) {
    uint64_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    resize(cap);
  }

  // The slot holding a unique row whose hash is h, or the empty slot to put it in, with `same`
  // deciding between rows of equal hash; *found says which.
  template <class Same>
  uint64_t find(uint64_t h, Same same, bool* found) const {
    for (uint64_t s = h & (cap_ - 1);; s = (s + 1) & (cap_ - 1)) {
      const uint64_t e = slots_[s];
      if (e == kEmpty) {
        *found = false;
        return s;
      }
      if ((e & kTag) == (h & kTag) && same((uint32_t)e)) {
        *found = true;
        return s;
      }
    }
  }
  uint32_t at(uint64_t s) const { return (uint32_t)slots_[s]; }

  void put(uint64_t s, uint64_t h, uint32_t u) {
    slots_[s] = (h & kTag) | u;
    if (2 * (uint64_t)(u + 1) > cap_) grow(u + 1);  // keep the load under one half
  }

  // The unique row find(h, ...) would most likely return: the first whose tag matches along
  // h's probe, or kNone. A hint only, for probing a block's rows all at once (their loads
  // overlap, where find's wait on each other's compares); find decides.
  static constexpr uint32_t kNone = 0xffffffffu;
  void prefetch_slot(uint64_t h) const { __builtin_prefetch(&slots_[h & (cap_ - 1)]); }
  // Branch-free over the first two slots of the probe (the second is only looked at past a
  // full first one), so that the misses of many rows overlap; kNone past them too.
  uint32_t candidate(uint64_t h) const {
    const uint64_t s = h & (cap_ - 1), tag = h & kTag;
    const uint64_t e0 = slots_[s], e1 = slots_[(s + 1) & (cap_ - 1)];
    uint32_t c = (e0 != kEmpty && (e1 & kTag) == tag) ? (uint32_t)e1 : kNone;
    return (e0 & kTag) == tag ? (uint32_t)e0 : c;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull, kTag = 0xffffffff00000000ull;

  void resize(uint64_t cap) {
    cap_ = cap;
    slots_ = Buffer<uint64_t>(cap);
    std::fill(slots_.data(), slots_.data() + cap, kEmpty);
  }
  void grow(uint32_t n) {
    resize(2 * cap_);
    for (uint32_t u = 0; u < n; ++u) {
      uint64_t t = uhash_[u] & (cap_ - 1);
      while (slots_[t] != kEmpty) t = (t + 1) & (cap_ - 1);
      slots_[t] = (uhash_[u] & kTag) | u;
    }
  }

  const Buffer<uint64_t>& uhash_;
  Buffer<uint64_t> slots_;
  uint64_t cap_ = 0;
};

// Rows ahead whose table slot is fetched while a block's candidates are looked up.
#ifndef HL_PROBE_AHEAD
#define HL_PROBE_AHEAD 32
#endif
constexpr uint64_t kProbeAhead = HL_PROBE_AHEAD;

}  // namespace

template <int DT>
Coded code_distinct_rows(const Tensor<DT>& t, const DistinctRows* repeats, double eb_abs,
                         int threads, bool widths, double max_abs) {
  const uint64_t rows = t.n_rows, d = t.row_len;
  // The rows quantized: every row, or the distinct rows `repeats` leaves, gathered in row order
  // (the map below is then of those, and `repeats` carries it to every row at the end).
  const uint64_t* pick = repeats ? repeats->first.data() : nullptr;
  const uint64_t m = repeats ? repeats->first.size() : rows;
  auto row_of = [&](uint64_t k) { return pick ? pick[k] : k; };
  // Unique rows in order of first occurrence: codes as bytes (narrow rows) or codes (wide rows),
  // outlier flag, hash (its tag bit 32 says wide), first row. Sized for the worst case; only what
  // is used is touched. Narrow rows' codes are written only at the end, and only when a wide row
  // was met or level 2 asks for codes (without `widths`): lossy level-1 frames then take the bytes.
  Buffer<uint32_t> ucodes(m * d);
  bool any_wide = false;
  Buffer<uint8_t> ubytes(m * d), uout(m);
  Buffer<uint64_t> uhash(m);
  Buffer<uint64_t> source(m);
  Buffer<uint32_t> map(m);
  CodeTable table(uhash, m);
  uint32_t n = 0;
  // Level-1 widths of the unique codes (Coded::w16), taken after each block over the pairs of
  // short blocks its new rows completed, while they are in cache: [0, done) has them.
  Buffer<uint8_t> w16(widths ? short_n_blocks(m * d) : 0);
  Buffer<uint8_t> w32(widths ? hl_div_up(m * d, HL_BLOCK) : 0);
  uint64_t done = 0;
  uint32_t max_code = 0;
  auto widths_up_to = [&](uint64_t end) {  // while every row is narrow
    if (w32.empty() || any_wide || end <= done) return;
    uint32_t m;
    level1_widths(&ubytes[done], end - done, &w16[done / HL_SHORT_BLOCK], &w32[done / HL_BLOCK],
                  &m, 1);
    max_code = m > max_code ? m : max_code;
    done = end;
  };

  // Blocks of rows small enough for their codes to stay in L2 between quantizing and numbering
  // (larger with more threads, which quantize a block together).
  const uint64_t block_codes = threads > 1 ? (uint64_t)threads << 17 : 1u << 15;
  const uint64_t block = std::max<uint64_t>(1, block_codes / std::max<uint64_t>(d, 1));
  Block b(std::min(block, m), d);
  cpu::QuantParams qp = cpu::quant_params(eb_abs);
  qp.max_abs = max_abs;
  // Whether rows are still numbered. dedup_pays only falls as unique rows are found, so once it
  // fails for those found so far the frame stores every row whatever the rest hold: the rest
  // are quantized without hashes and taken as unique rows of their own, which the every_row
  // expansion below turns into the same frame (d16, 55% of rows distinct: compress 1.29x
  // faster, benchmarks/RESULTS.md).
  bool numbering = true;
  for (uint64_t b0 = 0; b0 < m; b0 += block) {
    const uint64_t nb = std::min(block, m - b0);
    {
      const int nt = nb * d > 65536 ? threads : 1;
      omp_threads(nt, [&](int part, int parts) {
        uint64_t a, e;
        split_range(nb, part, parts, &a, &e);
        cpu::quantize_rows_narrow(DT, pick ? t.x : t.x + (b0 + a) * d,
                                  pick ? pick + b0 + a : nullptr, e - a, d, qp,
                                  b.z.data() + a * d, b.outlier.data() + a,
                                  numbering ? b.hash.data() + a : nullptr, b.narrow.data() + a,
                                  b.bytes.data() + a * d);
      });
    }
    const uint8_t* bnarrow = b.narrow.data();
    const uint8_t* bbytes = b.bytes.data();
    const uint64_t* bhash = b.hash.data();
    uint32_t* bcand = b.cand.data();
    uint8_t* ub = ubytes.data();
    auto same = [&](uint64_t i, uint32_t u) {  // the tags matched: both rows narrow, or neither
      if (bnarrow[i]) return rows_equal(ub + (uint64_t)u * d, bbytes + i * d, d);
      const uint32_t* zi = &b.z[i * d];
      if (!rows_equal(&ucodes[(uint64_t)u * d], zi, d * 4)) return false;
      return !b.outlier[i] ||
             outliers_match(zi, t.x + source[u] * d, t.x + row_of(b0 + i) * d, d);
    };
    auto look = [&](uint64_t i) {
      if (i + kProbeAhead < nb) table.prefetch_slot(bhash[i + kProbeAhead]);  // the probe's
      const uint32_t u = table.candidate(bhash[i]);  // branches would serialize its misses
      bcand[i] = u;
      // no branch either: a row without a candidate prefetches unique row 0
      const uint64_t at = (uint64_t)(u == CodeTable::kNone ? 0 : u) * d;
      if (d <= 64)
        __builtin_prefetch(ub + at);
      else
        prefetch_row(ub + at, d);
    };
    auto add = [&](uint64_t i) {  // row i as a new unique row
      const uint32_t u = n++;
      if (bnarrow[i]) {
        copy_bytes(ub + (uint64_t)u * d, bbytes + i * d, d);
      } else {
        memcpy(&ucodes[(uint64_t)u * d], &b.z[i * d], d * 4);
        any_wide = true;
      }
      uout[u] = b.outlier[i];
      uhash[u] = numbering ? bhash[i] : (uint64_t)!bnarrow[i] << 32;  // the tag bit: wide
      source[u] = row_of(b0 + i);
      map[b0 + i] = u;
      return u;
    };
    auto resolve = [&](uint64_t i) {
      // The table holds one unique row a content: a candidate that is the same row is the one
      // find would return.
      if (bcand[i] != CodeTable::kNone && same(i, bcand[i])) {
        map[b0 + i] = bcand[i];
        return;
      }
      const uint64_t h = bhash[i];
      bool found;
      const uint64_t s = table.find(h, [&](uint32_t u) { return same(i, u); }, &found);
      if (found) {
        map[b0 + i] = table.at(s);
        return;
      }
      table.put(s, h, add(i));
    };
    if (!numbering) {
      for (uint64_t i = 0; i < nb; ++i) add(i);
      widths_up_to((uint64_t)n * d / (2 * HL_SHORT_BLOCK) * (2 * HL_SHORT_BLOCK));
      continue;
    }
    // Every row's candidate first, its compact codes fetched while the other rows probe: the
    // compares below then read cached rows. Only a row with no candidate (new, or first seen
    // in this block) or a false one (a tag collision) probes again.
    for (uint64_t i = 0; i < nb; ++i) look(i);
    for (uint64_t i = 0; i < nb; ++i) resolve(i);
    widths_up_to((uint64_t)n * d / (2 * HL_SHORT_BLOCK) * (2 * HL_SHORT_BLOCK));
    numbering = dedup_pays(rows, n, d);
  }

  if (repeats) {  // a row repeated bit for bit takes its distinct row's unique row
    Buffer<uint32_t> all(rows);
    for (uint64_t r = 0; r < rows; ++r) all[r] = map[repeats->map[r]];
    map = std::move(all);
  }
  const bool as_bytes = widths && !any_wide;
  if (!as_bytes) {
    for (uint64_t u = 0; u < n; ++u)
      if (!((uhash[u] >> 32) & 1)) widen_codes(&ubytes[u * d], d, &ucodes[u * d]);
  }
  if (!dedup_pays(rows, n, d) && n < rows) {  // store every row: expand the unique rows back
    if (as_bytes) return every_row(ubytes.data(), map.data(), rows, d, threads);
    return every_row(ucodes.data(), uout.data(), map.data(), rows, d, threads);
  }
  widths_up_to((uint64_t)n * d);  // the last, partial pair
  Coded c;
  c.n_unique = n;
  if (as_bytes) {
    c.w16 = std::move(w16);
    c.w32 = std::move(w32);
    c.max_code = max_code;
    c.bytes = std::move(ubytes);
  } else {
    c.codes = std::move(ucodes);
  }
  c.row_outlier = std::move(uout);
  if (n < rows) {
    c.source = std::move(source);
    c.map = std::move(map);
  }
  return c;
}

template Coded code_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, DistinctRows*, bool, double, const Dither&, int, bool, double);
template Coded code_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, DistinctRows*, bool, double, const Dither&, int, bool, double);
template Coded code_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, DistinctRows*, bool, double, const Dither&, int, bool, double);
template Coded code_distinct_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, const DistinctRows*, double, int, bool, double);
template Coded code_distinct_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, const DistinctRows*, double, int, bool, double);
template Coded code_distinct_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, const DistinctRows*, double, int, bool, double);

}  // namespace enc
}  // namespace hl
