// Frame headers and descriptors (frame.h): layout, writing and validation.
#include "frame_io.h"

#include <stdio.h>

#include <algorithm>

#include "codec_common.h"
#include "crc32c.h"
#include "reader.h"

namespace hl {
namespace {

std::string num(uint64_t v) { return std::to_string(v); }

// What is wrong with a radix head that get_radix_head rejected for its K or g.
std::string radix_fault(const uint8_t* code, uint64_t len) {
  uint64_t k = 0, g = 0, a = 0, b = 0;
  get_varint(code + 1, len - 1, &k, &a);
  get_varint(code + 1 + a, len - 1 - a, &g, &b);
  return "radix section with K = " + std::to_string(k) + " and g = " + std::to_string(g) +
         ", expected 3 <= K <= 65535 not a power of two and 1 <= g with K^g < 2^32";
}

}  // namespace

std::vector<int64_t> FrameView::shape() const {
  std::vector<int64_t> s;
  if (ndim == 0) return s;
  s.push_back((int64_t)rows);
  s.insert(s.end(), trailing.begin(), trailing.end());
  return s;
}

uint64_t FrameView::decoded_bytes() const {
  uint64_t n = 0;
  for (const SegmentView& s : segs) n += s.n_rows * s.row_len;
  return n * hl_elem_bytes(dtype);
}

namespace {
// Why the bytes at p (n of them) do not start a frame: too few, or not "HV" and version 2.
[[noreturn]] void not_a_frame(const uint8_t* p, uint64_t n) {
  if (n < HL_FRAME_PREFIX + 1)
    throw FrameError("frame is truncated: " + num(n) + " bytes, a frame has at least " +
                     num(HL_FRAME_PREFIX + 1));
  char buf[128];
  snprintf(buf, sizeof(buf),
           "not an hvd_lossy frame: it starts %02x %02x %02x, expected 48 56 02 (\"HV\", "
           "version %d)", p[0], p[1], p[2], HL_FRAME_VERSION);
  throw FrameError(buf);
}
}  // namespace

uint64_t checked_frame_bytes(const uint8_t* p, uint64_t avail) {
  Reader in(p, avail, "frame");
  if (avail < HL_FRAME_PREFIX + 1 || !is_frame(p, avail)) not_a_frame(p, avail);
  in.skip(HL_FRAME_PREFIX);
  const uint64_t total = in.varint("total size");
  if (total > avail || total < in.pos())
    throw FrameError("frame is truncated: its header says " + num(total) + " bytes, " +
                     num(avail) + " left");
  return total;
}

namespace {
void parse_descriptors(Reader& in, FrameView& f, uint64_t n_segs, uint64_t slab,
                       uint64_t row_len);

// The header and descriptors of a frame of `size` bytes whose first `avail` are at frame (in
// reads them), into f. False when the descriptors run past avail: *need (at most size) bytes
// hold them whatever they say.
bool parse_head(const uint8_t* frame, uint64_t avail, uint64_t size, Reader& in, FrameView& f,
                uint64_t* need) {
  in.skip(3);
  f.crc = in.fixed(4, "checksum");
  f.total_bytes = in.varint("total size");
  if (f.total_bytes != size)
    throw FrameError("frame is truncated or has trailing bytes: " + num(size) +
                     " bytes, its header says " + num(f.total_bytes));
  const uint32_t info = in.fixed(1, "info byte");
  f.dtype = info & 3;
  f.ndim = (info >> 2) & 15;
  f.seeded = info & HL_FRAME_SEEDED;
  if (f.dtype > HL_BFLOAT16 || f.ndim > HL_MAX_NDIM) {
    char buf[80];
    snprintf(buf, sizeof(buf), "frame is corrupted: info byte 0x%02x", info);
    throw FrameError(buf);
  }
  if (f.seeded) f.seed = in.fixed(3, "dither seed");
  if (info & HL_FRAME_EXT) {
    f.ext_bytes = in.varint("extension size");
    if (f.ext_bytes == 0 || f.ext_bytes > HL_FRAME_MAX_EXT || f.ext_bytes > in.remaining())
      throw FrameError("frame is corrupted: an extension of " + num(f.ext_bytes) + " bytes, " +
                       num(in.remaining()) + " left (1 to " + num(HL_FRAME_MAX_EXT) + " expected)");
    f.ext = frame + in.pos();
    in.skip(f.ext_bytes);
  }
  uint64_t slab = 1, row_len = 1;  // rows a dim-0 entry holds; elements a row
  for (int d = 1; d < f.ndim; ++d) {
    const uint64_t v = in.varint("shape");
    if (v > (1ull << 60)) throw FrameError("frame is corrupted: dimension " + num(v));
    f.trailing.push_back((int64_t)v);
  }
  if (f.ndim >= 2) {
    row_len = (uint64_t)f.trailing.back();
    for (int d = 0; d + 2 < f.ndim; ++d)
      if (__builtin_mul_overflow(slab, (uint64_t)f.trailing[d], &slab) || slab > (1ull << 60))
        throw FrameError("frame is corrupted: shape overflows");
  }
  const uint64_t n_segs = in.varint("segment count");
  f.header_bytes = in.pos();
  if (n_segs > (size - in.pos()) / 3)  // a descriptor has at least 3 bytes
    throw FrameError("frame is corrupted: " + num(n_segs) + " segments in " + num(size) +
                     " bytes");
  if (f.ndim == 0 && n_segs != 1)
    throw FrameError("frame is corrupted: a 0-d frame with " + num(n_segs) + " segments");
  // a descriptor at its longest: flags, the bound and five varints of 10 bytes
  *need = std::min(size, in.pos() + n_segs * (1 + 3 + 5 * 10));
  if (*need <= avail) {
    parse_descriptors(in, f, n_segs, slab, row_len);
    return true;
  }
  try {  // they usually end well before their bound; if not, they are asked for
    parse_descriptors(in, f, n_segs, slab, row_len);
    *need = in.pos();
    return true;
  } catch (const FrameError&) {
    f.segs.clear();
    f.rows = 0;
    return false;
  }
}

// The n_segs descriptors at in, of segments of `slab` rows a dim-0 entry and row_len elements
// a row, into f.segs (and f.rows).
void parse_descriptors(Reader& in, FrameView& f, uint64_t n_segs, uint64_t slab,
                       uint64_t row_len) {
  f.segs.resize(n_segs);
  for (uint64_t k = 0; k < n_segs; ++k) {
    SegmentView& s = f.segs[k];
    const uint64_t at = in.pos();
    s.dtype = f.dtype;
    const uint32_t flags = in.fixed(1, "segment flags");
    if (flags & ~HL_SEG_KNOWN) {
      char buf[96];
      snprintf(buf, sizeof(buf), "frame is corrupted: segment %llu has unknown flags 0x%02x",
               (unsigned long long)k, flags);
      throw FrameError(buf);
    }
    const bool lossless = flags & HL_SEG_LOSSLESS;
    s.dim0 = in.varint("segment rows");
    if (lossless && (flags & (HL_SEG_OUTLIERS | HL_SEG_DITHER)))
      throw FrameError("frame is corrupted: lossless segment " + num(k) +
                       " with outliers or dither");
    if ((flags & HL_SEG_DITHER) && (!f.seeded || (flags & HL_SEG_MAP)))
      throw FrameError("frame is corrupted: dithered segment " + num(k) +
                       " without a seed or with a row map");
    if (f.ndim == 0) {
      if (s.dim0 != 1) throw FrameError("frame is corrupted: a 0-d segment of " + num(s.dim0));
      s.n_rows = s.row_len = 1;
    } else if (f.ndim == 1) {
      if (s.dim0 > (1ull << 60)) throw FrameError("frame is corrupted: segment size overflows");
      s.n_rows = 1;
      s.row_len = s.dim0;
    } else {
      if (__builtin_mul_overflow(s.dim0, slab, &s.n_rows))
        throw FrameError("frame is corrupted: segment rows overflow");
      s.row_len = row_len;
    }
    uint64_t elems;
    if (__builtin_mul_overflow(s.n_rows, s.row_len, &elems) || elems > (1ull << 60) ||
        __builtin_add_overflow(f.rows, s.dim0, &f.rows) || f.rows > (1ull << 62))
      throw FrameError("frame is corrupted: segment " + num(k) + " overflows");
    s.level = (flags & HL_SEG_LEVEL2) ? 2 : 1;
    s.lossless = lossless;
    s.rel = flags & HL_SEG_REL;
    s.identity = !(flags & HL_SEG_MAP);
    s.dithered = flags & HL_SEG_DITHER;
    s.seed = (uint32_t)((f.seed + k) % HL_DITHER_SEEDS);
    if (!lossless) {
      const uint32_t code = in.fixed(3, "segment bound");
      s.eb_abs = hl_bound_of_code(code);
      if (!(s.eb_abs > 0) || !isfinite(s.eb_abs))
        throw FrameError("frame is corrupted: segment " + num(k) + " has bound " +
                         std::to_string(s.eb_abs));
    }
    s.n_unique = s.n_rows;
    if (flags & HL_SEG_MAP) {
      s.n_unique = in.varint("segment unique rows");
      if (s.n_unique == 0 || s.n_unique >= s.n_rows || s.n_rows > 0xffffffffull)
        throw FrameError("frame is corrupted: segment " + num(k) + " has " + num(s.n_unique) +
                         " unique rows of " + num(s.n_rows));
    }
    if (flags & HL_SEG_MAP_RANS) {
      if (!(flags & HL_SEG_MAP))
        throw FrameError("frame is corrupted: segment " + num(k) + " has a coded map but no map");
      s.map_rans = true;
      s.map_buckets = flags & HL_SEG_MAP_BUCKETS;
      s.map_bytes = in.varint("segment map size");
    } else if (flags & HL_SEG_MAP_BUCKETS) {
      throw FrameError("frame is corrupted: segment " + num(k) + " has a bucketed map but no "
                       "coded map");
    }
    if (flags & HL_SEG_OUTLIERS) {
      s.n_outliers = in.varint("segment outliers");
      if (s.n_outliers == 0) throw FrameError("frame is corrupted: an empty outlier section");
    }
    s.code_bytes = in.varint("segment code size");
    s.bytes = in.pos() - at;
  }
}
}  // namespace

FrameView parse_frame_head(const uint8_t* frame, uint64_t avail, uint64_t size, uint64_t* need) {
  FrameView f;
  *need = std::min<uint64_t>(size, HL_FRAME_MAX_HEADER);  // the header before the descriptors
  if (avail > size) avail = size;
  if (avail < *need) return f;
  if (avail < HL_FRAME_PREFIX + 1 || !is_frame(frame, avail)) not_a_frame(frame, avail);
  Reader in(frame, avail, "frame");
  parse_head(frame, avail, size, in, f, need);
  return f;
}

FrameView parse_frame(const uint8_t* frame, uint64_t size) {
  if (size < HL_FRAME_PREFIX + 1 || !is_frame(frame, size)) not_a_frame(frame, size);
  FrameView f;
  Reader in(frame, size, "frame");
  uint64_t need = 0;
  parse_head(frame, size, size, in, f, &need);
  const uint64_t n_segs = f.segs.size(), eb = hl_elem_bytes(f.dtype);
  // Payloads: every size against the bytes left before anything is read or allocated.
  const uint8_t* table = nullptr;  // the last level-2 code section with its own table
  uint64_t table_bytes = 0;
  for (uint64_t k = 0; k < n_segs; ++k) {
    SegmentView& s = f.segs[k];
    const uint64_t at = in.pos();
    const uint64_t n_codes = s.n_unique * s.row_len;
    auto fail = [&](const std::string& what) {
      return FrameError("frame is corrupted: segment " + num(k) + " (" + num(s.n_rows) + " x " +
                        num(s.row_len) + "): " + what);
    };
    if (s.map_rans) {
      if (s.map_bytes < 4 + 4 * hl_div_up(s.n_rows, HL_RANS_CHUNK) || s.map_bytes > in.remaining())
        throw fail("coded row map of " + num(s.map_bytes) + " bytes");
      s.map = frame + in.pos();
      in.skip(s.map_bytes);
    } else if (!s.identity) {
      const uint64_t nb = hl_div_up(s.n_rows, HL_BLOCK);
      if (nb > in.remaining()) throw fail("truncated row map");
      uint64_t payload = 0;
      for (uint64_t b = 0; b < nb; ++b) {
        const uint8_t w = frame[in.pos() + b];
        if (w > 32) throw fail("row map block width " + num(w));
        payload += 4ull * w;
      }
      s.map = frame + in.pos();
      s.map_bytes = nb + payload;
      if (s.map_bytes > in.remaining()) throw fail("truncated row map");
      in.skip(s.map_bytes);
    }
    // level 2: a table (or the 2 bytes of a borrowed one), an escape count, a state a stream
    uint64_t min_code = s.level == 1 ? hl_div_up(n_codes, HL_BLOCK)
                                     : 3 + 4 * hl_div_up(n_codes, HL_RANS_CHUNK);
    if (s.level == 1 && !s.lossless && n_codes > 0 &&
        s.code_bytes <= in.remaining()) {  // a radix or short-block section: its own least size
      const uint8_t* code = frame + in.pos();
      if (s.code_bytes > 0 && code[0] == HL_SHORT_MARK) {
        s.short_blocks = true;
        min_code = short_head_bytes(n_codes);
      } else {
        switch (get_radix_head(code, s.code_bytes, &s.radix_k, &s.radix_g, &s.radix_head)) {
          case HL_RADIX_OK:
            min_code = s.radix_head + hl_div_up(hl_div_up(n_codes, s.radix_g), HL_BLOCK);
            break;
          case HL_RADIX_NONE:
            break;
          case HL_RADIX_TRUNCATED:
            throw fail("code section ends inside its radix head");
          default:
            throw fail(radix_fault(code, s.code_bytes));
        }
      }
    }
    if ((s.level == 2 && n_codes == 0) || s.code_bytes < min_code)
      throw fail("code section of " + num(s.code_bytes) + " bytes, too small");
    if (s.code_bytes > in.remaining()) throw fail("truncated code section");
    s.code = frame + in.pos();
    in.skip(s.code_bytes);
    if (s.level == 2) {
      if (s.code[1] == 0) {  // w = 0: the table of the last section that has one
        if (!table) throw fail("code section borrows a table, and none comes before it");
        s.table = table;
        s.table_bytes = table_bytes;
      } else {
        table = s.code;
        table_bytes = s.code_bytes;
      }
    }
    s.pos_bytes = outlier_pos_bytes(n_codes);
    if (s.n_outliers > n_codes) throw fail(num(s.n_outliers) + " outliers");
    s.outlier_bytes = s.n_outliers * (s.pos_bytes + eb);
    if (s.outlier_bytes > in.remaining()) throw fail("truncated outlier section");
    s.outliers = frame + in.pos();
    in.skip(s.outlier_bytes);
    s.bytes += in.pos() - at;
  }
  if (in.remaining() != 0)
    throw FrameError("frame is corrupted: " + num(in.remaining()) + " stray bytes after its segments");
  return f;
}

void check_crc(uint32_t computed, uint32_t stored) {
  if (computed != stored) {
    char buf[128];
    snprintf(buf, sizeof(buf), "frame is corrupted: checksum (CRC32C) 0x%08x, its header says 0x%08x",
             computed, stored);
    throw FrameError(buf);
  }
}

void verify_frame(const FrameView& f, const uint8_t* frame) {
  check_crc(crc32c(frame + HL_FRAME_PREFIX, f.total_bytes - HL_FRAME_PREFIX), f.crc);
}

uint64_t SegmentDesc::descriptor_bytes() const {
  return segment_descriptor_bytes(flags, rows, n_unique, map_bytes, n_outliers, code_bytes);
}

namespace {
uint64_t head_body_bytes(const FrameHead& h, size_t n_segs) {
  if (h.ext.size() > HL_FRAME_MAX_EXT)
    throw ArgumentError("a frame extension of " + num(h.ext.size()) + " bytes, at most " +
                        num(HL_FRAME_MAX_EXT) + " fit");
  uint64_t n = 1 + (h.seeded ? 3 : 0) + varint_bytes(n_segs);
  if (!h.ext.empty()) n += varint_bytes(h.ext.size()) + h.ext.size();
  for (int64_t d : h.trailing) n += varint_bytes((uint64_t)d);
  return n;
}
}  // namespace

uint64_t frame_size(const FrameHead& h, const std::vector<SegmentDesc>& segs,
                       uint64_t* header_bytes) {
  uint64_t body = head_body_bytes(h, segs.size());
  for (const SegmentDesc& s : segs) body += s.descriptor_bytes() + s.payload_bytes;
  uint64_t len = 1;  // the total's own varint counts in the total
  while (varint_bytes(HL_FRAME_PREFIX + len + body) > len) ++len;
  if (header_bytes) *header_bytes = HL_FRAME_PREFIX + len + head_body_bytes(h, segs.size());
  return HL_FRAME_PREFIX + len + body;
}

uint8_t* write_frame_head(const FrameHead& h, const std::vector<SegmentDesc>& segs, uint64_t total,
                       uint8_t* out) {
  uint8_t* w = out;
  *w++ = 'H';
  *w++ = 'V';
  *w++ = HL_FRAME_VERSION;
  w = put_fixed_le(w, 0, 4);  // the CRC, once the payloads are written
  w = put_varint(w, total);
  *w++ = (uint8_t)(frame_info_byte(h.dtype, h.ndim, h.seeded) | (h.ext.empty() ? 0 : HL_FRAME_EXT));
  if (h.seeded) w = put_fixed_le(w, h.seed, 3);
  if (!h.ext.empty()) {
    w = put_varint(w, h.ext.size());
    memcpy(w, h.ext.data(), h.ext.size());
    w += h.ext.size();
  }
  for (int64_t d : h.trailing) w = put_varint(w, (uint64_t)d);
  w = put_varint(w, segs.size());
  for (const SegmentDesc& s : segs)
    w = put_descriptor(w, s.flags, s.rows, s.bound, s.n_unique, s.map_bytes, s.n_outliers,
                          s.code_bytes);
  return w;
}

void seal_frame(uint8_t* frame, uint64_t total) {
  put_fixed_le(frame + 3, crc32c(frame + HL_FRAME_PREFIX, total - HL_FRAME_PREFIX), 4);
}

uint64_t write_empty_frame(const FrameHead& h, uint8_t* out) {
  const std::vector<SegmentDesc> none;
  const uint64_t total = frame_size(h, none, nullptr);
  write_frame_head(h, none, total, out);
  seal_frame(out, total);
  return total;
}

}  // namespace hl
