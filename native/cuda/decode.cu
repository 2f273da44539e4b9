// CUDA decoder of frames (frame.h). The frame is copied to the host once, its size and
// CRC32C checked there before anything is parsed from it (check.cu's rules), and parsed there
// (parse_frame; block-packed maps announce their length only through their width bytes, in the
// payload); the compact rANS tables, escapes and stream sizes are read there too (rans_layout,
// as the CPU decoder reads them). The device gets each section's layout and decodes every
// segment: block-packed, radix and short-block codes, packed or rANS-coded maps, rANS streams,
// outliers, map checks and row gather, all in stream order, one DecodeState a segment, one copy
// of the error words at the end. Kernels never read or write outside the frame and the buffers,
// whatever the payload says: each inconsistency sets a bit in the segment's error word, later
// kernels stop when it is set, and the host raises FrameError naming the first segment flagged.
#include <cub/cub.cuh>

#include <stdio.h>

#include <algorithm>

#include "codec_cuda_device.cuh"
#include "crc32c.h"
#include "elements.h"
#include "frame_io.h"
#include "level1_sections.h"
#include "rans.h"
#include "segment_table.h"  // the segments' error bits and their FrameError

namespace hl {
namespace gpu {
namespace {

struct alignas(16) DecodeState {
  uint32_t error;                     // SegmentError bits (segment_table.h)
  uint64_t esc_off, data_off, n_esc;  // level 2: offsets in the escapes and the code section
  uint32_t freq[256];
  uint32_t cum[257];
};

// rANS streams decoded by one block, and the shared-memory stride of one stream's symbols: 4
// bytes of padding put the lanes' reads of the same position in different banks.
constexpr unsigned kDecodeStreams = 32;
constexpr uint64_t kSymStride = HL_RANS_CHUNK + 4;
constexpr size_t kDecodeSmem = kDecodeStreams * kSymStride;

__device__ __forceinline__ void flag(DecodeState* ds, uint32_t bit) { atomicOr(&ds->error, bit); }

// Whether an earlier stage flagged the frame. Other blocks of the running kernel may flag it
// meanwhile, so one thread reads the word for the whole block: kernels with warp or block
// collectives must not let some of their threads leave early.
__device__ bool block_stopped(const DecodeState* ds) {
  __shared__ uint32_t seen;
  if (threadIdx.x == 0) seen = *reinterpret_cast<const volatile uint32_t*>(&ds->error);
  __syncthreads();
  return seen != 0;
}

// Widths of a packed section; a width over max_width is flagged and read as 0 so that the
// offsets stay inside the section.
__global__ void read_widths_kernel(const uint8_t* sec, uint64_t nb, uint32_t max_width,
                                   uint64_t* width, DecodeState* ds, uint32_t err) {
  HL_GRID_STRIDE(b, nb) {
    uint32_t w = sec[b];
    if (w > max_width) {
      flag(ds, err);
      w = 0;
    }
    width[b] = w;
  }
}

// The section must hold exactly its widths and their payloads (unpack_blocks in pack.cc).
__global__ void section_size_kernel(uint64_t nb, uint64_t len, const uint64_t* width,
                                    const uint64_t* word_off, DecodeState* ds, uint32_t err) {
  const uint64_t need = nb + (nb ? 4 * (word_off[nb - 1] + width[nb - 1]) : 0);
  if (need != len) flag(ds, err);
}

// Receives unpacked codes: dequantizes into the unique rows (or checks and stores raw bits).
// Code i is element i of the unique rows; a dithered segment has no map, so it is also element
// i of the segment, the index its dither offset hashes (element_value, elements.h).
template <int DT>
struct CodeSink {
  typename Elem<DT>::raw_t* u;
  ElementRule rule;
  __device__ void operator()(uint64_t i, uint32_t v, DecodeState* ds) const {
    if (rule.lossless) {
      if (sizeof(typename Elem<DT>::raw_t) == 2 && v > 0xffffu) flag(ds, kSegLosslessRange);
      u[i] = (typename Elem<DT>::raw_t)v;
    } else {
      u[i] = element_value<DT>(rule, v, i);
    }
  }
};

// Receives the values of a radix section (frame.h) and hands each digit to the inner sink:
// digit i of value j is code radix_code_of(G, g, j, i). Digits past the n codes must be 0 and
// what is left after g - 1 splits (the top digit) below K; anything else flags the code section.
template <typename Inner>
struct RadixSink {
  Inner inner;
  uint64_t n, G;
  uint32_t g;
  RadixDiv div;
  __device__ void operator()(uint64_t j, uint32_t v, DecodeState* ds) const {
    for (uint32_t i = 0; i + 1 < g; ++i) {
      const uint32_t q = radix_div(v, div), d = v - q * div.k;
      const uint64_t pos = radix_code_of(G, g, j, i);
      if (pos < n)
        inner(pos, d, ds);
      else if (d)
        flag(ds, kSegCodeSection);
      v = q;
    }
    const uint64_t pos = radix_code_of(G, g, j, g - 1);
    if (v >= div.k || (pos >= n && v))
      flag(ds, kSegCodeSection);
    else if (pos < n)
      inner(pos, v, ds);
  }
};

struct MapSink {
  uint32_t* map;
  __device__ void operator()(uint64_t i, uint32_t v, DecodeState*) const { map[i] = v; }
};

// One warp a block: lane j loads word j, every lane collects its bit of each word.
template <typename Sink>
__global__ void unpack_blocks_kernel(const uint8_t* sec, uint64_t len, uint64_t n,
                                     const uint64_t* width, const uint64_t* word_off,
                                     DecodeState* ds, uint32_t err, Sink sink) {
  if (block_stopped(ds)) return;
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  HL_WARP_STRIDE(b, nb) {
    const uint32_t w = (uint32_t)width[b];
    const uint64_t off = nb + 4 * word_off[b];
    if (w > 32 || off + 4ull * w > len) {  // excluded by the size check; guards the reads
      if (lane_id() == 0) flag(ds, err);
      continue;
    }
    const uint32_t word = lane_id() < w ? (uint32_t)get_le(sec + off + 4 * lane_id(), 4) : 0u;
    uint32_t v = 0;
    for (uint32_t j = 0; j < w; ++j) v |= ((__shfl_sync(kFull, word, j) >> lane_id()) & 1u) << j;
    const uint64_t i = b * HL_BLOCK + lane_id();
    if (i < n) sink(i, v, ds);
  }
}

// ---- short-block sections (frame.h "Short-block section") ---------------------------------

// Widths from the nibbles after the mark; the padding nibble after an odd count must be 0.
__global__ void read_short_widths_kernel(const uint8_t* sec, uint64_t nb, uint64_t* width,
                                         DecodeState* ds, uint32_t err) {
  HL_GRID_STRIDE(b, nb) width[b] = short_width(sec + 1, b);
  if (blockIdx.x == 0 && threadIdx.x == 0 && (nb & 1) && (sec[1 + nb / 2] >> 4) != 0)
    flag(ds, err);
}

// The section must be exactly its mark, nibbles and planes.
__global__ void short_size_kernel(uint64_t n, uint64_t len, const uint64_t* width,
                                  const uint64_t* word_off, DecodeState* ds, uint32_t err) {
  const uint64_t nb = short_n_blocks(n);
  if (short_section_bytes(n, word_off[nb - 1] + width[nb - 1]) != len) flag(ds, err);
}

// Two blocks a warp: lane i of a half loads word i of its block, every lane collects its bit
// of each of the half's words.
template <typename Sink>
__global__ void unpack_short_kernel(const uint8_t* sec, uint64_t len, uint64_t n,
                                    const uint64_t* width, const uint64_t* word_off,
                                    DecodeState* ds, uint32_t err, Sink sink) {
  if (block_stopped(ds)) return;
  const uint64_t nb = short_n_blocks(n), head = short_head_bytes(n);
  HL_WARP_STRIDE(w, hl_div_up(nb, 2)) {
    const unsigned half = lane_id() >> 4, li = lane_id() & 15;
    const uint64_t b = 2 * w + half;
    uint32_t wb = b < nb ? (uint32_t)width[b] : 0u;
    const uint64_t off = b < nb ? head + 2 * word_off[b] : 0;
    if (wb > HL_SHORT_MAX_WIDTH || off + 2ull * wb > len) {  // excluded by the size check
      if (li == 0) flag(ds, err);
      wb = 0;
    }
    const uint32_t word = li < wb ? (uint32_t)get_le(sec + off + 2 * li, 2) : 0u;
    uint32_t v = 0;
    for (uint32_t j = 0; j < HL_SHORT_MAX_WIDTH; ++j) {
      const uint32_t wj = __shfl_sync(kFull, word, 16 * half + j);
      if (j < wb) v |= ((wj >> li) & 1u) << j;
    }
    const uint64_t i = b * HL_SHORT_BLOCK + li;
    if (b < nb && i < n) sink(i, v, ds);
  }
}

// rans_decode (rans_cpu.cc) for kDecodeStreams streams a block: one thread a stream decodes
// into shared memory (the lanes' serial loops would otherwise each store a byte to a different
// line of global memory every step), then the block copies the symbols out, coalesced.
// Escapes are counted per stream.
constexpr unsigned kDecodeThreads = 128;

__global__ void rans_decode_kernel(const uint8_t* sec, uint64_t n, const uint64_t* stream_len,
                                   const uint64_t* stream_off, DecodeState* ds, uint8_t* sym,
                                   uint64_t* esc_count) {
  extern __shared__ uint8_t out[];  // kDecodeStreams x kSymStride
  __shared__ uint8_t lut[1u << HL_RANS_BITS];
  __shared__ uint32_t freq[256], cum[256];
  if (block_stopped(ds)) return;
  for (unsigned s = threadIdx.x; s < 256; s += blockDim.x) {
    const uint32_t f = ds->freq[s], c = ds->cum[s];
    freq[s] = f;
    cum[s] = c;
    for (uint32_t k = c; k < c + f && k < (1u << HL_RANS_BITS); ++k) lut[k] = (uint8_t)s;
  }
  const uint8_t* data = sec + ds->data_off;
  const uint64_t ns = hl_div_up(n, HL_RANS_CHUNK);
  for (uint64_t base = (uint64_t)blockIdx.x * kDecodeStreams; base < ns;
       base += (uint64_t)gridDim.x * kDecodeStreams) {
    __syncthreads();  // tables built; the previous group copied out
    const uint64_t k = base + threadIdx.x;
    if (threadIdx.x < kDecodeStreams && k < ns) {
      const uint64_t lo = k * HL_RANS_CHUNK, hi = lo + HL_RANS_CHUNK < n ? lo + HL_RANS_CHUNK : n;
      uint8_t* my = out + threadIdx.x * kSymStride;
      const uint8_t* p = data + stream_off[k];
      const uint8_t* end = p + stream_len[k];
      uint64_t esc = 0;
      bool bad = end - p < 4;
      uint32_t x = 0;
      if (!bad) {
        x = (uint32_t)get_le(p, 4);
        p += 4;
        bad = x < HL_RANS_L || x >= (HL_RANS_L << 8);
      }
      for (uint64_t i = 0; i < hi - lo && !bad; ++i) {
        const uint32_t slot = x & ((1u << HL_RANS_BITS) - 1);
        const uint32_t s = lut[slot];
        my[i] = (uint8_t)s;
        esc += s == HL_RANS_ESC;
        x = freq[s] * (x >> HL_RANS_BITS) + slot - cum[s];
        while (x < HL_RANS_L) {
          if (p == end) {
            bad = true;
            break;
          }
          x = (x << 8) | *p++;
        }
      }
      if (!bad && (x != HL_RANS_L || p != end)) bad = true;
      if (bad) flag(ds, kSegEntropy);
      esc_count[k] = esc;
    }
    __syncthreads();
    const uint64_t lo = base * HL_RANS_CHUNK;
    const uint64_t hi = lo + kDecodeStreams * HL_RANS_CHUNK < n ? lo + kDecodeStreams * HL_RANS_CHUNK : n;
    for (uint64_t j = threadIdx.x; j < hi - lo; j += blockDim.x)
      sym[lo + j] = out[(j / HL_RANS_CHUNK) * kSymStride + j % HL_RANS_CHUNK];
  }
}

__global__ void rans_escape_total_kernel(uint64_t ns, const uint64_t* esc_count,
                                         const uint64_t* esc_off, DecodeState* ds) {
  if (ds->error) return;
  if (esc_off[ns - 1] + esc_count[ns - 1] != ds->n_esc) flag(ds, kSegEntropy);
}

// One block a stream: escapes resolved in order (block scan), then the codes go to the sink.
// Each thread takes a contiguous run of HL_RANS_CHUNK / kThreads codes.
template <typename Sink>
__global__ void rans_finish_kernel(const uint8_t* sec, uint64_t n, const uint8_t* sym,
                                   const uint64_t* esc_off, DecodeState* ds, Sink sink) {
  typedef cub::BlockScan<uint32_t, kThreads> Scan;
  __shared__ typename Scan::TempStorage scan_tmp;
  constexpr uint32_t kRun = HL_RANS_CHUNK / kThreads;
  static_assert(HL_RANS_CHUNK % kThreads == 0, "streams split evenly over the block");
  if (block_stopped(ds)) return;
  const uint8_t* esc = sec + ds->esc_off;
  const uint64_t n_esc = ds->n_esc;
  const uint64_t ns = hl_div_up(n, HL_RANS_CHUNK);
  HL_BLOCK_STRIDE(k, ns) {
    const uint64_t hi = (k + 1) * HL_RANS_CHUNK < n ? (k + 1) * HL_RANS_CHUNK : n;
    const uint64_t lo = k * HL_RANS_CHUNK + (uint64_t)threadIdx.x * kRun;
    uint32_t mine = 0;
    for (uint64_t i = lo; i < lo + kRun && i < hi; ++i) mine += sym[i] == HL_RANS_ESC;
    uint32_t before;
    Scan(scan_tmp).ExclusiveSum(mine, before);
    uint64_t g = esc_off[k] + before;
    for (uint64_t i = lo; i < lo + kRun && i < hi; ++i) {
      uint32_t v = sym[i];
      if (v == HL_RANS_ESC) {
        if (g < n_esc) {
          v = (uint32_t)get_le(esc + 4 * g, 4);
          if (v < HL_RANS_ESC) flag(ds, kSegEntropy);
        } else {
          flag(ds, kSegEntropy);
        }
        ++g;
      }
      sink(i, v, ds);
    }
    __syncthreads();
  }
}

// Outlier records must be in range and strictly increasing (so no two threads write one
// element); fp16/bf16 raw bits must fit 16 bits. A record is pos_bytes of position then
// raw_bytes of raw bits, little-endian (outlier_pos_bytes and the element's bytes).
template <int DT>
__global__ void scatter_outliers_kernel(const uint8_t* rec, uint64_t n_out, uint64_t nu,
                                        uint32_t pos_bytes, uint32_t raw_bytes,
                                        typename Elem<DT>::raw_t* u, DecodeState* ds) {
  if (ds->error) return;
  const uint64_t size = pos_bytes + raw_bytes;
  HL_GRID_STRIDE(k, n_out) {
    const uint64_t pos = get_le(rec + size * k, (int)pos_bytes);
    const uint32_t raw = (uint32_t)get_le(rec + size * k + pos_bytes, (int)raw_bytes);
    const bool ordered = k == 0 || pos > get_le(rec + size * (k - 1), (int)pos_bytes);
    if (pos >= nu || !ordered ||
        (sizeof(typename Elem<DT>::raw_t) == 2 && raw > 0xffffu)) {
      flag(ds, kSegOutlier);
      continue;
    }
    u[pos] = (typename Elem<DT>::raw_t)raw;
  }
}

// The map numbers unique rows by first occurrence: each entry is at most one more than the
// largest before it, and the largest is n_unique - 1.
__global__ void check_map_kernel(const uint32_t* map, const uint32_t* prefix_max, uint64_t n_rows,
                                 uint64_t n_unique, DecodeState* ds) {
  if (ds->error) return;
  HL_GRID_STRIDE(r, n_rows) {
    const uint64_t allowed = r ? (uint64_t)prefix_max[r - 1] + 1 : 0;
    if (map[r] > allowed || map[r] >= n_unique) flag(ds, kSegMapEntry);
    if (r == n_rows - 1 && (uint64_t)prefix_max[r] + 1 != n_unique) flag(ds, kSegMapEntry);
  }
}

template <int DT>
__global__ void gather_rows_kernel(const typename Elem<DT>::raw_t* u, const uint32_t* map,
                                   uint64_t n_rows, uint64_t d, uint64_t n_unique,
                                   typename Elem<DT>::raw_t* out, DecodeState* ds) {
  if (ds->error) return;
  HL_WARP_STRIDE(r, n_rows) {
    const uint64_t m = map[r];
    if (m >= n_unique) continue;
    for (uint64_t i = lane_id(); i < d; i += 32) out[r * d + i] = u[m * d + i];
  }
}

// Symbols of a rANS-coded map back to entries (rans_map_encode): 0 is the next new row, u + 1
// a repeat of unique row u. new_before is the exclusive scan of the zero flags. In place.
__global__ void new_row_flags_kernel(const uint32_t* sym, uint64_t n_rows, uint32_t* flag) {
  HL_GRID_STRIDE(r, n_rows) flag[r] = sym[r] == 0;
}
__global__ void map_from_symbols_kernel(uint32_t* map, const uint32_t* new_before,
                                        uint64_t n_rows, const DecodeState* ds) {
  if (ds->error) return;
  HL_GRID_STRIDE(r, n_rows) map[r] = map[r] == 0 ? new_before[r] : map[r] - 1;
}

__global__ void gather_errors_kernel(const DecodeState* ds, uint64_t n, uint32_t* errors) {
  HL_GRID_STRIDE(k, n) errors[k] = ds[k].error;
}

// ---- decoder host side -----------------------------------------------------------------------

// What the host read of one segment's level-2 sections.
struct SegmentPlan {
  SegmentView v;
  uint64_t out_elems = 0;  // where its rows start in the output, in elements
  RansLayout code, map;    // level 2 / HL_SEG_MAP_RANS only
};

// Scratch sized for the largest segment; segments run one after another on the stream.
struct DecodeScratch {
  uint64_t *width, *word_off;
  uint8_t* uniq;
  uint8_t* sym;
  uint64_t *stream_len, *stream_off, *esc_count, *esc_off;
  uint32_t *map, *prefix_max;
  uint32_t *escapes, *new_before, *errors;
  DecodeState* states;  // one a segment
  DecodeState* ds;      // the segment's being enqueued
  CubScratch cub;
};

template <typename Sink>
void unpack_section(const uint8_t* sec, uint64_t len, uint64_t n, uint32_t err, Sink sink,
                    const DecodeScratch& s, cudaStream_t stream) {
  const uint64_t nb = hl_div_up(n, HL_BLOCK);
  if (nb > len)  // parse_header rules this out; the kernels below rely on it
    throw FrameError("frame is corrupted: a packed section of " + std::to_string(len) +
                     " bytes is too small for the widths of " + std::to_string(nb) + " blocks");
  launch("read_widths", read_widths_kernel, grid_for(nb, kThreads), kThreads, stream, sec, nb,
         32u, s.width, s.ds, err);
  if (nb)
    cub_run("scan of block widths", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, s.width, s.word_off, nb, stream);
    });
  launch("section_size", section_size_kernel, 1, 1, stream, nb, len, s.width, s.word_off, s.ds,
         err);
  launch("unpack_blocks", unpack_blocks_kernel<Sink>, grid_for(nb, kWarpsPerBlock), kThreads,
         stream, sec, len, n, s.width, s.word_off, s.ds, err, sink);
}

// Decodes the short-block section at sec (len bytes, n >= 1 codes) into sink.
template <typename Sink>
void unpack_short_section(const uint8_t* sec, uint64_t len, uint64_t n, uint32_t err, Sink sink,
                          const DecodeScratch& s, cudaStream_t stream) {
  const uint64_t nb = short_n_blocks(n);
  if (short_head_bytes(n) > len)  // the nibbles must be there before they are read
    throw FrameError("frame is corrupted: a short-block section of " + std::to_string(len) +
                     " bytes is too small for the widths of " + std::to_string(nb) + " blocks");
  launch("read_short_widths", read_short_widths_kernel, grid_for(nb, kThreads), kThreads, stream,
         sec, nb, s.width, s.ds, err);
  cub_run("scan of short-block widths", s.cub, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, s.width, s.word_off, nb, stream);
  });
  launch("short_size", short_size_kernel, 1, 1, stream, n, len, s.width, s.word_off, s.ds, err);
  launch("unpack_short", unpack_short_kernel<Sink>, grid_for(hl_div_up(nb, 2), kWarpsPerBlock),
         kThreads, stream, sec, len, n, s.width, s.word_off, s.ds, err, sink);
}

void plan_decode_scratch(const FrameView& f, const std::vector<SegmentPlan>& plans, Workspace* ws,
                         DecodeScratch* x) {
  uint64_t nb = 0, ns = 0, uniq = 0, sym = 0, map_rows = 0, rans_rows = 0, esc = 0;
  for (const SegmentPlan& p : plans) {
    const SegmentView& v = p.v;
    const uint64_t nu = v.n_unique * v.row_len;
    const bool identity = v.identity;
    const uint64_t rows = identity ? 0 : v.n_rows;
    nb = std::max(nb, hl_div_up(std::max(v.level == 1 ? nu : 0, v.map_rans ? 0 : rows), HL_BLOCK));
    if (v.level == 1) nb = std::max(nb, short_n_blocks(nu));  // a short-block section's blocks
    if (v.level == 2) {
      ns = std::max(ns, hl_div_up(nu, HL_RANS_CHUNK));
      sym = std::max(sym, nu);
      esc = std::max<uint64_t>(esc, p.code.escapes.size());
    }
    if (v.map_rans) {
      ns = std::max(ns, hl_div_up(rows, HL_RANS_CHUNK));
      sym = std::max(sym, rows);
      esc = std::max<uint64_t>(esc, p.map.escapes.size());
      rans_rows = std::max(rans_rows, rows);
    }
    if (!identity) uniq = std::max(uniq, nu * hl_elem_bytes(f.dtype));
    map_rows = std::max(map_rows, rows);
  }
  DecodeScratch& s = *x;
  size_t cub_bytes = 0;
  cub_need(&cub_bytes, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, std::max(nb, ns), 0);
  });
  if (map_rows)
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_prefix_max<uint32_t>(t, b, nullptr, nullptr, map_rows, 0);
    });
  if (rans_rows)
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint32_t>(t, b, nullptr, nullptr, rans_rows, 0);
    });
  ws->reserve(&s.width, nb);
  ws->reserve(&s.word_off, nb);
  ws->reserve(&s.uniq, uniq);
  ws->reserve(&s.sym, sym);
  ws->reserve(&s.stream_len, ns);
  ws->reserve(&s.stream_off, ns);
  ws->reserve(&s.esc_count, ns);
  ws->reserve(&s.esc_off, ns);
  ws->reserve(&s.map, map_rows);
  ws->reserve(&s.prefix_max, map_rows);
  ws->reserve(&s.escapes, esc);
  ws->reserve(&s.new_before, rans_rows);
  ws->reserve(&s.states, plans.size());
  ws->reserve(&s.errors, plans.size());
  ws->reserve_bytes(&s.cub.tmp, cub_bytes);
  s.cub.bytes = cub_bytes;
  s.ds = nullptr;
}

// The part of a DecodeState a rANS section fills, from esc_off on: the error word before it
// keeps what earlier sections of the segment found.
constexpr size_t kRansStateOffset = offsetof(DecodeState, esc_off);

// Decodes the level-2 section at sec_dev (its layout L read on the host) of n codes into sink.
template <typename Sink>
void enqueue_rans(const uint8_t* sec_dev, const RansLayout& L, uint64_t n, Sink sink,
                  const DecodeScratch& s, DecodeState* ds, cudaStream_t stream) {
  const uint64_t ns = hl_div_up(n, HL_RANS_CHUNK);  // >= 1: parse_frame rejects empty level 2
  DecodeState h;
  memset(&h, 0, sizeof(h));
  h.esc_off = 0;  // the escapes go to their own buffer, as 4-byte values
  h.data_off = L.data_off;
  h.n_esc = L.escapes.size();
  memcpy(h.freq, L.freq, sizeof(h.freq));
  memcpy(h.cum, L.cum, sizeof(h.cum));
  // Pageable sources: each copy returns once its bytes are staged, so the host vectors may go.
  HL_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t*>(ds) + kRansStateOffset,
                                reinterpret_cast<const uint8_t*>(&h) + kRansStateOffset,
                                sizeof(DecodeState) - kRansStateOffset, cudaMemcpyHostToDevice,
                                stream));
  std::vector<uint64_t> offs(2 * ns);
  for (uint64_t k = 0; k < ns; ++k) {
    offs[k] = L.start[k + 1] - L.start[k];
    offs[ns + k] = L.start[k];
  }
  HL_CUDA_CHECK(cudaMemcpyAsync(s.stream_len, offs.data(), ns * sizeof(uint64_t),
                                cudaMemcpyHostToDevice, stream));
  HL_CUDA_CHECK(cudaMemcpyAsync(s.stream_off, offs.data() + ns, ns * sizeof(uint64_t),
                                cudaMemcpyHostToDevice, stream));
  if (!L.escapes.empty())
    HL_CUDA_CHECK(cudaMemcpyAsync(s.escapes, L.escapes.data(), L.escapes.size() * 4,
                                  cudaMemcpyHostToDevice, stream));
  launch_smem("rans_decode", rans_decode_kernel, hl_div_up(ns, kDecodeStreams), kDecodeThreads,
              kDecodeSmem, stream, sec_dev, n, s.stream_len, s.stream_off, ds, s.sym,
              s.esc_count);
  cub_run("scan of escape counts", s.cub, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, s.esc_count, s.esc_off, ns, stream);
  });
  launch("rans_escape_total", rans_escape_total_kernel, 1, 1, stream, ns, s.esc_count, s.esc_off,
         ds);
  launch("rans_finish", rans_finish_kernel<Sink>, grid_for(ns, 1), kThreads, stream,
         reinterpret_cast<const uint8_t*>(s.escapes), n, s.sym, s.esc_off, ds, sink);
}

template <int DT>
void enqueue_segment(const SegmentPlan& p, const uint8_t* host_frame, const uint8_t* frame_dev,
                     void* out_v, const DecodeScratch& x, DecodeState* ds, cudaStream_t stream) {
  typedef typename Elem<DT>::raw_t raw_t;
  const SegmentView& v = p.v;
  raw_t* out = static_cast<raw_t*>(out_v) + p.out_elems;
  const uint64_t R = v.n_rows, d = v.row_len, nu = v.n_unique * d;
  const bool identity = v.identity;
  auto on_device = [&](const uint8_t* host_p) { return frame_dev + (host_p - host_frame); };
  DecodeScratch s = x;
  s.ds = ds;
  raw_t* u = identity ? out : reinterpret_cast<raw_t*>(s.uniq);
  const CodeSink<DT> sink{u, element_rule(v.eb_abs, v.lossless, v.dithered, v.seed)};
  if (v.level == 1 && v.radix_k) {  // parse_frame read and checked its head: lossy, nu >= 1
    const uint64_t G = hl_div_up(nu, v.radix_g);
    const RadixSink<CodeSink<DT>> radix{sink, nu, G, v.radix_g, radix_div_of(v.radix_k)};
    unpack_section(on_device(v.code) + v.radix_head, v.code_bytes - v.radix_head, G,
                   kSegCodeSection, radix, s, stream);
  } else if (v.level == 1 && v.short_blocks) {  // parse_frame saw the mark: lossy, nu >= 1
    unpack_short_section(on_device(v.code), v.code_bytes, nu, kSegCodeSection, sink, s, stream);
  } else if (v.level == 1) {
    unpack_section(on_device(v.code), v.code_bytes, nu, kSegCodeSection, sink, s, stream);
  } else {
    enqueue_rans(on_device(v.code), p.code, nu, sink, x, ds, stream);
  }
  launch("scatter_outliers", scatter_outliers_kernel<DT>, grid_for(v.n_outliers, kThreads),
         kThreads, stream, on_device(v.outliers), v.n_outliers, nu, (uint32_t)v.pos_bytes,
         (uint32_t)sizeof(raw_t), u, ds);
  if (identity) return;
  if (v.map_rans) {
    enqueue_rans(on_device(v.map), p.map, R, MapSink{s.map}, x, ds, stream);
    launch("new_row_flags", new_row_flags_kernel, grid_for(R, kThreads), kThreads, stream, s.map,
           R, s.prefix_max);
    cub_run("scan of new rows", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint32_t>(t, b, s.prefix_max, x.new_before, R, stream);
    });
    launch("map_from_symbols", map_from_symbols_kernel, grid_for(R, kThreads), kThreads, stream,
           s.map, x.new_before, R, ds);
  } else {
    unpack_section(on_device(v.map), v.map_bytes, R, kSegMapSection, MapSink{s.map}, s, stream);
  }
  cub_run("prefix max of the row map", s.cub, [&](void* t, size_t& b) {
    return cub_prefix_max(t, b, s.map, s.prefix_max, R, stream);
  });
  launch("check_map", check_map_kernel, grid_for(R, kThreads), kThreads, stream, s.map,
         s.prefix_max, R, v.n_unique, ds);
  launch("gather_rows", gather_rows_kernel<DT>, grid_for(R, kWarpsPerBlock), kThreads, stream, u,
         s.map, R, d, v.n_unique, out, ds);
}

}  // namespace
}  // namespace gpu

// =============================================================================================
// Entry point (codec.h)
// =============================================================================================

void decompress_cuda(const uint8_t* frame_dev, uint64_t size, void* out_dev, uint64_t out_bytes,
                     void* stream_v, bool verify_checksum) {
  using namespace gpu;
  check_frame_size(size);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(frame_dev, "the frame");
  std::vector<uint8_t> host(size);
  memcpy(host.data(), fetch(frame_dev, size, stream), size);
  if (verify_checksum) {  // on the copy, before anything is parsed from it
    const uint32_t stored = stored_crc(host.data(), size, size);
    const uint32_t crc = crc32c(host.data() + HL_FRAME_PREFIX, size - HL_FRAME_PREFIX);
    check_crc(crc, stored);
  }

  const FrameView f = parse_frame(host.data(), size);
  std::vector<SegmentPlan> plans(f.segs.size());
  uint64_t at = 0;
  for (size_t k = 0; k < f.segs.size(); ++k) {
    SegmentPlan& p = plans[k];
    p.v = f.segs[k];
    if (p.v.map_buckets)
      throw ArgumentError("bucketed row maps have no CUDA decoder yet: decode them on the CPU "
                          "(hvd_lossy.decompress does this for device frames)");
    p.out_elems = at;
    at += p.v.n_rows * p.v.row_len;
    // A section whose table is borrowed (w = 0) reads the frame's first table (frame.h).
    if (p.v.level == 2)
      p.code = rans_layout(p.v.code, p.v.code_bytes, p.v.n_unique * p.v.row_len, p.v.table,
                           p.v.table_bytes);
    if (p.v.map_rans) p.map = rans_layout(p.v.map, p.v.map_bytes, p.v.n_rows);
  }
  const uint64_t need = f.decoded_bytes();
  if (out_bytes != need)
    throw ArgumentError("output buffer holds " + std::to_string(out_bytes) +
                        " bytes, the frame decodes to " + std::to_string(need));
  if (plans.empty()) return;
  Workspace ws(stream);
  DecodeScratch x;
  plan_decode_scratch(f, plans, &ws, &x);
  ws.allocate();
  HL_CUDA_CHECK(cudaMemsetAsync(x.states, 0, plans.size() * sizeof(DecodeState), stream));
  with_dtype(f.dtype, [&](auto dt) {
    for (size_t k = 0; k < plans.size(); ++k)
      enqueue_segment<decltype(dt)::value>(plans[k], host.data(), frame_dev, out_dev, x,
                                           x.states + k, stream);
  });
  launch("gather_errors", gather_errors_kernel, grid_for(plans.size(), kThreads), kThreads,
         stream, x.states, (uint64_t)plans.size(), x.errors);
  std::vector<uint32_t> errors(plans.size());
  memcpy(errors.data(), fetch(x.errors, errors.size() * 4, stream), errors.size() * 4);
  for (size_t k = 0; k < errors.size(); ++k)
    if (errors[k])
      raise_segment_error(errors[k], "segment " + std::to_string(k), plans[k].v.code_bytes,
                          plans[k].v.n_unique * plans[k].v.row_len, plans[k].v.map_bytes);
}

}  // namespace hl
