// The encoder's third stage (encode_stages.cuh): the map section, block packed, and the code
// section in the packing level1_packing picks of the three (frame.h: block packing, radix,
// short blocks), sized on the device with the rules of level1_sections.h, for every piece at
// once.
#include "encode_stages.cuh"

namespace hl {
namespace gpu {
namespace {

// ---- block packing (frame.h "Packed integer arrays") ------------------------------------------

// The values of a radix section are block packed after its head (frame.h).
enum SectionKind { kMapSection = 0, kCodeSection = 1, kRadixSection = 2 };

// A piece's section: its values, their count, its offset in the payload, where its size goes,
// and where its block widths and their call-wide scan lie.
struct SectionView {
  const uint32_t* vals;
  uint64_t count;
  uint64_t off;
  uint64_t* bytes;
  uint64_t block_base;
};

// aux: the call's row maps (kMapSection) or radix values (kRadixSection).
template <int SEC>
__device__ SectionView section_view(const DevicePiece& e, EncodeState* st, const uint32_t* aux) {
  if (SEC == kMapSection)
    return {aux + e.row_base, st->map_count, 0, &st->map_bytes, e.block_base};
  if (SEC == kRadixSection)
    return {aux + e.value_base, st->radix_G, st->code_off + st->radix_head,
            &st->radix_vals_bytes, e.rblock_base};
  return {st->ucodes, st->n_codes, st->code_off, &st->code_bytes, e.block_base};
}

// Whether the section's blocks go into the payload: the code section's only when block
// packing is its packing, radix values only when radix is.
template <int SEC>
__device__ bool section_written(const EncodeState* st) {
  if (SEC == kRadixSection) return st->packing == HL_PACK_RADIX;
  if (SEC == kCodeSection) return st->packing == HL_PACK_BLOCK;
  return true;
}

// Width of every block of the piece's section.
template <int SEC>
__global__ void block_widths_kernel(Batch b, uint64_t bpp, const uint32_t* aux, uint64_t* width) {
  HL_PIECE_OF_BLOCK
  const SectionView s = section_view<SEC>(e, st, aux);
  HL_PIECE_WARP_STRIDE(blk, hl_div_up(s.count, HL_BLOCK)) {
    const uint64_t i = blk * HL_BLOCK + lane_id();
    const uint32_t v = i < s.count ? s.vals[i] : 0u;
    const uint32_t w = bit_width(__reduce_or_sync(kFull, v));
    if (SEC == kCodeSection) {  // radix K and the short-block test need the largest code
      const uint32_t m = __reduce_max_sync(kFull, v);
      if (lane_id() == 0 && m) atomicMax(&st->max_code, m);
    }
    if (lane_id() == 0) width[s.block_base + blk] = w;
  }
}

// One warp a block: word j is the ballot of bit j, value i in lane i; lane j stores word j.
template <int SEC>
__global__ void pack_blocks_kernel(Batch b, uint64_t bpp, const uint32_t* aux,
                                   const uint64_t* width, const uint64_t* word_off) {
  HL_PIECE_OF_BLOCK
  if (!section_written<SEC>(st)) return;
  const SectionView s = section_view<SEC>(e, st, aux);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  uint8_t* sec = b.slots + e.slot + s.off;
  HL_PIECE_WARP_STRIDE(blk, nb) {
    const uint32_t w = (uint32_t)width[s.block_base + blk];
    const uint64_t i = blk * HL_BLOCK + lane_id();
    const uint32_t v = i < s.count ? s.vals[i] : 0u;
    uint32_t mine = 0;
    for (uint32_t j = 0; j < w; ++j) {
      uint32_t word = __ballot_sync(kFull, (v >> j) & 1u);
      if (lane_id() == j) mine = word;
    }
    if (lane_id() == 0) sec[blk] = (uint8_t)w;
    if (lane_id() < w)
      put_le(sec + nb + 4 * (scan_local(word_off, s.block_base, blk) + lane_id()), mine, 4);
  }
}

// The section's size from its scanned widths (before any of it is written: the code section is
// sized three ways first). After the map: the code section's offset; after the code section's
// block packing: the radix plan (which needs the largest code).
template <int SEC>
__global__ void section_bytes_kernel(Batch b, const uint32_t* aux, const uint64_t* width,
                                     const uint64_t* word_off) {
  HL_EACH_PIECE
  const SectionView s = section_view<SEC>(e, st, aux);
  const uint64_t nb = hl_div_up(s.count, HL_BLOCK);
  *s.bytes = nb ? block_section_bytes(nb, scan_total(word_off, width, s.block_base, nb)) : 0;
  if (SEC == kMapSection) st->code_off = st->map_bytes;
  if (SEC == kCodeSection) radix_plan(st);
}

// ---- radix and short-block code sections (level1_sections.h) ---------------------------------

// The radix values, one thread a value: digit i of value j is code radix_code_of(G, g, j, i),
// so a warp's reads of one digit are consecutive codes.
__global__ void radix_values_kernel(Batch b, uint64_t bpp, uint32_t* values) {
  HL_PIECE_OF_BLOCK
  const uint64_t G = st->radix_G, n = st->n_codes;
  const uint32_t g = st->radix_g, k = st->radix_k;
  const uint32_t* v = st->ucodes;
  HL_PIECE_STRIDE(j, G) values[e.value_base + j] = radix_value(v, n, G, g, k, j);
}

// Short-block widths, two blocks of 16 a warp (a half-warp's OR by shuffles within the half),
// where short blocks apply.
__global__ void short_widths_kernel(Batch b, uint64_t bpp, uint64_t* width) {
  HL_PIECE_OF_BLOCK
  const uint64_t n = st->n_codes, nb = short_n_blocks(n);
  if (st->rule.lossless || !short_applies(n, st->max_code)) return;
  HL_PIECE_WARP_STRIDE(w, hl_div_up(nb, 2)) {
    const uint64_t blk = 2 * w + (lane_id() >> 4);
    const uint64_t i = blk * HL_SHORT_BLOCK + (lane_id() & 15);
    uint32_t v = blk < nb && i < n ? st->ucodes[i] : 0u;
    for (int o = 8; o > 0; o >>= 1) v |= __shfl_xor_sync(kFull, v, o);
    if ((lane_id() & 15) == 0 && blk < nb) width[e.sblock_base + blk] = bit_width(v);
  }
}

// choose_packing over the three sizes, and the radix head when radix wins.
__global__ void choose_packing_kernel(Batch b, const uint64_t* short_width,
                                      const uint64_t* short_off) {
  HL_EACH_PIECE
  const uint64_t n = st->n_codes;
  const bool shorts = !st->rule.lossless && short_applies(n, st->max_code);
  choose_packing(st, shorts ? scan_total(short_off, short_width, e.sblock_base, short_n_blocks(n))
                            : 0);
  if (st->packing == HL_PACK_RADIX)
    radix_put_head(b.slots + e.slot + st->code_off, st->radix_k, st->radix_g);
}

// The short-block section: mark, width nibbles (a thread a byte) and planes (two blocks a warp:
// word j of a block is the half-warp's share of the ballot of bit j).
__global__ void short_write_kernel(Batch b, uint64_t bpp, const uint64_t* width,
                                   const uint64_t* word_off) {
  HL_PIECE_OF_BLOCK
  if (st->packing != HL_PACK_SHORT) return;
  const uint64_t n = st->n_codes, nb = short_n_blocks(n), head = short_head_bytes(n);
  const uint64_t* wd = width + e.sblock_base;
  uint8_t* sec = b.slots + e.slot + st->code_off;
  if (pb.block == 0 && threadIdx.x == 0) sec[0] = HL_SHORT_MARK;
  const uint64_t pairs = hl_div_up(nb, 2);
  HL_PIECE_STRIDE(p, pairs)
    sec[1 + p] = short_nibble_byte((uint32_t)wd[2 * p], 2 * p + 1 < nb ? (uint32_t)wd[2 * p + 1] : 0u);
  HL_PIECE_WARP_STRIDE(w, pairs) {
    const unsigned half = lane_id() >> 4, li = lane_id() & 15;
    const uint64_t blk = 2 * w + half, i = blk * HL_SHORT_BLOCK + li;
    const uint32_t v = blk < nb && i < n ? st->ucodes[i] : 0u;
    const uint32_t wb = blk < nb ? (uint32_t)wd[blk] : 0u;
    uint32_t mine = 0;
    for (uint32_t j = 0; j < HL_SHORT_MAX_WIDTH; ++j) {
      const uint32_t word = __ballot_sync(kFull, (v >> j) & 1u);
      if (li == j) mine = (word >> (16 * half)) & 0xffffu;
    }
    if (li < wb) put_le(sec + head + 2 * (scan_local(word_off, e.sblock_base, blk) + li), mine, 2);
  }
}

// A call-wide exclusive scan of `count` widths (every piece's, back to back).
void scan_widths(const char* name, const uint64_t* width, uint64_t* word_off, uint64_t count,
                 const EncodeScratch& s, cudaStream_t stream) {
  if (count == 0) return;
  cub_run(name, s.cub, [&](void* t, size_t& bytes) {
    return cub_exclusive_sum<uint64_t>(t, bytes, width, word_off, count, stream);
  });
}

// Block packing of a section in two steps: widths, their scan and the section's size; then,
// once the code section's packing is chosen, the blocks. max_count: the most values a piece's
// section holds; total_blocks: the blocks of the call's width array.
template <int SEC>
void size_section(const Batch& b, const uint32_t* aux, uint64_t max_count, uint64_t* width,
                  uint64_t* word_off, uint64_t total_blocks, const EncodeScratch& s,
                  cudaStream_t stream) {
  launch_pieces("block_widths", block_widths_kernel<SEC>,
                piece_blocks(hl_div_up(max_count, HL_BLOCK), kWarpsPerBlock, b.n_pieces), b,
                stream, aux, width);
  scan_widths("scan of block widths", width, word_off, total_blocks, s, stream);
  launch_each_piece("section_bytes", section_bytes_kernel<SEC>, b, stream, aux, width, word_off);
}

template <int SEC>
void write_section(const Batch& b, const uint32_t* aux, uint64_t max_count, const uint64_t* width,
                   const uint64_t* word_off, cudaStream_t stream) {
  launch_pieces("pack_blocks", pack_blocks_kernel<SEC>,
                piece_blocks(hl_div_up(max_count, HL_BLOCK), kWarpsPerBlock, b.n_pieces), b,
                stream, aux, width, word_off);
}

}  // namespace

void enqueue_sections(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                      cudaStream_t stream) {
  const PieceTable& t = plan.table;
  const uint64_t map_rows = plan.any_dedup ? plan.max_rows : 0;
  size_section<kMapSection>(b, s.map, map_rows, s.width, s.word_off, t.blocks, s, stream);
  write_section<kMapSection>(b, s.map, map_rows, s.width, s.word_off, stream);
  // The code section: block packing, radix and short blocks sized on the device,
  // choose_packing picks, and only the chosen one is written.
  const uint64_t n = plan.max_elems, mv = plan.max_values, msb = plan.max_short_blocks;
  size_section<kCodeSection>(b, nullptr, n, s.width, s.word_off, t.blocks, s, stream);
  launch_pieces("radix_values", radix_values_kernel, piece_blocks(mv, kThreads, b.n_pieces), b,
                stream, s.values);
  size_section<kRadixSection>(b, s.values, mv, s.rwidth, s.rword_off, t.rblocks, s, stream);
  const uint64_t short_bpp = piece_blocks(hl_div_up(msb, 2), kWarpsPerBlock, b.n_pieces);
  launch_pieces("short_widths", short_widths_kernel, short_bpp, b, stream, s.swidth);
  scan_widths("scan of short-block widths", s.swidth, s.sword_off, t.sblocks, s, stream);
  launch_each_piece("choose_packing", choose_packing_kernel, b, stream, s.swidth, s.sword_off);
  write_section<kCodeSection>(b, nullptr, n, s.width, s.word_off, stream);
  write_section<kRadixSection>(b, s.values, mv, s.rwidth, s.rword_off, stream);
  launch_pieces("short_write", short_write_kernel, short_bpp, b, stream, s.swidth, s.sword_off);
}

}  // namespace gpu
}  // namespace hl
