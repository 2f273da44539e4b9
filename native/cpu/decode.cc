// CPU decoder: frames' segments into tensors, checksums and header checks first (the encoder
// is encode.cc).
#include <stddef.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "codec.h"
#include "codec_common.h"
#include "scratch.h"
#include "frame_io.h"
#include "kernels_cpu.h"
#include "map_buckets.h"
#include "pack.h"
#include "parallel.h"
#include "radix.h"
#include "short_blocks.h"
#include "rans.h"
#include "radix_sweep.h"
#include "row_sweep.h"

namespace hl {
namespace {

// A segment's row map, decoded (not checked: check_row_map).
Buffer<uint32_t> read_map(const SegmentView& h, int threads) {
  Buffer<uint32_t> map(h.n_rows);
  if (h.map_buckets) {
    map_buckets_decode(h.map, h.map_bytes, h.n_rows, map.data(), threads);
  } else if (h.map_rans) {
    rans_decode(h.map, h.map_bytes, h.n_rows, map.data(), threads);
    uint64_t seen = 0;  // symbols back to entries (rans_map_encode); checked by check_row_map
    for (uint64_t r = 0; r < h.n_rows; ++r) {
      const uint32_t v = map[r];
      map[r] = v == 0 ? (uint32_t)seen++ : v - 1;
      if (seen > h.n_unique) break;  // the check names it
    }
  } else {
    unpack_blocks(h.map, h.map_bytes, h.n_rows, 32, map.data(), "row map", threads);
  }
  return map;
}

// Codes to elements a chunk at a time: into `to` (elements from `first` on), or through a
// stage that stays in L1 to a row sweep.
template <typename raw_t>
struct Dequantize {
  explicit Dequantize(const SegmentView& h) : dtype(h.dtype), step(2.0 * h.eb_abs), dithered(h.dithered),
                                     seed(h.seed) {}
  const int dtype;
  const double step;
  const bool dithered;
  const uint32_t seed;
  raw_t* to = nullptr;
  RowSweep<raw_t>* sweep = nullptr;

  void put(uint64_t first, const uint32_t* z, uint64_t count, raw_t* at) const {
    if (dithered)  // code i is element i of the unique rows
      cpu::dequantize_dithered(dtype, z, count, step, seed, first, at);
    else
      cpu::dequantize(dtype, z, count, step, at);
  }
  static void run(void* ctx, uint64_t first, const uint32_t* z, uint64_t count) {
    Dequantize& d = *static_cast<Dequantize*>(ctx);
    if (!d.sweep) return d.put(first, z, count, d.to + first);
    constexpr uint64_t kStage = RowSweep<raw_t>::kStage;
    for (uint64_t at = 0; at < count; at += kStage) {
      const uint64_t c = count - at < kStage ? count - at : kStage;
      d.put(first + at, z + at, c, d.sweep->stage());
      d.sweep->commit(c);
    }
  }
};

// The lossy codes of a segment's nu unique elements, level 1 from their packed section a chunk
// at a time (no array of every code), level 2 all at once, to deq.
template <typename raw_t>
void lossy_codes_to(const SegmentView& h, uint64_t nu, int threads, Dequantize<raw_t>* deq) {
  const ChunkSink sink{&Dequantize<raw_t>::run, deq};
  if (h.level == 1) {
    if (h.radix_k)
      radix_unpack_to(h.code + h.radix_head, h.code_bytes - h.radix_head, nu, h.radix_k,
                      h.radix_g, "code section", threads, sink);
    else if (h.short_blocks)
      short_unpack_to(h.code, h.code_bytes, nu, "code section", threads, sink);
    else
      unpack_blocks_to(h.code, h.code_bytes, nu, 32, "code section", threads, sink);
    return;
  }
  Buffer<uint32_t> codes(nu);
  rans_decode(h.code, h.code_bytes, nu, codes.data(), threads, h.table, h.table_bytes);
  if (deq->sweep || nu <= 65536) return sink.fn(deq, 0, codes.data(), nu);
  omp_threads(threads, [&](int part, int parts) {
    uint64_t a, b;
    split_range(nu, part, parts, &a, &b);
    sink.fn(deq, a, codes.data() + a, b - a);
  });
}

// A lossy segment with a row map on one thread: the map first, then one sweep over the output
// rows as the unique rows are decoded (row_sweep.h).
template <int DT>
void decode_swept(const SegmentView& h, void* out, bool stream) {
  typedef typename Elem<DT>::raw_t raw_t;
  Buffer<uint32_t> map = read_map(h, 1);
  Buffer<uint8_t> repeated(h.n_unique);
  check_row_map(map.data(), h.n_rows, h.n_unique, repeated.data());
  check_outliers(h, h.n_unique * h.row_len, sizeof(raw_t));
  RowSweep<raw_t> sweep(h, static_cast<raw_t*>(out), map.data(), repeated.data(), stream);
  if constexpr (DT == HL_FLOAT32) {
    if (h.level == 1 && radix_sweep_applies(h)) {
      radix_sweep_f32(h, 2.0 * h.eb_abs, &sweep);
      return sweep.finish();
    }
  }
  Dequantize<raw_t> deq(h);
  deq.sweep = &sweep;
  lossy_codes_to(h, h.n_unique * h.row_len, 1, &deq);
  sweep.finish();
}

template <int DT>
void decode(const SegmentView& h, void* out_v, int threads, bool stream) {
  typedef typename Elem<DT>::raw_t raw_t;
  if (!h.identity && !h.lossless && threads <= 1 && h.row_len > 0)
    return decode_swept<DT>(h, out_v, stream);
  raw_t* out = static_cast<raw_t*>(out_v);
  const uint64_t d = h.row_len;
  const uint64_t nu = h.n_unique * d;
  const bool identity = h.identity;

  Buffer<raw_t> uniq(identity ? 0 : nu);
  raw_t* u = identity ? out : uniq.data();
  if (h.lossless) {
    Buffer<uint32_t> codes(nu);
    if (h.level == 1)
      unpack_blocks(h.code, h.code_bytes, nu, 32, codes.data(), "code section", threads);
    else
      rans_decode(h.code, h.code_bytes, nu, codes.data(), threads, h.table, h.table_bytes);
    const uint32_t limit = sizeof(raw_t) == 2 ? 0xffffu : 0xffffffffu;
    bool bad = false;
    for (uint64_t i = 0; i < nu; ++i) {
      bad |= codes[i] > limit;
      u[i] = (raw_t)codes[i];
    }
    if (bad) throw FrameError("frame is corrupted: a lossless code exceeds the dtype's bits");
  } else {
    Dequantize<raw_t> deq(h);
    deq.to = u;
    lossy_codes_to(h, nu, threads, &deq);
  }

  check_outliers(h, nu, sizeof(raw_t));
  for (uint64_t k = 0; k < h.n_outliers; ++k) {
    uint64_t pos;
    uint32_t raw;
    read_outlier(h, sizeof(raw_t), k, &pos, &raw);
    u[pos] = (raw_t)raw;
  }

  if (identity) return;
  Buffer<uint32_t> map = read_map(h, threads);
  check_row_map(map.data(), h.n_rows, h.n_unique, nullptr);
  if (d == 0) return;  // rows of no elements: nothing to copy, and u (or out) may be null
  const uint64_t rows = h.n_rows, row_bytes = d * sizeof(raw_t);
  const int nt = rows * d > 65536 ? threads : 1;
  omp_threads(nt, [&](int part, int parts) {
    uint64_t a, b;
    split_range(rows, part, parts, &a, &b);
    cpu::expand_rows(reinterpret_cast<uint8_t*>(out) + a * row_bytes,
                     reinterpret_cast<const uint8_t*>(u), map.data() + a, b - a, row_bytes, stream);
  });
}

// Decodes a segment whose frame is parsed and verified into its n_rows * row_len elements
// at out. stream: the call's whole output is at least cpu::kStreamFrom (see decode).
void decode_segment(const SegmentView& v, void* out, int threads, bool stream) {
  switch (v.dtype) {
    case HL_FLOAT32: return decode<HL_FLOAT32>(v, out, threads, stream);
    case HL_FLOAT16: return decode<HL_FLOAT16>(v, out, threads, stream);
    case HL_BFLOAT16: return decode<HL_BFLOAT16>(v, out, threads, stream);
  }
}

uint64_t decoded_bytes(const SegmentView& v) {
  return v.n_rows * v.row_len * hl_elem_bytes(v.dtype);
}

// The frame at frame (avail bytes left in its span), validated (not its checksum): its size
// is its header's, refused when past avail.
ParsedFrame next_frame(const uint8_t* frame, uint64_t avail) {
  ParsedFrame f;
  f.frame = parse_frame(frame, checked_frame_bytes(frame, avail));
  f.shape = f.frame.shape();
  return f;
}

// One segment to decode, its frame verified: where its elements go.
struct Job {
  SegmentView seg;
  uint8_t* out;
  size_t owner;  // the source (decompress_into) or frame index it reports errors to
};

// Decodes every job, threaded across segments when there are enough of them (the
// cooperative parallel_items: see parallel.h) and within each segment otherwise. A FrameError
// is recorded for the job's owner (the first one an owner gets wins) and the other jobs go on;
// anything else is rethrown after the loop.
void run_jobs(const std::vector<Job>& jobs, std::vector<std::string>* errors, int threads) {
  const size_t n = jobs.size();
  const bool across = (int)n >= threads && n > 1;
  const int inner = across ? 1 : threads;
  uint64_t total = 0;
  for (const Job& j : jobs) total += decoded_bytes(j.seg);
  const bool stream = total >= cpu::kStreamFrom;
  std::mutex lock;
  auto one = [&](size_t i) {
    const Job& j = jobs[i];
    try {
      decode_segment(j.seg, j.out, inner, stream);
    } catch (const FrameError& e) {
      std::lock_guard<std::mutex> g(lock);
      if ((*errors)[j.owner].empty()) (*errors)[j.owner] = e.what();
    }  // anything else leaves parallel_items as itself
  };
  parallel::parallel_items(n, across ? threads : 1, one);
}

// Jobs for the segments of a parsed frame, elements from out on, once its CRC is verified.
void add_jobs(const uint8_t* frame, const FrameView& f, uint8_t* out, size_t owner,
              std::vector<Job>* jobs) {
  verify_frame(f, frame);
  uint64_t at = 0;
  for (const SegmentView& s : f.segs) {
    jobs->push_back(Job{s, out + at, owner});
    at += decoded_bytes(s);
  }
}

// The frames of one source laid out at consecutive rows: "" when they fit, else the reason.
// Sets *mismatch when the frames are well formed but disagree with what the source must hold.
std::string plan_source(const uint8_t* buffer, const DecodeSource& src, size_t index,
                        uint8_t dtype, const std::vector<int64_t>& trailing, uint64_t row_bytes,
                        uint8_t* out, std::vector<Job>* jobs, bool* mismatch) {
  const size_t first_job = jobs->size();
  uint64_t pos = 0, rows = 0;
  size_t k = 0;
  auto fail = [&](const std::string& why) {
    jobs->resize(first_job);  // nothing of a failed source is decoded
    return "source " + std::to_string(index) + ", frame " + std::to_string(k) + " at byte " +
           std::to_string(src.offset + pos) + ": " + why;
  };
  for (; pos < src.length; ++k) {
    ParsedFrame f;
    try {
      f = next_frame(buffer + src.offset + pos, src.length - pos);
    } catch (const FrameError& e) {
      return fail(e.what());
    }
    const std::vector<int64_t>& shape = f.shape;
    *mismatch = true;  // until the checks below pass
    if (f.frame.dtype != dtype)
      return fail("frame holds dtype code " + std::to_string(f.frame.dtype) + ", expected " +
                  std::to_string(dtype));
    bool same = shape.size() == trailing.size() + 1;
    for (size_t d = 0; same && d < trailing.size(); ++d) same = shape[d + 1] == trailing[d];
    if (!same) {
      std::string got, want = "(rows";
      for (size_t d = 0; d < shape.size(); ++d) got += (d ? ", " : "(") + std::to_string(shape[d]);
      for (int64_t t : trailing) want += ", " + std::to_string(t);
      return fail("frame has shape " + (shape.empty() ? std::string("()") : got + ")") +
                  ", expected " + want + ")");
    }
    if ((uint64_t)shape[0] > (uint64_t)src.rows - rows)
      return fail("frame holds " + std::to_string(shape[0]) + " rows, only " +
                  std::to_string((uint64_t)src.rows - rows) + " of the source's " +
                  std::to_string(src.rows) + " are left");
    *mismatch = false;
    try {
      add_jobs(buffer + src.offset + pos, f.frame, out + rows * row_bytes, index, jobs);
    } catch (const FrameError& e) {
      return fail(e.what());
    }
    rows += (uint64_t)shape[0];
    pos += f.frame.total_bytes;
  }
  if (rows != (uint64_t)src.rows) {
    *mismatch = true;
    jobs->resize(first_job);
    return "source " + std::to_string(index) + ": its " + std::to_string(k) + " frames in bytes [" +
           std::to_string(src.offset) + ", " + std::to_string(src.offset + src.length) +
           ") hold " + std::to_string(rows) + " rows, expected " + std::to_string(src.rows);
  }
  return "";
}

}  // namespace

namespace {

void decode_frame(const uint8_t* frame, const FrameView& f, void* out, uint64_t out_bytes,
                  int threads) {
  threads = resolve_threads(threads);
  verify_frame(f, frame);
  const uint64_t need = f.decoded_bytes();
  if (out_bytes != need)
    throw ArgumentError("output buffer holds " + std::to_string(out_bytes) +
                        " bytes, the frame decodes to " + std::to_string(need));
  std::vector<Job> jobs;
  add_jobs(frame, f, static_cast<uint8_t*>(out), 0, &jobs);
  std::vector<std::string> errors(1);
  run_jobs(jobs, &errors, threads);
  if (!errors[0].empty()) throw FrameError(errors[0]);
}

}  // namespace

void decompress_cpu(const uint8_t* frame, uint64_t size, void* out, uint64_t out_bytes,
                    int threads) {
  decode_frame(frame, parse_frame(frame, size), out, out_bytes, threads);
}

bool decompress_as_cpu(const uint8_t* frame, uint64_t size, uint8_t dtype,
                       const std::vector<int64_t>& shape, void* out, uint64_t out_bytes,
                       int threads) {
  const FrameView f = parse_frame(frame, size);
  if (f.dtype != dtype || f.shape() != shape) return false;
  decode_frame(frame, f, out, out_bytes, threads);
  return true;
}

std::vector<std::string> decompress_into_cpu(const uint8_t* buffer, uint64_t buffer_len,
                                             const std::vector<DecodeSource>& sources,
                                             uint8_t dtype, const std::vector<int64_t>& trailing,
                                             void* out, uint64_t out_bytes, int threads,
                                             std::vector<uint8_t>* mismatched) {
  threads = resolve_threads(threads);
  check_dtype_code(dtype);
  uint64_t row_elems = 1;
  for (int64_t t : trailing) {
    if (t < 0) throw ArgumentError("negative dimension " + std::to_string(t) + " in trailing");
    row_elems *= (uint64_t)t;
  }
  const uint64_t row_bytes = row_elems * hl_elem_bytes(dtype);
  uint64_t rows = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const DecodeSource& s = sources[i];
    if (s.rows < 0)
      throw ArgumentError("source " + std::to_string(i) + " has " + std::to_string(s.rows) +
                          " rows, expected >= 0");
    if (s.offset > buffer_len || s.length > buffer_len - s.offset)
      throw ArgumentError("source " + std::to_string(i) + " spans bytes [" +
                          std::to_string(s.offset) + ", " + std::to_string(s.offset + s.length) +
                          "), past the buffer's " + std::to_string(buffer_len));
    rows += (uint64_t)s.rows;
  }
  if (rows * row_bytes != out_bytes)
    throw ArgumentError("output buffer holds " + std::to_string(out_bytes) + " bytes, the " +
                        std::to_string(rows) + " rows of the sources take " +
                        std::to_string(rows * row_bytes));
  if (sources.size() > 1) parallel::prewake(threads);  // while the headers are read
  std::vector<std::string> errors(sources.size());
  std::vector<uint8_t> mismatch(sources.size(), 0);
  std::vector<Job> jobs;
  uint8_t* at = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < sources.size(); ++i) {
    bool m = false;
    errors[i] = plan_source(buffer, sources[i], i, dtype, trailing, row_bytes, at, &jobs, &m);
    mismatch[i] = m;
    at += (uint64_t)sources[i].rows * row_bytes;
  }
  run_jobs(jobs, &errors, threads);
  for (size_t i = 0; i < errors.size(); ++i)  // decoding errors arrive without their source
    if (!errors[i].empty() && errors[i].compare(0, 7, "source ") != 0)
      errors[i] = "source " + std::to_string(i) + ": " + errors[i];
  if (mismatched) *mismatched = std::move(mismatch);
  return errors;
}

std::vector<ParsedFrame> parse_frames(const uint8_t* buffer, uint64_t len,
                                      const std::vector<uint64_t>* sizes) {
  std::vector<ParsedFrame> frames;
  uint64_t pos = 0;
  for (size_t k = 0; sizes ? k < sizes->size() : pos < len; ++k) {
    const uint64_t avail = sizes ? (*sizes)[k] : len - pos;
    if (pos + avail > len)
      throw ArgumentError("frame sizes overrun the buffer of " + std::to_string(len) + " bytes");
    ParsedFrame f = next_frame(buffer + pos, avail);
    if (sizes && f.frame.total_bytes != avail)
      throw FrameError("frame is truncated or has trailing bytes: " + std::to_string(avail) +
                       " bytes, its header says " + std::to_string(f.frame.total_bytes));
    f.offset = pos;
    pos += f.frame.total_bytes;
    frames.push_back(std::move(f));
  }
  return frames;
}

void decompress_frames_cpu(const uint8_t* buffer, const std::vector<ParsedFrame>& frames,
                           uint64_t align, const std::function<uint8_t*(uint64_t)>& alloc,
                           std::vector<uint64_t>* out_offsets, int threads) {
  threads = resolve_threads(threads);
  const size_t n = frames.size();
  std::vector<std::string> errors(n);
  auto first_error = [&] {
    for (size_t k = 0; k < n; ++k)
      if (!errors[k].empty()) throw FrameError(errors[k]);
  };
  // Checksums first: a corrupted header must not make us allocate what it claims.
  for (size_t k = 0; k < n; ++k) {
    try {
      verify_frame(frames[k].frame, buffer + frames[k].offset);
    } catch (const FrameError& e) {
      errors[k] = e.what();
    }
  }
  first_error();
  out_offsets->assign(n, 0);
  uint64_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    (*out_offsets)[k] = total;
    total += hl_div_up(frames[k].frame.decoded_bytes(), align) * align;
  }
  uint8_t* out = alloc(total);
  std::vector<Job> jobs;
  for (size_t k = 0; k < n; ++k) {
    uint64_t at = 0;
    for (const SegmentView& sv : frames[k].frame.segs) {
      jobs.push_back(Job{sv, out + (*out_offsets)[k] + at, k});
      at += decoded_bytes(sv);
    }
  }
  run_jobs(jobs, &errors, threads);
  first_error();
}

}  // namespace hl
