// CRC32C for format-2 frames: hardware (SSE4.2) when present, slicing-by-8 tables otherwise.
#include "crc32c.h"

#include <string.h>

#include "frame_fields.h"  // the table and the piecewise combination, shared with CUDA

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define HL_CRC_X86 1
#endif

namespace hl {
namespace {

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) t[0][i] = crc32c_table_entry(i);
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

uint32_t update_portable(uint32_t c, const uint8_t* p, uint64_t n) {
  const Tables& T = tables();
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);  // little-endian hosts only, like the rest of the codec
    w ^= c;
    c = T.t[7][w & 0xff] ^ T.t[6][(w >> 8) & 0xff] ^ T.t[5][(w >> 16) & 0xff] ^
        T.t[4][(w >> 24) & 0xff] ^ T.t[3][(w >> 32) & 0xff] ^ T.t[2][(w >> 40) & 0xff] ^
        T.t[1][(w >> 48) & 0xff] ^ T.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ T.t[0][(c ^ *p++) & 0xff];
  return c;
}

#ifdef HL_CRC_X86
__attribute__((target("sse4.2"))) uint32_t update_hw(uint32_t c, const uint8_t* p, uint64_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = (uint32_t)c64;
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// update_hw over three thirds at once: one crc32 instruction takes three cycles to give its
// result, and three chains keep the unit busy every cycle. The register is linear, so the
// register after A || B || C is shift(a, |B| + |C|) ^ shift(b, |C|) ^ c with b and c run from
// zero (frame_fields.h). Short messages keep one chain: the shifts cost about 2 KiB of it.
__attribute__((target("sse4.2"))) uint32_t update_hw3(uint32_t c, const uint8_t* p, uint64_t n) {
  const uint64_t third = n / 24 * 8;  // whole 8-byte words
  if (third < 4096) return update_hw(c, p, n);
  const uint8_t* q = p + third;
  const uint8_t* r = q + third;
  uint64_t a = c, b = 0, d = 0;
  for (uint64_t i = 0; i < third; i += 8) {
    uint64_t wa, wb, wd;
    memcpy(&wa, p + i, 8);
    memcpy(&wb, q + i, 8);
    memcpy(&wd, r + i, 8);
    a = _mm_crc32_u64(a, wa);
    b = _mm_crc32_u64(b, wb);
    d = _mm_crc32_u64(d, wd);
  }
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  uint32_t t = crc32c_shift((uint32_t)a, third, x2k) ^ (uint32_t)b;
  t = crc32c_shift(t, third, x2k) ^ (uint32_t)d;
  return update_hw(t, r + third, n - 3 * third);
}
#endif

}  // namespace

bool crc32c_hardware() {
#ifdef HL_CRC_X86
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t crc32c_portable(const uint8_t* p, uint64_t n) { return ~update_portable(~0u, p, n); }

uint32_t crc32c(const uint8_t* p, uint64_t n) {
#ifdef HL_CRC_X86
  if (crc32c_hardware()) return ~update_hw3(~0u, p, n);
#endif
  return crc32c_portable(p, n);
}

uint32_t crc32c_in_pieces(const uint8_t* p, uint64_t n, uint64_t piece) {
  if (piece == 0) piece = 1;
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  const uint32_t* table = tables().t[0];
  uint32_t terms = 0;
  // Pieces in reverse order: the XOR does not care, which is what the device relies on.
  for (uint64_t k = hl_div_up(n, piece); k-- > 0;) {
    const uint64_t lo = k * piece, len = n - lo < piece ? n - lo : piece;
    terms ^= crc32c_piece_term(crc32c_update(0, p + lo, len, table), n - lo - len, x2k);
  }
  return crc32c_finish(terms, n, x2k);
}

}  // namespace hl
