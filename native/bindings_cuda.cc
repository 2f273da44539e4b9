// The CUDA half of hvd_lossy._C (compiled only with HL_WITH_CUDA): the arguments of the CPU
// compress / compress_into / decompress in bindings.cc, with the caller's CUDA stream
// (torch.cuda.current_stream().cuda_stream, an integer) in place of the thread count. Pointers
// are device pointers (torch's data_ptr()); the GIL is released while the codec works.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include "bindings_util.h"
#include "codec_cuda.h"

namespace py = pybind11;

namespace {

using hl::py_util::params;
using hl::py_util::ptr;

}  // namespace

void register_cuda(py::module_& m) {
  m.def("compress_cuda",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& shape, double eb, int mode,
           bool dedup, uintptr_t out, uint64_t out_cap, uintptr_t stream, int64_t dither_seed,
           uintptr_t scratch, uint64_t scratch_bytes) {
          return hl::compress_cuda(ptr<const void>(in),
                                   params(dtype, mode, 1, dedup, eb, dither_seed), shape,
                                   ptr<uint8_t>(out), out_cap, ptr<void>(stream),
                                   ptr<void>(scratch), scratch_bytes);
        },
        py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("error_bound"),
        py::arg("mode"), py::arg("dedup"), py::arg("out"), py::arg("out_cap"), py::arg("stream"),
        py::arg("dither_seed") = -1, py::arg("scratch") = 0, py::arg("scratch_bytes") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "CUDA compress at level 1 (dither_seed -1: no dither): one device tensor into a frame "
        "of one segment on the device; returns its size. scratch: device memory of at least "
        "compress_cuda_scratch bytes (0: the codec's own pool).");

  m.def("compress_cuda_scratch",
        [](int dtype, const std::vector<int64_t>& shape, int mode, bool dedup,
           int64_t dither_seed) {
          return hl::compress_cuda_scratch(params(dtype, mode, 1, dedup, 0.0, dither_seed), shape);
        },
        py::arg("dtype"), py::arg("shape"), py::arg("mode"), py::arg("dedup"),
        py::arg("dither_seed") = -1,
        "Bytes of device scratch a compress_cuda call of these arguments needs.");

  m.def("compress_into_cuda",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& rows,
           const std::vector<int64_t>& trailing, const std::vector<double>& ebs, int mode,
           bool dedup, const std::vector<int64_t>& groups, uint64_t prefix_bytes, uintptr_t out,
           uint64_t out_cap, uintptr_t stream, const std::string& ext, int64_t dither_seed,
           uintptr_t scratch, uint64_t scratch_bytes) {
          hl::CompressParams p = params(dtype, mode, 1, dedup, 0.0, dither_seed);
          std::vector<uint64_t> group_bytes;
          std::vector<uint64_t> sizes =
              hl::compress_into_cuda(ptr<const void>(in), p,
                                     {rows, trailing, ebs, groups, prefix_bytes, ext},
                                     ptr<uint8_t>(out), out_cap, ptr<void>(stream), &group_bytes,
                                     ptr<void>(scratch), scratch_bytes);
          return std::make_pair(sizes, group_bytes);
        },
        py::arg("input"), py::arg("dtype"), py::arg("rows"), py::arg("trailing"),
        py::arg("error_bounds"), py::arg("mode"), py::arg("dedup"), py::arg("groups"),
        py::arg("prefix_bytes"), py::arg("out"), py::arg("out_cap"), py::arg("stream"),
        py::arg("extension"), py::arg("dither_seed") = -1, py::arg("scratch") = 0,
        py::arg("scratch_bytes") = 0, py::call_guard<py::gil_scoped_release>(),
        "CUDA compress_into at level 1 (dither_seed: piece 0's, piece i's is + i; -1: no "
        "dither): one frame a group in device memory, laid out as the CPU's, every piece coded "
        "by one set of launches; returns (sizes a piece, frame bytes a group). scratch: device "
        "memory of at least compress_into_cuda_scratch bytes (0: the codec's own pool).");

  m.def("compress_into_cuda_scratch",
        [](int dtype, const std::vector<int64_t>& rows, const std::vector<int64_t>& trailing,
           const std::vector<double>& ebs, int mode, bool dedup, size_t n_groups,
           int64_t dither_seed) {
          return hl::compress_into_cuda_scratch(params(dtype, mode, 1, dedup, 0.0, dither_seed),
                                                rows, trailing, ebs, n_groups);
        },
        py::arg("dtype"), py::arg("rows"), py::arg("trailing"), py::arg("error_bounds"),
        py::arg("mode"), py::arg("dedup"), py::arg("n_groups"), py::arg("dither_seed") = -1,
        "Bytes of device scratch a compress_into_cuda call of these arguments needs.");

  m.def("decompress_cuda",
        [](uintptr_t frame, uint64_t size, uintptr_t out, uint64_t out_bytes, uintptr_t stream,
           bool verify) {
          hl::decompress_cuda(ptr<const uint8_t>(frame), size, ptr<void>(out), out_bytes,
                              ptr<void>(stream), verify);
        },
        py::arg("frame"), py::arg("size"), py::arg("out"), py::arg("out_bytes"),
        py::arg("stream"), py::arg("verify") = true, py::call_guard<py::gil_scoped_release>(),
        "CUDA decompress: a device frame into a device buffer of out_bytes; raises FrameError "
        "(ValueError) for a corrupted frame. verify=False: verify_cuda already checked it.");

  m.def("decompress_batched_cuda",
        [](uintptr_t buffer, uint64_t size,
           const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& frames, uintptr_t out,
           uint64_t out_bytes, uintptr_t stream, bool verify, const py::object& alloc) {
          std::vector<hl::FramePlace> places(frames.size());
          for (size_t i = 0; i < frames.size(); ++i)
            places[i] = {std::get<0>(frames[i]), std::get<1>(frames[i]), std::get<2>(frames[i])};
          // `alloc` is referenced, not copied: its reference count must not change without
          // the GIL, and the argument outlives the call.
          hl::DeviceAlloc scratch;
          if (!alloc.is_none())
            scratch = [&alloc](uint64_t bytes) {
              py::gil_scoped_acquire gil;
              return ptr<void>(alloc(bytes).cast<uintptr_t>());
            };
          hl::decompress_batched_cuda(ptr<const uint8_t>(buffer), size, places, ptr<void>(out),
                                      out_bytes, ptr<void>(stream), verify, scratch);
        },
        py::arg("buffer"), py::arg("size"), py::arg("frames"), py::arg("out"),
        py::arg("out_bytes"), py::arg("stream"), py::arg("verify") = true,
        py::arg("alloc") = py::none(), py::call_guard<py::gil_scoped_release>(),
        "CUDA decompress of level-1 frames, each (offset, bytes, first output element) of the "
        "device buffer, with one launch set for all their segments, into one device buffer of "
        "out_bytes (outputs in order, not overlapping); raises FrameError (ValueError) for a "
        "corrupted frame, naming it, ValueError for a level-2 segment or an entropy-coded or "
        "bucketed map. alloc: a callable (bytes -> device pointer, int) for the call's device "
        "scratch, usable in the stream's order and kept alive by the caller until the call "
        "returns (None: the codec's own pool). Not yet run on a GPU.");

  m.def("verify_cuda",
        [](uintptr_t frame, uint64_t size, uintptr_t stream) {
          hl::verify_cuda(ptr<const uint8_t>(frame), size, ptr<void>(stream));
        },
        py::arg("frame"), py::arg("size"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(),
        "Size and CRC32C of a device frame verified on the device before anything is "
        "allocated for it; raises FrameError (ValueError).");

  m.def("crc32c_cuda",
        [](uintptr_t data, uint64_t size, uintptr_t stream) {
          return hl::crc32c_cuda(ptr<const uint8_t>(data), size, ptr<void>(stream));
        },
        py::arg("data"), py::arg("size"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(), "CRC32C of device bytes, computed on the device.");
}
