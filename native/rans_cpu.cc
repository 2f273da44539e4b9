// Byte-wise 32-bit rANS (after ryg_rans) in independent streams of HL_RANS_CHUNK codes, so the
// decoder, and a GPU encoder, can work on streams in parallel.
#include <string.h>

#include <string>

#include "codec_common.h"
#include "pack.h"
#include "rans.h"
#include "reader.h"
#include "varint.h"

namespace hl {
namespace {

constexpr uint32_t kScale = 1u << HL_RANS_BITS;

struct Table {
  uint32_t freq[256];
  uint32_t cum[257];
};

void build_cum(Table* t) {
  t->cum[0] = 0;
  for (int s = 0; s < 256; ++s) t->cum[s + 1] = t->cum[s] + t->freq[s];
}

// A symbol's encoder step with the division by its frequency replaced by an exact reciprocal
// multiply (ryg_rans's RansEncSymbol): for every state below 2^31,
//   x + bias + q * cmpl_freq == ((x / freq) << HL_RANS_BITS) + x % freq + cum,
// with q = x / freq computed as (x * rcp_freq) >> (32 + rcp_shift). Same bytes, no divide.
struct EncSymbol {
  uint32_t x_max, rcp_freq, bias, cmpl_freq, rcp_shift;
};

EncSymbol enc_symbol(uint32_t cum, uint32_t freq) {
  EncSymbol e;
  e.x_max = ((HL_RANS_L >> HL_RANS_BITS) << 8) * freq;
  e.cmpl_freq = kScale - freq;
  if (freq < 2) {  // q = x - 1 from an all-ones reciprocal; the bias puts back the missing x
    e.rcp_freq = ~0u;
    e.rcp_shift = 0;
    e.bias = cum + kScale - 1;
  } else {
    uint32_t shift = 0;
    while (freq > (1u << shift)) shift++;
    e.rcp_freq = (uint32_t)(((1ull << (shift + 31)) + freq - 1) / freq);
    e.rcp_shift = shift - 1;
    e.bias = cum;
  }
  return e;
}

// Encodes codes [lo, hi) backwards; returns state followed by bytes in decoder order.
std::vector<uint8_t> encode_stream(const uint32_t* z, uint64_t lo, uint64_t hi,
                                   const EncSymbol* syms) {
  // At most 2 bytes a symbol (renormalization of a frequency-1 symbol), plus the state.
  std::vector<uint8_t> buf(4 + 2 * (hi - lo));
  if (buf.size() < 4) return {};  // 2 * (hi - lo) wrapped around: no such stream exists
  uint8_t* end = buf.data() + buf.size();
  uint8_t* p = end;
  uint32_t x = HL_RANS_L;
  for (uint64_t i = hi; i-- > lo;) {
    const EncSymbol& e = syms[rans_symbol(z[i])];
    while (x >= e.x_max) {
      *--p = (uint8_t)(x & 0xff);
      x >>= 8;
    }
    const uint32_t q = (uint32_t)(((uint64_t)x * e.rcp_freq) >> 32) >> e.rcp_shift;
    x += e.bias + q * e.cmpl_freq;
  }
  p -= 4;
  store_u32(p, x);
  return std::vector<uint8_t>(p, end);
}


void append_varint(std::vector<uint8_t>* out, uint64_t v) {
  uint8_t buf[10];
  out->insert(out->end(), buf, put_varint(buf, v));
}

// The compact section (frame.h): K, w, w-bit frequencies, varint escapes and
// stream lengths (the last implied).
void table_shape(const uint32_t* freq, int* k, uint32_t* w) {
  *k = 0;
  uint32_t fmax = 0;
  for (int s = 0; s < 256; ++s)
    if (freq[s]) {
      *k = s + 1;
      fmax = freq[s] > fmax ? freq[s] : fmax;
    }
  *w = bit_width(fmax);
}

void write_compact(const uint32_t* freq, const uint32_t* z, uint64_t n, uint64_t n_esc,
                   const std::vector<std::vector<uint8_t>>& streams, std::vector<uint8_t>* out,
                   bool write_table) {
  int k;
  uint32_t w;
  table_shape(freq, &k, &w);
  if (!write_table) {  // a borrowed table: w = 0 (frame.h)
    out->push_back(0);
    out->push_back(0);
  } else {
    out->push_back((uint8_t)(k - 1));
    out->push_back((uint8_t)w);
    uint64_t acc = 0;
    int bits = 0;
    for (int s = 0; s < k; ++s) {
      acc |= (uint64_t)freq[s] << bits;
      bits += (int)w;
      while (bits >= 8) {
        out->push_back((uint8_t)acc);
        acc >>= 8;
        bits -= 8;
      }
    }
    if (bits) out->push_back((uint8_t)acc);
  }
  append_varint(out, n_esc);
  for (uint64_t i = 0; i < n; ++i)
    if (z[i] >= HL_RANS_ESC) append_varint(out, z[i] - HL_RANS_ESC);
  for (size_t s = 0; s + 1 < streams.size(); ++s) append_varint(out, streams[s].size());
  for (auto& st : streams) out->insert(out->end(), st.begin(), st.end());
}

}  // namespace

void rans_counts(const uint32_t* z, uint64_t n, uint64_t* counts) {
  for (int s = 0; s < 256; ++s) counts[s] = 0;
  for (uint64_t i = 0; i < n; ++i) counts[rans_symbol(z[i])]++;
}

void rans_freqs(const uint64_t* counts, uint32_t* freq) { normalize_freqs(counts, freq); }

uint64_t rans_table_bytes(const uint32_t* freq) {
  int k;
  uint32_t w;
  table_shape(freq, &k, &w);
  return 2 + ((uint64_t)k * w + 7) / 8;
}

std::vector<uint8_t> rans_encode(const uint32_t* z, uint64_t n, int threads,
                                 const uint32_t* shared, bool write_table) {
  uint64_t counts[256];
  rans_counts(z, n, counts);
  const uint64_t n_esc = counts[HL_RANS_ESC];
  Table t;
  if (shared) {
    for (int s = 0; s < 256; ++s) {
      if (counts[s] && !shared[s]) throw CodecError("a shared rANS table lacks a symbol it codes");
      t.freq[s] = shared[s];
    }
  } else {
    normalize_freqs(counts, t.freq);
  }
  build_cum(&t);
  EncSymbol syms[256];
  for (int sym = 0; sym < 256; ++sym) syms[sym] = enc_symbol(t.cum[sym], t.freq[sym]);

  const uint64_t n_streams = hl_div_up(n, HL_RANS_CHUNK);
  std::vector<std::vector<uint8_t>> streams(n_streams);
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (n_streams > 8)
  for (int64_t k = 0; k < (int64_t)n_streams; ++k) {
    uint64_t lo = (uint64_t)k * HL_RANS_CHUNK;
    uint64_t hi = lo + HL_RANS_CHUNK < n ? lo + HL_RANS_CHUNK : n;
    streams[k] = encode_stream(z, lo, hi, syms);
  }

  std::vector<uint8_t> out;
  write_compact(t.freq, z, n, n_esc, streams, &out, write_table || !shared);
  return out;
}

// The compact table at the reader (K - 1, w, frequencies) into t.
void read_compact_table(Reader& r, Table* t) {
  const int k = r.read<uint8_t>() + 1;
  const uint32_t w = r.read<uint8_t>();
  if (w < 1 || w > HL_RANS_BITS + 1)
    throw FrameError("frame is corrupted: entropy table frequencies of " + std::to_string(w) +
                     " bits, expected 1.." + std::to_string(HL_RANS_BITS + 1));
  const uint8_t* bits = r.take(((uint64_t)k * w + 7) / 8);
  for (int s = 0; s < k; ++s) {
    uint32_t f = 0;
    for (uint32_t b = 0; b < w; ++b) {
      const uint64_t at = (uint64_t)s * w + b;
      f |= (uint32_t)((bits[at >> 3] >> (at & 7)) & 1) << b;
    }
    t->freq[s] = f;
  }
}

RansLayout rans_layout(const uint8_t* in, uint64_t len, uint64_t n, const uint8_t* table,
                       uint64_t table_len) {
  Reader r(in, len, "entropy-coded code section");
  RansLayout L;
  Table t = {};
  const uint64_t n_streams = hl_div_up(n, HL_RANS_CHUNK);
  std::vector<uint32_t>& escapes = L.escapes;
  std::vector<uint64_t>& start = L.start;
  start.assign(n_streams + 1, 0);
  if (n == 0) throw FrameError("frame is corrupted: an entropy-coded section of no codes");
  if (len >= 2 && in[1] == 0) {  // w = 0: the table is borrowed (frame.h)
    if (!table || in[0] != 0)
      throw FrameError("frame is corrupted: an entropy-coded section borrows a table "
                       "where none is to borrow");
    r.take(2);
    Reader tr(table, table_len, "borrowed entropy table");
    read_compact_table(tr, &t);
  } else {
    read_compact_table(r, &t);
  }
  const uint64_t n_esc = r.varint("entropy-coded section's escape count");
  if (n_esc > n || n_esc > r.remaining())
    throw FrameError("frame is corrupted: " + std::to_string(n_esc) + " escapes for " +
                     std::to_string(n) + " codes");
  escapes.resize(n_esc);
  for (uint64_t e = 0; e < n_esc; ++e) {
    const uint64_t v = r.varint("entropy-coded section's escapes") + HL_RANS_ESC;
    if (v > 0xffffffffull) throw FrameError("frame is corrupted: escape value overflows");
    escapes[e] = (uint32_t)v;
  }
  if (n_streams - 1 > r.remaining())
    throw FrameError("frame is corrupted: " + std::to_string(n_streams) +
                     " entropy-coded streams in " + std::to_string(len) + " bytes");
  for (uint64_t s = 0; s + 1 < n_streams; ++s) {
    const uint64_t l = r.varint("entropy-coded section's stream sizes");
    if (l > len) throw FrameError("frame is corrupted: an entropy-coded stream overruns");
    start[s + 1] = start[s] + l;
  }
  if (start[n_streams - 1] > r.remaining())
    throw FrameError("frame is corrupted: entropy-coded streams overrun their section");
  start[n_streams] = r.remaining();
  build_cum(&t);
  if (t.cum[256] != kScale)
    throw FrameError("frame is corrupted: entropy frequencies sum to " +
                     std::to_string(t.cum[256]) + ", expected " + std::to_string(kScale));
  const uint8_t* data = r.take(start[n_streams]);
  if (r.remaining() != 0)
    throw FrameError("frame is corrupted: " + std::to_string(r.remaining()) +
                     " stray bytes after the entropy-coded streams");
  memcpy(L.freq, t.freq, sizeof(t.freq));
  memcpy(L.cum, t.cum, sizeof(t.cum));
  L.data_off = (uint64_t)(data - in);
  return L;
}

void rans_decode(const uint8_t* in, uint64_t len, uint64_t n, uint32_t* z, int threads,
                 const uint8_t* table, uint64_t table_len) {
  const RansLayout L = rans_layout(in, len, n, table, table_len);
  const uint64_t n_streams = hl_div_up(n, HL_RANS_CHUNK);
  Table t;
  memcpy(t.freq, L.freq, sizeof(t.freq));
  memcpy(t.cum, L.cum, sizeof(t.cum));
  const std::vector<uint32_t>& escapes = L.escapes;
  const std::vector<uint64_t>& start = L.start;
  uint8_t lut[kScale];
  for (int s = 0; s < 256; ++s)
    for (uint32_t c = t.cum[s]; c < t.cum[s + 1]; ++c) lut[c] = (uint8_t)s;
  const uint64_t n_esc = escapes.size();
  const uint8_t* data = in + L.data_off;

  // Escapes are consumed in code order, so each stream needs to know how many came before it.
  // Decode symbols per stream in parallel, then resolve escapes in one ordered pass.
  bool bad = false;
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (n_streams > 8) \
    reduction(|| : bad)
  for (int64_t k = 0; k < (int64_t)n_streams; ++k) {
    uint64_t lo = (uint64_t)k * HL_RANS_CHUNK;
    uint64_t hi = lo + HL_RANS_CHUNK < n ? lo + HL_RANS_CHUNK : n;
    const uint8_t* p = data + start[k];
    const uint8_t* end = data + start[k + 1];
    if (end - p < 4) {
      bad = true;
      continue;
    }
    uint32_t x = load_u32(p);
    p += 4;
    if (x < HL_RANS_L || x >= (HL_RANS_L << 8)) {
      bad = true;
      continue;
    }
    for (uint64_t i = lo; i < hi; ++i) {
      uint32_t slot = x & (kScale - 1);
      uint32_t s = lut[slot];
      z[i] = s;
      x = t.freq[s] * (x >> HL_RANS_BITS) + slot - t.cum[s];
      while (x < HL_RANS_L) {
        if (p == end) {
          bad = true;
          break;
        }
        x = (x << 8) | *p++;
      }
      if (bad) break;
    }
    if (!bad && (x != HL_RANS_L || p != end)) bad = true;
  }
  if (bad) throw FrameError("frame is corrupted: an entropy-coded stream does not decode");
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (z[i] != HL_RANS_ESC) continue;
    if (k == n_esc) throw FrameError("frame is corrupted: more escaped codes than escapes");
    uint32_t v = escapes[k++];
    if (v < HL_RANS_ESC) throw FrameError("frame is corrupted: escape value below 255");
    z[i] = v;
  }
  if (k != n_esc) throw FrameError("frame is corrupted: unused escapes in the entropy section");
}

}  // namespace hl
