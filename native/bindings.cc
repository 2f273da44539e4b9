// pybind11 module hvd_lossy._C: converts arguments, releases the GIL, calls the codec. Tensors
// cross as raw data pointers (torch's data_ptr()), so the module needs no torch headers.
#include <iterator>
#include <tuple>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings_util.h"
#include "codec.h"
#include "frame_io.h"
#include "kernels_cpu.h"
#include "keyed.h"
#include "output_blocks.h"
#include "pack.h"
#include "parallel.h"
#include "reuse.h"
#include "segment_table.h"  // batch_unsupported

namespace py = pybind11;

namespace {

using hl::py_util::params;
using hl::py_util::ptr;

// frame_info: the frame's fields and one dict a segment.
py::dict frame_dict(const hl::FrameView& f) {
  py::dict d;
  d["format"] = 2;
  d["dtype_code"] = (int)f.dtype;
  d["shape"] = f.shape();
  d["frame_bytes"] = f.total_bytes;
  d["header_bytes"] = f.header_bytes;
  d["checksum"] = f.crc;
  d["extension"] = f.ext ? py::object(py::bytes(reinterpret_cast<const char*>(f.ext), f.ext_bytes))
                         : py::object(py::none());
  py::list segs;
  uint64_t n_outliers = 0;
  for (size_t k = 0; k < f.segs.size(); ++k) {
    const hl::SegmentView& s = f.segs[k];
    py::dict e;
    e["rows"] = s.dim0;
    e["level"] = (int)s.level;
    e["mode"] = s.rel ? "rel" : "abs";
    e["lossless"] = s.lossless;
    e["dither_seed"] = s.dithered ? py::cast(s.seed) : py::none();
    e["eb_abs"] = s.eb_abs;
    e["n_rows"] = s.n_rows;
    e["row_len"] = s.row_len;
    e["n_unique"] = s.n_unique;
    e["n_outliers"] = s.n_outliers;
    e["map_bytes"] = s.map_bytes;
    e["map_coded"] = s.map_rans;
    e["map_bucketed"] = s.map_buckets;
    // level 2: whether its code section borrows an earlier section's rANS table (frame.h)
    e["table_borrowed"] = s.table != nullptr;
    // lossy level 1: radix packing's K and group size (frame.h), None for block packing
    e["radix"] = s.radix_k ? py::cast(s.radix_k) : py::none();
    e["radix_group"] = s.radix_k ? py::cast(s.radix_g) : py::none();
    e["short_blocks"] = s.short_blocks;  // lossy level 1: a short-block code section (frame.h)
    e["code_bytes"] = s.code_bytes;
    e["outlier_bytes"] = s.outlier_bytes;
    e["segment_bytes"] = s.bytes;
    n_outliers += s.n_outliers;
    segs.append(e);
  }
  d["segments"] = segs;
  d["n_outliers"] = n_outliers;
  return d;
}

// A uint8 numpy array of the first `bytes` of a block the codec owns; the array's destructor
// gives the block back (hl::release_output), so the block is reused only once nothing
// references it.
py::array_t<uint8_t> block_array(const hl::OutputBlock& block, uint64_t bytes) {
  hl::OutputBlock* owned = new hl::OutputBlock(block);
  py::capsule owner(owned, [](void* p) {
    auto* b = static_cast<hl::OutputBlock*>(p);
    hl::release_output(*b);
    delete b;
  });
  return py::array_t<uint8_t>({(py::ssize_t)bytes}, {(py::ssize_t)1},
                              static_cast<uint8_t*>(block.data), owner);
}

// Runs a codec call that asks for its output memory once (alloc), GIL released; returns the
// result and the memory as an array. A failure after the block was taken gives it back.
template <class Call>
auto with_new_block(Call call) {
  hl::OutputBlock block;
  uint64_t total = 0;
  auto alloc = [&](uint64_t bytes) {
    total = bytes;
    block = hl::acquire_output(bytes);
    return static_cast<uint8_t*>(block.data);
  };
  decltype(call(alloc)) result;
  {
    py::gil_scoped_release nogil;
    try {
      result = call(alloc);
    } catch (...) {
      hl::release_output(block);
      throw;
    }
  }
  return std::make_pair(block_array(block, total), std::move(result));
}

// (dtype code, ndim, trailing, rows, frame bytes, header bytes, extension or None) of the
// frame filling [offset, offset + length) exactly; its CRC32C too when verify.
py::object chunk_head(const uint8_t* buffer, uint64_t offset, uint64_t length, bool verify) {
  const uint8_t* p = buffer + offset;
  const hl::FrameView f = hl::parse_frame(p, hl::checked_frame_bytes(p, length));
  if (f.total_bytes != length)
    throw hl::FrameError("frame is truncated or has trailing bytes: a chunk of " +
                         std::to_string(length) + " bytes, its frame says " +
                         std::to_string(f.total_bytes));
  if (verify) hl::verify_frame(f, p);
  py::object ext = f.ext ? py::object(py::bytes(reinterpret_cast<const char*>(f.ext), f.ext_bytes))
                         : py::object(py::none());
  return py::make_tuple((int)f.dtype, f.ndim, f.trailing, f.rows, f.total_bytes, f.header_bytes,
                        ext);
}

// What the device receive path reads of a frame of `size` bytes from its first `avail` bytes
// at p (parse_frame_head): (dtype code, ndim, trailing, rows, frame bytes, header bytes,
// extension or None, why the batched device decoder cannot read it ("" when it can), whether
// a row map is bucketed, whether a segment is dithered, its segments); or, when the descriptors may lie past
// avail, the bytes that hold them (an int).
py::object frame_head(const uint8_t* p, uint64_t avail, uint64_t size) {
  uint64_t need = 0;
  const hl::FrameView f = hl::parse_frame_head(p, avail, size, &need);
  if (need > avail) return py::int_(need);
  std::string refusal;
  bool bucketed = false, dithered = false;
  for (size_t k = 0; k < f.segs.size(); ++k) {
    const std::string why = hl::batch_unsupported(f.segs[k]);
    if (refusal.empty() && !why.empty()) refusal = "segment " + std::to_string(k) + ": " + why;
    bucketed |= f.segs[k].map_buckets;
    dithered |= f.segs[k].dithered;
  }
  py::object ext = f.ext ? py::object(py::bytes(reinterpret_cast<const char*>(f.ext), f.ext_bytes))
                         : py::object(py::none());
  return py::make_tuple((int)f.dtype, f.ndim, f.trailing, f.rows, f.total_bytes, f.header_bytes,
                        ext, refusal, bucketed, dithered, f.segs.size());
}

// Whether every frame is (r_k, *trailing) of one dtype, with rows of at least one element (the
// pieces of one tensor, as compress_chunks makes them); sets trailing.
bool uniform_rows(const std::vector<hl::ParsedFrame>& frames, std::vector<int64_t>* trailing) {
  for (size_t k = 0; k < frames.size(); ++k) {
    const auto& f = frames[k];
    if (f.shape.empty() || f.frame.dtype != frames[0].frame.dtype) return false;
    if (!std::equal(f.shape.begin() + 1, f.shape.end(), frames[0].shape.begin() + 1,
                    frames[0].shape.end()))
      return false;
  }
  if (frames.empty()) return false;
  trailing->assign(frames[0].shape.begin() + 1, frames[0].shape.end());
  for (int64_t t : *trailing)
    if (t == 0) return false;  // rows of no elements: a view(-1, ...) could not infer the rows
  return true;
}

// Decodes back-to-back frames into one block of memory the codec owns, handed to Python as a
// uint8 array. Returns (array, [(dtype_code, shape, byte offset), ...], trailing): trailing is
// the shared trailing shape when every frame is (r_k, *trailing) of one dtype, and then the
// parts lie back to back with no padding (so Python can cut them with one split); otherwise
// None, and each part starts on a cache line. One call, GIL released while it works.
// max_output: the most bytes the frames may decode to. They are checked when the block is
// asked for, after every checksum: a sealed frame can legitimately announce terabytes (a row
// map of duplicates costs about a bit a row), and the limit turns that into a FrameError
// instead of an allocation failure.
py::tuple decode_frames_new(uintptr_t buffer, uint64_t len, const py::object& sizes_obj,
                            int threads, uint64_t max_output) {
  std::vector<uint64_t> sizes;
  const bool have_sizes = !sizes_obj.is_none();
  if (have_sizes) sizes = sizes_obj.cast<std::vector<uint64_t>>();
  std::vector<uint64_t> offsets;
  std::vector<hl::ParsedFrame> frames;
  std::vector<int64_t> trailing;
  bool uniform = false;
  auto done = with_new_block([&](const std::function<uint8_t*(uint64_t)>& alloc) {
    hl::parallel::prewake(hl::resolve_threads(threads));  // while the headers are read
    frames = hl::parse_frames(ptr<const uint8_t>(buffer), len, have_sizes ? &sizes : nullptr);
    uniform = uniform_rows(frames, &trailing);
    const uint64_t align = uniform ? hl_elem_bytes(frames[0].frame.dtype) : 64;
    auto limited = [&](uint64_t bytes) {
      if (bytes > max_output)
        throw hl::FrameError("the frames announce " + std::to_string(bytes) +
                             " bytes of output, more than max_output_bytes (" +
                             std::to_string(max_output) +
                             "; hvd_lossy.set_max_output_bytes changes it)");
      return alloc(bytes);
    };
    hl::decompress_frames_cpu(ptr<const uint8_t>(buffer), frames, align, limited, &offsets,
                              threads);
    return 0;
  });
  py::list parts;
  for (size_t k = 0; k < frames.size(); ++k)
    parts.append(py::make_tuple((int)frames[k].frame.dtype, frames[k].shape, offsets[k]));
  return py::make_tuple(done.first, parts, uniform ? py::cast(trailing) : py::none());
}

// Reuse (native/cpu/reuse.h): pieces as (start, rows, group, cache, eb_param, lossless) and
// caches as (records address, capacity, stride), as hvd_lossy.reuse passes them.
using ReusePieceArg = std::tuple<uint64_t, uint64_t, int64_t, int64_t, double, bool>;
using ReuseCacheArg = std::tuple<uintptr_t, uint64_t, uint64_t>;

std::vector<hl::reuse::Piece> reuse_pieces(const std::vector<ReusePieceArg>& args) {
  std::vector<hl::reuse::Piece> out(args.size());
  for (size_t k = 0; k < args.size(); ++k)
    std::tie(out[k].start, out[k].rows, out[k].group, out[k].cache, out[k].eb_param,
             out[k].lossless) = args[k];
  return out;
}

std::vector<hl::reuse::Cache> reuse_caches(const std::vector<ReuseCacheArg>& args) {
  std::vector<hl::reuse::Cache> out(args.size());
  for (size_t k = 0; k < args.size(); ++k)
    out[k] = {ptr<uint8_t>(std::get<0>(args[k])), std::get<1>(args[k]), std::get<2>(args[k])};
  return out;
}

// A reuse pass over (rows, dtype, ids, n_rows, row_len, pieces, caches, *more), without the GIL.
template <class F, class... More>
void def_reuse_pass(py::module_& m, const char* name, F f, const char* doc, More... more) {
  m.def(name, f, py::arg("rows"), py::arg("dtype"), py::arg("ids"), py::arg("n_rows"),
        py::arg("row_len"), py::arg("pieces"), py::arg("caches"), more...,
        py::call_guard<py::gil_scoped_release>(), doc);
}

}  // namespace

#ifdef HL_WITH_CUDA
void register_cuda(py::module_& m);
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "hvd_lossy native codec (CPU; CUDA when built with it)";
  py::register_exception<hl::FrameError>(m, "FrameError", PyExc_ValueError);
  py::register_exception<hl::CodecError>(m, "CodecError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hl::ArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.attr("FORMAT_VERSION") = HL_FRAME_VERSION;
  m.attr("MAX_EXTENSION_BYTES") = HL_FRAME_MAX_EXT;
#ifdef HL_WITH_CUDA
  m.attr("WITH_CUDA") = true;
  register_cuda(m);
#else
  m.attr("WITH_CUDA") = false;
#endif

  m.def("max_frame_bytes",
        [](uint64_t rows, uint64_t row_len) { return hl_max_frame_bytes(rows, row_len); },
        py::arg("rows"), py::arg("row_len"),
        "Worst-case size in bytes of a frame of one segment of rows x row_len elements.");

  m.def("frame_info",
        [](uintptr_t frame, uint64_t size) {
          return frame_dict(hl::parse_frame(ptr<const uint8_t>(frame), size));
        },
        py::arg("frame"), py::arg("size"), "Validated header of a frame as a dict.");

  m.def("frame_bytes",
        [](uintptr_t frame, uint64_t avail) {
          return hl::checked_frame_bytes(ptr<const uint8_t>(frame), avail);
        },
        py::arg("frame"), py::arg("avail"),
        "Size of the frame starting at `frame` (for walking back-to-back frames).");

  m.def("decompress",
        [](uintptr_t frame, uint64_t size, uintptr_t out, uint64_t out_bytes, int threads) {
          hl::decompress_cpu(ptr<const uint8_t>(frame), size, ptr<void>(out), out_bytes, threads);
        },
        py::arg("frame"), py::arg("size"), py::arg("out"), py::arg("out_bytes"),
        py::arg("threads") = 0, py::call_guard<py::gil_scoped_release>(),
        "Decodes a frame into a buffer of out_bytes.");

  m.def("decompress_as",
        [](uintptr_t frame, uint64_t size, int dtype, const std::vector<int64_t>& shape,
           uintptr_t out, uint64_t out_bytes, int threads) {
          return hl::decompress_as_cpu(ptr<const uint8_t>(frame), size, (uint8_t)dtype, shape,
                                       ptr<void>(out), out_bytes, threads);
        },
        py::arg("frame"), py::arg("size"), py::arg("dtype"), py::arg("shape"), py::arg("out"),
        py::arg("out_bytes"), py::arg("threads") = 0, py::call_guard<py::gil_scoped_release>(),
        "Decodes a frame into a buffer of out_bytes when it holds that dtype code and shape; "
        "False, decoding nothing, when it does not.");

  m.def("compress_into",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& rows,
           const std::vector<int64_t>& trailing, const std::vector<double>& ebs, int mode,
           int level, bool dedup, const std::vector<int64_t>& groups, uint64_t prefix_bytes,
           uintptr_t out, uint64_t out_cap, int threads, int64_t dither_seed,
           const std::string& ext, uintptr_t stats, uintptr_t ids, uintptr_t zero_rows) {
          std::vector<uint64_t> group_bytes;
          hl::CompressParams p = params(dtype, mode, level, dedup, 0.0, dither_seed);
          p.ids = ptr<const int64_t>(ids);
          p.zero_rows = ptr<const uint8_t>(zero_rows);
          std::vector<uint64_t> sizes = hl::compress_into_cpu(
              ptr<const void>(in), p, {rows, trailing, ebs, groups, prefix_bytes, ext},
              ptr<uint8_t>(out), out_cap, threads, ext.empty() ? nullptr : &group_bytes,
              ptr<double>(stats));
          sizes.insert(sizes.end(), group_bytes.begin(), group_bytes.end());
          return sizes;
        },
        py::arg("input"), py::arg("dtype"), py::arg("rows"), py::arg("trailing"),
        py::arg("error_bounds"), py::arg("mode"), py::arg("level"), py::arg("dedup"),
        py::arg("groups"), py::arg("prefix_bytes"), py::arg("out"), py::arg("out_cap"),
        py::arg("threads") = 0, py::arg("dither_seed") = -1,
        py::arg("extension") = std::string(), py::arg("stats") = 0, py::arg("ids") = 0,
        py::arg("zero_rows") = 0, py::call_guard<py::gil_scoped_release>(),
        "compress_many with the pieces in groups, one frame a group, prefix_bytes left untouched "
        "before each group: out holds [prefix][frame of group 0][prefix][frame of group 1]... "
        "with no gaps. Returns a size a piece (its segment, a group's first also counting the "
        "frame header); with an extension every group's frame, an empty group's too, carries "
        "it, and the sizes are followed by each group's frame size. "
        "stats, when not 0, is the address of STATS_PER_PIECE doubles a piece the codec fills "
        "with what it learnt (STAT_MIN, STAT_MAX, STAT_UNIQUE; NaN where not computed). "
        "ids, when not 0, is the address of one int64 key per row of dim 0 (pieces of shape "
        "(rows, row_len) only): rows of a piece with equal keys are duplicates once their "
        "bits are confirmed equal (the same frames, found without hashing rows). "
        "zero_rows, when not 0 (with ids), is the address of one byte a row, nonzero for a row "
        "the caller has filled with +0.0: those of a piece are taken as one row unread "
        "(CompressParams::zero_rows; hvd_lossy.reuse's references).");
  m.attr("STATS_PER_PIECE") = (int)hl::HL_STATS_PER_PIECE;
  m.attr("STAT_MIN") = (int)hl::HL_STAT_MIN;
  m.attr("STAT_MAX") = (int)hl::HL_STAT_MAX;
  m.attr("STAT_UNIQUE") = (int)hl::HL_STAT_UNIQUE;
  m.attr("STAT_FINITE") = (int)hl::HL_STAT_FINITE;
  m.attr("STAT_SUM") = (int)hl::HL_STAT_SUM;
  m.attr("STAT_SUMSQ") = (int)hl::HL_STAT_SUMSQ;

  m.def("piece_stats",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& rows,
           const std::vector<int64_t>& trailing, uintptr_t stats, int threads,
           bool range_only) {
          hl::piece_stats_cpu(ptr<const void>(in), (uint8_t)dtype, rows, trailing,
                              ptr<double>(stats), threads, range_only);
        },
        py::arg("input"), py::arg("dtype"), py::arg("rows"), py::arg("trailing"),
        py::arg("stats"), py::arg("threads") = 0, py::arg("range_only") = false,
        py::call_guard<py::gil_scoped_release>(),
        "Fills STATS_PER_PIECE doubles a piece at stats with its statistics without coding it: "
        "every column, or with range_only STAT_MIN and STAT_MAX alone (the others NaN).");

  m.def("max_grouped_bytes", &hl::max_grouped_bytes, py::arg("rows"), py::arg("trailing"),
        py::arg("groups"), py::arg("prefix_bytes"),
        "Capacity compress_into needs: every group's prefix and worst-case frame header, every "
        "piece's worst-case segment.");

  m.def("decompress_into",
        [](uintptr_t buffer, uint64_t buffer_len, const std::vector<std::tuple<uint64_t, uint64_t, int64_t>>& srcs,
           int dtype, const std::vector<int64_t>& trailing, uintptr_t out, uint64_t out_bytes,
           int threads) {
          std::vector<hl::DecodeSource> sources;
          sources.reserve(srcs.size());
          for (const auto& s : srcs)
            sources.push_back({std::get<0>(s), std::get<1>(s), std::get<2>(s)});
          if (dtype < 0 || dtype > 255)
            throw hl::ArgumentError("unsupported dtype code " + std::to_string(dtype));
          std::vector<std::string> errors;
          std::vector<uint8_t> mismatched;
          {
            py::gil_scoped_release nogil;
            errors = hl::decompress_into_cpu(ptr<const uint8_t>(buffer), buffer_len, sources,
                                             (uint8_t)dtype, trailing, ptr<void>(out), out_bytes,
                                             threads, &mismatched);
          }
          py::list result;
          for (size_t i = 0; i < errors.size(); ++i)
            result.append(errors[i].empty()
                              ? py::object(py::none())
                              : py::object(py::make_tuple(errors[i], bool(mismatched[i]))));
          return result;
        },
        py::arg("buffer"), py::arg("buffer_len"), py::arg("sources"), py::arg("dtype"),
        py::arg("trailing"), py::arg("out"), py::arg("out_bytes"), py::arg("threads") = 0,
        "Decodes each source's back-to-back frames (offset, length, rows) straight into out at "
        "consecutive rows; returns one entry per source: None, or (why it failed, whether "
        "its frames were well formed but disagree with the dtype, row shape or rows asked).");

  m.def("compress_new",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& shape, double eb, int mode,
           int level, bool dedup, int threads, int64_t dither_seed) {
          const hl::CompressParams p = params(dtype, mode, level, dedup, eb, dither_seed);
          return with_new_block([&](const std::function<uint8_t*(uint64_t)>& alloc) {
                   return hl::compress_shape_alloc_cpu(ptr<const void>(in), p, shape, alloc,
                                                       threads);
                 }).first;
        },
        py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("error_bound"),
        py::arg("mode"), py::arg("level"), py::arg("dedup"), py::arg("threads") = 0,
        py::arg("dither_seed") = -1,
        "compress into new memory of exactly the frame's size: a uint8 array.");

  m.def("compress_many_new",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& rows,
           const std::vector<int64_t>& trailing, const std::vector<double>& ebs, int mode,
           int level, bool dedup, int threads, int64_t dither_seed, uintptr_t ids,
           uintptr_t zero_rows) {
          hl::CompressParams p = params(dtype, mode, level, dedup, 0.0, dither_seed);
          p.ids = ptr<const int64_t>(ids);
          p.zero_rows = ptr<const uint8_t>(zero_rows);
          auto done = with_new_block([&](const std::function<uint8_t*(uint64_t)>& alloc) {
            return hl::compress_alloc_cpu(ptr<const void>(in), p, rows, trailing, ebs, alloc,
                                          threads);
          });
          return py::make_tuple(done.first, done.second);
        },
        py::arg("input"), py::arg("dtype"), py::arg("rows"), py::arg("trailing"),
        py::arg("error_bounds"), py::arg("mode"), py::arg("level"), py::arg("dedup"),
        py::arg("threads") = 0, py::arg("dither_seed") = -1, py::arg("ids") = 0,
        py::arg("zero_rows") = 0,
        "compress_many into new memory of exactly the frame's size: (uint8 array, sizes); "
        "ids and zero_rows as for compress_into.");

  m.def("empty_block",
        [](uint64_t bytes) { return block_array(hl::acquire_output(bytes), bytes); },
        py::arg("bytes"),
        "A uint8 array of `bytes` on a block from the output cache (contents undefined), for "
        "a tensor the caller decodes into.");

  m.def("copy_into",
        [](uintptr_t dst, uintptr_t src, uint64_t bytes) {
          py::gil_scoped_release nogil;
          hl::cpu::copy_output(ptr<uint8_t>(dst), ptr<const uint8_t>(src), bytes);
        },
        py::arg("dst"), py::arg("src"), py::arg("bytes"),
        "Copies bytes from src to dst (which do not overlap), with streaming stores where a "
        "decode would use them: an all-to-all's own rows into its output.");

  m.def("decompress_frames", &decode_frames_new, py::arg("buffer"), py::arg("buffer_len"),
        py::arg("sizes") = py::none(), py::arg("threads") = 0,
        py::arg("max_output") = UINT64_MAX,
        "Decodes back-to-back frames into one new block: (uint8 array, [(dtype_code, shape, "
        "offset)]); FrameError when they would decode to more than max_output bytes.");

  m.def("simd_level", &hl::cpu::simd_level,
        "Instruction set of the CPU kernels: 0 portable, 1 AVX2 with FMA, 2 AVX-512.");
  m.def("simd_forced", [] {
          std::vector<std::string> names;
          for (int k = 0; k < int(std::size(hl::cpu::kForcing)); ++k)
            if (hl::cpu::simd_forced() >> k & 1) names.push_back(hl::cpu::kForcing[k]);
          return names;
        },
        "The forcing variables (HVD_LOSSY_NO_AVX2, HVD_LOSSY_NO_AVX512) the kernels' choice "
        "read as forcing: set, and neither empty nor 0.");

  m.def("set_output_cache_bytes", &hl::set_output_cache_limit, py::arg("bytes"));
  m.def("output_cache_bytes", [] {
    return py::make_tuple(hl::output_cache_limit(), hl::output_cache_held());
  });

  m.def("chunk_heads",
        [](uintptr_t buffer, uint64_t buffer_len,
           const std::vector<std::pair<uint64_t, uint64_t>>& chunks, bool verify) {
          const uint8_t* buf = ptr<const uint8_t>(buffer);
          py::list out;
          for (size_t i = 0; i < chunks.size(); ++i) {
            const uint64_t offset = chunks[i].first, length = chunks[i].second;
            if (offset > buffer_len || length > buffer_len - offset)
              throw hl::ArgumentError("chunk " + std::to_string(i) + " spans bytes [" +
                                      std::to_string(offset) + ", " +
                                      std::to_string(offset + length) + "), past the buffer's " +
                                      std::to_string(buffer_len));
            try {
              out.append(chunk_head(buf, offset, length, verify));
            } catch (const hl::FrameError& e) {
              out.append(py::str(e.what()));
            }
          }
          return out;
        },
        py::arg("buffer"), py::arg("buffer_len"), py::arg("chunks"), py::arg("verify") = false,
        "For each (offset, length) chunk of buffer: the frame filling it exactly, as (dtype "
        "code, ndim, trailing, rows, frame bytes, header bytes, extension bytes or None), its "
        "CRC32C verified when verify; or the FrameError's message (str) when it is not one.");

  m.def("frame_heads",
        [](uintptr_t buffer, uint64_t buffer_len,
           const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& chunks) {
          const uint8_t* buf = ptr<const uint8_t>(buffer);
          py::list out;
          for (size_t i = 0; i < chunks.size(); ++i) {
            const auto [offset, avail, size] = chunks[i];
            if (offset > buffer_len || avail > buffer_len - offset || avail > size)
              throw hl::ArgumentError("chunk " + std::to_string(i) + " has bytes [" +
                                      std::to_string(offset) + ", +" + std::to_string(avail) +
                                      ") of its " + std::to_string(size) +
                                      ", expected them within the buffer's " +
                                      std::to_string(buffer_len) + " and the chunk");
            try {
              out.append(frame_head(buf + offset, avail, size));
            } catch (const hl::FrameError& e) {
              out.append(py::str(e.what()));
            }
          }
          return out;
        },
        py::arg("buffer"), py::arg("buffer_len"), py::arg("chunks"),
        "For each (offset, bytes present, chunk bytes) chunk of buffer, whose first bytes (a "
        "prefix of a device buffer's chunk copied to the host) lie at offset: the header and "
        "descriptors of the frame filling the chunk, as (dtype code, ndim, trailing, rows, "
        "frame bytes, header bytes, extension bytes or None, why the batched device decoder "
        "cannot read it or '', bucketed row map, dithered segment, segments); or the bytes its "
        "descriptors may need (int) when more than present; or the FrameError's message "
        "(str). The payloads are not read (nor the CRC32C).");

  m.def("empty_frame",
        [](int dtype, const std::vector<int64_t>& trailing, const std::string& ext) {
          if (dtype < 0 || dtype > HL_BFLOAT16)
            throw hl::ArgumentError("dtype code " + std::to_string(dtype) +
                                    ", expected 0 (float32), 1 (float16) or 2 (bfloat16)");
          if (trailing.size() + 1 > HL_MAX_NDIM)
            throw hl::ArgumentError(std::to_string(trailing.size()) + " trailing dims, at most " +
                                    std::to_string(HL_MAX_NDIM - 1));
          for (int64_t t : trailing)
            if (t < 0) throw hl::ArgumentError("negative dimension " + std::to_string(t));
          hl::FrameHead h;
          h.dtype = (uint8_t)dtype;
          h.ndim = 1 + (int)trailing.size();
          h.trailing = trailing;
          h.ext = ext;
          std::string out(hl::frame_size(h, {}, nullptr), '\0');
          hl::write_empty_frame(h, reinterpret_cast<uint8_t*>(&out[0]));
          return py::bytes(out);
        },
        py::arg("dtype"), py::arg("trailing"), py::arg("extension"),
        "A sealed frame of no segments, dtype x (0, *trailing), carrying the extension.");

  m.def("reuse_encode",
        [](uintptr_t x, int dtype, uintptr_t ids, uint64_t n_rows, uint64_t row_len, bool rel,
           const std::vector<ReusePieceArg>& pieces, const std::vector<ReuseCacheArg>& caches,
           const std::vector<uint8_t>& allow, uintptr_t residual, uintptr_t x_hat, uintptr_t hit,
           int threads) {
          const hl::reuse::EncodeResult r = hl::reuse::encode(
              (uint8_t)dtype, ptr<const void>(x), ptr<const int64_t>(ids), row_len, rel,
              reuse_pieces(pieces), reuse_caches(caches), allow, ptr<void>(residual),
              ptr<void>(x_hat), ptr<uint8_t>(hit), n_rows, threads);
          return std::make_tuple(r.eb, r.code_eb, r.references, r.residuals, r.predicted);
        },
        py::arg("x"), py::arg("dtype"), py::arg("ids"), py::arg("n_rows"), py::arg("row_len"),
        py::arg("rel"), py::arg("pieces"), py::arg("caches"), py::arg("allow"),
        py::arg("residual"), py::arg("x_hat"), py::arg("hit"), py::arg("threads") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "The sender's reuse pass over a call's pieces (native/cpu/reuse.h encode): residuals, "
        "X^ and a hit byte a row into the given buffers; returns (X's bound, the residual's "
        "bound, references, residuals) a piece and whether each group's frame predicts.");

  // The store's and the receiver's passes take the rows with their ids and the call's
  // pieces and caches first, as hvd_lossy.reuse passes them.
  def_reuse_pass(
      m, "reuse_store",
      [](uintptr_t rows, int dtype, uintptr_t ids, uint64_t n_rows, uint64_t row_len,
         const std::vector<ReusePieceArg>& pieces, const std::vector<ReuseCacheArg>& caches,
         uintptr_t hit) {
        hl::reuse::store((uint8_t)dtype, ptr<const void>(rows), ptr<const int64_t>(ids),
                         row_len, reuse_pieces(pieces), reuse_caches(caches), n_rows,
                         ptr<const uint8_t>(hit));
      },
      "Each piece's rows replace what its cache holds for their ids (the last row of a slot "
      "wins); hit: the address of reuse_encode's hit bytes for these rows (rows it marks as "
      "decoding to their held row are left as held), or 0.",
      py::arg("hit") = 0);

  def_reuse_pass(
      m, "reuse_apply",
      [](uintptr_t rows, int dtype, uintptr_t ids, uint64_t n_rows, uint64_t row_len,
         const std::vector<ReusePieceArg>& pieces, const std::vector<ReuseCacheArg>& caches,
         const std::vector<uint8_t>& predicted, int threads) {
        hl::reuse::apply((uint8_t)dtype, ptr<void>(rows), ptr<const int64_t>(ids), row_len,
                         reuse_pieces(pieces), reuse_caches(caches), predicted, n_rows, threads);
      },
      "The receiver's reuse pass: decoded residuals in rows become P + R^ where the group "
      "predicts and the cache holds the id, then replace what the caches hold.",
      py::arg("predicted"), py::arg("threads") = 0);

  m.def("number_keys",
        [](uintptr_t keys, const std::vector<int64_t>& seg_rows, uintptr_t inverse,
           uintptr_t first) {
          return hl::keyed::number_keys(ptr<const int64_t>(keys), seg_rows, ptr<int64_t>(inverse),
                                        ptr<int64_t>(first));
        },
        py::arg("keys"), py::arg("seg_rows"), py::arg("inverse"), py::arg("first"),
        py::call_guard<py::gil_scoped_release>(),
        "Each segment's distinct keys numbered by first occurrence (native/cpu/keyed.h "
        "number_keys): fills inverse and first (int64, one a row), returns each segment's "
        "count.");

  m.def("sum_rows",
        [](int dtype, uintptr_t rows, uint64_t row_len, uintptr_t inverse,
           const std::vector<int64_t>& seg_rows, uint64_t n_unique, uintptr_t out,
           uintptr_t spans) {
          hl::keyed::sum_rows((uint8_t)dtype, ptr<const void>(rows), row_len,
                              ptr<const int64_t>(inverse), seg_rows, n_unique, ptr<void>(out),
                              ptr<double>(spans));
        },
        py::arg("dtype"), py::arg("rows"), py::arg("row_len"), py::arg("inverse"),
        py::arg("seg_rows"), py::arg("n_unique"), py::arg("out"), py::arg("spans"),
        py::call_guard<py::gil_scoped_release>(),
        "Rows summed by number_keys' numbering, with each segment's finite range when spans "
        "is not 0 (native/cpu/keyed.h sum_rows).");

  m.def("expand_rows",
        [](int dtype, uintptr_t sums, uint64_t row_len, uintptr_t inverse, uintptr_t first,
           uint64_t n_rows, uint64_t n_unique, uintptr_t out) {
          hl::keyed::expand_rows((uint8_t)dtype, ptr<const void>(sums), row_len,
                                 ptr<const int64_t>(inverse), ptr<const int64_t>(first), n_rows,
                                 n_unique, ptr<void>(out));
        },
        py::arg("dtype"), py::arg("sums"), py::arg("row_len"), py::arg("inverse"),
        py::arg("first"), py::arg("n_rows"), py::arg("n_unique"), py::arg("out"),
        py::call_guard<py::gil_scoped_release>(),
        "Each number's sum on its first row, zeros elsewhere (native/cpu/keyed.h expand_rows).");

  m.def("reuse_slot", &hl::reuse::slot_of, py::arg("id"), py::arg("capacity"),
        "The cache slot of an id (native/cpu/reuse.h slot_of).");

  m.def("segments_lossless",
        [](uintptr_t buffer, const std::vector<std::pair<uint64_t, uint64_t>>& frames) {
          std::vector<std::vector<bool>> out;
          for (const auto& f : frames) {
            const hl::FrameView v = hl::parse_frame(ptr<const uint8_t>(buffer) + f.first, f.second);
            std::vector<bool> segs;
            for (const hl::SegmentView& s : v.segs) segs.push_back(s.lossless);
            out.push_back(segs);
          }
          return out;
        },
        py::arg("buffer"), py::arg("frames"),
        "For each (offset, bytes) frame of buffer: whether each of its segments is lossless "
        "(validated headers, payloads not read).");
}
