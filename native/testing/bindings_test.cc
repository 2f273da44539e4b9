// _hl_test: the test-only hooks into the native codec, a pybind11 module apart from hvd_lossy._C
// that the tests build (tests/_hooks.py, CMake option HVD_LOSSY_TEST_HOOKS) and the wheel never
// ships: CRC32C as both codecs compute it, the radix rule and division, the CPU encoder's rows
// numbered by id (dedup.cc), the decoder's row-map check (row_sweep.cc), and the CUDA encoder's
// level-1 sections and frame assembly run serially on the host (level1_ref.h, device_frames.h).
#include <string.h>

#include <tuple>
#include <type_traits>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings_util.h"
#include "frame_io.h"
#include "crc32c.h"
#include "batch_ref.h"
#include "decode_batch_ref.h"
#include "level1_ref.h"
#include "device_frames.h"
#include "elements.h"
#include "encode_stages.h"
#include "kernels_cpu.h"
#include "kernels_scalar.h"
#include "row_sweep.h"

namespace py = pybind11;

namespace {

using hl::py_util::ptr;

// A segment's payload (map, code section, outliers) through level1_sections.h's functions in
// the CUDA encoder's decomposition (level1_ref.h), for the tests that hold it against the CPU
// encoder's frames.
py::tuple segment_payload_hd(const std::vector<uint32_t>& map, std::vector<uint32_t> codes,
                             const std::vector<std::pair<uint64_t, uint32_t>>& outliers,
                             int dtype, bool lossy_level1) {
  if (dtype < 0 || dtype > HL_BFLOAT16)
    throw hl::ArgumentError("dtype code " + std::to_string(dtype) +
                            ", expected 0 (float32), 1 (float16) or 2 (bfloat16)");
  std::string out;
  if (!map.empty()) {
    uint64_t sum = 0;
    const std::vector<uint64_t> w = hl::l1ref::widths(map.data(), map.size(), HL_BLOCK);
    const std::vector<uint64_t> off = hl::l1ref::exclusive_scan(w, &sum);
    std::string sec(hl::block_section_bytes(w.size(), sum), '\0');
    hl::l1ref::write_blocks(map.data(), map.size(), w, off, reinterpret_cast<uint8_t*>(&sec[0]));
    out += sec;
  }
  for (const auto& o : outliers) {
    if (o.first >= codes.size())
      throw hl::ArgumentError("outlier at " + std::to_string(o.first) + ", past the " +
                              std::to_string(codes.size()) + " codes");
    codes[o.first] = 0;  // the format stores 0 at an outlier
  }
  int packing = 0;
  const std::vector<uint8_t> code =
      hl::l1ref::code_section(codes.data(), codes.size(), lossy_level1, &packing);
  out.append(reinterpret_cast<const char*>(code.data()), code.size());
  const uint8_t pb = hl::outlier_pos_bytes(codes.size());
  const uint64_t eb = hl_elem_bytes((uint8_t)dtype);
  for (const auto& o : outliers) {
    uint8_t rec[16];
    const uint8_t* end = hl::put_outlier(rec, o.first, o.second, pb, eb);
    out.append(reinterpret_cast<const char*>(rec), end - rec);
  }
  return py::make_tuple(py::bytes(out), packing, code.size());
}

// The CUDA encoder's frame assembly (device_frames.h) on the host: the segments of the CPU
// encoder's compress_into layout at `buffer` (level 1, no dither) taken apart into what an
// encoder finds of each (SegmentFound) and their payloads, then planned, headed, assembled and
// sealed (CRC32C in the device's 1 KiB pieces) again into a buffer of 0xab bytes. Returns
// (layout bytes, sizes, group bytes) for the tests to compare with the CPU encoder's.
py::tuple device_frames_hd(const std::string& buffer, const std::vector<int64_t>& rows,
                       const std::vector<int64_t>& trailing, const std::vector<int64_t>& groups,
                       uint64_t prefix_bytes, const std::string& ext, int mode, int dtype) {
  const uint8_t* buf = reinterpret_cast<const uint8_t*>(buffer.data());
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t r : rows) {
    std::vector<int64_t> s{r};
    s.insert(s.end(), trailing.begin(), trailing.end());
    shapes.push_back(s);
  }
  std::vector<hl::SegmentDesc> descs;
  std::vector<uint32_t> seeds;
  std::vector<const uint8_t*> payload;
  std::vector<uint64_t> payload_bytes;
  uint64_t at = 0;
  size_t seg = 0;
  for (int64_t g : groups) {
    at += prefix_bytes;
    if (g == 0 && ext.empty()) continue;
    if (at > buffer.size()) throw hl::ArgumentError("buffer ends before a group's frame");
    const hl::FrameView f = hl::parse_frame(buf + at, hl::checked_frame_bytes(buf + at, buffer.size() - at));
    if ((int64_t)f.segs.size() != g) throw hl::ArgumentError("a frame of another group size");
    for (const hl::SegmentView& v : f.segs) {
      if (v.level != 1)
        throw hl::ArgumentError("device_frames_hd takes level-1 segments");
      hl::SegmentFound r;
      r.lossless = v.lossless;
      r.identity = v.identity;
      r.dithered = v.dithered;
      // the piece's seed as the CUDA encoder has it (pieces.h: consecutive from the call's),
      // dithered or not
      seeds.push_back(f.seeded ? (uint32_t)((f.seed + (&v - f.segs.data())) % HL_DITHER_SEEDS) : 0);
      r.bound = r.lossless ? 0 : hl_bound_code(v.eb_abs);
      r.n_unique = v.n_unique;
      r.n_outliers = v.n_outliers;
      r.map_bytes = v.map_bytes;
      r.code_bytes = v.code_bytes;
      r.payload_bytes = v.map_bytes + v.code_bytes + v.outlier_bytes;
      if (seg >= shapes.size()) throw hl::ArgumentError("more segments than rows");
      descs.push_back(hl::descriptor_of(r, (uint8_t)mode, shapes[seg++]));
      payload.push_back(r.identity ? v.code : v.map);
      payload_bytes.push_back(r.payload_bytes);
    }
    at += f.total_bytes;
  }
  if (seg != shapes.size()) throw hl::ArgumentError("fewer segments than rows");
  const hl::FramesPlan plan =
      hl::plan_device_frames(descs, shapes, groups, prefix_bytes, ext, trailing, (uint8_t)dtype,
                             seeds);
  // The payloads back to back as the slots the moves read them from.
  std::string slots;
  std::vector<uint64_t> slot;
  for (size_t i = 0; i < payload.size(); ++i) {
    slot.push_back(slots.size());
    slots.append(reinterpret_cast<const char*>(payload[i]), payload_bytes[i]);
  }
  std::string out(plan.end, '\xab');
  uint8_t* o = reinterpret_cast<uint8_t*>(&out[0]);
  const hl::FrameMoves m = hl::frame_moves(plan, payload_bytes, slot);
  for (const hl::FrameCopy& c : m.copies)
    memcpy(o + c.dst, c.from_heads ? plan.heads.data() + c.src : (const uint8_t*)slots.data() + c.src,
           c.len);
  for (const hl::FrameSeal& f : m.seals)
    hl::put_fixed_le(o + f.at + 3,
                     hl::crc32c_in_pieces(o + f.at + HL_FRAME_PREFIX, f.total - HL_FRAME_PREFIX, 1024),
                     4);
  return py::make_tuple(py::bytes(out), plan.sizes, plan.group_bytes);
}

template <class F>
void with_host_dtype(int dtype, F f) {
  switch (dtype) {
    case HL_FLOAT32: return f(std::integral_constant<int, HL_FLOAT32>());
    case HL_FLOAT16: return f(std::integral_constant<int, HL_FLOAT16>());
    case HL_BFLOAT16: return f(std::integral_constant<int, HL_BFLOAT16>());
  }
  throw hl::ArgumentError("dtype code " + std::to_string(dtype) +
                          ", expected 0 (float32), 1 (float16) or 2 (bfloat16)");
}

// elements.h on a segment's raw elements, one call an element as the CUDA encoder's threads
// make them: quantize_kernel's code of element i (kOutlierMark at an outlier) and
// write_outliers_kernel's (position, raw bits) records in position order. Returns (codes,
// outliers, whether the rule dithers).
py::tuple element_codes_hd(const std::string& raw, int dtype, double eb_abs, bool lossless,
                           bool dither, uint32_t seed) {
  const hl::ElementRule rule = hl::element_rule(eb_abs, lossless, dither, seed);
  std::vector<uint32_t> codes;
  std::vector<std::pair<uint64_t, uint32_t>> outliers;
  with_host_dtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    typedef typename hl::Elem<DT>::raw_t raw_t;
    const uint64_t n = raw.size() / sizeof(raw_t);
    codes.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      raw_t x;
      memcpy(&x, raw.data() + i * sizeof(raw_t), sizeof(raw_t));
      codes[i] = hl::element_code<DT>(rule, x, i);
      if (!rule.lossless && codes[i] == hl::kOutlierMark) outliers.emplace_back(i, (uint32_t)x);
    }
  });
  return py::make_tuple(codes, outliers, rule.dithered);
}

// The CUDA decoder's values of a segment without a map: CodeSink's element_value (or the raw
// bits when lossless) for every code, then scatter_outliers_kernel's records. Returns the
// elements' raw bytes.
py::bytes element_values_hd(const std::vector<uint32_t>& codes,
                            const std::vector<std::pair<uint64_t, uint32_t>>& outliers, int dtype,
                            double eb_abs, bool lossless, bool dither, uint32_t seed) {
  const hl::ElementRule rule = hl::element_rule(eb_abs, lossless, dither, seed);
  std::string out;
  with_host_dtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    typedef typename hl::Elem<DT>::raw_t raw_t;
    std::vector<raw_t> v(codes.size());
    for (uint64_t i = 0; i < codes.size(); ++i)
      v[i] = rule.lossless ? (raw_t)codes[i] : hl::element_value<DT>(rule, codes[i], i);
    for (const auto& o : outliers) {
      if (o.first >= v.size())
        throw hl::ArgumentError("outlier at " + std::to_string(o.first) + ", past the " +
                                std::to_string(v.size()) + " elements");
      v[o.first] = (raw_t)o.second;
    }
    out.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(raw_t));
  });
  return py::bytes(out);
}

// Zigzag codes through the float32 dequantizers (any step, dithered or not) and through the
// scalar rule (reconstruct): (decoded, reference decoded).
py::tuple dequantized_f32(const std::vector<uint32_t>& z, double step, bool dither, uint64_t first,
                          uint32_t seed) {
  const uint64_t n = z.size();
  std::vector<float> y(n), y_ref(n);
  if (dither)
    hl::cpu::dequantize_dithered(HL_FLOAT32, z.data(), n, step, seed, first, y.data());
  else
    hl::cpu::dequantize(HL_FLOAT32, z.data(), n, step, y.data());
  for (uint64_t i = 0; i < n; ++i) {
    const double u = dither ? hl::dither_unit(seed, first + i) * step : 0.0;
    const uint32_t bits = hl::reconstruct<HL_FLOAT32>(hl::unzigzag(z[i]), step, u);
    memcpy(&y_ref[i], &bits, 4);
  }
  return py::make_tuple(y, y_ref);
}

// One row through the float32 kernels and through the scalar rule (quantized_f32 below).
// max_abs: what the range pass would tell the kernels (QuantParams::max_abs; inf: nothing).
py::tuple quantized_f32(const std::vector<float>& x, double eb_abs, bool dither, uint64_t first,
                        uint32_t seed, double max_abs = INFINITY) {
  const uint64_t n = x.size();
  hl::cpu::QuantParams qp;
  qp.step = 2.0 * eb_abs;
  qp.inv_step = 1.0 / qp.step;
  qp.eb_abs = eb_abs;
  qp.dither = dither;
  qp.seed = seed;
  qp.first = first;
  qp.max_abs = max_abs;
  std::vector<uint32_t> z(n), z_ref(n), codes(n);
  uint8_t miss = 0;
  hl::cpu::quantize_rows(HL_FLOAT32, x.data(), nullptr, 1, n, qp, z.data(), &miss, nullptr);
  auto offset = [&](uint64_t i) { return dither ? hl::dither_unit(seed, first + i) * qp.step : 0.0; };
  for (uint64_t i = 0; i < n; ++i) {
    if (!hl::quantize<HL_FLOAT32>(hl::f32_bits(x[i]), qp.inv_step, qp.step, eb_abs, &z_ref[i],
                                  offset(i)))
      z_ref[i] = hl::kOutlierMark;
    codes[i] = z_ref[i] == hl::kOutlierMark ? 0 : z_ref[i];
  }
  const py::tuple decoded = dequantized_f32(codes, qp.step, dither, first, seed);
  return py::make_tuple(z, z_ref, decoded[0], decoded[1]);
}

// cpu::quantize_rows_narrow (whichever simd_level runs) over rows of d float32 elements, beside
// the scalar rule of its dedup hashes (narrow_hash of a narrow row's bytes, wide_hash of a wide
// row's codes): (narrow flags, hashes, reference hashes). max_abs: the bound on |x| a relative
// bound's range pass hands the quantizer (finite: its bounded lanes and byte runs).
py::tuple narrow_hashes_f32(const std::vector<float>& x, uint64_t d, double eb_abs,
                            double max_abs) {
  if (d == 0 || x.size() % d != 0)
    throw hl::ArgumentError("rows of d = " + std::to_string(d) + " elements, got " +
                            std::to_string(x.size()) + " elements");
  const uint64_t rows = x.size() / d;
  hl::cpu::QuantParams qp = hl::cpu::quant_params(eb_abs);
  qp.max_abs = max_abs;
  std::vector<uint32_t> z(x.size());
  std::vector<uint8_t> outlier(rows), narrow(rows), bytes(x.size());
  std::vector<uint64_t> hashes(rows), ref(rows);
  hl::cpu::quantize_rows_narrow(HL_FLOAT32, x.data(), nullptr, rows, d, qp, z.data(),
                                outlier.data(), hashes.data(), narrow.data(), bytes.data());
  for (uint64_t r = 0; r < rows; ++r)
    ref[r] = narrow[r] ? hl::cpu::narrow_hash(&bytes[r * d], d)
                       : hl::cpu::wide_hash(reinterpret_cast<const uint32_t*>(&x[r * d]),
                                            &z[r * d], d, outlier[r]);
  return py::make_tuple(narrow, hashes, ref);
}

// The CUDA encoder's batch emulated on the host (batch_ref.h) over compress_into's pieces
// (level 1): (layout bytes, sizes a piece, bytes a group), gaps 0xab.
py::tuple compress_into_batched_hd(const std::string& raw, int dtype,
                                   const std::vector<int64_t>& rows,
                                   const std::vector<int64_t>& trailing,
                                   const std::vector<double>& ebs, int mode, bool dedup,
                                   const std::vector<int64_t>& groups, uint64_t prefix_bytes,
                                   const std::string& ext, int64_t dither_seed) {
  const hl::CompressParams p = hl::py_util::params(dtype, mode, 1, dedup, 0.0, dither_seed);
  const hl::Pieces c =
      hl::plan_grouped(p, {rows, trailing, ebs, groups, prefix_bytes, ext}, UINT64_MAX);
  const uint64_t need = c.in_off.back() * hl_elem_bytes((uint8_t)dtype);
  if (raw.size() != need)
    throw hl::ArgumentError("input of " + std::to_string(raw.size()) + " bytes, the pieces need " +
                            std::to_string(need));
  std::string out;
  std::vector<uint64_t> sizes, group_bytes;
  with_host_dtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    std::vector<typename hl::Elem<DT>::raw_t> x(c.in_off.back());
    memcpy(x.data(), raw.data(), raw.size());
    out = hl::batchref::encode_frames<DT>(x.data(), c, dedup, groups, prefix_bytes, ext, trailing,
                                          &sizes, &group_bytes);
  });
  return py::make_tuple(py::bytes(out), sizes, group_bytes);
}

// The encoder's first stage with ids (dedup.cc) on float32 rows: (map, first), each row's
// distinct row and each distinct row's first row, before code_distinct_rows merges equal codes.
py::tuple distinct_rows_by_id_f32(uintptr_t rows, uint64_t n_rows, uint64_t row_len,
                                  uintptr_t ids, uintptr_t zero_rows) {
  const hl::enc::Tensor<HL_FLOAT32> t{ptr<const uint32_t>(rows), n_rows, row_len};
  double lo, hi;
  hl::enc::DistinctRows d;
  {
    py::gil_scoped_release free;
    d = hl::enc::distinct_rows_by_id(t, ptr<const int64_t>(ids), ptr<const uint8_t>(zero_rows),
                                     true, &lo, &hi);
  }
  return py::make_tuple(std::vector<uint32_t>(d.map.data(), d.map.data() + n_rows), d.first);
}

// The output of the batched decoder's emulation of the frames at places of buffer (elements
// no frame writes stay 0).
py::bytes decompress_batched_hd(const std::string& buffer,
                                const std::vector<hl::FramePlace>& places) {
  const uint8_t* buf = reinterpret_cast<const uint8_t*>(buffer.data());
  uint8_t dtype = 0;
  const hl::SegmentTable t = hl::decoderef::walked_table(buf, buffer.size(), places, &dtype);
  std::string out;
  with_host_dtype(dtype, [&](auto dt) {
    hl::decoderef::Decode<decltype(dt)::value> d(t, buf);
    d.run();
    out.assign(reinterpret_cast<const char*>(d.out.data()), d.out.size() * sizeof(d.out[0]));
  });
  return py::bytes(out);
}

}  // namespace

PYBIND11_MODULE(_hl_test, m) {
  m.doc() = "hvd_lossy's test-only native hooks (never shipped)";
  // The codec's failures as hvd_lossy raises them: its FrameError (held for the module's life).
  static PyObject* frame_error =
      py::object(py::module_::import("hvd_lossy._C").attr("FrameError")).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hl::FrameError& e) {
      PyErr_SetString(frame_error, e.what());
    } catch (const hl::ArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("distinct_rows_by_id_f32", &distinct_rows_by_id_f32, py::arg("rows"), py::arg("n_rows"),
        py::arg("row_len"), py::arg("ids"), py::arg("zero_rows") = 0,
        "dedup.cc's rows numbered by id (addresses of float32 rows and int64 ids): (map, first).");
  m.def("check_row_map",
        [](const std::vector<uint32_t>& map, uint64_t n_unique) {
          std::vector<uint8_t> repeated(n_unique);
          try {
            hl::check_row_map(map.data(), map.size(), n_unique, repeated.data());
          } catch (const std::exception& e) {
            return py::make_tuple(std::string(e.what()), py::bytes());
          }
          return py::make_tuple(std::string(),
                                py::bytes(reinterpret_cast<const char*>(repeated.data()),
                                          repeated.size()));
        },
        py::arg("map"), py::arg("n_unique"),
        "row_sweep.cc's check of a decoded row map: ('', repeated marks) or (error, b'').");
  m.def("crc32c",
        [](uintptr_t p, uint64_t n, bool portable) {
          return portable ? hl::crc32c_portable(ptr<const uint8_t>(p), n)
                          : hl::crc32c(ptr<const uint8_t>(p), n);
        },
        py::arg("data"), py::arg("size"), py::arg("portable") = false,
        "CRC32C (hardware when present; portable=True: the table version).");
  m.def("crc32c_in_pieces",
        [](uintptr_t p, uint64_t n, uint64_t piece) {
          return hl::crc32c_in_pieces(ptr<const uint8_t>(p), n, piece);
        },
        py::arg("data"), py::arg("size"), py::arg("piece"),
        "CRC32C the way the CUDA codec computes it: pieces of `piece` bytes combined (tests).");

  // The radix rule and division every codec shares (frame_fields.h), for the tests.
  m.def("radix_group",
        [](uint32_t k, uint64_t n) {
          if (!hl::radix_k_ok(k))
            throw hl::ArgumentError("radix " + std::to_string(k) +
                                    ", expected 3 <= K <= 65535 not a power of two");
          if (n == 0) throw hl::ArgumentError("radix_group of 0 codes, expected n >= 1");
          return hl::radix_group(k, n);
        },
        py::arg("k"), py::arg("n"), "The group size g radix packing uses for n codes in [0, k).");
  m.def("radix_divmod",
        [](uint32_t k, const std::vector<uint32_t>& values) {
          if (!hl::radix_k_ok(k))
            throw hl::ArgumentError("radix " + std::to_string(k) +
                                    ", expected 3 <= K <= 65535 not a power of two");
          const hl::RadixDiv d = hl::radix_div_of(k);
          std::vector<std::pair<uint32_t, uint32_t>> out(values.size());
          for (size_t i = 0; i < values.size(); ++i) {
            const uint32_t q = hl::radix_div(values[i], d);
            out[i] = {q, values[i] - q * k};
          }
          return out;
        },
        py::arg("k"), py::arg("values"),
        "(v // k, v % k) of each uint32 value, as the radix decoders compute them.");

  // The float32 kernels (cpu::quantize_rows, cpu::dequantize(_dithered), whichever simd_level
  // runs) on one row, beside hl::quantize and hl::reconstruct element by element: the vector
  // lanes (single precision where they are sure, hl::dither_unit's generator) must agree with
  // the scalar rule everywhere, the dither's 2^32 boundaries of the index included, which no
  // tensor a test can build reaches.
  m.def("quantized_f32",
        [](const std::vector<float>& x, double eb_abs, bool dither, uint64_t first,
           uint32_t seed, double max_abs) {
          return quantized_f32(x, eb_abs, dither, first, seed, max_abs);
        },
        py::arg("x"), py::arg("eb_abs"), py::arg("dither") = false, py::arg("first") = 0,
        py::arg("seed") = 0, py::arg("max_abs") = INFINITY,
        "(codes, reference codes, decoded, reference decoded) of one row; max_abs: the largest "
        "|finite element| the kernels are told of (inf: none).");
  m.def("dithered_f32",
        [](const std::vector<float>& x, uint64_t first, uint32_t seed, double eb_abs) {
          return quantized_f32(x, eb_abs, true, first, seed);
        },
        py::arg("x"), py::arg("first"), py::arg("seed"), py::arg("eb_abs"),
        "(kernel codes, reference codes, kernel decode, reference decode) of dithered float32 "
        "elements first, first + 1, ... (codes: zigzag or the outlier mark; decode of the "
        "reference codes, outliers as 0).");
  m.def("narrow_hashes_f32", &narrow_hashes_f32, py::arg("x"), py::arg("d"), py::arg("eb_abs"),
        py::arg("max_abs") = INFINITY,
        "(narrow flags, dedup hashes, reference hashes) of rows of d float32 elements through "
        "the quantizer that serves dedup.");
  m.def("dequantized_f32", &dequantized_f32, py::arg("codes"), py::arg("step"),
        py::arg("dither") = false, py::arg("first") = 0, py::arg("seed") = 0,
        "(kernel decode, reference decode) of zigzag codes at any step, dithered from element "
        "index first with seed when dither.");
  m.def("segment_payload_hd", &segment_payload_hd, py::arg("map"), py::arg("codes"),
        py::arg("outliers"), py::arg("dtype"), py::arg("lossy_level1"),
        "(payload bytes, Level1Packing, code section bytes) of a segment from its row map "
        "(empty: none), its unique rows' codes and its (position, raw bits) outliers, written by "
        "the functions the CUDA encoder runs (level1_sections.h), serially on the host.");
  m.def("device_frames_hd", &device_frames_hd, py::arg("buffer"), py::arg("rows"), py::arg("trailing"),
        py::arg("groups"), py::arg("prefix_bytes"), py::arg("extension"), py::arg("mode"),
        py::arg("dtype"),
        "The CPU encoder's compress_into layout taken apart and put together again by the CUDA "
        "encoder's host side (device_frames.h): (layout bytes, sizes, group bytes).");
  m.def("element_codes_hd", &element_codes_hd, py::arg("raw"), py::arg("dtype"),
        py::arg("eb_abs"), py::arg("lossless"), py::arg("dither"), py::arg("seed"),
        "(codes, outliers, dithered) of a segment's raw elements by elements.h's element_code, "
        "one call an element as the CUDA encoder's threads make them.");
  m.def("element_values_hd", &element_values_hd, py::arg("codes"), py::arg("outliers"),
        py::arg("dtype"), py::arg("eb_abs"), py::arg("lossless"), py::arg("dither"),
        py::arg("seed"),
        "Raw bytes of a map-less segment decoded by elements.h's element_value, one call a "
        "code, then its outliers scattered, as the CUDA decoder does.");
  m.def("decompress_batched_hd",
        [](const std::string& buffer, const std::vector<uint64_t>& sizes) {
          return decompress_batched_hd(buffer, hl::back_to_back(sizes.data(), sizes.size()));
        },
        py::arg("buffer"), py::arg("sizes"),
        "the frames of sizes[i] bytes back to back in buffer decoded by the host emulation of "
        "the batched CUDA decoder (native/testing/decode_batch_ref.h): their raw bits, "
        "concatenated");
  m.def("decompress_placed_hd",
        [](const std::string& buffer,
           const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& frames) {
          std::vector<hl::FramePlace> places(frames.size());
          for (size_t i = 0; i < frames.size(); ++i)
            places[i] = {std::get<0>(frames[i]), std::get<1>(frames[i]), std::get<2>(frames[i])};
          return decompress_batched_hd(buffer, places);
        },
        py::arg("buffer"), py::arg("frames"),
        "decompress_batched_cuda's frames argument, (offset, bytes, first output element) a "
        "frame, decoded by the host emulation: the output's raw bits up to where the last "
        "frame's end (elements no frame writes are 0)");
  m.def("compress_into_batched_hd", &compress_into_batched_hd, py::arg("raw"), py::arg("dtype"),
        py::arg("rows"), py::arg("trailing"), py::arg("error_bounds"), py::arg("mode"),
        py::arg("dedup"), py::arg("groups"), py::arg("prefix_bytes"), py::arg("extension"),
        py::arg("dither_seed"),
        "compress_into's layout (level 1) by the CUDA encoder's batch emulated on the host: one "
        "table of pieces, call-wide scans and sort, the per-piece and per-item functions the "
        "kernels run, the frames put together by the device's move list: (layout bytes, sizes "
        "a piece, bytes a group).");
  m.attr("OUTLIER_MARK") = hl::kOutlierMark;
  m.attr("PACK_BLOCK") = (int)hl::HL_PACK_BLOCK;
  m.attr("PACK_RADIX") = (int)hl::HL_PACK_RADIX;
  m.attr("PACK_SHORT") = (int)hl::HL_PACK_SHORT;
}
