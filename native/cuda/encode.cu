// CUDA codec: writes the frame format of frame.h byte for byte like codec_cpu.cc.
//
// Shape of the encoder (one chunk, all enqueued on the caller's stream, no host sync inside):
//   finite range (rel mode) -> eb_abs on the device -> quantize (codes + row outlier flags)
//   -> dedup: row content hash, radix sort of (hash, row), first identical row within each
//      hash run, exclusive scan of "first of its kind" flags = unique ids in first-occurrence
//      order -> dedup_pays -> gather unique rows
//   -> outlier counts per unique row, scan, codes at outliers zeroed
//   -> block packing of the map and the codes (warp OR for widths, scan, ballot bit planes)
//   -> level 2: histogram, normalize_freqs (one thread), one thread a rANS stream into a
//      worst-case slot, scans of stream sizes and escape counts, choice of the smaller section
//   -> outlier records, header, checksum (sum of checksum_term over the frame's words)
// Every size the host cannot know yet (n_unique, section sizes, the level) lives in an
// EncodeState on the device; kernels are launched over worst-case counts known on the host and
// read the real counts from the state. The host learns the frame sizes with one copy at the end.
// A lossy frame larger than hl_max_frame_bytes is not finished on the device (its outliers and
// header are skipped); the host then encodes that chunk again, lossless (a second copy).
//
// The decoder is codec_cuda_decode.cu, the checks before allocating codec_cuda_check.cu; the
// device helpers all three share are in codec_cuda_device.cuh.
#include <cub/cub.cuh>

#include <stdio.h>

#include <map>
#include <mutex>
#include <type_traits>

#include "codec_cuda.cuh"
#include "codec_cuda_device.cuh"
#include "level1_sections.h"

namespace hl {
namespace gpu {

// ---- host infrastructure -------------------------------------------------------------------

DeviceScope::DeviceScope(const void* ptr, const char* what) {
  cudaPointerAttributes attr;
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();  // clear the sticky-free error of a failed query
    throw ArgumentError(std::string(what) + " is not CUDA device memory");
  }
  HL_CUDA_CHECK(cudaGetDevice(&previous_));
  device_ = attr.device;
  if (device_ != previous_) HL_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

namespace {

// Freed scratch stays in the pool up to this many bytes, so that steady-state calls allocate
// without going to the driver; memory beyond it goes back at the next synchronization.
constexpr uint64_t kPoolKeepBytes = 2ull << 30;

cudaMemPool_t device_pool(int device) {
  static std::mutex mu;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool;
  HL_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep = kPoolKeepBytes;
  HL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  pools[device] = pool;
  return pool;
}

struct PinnedBuffer {
  void* p = nullptr;
  uint64_t cap = 0;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};
thread_local PinnedBuffer t_staging;

}  // namespace

void* pool_alloc(uint64_t bytes, cudaStream_t stream) {
  int device;
  HL_CUDA_CHECK(cudaGetDevice(&device));
  void* p = nullptr;
  HL_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, device_pool(device), stream));
  return p;
}

Workspace::~Workspace() {
  if (base_) cudaFreeAsync(base_, stream_);
}

void Workspace::allocate() {
  base_ = pool_alloc(bytes_, stream_);
  for (const Piece& p : pieces_) *p.target = static_cast<uint8_t*>(base_) + p.offset;
}

const void* fetch(const void* src_dev, uint64_t bytes, cudaStream_t stream) {
  if (t_staging.cap < bytes) {
    if (t_staging.p) HL_CUDA_CHECK(cudaFreeHost(t_staging.p));
    t_staging.p = nullptr;
    t_staging.cap = 0;
    uint64_t cap = bytes < 4096 ? 4096 : bytes;
    HL_CUDA_CHECK(cudaMallocHost(&t_staging.p, cap));
    t_staging.cap = cap;
  }
  HL_CUDA_CHECK(cudaMemcpyAsync(t_staging.p, src_dev, bytes, cudaMemcpyDeviceToHost, stream));
  HL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return t_staging.p;
}

namespace {

// =============================================================================================
// Encoder
// =============================================================================================

// What the device knows about one chunk's frame. Offsets are from the frame's first byte.
struct alignas(16) EncodeState {
  unsigned long long lo_key, hi_key;  // finite range, order_key encoded
  double eb_abs, step, inv_step;
  uint32_t lossless;    // codes are raw bits
  uint32_t error;       // kEncodeBoundOverflow
  uint32_t identity;    // no map section
  uint32_t level;       // level stored
  uint32_t fallback;    // lossy frame too large: encode again lossless
  uint32_t n_present;   // level 2: symbols with nonzero frequency
  // Format-2 segments (v2): the sections alone from offset 0 of the job's slot, v2 outlier
  // records, no header or checksum (codec_cuda_v2.cu writes the frame around them).
  uint32_t v2;
  uint32_t bound;       // v2: hl_bound_code of the bound the codes use
  uint32_t max_code;    // largest stored code: radix K and whether short blocks apply
  uint32_t packing;     // v2: Level1Packing of the code section
  uint32_t radix_k, radix_g;
  uint64_t radix_G, radix_head, radix_vals_bytes;
  uint64_t n_unique_found;  // distinct rows before the dedup_pays rule
  uint64_t n_unique, n_codes, map_count, n_outliers;
  uint64_t map_off, map_bytes, code_off, code1_bytes, code_bytes, outlier_off, total;
  uint64_t n_streams, n_esc;
  unsigned long long checksum_sum;
  uint32_t* ucodes;  // codes of the unique rows: the quantized codes themselves, or gathered
  unsigned long long counts[256];
  uint32_t freq[256];
  uint32_t cum[257];
};

constexpr uint32_t kEncodeBoundOverflow = 1;

// What the host reads back per chunk.
struct ChunkResult {
  uint64_t total;     // v1: the frame; v2: the segment's payload
  uint32_t fallback;
  uint32_t error;
  // v2: the descriptor's fields
  uint64_t n_unique, n_outliers, map_bytes, code_bytes;
  uint32_t bound, lossless, identity, packing;
};

struct ShapeArg {
  int64_t d[HL_MAX_NDIM];
};

__global__ void init_state_kernel(EncodeState* st) {
  uint64_t* w = reinterpret_cast<uint64_t*>(st);
  for (uint64_t i = threadIdx.x; i < sizeof(EncodeState) / 8; i += blockDim.x) w[i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    st->lo_key = order_key(INFINITY);
    st->hi_key = order_key(-INFINITY);
  }
}

template <int DT>
__global__ void finite_range_kernel(const typename Elem<DT>::raw_t* x, uint64_t n,
                                    EncodeState* st) {
  double lo = INFINITY, hi = -INFINITY;
  HL_GRID_STRIDE(i, n) {
    double v = Elem<DT>::to_double(x[i]);
    if (isfinite(v)) {
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  lo = block_reduce(lo, (double)INFINITY, [](double a, double b) { return b < a ? b : a; });
  __syncthreads();  // block_reduce's shared partials are reused
  hi = block_reduce(hi, (double)-INFINITY, [](double a, double b) { return b > a ? b : a; });
  if (threadIdx.x == 0 && lo <= hi) {
    atomicMin(&st->lo_key, order_key(lo));
    atomicMax(&st->hi_key, order_key(hi));
  }
}

// absolute_bound (codec_cpu.cc) on the device, and the lossless decision.
__global__ void prepare_kernel(EncodeState* st, double eb_param, bool rel, bool ranged,
                               bool force_lossless, bool v2) {
  double lo = 0, hi = 0;
  if (ranged) {
    lo = from_order_key(st->lo_key);
    hi = from_order_key(st->hi_key);
  }
  double eb = eb_param;
  if (rel) eb = hi > lo ? eb_param * (hi - lo) : 0.0;
  if (!isfinite(eb)) {
    st->error |= kEncodeBoundOverflow;
    eb = 0;
  }
  if (v2) {  // format 2 stores 24 bits of the bound and codes with exactly that (prepare())
    st->bound = hl_bound_code(eb);
    eb = hl_bound_of_code(st->bound);
  }
  st->v2 = v2;
  st->eb_abs = eb;
  st->step = 2.0 * eb;
  st->inv_step = 1.0 / st->step;
  st->lossless = force_lossless || eb == 0;
}

// Codes (zigzag, or kOutlierMark) and row outlier flags exactly as quantize_all; raw bits when
// lossless. row_outlier must be zeroed.
template <int DT>
__global__ void quantize_kernel(const typename Elem<DT>::raw_t* x, uint64_t n, uint64_t row_len,
                                const EncodeState* st, uint32_t* codes, uint8_t* row_outlier) {
  const bool lossless = st->lossless;
  const double step = st->step, inv_step = st->inv_step, eb = st->eb_abs;
  HL_GRID_STRIDE(i, n) {
    const typename Elem<DT>::raw_t raw = x[i];
    if (lossless) {
      codes[i] = raw;
      continue;
    }
    uint32_t z;
    bool ok = quantize<DT>(raw, inv_step, step, eb, &z);
    codes[i] = ok ? z : kOutlierMark;
    if (!ok) row_outlier[i / row_len] = 1;
  }
}

// A 32-bit hash of each row's content: its codes and, at outliers, the raw bits (two rows that
// differ only in outlier values would otherwise always collide). Summing per-element mixes
// makes it independent of how lanes split the row. Rows with equal hashes are compared in
// full, so collisions cost time, never correctness.
// A warp hashes kHashRows rows at once, so that several loads are in flight per lane.
constexpr int kHashRows = 4;

template <int DT>
__global__ void row_hash_kernel(const typename Elem<DT>::raw_t* x, const uint32_t* codes,
                                uint64_t n_rows, uint64_t d, const EncodeState* st,
                                uint32_t* keys, uint32_t* rows) {
  const bool lossy = !st->lossless;
  const uint64_t groups = hl_div_up(n_rows, kHashRows);
  HL_WARP_STRIDE(g, groups) {
    uint32_t h[kHashRows];
    for (int k = 0; k < kHashRows; ++k) h[k] = 0;
    for (uint64_t i = lane_id(); i < d; i += 32) {
      uint32_t c[kHashRows];
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        c[k] = r < n_rows ? codes[r * d + i] : 0u;
      }
#pragma unroll
      for (int k = 0; k < kHashRows; ++k) {
        const uint64_t r = g * kHashRows + k;
        if (r >= n_rows) continue;
        h[k] += mix32(c[k] ^ ((uint32_t)i * 0x9e3779b9u));
        if (lossy && c[k] == kOutlierMark)
          h[k] += mix32((uint32_t)x[r * d + i] ^ ((uint32_t)i * 0x7f4a7c15u + 1));
      }
    }
#pragma unroll
    for (int k = 0; k < kHashRows; ++k)
      for (int o = 16; o > 0; o >>= 1) h[k] += __shfl_xor_sync(kFull, h[k], o);
    if (lane_id() < kHashRows) {
      uint32_t mine = h[0];
#pragma unroll
      for (int k = 1; k < kHashRows; ++k)
        if (lane_id() == (unsigned)k) mine = h[k];
      const uint64_t r = g * kHashRows + lane_id();
      if (r < n_rows) {
        keys[r] = mix32(mine ^ (uint32_t)d);
        rows[r] = (uint32_t)r;
      }
    }
  }
}

// same_row (codec_cpu.cc), one warp: codes equal and, where a row holds outliers (lossy only),
// raw bits equal at the outlier positions.
template <int DT>
__device__ bool rows_equal(const typename Elem<DT>::raw_t* x, const uint32_t* codes, uint64_t d,
                           uint64_t a, uint64_t b, bool lossy) {
  for (uint64_t i0 = 0; i0 < d; i0 += 32) {
    const uint64_t i = i0 + lane_id();
    bool eq = true;
    if (i < d) {
      uint32_t ca = codes[a * d + i], cb = codes[b * d + i];
      eq = ca == cb && (!lossy || ca != kOutlierMark || x[a * d + i] == x[b * d + i]);
    }
    if (!__all_sync(kFull, eq)) return false;
  }
  return true;
}

// Each sorted position's run head: its own index where the hash changes, else 0; a prefix max
// then gives every position the start of its run of equal hashes.
__global__ void run_heads_kernel(const uint32_t* keys_sorted, uint64_t n_rows, uint32_t* head) {
  HL_GRID_STRIDE(p, n_rows) head[p] = (p == 0 || keys_sorted[p] != keys_sorted[p - 1]) ? (uint32_t)p : 0u;
}

// For each row, the smallest row with identical content. Rows sorted by (hash, row) by a stable
// radix sort: identical rows share a hash run and the run lists rows in ascending order, so the
// first identical row met from the run's start is the first occurrence.
template <int DT>
__global__ void first_occurrence_kernel(const typename Elem<DT>::raw_t* x, const uint32_t* codes,
                                        uint64_t n_rows, uint64_t d, const EncodeState* st,
                                        const uint32_t* run_start, const uint32_t* rows_sorted,
                                        uint32_t* first_of) {
  const bool lossy = !st->lossless;
  HL_WARP_STRIDE(p, n_rows) {
    const uint32_t r = rows_sorted[p];
    const uint64_t lo = run_start[p];
    uint32_t first = r;
    for (uint64_t q = lo; q < p; ++q) {
      uint32_t c = rows_sorted[q];
      if (rows_equal<DT>(x, codes, d, c, r, lossy)) {
        first = c;
        break;
      }
    }
    if (lane_id() == 0) first_of[r] = first;
  }
}

__global__ void unique_flags_kernel(const uint32_t* first_of, uint64_t n_rows, uint32_t* flag) {
  HL_GRID_STRIDE(r, n_rows) flag[r] = first_of[r] == r;
}

// uid = exclusive scan of the flags numbers unique rows in order of first occurrence.
__global__ void row_map_kernel(const uint32_t* first_of, const uint32_t* flag, const uint32_t* uid,
                               uint64_t n_rows, uint32_t* map, uint32_t* first, EncodeState* st) {
  HL_GRID_STRIDE(r, n_rows) {
    map[r] = uid[first_of[r]];
    if (flag[r]) first[uid[r]] = (uint32_t)r;
    if (r == n_rows - 1) st->n_unique_found = (uint64_t)uid[r] + flag[r];
  }
}

// Applies dedup_pays and fixes the row layout: which codes are stored, and the map's size.
__global__ void rows_layout_kernel(EncodeState* st, uint64_t n_rows, uint64_t d, bool deduped,
                                   int ndim, uint32_t* codes, uint32_t* gathered) {
  uint64_t nu = n_rows;
  if (deduped) {
    nu = st->n_unique_found;
    if (!dedup_pays(n_rows, nu, d)) nu = n_rows;
  }
  const bool identity = nu == n_rows;
  st->n_unique = nu;
  st->identity = identity;
  st->n_codes = nu * d;
  st->map_count = identity ? 0 : n_rows;
  st->ucodes = identity ? codes : gathered;
  st->map_off = st->v2 ? 0 : HL_HEADER_BYTES + 8ull * ndim;
}

__global__ void gather_unique_kernel(const EncodeState* st, const uint32_t* codes,
                                     const uint32_t* first, uint64_t d, uint32_t* gathered) {
  if (st->identity) return;
  const uint64_t nu = st->n_unique;
  HL_WARP_STRIDE(u, nu) {
    const uint32_t* src = codes + (uint64_t)first[u] * d;
    uint32_t* dst = gathered + u * d;
    for (uint64_t i = lane_id(); i < d; i += 32) dst[i] = src[i];
  }
}

// Outliers per unique row (0 past n_unique, so a scan over all rows gives record offsets), and
// their codes zeroed as the format stores them.
__global__ void count_outliers_kernel(const EncodeState* st, const uint8_t* row_outlier,
                                      const uint32_t* first, uint64_t n_rows, uint64_t d,
                                      uint64_t* count) {
  const bool lossless = st->lossless, identity = st->identity;
  const uint64_t nu = st->n_unique;
  uint32_t* uc = st->ucodes;
  HL_WARP_STRIDE(u, n_rows) {
    uint64_t c = 0;
    if (!lossless && u < nu && row_outlier[identity ? u : first[u]]) {
      uint32_t* row = uc + u * d;
      for (uint64_t i0 = 0; i0 < d; i0 += 32) {
        const uint64_t i = i0 + lane_id();
        const bool mark = i < d && row[i] == kOutlierMark;
        const uint32_t b = __ballot_sync(kFull, mark);
        if (mark) row[i] = 0;
        c += __popc(b);
      }
    }
    if (lane_id() == 0) count[u] = c;
  }
}

// ---- block packing (frame.h "Packed integer arrays") ------------------------------------------

// The values of a radix section are block packed after its head (frame.h).
enum SectionKind { kMapSection = 0, kCodeSection = 1, kRadixSection = 2 };

struct SectionView {
  const uint32_t* vals;
  uint64_t count;
  uint64_t off;
  uint64_t* bytes;
};

// aux: the row map (kMapSection) or the radix values (kRadixSection).
template <int SEC>
__device__ SectionView section_view(EncodeState* st, const uint32_t* aux) {
  if (SEC == kMapSection) return {aux, st->map_count, st->map_off, &st->map_bytes};
  if (SEC == kRadixSection)
    return {aux, st->radix_G, st->code_off + st->radix_head, &st->radix_vals_bytes};
  return {st->ucodes, st->n_codes, st->code_off, &st->code1_bytes};
}

// Whether the section's blocks go into the frame: a v2 code section only when block packing
// is its packing, radix values only when radix is.
template <int SEC>
__device__ bool section_written(const EncodeState* st) {
  if (SEC == kRadixSection) return st->packing == HL_PACK_RADIX;
  if (SEC == kCodeSection) return !st->v2 || st->packing == HL_PACK_BLOCK;
  return true;
}

// Width of every block (0 past the section's blocks, so a scan over max_blocks stays exact).
template <int SEC>
__global__ void block_widths_kernel(EncodeState* st, const uint32_t* map, uint64_t max_blocks,
                                    uint64_t* width) {
  const SectionView s = section_view<SEC>(st, map);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  HL_WARP_STRIDE(b, max_blocks) {
    uint32_t w = 0;
    if (b < nb) {
      const uint64_t i = b * HL_BLOCK + lane_id();
      const uint32_t v = i < s.count ? s.vals[i] : 0u;
      w = bit_width(__reduce_or_sync(kFull, v));
      if (SEC == kCodeSection) {  // radix K and the short-block test need the largest code
        const uint32_t m = __reduce_max_sync(kFull, v);
        if (lane_id() == 0 && m) atomicMax(&st->max_code, m);
      }
    }
    if (lane_id() == 0) width[b] = w;
  }
}

// One warp a block: word j is the ballot of bit j, value i in lane i; lane j stores word j.
template <int SEC>
__global__ void pack_blocks_kernel(EncodeState* st, const uint32_t* map, uint8_t* frame,
                                   const uint64_t* width, const uint64_t* word_off) {
  if (!section_written<SEC>(st)) return;
  const SectionView s = section_view<SEC>(st, map);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  uint8_t* sec = frame + s.off;
  HL_WARP_STRIDE(b, nb) {
    const uint32_t w = (uint32_t)width[b];
    const uint64_t i = b * HL_BLOCK + lane_id();
    const uint32_t v = i < s.count ? s.vals[i] : 0u;
    uint32_t mine = 0;
    for (uint32_t j = 0; j < w; ++j) {
      uint32_t word = __ballot_sync(kFull, (v >> j) & 1u);
      if (lane_id() == j) mine = word;
    }
    if (lane_id() == 0) sec[b] = (uint8_t)w;
    if (lane_id() < w) put_le(sec + nb + 4 * (word_off[b] + lane_id()), mine, 4);
  }
}

// The section's size from its scanned widths (before any of it is written: a v2 code section
// is sized three ways first).
template <int SEC>
__global__ void section_bytes_kernel(EncodeState* st, const uint32_t* aux, const uint64_t* width,
                                     const uint64_t* word_off) {
  const SectionView s = section_view<SEC>(st, aux);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  *s.bytes = nb ? block_section_bytes(nb, word_off[nb - 1] + width[nb - 1]) : 0;
}

// ---- format-2 level-1 code sections: radix and short blocks (level1_sections.h) ------------

// K, g and G of the segment's radix section, G = 0 when radix packing does not apply.
__global__ void radix_plan_kernel(EncodeState* st) {
  const uint64_t n = st->n_codes;
  st->radix_G = 0;
  if (st->lossless || !radix_applies(n, st->max_code)) return;
  const uint32_t k = st->max_code + 1, g = radix_group(k, n);
  st->radix_k = k;
  st->radix_g = g;
  st->radix_G = hl_div_up(n, g);
  st->radix_head = radix_head_bytes(k, g);
}

// The radix values, one thread a value: digit i of value j is code radix_code_of(G, g, j, i),
// so a warp's reads of one digit are consecutive codes.
__global__ void radix_values_kernel(const EncodeState* st, uint32_t* values) {
  const uint64_t G = st->radix_G, n = st->n_codes;
  const uint32_t g = st->radix_g, k = st->radix_k;
  const uint32_t* v = st->ucodes;
  HL_GRID_STRIDE(j, G) values[j] = radix_value(v, n, G, g, k, j);
}

// Short-block widths, two blocks of 16 a warp (a half-warp's OR by shuffles within the half);
// 0 past the section's blocks and everywhere when short blocks do not apply.
__global__ void short_widths_kernel(const EncodeState* st, uint64_t max_blocks, uint64_t* width) {
  const uint64_t n = st->n_codes, nb = short_n_blocks(n);
  const bool on = !st->lossless && short_applies(n, st->max_code);
  HL_WARP_STRIDE(w, hl_div_up(max_blocks, 2)) {
    const uint64_t b = 2 * w + (lane_id() >> 4);
    const uint64_t i = b * HL_SHORT_BLOCK + (lane_id() & 15);
    uint32_t v = on && b < nb && i < n ? st->ucodes[i] : 0u;
    for (int o = 8; o > 0; o >>= 1) v |= __shfl_xor_sync(kFull, v, o);
    if ((lane_id() & 15) == 0 && b < max_blocks) width[b] = bit_width(v);
  }
}

// level1_packing over the three sizes; the code section's size becomes the chosen one's.
__global__ void choose_packing_kernel(EncodeState* st, const uint64_t* short_width,
                                      const uint64_t* short_off) {
  const uint64_t n = st->n_codes;
  uint64_t radix = 0, shorts = 0;
  if (!st->lossless && st->radix_G)
    radix = st->radix_head + st->radix_vals_bytes;
  if (!st->lossless && short_applies(n, st->max_code)) {
    const uint64_t nb = short_n_blocks(n);
    shorts = short_section_bytes(n, short_off[nb - 1] + short_width[nb - 1]);
  }
  st->packing = (uint32_t)level1_packing(st->code1_bytes, radix, shorts);
  if (st->packing == HL_PACK_RADIX) st->code1_bytes = radix;
  if (st->packing == HL_PACK_SHORT) st->code1_bytes = shorts;
}

__global__ void radix_head_kernel(const EncodeState* st, uint8_t* frame) {
  if (st->packing == HL_PACK_RADIX) radix_put_head(frame + st->code_off, st->radix_k, st->radix_g);
}

// The short-block section: mark, width nibbles (a thread a byte) and planes (two blocks a warp:
// word j of a block is the half-warp's share of the ballot of bit j).
__global__ void short_write_kernel(const EncodeState* st, uint8_t* frame, const uint64_t* width,
                                   const uint64_t* word_off) {
  if (st->packing != HL_PACK_SHORT) return;
  const uint64_t n = st->n_codes, nb = short_n_blocks(n), head = short_head_bytes(n);
  uint8_t* sec = frame + st->code_off;
  if (blockIdx.x == 0 && threadIdx.x == 0) sec[0] = HL_SHORT_MARK;
  const uint64_t pairs = hl_div_up(nb, 2);
  HL_GRID_STRIDE(p, pairs)
    sec[1 + p] = short_nibble_byte((uint32_t)width[2 * p],
                                   2 * p + 1 < nb ? (uint32_t)width[2 * p + 1] : 0u);
  HL_WARP_STRIDE(w, pairs) {
    const unsigned half = lane_id() >> 4, li = lane_id() & 15;
    const uint64_t b = 2 * w + half, i = b * HL_SHORT_BLOCK + li;
    const uint32_t v = b < nb && i < n ? st->ucodes[i] : 0u;
    const uint32_t wb = b < nb ? (uint32_t)width[b] : 0u;
    uint32_t mine = 0;
    for (uint32_t j = 0; j < HL_SHORT_MAX_WIDTH; ++j) {
      const uint32_t word = __ballot_sync(kFull, (v >> j) & 1u);
      if (li == j) mine = (word >> (16 * half)) & 0xffffu;
    }
    if (li < wb) put_le(sec + head + 2 * (word_off[b] + li), mine, 2);
  }
}

__global__ void code_layout_kernel(EncodeState* st) { st->code_off = st->map_off + st->map_bytes; }

// ---- level 2 (rANS, layout in codec_common.h) ------------------------------------------------

// One block a stream: symbol counts into the global histogram, escapes per stream.
__global__ void rans_histogram_kernel(EncodeState* st, uint64_t max_streams, uint64_t* esc_count) {
  __shared__ uint32_t h[256];
  const uint64_t n = st->n_codes;
  const uint64_t ns = hl_div_up(n, HL_RANS_CHUNK);
  const uint32_t* z = st->ucodes;
  HL_BLOCK_STRIDE(k, max_streams) {
    for (unsigned t = threadIdx.x; t < 256; t += blockDim.x) h[t] = 0;
    __syncthreads();
    if (k < ns) {
      const uint64_t lo = k * HL_RANS_CHUNK, hi = lo + HL_RANS_CHUNK < n ? lo + HL_RANS_CHUNK : n;
      for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) atomicAdd(&h[rans_symbol(z[i])], 1u);
    }
    __syncthreads();
    for (unsigned t = threadIdx.x; t < 256; t += blockDim.x)
      if (h[t]) atomicAdd(&st->counts[t], (unsigned long long)h[t]);
    if (threadIdx.x == 0) esc_count[k] = h[HL_RANS_ESC];
    __syncthreads();
  }
}

__global__ void rans_table_kernel(EncodeState* st) {
  if (st->n_codes == 0) return;
  normalize_freqs(reinterpret_cast<const uint64_t*>(st->counts), st->freq);
  uint32_t c = 0, present = 0;
  for (int s = 0; s < 256; ++s) {
    st->cum[s] = c;
    c += st->freq[s];
    present += st->freq[s] != 0;
  }
  st->cum[256] = c;
  st->n_present = present;
  st->n_esc = st->counts[HL_RANS_ESC];
  st->n_streams = hl_div_up(st->n_codes, HL_RANS_CHUNK);
}


// x / f for x < 2^31 and 1 <= f <= 2^12 as a multiply: with m = floor(2^43 / f) + 1,
// x * m / 2^43 exceeds x / f by less than 2^31 / 2^43 = 2^-12 <= 1 / f, which cannot carry the
// fraction of x / f (at most 1 - 1/f) past the next integer, so the floor is exact.
__host__ __device__ __forceinline__ uint64_t div_magic(uint32_t f) { return (1ull << 43) / f + 1; }
__device__ __forceinline__ uint32_t div_by(uint32_t x, uint64_t magic) {
  return (uint32_t)__umul64hi((uint64_t)x << 21, magic);
}

// Copies the symbols of `count` codes (kEncodeStreams streams' worth at most) into shared
// memory, stream by stream at kSymStride. Codes arrive 4 at a time in 16-byte loads, several in
// flight per thread; z is 16-byte aligned (workspace pieces are 256-byte aligned and groups
// start at multiples of HL_RANS_CHUNK codes).
__device__ void stage_symbols(const uint32_t* z, uint64_t count, uint8_t* sym) {
  constexpr int kUnroll = 4;
  const uint64_t quads = count / 4;
  const uint4* z4 = reinterpret_cast<const uint4*>(z);
  for (uint64_t q0 = threadIdx.x; q0 < quads; q0 += kUnroll * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t q = q0 + (uint64_t)u * blockDim.x;
      v[u] = q < quads ? z4[q] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t q = q0 + (uint64_t)u * blockDim.x;
      if (q >= quads) break;
      const uint64_t j = 4 * q;  // 4 codes of one stream: HL_RANS_CHUNK is a multiple of 4
      const uint32_t packed = rans_symbol(v[u].x) | rans_symbol(v[u].y) << 8 |
                              rans_symbol(v[u].z) << 16 | rans_symbol(v[u].w) << 24;
      *reinterpret_cast<uint32_t*>(sym + (j / HL_RANS_CHUNK) * kSymStride + j % HL_RANS_CHUNK) = packed;
    }
  }
  for (uint64_t j = 4 * quads + threadIdx.x; j < count; j += blockDim.x)
    sym[(j / HL_RANS_CHUNK) * kSymStride + j % HL_RANS_CHUNK] = (uint8_t)rans_symbol(z[j]);
}

// encode_stream (rans_cpu.cc) for kEncodeStreams streams a block. The block first copies the
// streams' symbols into shared memory (coalesced); then one thread a stream encodes backwards
// from there, so its serial loop waits on neither global memory nor a hardware division.
// Bytes go downwards from the end of the stream's slot: [start, slot end) is the state followed
// by the bytes in the order the decoder reads them.
__global__ void rans_encode_kernel(const EncodeState* st, uint64_t max_streams, uint8_t* slots,
                                   uint64_t* stream_len) {
  extern __shared__ uint8_t sym[];  // kEncodeStreams x kSymStride
  __shared__ uint32_t freq[256], cum[256];
  __shared__ uint64_t magic[256];
  for (unsigned t = threadIdx.x; t < 256; t += blockDim.x) {
    freq[t] = st->freq[t];
    cum[t] = st->cum[t];
    magic[t] = freq[t] ? div_magic(freq[t]) : 0;
  }
  const uint64_t n = st->n_codes;
  const uint64_t ns = hl_div_up(n, HL_RANS_CHUNK);
  const uint32_t* z = st->ucodes;
  for (uint64_t base = (uint64_t)blockIdx.x * kEncodeStreams; base < max_streams;
       base += (uint64_t)gridDim.x * kEncodeStreams) {
    __syncthreads();  // the tables are in place, and the previous group is encoded
    const uint64_t lo = base * HL_RANS_CHUNK;
    const uint64_t hi = lo + kEncodeStreams * HL_RANS_CHUNK < n ? lo + kEncodeStreams * HL_RANS_CHUNK : n;
    stage_symbols(z + lo, hi > lo ? hi - lo : 0, sym);
    __syncthreads();
    const uint64_t k = base + threadIdx.x;
    if (threadIdx.x >= kEncodeStreams || k >= max_streams) continue;
    if (k >= ns) {
      stream_len[k] = 0;
      continue;
    }
    const uint8_t* my = sym + threadIdx.x * kSymStride;
    const uint64_t count = (k + 1) * HL_RANS_CHUNK < n ? HL_RANS_CHUNK : n - k * HL_RANS_CHUNK;
    uint8_t* end = slots + (k + 1) * kRansSlotBytes;
    uint8_t* p = end;
    uint32_t x = HL_RANS_L;
    // The next symbol's table entries do not depend on x: fetch them a step ahead, so that only
    // the state arithmetic is on the serial path.
    uint32_t s = count ? my[count - 1] : 0;
    uint32_t f = freq[s], c = cum[s];
    uint64_t m = magic[s];
    for (uint64_t i = count; i-- > 0;) {
      const uint32_t f_now = f, c_now = c;
      const uint64_t m_now = m;
      if (i > 0) {
        s = my[i - 1];
        f = freq[s];
        c = cum[s];
        m = magic[s];
      }
      const uint32_t x_max = ((HL_RANS_L >> HL_RANS_BITS) << 8) * f_now;
      while (x >= x_max) {
        *--p = (uint8_t)(x & 0xff);
        x >>= 8;
      }
      const uint32_t q = div_by(x, m_now);
      x = (q << HL_RANS_BITS) + (x - q * f_now) + c_now;
    }
    p -= 4;
    put_le(p, x, 4);
    stream_len[k] = (uint64_t)(end - p);
  }
}

// Sizes both code sections, picks the level, places the outliers and decides the fallback.
__global__ void decide_kernel(EncodeState* st, uint64_t n_rows, uint64_t row_len, int ndim,
                              uint8_t dtype, uint64_t max_streams, const uint64_t* out_count,
                              const uint64_t* out_off, const uint64_t* stream_len,
                              const uint64_t* stream_off) {
  const uint64_t n_out = n_rows ? out_off[n_rows - 1] + out_count[n_rows - 1] : 0;
  st->n_outliers = n_out;
  bool entropy = false;
  if (max_streams > 0 && st->n_codes > 0) {
    const uint64_t data = stream_off[max_streams - 1] + stream_len[max_streams - 1];
    const uint64_t code2 =
        2 + 3ull * st->n_present + 4 + 4 * st->n_esc + 4 * st->n_streams + data;
    entropy = code2 < st->code1_bytes;
    if (entropy) st->code_bytes = code2;
  }
  st->level = entropy ? 2 : 1;
  if (!entropy) st->code_bytes = st->code1_bytes;
  st->outlier_off = st->code_off + st->code_bytes;
  const uint64_t rec = st->v2 ? v2_outlier_record_bytes(st->n_codes, dtype) : HL_OUTLIER_BYTES;
  st->total = st->outlier_off + rec * n_out;
  st->fallback = !st->lossless && lossy_exceeds_bound(n_rows, row_len, ndim, st->map_bytes,
                                                      st->code_bytes, n_out);
}

// Writes the level-2 section over the level-1 one (it is smaller), one block a stream: the
// stream's bytes and length, and its escapes in order (block scan of the escape flags).
__global__ void rans_write_kernel(const EncodeState* st, uint8_t* frame, const uint8_t* slots,
                                  const uint64_t* stream_len, const uint64_t* stream_off,
                                  const uint64_t* esc_off) {
  typedef cub::BlockScan<uint32_t, kThreads> Scan;
  __shared__ typename Scan::TempStorage scan_tmp;
  if (st->level != 2) return;
  const uint64_t n = st->n_codes, ns = st->n_streams, n_esc = st->n_esc;
  const uint32_t np = st->n_present;
  uint8_t* sec = frame + st->code_off;
  uint8_t* esc = sec + 2 + 3ull * np + 4;
  uint8_t* lens = esc + 4 * n_esc;
  uint8_t* data = lens + 4 * ns;
  const uint32_t* z = st->ucodes;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    put_le(sec, np, 2);
    uint8_t* t = sec + 2;
    for (int s = 0; s < 256; ++s) {
      if (!st->freq[s]) continue;
      t[0] = (uint8_t)s;
      put_le(t + 1, st->freq[s], 2);
      t += 3;
    }
    put_le(t, n_esc, 4);
  }
  HL_BLOCK_STRIDE(k, ns) {
    const uint64_t len = stream_len[k];
    const uint8_t* src = slots + (k + 1) * kRansSlotBytes - len;
    uint8_t* dst = data + stream_off[k];
    for (uint64_t t = threadIdx.x; t < len; t += blockDim.x) dst[t] = src[t];
    if (threadIdx.x == 0) put_le(lens + 4 * k, len, 4);
    const uint64_t lo = k * HL_RANS_CHUNK, hi = lo + HL_RANS_CHUNK < n ? lo + HL_RANS_CHUNK : n;
    uint64_t base = esc_off[k];
    for (uint64_t t0 = lo; t0 < hi; t0 += blockDim.x) {
      const uint64_t i = t0 + threadIdx.x;
      const uint32_t v = i < hi ? z[i] : 0u;
      const uint32_t flag = v >= HL_RANS_ESC;
      uint32_t before, total;
      Scan(scan_tmp).ExclusiveSum(flag, before, total);
      if (flag) put_le(esc + 4 * (base + before), v, 4);
      base += total;
      __syncthreads();
    }
  }
}

// Outlier records in position order, one warp a unique row. The outlier test is repeated on
// the raw value (the codes were zeroed); it is the same pure function as in quantize_kernel.
template <int DT>
__global__ void write_outliers_kernel(const EncodeState* st, const typename Elem<DT>::raw_t* x,
                                      const uint32_t* first, uint64_t n_rows, uint64_t d,
                                      const uint64_t* out_count, const uint64_t* out_off,
                                      uint8_t* frame) {
  if (st->lossless || st->fallback) return;
  const bool identity = st->identity;
  const uint64_t nu = st->n_unique;
  const double step = st->step, inv_step = st->inv_step, eb = st->eb_abs;
  uint8_t* rec = frame + st->outlier_off;
  const uint8_t pos_bytes = v2_pos_bytes(nu * d);  // v2 records: compact position, raw bits
  const uint64_t rec_bytes = st->v2 ? pos_bytes + sizeof(typename Elem<DT>::raw_t)
                                    : (uint64_t)HL_OUTLIER_BYTES;
  HL_WARP_STRIDE(u, n_rows) {
    if (u >= nu) break;
    if (out_count[u] == 0) continue;
    const uint64_t r = identity ? u : first[u];
    uint64_t k = out_off[u];
    for (uint64_t i0 = 0; i0 < d; i0 += 32) {
      const uint64_t i = i0 + lane_id();
      bool out = false;
      uint32_t raw = 0;
      if (i < d) {
        raw = x[r * d + i];
        uint32_t z;
        out = !quantize<DT>((typename Elem<DT>::raw_t)raw, inv_step, step, eb, &z);
      }
      const uint32_t b = __ballot_sync(kFull, out);
      if (out) {
        uint8_t* p = rec + rec_bytes * (k + __popc(b & ((1u << lane_id()) - 1)));
        if (st->v2) {
          v2_put_outlier(p, u * d + i, raw, pos_bytes, sizeof(typename Elem<DT>::raw_t));
        } else {
          put_le(p, u * d + i, 8);
          put_le(p + 8, raw, 4);
        }
      }
      k += __popc(b);
    }
  }
}

__global__ void header_kernel(const EncodeState* st, uint8_t* frame, ShapeArg shape, int ndim,
                              uint8_t dtype, uint8_t mode, double eb_param, uint64_t n_rows,
                              uint64_t row_len) {
  if (st->fallback || st->v2) return;
  HlFrameHeader h;
  memset(&h, 0, sizeof(h));
  h.magic = HL_MAGIC;
  h.version = HL_VERSION;
  h.dtype = dtype;
  h.level = (uint8_t)st->level;
  h.flags = (uint8_t)((mode == HL_MODE_REL ? HL_FLAG_REL : 0) |
                      (st->lossless ? HL_FLAG_LOSSLESS : 0) |
                      (st->n_unique == n_rows ? HL_FLAG_IDENTITY_MAP : 0));
  h.ndim = (uint8_t)ndim;
  h.eb_param = eb_param;
  h.eb_abs = st->eb_abs;
  h.n_rows = n_rows;
  h.row_len = row_len;
  h.n_unique = st->n_unique;
  h.n_outliers = st->n_outliers;
  h.map_bytes = st->map_bytes;
  h.code_bytes = st->code_bytes;
  h.outlier_bytes = (uint64_t)HL_OUTLIER_BYTES * st->n_outliers;
  h.total_bytes = st->total;
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&h);
  for (int i = 0; i < HL_HEADER_BYTES; ++i) frame[i] = b[i];
  for (int i = 0; i < ndim; ++i) put_le(frame + HL_HEADER_BYTES + 8 * i, (uint64_t)shape.d[i], 8);
}

// The header was written with a zero checksum field, so the frame's words are summed as is.
template <bool kAligned>
__global__ void encode_checksum_kernel(EncodeState* st, const uint8_t* frame) {
  if (st->fallback || st->v2) return;
  uint64_t sum = checksum_share<kAligned>(frame, st->total, false);
  sum = block_reduce(sum, (uint64_t)0, SumOp());
  if (threadIdx.x == 0) atomicAdd(&st->checksum_sum, (unsigned long long)sum);
}

__global__ void finish_kernel(const EncodeState* st, uint8_t* frame, ChunkResult* result) {
  if (!st->fallback && !st->v2)
    put_le(frame + offsetof(HlFrameHeader, checksum), checksum_fold(st->checksum_sum, st->total),
           4);
  result->total = st->fallback ? 0 : st->total;
  result->fallback = st->fallback;
  result->error = st->error;
  result->n_unique = st->n_unique;
  result->n_outliers = st->n_outliers;
  result->map_bytes = st->map_bytes;
  result->code_bytes = st->code_bytes;
  result->bound = st->bound;
  result->lossless = st->lossless;
  result->identity = st->identity;
  result->packing = st->packing;
}

// ---- encoder host side -----------------------------------------------------------------------

// One chunk to encode: a tensor of n_rows x row_len elements with the given shape.
struct EncodeJob {
  const void* x_dev;
  uint8_t dtype, mode, level;
  bool dedup;
  double eb;
  uint64_t n_rows, row_len;
  int ndim;
  ShapeArg shape;
  uint8_t* frame_dev;  // room for max_frame bytes
  uint64_t max_frame;
  bool v2 = false;     // a format-2 segment at level 1 (EncodeState::v2)

  uint64_t n() const { return n_rows * row_len; }
  // Map entries are uint32; the CPU codec has the same limit in practice (4 billion rows).
  bool dedups() const { return dedup_applies(dedup, n_rows, row_len); }
  uint64_t max_streams() const { return level == 2 && !v2 ? hl_div_up(n(), HL_RANS_CHUNK) : 0; }
  // v2 level-1 sections: radix values (g >= 2: at most half the codes) and short blocks
  uint64_t max_values() const { return v2 ? hl_div_up(n(), 2) : 0; }
  uint64_t max_short_blocks() const { return v2 ? short_n_blocks(n()) : 0; }
};

// Scratch sized for the largest job; jobs run one after another on the stream and share it.
struct EncodeScratch {
  uint32_t *codes, *gathered;
  uint8_t* row_outlier;
  uint32_t *keys, *keys_sorted, *rows, *rows_sorted, *run_head, *run_start;
  uint32_t *first_of, *flag, *uid, *map, *first;
  uint64_t *out_count, *out_off;
  uint64_t *width, *word_off;
  uint32_t* values;                   // v2: radix values
  uint64_t *rwidth, *rword_off;       // ... their block widths
  uint64_t *swidth, *sword_off;       // v2: short-block widths
  uint8_t* slots;
  uint64_t *stream_len, *stream_off, *esc_count, *esc_off;
  CubScratch cub;
};

void plan_encode_scratch(const std::vector<EncodeJob>& jobs, Workspace* ws, EncodeScratch* s) {
  uint64_t rows = 0, elems = 0, dedup_rows = 0, dedup_elems = 0, blocks = 0, streams = 0;
  uint64_t values = 0, short_blocks = 0;
  size_t cub_bytes = 0;
  for (const EncodeJob& j : jobs) {
    const uint64_t n = j.n(), nb = hl_div_up(n > j.n_rows ? n : j.n_rows, HL_BLOCK);
    rows = std::max(rows, j.n_rows);
    elems = std::max(elems, n);
    blocks = std::max(blocks, nb);
    streams = std::max(streams, j.max_streams());
    values = std::max(values, j.max_values());
    short_blocks = std::max(short_blocks, j.max_short_blocks());
    if (j.v2)
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, j.max_short_blocks(), 0);
      });
    if (j.dedups()) {
      dedup_rows = std::max(dedup_rows, j.n_rows);
      dedup_elems = std::max(dedup_elems, n);
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_sort_pairs(t, b, nullptr, nullptr, nullptr, nullptr, j.n_rows, 0);
      });
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_exclusive_sum<uint32_t>(t, b, nullptr, nullptr, j.n_rows, 0);
      });
      cub_need(&cub_bytes, [&](void* t, size_t& b) {
        return cub_prefix_max(t, b, nullptr, nullptr, j.n_rows, 0);
      });
    }
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, std::max(j.n_rows, nb), 0);
    });
    cub_need(&cub_bytes, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, nullptr, nullptr, j.max_streams(), 0);
    });
  }
  ws->reserve(&s->codes, elems);
  ws->reserve(&s->gathered, dedup_elems);
  ws->reserve(&s->row_outlier, rows);
  ws->reserve(&s->keys, dedup_rows);
  ws->reserve(&s->keys_sorted, dedup_rows);
  ws->reserve(&s->rows, dedup_rows);
  ws->reserve(&s->rows_sorted, dedup_rows);
  ws->reserve(&s->run_head, dedup_rows);
  ws->reserve(&s->run_start, dedup_rows);
  ws->reserve(&s->first_of, dedup_rows);
  ws->reserve(&s->flag, dedup_rows);
  ws->reserve(&s->uid, dedup_rows);
  ws->reserve(&s->map, dedup_rows);
  ws->reserve(&s->first, dedup_rows);
  ws->reserve(&s->out_count, rows);
  ws->reserve(&s->out_off, rows);
  ws->reserve(&s->width, blocks);
  ws->reserve(&s->word_off, blocks);
  ws->reserve(&s->values, values);
  ws->reserve(&s->rwidth, hl_div_up(values, HL_BLOCK));
  ws->reserve(&s->rword_off, hl_div_up(values, HL_BLOCK));
  ws->reserve(&s->swidth, short_blocks);
  ws->reserve(&s->sword_off, short_blocks);
  ws->reserve(&s->slots, streams * kRansSlotBytes);
  ws->reserve(&s->stream_len, streams);
  ws->reserve(&s->stream_off, streams);
  ws->reserve(&s->esc_count, streams);
  ws->reserve(&s->esc_off, streams);
  ws->reserve_bytes(&s->cub.tmp, cub_bytes);
  s->cub.bytes = cub_bytes;
}

// Block packing of a section in two steps: widths, their scan and the section's size; then,
// once the v2 code section's packing is chosen, the blocks. width/word_off: max_count / 32.
template <int SEC>
void size_section(EncodeState* st, const uint32_t* aux, uint64_t max_count, uint64_t* width,
                  uint64_t* word_off, const EncodeScratch& s, cudaStream_t stream) {
  const uint64_t max_blocks = hl_div_up(max_count, HL_BLOCK);
  if (max_blocks == 0) return;
  const uint64_t grid = grid_for(max_blocks, kWarpsPerBlock);
  launch("block_widths", block_widths_kernel<SEC>, grid, kThreads, stream, st, aux, max_blocks,
         width);
  cub_run("scan of block widths", s.cub, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, width, word_off, max_blocks, stream);
  });
  launch("section_bytes", section_bytes_kernel<SEC>, 1, 1, stream, st, aux, width, word_off);
}

template <int SEC>
void write_section(EncodeState* st, const uint32_t* aux, uint64_t max_count, uint8_t* frame,
                   const uint64_t* width, const uint64_t* word_off, cudaStream_t stream) {
  const uint64_t max_blocks = hl_div_up(max_count, HL_BLOCK);
  launch("pack_blocks", pack_blocks_kernel<SEC>, grid_for(max_blocks, kWarpsPerBlock), kThreads,
         stream, st, aux, frame, width, word_off);
}

template <int SEC>
void pack_section(EncodeState* st, const uint32_t* aux, uint64_t max_count, uint8_t* frame,
                  const EncodeScratch& s, cudaStream_t stream) {
  size_section<SEC>(st, aux, max_count, s.width, s.word_off, s, stream);
  write_section<SEC>(st, aux, max_count, frame, s.width, s.word_off, stream);
}

// A v2 segment's code section: block packing, radix and short blocks sized on the device,
// level1_packing picks (choose_packing_kernel), and only the chosen one is written.
void code_section_v2(const EncodeJob& j, EncodeState* st, const EncodeScratch& s,
                     cudaStream_t stream) {
  const uint64_t n = j.n();
  size_section<kCodeSection>(st, nullptr, n, s.width, s.word_off, s, stream);
  if (n == 0) return;
  const uint64_t mv = j.max_values(), msb = j.max_short_blocks();
  launch("radix_plan", radix_plan_kernel, 1, 1, stream, st);
  launch("radix_values", radix_values_kernel, grid_for(mv, kThreads), kThreads, stream, st,
         s.values);
  size_section<kRadixSection>(st, s.values, mv, s.rwidth, s.rword_off, s, stream);
  launch("short_widths", short_widths_kernel, grid_for(hl_div_up(msb, 2), kWarpsPerBlock),
         kThreads, stream, st, msb, s.swidth);
  cub_run("scan of short-block widths", s.cub, [&](void* t, size_t& b) {
    return cub_exclusive_sum<uint64_t>(t, b, s.swidth, s.sword_off, msb, stream);
  });
  launch("choose_packing", choose_packing_kernel, 1, 1, stream, st, s.swidth, s.sword_off);
  write_section<kCodeSection>(st, nullptr, n, j.frame_dev, s.width, s.word_off, stream);
  launch("radix_head", radix_head_kernel, 1, 1, stream, st, j.frame_dev);
  write_section<kRadixSection>(st, s.values, mv, j.frame_dev, s.rwidth, s.rword_off, stream);
  launch("short_write", short_write_kernel, grid_for(hl_div_up(msb, 2), kWarpsPerBlock),
         kThreads, stream, st, j.frame_dev, s.swidth, s.sword_off);
}

template <int DT>
void enqueue_encode(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                    ChunkResult* result, bool force_lossless, cudaStream_t stream) {
  typedef typename Elem<DT>::raw_t raw_t;
  const raw_t* x = static_cast<const raw_t*>(j.x_dev);
  const uint64_t R = j.n_rows, d = j.row_len, n = j.n();
  const uint64_t elem_grid = grid_for(n, kThreads), row_grid = grid_for(R, kWarpsPerBlock);

  launch("init_state", init_state_kernel, 1, kThreads, stream, st);
  const bool ranged = j.mode == HL_MODE_REL && j.eb > 0;
  if (ranged) launch("finite_range", finite_range_kernel<DT>, elem_grid, kThreads, stream, x, n, st);
  launch("prepare", prepare_kernel, 1, 1, stream, st, j.eb, j.mode == HL_MODE_REL, ranged,
         force_lossless, j.v2);
  if (R) HL_CUDA_CHECK(cudaMemsetAsync(s.row_outlier, 0, R, stream));
  launch("quantize", quantize_kernel<DT>, elem_grid, kThreads, stream, x, n, d, st, s.codes,
         s.row_outlier);

  const bool dedup = j.dedups();
  if (dedup) {
    launch("row_hash", row_hash_kernel<DT>, grid_for(hl_div_up(R, kHashRows), kWarpsPerBlock),
           kThreads, stream, x, s.codes, R, d, st, s.keys, s.rows);
    cub_run("sort of row hashes", s.cub, [&](void* t, size_t& b) {
      return cub_sort_pairs(t, b, s.keys, s.keys_sorted, s.rows, s.rows_sorted, R, stream);
    });
    launch("run_heads", run_heads_kernel, grid_for(R, kThreads), kThreads, stream, s.keys_sorted,
           R, s.run_head);
    cub_run("prefix max of run heads", s.cub, [&](void* t, size_t& b) {
      return cub_prefix_max(t, b, s.run_head, s.run_start, R, stream);
    });
    launch("first_occurrence", first_occurrence_kernel<DT>, row_grid, kThreads, stream, x,
           s.codes, R, d, st, s.run_start, s.rows_sorted, s.first_of);
    launch("unique_flags", unique_flags_kernel, grid_for(R, kThreads), kThreads, stream,
           s.first_of, R, s.flag);
    cub_run("scan of unique flags", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint32_t>(t, b, s.flag, s.uid, R, stream);
    });
    launch("row_map", row_map_kernel, grid_for(R, kThreads), kThreads, stream, s.first_of,
           s.flag, s.uid, R, s.map, s.first, st);
  }
  launch("rows_layout", rows_layout_kernel, 1, 1, stream, st, R, d, dedup, j.ndim, s.codes,
         s.gathered);
  if (dedup)
    launch("gather_unique", gather_unique_kernel, row_grid, kThreads, stream, st, s.codes,
           s.first, d, s.gathered);
  if (R) {
    launch("count_outliers", count_outliers_kernel, row_grid, kThreads, stream, st, s.row_outlier,
           s.first, R, d, s.out_count);
    cub_run("scan of outlier counts", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, s.out_count, s.out_off, R, stream);
    });
  }

  pack_section<kMapSection>(st, s.map, dedup ? R : 0, j.frame_dev, s, stream);
  launch("code_layout", code_layout_kernel, 1, 1, stream, st);
  if (j.v2)
    code_section_v2(j, st, s, stream);
  else
    pack_section<kCodeSection>(st, nullptr, n, j.frame_dev, s, stream);

  const uint64_t ms = j.max_streams();
  if (ms) {
    launch("rans_histogram", rans_histogram_kernel, grid_for(ms, 1), kThreads, stream, st, ms,
           s.esc_count);
    launch("rans_table", rans_table_kernel, 1, 1, stream, st);
    cub_run("scan of escape counts", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, s.esc_count, s.esc_off, ms, stream);
    });
    launch_smem("rans_encode", rans_encode_kernel, hl_div_up(ms, kEncodeStreams), kEncodeThreads,
                kEncodeSmem, stream, st, ms, s.slots, s.stream_len);
    cub_run("scan of stream sizes", s.cub, [&](void* t, size_t& b) {
      return cub_exclusive_sum<uint64_t>(t, b, s.stream_len, s.stream_off, ms, stream);
    });
  }
  launch("decide", decide_kernel, 1, 1, stream, st, R, d, j.ndim, j.dtype, ms, s.out_count,
         s.out_off, s.stream_len, s.stream_off);
  if (ms)
    launch("rans_write", rans_write_kernel, grid_for(ms, 1), kThreads, stream, st, j.frame_dev,
           s.slots, s.stream_len, s.stream_off, s.esc_off);
  if (n)
    launch("write_outliers", write_outliers_kernel<DT>, row_grid, kThreads, stream, st, x, s.first,
           R, d, s.out_count, s.out_off, j.frame_dev);
  launch("header", header_kernel, 1, 1, stream, st, j.frame_dev, j.shape, j.ndim, j.dtype, j.mode,
         j.eb, R, d);
  const uint64_t word_grid = grid_for(hl_div_up(j.max_frame, 8), kThreads);
  if (reinterpret_cast<uintptr_t>(j.frame_dev) % 8 == 0)
    launch("checksum", encode_checksum_kernel<true>, word_grid, kThreads, stream, st, j.frame_dev);
  else
    launch("checksum", encode_checksum_kernel<false>, word_grid, kThreads, stream, st, j.frame_dev);
  launch("finish", finish_kernel, 1, 1, stream, st, j.frame_dev, result);
}

struct JobOutcome {
  uint64_t total;
  uint32_t error;
};

// Encodes every job into its frame_dev; a job whose lossy frame would exceed max_frame is
// encoded again lossless. Returns what the device found once known on the host.
std::vector<ChunkResult> encode_results(const std::vector<EncodeJob>& jobs, cudaStream_t stream) {
  const size_t n = jobs.size();
  Workspace ws(stream);
  EncodeScratch s;
  plan_encode_scratch(jobs, &ws, &s);
  EncodeState* states;
  ChunkResult* results;
  ws.reserve(&states, n);
  ws.reserve(&results, n);
  ws.allocate();

  auto run = [&](size_t i, bool force_lossless) {
    with_dtype(jobs[i].dtype, [&](auto dt) {
      enqueue_encode<decltype(dt)::value>(jobs[i], s, states + i, results + i, force_lossless,
                                          stream);
    });
  };
  for (size_t i = 0; i < n; ++i) run(i, false);
  std::vector<ChunkResult> res(n);
  memcpy(res.data(), fetch(results, n * sizeof(ChunkResult), stream), n * sizeof(ChunkResult));
  bool again = false;
  for (size_t i = 0; i < n; ++i) {
    if (res[i].fallback && !res[i].error) {
      run(i, true);
      again = true;
    }
  }
  if (again)
    memcpy(res.data(), fetch(results, n * sizeof(ChunkResult), stream), n * sizeof(ChunkResult));
  for (size_t i = 0; i < n; ++i) {
    if (!res[i].error && (res[i].fallback || (!jobs[i].v2 && res[i].total < HL_HEADER_BYTES)))
      throw CodecError("CUDA encoder produced no frame for chunk " + std::to_string(i));
  }
  return res;
}

std::vector<JobOutcome> encode_jobs(const std::vector<EncodeJob>& jobs, cudaStream_t stream) {
  const std::vector<ChunkResult> res = encode_results(jobs, stream);
  std::vector<JobOutcome> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) out[i] = {res[i].total, res[i].error};
  return out;
}

std::string bound_overflow_message(double eb) {
  return "error_bound " + std::to_string(eb) + " times the value range overflows a double";
}

EncodeJob make_job(const void* x_dev, const CompressParams& p, const std::vector<int64_t>& shape,
                   uint8_t* frame_dev) {
  EncodeJob j;
  j.x_dev = x_dev;
  j.dtype = p.dtype;
  j.mode = p.mode;
  j.level = p.level;
  j.dedup = p.dedup;
  j.eb = p.error_bound;
  shape_to_rows(shape, &j.n_rows, &j.row_len);
  j.ndim = (int)shape.size();
  for (int i = 0; i < HL_MAX_NDIM; ++i) j.shape.d[i] = i < j.ndim ? shape[i] : 0;
  j.frame_dev = frame_dev;
  j.max_frame = hl_max_frame_bytes(j.n_rows, j.row_len, j.ndim);
  return j;
}

}  // namespace

uint64_t segment_slot_bytes(const std::vector<int64_t>& shape) {
  uint64_t rows, len;
  shape_to_rows(shape, &rows, &len);
  return hl_max_frame_bytes(rows, len, (int)shape.size());
}

std::vector<SegmentResult> encode_segments(const std::vector<SegmentJob>& segs,
                                           cudaStream_t stream) {
  std::vector<EncodeJob> jobs;
  jobs.reserve(segs.size());
  for (const SegmentJob& g : segs) {
    if (g.p.level != 1 || g.p.dither)
      throw ArgumentError("the CUDA format-2 encoder codes level 1 without dither, got level " +
                          std::to_string(g.p.level) + (g.p.dither ? " with dither" : ""));
    jobs.push_back(make_job(g.x_dev, g.p, g.shape, g.payload_dev));
    jobs.back().v2 = true;
  }
  if (jobs.empty()) return {};
  const std::vector<ChunkResult> res = encode_results(jobs, stream);
  std::vector<SegmentResult> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ChunkResult& r = res[i];
    SegmentResult& o = out[i];
    o.payload_bytes = r.total;
    o.n_unique = r.n_unique;
    o.n_outliers = r.n_outliers;
    o.map_bytes = r.map_bytes;
    o.code_bytes = r.code_bytes;
    o.bound = r.lossless ? 0 : r.bound;
    o.lossless = r.lossless != 0;
    o.identity = r.identity != 0;
    o.packing = (int)r.packing;
    o.bound_overflow = r.error != 0;
  }
  return out;
}

}  // namespace gpu

// =============================================================================================
// Entry points (codec.h)
// =============================================================================================

uint64_t compress_cuda(const void* input_dev, const CompressParams& p,
                       const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                       void* stream_v) {
  using namespace gpu;
  check_params(p);
  if (p.format == 2) {
    for (int64_t s : shape)
      if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
    return compress_v2_cuda(input_dev, p, shape, out_dev, out_cap,
                            static_cast<cudaStream_t>(stream_v));
  }
  if (p.dither)
    throw ArgumentError("dither has no CUDA encoder yet: compress on the CPU "
                        "(hvd_lossy.compress does this for device tensors)");
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  EncodeJob job = make_job(input_dev, p, shape, nullptr);
  DeviceScope scope(out_dev, "the output buffer");
  // Straight into the caller's buffer when the worst case fits; otherwise into scratch, and the
  // size is checked before copying (the CPU codec raises the same error).
  const bool direct = out_cap >= job.max_frame;
  uint8_t* frame = direct ? out_dev : static_cast<uint8_t*>(pool_alloc(job.max_frame, stream));
  job.frame_dev = frame;
  JobOutcome r;
  try {
    r = encode_jobs({job}, stream)[0];
  } catch (...) {
    if (!direct) cudaFreeAsync(frame, stream);
    throw;
  }
  if (!direct && !r.error && r.total <= out_cap) {
    cudaError_t e = cudaMemcpyAsync(out_dev, frame, r.total, cudaMemcpyDeviceToDevice, stream);
    cudaFreeAsync(frame, stream);
    check_cuda(e, "cudaMemcpyAsync of the frame");
  } else if (!direct) {
    cudaFreeAsync(frame, stream);
  }
  if (r.error) throw ArgumentError(bound_overflow_message(p.error_bound));
  if (r.total > out_cap)
    throw ArgumentError("output buffer holds " + std::to_string(out_cap) +
                        " bytes, the frame needs " + std::to_string(r.total));
  return r.total;
}

std::vector<uint64_t> compress_many_cuda(const void* input_dev, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         uint8_t* out_dev, uint64_t out_cap, void* stream_v) {
  using namespace gpu;
  if (p.format == 2)  // one v2 frame of all the chunks
    return compress_into_cuda(input_dev, p, rows, trailing, error_bounds,
                              {(int64_t)rows.size()}, 0, out_dev, out_cap, stream_v);
  const size_t n = rows.size();
  const uint64_t row_elems = check_chunk_args(p, n, trailing, error_bounds);
  if (p.dither)
    throw ArgumentError("dither has no CUDA encoder yet: compress on the CPU "
                        "(hvd_lossy.compress_chunks does this for device tensors)");
  const uint8_t* in = static_cast<const uint8_t*>(input_dev);
  const uint64_t eb = hl_elem_bytes(p.dtype);
  std::vector<EncodeJob> jobs;
  std::vector<uint64_t> out_off(n + 1, 0);
  uint64_t in_off = 0;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] < 0)
      throw ArgumentError("chunk " + std::to_string(i) + " has " + std::to_string(rows[i]) +
                          " rows, expected >= 0");
    CompressParams pi = p;
    if (!error_bounds.empty()) {
      pi.error_bound = error_bounds[i];
      check_params(pi);
    }
    std::vector<int64_t> shape{rows[i]};
    shape.insert(shape.end(), trailing.begin(), trailing.end());
    jobs.push_back(make_job(in + in_off * eb, pi, shape, nullptr));
    in_off += (uint64_t)rows[i] * row_elems;
    out_off[i + 1] = out_off[i] + jobs.back().max_frame;
  }
  if (out_off[n] > out_cap)
    throw ArgumentError("output buffer holds " + std::to_string(out_cap) +
                        " bytes, the frames may need " + std::to_string(out_off[n]));
  if (n == 0) return {};
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(out_dev, "the output buffer");
  for (size_t i = 0; i < n; ++i) jobs[i].frame_dev = out_dev + out_off[i];
  std::vector<JobOutcome> res = encode_jobs(jobs, stream);
  std::vector<uint64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    // The same bad argument as compress_cuda's and the CPU codec's: the same ArgumentError
    // (ValueError in Python) on every path.
    if (res[i].error) throw ArgumentError(bound_overflow_message(jobs[i].eb));
    sizes[i] = res[i].total;
  }
  // Close the gaps left by the worst-case slots, in order. A frame whose slot overlaps its
  // destination goes through a bounce buffer (cudaMemcpyAsync needs disjoint ranges).
  uint64_t w = 0, largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, sizes[i]);
  uint8_t* bounce = nullptr;
  try {
    for (size_t i = 0; i < n; ++i) {
      if (w != out_off[i]) {
        if (out_off[i] - w >= sizes[i]) {
          HL_CUDA_CHECK(cudaMemcpyAsync(out_dev + w, out_dev + out_off[i], sizes[i],
                                        cudaMemcpyDeviceToDevice, stream));
        } else {
          if (!bounce) bounce = static_cast<uint8_t*>(pool_alloc(largest, stream));
          HL_CUDA_CHECK(cudaMemcpyAsync(bounce, out_dev + out_off[i], sizes[i],
                                        cudaMemcpyDeviceToDevice, stream));
          HL_CUDA_CHECK(cudaMemcpyAsync(out_dev + w, bounce, sizes[i], cudaMemcpyDeviceToDevice,
                                        stream));
        }
      }
      w += sizes[i];
    }
  } catch (...) {
    if (bounce) cudaFreeAsync(bounce, stream);
    throw;
  }
  if (bounce) HL_CUDA_CHECK(cudaFreeAsync(bounce, stream));
  return sizes;
}

}  // namespace hl
