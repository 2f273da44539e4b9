// Encoder stage 3: a piece's map, code and outlier sections, the choice of packing, and the
// level-2 coding of a frame's small segments with one shared table.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "encode_stages.h"
#include "level1_sections.h"
#include "map_buckets.h"
#include "pack.h"
#include "parallel.h"
#include "rans.h"
#include "short_blocks.h"

namespace hl {
namespace enc {
namespace {

Packing plan_packing(const uint32_t* v, uint64_t n, int threads, uint32_t* max_out = nullptr) {
  Packing p;
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  p.widths = Buffer<uint8_t>(nb);
  block_widths(v, n, p.widths.data(), threads, max_out);
  p.bytes = nb + payload_bytes(p.widths.data(), nb);
  return p;
}

// The code section's plan: block packing, or for lossy level-1 codes (`level1`) the smallest of
// block packing, radix packing and short blocks (level1_packing). The widths come from `taken`
// when the quantizing took them (their buffers move into the plan), else from a pass over the
// codes.
template <typename T>
Packing plan_codes(const T* v, uint64_t n, bool level1, int threads, Coded* taken = nullptr) {
  if constexpr (sizeof(T) == 4) {
    if (!level1 || n == 0) return plan_packing(v, n, threads);
  }
  Packing p;
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  Buffer<uint8_t> w16;
  uint32_t max_code = 0;
  if (taken) {
    p.widths = std::move(taken->w32);
    w16 = std::move(taken->w16);
    max_code = taken->max_code;
  } else {
    p.widths = Buffer<uint8_t>(nb);
    w16 = Buffer<uint8_t>(short_n_blocks(n));
    level1_widths(v, n, w16.data(), p.widths.data(), &max_code, threads);
  }
  const uint64_t block = nb + payload_bytes(p.widths.data(), nb);
  const uint64_t shorts = short_applies(n, max_code) ? short_bytes(w16.data(), n) : 0;
  // radix_plan builds its values only when they can beat `below`: radix wins ties with short
  // blocks, so short + 1
  const uint64_t below = shorts && shorts + 1 < block ? shorts + 1 : block;
  p.radix = radix_plan(v, n, max_code, below, threads, p.widths.data());
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

template <typename T>
void pack_to(const T* v, uint64_t n, const Packing& p, int threads, uint8_t* out) {
  if (p.radix.k)
    radix_write(p.radix, out, threads);
  else if (p.short_blocks)
    short_write(v, n, p.widths16.data(), out, threads);
  else
    pack_blocks(v, n, p.widths.data(), out, threads);
}

template <typename T>
Bytes pack(const T* v, uint64_t n, const Packing& p, int threads) {
  Bytes out(p.bytes);
  pack_to(v, n, p, threads, out.data());
  return out;
}

// Level-1 codes left for write_code, with their plan (a radix plan needs only its values).
template <typename T>
void pend(Sections& s, Buffer<T>& codes, Buffer<T>& pending, uint64_t n, Packing&& plan) {
  s.n_pending = n;
  s.plan = std::move(plan);
  if (!s.plan.radix.k) pending = std::move(codes);
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

}  // namespace

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
  const uint64_t n_codes = n_unique * d;
  if (!c.bytes.empty()) {  // lossy level-1 codes that fit bytes: no outliers
    Packing plan = plan_codes(c.bytes.data(), n_codes, true, threads, c.w32.empty() ? nullptr : &c);
    pend(s, c.bytes, s.pending_bytes, n_codes, std::move(plan));
    return s;
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
  // Radix packing and short blocks only where level 1 was asked for: level 2's choices between
  // rANS, shared tables and its packed fallback are weighed against block packing.
  // Widths taken while quantizing hold unless an outlier's mark became 0 above.
  Coded* taken = !c.w32.empty() && s.outliers.empty() ? &c : nullptr;
  Packing plan = plan_codes(ucodes, n_codes, !lossless && level == 1, threads, taken);
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
  if (level == 1 && n_codes > 0)
    pend(s, c.codes, s.pending_codes, n_codes, std::move(plan));
  else
    s.code = pack(ucodes, n_codes, plan, threads);
  return s;
}

void write_code(const Sections& s, int threads, uint8_t* out) {
  if (!s.n_pending) {
    if (!s.code.empty()) memcpy(out, s.code.data(), s.code.size());
    return;
  }
  if (!s.pending_codes.empty())
    pack_to(s.pending_codes.data(), s.n_pending, s.plan, threads, out);
  else  // bytes, or none for a radix plan, which packs its own values
    pack_to(s.pending_bytes.data(), s.n_pending, s.plan, threads, out);
}

template Sections build_sections<HL_FLOAT32>(const Tensor<HL_FLOAT32>&, Coded&, bool, uint8_t, int);
template Sections build_sections<HL_FLOAT16>(const Tensor<HL_FLOAT16>&, Coded&, bool, uint8_t, int);
template Sections build_sections<HL_BFLOAT16>(const Tensor<HL_BFLOAT16>&, Coded&, bool, uint8_t, int);

namespace {


// Bits of coding `counts` with `freq` (of 1 << HL_RANS_BITS).
double bits(const uint64_t* counts, const uint32_t* freq) {
  double b = 0;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) b += (double)counts[s] * (HL_RANS_BITS - log2((double)freq[s]));
  return b;
}

void set_code(Sections& s, std::vector<uint8_t>&& code) {
  if (code.size() < s.plan.bytes) {
    s.code = Bytes(code.size());
    memcpy(s.code.data(), code.data(), code.size());
    s.level = 2;
  } else {
    s.code = pack(s.deferred.data(), s.n_deferred, s.plan, 1);
    s.level = 1;
  }
}


}  // namespace

void encode_deferred(const std::vector<Sections*>& segs, int threads) {
  std::vector<Sections*> idx;
  bool all = true;
  for (Sections* s : segs) {
    if (s->n_deferred) idx.push_back(s);
    else if (s->level == 2) all = false;
  }
  if (idx.empty()) return;
  std::vector<std::vector<uint64_t>> counts(idx.size(), std::vector<uint64_t>(256));
  uint64_t pooled[256] = {0};
  for (size_t j = 0; j < idx.size(); ++j) {
    const Sections& s = *idx[j];
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
      own += bits(counts[j].data(), freq) + 8.0 * rans_table_bytes(freq);
      one += bits(counts[j].data(), shared);
    }
    use = one < own;
  }
  std::vector<std::vector<uint8_t>> codes(idx.size());
  auto encode_all = [&](bool with_shared) {
    parallel::parallel_items(idx.size(), threads, [&](size_t j) {
      const Sections& s = *idx[j];
      codes[j] = rans_encode(s.deferred.data(), s.n_deferred, 1, with_shared ? shared : nullptr,
                             j == 0);
    });
  };
  encode_all(use);
  if (use) {  // the table's carrier and every borrower must stay entropy coded
    for (size_t j = 0; j < idx.size(); ++j)
      if (codes[j].size() >= idx[j]->plan.bytes) {
        encode_all(false);
        break;
      }
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    set_code(*idx[j], std::move(codes[j]));
    idx[j]->deferred = Buffer<uint32_t>();
    idx[j]->n_deferred = 0;
  }
}


}  // namespace enc
}  // namespace hl
