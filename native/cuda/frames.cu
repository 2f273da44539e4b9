// The CUDA encoder's frames (frame.h) and its entry points (codec.h). Every piece of a call is
// coded by one batch on the device (encode_batch, encode_stages.cuh) into worst-case slots; once
// their sizes are on the host (the one wait), the headers and descriptors are written on the
// host by the functions the CPU encoder writes them with (frame_io.h: frame_size,
// write_frame_head, the extension included) and go to the device in one copy with the list of
// moves (device_frames.h: frame_moves); then one kernel runs every move (heads and payloads to
// their final places), one takes every frame's CRC32C and one stores them (frame_fields.h's
// piecewise form). So the bytes around the segments are the CPU encoder's by construction, and
// the segments' bytes follow the same rules (level1_sections.h, piece_table.h).
//
// Level 2 has no device encoder: the entry points refuse it, and hvd_lossy's Python layer
// (_codec.py) then codes on the host with the CPU encoder (the same bytes). Dithered pieces
// are coded here (elements.h: the per-element rule both codecs share).
#include <string>
#include <vector>

#include <algorithm>

#include "encode_stages.cuh"
#include "frame_io.h"
#include "level1_sections.h"
#include "pieces.h"
#include "device_frames.h"

namespace hl {
namespace gpu {
namespace {

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

// Everything a call of encode_frames puts in device memory, reserved in one Workspace: the
// encoder's buffers, and room for the heads and the moves that come up after the results.
struct CallBuffers {
  EncodeBuffers enc;
  uint8_t* heads;
  FrameCopy* copies;
  FrameSeal* seals;
  uint32_t* terms;  // a frame's CRC32C terms
  uint64_t heads_cap = 0, copies_cap = 0, seals_cap = 0;

  void reserve(const BatchPlan& plan, size_t n_groups, Workspace* ws) {
    enc.reserve(plan, ws);
    const uint64_t n = plan.table.pieces.size();
    heads_cap = max_heads_bytes(n, n_groups);
    copies_cap = n + n_groups;
    seals_cap = n_groups;
    ws->reserve(&heads, heads_cap);
    ws->reserve(&copies, copies_cap);
    ws->reserve(&seals, seals_cap);
    ws->reserve(&terms, seals_cap);
  }
};

// The call's plan: its pieces' table (pieces.h's checked pieces, the call's dedup flag).
BatchPlan call_plan(const Pieces& c, bool dedup) { return batch_plan(piece_table(c, dedup)); }

// The heads, the moves and the seals of `plan` go to the device in one copy; then every move,
// every frame's CRC32C and its seal, one launch each.
void assemble_frames(const FramesPlan& frames, const std::vector<uint64_t>& payload_bytes,
                     const std::vector<uint64_t>& slot, const CallBuffers& buf, uint8_t* out_dev,
                     cudaStream_t stream) {
  const FrameMoves m = frame_moves(frames, payload_bytes, slot);
  if (frames.heads.size() > buf.heads_cap || m.copies.size() > buf.copies_cap ||
      m.seals.size() > buf.seals_cap)
    throw CodecError("frame heads or moves outgrow their reserved room");
  // Heads, copies and seals lie back to back in the workspace (reserve order), so one
  // host-to-device copy of a staged image takes them all.
  const uint64_t copies_at = (uint64_t)((uint8_t*)buf.copies - buf.heads);
  const uint64_t seals_at = (uint64_t)((uint8_t*)buf.seals - buf.heads);
  if (m.copies.empty()) return;
  std::vector<uint8_t> image(seals_at + m.seals.size() * sizeof(FrameSeal));
  memcpy(image.data(), frames.heads.data(), frames.heads.size());
  memcpy(image.data() + copies_at, m.copies.data(), m.copies.size() * sizeof(FrameCopy));
  memcpy(image.data() + seals_at, m.seals.data(), m.seals.size() * sizeof(FrameSeal));
  upload(buf.heads, image.data(), image.size(), stream);
  uint64_t longest = 0, largest = 0;
  for (const FrameCopy& c : m.copies) longest = std::max(longest, c.len);
  for (const FrameSeal& f : m.seals) largest = std::max(largest, f.total);
  copy_moves_dev(buf.copies, m.copies.size(), longest, buf.heads, buf.enc.slots, out_dev, stream);
  if (!m.seals.empty())
    seal_frames_dev(out_dev, buf.seals, m.seals.size(), largest, buf.terms, stream);
}

// Codes the pieces on the device and writes one frame a group into out_dev (prefix_bytes
// left before each group, as compress_into_cpu lays them out). empty_trailing: the trailing
// dims of an empty group's frame (it gets one only with an extension). fits(total) throws when
// the layout's `total` bytes do not fit the caller's buffer. scratch: the caller's device
// memory for the call (null: the pool's), at least scratch_bytes_of(c, dedup, groups.size()).
template <typename Fits>
Layout encode_frames(const uint8_t* in_dev, const Pieces& c, bool dedup,
                     const std::vector<int64_t>& groups, uint64_t prefix_bytes,
                     const std::string& ext, const std::vector<int64_t>& empty_trailing,
                     uint8_t dtype, uint8_t* out_dev, void* scratch, uint64_t scratch_bytes,
                     cudaStream_t stream, Fits fits) {
  const size_t n = c.shapes.size();
  BatchPlan plan = call_plan(c, dedup);
  Workspace ws(stream, scratch, scratch_bytes);
  CallBuffers buf;
  buf.reserve(plan, groups.size(), &ws);
  ws.allocate();
  const std::vector<SegmentResult> res = encode_batch(plan, buf.enc, in_dev, dtype, stream);
  std::vector<SegmentDesc> descs(n);
  std::vector<uint32_t> seeds(n);
  std::vector<uint64_t> payload_bytes(n), slot(n);
  for (size_t i = 0; i < n; ++i) {
    seeds[i] = c.params[i].dither_seed;
    const SegmentResult& r = res[i];
    // The device found the bound overflowing: the rule again on its range throws the CPU
    // encoder's ArgumentError.
    if (r.bound_overflow) absolute_bound(c.params[i], r.lo, r.hi);
    descs[i] = descriptor_of(r, c.params[i].mode, c.shapes[i]);
    payload_bytes[i] = r.payload_bytes;
    slot[i] = plan.table.pieces[i].slot;
  }
  const FramesPlan frames =
      plan_device_frames(descs, c.shapes, groups, prefix_bytes, ext, empty_trailing, dtype, seeds);
  fits(frames.end);
  assemble_frames(frames, payload_bytes, slot, buf, out_dev, stream);
  Layout lay;
  lay.sizes = frames.sizes;
  lay.group_bytes = frames.group_bytes;
  return lay;
}

// Device scratch of encode_frames for these pieces (bytes): the same reservations, not
// allocated.
uint64_t scratch_bytes_of(const Pieces& c, bool dedup, size_t n_groups) {
  BatchPlan plan = call_plan(c, dedup);
  Workspace ws(nullptr);
  CallBuffers buf;
  buf.reserve(plan, n_groups, &ws);
  return ws.bytes();
}

// compress_cuda's one piece of any shape (plan_pieces cuts dim 0, and a 0-d tensor has none).
Pieces one_piece(const CompressParams& p, const std::vector<int64_t>& shape) {
  for (int64_t s : shape)
    if (s < 0) throw ArgumentError("negative dimension " + std::to_string(s) + " in shape");
  Pieces c;
  c.params = {p};
  c.shapes = {shape};
  c.in_off = {0};
  return c;
}

}  // namespace
}  // namespace gpu

std::vector<uint64_t> compress_into_cuda(const void* input_dev, const CompressParams& p,
                                         const GroupedCall& call, uint8_t* out_dev,
                                         uint64_t out_cap, void* stream_v,
                                         std::vector<uint64_t>* group_bytes, void* scratch_dev,
                                         uint64_t scratch_bytes) {
  using namespace gpu;
  check_device_params(p);
  const Pieces c = plan_grouped(p, call, out_cap);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  DeviceScope scope(out_dev, "the output buffer");
  Layout lay = encode_frames(static_cast<const uint8_t*>(input_dev), c, p.dedup, call.groups,
                             call.prefix_bytes, call.ext, call.trailing, p.dtype, out_dev,
                             scratch_dev, scratch_bytes, stream, [](uint64_t) {});
  if (group_bytes) *group_bytes = lay.group_bytes;
  return lay.sizes;
}

uint64_t compress_into_cuda_scratch(const CompressParams& p, const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& trailing,
                                    const std::vector<double>& error_bounds, size_t n_groups) {
  gpu::check_device_params(p);
  return gpu::scratch_bytes_of(plan_pieces(p, rows, trailing, error_bounds), p.dedup, n_groups);
}

uint64_t compress_cuda(const void* input_dev, const CompressParams& p,
                       const std::vector<int64_t>& shape, uint8_t* out_dev, uint64_t out_cap,
                       void* stream_v, void* scratch_dev, uint64_t scratch_bytes) {
  using namespace gpu;
  check_device_params(p);
  const Pieces c = one_piece(p, shape);
  DeviceScope scope(out_dev, "the output buffer");
  const Layout lay = encode_frames(static_cast<const uint8_t*>(input_dev), c, p.dedup, {1}, 0,
                                   std::string(), {}, p.dtype, out_dev, scratch_dev,
                                   scratch_bytes, static_cast<cudaStream_t>(stream_v),
                                   [&](uint64_t bytes) {
                                     if (bytes > out_cap)
                                       throw ArgumentError(
                                           "output buffer holds " + std::to_string(out_cap) +
                                           " bytes, the frame needs " + std::to_string(bytes));
                                   });
  return lay.group_bytes[0];
}

uint64_t compress_cuda_scratch(const CompressParams& p, const std::vector<int64_t>& shape) {
  gpu::check_device_params(p);
  return gpu::scratch_bytes_of(gpu::one_piece(p, shape), p.dedup, 1);
}

}  // namespace hl
