// The CUDA encoder's frames (frame.h) and its entry points (codec.h). The segments are coded on
// the device (encode_segments, encode_stages.cuh) into worst-case slots; once their sizes are
// on the host (the one wait), the header and descriptors are written on the host by the
// functions the CPU encoder writes them with (frame_io.h: frame_size, write_frame_head, the
// extension included), copied in front of the payloads, which move to their final places device
// to device, and each frame's CRC32C is taken and stored on the device (frame_fields.h's
// piecewise form). So the bytes around the segments are the CPU encoder's by construction, and
// the segments' bytes follow the same rules (level1_sections.h).
//
// Level 2 has no device encoder: the entry points refuse it, and hvd_lossy's Python layer
// (_codec.py) then codes on the host with the CPU encoder (the same bytes). Dithered pieces
// are coded here (elements.h: the per-element rule both codecs share).
#include <string>
#include <vector>

#include "codec_cuda.cuh"
#include "frame_io.h"
#include "level1_sections.h"
#include "pieces.h"
#include "device_frames.h"

namespace hl {
namespace gpu {
namespace {

// Stores the CRC32C of the frame of `total` bytes whose bytes after the CRC field gave *terms.
__global__ void crc_seal_kernel(uint8_t* frame, uint64_t total, const uint32_t* terms) {
  uint32_t x2k[64];
  crc32c_x2k_table(x2k);
  put_fixed_le(frame + 3, crc32c_finish(*terms, total - HL_FRAME_PREFIX, x2k), 4);
}

// A stream-ordered allocation freed with the scope, also when an exception leaves it.
struct PoolBuffer {
  void* p = nullptr;
  cudaStream_t stream;
  PoolBuffer(uint64_t bytes, cudaStream_t s) : stream(s) { p = pool_alloc(bytes, s); }
  ~PoolBuffer() {
    if (p) cudaFreeAsync(p, stream);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

void check_device_params(const CompressParams& p) {
  check_params(p);
  if (p.level != 1)
    throw ArgumentError("the CUDA encoder codes level 1, got level " + std::to_string(p.level) +
                        ": compress on the CPU (hvd_lossy does this for device tensors)");
}

struct Layout {
  std::vector<uint64_t> sizes;        // a piece: its segment, a group's first also the header
  std::vector<uint64_t> group_bytes;  // a group: its frame (0 when it has none)
};

// Codes the pieces on the device and writes one frame a group into out_dev (prefix_bytes
// left before each group, as compress_into_cpu lays them out). empty_trailing: the trailing
// dims of an empty group's frame (it gets one only with an extension). fits(total) throws when
// the layout's `total` bytes do not fit the caller's buffer.
template <typename Fits>
Layout encode_frames(const uint8_t* in_dev, const Pieces& c, const std::vector<int64_t>& groups,
                     uint64_t prefix_bytes, const std::string& ext,
                     const std::vector<int64_t>& empty_trailing, uint8_t dtype, uint8_t* out_dev,
                     cudaStream_t stream, Fits fits) {
  const size_t n = c.shapes.size();
  const uint64_t eb = hl_elem_bytes(dtype);
  std::vector<uint64_t> slot(n + 1, 0);
  for (size_t i = 0; i < n; ++i) slot[i + 1] = slot[i] + segment_slot_bytes(c.shapes[i]);
  PoolBuffer scratch(slot[n], stream);
  std::vector<SegmentJob> jobs(n);
  for (size_t i = 0; i < n; ++i)
    jobs[i] = {in_dev + c.in_off[i] * eb, c.params[i], c.shapes[i],
               scratch.as<uint8_t>() + slot[i]};
  const std::vector<SegmentResult> res = encode_segments(jobs, stream);
  std::vector<SegmentDesc> descs(n);
  std::vector<uint32_t> seeds(n);
  for (size_t i = 0; i < n; ++i) {
    seeds[i] = c.params[i].dither_seed;
    const SegmentResult& r = res[i];
    // The device found the bound overflowing: the rule again on its range throws the CPU
    // encoder's ArgumentError.
    if (r.bound_overflow) absolute_bound(c.params[i], r.lo, r.hi);
    descs[i] = descriptor_of(r, c.params[i].mode, c.shapes[i]);
  }
  const FramesPlan plan =
      plan_device_frames(descs, c.shapes, groups, prefix_bytes, ext, empty_trailing, dtype, seeds);
  fits(plan.end);

  // Every frame's header and descriptors (an empty group's whole frame, sealed) go to the device
  // in one copy while the stream is idle (the results were just fetched): a pageable copy waits
  // for the stream, so one copy rather than one a frame.
  PoolBuffer heads_dev(plan.heads.size(), stream);
  PoolBuffer terms(sizeof(uint32_t) * (plan.frames.empty() ? 1 : plan.frames.size()), stream);
  if (!plan.heads.empty())
    HL_CUDA_CHECK(cudaMemcpyAsync(heads_dev.p, plan.heads.data(), plan.heads.size(),
                                  cudaMemcpyHostToDevice, stream));
  HL_CUDA_CHECK(cudaMemsetAsync(terms.p, 0, sizeof(uint32_t) * plan.frames.size(), stream));
  std::vector<uint64_t> payload_bytes(n);
  for (size_t i = 0; i < n; ++i) payload_bytes[i] = res[i].payload_bytes;
  uint32_t* term = terms.as<uint32_t>();
  assemble_device_frames(
      plan, payload_bytes,
      [&](size_t, uint64_t at, uint64_t head_at, uint64_t len) {
        HL_CUDA_CHECK(cudaMemcpyAsync(out_dev + at, heads_dev.as<uint8_t>() + head_at, len,
                                      cudaMemcpyDeviceToDevice, stream));
      },
      [&](size_t i, uint64_t at, uint64_t len) {
        HL_CUDA_CHECK(cudaMemcpyAsync(out_dev + at, scratch.as<uint8_t>() + slot[i], len,
                                      cudaMemcpyDeviceToDevice, stream));
      },
      [&](size_t k, uint64_t at, uint64_t total) {
        crc32c_terms_dev(out_dev + at + HL_FRAME_PREFIX, total - HL_FRAME_PREFIX, term + k, stream);
        launch("crc_seal", crc_seal_kernel, 1, 1, stream, out_dev + at, total, term + k);
      });
  Layout lay;
  lay.sizes = plan.sizes;
  lay.group_bytes = plan.group_bytes;
  return lay;
}

}  // namespace
}  // namespace gpu

std::vector<uint64_t> compress_into_cuda(const void* input_dev, const CompressParams& p,
                                         const std::vector<int64_t>& rows,
                                         const std::vector<int64_t>& trailing,
                                         const std::vector<double>& error_bounds,
                                         const std::vector<int64_t>& groups,
                                         uint64_t prefix_bytes, uint8_t* out_dev, uint64_t out_cap,
                                         void* stream_v, const std::string& ext,
                                         std::vector<uint64_t>* group_bytes) {
  using namespace gpu;
  check_device_params(p);
  const Pieces c =
      plan_grouped(p, rows, trailing, error_bounds, groups, prefix_bytes, ext, out_cap);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(out_dev, "the output buffer");
  Layout lay = encode_frames(static_cast<const uint8_t*>(input_dev), c, groups, prefix_bytes, ext,
                             trailing, p.dtype, out_dev, stream, [](uint64_t) {});
  if (group_bytes) *group_bytes = lay.group_bytes;
  return lay.sizes;
}

uint64_t compress_cuda(const void* input_dev, const CompressParams& p,
                       const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                       void* stream_v) {
  using namespace gpu;
  check_device_params(p);
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  Pieces c;  // one piece of any shape (plan_pieces cuts dim 0, and a 0-d tensor has none)
  c.params = {p};
  c.shapes = {shape};
  c.in_off = {0};
  DeviceScope scope(out_dev, "the output buffer");
  const Layout lay = encode_frames(static_cast<const uint8_t*>(input_dev), c, {1}, 0,
                                   std::string(), {}, p.dtype, out_dev,
                                   static_cast<cudaStream_t>(stream_v), [&](uint64_t bytes) {
                                     if (bytes > out_cap)
                                       throw ArgumentError(
                                           "output buffer holds " + std::to_string(out_cap) +
                                           " bytes, the frame needs " + std::to_string(bytes));
                                   });
  return lay.group_bytes[0];
}

}  // namespace hl
