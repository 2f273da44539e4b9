// Host-side block packing (see "Packed integer arrays" in frame.h).
// The CUDA path packs the same bit planes with warp ballots.
#pragma once

#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "codec.h"
#include "codec_common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace hl {

#ifdef _OPENMP
inline int max_threads() { return omp_get_max_threads(); }
#else
inline int max_threads() { return 1; }
#endif
// threads <= 0 means all cores.
inline int resolve_threads(int threads) { return threads > 0 ? threads : max_threads(); }

// body(k, n) on each thread k of one OpenMP region of nt threads, or body(0, 1) on the caller
// when nt <= 1. libgomp ends every region, one of a single thread too, with a futex syscall
// waking its barrier whether anyone waits or not: a call of 13 pieces of 64 rows made 30 of
// them, the encoder's regions entered once a piece.
template <class Body>
inline void omp_threads(int nt, Body&& body) {
  if (nt <= 1) {
    body(0, 1);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
  body(omp_get_thread_num(), omp_get_num_threads());
#else
  body(0, 1);
#endif
}

// The largest of what body(k, n) returns on the threads of omp_threads(nt, body).
template <class Body>
inline uint32_t omp_max(int nt, Body&& body) {
  std::vector<uint32_t> part(nt > 1 ? nt : 1, 0);
  omp_threads(nt, [&](int k, int n) { part[k] = body(k, n); });
  return *std::max_element(part.begin(), part.end());
}

inline void store_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// Width of each block of 32 values: the bit width of the block's largest value; with max_out,
// also the largest of all n values (0 when n = 0).
void block_widths(const uint32_t* v, uint64_t n, uint8_t* widths, int threads,
                  uint32_t* max_out = nullptr);

// Payload bytes of one block of this width: a bit plane of HL_BLOCK values a bit.
inline uint64_t block_payload_bytes(uint64_t width) { return width * (HL_BLOCK / 8); }

// Payload bytes of blocks with these widths (block_payload_bytes of each).
uint64_t payload_bytes(const uint8_t* widths, uint64_t n_blocks);

// Writes widths then bit-plane payloads: n_blocks + payload_bytes(widths) bytes at out.
void pack_blocks(const uint32_t* v, uint64_t n, const uint8_t* widths, uint8_t* out, int threads);
// The same of values held as bytes (widths of at most 8).
void pack_blocks(const uint8_t* v, uint64_t n, const uint8_t* widths, uint8_t* out, int threads);

// Reads n values packed at [in, in+len). Throws FrameError, naming `what`, unless the section
// holds exactly the blocks it announces with widths of at most max_width.
void unpack_blocks(const uint8_t* in, uint64_t len, uint64_t n, uint32_t max_width, uint32_t* v,
                   const char* what, int threads);

// unpack_blocks without an array of all n values: the section is checked first, then unpacked a
// chunk of a few thousand values at a time into a buffer that stays in L1, each chunk handed to
// sink(index of its first value, values, count) (from several threads at once when threaded).
// A plain function and its context rather than a std::function, whose captures would be
// allocated on every frame decoded.
struct ChunkSink {
  void (*fn)(void* ctx, uint64_t first, const uint32_t* values, uint64_t count);
  void* ctx;
};
void unpack_blocks_to(const uint8_t* in, uint64_t len, uint64_t n, uint32_t max_width,
                      const char* what, int threads, ChunkSink sink);

// One block of 32 values (all there, none padding) as w bit planes of 4 bytes at out, and back,
// with the machine's fastest kernel (the same bytes on every path). The short-block sections
// (short_blocks.h) run two of their blocks of 16 through these at once.
void pack_block32(const uint32_t* v, uint32_t w, uint8_t* out);
void unpack_block32(const uint8_t* in, uint32_t w, uint32_t* v);

// The tables of the portable unpacking loops (block packing, short blocks): entry b has W-bit
// lane k equal to bit k of b (K bits), turning one byte of a bit plane into 8 byte lanes
// (K = 8, W = 8), or a nibble into 4 lanes of 16 bits (K = 4, W = 16).
template <int K, int W>
struct SpreadTable {
  uint64_t t[1 << K];
  SpreadTable() {
    for (int b = 0; b < (1 << K); ++b) {
      uint64_t s = 0;
      for (int k = 0; k < K; ++k) s |= (uint64_t)((b >> k) & 1) << (W * k);
      t[b] = s;
    }
  }
};
extern const SpreadTable<8, 8> kSpread8;
extern const SpreadTable<4, 16> kSpread16;

}  // namespace hl
