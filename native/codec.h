// Plain C++ API of the hvd_lossy codec. The CPU entry points live in codec_cpu.cc, the CUDA ones
// (same arguments plus a stream, all pointers on the device) in codec_cuda.cu. Both write the
// frame format of frame.h byte for byte identically.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "frame.h"

namespace hl {

// A frame that is truncated, corrupted or not ours. Surfaces in Python as ValueError.
struct FrameError : std::invalid_argument {
  explicit FrameError(const std::string& m) : std::invalid_argument(m) {}
};
// A bad argument (unsupported dtype, negative bound, buffer too small). ValueError in Python.
struct ArgumentError : std::invalid_argument {
  explicit ArgumentError(const std::string& m) : std::invalid_argument(m) {}
};
// A failure inside the codec itself (CUDA error, allocation). RuntimeError in Python.
struct CodecError : std::runtime_error {
  explicit CodecError(const std::string& m) : std::runtime_error(m) {}
};

struct CompressParams {
  uint8_t dtype;      // HlDType
  uint8_t mode;       // HlMode
  uint8_t level;      // 1 block packing, 2 entropy coded
  bool dedup;         // drop duplicate rows
  double error_bound; // relative factor (mode rel) or absolute bound; 0 = lossless
  bool dither = false;       // subtractive dither (frame.h); turns dedup off
  uint32_t dither_seed = 0;  // < HL_DITHER_SEEDS; chunk i of compress_many uses seed + i
};

// Rows and row length of a shape: the last dimension is a row; 0-d and 1-d tensors are one row.
// Throws ArgumentError for more than HL_MAX_NDIM dimensions or a negative one.
void shape_to_rows(const std::vector<int64_t>& shape, uint64_t* n_rows, uint64_t* row_len);

// Checks the parameters and throws ArgumentError naming the bad value.
void check_params(const CompressParams& p);

// Checks the arguments of compress_many_* (params, one bound a chunk when given, trailing
// dimensions >= 0); returns the elements a row of dim 0 holds.
uint64_t check_chunk_args(const CompressParams& p, size_t n_chunks,
                          const std::vector<int64_t>& trailing,
                          const std::vector<double>& error_bounds);

// Absolute bound for a tensor whose finite values span [lo, hi] (lo > hi when none are finite).
double absolute_bound(const CompressParams& p, double lo, double hi);

// Compresses `n_chunks` tensors that lie back to back in `input` (raw bits of p.dtype): chunk i
// has rows[i] rows and shape (rows[i], *trailing) (trailing empty: each chunk is 1-d of rows[i]
// elements, one row). error_bounds[i] overrides p.error_bound per chunk. Frames are written back
// to back into `out` (capacity out_cap, at least the sum of hl_max_frame_bytes); returns their
// sizes. threads <= 0 uses all cores.
std::vector<uint64_t> compress_many_cpu(const void* input, const CompressParams& p,
                                        const std::vector<int64_t>& rows,
                                        const std::vector<int64_t>& trailing,
                                        const std::vector<double>& error_bounds, uint8_t* out,
                                        uint64_t out_cap, int threads);

// One tensor of the given shape (ndim 0..HL_MAX_NDIM). Returns the frame size.
uint64_t compress_cpu(const void* input, const CompressParams& p,
                      const std::vector<int64_t>& shape, uint8_t* out, uint64_t out_cap,
                      int threads);

// Validates the header and section sizes of the frame in [frame, frame+size) (not the payload
// checksum) and returns it with the shape. Throws FrameError.
HlFrameHeader parse_header(const uint8_t* frame, uint64_t size, std::vector<int64_t>* shape);

// Decodes a frame into `out` (n_rows * row_len elements of the frame's dtype, out_bytes long).
// Verifies the checksum and every section; throws FrameError on anything inconsistent.
void decompress_cpu(const uint8_t* frame, uint64_t size, void* out, uint64_t out_bytes,
                    int threads);

// Checksum of a frame as stored in its header (the checksum field read as zero).
uint32_t frame_checksum(const uint8_t* frame, uint64_t size);

// ---- CUDA (codec_cuda.cu; only when built with HL_WITH_CUDA) ------------------------------
// Same contracts as the CPU functions above, byte-identical frames; every pointer is device
// memory except `rows`, `trailing`, `error_bounds`, `shape` and the returned sizes. `stream` is
// a cudaStream_t. The functions enqueue their work on the stream; they return once the frame
// sizes are known on the host (one device-to-host copy of the sizes), never syncing the device.
std::vector<uint64_t> compress_many_cuda(const void* input_dev, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         uint8_t* out_dev, uint64_t out_cap, void* stream);
uint64_t compress_cuda(const void* input_dev, const CompressParams& p,
                       const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                       void* stream);
// The header must already have been validated on the host (parse_header on a copy of it).
void decompress_cuda(const uint8_t* frame_dev, uint64_t size, void* out_dev, uint64_t out_bytes,
                     void* stream);

}  // namespace hl
