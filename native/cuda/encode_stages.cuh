// The CUDA encoder of format-2 segments at level 1 (frame.h): every piece of a call coded by
// one launch of each stage, all pieces at once, on the caller's stream with no host sync inside.
// The pieces are one device-side table (piece_table.h: offsets, rows, bounds, seeds, the bases
// of each piece's share of the call's scratch arrays); a stage's grid is a few blocks a piece
// (launch_pieces), and the decisions between stages run one thread a piece.
//   encode_quantize.cu  finite range (rel mode) -> the absolute bound on the device, rounded to
//                       the 24 bits format 2 stores -> codes (zigzag, or kOutlierMark) and row
//                       outlier flags
//   encode_dedup.cu     row content hash, one radix sort of (piece, hash, row) for all pieces,
//                       first identical row within each hash run, one scan of "first of its
//                       kind" flags = unique ids in first-occurrence order -> dedup_pays ->
//                       gather unique rows -> outlier counts per unique row, one scan of them,
//                       codes at outliers zeroed
//   encode_sections.cu  block packing of the map (warp OR for widths, scan, ballot bit planes);
//                       the code section sized three ways (block packing, radix, short blocks),
//                       level1_packing picks and only the chosen one is written
//   encode.cu           outlier records, the lossless decision, the results; the one scratch
//                       plan and the order of the stages (encode_batch)
// The scans are device-wide over the pieces' arrays back to back; a piece reads its share with
// scan_local (piece_table.h). A piece's payload (map, code, outliers) goes to offset 0 of its
// slot; frames.cu writes the frames around the payloads. Every size the host cannot know yet
// (n_unique, section sizes, the packing) lives in the piece's EncodeState on the device; kernels
// are launched over worst cases known on the host and read the real counts from the state. The
// host learns the sizes with one copy at the end. A lossy piece whose sections break the size
// bound (lossy_exceeds_bound) is not finished on the device (its outliers are skipped); the
// host then runs the batch again for those pieces alone, lossless (a second copy, only then).
#pragma once

#include "codec_cuda_device.cuh"
#include "elements.h"
#include "level1_sections.h"
#include "piece_table.h"

namespace hl {
namespace gpu {

// The call's scratch: every piece's share back to back (DevicePiece's bases).
struct EncodeScratch {
  uint32_t *codes, *gathered;  // elem_base
  uint8_t* row_outlier;        // row_base, and so are the row arrays below
  uint64_t *keys, *keys_sorted, *run_head, *run_start;  // dedup_key, run_head
  uint32_t *rows, *rows_sorted;                         // a row's index in its piece
  uint32_t *first_of, *flag, *uid, *map, *first;
  uint64_t *out_count, *out_off;
  uint64_t *width, *word_off;    // block_base: block widths of the map or the codes, their scan
  uint32_t* values;              // value_base: radix values
  uint64_t *rwidth, *rword_off;  // rblock_base: ... their block widths
  uint64_t *swidth, *sword_off;  // sblock_base: short-block widths
  CubScratch cub;
};

// What every stage kernel gets: the table, the pieces' states, the input and the slots.
struct Batch {
  const DevicePiece* pieces;
  EncodeState* states;
  uint64_t n_pieces;
  const void* x;
  uint8_t* slots;
  uint8_t dtype;
};

// The host's view of the call: the table (a copy of what is on the device) and the largest
// piece's counts, which size the grids.
struct BatchPlan {
  PieceTable table;
  uint64_t max_rows = 0, max_elems = 0, max_blocks = 0, max_values = 0, max_short_blocks = 0;
  bool any_dedup = false;
};
BatchPlan batch_plan(PieceTable table);

// Blocks a piece for `items` a piece at items_per_block: grid_for's count, fewer when there
// are many pieces (a piece's blocks stride over it, so fewer is always correct).
inline uint64_t piece_blocks(uint64_t items, uint64_t items_per_block, uint64_t n_pieces) {
  const uint64_t g = grid_for(items, items_per_block);
  const uint64_t cap = n_pieces ? (16 * kMaxGrid) / n_pieces : 1;
  return g == 0 ? 0 : g < cap ? g : (cap ? cap : 1);
}

// Launches a stage kernel(Batch, bpp, args...) over bpp blocks for every piece: one launch for
// all of them (none when bpp is 0, i.e. no piece has an item).
template <typename... KArgs, typename... Args>
void launch_pieces(const char* name, void (*kernel)(KArgs...), uint64_t bpp, const Batch& b,
                   cudaStream_t stream, Args&&... args) {
  launch(name, kernel, bpp * b.n_pieces, kThreads, stream, b, bpp, std::forward<Args>(args)...);
}
// A decision kernel(Batch, args...): one thread a piece.
template <typename... KArgs, typename... Args>
void launch_each_piece(const char* name, void (*kernel)(KArgs...), const Batch& b,
                       cudaStream_t stream, Args&&... args) {
  launch(name, kernel, hl_div_up(b.n_pieces, kThreads), kThreads, stream, b,
         std::forward<Args>(args)...);
}

// In a stage kernel(Batch b, uint64_t bpp, ...): this block's piece `e`, its state `st` and its
// block `pb.block` of bpp; an inactive piece's blocks leave at once (the whole block: no warp
// or block collective loses members).
#define HL_PIECE_OF_BLOCK                                                   \
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);                   \
  const DevicePiece e = b.pieces[pb.piece];                                 \
  EncodeState* st = b.states + pb.piece;                                   \
  if (!e.active) return;
// Strides over a piece's n items: a thread an item, or a warp an item (every lane of a warp gets
// the same w, so warp collectives inside the loop are safe).
#define HL_PIECE_STRIDE(i, n)                                                        \
  for (uint64_t i = pb.block * blockDim.x + threadIdx.x; i < (n); i += bpp * blockDim.x)
#define HL_PIECE_WARP_STRIDE(w, n)                                             \
  for (uint64_t w = (pb.block * blockDim.x + threadIdx.x) >> 5; w < (n);     \
       w += (bpp * blockDim.x) >> 5)
// In a decision kernel(Batch b, ...): piece p, its table entry e and state st, active only.
#define HL_EACH_PIECE                                                         \
  const uint64_t p = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;        \
  if (p >= b.n_pieces || !b.pieces[p].active) return;                         \
  const DevicePiece e = b.pieces[p];                                          \
  EncodeState* st = b.states + p;

// The call's device memory for the encoder: the payload slots, the table, the states, the
// results and the scratch, reserved in one Workspace.
struct EncodeBuffers {
  uint8_t* slots;
  DevicePiece* pieces;
  EncodeState* states;
  PieceResult* results;
  EncodeScratch scratch;
  void reserve(const BatchPlan& plan, Workspace* ws);
};

// Uploads the table, enqueues every stage once for all pieces and returns once their results
// are on the host (one device-to-host copy; a second round, and copy, only when a lossy piece
// fell back to lossless: plan's table then marks those pieces). Each piece's payload lies at
// its slot.
std::vector<SegmentResult> encode_batch(BatchPlan& plan, const EncodeBuffers& buf,
                                        const void* x_dev, uint8_t dtype, cudaStream_t stream);

// The stages, in the order encode.cu enqueues them, each for every active piece of the batch.
// The bound, the codes and the row outlier flags.
void enqueue_quantize(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                      cudaStream_t stream);
// The unique rows and the map (pieces that dedup), the stored codes, the outlier counts.
void enqueue_dedup(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                   cudaStream_t stream);
// The map and code sections.
void enqueue_sections(const BatchPlan& plan, const Batch& b, const EncodeScratch& s,
                      cudaStream_t stream);

}  // namespace gpu
}  // namespace hl
