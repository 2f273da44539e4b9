// Checks of device frames before anything is allocated for them: CRC32C on the device,
// verify_cuda (codec.h), and the size and CRC rules the decoder applies to its host copy. The
// CRC is frame_fields.h's piecewise form: every thread takes pieces of kCrcPiece bytes, runs
// the byte-at-a-time table from a zero register, shifts the result past the bytes that follow
// the piece and XORs it into its share; the shares meet in one word, and the host finishes the
// CRC with the same shared function the CPU tests exercise (crc32c_in_pieces).
#include <stdio.h>

#include <algorithm>

#include "codec_cuda.cuh"
#include "frame_io.h"
#include "frame_fields.h"
#include "piece_table.h"

namespace hl {
namespace gpu {
namespace {

// Long enough that the shift (about 30 carry-less multiplications of 32 steps) costs less
// than the piece's table lookups, short enough that a 64 KiB frame still spreads over 64
// threads.
constexpr uint64_t kCrcPiece = 1024;

// The byte table and the shift table of the piecewise CRC, in shared memory.
struct CrcTables {
  uint32_t table[256];
  uint32_t x2k[64];
};
__device__ void load_crc_tables(CrcTables* t) {
  for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) t->table[i] = crc32c_table_entry(i);
  if (threadIdx.x == 0) crc32c_x2k_table(t->x2k);
  __syncthreads();
}

// The XOR of the piece terms of n bytes at p that thread `first` of `stride` threads takes.
__device__ uint32_t crc_share(const uint8_t* p, uint64_t n, uint64_t first, uint64_t stride,
                              const CrcTables& t) {
  uint32_t acc = 0;
  for (uint64_t k = first; k < hl_div_up(n, kCrcPiece); k += stride) {
    const uint64_t lo = k * kCrcPiece, len = n - lo < kCrcPiece ? n - lo : kCrcPiece;
    acc ^= crc32c_piece_term(crc32c_update(0, p + lo, len, t.table), n - lo - len, t.x2k);
  }
  return acc;
}

// XORs a warp's shares into *terms.
__device__ void add_terms(uint32_t acc, uint32_t* terms) {
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc) atomicXor(terms, acc);
}

__global__ void crc32c_pieces_kernel(const uint8_t* p, uint64_t n, uint32_t* terms) {
  __shared__ CrcTables t;
  load_crc_tables(&t);
  add_terms(crc_share(p, n, (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
                      (uint64_t)gridDim.x * blockDim.x, t),
            terms);
}

// Every frame's terms: bpp blocks a frame, over its bytes after the CRC field.
__global__ void crc32c_frames_kernel(const uint8_t* out, const FrameSeal* seals, uint64_t bpp,
                                     uint32_t* terms) {
  __shared__ CrcTables t;
  load_crc_tables(&t);
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  const FrameSeal f = seals[pb.piece];
  add_terms(crc_share(out + f.at + HL_FRAME_PREFIX, f.total - HL_FRAME_PREFIX,
                      pb.block * blockDim.x + threadIdx.x, bpp * blockDim.x, t),
            terms + pb.piece);
}

// Stores every frame's CRC32C from its terms, a thread a frame.
__global__ void seal_frames_kernel(uint8_t* out, const FrameSeal* seals, uint64_t n,
                                   const uint32_t* terms) {
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
       k += (uint64_t)gridDim.x * blockDim.x) {
    const FrameSeal f = seals[k];
    put_fixed_le(out + f.at + 3, crc32c_finish(terms[k], f.total - HL_FRAME_PREFIX, x2k), 4);
  }
}

// Every move of frame_moves: bpp blocks a move, 16 bytes a thread where source and
// destination line up, else bytes.
__global__ void copy_moves_kernel(const FrameCopy* copies, uint64_t bpp, const uint8_t* heads,
                                  const uint8_t* slots, uint8_t* out) {
  const PieceBlock pb = piece_of_block(blockIdx.x, bpp);
  const FrameCopy c = copies[pb.piece];
  const uint8_t* src = (c.from_heads ? heads : slots) + c.src;
  uint8_t* dst = out + c.dst;
  const uint64_t first = pb.block * blockDim.x + threadIdx.x, stride = bpp * blockDim.x;
  if ((((uintptr_t)src ^ (uintptr_t)dst) & 15) == 0) {
    const uint64_t lead = ((16 - ((uintptr_t)dst & 15)) & 15) < c.len
                              ? ((16 - ((uintptr_t)dst & 15)) & 15) : c.len;
    for (uint64_t i = first; i < lead; i += stride) dst[i] = src[i];
    const uint64_t words = (c.len - lead) / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src + lead);
    uint4* d4 = reinterpret_cast<uint4*>(dst + lead);
    for (uint64_t i = first; i < words; i += stride) d4[i] = s4[i];
    for (uint64_t i = lead + 16 * words + first; i < c.len; i += stride) dst[i] = src[i];
  } else {
    for (uint64_t i = first; i < c.len; i += stride) dst[i] = src[i];
  }
}

}  // namespace

void check_frame_size(uint64_t size) {
  if (size <= HL_FRAME_PREFIX) checked_frame_bytes(nullptr, size);  // too short to hold a byte of it
}

uint32_t stored_crc(const uint8_t* head, uint64_t head_len, uint64_t size) {
  uint64_t total = 0;
  uint32_t stored = 0;
  // The CRC covers everything after its own field and the size is all it needs; the segments
  // are parsed (and may announce their sizes) only once it holds. The full parser names what is
  // wrong with a head that is not a frame's.
  if (!peek_frame_total(head, head_len, &total, &stored)) checked_frame_bytes(head, head_len);
  if (total != size)
    throw FrameError("frame is truncated or has trailing bytes: " + std::to_string(size) +
                     " bytes, its header says " + std::to_string(total));
  return stored;
}

void copy_moves_dev(const FrameCopy* copies_dev, uint64_t n, uint64_t longest,
                    const uint8_t* heads_dev, const uint8_t* slots_dev, uint8_t* out_dev,
                    cudaStream_t stream) {
  uint64_t bpp = grid_for(hl_div_up(longest, 16), kThreads);
  bpp = std::max<uint64_t>(1, std::min<uint64_t>(bpp, 16 * kMaxGrid / std::max<uint64_t>(n, 1)));
  launch("copy_moves", copy_moves_kernel, bpp * n, kThreads, stream, copies_dev, bpp, heads_dev,
         slots_dev, out_dev);
}

void frame_terms_dev(const uint8_t* buf_dev, const FrameSeal* seals_dev, uint64_t n,
                     uint64_t largest, uint32_t* terms_dev, cudaStream_t stream) {
  uint64_t bpp = grid_for(hl_div_up(largest, kCrcPiece), kThreads);
  bpp = std::max<uint64_t>(1, std::min<uint64_t>(bpp, 16 * kMaxGrid / std::max<uint64_t>(n, 1)));
  HL_CUDA_CHECK(cudaMemsetAsync(terms_dev, 0, n * sizeof(uint32_t), stream));
  launch("crc32c_frames", crc32c_frames_kernel, bpp * n, kThreads, stream, buf_dev, seals_dev,
         bpp, terms_dev);
}

void seal_frames_dev(uint8_t* out_dev, const FrameSeal* seals_dev, uint64_t n, uint64_t largest,
                     uint32_t* terms_dev, cudaStream_t stream) {
  frame_terms_dev(out_dev, seals_dev, n, largest, terms_dev, stream);
  launch("seal_frames", seal_frames_kernel, grid_for(n, kThreads), kThreads, stream, out_dev,
         seals_dev, n, terms_dev);
}

uint32_t crc32c_dev(const uint8_t* p_dev, uint64_t n, cudaStream_t stream) {
  uint32_t terms = 0;
  if (n) {
    Workspace ws(stream);
    uint32_t* acc;
    ws.reserve(&acc, 1);
    ws.allocate();
    HL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(uint32_t), stream));
    launch("crc32c_pieces", crc32c_pieces_kernel,
           grid_for(hl_div_up(n, kCrcPiece), kThreads), kThreads, stream, p_dev, n, acc);
    memcpy(&terms, fetch(acc, sizeof(terms), stream), sizeof(terms));
  }
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  return crc32c_finish(terms, n, x2k);
}

}  // namespace gpu

uint32_t crc32c_cuda(const uint8_t* p_dev, uint64_t n, void* stream) {
  gpu::DeviceScope scope(p_dev, "the data");
  return gpu::crc32c_dev(p_dev, n, static_cast<cudaStream_t>(stream));
}

void verify_cuda(const uint8_t* frame_dev, uint64_t size, void* stream_v) {
  using namespace gpu;
  check_frame_size(size);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(frame_dev, "the frame");
  uint8_t head[HL_FRAME_PREFIX + 10];  // the prefix and the total's varint
  const uint64_t head_len = std::min<uint64_t>(size, sizeof(head));
  memcpy(head, fetch(frame_dev, head_len, stream), head_len);
  const uint32_t stored = stored_crc(head, head_len, size);
  const uint32_t crc = crc32c_dev(frame_dev + HL_FRAME_PREFIX, size - HL_FRAME_PREFIX, stream);
  check_crc(crc, stored);
}

}  // namespace hl
