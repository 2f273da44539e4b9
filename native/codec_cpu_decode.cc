// CPU decoder: v1 frames and v2 segments into tensors, checksums and header checks first
// (the encoder is codec_cpu.cc).
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec.h"
#include "codec_common.h"
#include "codec_cpu_internal.h"
#include "crc32c.h"
#include "frame_v2.h"
#include "kernels_cpu.h"
#include "map_buckets.h"
#include "pack.h"
#include "parallel.h"
#include "radix.h"
#include "short_blocks.h"
#include "rans.h"

namespace hl {
namespace {

uint32_t dither_seed(const HlFrameHeader& h) {
  return (uint32_t)h.reserved[0] | (uint32_t)h.reserved[1] << 8 | (uint32_t)h.reserved[2] << 16;
}

}  // namespace

// The one segment of a v1 frame whose header is validated.
SegmentView view_v1(const HlFrameHeader& h, const uint8_t* frame) {
  SegmentView v;
  v.version = 1;
  v.dtype = h.dtype;
  v.level = h.level;
  v.flags = h.flags;
  v.pos_bytes = 8;
  v.seed = dither_seed(h);
  v.eb_abs = h.eb_abs;
  v.n_rows = h.n_rows;
  v.row_len = h.row_len;
  v.n_unique = h.n_unique;
  v.n_outliers = h.n_outliers;
  v.map = frame + HL_HEADER_BYTES + 8ull * h.ndim;
  v.map_bytes = h.map_bytes;
  v.code = v.map + h.map_bytes;
  v.code_bytes = h.code_bytes;
  v.outliers = v.code + h.code_bytes;
  v.outlier_bytes = h.outlier_bytes;
  v.bytes = h.total_bytes;
  return v;
}

namespace {

// Calls decoding this much or more write duplicate rows with streaming stores: an output far
// larger than the caches bypasses them, saving the read of each line before it is written.
constexpr uint64_t kStreamFrom = uint64_t(8) << 20;

template <int DT>
void decode(const SegmentView& h, void* out_v, int threads, bool stream) {
  typedef typename Elem<DT>::raw_t raw_t;
  raw_t* out = static_cast<raw_t*>(out_v);
  const uint64_t d = h.row_len;
  const uint64_t nu = h.n_unique * d;
  const bool identity = h.flags & HL_FLAG_IDENTITY_MAP;
  const bool lossless = h.flags & HL_FLAG_LOSSLESS;
  const bool compact = h.version == 2;
  const uint8_t* map_p = h.map;
  const uint8_t* code_p = h.code;
  const uint8_t* out_p = h.outliers;

  Buffer<raw_t> uniq(identity ? 0 : nu);
  raw_t* u = identity ? out : uniq.data();
  const double step = 2.0 * h.eb_abs;
  const bool dithered = h.flags & HL_FLAG_DITHER;
  const uint32_t seed = h.seed;
  Buffer<uint32_t> codes;
  if (h.level == 1 && !lossless) {
    // Codes go from the packed section to elements a chunk at a time, through L1: no array of
    // every code (as large as the decoded unique rows) is written and read back.
    struct Dequantize {
      raw_t* u;
      double step;
      bool dithered;
      uint32_t seed;
      static void run(void* ctx, uint64_t first, const uint32_t* z, uint64_t count) {
        const Dequantize& d = *static_cast<const Dequantize*>(ctx);
        if (d.dithered)  // identity map: code i is element i
          cpu::dequantize_dithered(DT, z, count, d.step, d.seed, first, d.u + first);
        else
          cpu::dequantize(DT, z, count, d.step, d.u + first);
      }
    } deq{u, step, dithered, seed};
    if (h.radix_k)  // v2 only (parse_v2 sets it)
      radix_unpack_to(code_p + h.radix_head, h.code_bytes - h.radix_head, nu, h.radix_k,
                      h.radix_g, "code section", threads, ChunkSink{&Dequantize::run, &deq});
    else if (h.short_blocks)  // v2 only, as radix
      short_unpack_to(code_p, h.code_bytes, nu, "code section", threads,
                      ChunkSink{&Dequantize::run, &deq});
    else
      unpack_blocks_to(code_p, h.code_bytes, nu, 32, "code section", threads,
                       ChunkSink{&Dequantize::run, &deq});
  } else {
    codes = Buffer<uint32_t>(nu);
    if (h.level == 1)
      unpack_blocks(code_p, h.code_bytes, nu, 32, codes.data(), "code section", threads);
    else
      rans_decode(code_p, h.code_bytes, nu, codes.data(), threads, compact, h.table,
                  h.table_bytes);
  }
  if (lossless) {
    const uint32_t limit = sizeof(raw_t) == 2 ? 0xffffu : 0xffffffffu;
    bool bad = false;
    for (uint64_t i = 0; i < nu; ++i) {
      bad |= codes[i] > limit;
      u[i] = (raw_t)codes[i];
    }
    if (bad) throw FrameError("frame is corrupted: a lossless code exceeds the dtype's bits");
  } else if (h.level == 2) {
    const int nt = nu > 65536 ? threads : 1;
#pragma omp parallel num_threads(nt)
    {
      uint64_t a, b;
      split_range(nu, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &a, &b);
      if (dithered)  // identity map: code a is element a
        cpu::dequantize_dithered(DT, codes.data() + a, b - a, step, seed, a, u + a);
      else
        cpu::dequantize(DT, codes.data() + a, b - a, step, u + a);
    }
  }

  uint64_t prev = 0;
  const uint64_t rec = compact ? h.pos_bytes + sizeof(raw_t) : HL_OUTLIER_BYTES;
  for (uint64_t k = 0; k < h.n_outliers; ++k) {
    uint64_t pos = 0;
    uint32_t raw = 0;
    if (compact) {  // little-endian fields of pos_bytes and the element's bytes
      memcpy(&pos, out_p + rec * k, h.pos_bytes);
      memcpy(&raw, out_p + rec * k + h.pos_bytes, sizeof(raw_t));
    } else {
      memcpy(&pos, out_p + HL_OUTLIER_BYTES * k, 8);
      memcpy(&raw, out_p + HL_OUTLIER_BYTES * k + 8, 4);
    }
    if (pos >= nu || (k > 0 && pos <= prev) || (sizeof(raw_t) == 2 && raw > 0xffffu))
      throw FrameError("frame is corrupted: outlier " + std::to_string(k) + " at position " +
                       std::to_string(pos) + " is out of order or out of range (" +
                       std::to_string(nu) + " elements)");
    u[pos] = (raw_t)raw;
    prev = pos;
  }

  if (identity) return;
  Buffer<uint32_t> map(h.n_rows);
  if (h.map_buckets) {
    map_buckets_decode(map_p, h.map_bytes, h.n_rows, map.data(), threads);
  } else if (h.map_rans) {
    rans_decode(map_p, h.map_bytes, h.n_rows, map.data(), threads, true);
    uint64_t seen = 0;  // symbols back to entries (rans_map_encode); checked below
    for (uint64_t r = 0; r < h.n_rows; ++r) {
      const uint32_t v = map[r];
      map[r] = v == 0 ? (uint32_t)seen++ : v - 1;
      if (seen > h.n_unique) break;  // the check below names it
    }
  } else {
    unpack_blocks(map_p, h.map_bytes, h.n_rows, 32, map.data(), "row map", threads);
  }
  uint64_t next = 0;
  for (uint64_t r = 0; r < h.n_rows; ++r) {
    if (map[r] > next || map[r] >= h.n_unique)
      throw FrameError("frame is corrupted: row map entry " + std::to_string(r) + " is " +
                       std::to_string(map[r]) + ", expected at most " + std::to_string(next));
    if (map[r] == next) ++next;
  }
  if (next != h.n_unique)
    throw FrameError("frame is corrupted: row map uses " + std::to_string(next) + " of " +
                     std::to_string(h.n_unique) + " unique rows");
  if (d == 0) return;  // rows of no elements: nothing to copy, and u (or out) may be null
  const uint64_t rows = h.n_rows, row_bytes = d * sizeof(raw_t);
  const int nt = rows * d > 65536 ? threads : 1;
#pragma omp parallel num_threads(nt)
  {
    uint64_t a, b;
    split_range(rows, omp_get_thread_num_safe(), omp_get_num_threads_safe(), &a, &b);
    cpu::expand_rows(reinterpret_cast<uint8_t*>(out) + a * row_bytes,
                     reinterpret_cast<const uint8_t*>(u), map.data() + a, b - a, row_bytes, stream);
  }
}

}  // namespace

namespace {

// A header field that fails its check: when the frame's checksum (over the bytes its header
// says it has) also fails, the frame was damaged after it was sealed, and that is what the
// error says first; the field check follows as detail. Computed only on this failure path.
[[noreturn]] void corrupt(const HlFrameHeader& h, const uint8_t* frame, uint64_t size,
                          const std::string& what) {
  if (h.total_bytes == size) {
    const uint32_t sum = checksum_with_zero_field(frame, size, 1);
    if (sum != h.checksum) {
      char buf[96];
      snprintf(buf, sizeof(buf), "frame is corrupted: checksum 0x%08x, its header says 0x%08x",
               sum, h.checksum);
      throw FrameError(std::string(buf) + " (and " + what + ")");
    }
  }
  throw FrameError("frame is corrupted: " + what);
}

}  // namespace

HlFrameHeader parse_header(const uint8_t* frame, uint64_t size, std::vector<int64_t>* shape) {
  if (size < HL_HEADER_BYTES)
    throw FrameError("frame is truncated: " + std::to_string(size) +
                     " bytes, a frame has at least " + std::to_string(HL_HEADER_BYTES));
  HlFrameHeader h;
  memcpy(&h, frame, sizeof(h));
  if (h.magic != HL_MAGIC) {
    char buf[96];
    snprintf(buf, sizeof(buf), "not an hvd_lossy frame: magic 0x%08x, expected 0x%08x", h.magic,
             HL_MAGIC);
    throw FrameError(buf);
  }
  if (h.version != HL_VERSION)
    throw FrameError("unsupported frame version " + std::to_string(h.version) + ", expected " +
                     std::to_string(HL_VERSION));
  if (h.dtype > HL_BFLOAT16)
    corrupt(h, frame, size, std::string() + "dtype code " + std::to_string(h.dtype));
  if (h.level != 1 && h.level != 2)
    corrupt(h, frame, size, std::string() + "level " + std::to_string(h.level));
  if (h.flags & ~(HL_FLAG_REL | HL_FLAG_LOSSLESS | HL_FLAG_IDENTITY_MAP | HL_FLAG_DITHER)) {
    char buf[80];
    snprintf(buf, sizeof(buf), "frame is corrupted: unknown flags 0x%02x", h.flags);
    throw FrameError(buf);
  }
  if (h.ndim > HL_MAX_NDIM)
    corrupt(h, frame, size, std::string() + "ndim " + std::to_string(h.ndim) + ", at most " +
                     std::to_string(HL_MAX_NDIM));
  const bool dithered = h.flags & HL_FLAG_DITHER;
  if (!dithered && (h.reserved[0] || h.reserved[1] || h.reserved[2]))
    corrupt(h, frame, size, std::string() + "reserved header bytes are not zero");
  if (dithered && (h.flags & HL_FLAG_LOSSLESS || !(h.flags & HL_FLAG_IDENTITY_MAP)))
    corrupt(h, frame, size, std::string() + "a dithered frame must be lossy with no row map");
  if (h.total_bytes != size)
    throw FrameError("frame is truncated or has trailing bytes: " + std::to_string(size) +
                     " bytes, its header says " + std::to_string(h.total_bytes));
  if (!(h.eb_abs >= 0) || !isfinite(h.eb_abs))
    corrupt(h, frame, size, std::string() + "error bound " + std::to_string(h.eb_abs));
  const uint64_t shape_end = HL_HEADER_BYTES + 8ull * h.ndim;
  if (shape_end > size) throw FrameError("frame is truncated inside its shape");
  int64_t dims[HL_MAX_NDIM];  // on the stack: decoding many small frames allocates nothing here
  if (h.ndim) memcpy(dims, frame + HL_HEADER_BYTES, 8ull * h.ndim);
  uint64_t rows = 1, len = 1;
  for (int i = 0; i < h.ndim; ++i)
    if (dims[i] < 0) corrupt(h, frame, size, std::string() + "dimension " + std::to_string(dims[i]));
  if (h.ndim >= 2)
    for (int i = 0; i + 1 < h.ndim; ++i)
      if (__builtin_mul_overflow(rows, (uint64_t)dims[i], &rows))
        corrupt(h, frame, size, std::string() + "shape overflows");
  if (h.ndim >= 1) len = (uint64_t)dims[h.ndim - 1];
  uint64_t elems;
  if (__builtin_mul_overflow(rows, len, &elems) || elems > (1ull << 60))
    corrupt(h, frame, size, std::string() + "shape overflows");
  if (h.n_rows != rows || h.row_len != len)
    corrupt(h, frame, size, std::string() + "header rows x length " + std::to_string(h.n_rows) +
                     " x " + std::to_string(h.row_len) + " disagree with its shape");
  const bool identity = h.flags & HL_FLAG_IDENTITY_MAP;
  if (h.n_unique > h.n_rows || (identity && (h.n_unique != h.n_rows || h.map_bytes != 0)) ||
      (h.n_rows > 0 && h.n_unique == 0) || (!identity && h.n_rows > 0xffffffffull))
    corrupt(h, frame, size, std::string() + "" + std::to_string(h.n_unique) + " unique rows of " +
                     std::to_string(h.n_rows));
  if ((h.flags & HL_FLAG_LOSSLESS) && h.n_outliers)
    corrupt(h, frame, size, std::string() + "a lossless frame with outliers");
  if (h.n_outliers > size / HL_OUTLIER_BYTES || h.outlier_bytes != HL_OUTLIER_BYTES * h.n_outliers)
    corrupt(h, frame, size, std::string() + "" + std::to_string(h.n_outliers) + " outliers in " +
                     std::to_string(h.outlier_bytes) + " bytes");
  if (h.map_bytes > size || h.code_bytes > size ||
      shape_end + h.map_bytes + h.code_bytes + h.outlier_bytes != size)
    corrupt(h, frame, size, std::string() + "section sizes " + std::to_string(h.map_bytes) + " + " +
                     std::to_string(h.code_bytes) + " + " + std::to_string(h.outlier_bytes) +
                     " do not fill the frame of " + std::to_string(size) + " bytes");
  // Every block or stream costs bytes, so the code and map sections bound the work and memory
  // a decoder commits to before it reads them.
  const uint64_t n_codes = h.n_unique * len;
  const uint64_t min_code_bytes = h.level == 1 ? hl_div_up(n_codes, HL_BLOCK)
                                               : 8 * hl_div_up(n_codes, HL_RANS_CHUNK) + 7;
  if ((h.level == 2 && n_codes == 0) || h.code_bytes < min_code_bytes ||
      (!identity && h.map_bytes < hl_div_up(h.n_rows, HL_BLOCK)))
    corrupt(h, frame, size, std::string() + "sections too small for " + std::to_string(h.n_rows) +
                     " rows of " + std::to_string(len));
  if (shape) shape->assign(dims, dims + h.ndim);  // reuses the caller's capacity
  return h;
}

uint32_t frame_checksum(const uint8_t* frame, uint64_t size) {
  if (size < 16) throw FrameError("frame is truncated");
  return checksum_with_zero_field(frame, size, resolve_threads(0));
}

namespace {

void verify_checksum(const HlFrameHeader& h, const uint8_t* frame, uint64_t size, int threads) {
  const uint32_t sum = checksum_with_zero_field(frame, size, threads);
  if (sum != h.checksum) {
    char buf[128];
    snprintf(buf, sizeof(buf), "frame is corrupted: checksum 0x%08x, its header says 0x%08x",
             sum, h.checksum);
    throw FrameError(buf);
  }
}

// Decodes a segment whose frame is parsed and verified into its n_rows * row_len elements
// at out. stream: the call's whole output is at least kStreamFrom (see decode).
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

// The frame at frame (avail bytes left in its span), v1 or v2, validated (not its checksum):
// its size is its header's, refused when past avail.
ParsedFrame next_frame(const uint8_t* frame, uint64_t avail) {
  ParsedFrame f;
  if (is_v2(frame, avail)) {
    const uint64_t size = v2_frame_bytes(frame, avail);
    auto v2 = std::make_shared<FrameV2>(parse_v2(frame, size));
    memset(&f.h, 0, sizeof(f.h));
    f.h.dtype = v2->dtype;
    f.h.total_bytes = size;
    f.shape = v2->shape();
    f.v2 = std::move(v2);
    return f;
  }
  if (avail < HL_HEADER_BYTES)
    throw FrameError("frame is truncated: " + std::to_string(avail) +
                     " bytes left, a frame has at least " + std::to_string(HL_HEADER_BYTES));
  HlFrameHeader h;
  memcpy(&h, frame, sizeof(h));
  if (h.magic != HL_MAGIC) {
    f.h = parse_header(frame, avail, &f.shape);  // names the bad magic
    return f;
  }
  if (h.total_bytes > avail)
    throw FrameError("frame is truncated: its header says " + std::to_string(h.total_bytes) +
                     " bytes, " + std::to_string(avail) + " left");
  f.h = parse_header(frame, h.total_bytes, &f.shape);
  return f;
}

// One segment to decode: where its elements go, and for a v1 frame the bytes its checksum
// covers (v2 frames are verified whole before their segments become jobs).
struct Job {
  SegmentView seg;
  const uint8_t* frame;  // v1: the frame to verify
  uint32_t checksum;     // v1: its header's checksum
  uint8_t* out;          // null: only verify the checksum
  size_t owner;          // the source (decompress_into) or frame index it reports errors to
  bool verified;         // checksum already verified
};

void verify_v1(const Job& j, int threads) {
  HlFrameHeader h;
  h.checksum = j.checksum;
  verify_checksum(h, j.frame, j.seg.bytes, threads);
}

// Verifies and decodes every job, threaded across segments when there are enough of them (the
// cooperative parallel_items: see parallel.h) and within each segment otherwise. A FrameError
// is recorded for the job's owner (the first one an owner gets wins) and the other jobs go on;
// anything else is rethrown after the loop.
void run_jobs(const std::vector<Job>& jobs, std::vector<std::string>* errors, int threads) {
  const size_t n = jobs.size();
  const bool across = (int)n >= threads && n > 1;
  const int inner = across ? 1 : threads;
  uint64_t total = 0;
  for (const Job& j : jobs) total += j.out ? decoded_bytes(j.seg) : 0;
  const bool stream = total >= kStreamFrom;
  std::mutex lock;
  auto one = [&](size_t i) {
    const Job& j = jobs[i];
    try {
      if (!j.verified) verify_v1(j, inner);
      if (j.out) decode_segment(j.seg, j.out, inner, stream);
    } catch (const FrameError& e) {
      std::lock_guard<std::mutex> g(lock);
      if ((*errors)[j.owner].empty()) (*errors)[j.owner] = e.what();
    }  // anything else leaves parallel_items as itself
  };
  parallel::parallel_items(n, across ? threads : 1, one);
}

// Jobs for the segments of a parsed frame at frame, elements from out on (null: verify only).
// A v2 frame is verified here, once; a v1 frame's checksum is left to run_jobs.
void add_jobs(const uint8_t* frame, const ParsedFrame& f, uint8_t* out, size_t owner,
              std::vector<Job>* jobs) {
  if (!f.v2) {
    jobs->push_back(Job{view_v1(f.h, frame), frame, f.h.checksum, out, owner, false});
    return;
  }
  verify_v2(*f.v2, frame);
  uint64_t at = 0;
  for (const SegmentView& s : f.v2->segs) {
    jobs->push_back(Job{s, frame, 0, out ? out + at : nullptr, owner, true});
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
    if (f.h.dtype != dtype)
      return fail("frame holds dtype code " + std::to_string(f.h.dtype) + ", expected " +
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
      add_jobs(buffer + src.offset + pos, f, out + rows * row_bytes, index, jobs);
    } catch (const FrameError& e) {
      return fail(e.what());
    }
    rows += (uint64_t)shape[0];
    pos += f.h.total_bytes;
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

void decompress_cpu(const uint8_t* frame, uint64_t size, void* out, uint64_t out_bytes,
                    int threads) {
  threads = resolve_threads(threads);
  if (is_v2(frame, size)) {
    const FrameV2 f = parse_v2(frame, size);
    verify_v2(f, frame);
    const uint64_t need = f.decoded_bytes();
    if (out_bytes != need)
      throw ArgumentError("output buffer holds " + std::to_string(out_bytes) +
                          " bytes, the frame decodes to " + std::to_string(need));
    ParsedFrame pf;
    pf.v2 = std::make_shared<FrameV2>(f);
    std::vector<Job> jobs;
    add_jobs(frame, pf, static_cast<uint8_t*>(out), 0, &jobs);
    std::vector<std::string> errors(1);
    run_jobs(jobs, &errors, threads);
    if (!errors[0].empty()) throw FrameError(errors[0]);
    return;
  }
  HlFrameHeader h = parse_header(frame, size, nullptr);
  verify_checksum(h, frame, size, threads);
  const SegmentView v = view_v1(h, frame);
  const uint64_t need = decoded_bytes(v);
  if (out_bytes != need)
    throw ArgumentError("output buffer holds " + std::to_string(out_bytes) +
                        " bytes, the frame decodes to " + std::to_string(need));
  decode_segment(v, out, threads, need >= kStreamFrom);
}

std::vector<std::string> decompress_into_cpu(const uint8_t* buffer, uint64_t buffer_len,
                                             const std::vector<DecodeSource>& sources,
                                             uint8_t dtype, const std::vector<int64_t>& trailing,
                                             void* out, uint64_t out_bytes, int threads,
                                             std::vector<uint8_t>* mismatched) {
  threads = resolve_threads(threads);
  if (dtype > HL_BFLOAT16)
    throw ArgumentError("unsupported dtype code " + std::to_string(dtype) +
                        ", expected float32 (0), float16 (1) or bfloat16 (2)");
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
    ParsedFrame f;
    if (sizes && !is_v2(buffer + pos, avail)) {
      f.h = parse_header(buffer + pos, avail, &f.shape);
    } else {
      f = next_frame(buffer + pos, avail);
      if (sizes && f.h.total_bytes != avail)
        throw FrameError("frame is truncated or has trailing bytes: " + std::to_string(avail) +
                         " bytes, its header says " + std::to_string(f.h.total_bytes));
    }
    f.offset = pos;
    pos += f.h.total_bytes;
    frames.push_back(std::move(f));
  }
  return frames;
}

uint64_t frame_decoded_bytes(const ParsedFrame& f) {
  return f.v2 ? f.v2->decoded_bytes() : f.h.n_rows * f.h.row_len * hl_elem_bytes(f.h.dtype);
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
  std::vector<Job> checks;
  for (size_t k = 0; k < n; ++k) {
    if (frames[k].v2) {
      try {
        verify_v2(*frames[k].v2, buffer + frames[k].offset);
      } catch (const FrameError& e) {
        errors[k] = e.what();
      }
    } else {
      const uint8_t* fp = buffer + frames[k].offset;
      checks.push_back(Job{view_v1(frames[k].h, fp), fp, frames[k].h.checksum, nullptr, k, false});
    }
  }
  run_jobs(checks, &errors, threads);
  first_error();
  out_offsets->assign(n, 0);
  uint64_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    (*out_offsets)[k] = total;
    total += hl_div_up(frame_decoded_bytes(frames[k]), align) * align;
  }
  uint8_t* out = alloc(total);
  std::vector<Job> jobs;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* fp = buffer + frames[k].offset;
    if (frames[k].v2) {
      uint64_t at = 0;
      for (const SegmentView& sv : frames[k].v2->segs) {
        jobs.push_back(Job{sv, fp, 0, out + (*out_offsets)[k] + at, k, true});
        at += decoded_bytes(sv);
      }
    } else {
      jobs.push_back(Job{view_v1(frames[k].h, fp), fp, frames[k].h.checksum,
                         out + (*out_offsets)[k], k, true});
    }
  }
  run_jobs(jobs, &errors, threads);
  first_error();
}

}  // namespace hl
