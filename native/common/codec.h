// Plain C++ API of the hvd_lossy codec. The CPU entry points live in native/cpu (encode.cc,
// stats.cc, decode.cc), the CUDA ones (same arguments plus a stream, all pointers on the device)
// in native/cuda (codec_cuda.h). Both write the frame format of frame.h byte for byte identically.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "arguments.h"
#include "errors.h"
#include "frame.h"
#include "frame_io.h"

namespace hl {


// What the codec learns of a piece: finite min and max, distinct rows, and (piece_stats_cpu
// only) the finite elements with their sum and sum of squares. NaN where not computed (no range
// needed, duplicate removal did not run, or no finite element).
enum {
  HL_STAT_MIN = 0,
  HL_STAT_MAX = 1,
  HL_STAT_UNIQUE = 2,
  HL_STAT_FINITE = 3,
  HL_STAT_SUM = 4,
  HL_STAT_SUMSQ = 5,
  HL_STATS_PER_PIECE = 6
};


// The pieces grouped for an all-to-all (GroupedCall): groups[g] pieces (in piece order, the
// counts summing to rows.size()) form group g, and each group is ONE frame whose segments are its
// pieces (an empty group writes no frame). prefix_bytes bytes are left untouched before each
// group (an empty group still gets its prefix): the layout is [prefix][frame of group 0]
// [prefix][frame of group 1]... with no gaps, so the first groups.size() * prefix_bytes +
// sum(sizes) bytes of out are the send buffer. out_cap must be at least max_grouped_bytes(rows,
// trailing, groups, prefix_bytes). Each frame's bytes are written once, in place. Returns one
// size a piece: its segment (descriptor and payload), the first piece of each group also
// counting the frame's header, so each group's sizes add up to its frame. ext (at most
// HL_FRAME_MAX_EXT bytes): the transport's extension (frame.h) in every group's frame, an empty
// group then getting a frame of no segments; *group_bytes gets each group's frame size. With
// stats, also fills HL_STATS_PER_PIECE doubles a piece (HL_STAT_*).
std::vector<uint64_t> compress_into_cpu(const void* input, const CompressParams& p,
                                        const GroupedCall& call, uint8_t* out, uint64_t out_cap,
                                        int threads, std::vector<uint64_t>* group_bytes = nullptr,
                                        double* stats = nullptr);

// The statistics of pieces of dim 0 (rows[i] rows each, trailing dims) without coding them, by
// the passes the codec itself uses (its row hash and equality for distinct rows): all
// HL_STATS_PER_PIECE columns, for the chunk an all-to-all keeps. range_only: HL_STAT_MIN and
// HL_STAT_MAX alone (one pass, the codec's range pass), the other columns NaN.
void piece_stats_cpu(const void* input, uint8_t dtype, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& trailing, double* stats, int threads,
                     bool range_only = false);

// Compresses `n_chunks` tensors that lie back to back in `input` (raw bits of p.dtype) into ONE
// frame whose segments they are: chunk i has rows[i] rows and shape (rows[i], *trailing)
// (trailing empty: each chunk is 1-d of rows[i] elements, one row). error_bounds[i] overrides
// p.error_bound per chunk. The frame goes to memory it asks alloc for once, when its size is
// known: no worst-case buffer, the frame written once. Returns the sizes compress_into_cpu
// returns for one group. threads <= 0 uses all cores.
std::vector<uint64_t> compress_alloc_cpu(const void* input, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         const std::function<uint8_t*(uint64_t)>& alloc,
                                         int threads);

// One tensor of the given shape (ndim 0..HL_MAX_NDIM) as a frame of one segment, the same way:
// alloc(frame size) once the frame is built. Returns its size.
uint64_t compress_shape_alloc_cpu(const void* input, const CompressParams& p,
                                  const std::vector<int64_t>& shape,
                                  const std::function<uint8_t*(uint64_t)>& alloc, int threads);

// Capacity compress_into_cpu needs: every group's prefix and worst-case frame header, and every
// piece's worst-case segment. Throws ArgumentError for negative rows or groups that do not add
// up.
uint64_t max_grouped_bytes(const std::vector<int64_t>& rows, const std::vector<int64_t>& trailing,
                           const std::vector<int64_t>& groups, uint64_t prefix_bytes);

// Decodes a frame into `out` (its elements of the frame's dtype, out_bytes long). Verifies the
// checksum and every section; throws FrameError on anything inconsistent.
void decompress_cpu(const uint8_t* frame, uint64_t size, void* out, uint64_t out_bytes,
                    int threads);

// decompress_cpu into a tensor of dtype and shape that the caller expects: false, decoding
// nothing, when the frame holds another dtype or shape (the caller then explains the mismatch).
// The one native call of Python's decompress(frame, out=): no header parsed in Python first.
bool decompress_as_cpu(const uint8_t* frame, uint64_t size, uint8_t dtype,
                       const std::vector<int64_t>& shape, void* out, uint64_t out_bytes,
                       int threads);

// Where one sender's frames lie in a receive buffer: bytes [offset, offset + length), back to
// back, decoding to `rows` rows (dim-0 entries) in total.
struct DecodeSource {
  uint64_t offset, length;
  int64_t rows;
};

// Decodes every source's frames straight into `out` (out_bytes: exactly the sources' rows, each
// of prod(trailing) elements of dtype), source 0's rows first, frames at consecutive rows.
// Every frame must have dtype and shape (r, *trailing) (trailing empty: a 1-d frame of r), and
// a source's frames must fill its length exactly and add up to its rows; a frame announcing
// more rows than its source has left is refused before anything is decoded. Checksums are
// verified once per frame. Returns one message per source, empty when it decoded; when
// `mismatched` is given, (*mismatched)[i] says whether source i's frames were well formed but
// disagree with the dtype, row shape or rows asked for (else they were corrupt or truncated). A
// failed source's rows of out may be partly written. Bad arguments (dtype, a source past the
// buffer, out_bytes) throw ArgumentError. Threaded across frames, and within frames when few.
std::vector<std::string> decompress_into_cpu(const uint8_t* buffer, uint64_t buffer_len,
                                             const std::vector<DecodeSource>& sources,
                                             uint8_t dtype, const std::vector<int64_t>& trailing,
                                             void* out, uint64_t out_bytes, int threads,
                                             std::vector<uint8_t>* mismatched = nullptr);

// A frame of a buffer of back-to-back frames, its header and descriptors validated (parse_frame).
struct ParsedFrame {
  uint64_t offset = 0;
  FrameView frame;
  std::vector<int64_t> shape;  // frame.shape()
};

// Validates the headers of the frames in [buffer, buffer+len): of the given sizes, or walked by
// their headers' sizes when sizes is null. Throws FrameError naming the first bad one.
std::vector<ParsedFrame> parse_frames(const uint8_t* buffer, uint64_t len,
                                      const std::vector<uint64_t>* sizes);

// Decodes parsed frames (parse_frames of [buffer, ...)) into memory it asks alloc for, once,
// after every checksum is verified: frame k's elements at out + (*out_offsets)[k], each part
// rounded up to `align` bytes. Throws FrameError for the first bad frame.
void decompress_frames_cpu(const uint8_t* buffer, const std::vector<ParsedFrame>& frames,
                           uint64_t align, const std::function<uint8_t*(uint64_t)>& alloc,
                           std::vector<uint64_t>* out_offsets, int threads);

// The CUDA entry points (only when built with HL_WITH_CUDA) are in cuda/codec_cuda.h.

}  // namespace hl
