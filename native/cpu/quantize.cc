// Encoder stage 2: quantization (or raw bits) of the rows a piece stores, and the merging of
// rows that share codes: after dedup.cc's rows repeated bit for bit, or, for lossy frames
// without ids, as the only dedup (code_distinct_rows).
#include <math.h>
#include <string.h>

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

template <int DT>
void code_rows_into(const Tensor<DT>& t, const uint64_t* idx, uint64_t rows, bool lossless,
                    double eb_abs, const Dither& dither, int threads, uint32_t* codes,
                    uint8_t* row_outlier, uint64_t* hashes) {
  const cpu::QuantParams base = cpu::quant_params(eb_abs, dither.on, dither.seed);
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

// code_rows_into for every row of a lossy piece, with level1_widths taken a tile at a time right
// after the tile is quantized, while its codes are still in L2: a separate widths pass read all
// of them back from memory (tens of MB). Threads take whole runs of 32 rows, so every tile
// starts on a pair of short blocks (32 codes) and the widths are the same as one pass's.
template <int DT>
void code_rows_with_widths(const Tensor<DT>& t, double eb_abs, const Dither& dither, int threads,
                           Coded* c) {
  const uint64_t rows = t.n_rows, d = t.row_len, n = rows * d;
  c->w16 = Buffer<uint8_t>(short_n_blocks(n));
  c->w32 = Buffer<uint8_t>(hl_div_up(n, HL_BLOCK));
  const cpu::QuantParams base = cpu::quant_params(eb_abs, dither.on, dither.seed);
  constexpr uint64_t kTileCodes = 1u << 15;  // 128 KiB of codes and as much input
  const uint64_t tile = std::max<uint64_t>(1, kTileCodes / 32 / d) * 32;  // rows
  const uint64_t units = hl_div_up(rows, 32);
  const int nt = n > 65536 ? threads : 1;
  uint32_t* codes = c->codes.data();
  uint32_t m = 0;
#pragma omp parallel num_threads(nt) reduction(max : m)
  {
    uint64_t ua, ub;
    split_range(units, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &ua, &ub);
    const uint64_t a = std::min(ua * 32, rows), b = std::min(ub * 32, rows);
    cpu::QuantParams qp = base;
    for (uint64_t r0 = a; r0 < b; r0 += tile) {
      const uint64_t r1 = std::min(r0 + tile, b);
      qp.first = r0 * d;
      cpu::quantize_rows(DT, t.x + r0 * d, nullptr, r1 - r0, d, qp, codes + r0 * d,
                         c->row_outlier.data() + r0, nullptr);
      uint32_t tm;
      level1_widths(codes + r0 * d, (r1 - r0) * d, c->w16.data() + r0 * d / HL_SHORT_BLOCK,
                    c->w32.data() + r0 * d / HL_BLOCK, &tm, 1);
      m = tm > m ? tm : m;
    }
  }
  c->max_code = m;
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
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * d > 65536)
  for (int64_t r = 0; r < (int64_t)rows; ++r) {
    memcpy(&c.codes[r * d], &codes[(uint64_t)map[r] * d], d * 4);
    if (outlier) c.row_outlier[r] = outlier[map[r]];
  }
  return c;
}

}  // namespace

template <int DT>
Coded code_rows(const Tensor<DT>& t, DistinctRows* distinct, bool lossless, double eb_abs,
                const Dither& dither, int threads, bool widths) {
  const uint64_t rows = t.n_rows, d = t.row_len;
  Coded c;
  if (!distinct) {
    c.n_unique = rows;
    c.codes = Buffer<uint32_t>(rows * d);
    c.row_outlier = Buffer<uint8_t>(lossless ? 0 : rows);
    if (widths && !lossless && rows * d > 0) {
      code_rows_with_widths(t, eb_abs, dither, threads, &c);
      return c;
    }
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
      return !out1[a] || outliers_match(&codes1[a * d], t.x + first1[a] * d, t.x + first1[b] * d, d);
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
    return every_row(codes1.data(), lossless ? nullptr : out1.data(), map1.data(), rows, d,
                     threads);
  }
  c.n_unique = n2;
  c.source = Buffer<uint64_t>(n2);
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
    c.source = Buffer<uint64_t>();  // every row distinct: the identity
  }
  return c;
}

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_CLONES)
#define HL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HL_CLONES
#endif

// Marks each row wide when a code needs more than a byte (or it has an outlier) and writes the
// other rows' codes as bytes; folds the mark into bit 32 of the row's hash, the table's tag, so
// that only rows of one kind are ever compared.
HL_CLONES void narrow_rows(const uint32_t* z, const uint8_t* outlier, uint64_t rows, uint64_t d,
                           uint8_t* wide, uint8_t* bytes, uint64_t* hash) {
  for (uint64_t i = 0; i < rows; ++i) {
    const uint32_t* c = z + i * d;
    uint32_t any = 0;
    for (uint64_t k = 0; k < d; ++k) any |= c[k];
    wide[i] = (uint8_t)((any >> 8) != 0 || outlier[i]);
    hash[i] = (hash[i] & ~(1ull << 32)) | ((uint64_t)wide[i] << 32);
    if (wide[i]) continue;
    uint8_t* b = bytes + i * d;
    for (uint64_t k = 0; k < d; ++k) b[k] = (uint8_t)c[k];
  }
}

// The rows of code_distinct_rows's current block: their codes, outlier flags and hashes (from
// the quantizer), and narrow_rows's marks and bytes, the form unique rows are compared in.
struct Block {
  Buffer<uint32_t> z;
  Buffer<uint8_t> outlier, wide, bytes;
  Buffer<uint64_t> hash;
  Buffer<uint32_t> cand;  // CodeTable::candidate of each row
  Block(uint64_t rows, uint64_t d)
      : z(rows * d), outlier(rows), wide(rows), bytes(rows * d), hash(rows), cand(rows) {}
};

// Unique rows numbered by first occurrence of their codes (and outliers' raw bits) in an
// open-addressing table of (hash high half | unique index): the index leads straight to the
// unique row's compact codes, which a repeated row is compared with.
class CodeTable {
 public:
  // Sized for `expected` unique rows, so that a tensor with as many does not rehash on the way.
  CodeTable(const Buffer<uint64_t>& uhash, uint64_t expected) : uhash_(uhash) {
    uint64_t cap = 1024;
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
  uint32_t candidate(uint64_t h) const {
    for (uint64_t s = h & (cap_ - 1);; s = (s + 1) & (cap_ - 1)) {
      const uint64_t e = slots_[s];
      if (e == kEmpty) return kNone;
      if ((e & kTag) == (h & kTag)) return (uint32_t)e;
    }
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

}  // namespace

template <int DT>
Coded code_distinct_rows(const Tensor<DT>& t, double eb_abs, int threads, bool widths) {
  const uint64_t rows = t.n_rows, d = t.row_len;
  // Unique rows in order of first occurrence: codes, codes as bytes (narrow rows), outlier
  // flag, hash (its tag bit 32 says wide), first row. Sized for the worst case; only what is
  // used is touched.
  Buffer<uint32_t> ucodes(rows * d);
  Buffer<uint8_t> ubytes(rows * d), uout(rows);
  Buffer<uint64_t> uhash(rows);
  Buffer<uint64_t> source(rows);
  Buffer<uint32_t> map(rows);
  CodeTable table(uhash, rows);
  uint32_t n = 0;
  // Level-1 widths of the unique codes (Coded::w16), taken after each block over the pairs of
  // short blocks its new rows completed, while they are in cache: [0, done) has them.
  Buffer<uint8_t> w16(widths ? short_n_blocks(rows * d) : 0);
  Buffer<uint8_t> w32(widths ? hl_div_up(rows * d, HL_BLOCK) : 0);
  uint64_t done = 0;
  uint32_t max_code = 0;
  auto widths_up_to = [&](uint64_t end) {
    if (w32.empty() || end <= done) return;
    uint32_t m;
    level1_widths(&ucodes[done], end - done, &w16[done / HL_SHORT_BLOCK], &w32[done / HL_BLOCK],
                  &m, 1);
    max_code = m > max_code ? m : max_code;
    done = end;
  };

  // Blocks of rows small enough for their codes to stay in L2 between quantizing and numbering
  // (larger with more threads, which quantize a block together).
  const uint64_t block_codes = threads > 1 ? (uint64_t)threads << 17 : 1u << 15;
  const uint64_t block = std::max<uint64_t>(1, block_codes / std::max<uint64_t>(d, 1));
  Block b(std::min(block, rows), d);
  for (uint64_t b0 = 0; b0 < rows; b0 += block) {
    const uint64_t nb = std::min(block, rows - b0);
    code_rows_into(Tensor<DT>{t.x + b0 * d, nb, d}, nullptr, nb, false, eb_abs, Dither(),
                   threads, b.z.data(), b.outlier.data(), b.hash.data());
    narrow_rows(b.z.data(), b.outlier.data(), nb, d, b.wide.data(), b.bytes.data(),
                b.hash.data());
    auto same = [&](uint64_t i, uint32_t u) {  // the tags matched: both rows wide, or neither
      if (!b.wide[i]) return memcmp(&ubytes[(uint64_t)u * d], &b.bytes[i * d], d) == 0;
      const uint32_t* zi = &b.z[i * d];
      if (memcmp(&ucodes[(uint64_t)u * d], zi, d * 4) != 0) return false;
      return !b.outlier[i] || outliers_match(zi, t.x + source[u] * d, t.x + (b0 + i) * d, d);
    };
    // Every row's candidate first, its compact codes fetched while the other rows probe: the
    // compares below then read cached rows. Only a row with no candidate (new, or first seen
    // in this block) or a false one (a tag collision) probes again.
    for (uint64_t i = 0; i < nb; ++i) {
      if (i + 16 < nb) table.prefetch_slot(b.hash[i + 16]);  // the probe's branches would
      const uint32_t u = table.candidate(b.hash[i]);          // serialize its misses
      b.cand[i] = u;
      if (u == CodeTable::kNone) continue;
      if (b.wide[i])
        prefetch_row(&ucodes[(uint64_t)u * d], d * 4);
      else
        prefetch_row(&ubytes[(uint64_t)u * d], d);
    }
    for (uint64_t i = 0; i < nb; ++i) {
      // The table holds one unique row a content: a candidate that is the same row is the one
      // find would return.
      if (b.cand[i] != CodeTable::kNone && same(i, b.cand[i])) {
        map[b0 + i] = b.cand[i];
        continue;
      }
      const uint64_t h = b.hash[i];
      bool found;
      const uint64_t s = table.find(h, [&](uint32_t u) { return same(i, u); }, &found);
      if (found) {
        map[b0 + i] = table.at(s);
        continue;
      }
      const uint32_t u = n++;
      memcpy(&ucodes[(uint64_t)u * d], &b.z[i * d], d * 4);
      if (!b.wide[i]) memcpy(&ubytes[(uint64_t)u * d], &b.bytes[i * d], d);
      uout[u] = b.outlier[i];
      uhash[u] = h;
      source[u] = b0 + i;
      map[b0 + i] = u;
      table.put(s, h, u);
    }
    widths_up_to((uint64_t)n * d / (2 * HL_SHORT_BLOCK) * (2 * HL_SHORT_BLOCK));
  }

  if (!dedup_pays(rows, n, d) && n < rows)  // store every row: expand the unique rows back
    return every_row(ucodes.data(), uout.data(), map.data(), rows, d, threads);
  widths_up_to((uint64_t)n * d);  // the last, partial pair
  Coded c;
  c.n_unique = n;
  if (!w32.empty()) {
    c.w16 = std::move(w16);
    c.w32 = std::move(w32);
    c.max_code = max_code;
  }
  c.codes = std::move(ucodes);
  c.row_outlier = std::move(uout);
  if (n < rows) {
    c.source = std::move(source);
    c.map = std::move(map);
  }
  return c;
}

template Coded code_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, DistinctRows*, bool, double, const Dither&, int, bool);
template Coded code_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, DistinctRows*, bool, double, const Dither&, int, bool);
template Coded code_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, DistinctRows*, bool, double, const Dither&, int, bool);
template Coded code_distinct_rows<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, double, int, bool);
template Coded code_distinct_rows<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, double, int, bool);
template Coded code_distinct_rows<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, double, int, bool);

}  // namespace enc
}  // namespace hl
