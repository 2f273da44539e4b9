// The CUDA entry points of the hvd_lossy codec (only when built with HL_WITH_CUDA): the
// contracts of the CPU functions in codec.h, byte-identical frames; every pointer is
// device memory except `rows`, `trailing`, `error_bounds`, `groups`, `shape` and the returned
// sizes. `stream` is a cudaStream_t. The functions enqueue their work on the stream; they return
// once the frame sizes are known on the host (one device-to-host copy of the sizes), never
// syncing the device. The encoders code every piece of a call with one set of launches
// (native/common/piece_table.h); their device scratch is the caller's (scratch_dev, at least the
// bytes *_scratch says; hvd_lossy takes it from PyTorch's caching allocator) or, when
// scratch_dev is null, comes from the codec's own stream-ordered pool.
#pragma once

#include <stdint.h>

#include <functional>
#include <string>
#include <vector>

#include "codec.h"
#include "segment_table.h"  // FramePlace

namespace hl {

// Device memory of at least `bytes` from the caller, usable in the order of the call's stream
// and kept alive by the caller until the call returns (hvd_lossy's is a tensor from PyTorch's
// caching allocator). Used where a call's scratch sizes are known only inside it, after its
// host parse, so the caller cannot size one buffer beforehand.
typedef std::function<void*(uint64_t bytes)> DeviceAlloc;

// compress_into_cpu on the device (cuda/frames.cu): the same layout, sizes and bytes, every
// group's frame written into out_dev (capacity out_cap, at least max_grouped_bytes(rows,
// trailing, groups, prefix_bytes)) and sealed on the device. Level 1 only, dithered or not
// (ArgumentError otherwise: the CPU encoder codes level 2; hvd_lossy's Python layer copies such
// tensors to the host). No statistics.
std::vector<uint64_t> compress_into_cuda(const void* input_dev, const CompressParams& p,
                                         const GroupedCall& call, uint8_t* out_dev,
                                         uint64_t out_cap, void* stream,
                                         std::vector<uint64_t>* group_bytes = nullptr,
                                         void* scratch_dev = nullptr, uint64_t scratch_bytes = 0);
// Device scratch of a compress_into_cuda call of these arguments and n_groups groups (bytes).
uint64_t compress_into_cuda_scratch(const CompressParams& p, const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& trailing,
                                    const std::vector<double>& error_bounds, size_t n_groups);
// One tensor of any shape (0-d included) as a frame of one segment, as compress_cpu writes it;
// returns its size. Level 1 only, as compress_into_cuda.
uint64_t compress_cuda(const void* input_dev, const CompressParams& p,
                       const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                       void* stream, void* scratch_dev = nullptr, uint64_t scratch_bytes = 0);
// Device scratch of a compress_cuda call (bytes).
uint64_t compress_cuda_scratch(const CompressParams& p, const std::vector<int64_t>& shape);
// Decodes a frame into out_dev (out_bytes, exactly what it decodes to): the frame is copied to
// the host, its size and CRC32C verified there before it is parsed, and the segments decode on
// the device. verify_checksum false: verify_cuda has already checked it. Throws FrameError, or
// ArgumentError for bucketed row maps (no CUDA decoder yet).
void decompress_cuda(const uint8_t* frame_dev, uint64_t size, void* out_dev, uint64_t out_bytes,
                     void* stream, bool verify_checksum = true);
// Decodes the frames at places[i] of buf_dev (len bytes; segment_table.h) into out_dev
// (out_bytes, at least where the last frame's output ends), each from its out_elem on, with
// one launch set for all their segments (decode_batch.cu): the buffer is copied to the host
// once and parsed there (CRC32C checked unless verify_checksum is false), the payloads are
// read on the device. Level 1 with block-packed maps only: ArgumentError naming the first
// segment of level 2 or with an entropy-coded or bucketed map (decompress_cuda reads those).
// Throws FrameError naming the frame. Its device scratch (a few allocations a call) comes
// from `alloc` when given, else from the codec's own stream-ordered pool. Compiled, not yet
// run on a GPU.
void decompress_batched_cuda(const uint8_t* buf_dev, uint64_t len,
                             const std::vector<FramePlace>& places, void* out_dev,
                             uint64_t out_bytes, void* stream, bool verify_checksum = true,
                             const DeviceAlloc& alloc = DeviceAlloc());
// Verifies a device frame before the caller allocates anything for it: its first bytes (the
// size and the CRC32C) are copied to the host, then the CRC32C over the whole frame is
// computed on the device (frame_fields.h's piecewise form). Device memory used: a few bytes of
// state. Throws FrameError naming the fault.
void verify_cuda(const uint8_t* frame_dev, uint64_t size, void* stream);
// CRC32C of n device bytes at p_dev, computed on the device (tests and verify_cuda).
uint32_t crc32c_cuda(const uint8_t* p_dev, uint64_t n, void* stream);

}  // namespace hl
