// Reuse across iterations: see reuse.h. One sweep a piece: predict, subtract, settle the rows
// that surely code to zeros (references) by one compare, quantize and dequantize the others with
// the codec's kernels, reconstruct and check every element. A float32 row whose codes single
// precision decides takes all of that in one pass over it (cpu::coded_row_f32); the others, a
// block at a time, in a pass each.
#include "reuse.h"

#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "arguments.h"
#include "codec_common.h"
#include "errors.h"
#include "kernels_cpu.h"
#include "pack.h"
#include "parallel.h"

namespace hl {
namespace reuse {
namespace {

// Rows quantized a block at a time: codes and R^ of a block stay in L1/L2.
constexpr uint64_t kBlockElems = 4096;

template <int DT>
using raw_of = typename Elem<DT>::raw_t;

// Machine epsilon of the dtype: the rounding of X - P and of P + R^ is at most an eps of the
// larger magnitude each.
double dtype_eps(uint8_t dtype) {
  return dtype == HL_FLOAT32 ? 0x1p-23 : dtype == HL_FLOAT16 ? 0x1p-10 : 0x1p-7;
}

// The bound a frame stores for a wanted bound (frame.h hl_bound_code), as the value coded with.
double stored(double eb) { return hl_bound_of_code(hl_bound_code(eb)); }

template <int DT>
float as_float(raw_of<DT> r) {
  return (float)Elem<DT>::to_double(r);
}

// float32, the common case, as float adds eight lanes at a time where the CPU has AVX2 (the
// receiver's apply reconstructs every predicted row): the same adds, so the same bits.
HL_AVX2_CLONES bool reconstruct_row_f32(const float* p, const float* r_hat, uint64_t d,
                                         float* out) {
  uint32_t differ = 0;
  for (uint64_t i = 0; i < d; ++i) {
    const float v = p[i] + r_hat[i];
    uint32_t a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, p + i, sizeof b);
    differ |= a ^ b;
    out[i] = v;
  }
  return differ == 0;
}

// X^ = P + R^ of one row, in float and rounded to the dtype: the one function the sender and
// the receiver both use, so X^ is the same bits on both ends. Returns whether X^ is P's bits
// (then its record needs no store). out may be r_hat.
template <int DT>
bool reconstruct_row(const raw_of<DT>* p, const raw_of<DT>* r_hat, uint64_t d, raw_of<DT>* out) {
  if constexpr (DT == HL_FLOAT32)
    return reconstruct_row_f32(reinterpret_cast<const float*>(p),
                               reinterpret_cast<const float*>(r_hat), d,
                               reinterpret_cast<float*>(out));
  raw_of<DT> differ = 0;
  for (uint64_t i = 0; i < d; ++i) {
    out[i] = Elem<DT>::from_float(as_float<DT>(p[i]) + as_float<DT>(r_hat[i]));
    differ |= out[i] ^ p[i];
  }
  return differ == 0;
}

// Whether every element of X^ is within eb of X (NaN and Inf never are), and whether X^ equals
// the held row P in value. Whole rows without branches, in double as the bound is checked
// everywhere, so that the loop vectorizes (a miss is rare). to_double: an element's value.
template <typename T, typename ToDouble>
inline __attribute__((always_inline)) void check_row_of(const T* x, const T* xh, const T* p,
                                                        uint64_t d, double eb, bool* within,
                                                        bool* same, ToDouble to_double) {
  uint32_t miss = 0, differ = 0;
  for (uint64_t i = 0; i < d; ++i) {
    const double v = to_double(x[i]), back = to_double(xh[i]);
    miss |= !(fabs(back - v) <= eb);
    differ |= back != to_double(p[i]);
  }
  *within = !miss;
  *same = !differ;
}

template <int DT>
void check_row(const raw_of<DT>* x, const raw_of<DT>* xh, const raw_of<DT>* p, uint64_t d,
               double eb, bool* within, bool* same) {
  check_row_of(x, xh, p, d, eb, within, same,
               [](raw_of<DT> e) { return Elem<DT>::to_double(e); });
}

// float32, the common case, with AVX2 where the CPU has it (4 doubles a step).
HL_AVX2_CLONES void check_row_f32(const float* x, const float* xh, const float* p, uint64_t d,
                                   double eb, bool* within, bool* same) {
  check_row_of(x, xh, p, d, eb, within, same, [](float e) { return (double)e; });
}

template <>
void check_row<HL_FLOAT32>(const uint32_t* x, const uint32_t* xh, const uint32_t* p, uint64_t d,
                           double eb, bool* within, bool* same) {
  check_row_f32(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(xh),
                reinterpret_cast<const float*>(p), d, eb, within, same);
}

// A held row whose residual surely codes to zeros: every |X - P| (in float, as sweep_piece forms
// R) at most `limit` (zero_code_limit) and no -0 in P. Then R^ is +0 everywhere and X^ = P + 0
// is P's bits, within X's bound: the row is a reference, found without quantizing it. Its
// residual is written as zeros (what R^ is, lossy or stored exactly), the promise that lets the
// codec take every reference of a piece for one row, unread (hvd_lossy.reuse.zero_rows).
// float32 only; the 16-bit dtypes take the full sweep.
HL_AVX2_CLONES bool reference_row_f32(const float* x, const float* p, uint64_t d, float limit,
                                       float* r) {
  uint32_t miss = 0;
  for (uint64_t i = 0; i < d; ++i) {
    uint32_t bits;
    memcpy(&bits, p + i, sizeof bits);
    miss |= !(fabsf(x[i] - p[i]) <= limit) | (bits == 0x80000000u);
  }
  if (miss) return false;
  memset(r, 0, d * sizeof(float));
  return true;
}

template <int DT>
bool reference_row(const raw_of<DT>* x, const raw_of<DT>* p, uint64_t d, float limit,
                   raw_of<DT>* r) {
  if constexpr (DT == HL_FLOAT32)
    return reference_row_f32(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(p),
                             d, limit, reinterpret_cast<float*>(r));
  return false;
}

// The largest |r| reference_row accepts for a residual coded at code_eb: |r| <= code_eb (1 -
// 2^-20) keeps |r / step| below 1/2 in the quantizer's double arithmetic (step = 2 code_eb,
// hl::quantize), so its code is 0 and its reconstruction +0 within code_eb; and X's own
// error, |X - P| <= |r| (1 + 2^-23) in double, stays below code_eb <= eb (check_row's test).
float zero_code_limit(double code_eb) {
  const double t = code_eb * (1 - 0x1p-20);
  float f = (float)t;
  if ((double)f > t) f = nextafterf(f, 0.0f);
  return f;
}

// Slots are random reads (or writes) into caches far larger than the CPU's caches: every
// record would be a miss of its own, waited for in turn. Fetching kSlotsAhead rows ahead keeps
// that many misses in flight instead.
constexpr uint64_t kSlotsAhead = 32;

// The slots of rows [start, start + rows) (ids in call order).
void slots_of(const int64_t* ids, uint64_t start, uint64_t rows, uint64_t capacity,
              std::vector<uint64_t>* slots) {
  slots->resize(rows);
  for (uint64_t r = 0; r < rows; ++r) (*slots)[r] = slot_of(ids[start + r], capacity);
}

uint8_t* record_of(const Cache& c, uint64_t s) { return c.records + s * c.stride; }

int64_t tag_of(const uint8_t* rec) {
  int64_t tag;
  memcpy(&tag, rec, sizeof tag);
  return tag;
}

// Prefetches slot s of cache c: the lines of its record's first 256 bytes for a write (the
// hardware prefetcher carries on through longer rows), of its first 1 KiB for a read. A lookup
// reads only the head (tag, flag, the row's magnitude: held_row), and the sweep reads the row
// later, a piece at a time: no read runs through the row in between to start the hardware's
// stream, so the prefetch covers the whole row (up to 1 KiB: a d128 float32 record is 528 bytes).
void prefetch_slot(const Cache& c, uint64_t s, bool write) {
  const uint8_t* rec = record_of(c, s);
  const uint64_t most = write ? 256 : 1024;
  const uint64_t n = c.stride < most ? c.stride : most;
  for (uint64_t off = 0; off < n; off += 64) {
    if (write)
      __builtin_prefetch(rec + off, 1);
    else
      __builtin_prefetch(rec + off);
  }
  if (write)  // a record that starts late in a line ends in one more
    __builtin_prefetch(rec + n - 1, 1);
  else
    __builtin_prefetch(rec + n - 1);
}

// Copies d elements and returns the largest magnitude's bits among them (sign bits cleared,
// `abs` the mask): of finite elements the bits order as the magnitudes do, and NaN and Inf have
// the largest, so one integer max, which vectorizes, finds both the magnitude and whether every
// element is finite. One pass: the store reads each row it writes once.
template <typename T>
inline __attribute__((always_inline)) T copy_max_abs_bits_of(T* __restrict to,
                                                            const T* __restrict from, uint64_t d,
                                                            T abs) {
  T m = 0;
  for (uint64_t i = 0; i < d; ++i) {
    const T v = from[i];
    to[i] = v;
    const T a = v & abs;
    m = a > m ? a : m;
  }
  return m;
}
HL_AVX2_CLONES uint32_t copy_max_abs_bits_f32(uint32_t* to, const uint32_t* from, uint64_t d) {
  return copy_max_abs_bits_of<uint32_t>(to, from, d, 0x7fffffffu);
}
HL_AVX2_CLONES uint16_t copy_max_abs_bits_16(uint16_t* to, const uint16_t* from, uint64_t d) {
  return copy_max_abs_bits_of<uint16_t>(to, from, d, 0x7fff);
}

template <int DT>
uint32_t copy_max_abs_bits(raw_of<DT>* to, const raw_of<DT>* from, uint64_t d) {
  if constexpr (DT == HL_FLOAT32) return copy_max_abs_bits_f32(to, from, d);
  else return copy_max_abs_bits_16(to, from, d);
}

// A record's largest magnitude as copy_max_abs_bits finds it (a uint32 at kRecordMagnitude),
// written with its row by store_piece: a lookup then reads the record's head, not its row.
constexpr uint64_t kRecordMagnitude = 12;

uint32_t magnitude_of(const uint8_t* rec) {
  uint32_t m;
  memcpy(&m, rec + kRecordMagnitude, sizeof m);
  return m;
}

// The held row of `id` (in slot s) in cache c with its largest magnitude in *amax, or null when
// c holds none for it or the held row has a NaN or Inf (X - Inf and Inf + R^ would lose X, so
// such a row predicts nothing).
template <int DT>
const raw_of<DT>* held_row(const Cache& c, int64_t id, uint64_t s, float* amax) {
  const uint8_t* rec = record_of(c, s);
  if (!rec[8] || tag_of(rec) != id) return nullptr;
  const uint32_t m = magnitude_of(rec);
  // the bits of +Inf, the least a NaN or Inf can have
  const uint32_t inf = DT == HL_FLOAT32 ? 0x7f800000u : DT == HL_FLOAT16 ? 0x7c00 : 0x7f80;
  if (m >= inf) return nullptr;
  *amax = as_float<DT>((raw_of<DT>)m);
  return reinterpret_cast<const raw_of<DT>*>(rec + kRecordHead);
}

// Whether a row's record already holds its X^ (encode's hit byte): store() skips it.
inline bool held_as_is(uint8_t hit) { return hit == kHitHeld || hit == kHitReference; }

// Each slot written once, by the last row of the piece on it (the rule store() states): rows
// are taken last first and a slot seen already is skipped. A winning row whose record already
// holds it (held_as_is: X^ is the held row's bits) is not even read, so a call of
// references touches no record here.
template <int DT>
void store_piece(const raw_of<DT>* rows, const int64_t* ids, uint64_t d, const Piece& p,
                 const Cache& c, const uint8_t* hit, std::vector<uint64_t>* slots,
                 std::vector<uint64_t>* seen) {
  slots_of(ids, p.start, p.rows, c.capacity, slots);
  // Slots seen, open addressing at a load under one half (kFree marks an empty entry).
  constexpr uint64_t kFree = ~0ull;
  uint64_t cap = 16;
  while (cap < 2 * p.rows) cap *= 2;
  seen->assign(cap, kFree);
  auto first_time = [&](uint64_t s) {
    for (uint64_t e = (s * 0x9E3779B97F4A7C15ull) >> 40 & (cap - 1);; e = (e + 1) & (cap - 1)) {
      if ((*seen)[e] == s) return false;
      if ((*seen)[e] == kFree) {
        (*seen)[e] = s;
        return true;
      }
    }
  };
  for (uint64_t k = 0; k < p.rows; ++k) {
    const uint64_t r = p.rows - 1 - k;
    const bool as_is = hit && held_as_is(hit[p.start + r]);
    if (r >= kSlotsAhead && !(hit && held_as_is(hit[p.start + r - kSlotsAhead])))
      prefetch_slot(c, (*slots)[r - kSlotsAhead], true);
    if (!first_time((*slots)[r]) || as_is) continue;
    uint8_t* rec = record_of(c, (*slots)[r]);
    const int64_t id = ids[p.start + r];
    const uint32_t m = copy_max_abs_bits<DT>(reinterpret_cast<raw_of<DT>*>(rec + kRecordHead),
                                              rows + (p.start + r) * d, d);
    memcpy(rec, &id, sizeof id);
    rec[8] = 1;
    memcpy(rec + kRecordMagnitude, &m, sizeof m);
  }
}

// The held rows of a piece's rows (null where none), their records fetched kSlotsAhead rows
// ahead; returns the largest magnitude among them (from the records' heads).
template <int DT>
double predict_piece(const int64_t* ids, const Piece& p, const Cache& c,
                     std::vector<uint64_t>* slots, const raw_of<DT>** held) {
  slots_of(ids, p.start, p.rows, c.capacity, slots);
  float pmax = 0;
  for (uint64_t r = 0; r < p.rows; ++r) {
    if (r + kSlotsAhead < p.rows) prefetch_slot(c, (*slots)[r + kSlotsAhead], false);
    float m = 0;
    held[r] = held_row<DT>(c, ids[p.start + r], (*slots)[r], &m);
    pmax = m > pmax ? m : pmax;
  }
  return pmax;
}

// The pieces of each group, in call order; checks that every piece lies in the call's rows,
// names an existing group and cache, and that no two pieces share a cache (a cache is one
// (peer, segment): storing a piece must not change another piece's prediction).
std::vector<std::vector<size_t>> pieces_by_group(const std::vector<Piece>& pieces,
                                                 const std::vector<Cache>& caches,
                                                 size_t groups, uint64_t n_rows,
                                                 uint64_t row_bytes) {
  std::vector<std::vector<size_t>> by(groups);
  std::vector<uint8_t> used(caches.size(), 0);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    if (p.start + p.rows > n_rows || p.start + p.rows < p.start)
      throw ArgumentError("reuse piece " + std::to_string(k) + " covers rows [" +
                          std::to_string(p.start) + ", " + std::to_string(p.start + p.rows) +
                          "), expected rows within the call's " + std::to_string(n_rows));
    if (p.group < 0 || (size_t)p.group >= groups)
      throw ArgumentError("reuse piece " + std::to_string(k) + " is in group " +
                          std::to_string(p.group) + ", expected 0.." + std::to_string(groups - 1));
    if (p.cache < 0 || (size_t)p.cache >= caches.size() || used[p.cache])
      throw ArgumentError("reuse piece " + std::to_string(k) + " names cache " +
                          std::to_string(p.cache) + ", expected one of the " +
                          std::to_string(caches.size()) + " caches, each used by one piece");
    if (caches[p.cache].capacity == 0)
      throw ArgumentError("reuse cache " + std::to_string(p.cache) + " has no slots");
    if (caches[p.cache].stride < kRecordHead + row_bytes)
      throw ArgumentError("reuse cache " + std::to_string(p.cache) + " has records of " +
                          std::to_string(caches[p.cache].stride) + " bytes, expected at least " +
                          std::to_string(kRecordHead + row_bytes) + " (tag, flag, row)");
    used[p.cache] = 1;
    by[p.group].push_back(k);
  }
  return by;
}

// cpu::coded_row_f32 for a float32 row (h null: fresh), kRowUnsure for the 16-bit dtypes.
template <int DT>
int fused_row(const raw_of<DT>* x, const raw_of<DT>* h, uint64_t d, const cpu::QuantParams& qp,
              double eb, raw_of<DT>* r, raw_of<DT>* xh, bool* same, bool* as_held) {
  if constexpr (DT == HL_FLOAT32)
    return cpu::coded_row_f32(reinterpret_cast<const float*>(x),
                              reinterpret_cast<const float*>(h), d, qp, eb,
                              reinterpret_cast<float*>(r), reinterpret_cast<float*>(xh), same,
                              as_held);
  return cpu::kRowUnsure;
}

// sweep_piece's buffers, kept across a group's pieces: the block's rows that are not
// references, and their codes and outlier flags.
struct SweepScratch {
  std::vector<uint64_t> rest;
  std::vector<uint32_t> codes;
  std::vector<uint8_t> row_outlier;
};

// One piece of encode, its held rows found: R, R^ and X^ of its rows, a block at a time.
// Reference rows (reference_row) are settled as they are met; the others' R^ comes from the
// codec's quantizer and dequantizer, gathered. Returns false, at the first element of a
// predicted row that X^ would take outside X's bound (then nothing of the piece is final), else
// true with the piece's counts in out.
template <int DT>
bool sweep_piece(const raw_of<DT>* x, uint64_t d, const Piece& p, size_t k, bool predicted,
                 const raw_of<DT>* const* held, raw_of<DT>* residual, raw_of<DT>* x_hat,
                 uint8_t* hit, EncodeResult* out, SweepScratch* w) {
  const double eb = out->eb[k], code_eb = out->code_eb[k];
  const bool exact = p.lossless || code_eb == 0;  // the codec stores R itself
  const cpu::QuantParams qp = cpu::quant_params(code_eb);  // as enc::code_rows_into's
  const float limit = zero_code_limit(code_eb);
  const uint64_t block_rows = d ? std::max<uint64_t>(1, kBlockElems / d) : p.rows;
  const uint64_t row_bytes = d * sizeof(raw_of<DT>);
  uint64_t refs = 0, predicted_rows = 0;
  for (uint64_t a = 0; a < p.rows; a += block_rows) {
    const uint64_t n = std::min(block_rows, p.rows - a);
    const uint64_t row0 = p.start + a;
    w->rest.clear();  // rows of the block (from row0) that are not references
    for (uint64_t r = 0; r < n; ++r) {
      const raw_of<DT>* xr = x + (row0 + r) * d;
      raw_of<DT>* rr = residual + (row0 + r) * d;
      const raw_of<DT>* h = predicted ? held[a + r] : nullptr;
      if (h && reference_row<DT>(xr, h, d, limit, rr)) {  // X^ is h: no copy (store skips it)
        hit[row0 + r] = kHitReference;
        ++refs;
        ++predicted_rows;
        continue;
      }
      // Drifted held rows (most of them) and fresh ones in one pass, where its answer is sure.
      if (!exact) {
        bool same, as_held;
        const int fused = fused_row<DT>(xr, h, d, qp, eb, rr, x_hat + (row0 + r) * d, &same,
                                        &as_held);
        if (fused == cpu::kRowMiss) return false;
        if (fused == cpu::kRowWithin) {
          hit[row0 + r] = !h ? kHitFresh : as_held ? kHitHeld : kHitResidual;
          predicted_rows += h != nullptr;
          refs += same;
          continue;
        }
      }
      if (h)
        for (uint64_t i = 0; i < d; ++i)
          rr[i] = Elem<DT>::from_float(as_float<DT>(xr[i]) - as_float<DT>(h[i]));
      else
        memcpy(rr, xr, row_bytes);
      w->rest.push_back(r);
    }
    // R^ of the other rows: what the receiver's decoder makes of R (decode.cc: the same
    // dequantize, outliers and lossless segments as R's raw bits).
    const raw_of<DT>* rb = residual + row0 * d;
    const uint64_t m = w->rest.size();
    // R^ goes straight into the rows' X^: a fresh row's X^ is R^, a predicted row's becomes
    // P + R^ in place below (a scratch R^ and its copy cost a fresh d128 call 5-6% more).
    if (!exact && m) {
      w->codes.resize(m * d);
      w->row_outlier.resize(m);
      // (every row of the block: no gather, as for a call of fresh rows)
      cpu::quantize_rows(DT, rb, m == n ? nullptr : w->rest.data(), m, d, qp, w->codes.data(),
                         w->row_outlier.data(), nullptr);
      if (m == n)  // the block's rows in order
        cpu::dequantize(DT, w->codes.data(), m * d, qp.step, x_hat + row0 * d);
      else
        for (uint64_t j = 0; j < m; ++j)
          cpu::dequantize(DT, w->codes.data() + j * d, d, qp.step, x_hat + (row0 + w->rest[j]) * d);
      for (uint64_t j = 0; j < m; ++j)
        if (w->row_outlier[j])
          for (uint64_t i = 0; i < d; ++i)
            if (w->codes[j * d + i] == kOutlierMark)
              x_hat[(row0 + w->rest[j]) * d + i] = rb[w->rest[j] * d + i];
    }
    for (uint64_t j = 0; j < m; ++j) {
      const uint64_t r = w->rest[j], row = row0 + r;
      raw_of<DT>* xh = x_hat + row * d;
      const raw_of<DT>* rh = exact ? rb + r * d : xh;
      const raw_of<DT>* h = predicted ? held[a + r] : nullptr;
      hit[row] = h ? kHitResidual : kHitFresh;
      if (!h) {  // fresh: the codec's own reconstruction, within code_eb <= eb
        if (exact) memcpy(xh, rh, row_bytes);
        continue;
      }
      const bool as_held = reconstruct_row<DT>(h, rh, d, xh);
      bool within, same;
      check_row<DT>(x + row * d, xh, h, d, eb, &within, &same);
      if (!within) return false;
      ++predicted_rows;
      refs += same;
      hit[row] = as_held ? kHitHeld : kHitResidual;
    }
  }
  out->references[k] = refs;
  out->residuals[k] = predicted_rows - refs;
  return true;
}

// One group (peer) of encode: returns whether its frame codes residuals. Each piece is swept
// right after its held rows are found, while they are in the CPU's caches; a piece with a
// row that would miss its bound sends the whole group fresh (the pieces swept so far again).
template <int DT>
bool encode_group(const raw_of<DT>* x, const int64_t* ids, uint64_t d, bool rel, bool allow,
                  const std::vector<Piece>& pieces, const std::vector<size_t>& mine,
                  const std::vector<Cache>& caches, raw_of<DT>* residual, raw_of<DT>* x_hat,
                  uint8_t* hit, EncodeResult* out) {
  std::vector<uint64_t> first(mine.size() + 1, 0), slots;
  for (size_t j = 0; j < mine.size(); ++j) first[j + 1] = first[j] + pieces[mine[j]].rows;
  std::vector<const raw_of<DT>*> held(first.back());
  SweepScratch scratch;
  auto sweep = [&](size_t j, bool predicted) {
    return sweep_piece<DT>(x, d, pieces[mine[j]], mine[j], predicted, &held[first[j]],
                           residual, x_hat, hit, out, &scratch);
  };
  bool predicted = allow, any_hit = false;
  for (size_t j = 0; j < mine.size(); ++j) {
    const Piece& p = pieces[mine[j]];
    // Prediction and bounds, from the caches as they are before this call.
    const double pmax = predict_piece<DT>(ids, p, caches[p.cache], &slots, &held[first[j]]);
    for (uint64_t r = first[j]; r < first[j + 1]; ++r) any_hit |= held[r] != nullptr;
    double lo, hi;
    cpu::finite_range(DT, x + p.start * d, p.rows * d, &lo, &hi);
    // X's bound as the codec would give X itself (encode.cc), as its frame would store it.
    const double eb = stored(absolute_bound(rel, p.eb_param, lo, hi));
    // R is coded a little tighter: room for the two roundings between X and X^ (X - P, then
    // P + R^), so that a predicted row misses X's bound only in pathological cases, which
    // the sweep sends fresh. Any bound up to X's is valid: the receiver only decodes.
    const double xmax = lo <= hi ? fmax(fabs(lo), fabs(hi)) : 0.0;
    const double tighter = eb - 4 * dtype_eps(DT) * fmax(xmax, pmax);
    out->eb[mine[j]] = eb;
    out->code_eb[mine[j]] = tighter > 0 ? stored(tighter) : eb;
    if (sweep(j, predicted)) continue;
    predicted = false;  // fresh from now on, and again for the pieces before
    for (size_t i = 0; i <= j; ++i) sweep(i, false);
  }
  // A group with no held row codes exactly as a fresh one: say so in its header.
  return predicted && any_hit;
}

template <int DT>
EncodeResult encode_dt(const void* xv, const int64_t* ids, uint64_t d, bool rel,
                       const std::vector<Piece>& pieces, const std::vector<Cache>& caches,
                       const std::vector<uint8_t>& allow, void* residual, void* x_hat,
                       uint8_t* hit, uint64_t n_rows, int threads) {
  const auto by = pieces_by_group(pieces, caches, allow.size(), n_rows, d * sizeof(raw_of<DT>));
  EncodeResult out;
  out.eb.assign(pieces.size(), 0);
  out.code_eb.assign(pieces.size(), 0);
  out.references.assign(pieces.size(), 0);
  out.residuals.assign(pieces.size(), 0);
  out.predicted.assign(allow.size(), 0);
  parallel::parallel_items(by.size(), resolve_threads(threads), [&](size_t g) {
    if (by[g].empty()) return;
    out.predicted[g] = encode_group<DT>(
        static_cast<const raw_of<DT>*>(xv), ids, d, rel, allow[g] != 0, pieces, by[g], caches,
        static_cast<raw_of<DT>*>(residual), static_cast<raw_of<DT>*>(x_hat), hit, &out);
  });
  return out;
}

template <int DT>
void apply_dt(void* rowsv, const int64_t* ids, uint64_t d, const std::vector<Piece>& pieces,
              const std::vector<Cache>& caches, const std::vector<uint8_t>& predicted,
              uint64_t n_rows, int threads) {
  const auto by =
      pieces_by_group(pieces, caches, predicted.size(), n_rows, d * sizeof(raw_of<DT>));
  raw_of<DT>* rows = static_cast<raw_of<DT>*>(rowsv);
  parallel::parallel_items(by.size(), resolve_threads(threads), [&](size_t g) {
    std::vector<uint64_t> slots, seen;
    std::vector<const raw_of<DT>*> held;
    std::vector<uint8_t> hit;
    for (size_t k : by[g]) {
      const Piece& p = pieces[k];
      const Cache& c = caches[p.cache];
      // Every row predicts from the cache as it was before this call (as the sender's did);
      // the piece's cache is no other piece's, so storing after its own rows is enough.
      // hit as encode's (indexed by call row): which rows' records already hold them.
      hit.assign(p.start + p.rows, kHitFresh);
      if (predicted[g]) {
        held.resize(p.rows);
        predict_piece<DT>(ids, p, c, &slots, held.data());
        for (uint64_t r = 0; r < p.rows; ++r)
          if (held[r]) {
            raw_of<DT>* row = rows + (p.start + r) * d;
            hit[p.start + r] = reconstruct_row<DT>(held[r], row, d, row) ? kHitHeld : kHitResidual;
          }
      }
      store_piece<DT>(rows, ids, d, p, c, hit.data(), &slots, &seen);
    }
  });
}

}  // namespace

uint64_t slot_of(int64_t id, uint64_t capacity) {
  if (capacity == 0) throw ArgumentError("a reuse cache has at least one slot, got capacity 0");
  // int64 arithmetic as torch does it: the product wraps, >> is arithmetic, remainder >= 0.
  int64_t h = (int64_t)((uint64_t)id * (uint64_t)(int64_t)-7046029254386353131LL);
  h ^= h >> 29;
  const int64_t m = h % (int64_t)capacity;
  return (uint64_t)(m < 0 ? m + (int64_t)capacity : m);
}

EncodeResult encode(uint8_t dtype, const void* x, const int64_t* ids, uint64_t row_len, bool rel,
                    const std::vector<Piece>& pieces, const std::vector<Cache>& caches,
                    const std::vector<uint8_t>& allow, void* residual, void* x_hat,
                    uint8_t* hit, uint64_t n_rows, int threads) {
  check_dtype_code(dtype);
  switch (dtype) {
    case HL_FLOAT32:
      return encode_dt<HL_FLOAT32>(x, ids, row_len, rel, pieces, caches, allow, residual, x_hat,
                                   hit, n_rows, threads);
    case HL_FLOAT16:
      return encode_dt<HL_FLOAT16>(x, ids, row_len, rel, pieces, caches, allow, residual, x_hat,
                                   hit, n_rows, threads);
    default:
      return encode_dt<HL_BFLOAT16>(x, ids, row_len, rel, pieces, caches, allow, residual, x_hat,
                                    hit, n_rows, threads);
  }
}

void store(uint8_t dtype, const void* rows, const int64_t* ids, uint64_t row_len,
           const std::vector<Piece>& pieces, const std::vector<Cache>& caches, uint64_t n_rows,
           const uint8_t* hit) {
  check_dtype_code(dtype);
  size_t groups = 0;
  for (const Piece& p : pieces) groups = std::max<size_t>(groups, (size_t)p.group + 1);
  pieces_by_group(pieces, caches, groups, n_rows, row_len * hl_elem_bytes(dtype));  // the checks
  std::vector<uint64_t> slots, seen;
  for (const Piece& p : pieces) {
    const Cache& c = caches[p.cache];
    if (dtype == HL_FLOAT32)
      store_piece<HL_FLOAT32>(static_cast<const uint32_t*>(rows), ids, row_len, p, c, hit,
                              &slots, &seen);
    else if (dtype == HL_FLOAT16)
      store_piece<HL_FLOAT16>(static_cast<const uint16_t*>(rows), ids, row_len, p, c, hit,
                              &slots, &seen);
    else
      store_piece<HL_BFLOAT16>(static_cast<const uint16_t*>(rows), ids, row_len, p, c, hit,
                               &slots, &seen);
  }
}

void apply(uint8_t dtype, void* rows, const int64_t* ids, uint64_t row_len,
           const std::vector<Piece>& pieces, const std::vector<Cache>& caches,
           const std::vector<uint8_t>& predicted, uint64_t n_rows, int threads) {
  check_dtype_code(dtype);
  switch (dtype) {
    case HL_FLOAT32:
      return apply_dt<HL_FLOAT32>(rows, ids, row_len, pieces, caches, predicted, n_rows, threads);
    case HL_FLOAT16:
      return apply_dt<HL_FLOAT16>(rows, ids, row_len, pieces, caches, predicted, n_rows, threads);
    default:
      return apply_dt<HL_BFLOAT16>(rows, ids, row_len, pieces, caches, predicted, n_rows, threads);
  }
}

}  // namespace reuse
}  // namespace hl
