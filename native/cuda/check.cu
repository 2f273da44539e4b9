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

namespace hl {
namespace gpu {
namespace {

// Long enough that the shift (about 30 carry-less multiplications of 32 steps) costs less
// than the piece's table lookups, short enough that a 64 KiB frame still spreads over 64
// threads.
constexpr uint64_t kCrcPiece = 1024;

__global__ void crc32c_pieces_kernel(const uint8_t* p, uint64_t n, uint32_t* terms) {
  __shared__ uint32_t table[256];
  __shared__ uint32_t x2k[64];
  for (unsigned t = threadIdx.x; t < 256; t += blockDim.x) table[t] = crc32c_table_entry(t);
  if (threadIdx.x == 0) crc32c_x2k_table(x2k);
  __syncthreads();
  uint32_t acc = 0;
  const uint64_t pieces = hl_div_up(n, kCrcPiece);
  for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < pieces;
       k += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t lo = k * kCrcPiece, len = n - lo < kCrcPiece ? n - lo : kCrcPiece;
    acc ^= crc32c_piece_term(crc32c_update(0, p + lo, len, table), n - lo - len, x2k);
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc) atomicXor(terms, acc);
}

}  // namespace

void crc_mismatch(uint32_t computed, uint32_t stored) {
  char buf[128];
  snprintf(buf, sizeof(buf),
           "frame is corrupted: checksum (CRC32C) 0x%08x, its header says 0x%08x", computed,
           stored);
  throw FrameError(buf);
}

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

void crc32c_terms_dev(const uint8_t* p_dev, uint64_t n, uint32_t* terms_dev, cudaStream_t stream) {
  launch("crc32c_pieces", crc32c_pieces_kernel, grid_for(hl_div_up(n, kCrcPiece), kThreads),
         kThreads, stream, p_dev, n, terms_dev);
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
  if (crc != stored) crc_mismatch(crc, stored);
}

}  // namespace hl
