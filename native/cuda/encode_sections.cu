// The encoder's third stage (encode_stages.cuh): the map section, block packed, and the code
// section in the packing level1_packing picks of the three (frame.h: block packing, radix,
// short blocks), sized on the device with the rules of level1_sections.h.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

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
  if (SEC == kMapSection) return {aux, st->map_count, 0, &st->map_bytes};
  if (SEC == kRadixSection)
    return {aux, st->radix_G, st->code_off + st->radix_head, &st->radix_vals_bytes};
  return {st->ucodes, st->n_codes, st->code_off, &st->code_bytes};
}

// Whether the section's blocks go into the payload: the code section's only when block
// packing is its packing, radix values only when radix is.
template <int SEC>
__device__ bool section_written(const EncodeState* st) {
  if (SEC == kRadixSection) return st->packing == HL_PACK_RADIX;
  if (SEC == kCodeSection) return st->packing == HL_PACK_BLOCK;
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
__global__ void pack_blocks_kernel(EncodeState* st, const uint32_t* map, uint8_t* payload,
                                   const uint64_t* width, const uint64_t* word_off) {
  if (!section_written<SEC>(st)) return;
  const SectionView s = section_view<SEC>(st, map);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  uint8_t* sec = payload + s.off;
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

// The section's size from its scanned widths (before any of it is written: the code section
// is sized three ways first).
template <int SEC>
__global__ void section_bytes_kernel(EncodeState* st, const uint32_t* aux, const uint64_t* width,
                                     const uint64_t* word_off) {
  const SectionView s = section_view<SEC>(st, aux);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  *s.bytes = nb ? block_section_bytes(nb, word_off[nb - 1] + width[nb - 1]) : 0;
}

// ---- radix and short-block code sections (level1_sections.h) ---------------------------------

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
  st->packing = (uint32_t)level1_packing(st->code_bytes, radix, shorts);
  if (st->packing == HL_PACK_RADIX) st->code_bytes = radix;
  if (st->packing == HL_PACK_SHORT) st->code_bytes = shorts;
}

__global__ void radix_head_kernel(const EncodeState* st, uint8_t* payload) {
  if (st->packing == HL_PACK_RADIX)
    radix_put_head(payload + st->code_off, st->radix_k, st->radix_g);
}

// The short-block section: mark, width nibbles (a thread a byte) and planes (two blocks a warp:
// word j of a block is the half-warp's share of the ballot of bit j).
__global__ void short_write_kernel(const EncodeState* st, uint8_t* payload,
                                   const uint64_t* width, const uint64_t* word_off) {
  if (st->packing != HL_PACK_SHORT) return;
  const uint64_t n = st->n_codes, nb = short_n_blocks(n), head = short_head_bytes(n);
  uint8_t* sec = payload + st->code_off;
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

__global__ void code_layout_kernel(EncodeState* st) { st->code_off = st->map_bytes; }

// Block packing of a section in two steps: widths, their scan and the section's size; then,
// once the code section's packing is chosen, the blocks. width/word_off: max_count / 32.
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
void write_section(EncodeState* st, const uint32_t* aux, uint64_t max_count, uint8_t* payload,
                   const uint64_t* width, const uint64_t* word_off, cudaStream_t stream) {
  const uint64_t max_blocks = hl_div_up(max_count, HL_BLOCK);
  launch("pack_blocks", pack_blocks_kernel<SEC>, grid_for(max_blocks, kWarpsPerBlock), kThreads,
         stream, st, aux, payload, width, word_off);
}

template <int SEC>
void pack_section(EncodeState* st, const uint32_t* aux, uint64_t max_count, uint8_t* payload,
                  const EncodeScratch& s, cudaStream_t stream) {
  size_section<SEC>(st, aux, max_count, s.width, s.word_off, s, stream);
  write_section<SEC>(st, aux, max_count, payload, s.width, s.word_off, stream);
}

// The code section: block packing, radix and short blocks sized on the device,
// level1_packing picks (choose_packing_kernel), and only the chosen one is written.
void code_section(const EncodeJob& j, EncodeState* st, const EncodeScratch& s,
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
  write_section<kCodeSection>(st, nullptr, n, j.payload_dev, s.width, s.word_off, stream);
  launch("radix_head", radix_head_kernel, 1, 1, stream, st, j.payload_dev);
  write_section<kRadixSection>(st, s.values, mv, j.payload_dev, s.rwidth, s.rword_off, stream);
  launch("short_write", short_write_kernel, grid_for(hl_div_up(msb, 2), kWarpsPerBlock),
         kThreads, stream, st, j.payload_dev, s.swidth, s.sword_off);
}

}  // namespace

void enqueue_sections(const EncodeJob& j, const EncodeScratch& s, EncodeState* st,
                      cudaStream_t stream) {
  pack_section<kMapSection>(st, s.map, j.dedups() ? j.n_rows : 0, j.payload_dev, s, stream);
  launch("code_layout", code_layout_kernel, 1, 1, stream, st);
  code_section(j, st, s, stream);
}

}  // namespace gpu
}  // namespace hl
