// The batched CUDA decoder: every level-1 segment of the frames of one received buffer decoded
// by one launch set driven by one device table of segments (segment_table.h). Each stage is one
// launch for all segments, a few blocks a segment (piece_of_block) striding over that segment's
// items, and every per-item step is segment_table.h's HL_HD function, which the host's emulation
// (native/testing/decode_batch_ref.h) runs in this decomposition against the CPU decoder. The
// stages: the widths of every section's blocks, one device-wide scan of them, the section
// sizes, the unpacking (a warp a block, a lane a value) into values, radix digits or map
// entries, the outliers, one running max of the keyed map entries, the map checks and the row
// gather; then one copy of the error words back. Compiled for sm_90, NOT YET RUN ON A GPU;
// hvd_lossy's device receive path calls it (hvd_lossy/_decode.py).
//
// The parse is the host's (parse_frame: its checks and messages), but no payload comes to the
// host: the frames' prefixes (header and descriptors) come in one copy, a walk on the device
// (frame_walk.h, a thread a frame) finds the few payload bytes the parser reads (block-packed
// maps' widths, code sections' marks and radix heads) and takes every frame's CRC32C, and one
// copy brings those back; the host parses the image they make.
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "codec_cuda_device.cuh"
#include "device_frames.h"  // FrameCopy, FrameSeal
#include "frame_walk.h"
#include "piece_table.h"  // piece_of_block
#include "segment_table.h"

namespace hl {
namespace gpu {
namespace {

// The table as the kernels take it: sections are indexed 2 s + (0: code, 1: map).
struct Table {
  const DeviceSegment* segs;
  uint64_t n_segs;
  const uint8_t* buf;
  uint32_t* err;  // one word a segment (SegmentError bits)
};

__device__ __forceinline__ const DeviceSection& section_of(const Table& t, uint64_t sec) {
  return sec & 1 ? t.segs[sec >> 1].map : t.segs[sec >> 1].code;
}
__device__ __forceinline__ void flag(const Table& t, uint64_t s, uint32_t bits) {
  if (bits) atomicOr(t.err + s, bits);
}
// Whether segment s is flagged, read once for the whole block (every block belongs to one
// segment), so that no thread leaves a block collective early.
__device__ bool segment_stopped(const Table& t, uint64_t s) {
  __shared__ uint32_t seen;
  __syncthreads();
  if (threadIdx.x == 0) seen = *reinterpret_cast<const volatile uint32_t*>(t.err + s);
  __syncthreads();
  return seen != 0;
}

// In a kernel over bpp blocks an item owner (a section or a segment): this block's owner and
// its block among bpp.
#define HL_OWNER_STRIDE(i, n) \
  for (uint64_t i = pb.block * blockDim.x + threadIdx.x; i < (n); i += bpp * blockDim.x)
#define HL_OWNER_WARP_STRIDE(w, n)                                        \
  for (uint64_t w = (pb.block * blockDim.x + threadIdx.x) >> 5; w < (n); \
       w += (bpp * blockDim.x) >> 5)

__global__ void widths_kernel(Table t, uint64_t bpp, uint64_t* width) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  const DeviceSection& c = section_of(t, pb.piece);
  const uint32_t bit = pb.piece & 1 ? kSegMapSection : kSegCodeSection;
  uint32_t err = 0;
  HL_OWNER_STRIDE(b, c.n_blocks())
  width[c.block_base + b] = section_width(c, t.buf + c.off, b, bit, &err);
  flag(t, pb.piece >> 1, err);
}

// One thread a section.
__global__ void sizes_kernel(Table t, const uint64_t* width, const uint64_t* word_off) {
  HL_GRID_STRIDE(sec, 2 * t.n_segs) {
    const DeviceSection& c = section_of(t, sec);
    const uint64_t nb = c.n_blocks(), last = c.block_base + nb - 1;
    if (nb && !section_size_ok(c, t.buf + c.off, scan_local(word_off, c.block_base, nb - 1),
                               width[last]))
      flag(t, sec >> 1, sec & 1 ? kSegMapSection : kSegCodeSection);
  }
}

// Where unpacked values go: codes decoded into the unique rows (or the output when the
// segment has no map), radix digits likewise, map entries into the map and its keyed copy.
template <int DT>
struct Sinks {
  typedef typename Elem<DT>::raw_t raw_t;
  raw_t* out;
  raw_t* uniq;
  uint32_t* map;
  uint64_t* keyed;
  __device__ raw_t* codes_of(const DeviceSegment& g) const {
    return g.identity ? out + g.out_elem : uniq + g.uniq_base;
  }
};
template <int DT>
struct CodeStore {
  typename Elem<DT>::raw_t* codes;
  const ElementRule& rule;
  uint32_t* err;
  __device__ void operator()(uint64_t i, uint32_t v) const {
    codes[i] = code_value<DT>(rule, v, i, err);
  }
};

// A warp a block of a section; lane j takes value j of the block (short blocks: lanes 16-31
// idle). Every lane reads the block's planes itself: the warp's reads of a plane coincide.
template <int DT>
__global__ void unpack_kernel(Table t, uint64_t bpp, const uint64_t* width,
                              const uint64_t* word_off, Sinks<DT> out) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  const uint64_t s = pb.piece >> 1;
  const bool is_map = pb.piece & 1;
  if (segment_stopped(t, s)) return;
  const DeviceSegment& g = t.segs[s];
  const DeviceSection& c = is_map ? g.map : g.code;
  uint32_t err = 0;
  const CodeStore<DT> code{out.codes_of(g), g.rule, &err};
  const uint32_t size = section_block_size(c), lane = threadIdx.x & 31;
  HL_OWNER_WARP_STRIDE(b, c.n_blocks()) {
    const uint64_t j = b * size + lane;
    if (lane >= size || j >= c.n_values) continue;
    const uint32_t v = section_value(c, t.buf + c.off, scan_local(word_off, c.block_base, b),
                                     (uint32_t)width[c.block_base + b], lane);
    if (is_map) {
      out.map[g.map_base + j] = v;
      out.keyed[g.map_base + j] = map_key(s, v);
    } else if (c.kind == kSecRadix) {
      radix_digits(c, g.n_codes(), j, v, &err, code);
    } else {
      code(j, v);
    }
  }
  flag(t, s, err);
}

template <int DT>
__global__ void outliers_kernel(Table t, uint64_t bpp, Sinks<DT> out) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  if (segment_stopped(t, pb.piece)) return;
  const DeviceSegment& g = t.segs[pb.piece];
  typename Elem<DT>::raw_t* codes = out.codes_of(g);
  uint32_t err = 0;
  HL_OWNER_STRIDE(k, g.n_outliers) {
    uint64_t pos;
    uint32_t raw;
    if (outlier_record(t.buf + g.outlier_off, k, g.pos_bytes, (int)sizeof(*codes), g.n_codes(),
                       &pos, &raw))
      codes[pos] = (typename Elem<DT>::raw_t)raw;
    else
      err = kSegOutlier;
  }
  flag(t, pb.piece, err);
}

__global__ void check_maps_kernel(Table t, uint64_t bpp, const uint32_t* map,
                                  const uint64_t* prefix_max) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  if (segment_stopped(t, pb.piece)) return;
  const DeviceSegment& g = t.segs[pb.piece];
  uint32_t err = 0;
  HL_OWNER_STRIDE(r, g.identity ? 0 : g.n_rows)
  if (!map_entry_ok(prefix_max + g.map_base, r, map[g.map_base + r], g.n_rows, g.n_unique))
    err = kSegMapEntry;
  flag(t, pb.piece, err);
}

// A warp a row. The map checks ran before, so every entry is below n_unique.
template <int DT>
__global__ void gather_kernel(Table t, uint64_t bpp, Sinks<DT> out) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  if (segment_stopped(t, pb.piece)) return;
  const DeviceSegment& g = t.segs[pb.piece];
  const uint64_t d = g.row_len;
  HL_OWNER_WARP_STRIDE(r, g.identity ? 0 : g.n_rows) {
    const uint64_t m = out.map[g.map_base + r];
    for (uint64_t i = threadIdx.x & 31; i < d; i += 32)
      out.out[g.out_elem + r * d + i] = out.uniq[g.uniq_base + m * d + i];
  }
}

// ---- the parse without the payloads (frame_walk.h) -------------------------------------------

// A thread a frame: its segments' sizes copied to where the walk writes, then the walk.
__global__ void walk_kernel(const uint8_t* buf, const WalkFrame* frames, uint64_t n,
                            const WalkSegment* segs_in, WalkSegment* segs, uint8_t* widths,
                            uint8_t* heads) {
  HL_GRID_STRIDE(i, n) {
    const WalkFrame w = frames[i];
    for (uint64_t k = 0; k < w.n_segs; ++k) segs[w.first_seg + k] = segs_in[w.first_seg + k];
    walk_frame(buf + w.offset, w, segs, widths, heads);
  }
}

// The (offset, bytes) reads of the buffer back to back in host memory: one gather launch and
// one copy (read_heads' fetch). Valid until the next fetch.
const uint8_t* gather_reads(const uint8_t* buf_dev,
                            const std::vector<std::pair<uint64_t, uint64_t>>& reads,
                            cudaStream_t stream, const DeviceAlloc& alloc) {
  std::vector<FrameCopy> copies;
  uint64_t at = 0, longest = 0;
  for (const auto& r : reads) {
    copies.push_back({r.first, at, r.second, 0});
    at += r.second;
    longest = std::max(longest, r.second);
  }
  if (at == 0) return nullptr;
  Workspace ws(stream, alloc);
  FrameCopy* copies_dev;
  uint8_t* staging;
  ws.reserve(&copies_dev, copies.size());
  ws.reserve(&staging, at);
  ws.allocate();
  upload(copies_dev, copies.data(), copies.size() * sizeof(FrameCopy), stream);
  copy_moves_dev(copies_dev, copies.size(), longest, nullptr, buf_dev, staging, stream);
  return static_cast<const uint8_t*>(fetch(staging, at, stream));
}

// Byte offsets of consecutive arrays in one allocation, each 16-byte aligned.
uint64_t next_array(uint64_t* at, uint64_t bytes) {
  const uint64_t here = *at;
  *at += (bytes + 15) & ~(uint64_t)15;
  return here;
}

// The table of the frames at places of the device buffer (frame_walk.h): their heads from
// prefixes (a round or two of one gather and one copy), then one upload, the walk and every
// frame's CRC32C terms (two launches) and one copy of what they found; the table is parsed
// from the image of prefixes and walked bytes. No payload comes to the host.
SegmentTable walked_table(const uint8_t* buf_dev, uint64_t len,
                          const std::vector<FramePlace>& places, bool verify, uint8_t* dtype,
                          cudaStream_t stream, const DeviceAlloc& alloc) {
  check_places(places, len);
  BufferImage image(len);
  const std::vector<FrameView> heads = read_heads(
      places, &image, [&](const std::vector<std::pair<uint64_t, uint64_t>>& reads) {
        return gather_reads(buf_dev, reads, stream, alloc);
      });
  const uint64_t nf = places.size();
  if (nf == 0) return SegmentTable();
  std::vector<uint64_t> offsets(nf), sizes(nf);
  std::vector<FrameSeal> seals(nf);
  uint64_t largest = 0;
  for (uint64_t i = 0; i < nf; ++i) {
    offsets[i] = places[i].offset;
    sizes[i] = places[i].size;
    seals[i] = {places[i].offset, places[i].size};
    largest = std::max(largest, places[i].size);
  }
  Walk w = walk_plan(heads, offsets, sizes);
  const uint64_t ns = w.segs.size();
  uint64_t in_bytes = 0, out_bytes = 0;  // the upload and the results, each one array
  const uint64_t in_frames = next_array(&in_bytes, nf * sizeof(WalkFrame));
  const uint64_t in_seals = next_array(&in_bytes, nf * sizeof(FrameSeal));
  const uint64_t in_segs = next_array(&in_bytes, ns * sizeof(WalkSegment));
  const uint64_t out_segs = next_array(&out_bytes, ns * sizeof(WalkSegment));
  const uint64_t out_widths = next_array(&out_bytes, w.width_bytes);
  const uint64_t out_heads = next_array(&out_bytes, ns * kCodeHead);
  const uint64_t out_terms = next_array(&out_bytes, nf * sizeof(uint32_t));
  std::vector<uint8_t> up(in_bytes);
  memcpy(up.data() + in_frames, w.frames.data(), nf * sizeof(WalkFrame));
  memcpy(up.data() + in_seals, seals.data(), nf * sizeof(FrameSeal));
  memcpy(up.data() + in_segs, w.segs.data(), ns * sizeof(WalkSegment));
  Workspace ws(stream, alloc);
  uint8_t *in_dev, *res_dev;
  ws.reserve(&in_dev, in_bytes);
  ws.reserve(&res_dev, out_bytes);
  ws.allocate();
  upload(in_dev, up.data(), in_bytes, stream);
  HL_CUDA_CHECK(cudaMemsetAsync(res_dev + out_heads, 0, ns * kCodeHead, stream));
  launch("walk", walk_kernel, grid_for(nf, kThreads), kThreads, stream, buf_dev,
         reinterpret_cast<const WalkFrame*>(in_dev + in_frames), nf,
         reinterpret_cast<const WalkSegment*>(in_dev + in_segs),
         reinterpret_cast<WalkSegment*>(res_dev + out_segs), res_dev + out_widths,
         res_dev + out_heads);
  uint32_t* terms_dev = reinterpret_cast<uint32_t*>(res_dev + out_terms);
  if (verify)
    frame_terms_dev(buf_dev, reinterpret_cast<const FrameSeal*>(in_dev + in_seals), nf, largest,
                    terms_dev, stream);
  const uint8_t* got = static_cast<const uint8_t*>(fetch(res_dev, out_bytes, stream));
  memcpy(w.segs.data(), got + out_segs, ns * sizeof(WalkSegment));
  image.put_walked(w, got + out_widths, got + out_heads);
  std::vector<uint32_t> crcs(nf);
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  for (uint64_t i = 0; i < nf; ++i) {
    uint32_t terms;
    memcpy(&terms, got + out_terms + i * sizeof(uint32_t), sizeof(terms));
    crcs[i] = crc32c_finish(terms, places[i].size - HL_FRAME_PREFIX, x2k);
  }
  return segment_table(image.data(), len, places, verify ? crcs.data() : nullptr, dtype);
}

// Blocks an owner for the largest count of items an owner has, at items_per_block (fewer when
// there are many owners: an owner's blocks stride over its items).
uint64_t owner_blocks(uint64_t most, uint64_t items_per_block, uint64_t owners) {
  const uint64_t g = grid_for(most, items_per_block);
  const uint64_t cap = owners ? (16 * kMaxGrid) / owners : 1;
  return g == 0 ? 0 : g < cap ? g : (cap ? cap : 1);
}

}  // namespace
}  // namespace gpu

void decompress_batched_cuda(const uint8_t* buf_dev, uint64_t len,
                             const std::vector<FramePlace>& places, void* out_dev,
                             uint64_t out_bytes, void* stream_v, bool verify_checksum,
                             const DeviceAlloc& alloc) {
  using namespace gpu;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(buf_dev, "the frames");
  uint8_t dtype = 0;
  const SegmentTable t =
      walked_table(buf_dev, len, places, verify_checksum, &dtype, stream, alloc);
  const uint64_t need = t.out_elems * hl_elem_bytes(dtype);
  if (out_bytes < need)
    throw ArgumentError("output buffer holds " + std::to_string(out_bytes) +
                        " bytes, the frames decode to bytes up to " + std::to_string(need));
  const uint64_t n = t.segs.size();
  if (n == 0) return;
  uint64_t most_blocks = 0, most_outliers = 0, most_rows = 0;
  for (const DeviceSegment& g : t.segs) {
    most_blocks = std::max({most_blocks, g.code.n_blocks(), g.map.n_blocks()});
    most_outliers = std::max(most_outliers, g.n_outliers);
    most_rows = std::max(most_rows, g.identity ? 0 : g.n_rows);
  }

  Workspace ws(stream, alloc);
  DeviceSegment* segs_dev;
  uint32_t* err_dev;
  uint64_t *width, *word_off, *keyed, *prefix_max;
  uint32_t* map;
  uint8_t* uniq;
  CubScratch cub;
  cub_need(&cub.bytes, [&](void* tmp, size_t& b) {
    return cub_exclusive_sum<uint64_t>(tmp, b, nullptr, nullptr, t.n_blocks, 0);
  });
  cub_need(&cub.bytes, [&](void* tmp, size_t& b) {
    return cub_prefix_max<uint64_t>(tmp, b, nullptr, nullptr, t.map_entries, 0);
  });
  ws.reserve(&segs_dev, n);
  ws.reserve(&err_dev, n);
  ws.reserve(&width, t.n_blocks);
  ws.reserve(&word_off, t.n_blocks);
  ws.reserve(&map, t.map_entries);
  ws.reserve(&keyed, t.map_entries);
  ws.reserve(&prefix_max, t.map_entries);
  ws.reserve(&uniq, t.uniq_elems * hl_elem_bytes(dtype));
  ws.reserve_bytes(&cub.tmp, cub.bytes);
  ws.allocate();
  upload(segs_dev, t.segs.data(), n * sizeof(DeviceSegment), stream);
  HL_CUDA_CHECK(cudaMemsetAsync(err_dev, 0, n * sizeof(uint32_t), stream));
  const Table tab{segs_dev, n, buf_dev, err_dev};

  const uint64_t bpp_blocks = owner_blocks(most_blocks, kThreads, 2 * n);
  launch("widths", widths_kernel, bpp_blocks * 2 * n, kThreads, stream, tab, bpp_blocks, width);
  if (t.n_blocks)
    cub_run("scan of the call's block widths", cub, [&](void* tmp, size_t& b) {
      return cub_exclusive_sum<uint64_t>(tmp, b, width, word_off, t.n_blocks, stream);
    });
  launch("sizes", sizes_kernel, grid_for(2 * n, kThreads), kThreads, stream, tab, width,
         word_off);
  const uint64_t bpp_warps = owner_blocks(most_blocks, kWarpsPerBlock, 2 * n);
  with_dtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    typedef typename Elem<DT>::raw_t raw_t;
    const Sinks<DT> sinks{static_cast<raw_t*>(out_dev), reinterpret_cast<raw_t*>(uniq), map,
                          keyed};
    launch("unpack", unpack_kernel<DT>, bpp_warps * 2 * n, kThreads, stream, tab, bpp_warps,
           width, word_off, sinks);
    const uint64_t bpp_out = owner_blocks(most_outliers, kThreads, n);
    launch("outliers", outliers_kernel<DT>, bpp_out * n, kThreads, stream, tab, bpp_out, sinks);
    if (t.map_entries) {
      cub_run("running max of the keyed map entries", cub, [&](void* tmp, size_t& b) {
        return cub_prefix_max<uint64_t>(tmp, b, keyed, prefix_max, t.map_entries, stream);
      });
      const uint64_t bpp_rows = owner_blocks(most_rows, kThreads, n);
      launch("check_maps", check_maps_kernel, bpp_rows * n, kThreads, stream, tab, bpp_rows, map,
             prefix_max);
      const uint64_t bpp_gather = owner_blocks(most_rows, kWarpsPerBlock, n);
      launch("gather", gather_kernel<DT>, bpp_gather * n, kThreads, stream, tab, bpp_gather,
             sinks);
    }
  });
  std::vector<uint32_t> err(n);
  memcpy(err.data(), fetch(err_dev, n * sizeof(uint32_t), stream), n * sizeof(uint32_t));
  for (uint64_t k = 0; k < n; ++k)
    if (err[k]) raise_segment_error(err[k], t, k);
}

}  // namespace hl
