// The CUDA encoder's batch (native/cuda/encode*.cu) emulated on the host, for the tests: the
// same table of pieces (piece_table.h), the same concatenated scratch arrays with their bases,
// the same call-wide scans read back with scan_local/scan_total, the same stable sort of
// (piece, hash) keys, the same per-piece decisions (prepare_piece, rows_layout, radix_plan,
// choose_packing, decide_piece) and per-item functions (element_code, row_hash_term,
// radix_value, block_plane, short_nibble_byte, put_outlier), each item visited the way a
// stage's grid visits it (bpp blocks a piece, a thread or a warp an item, strided), and the
// frames put together by the same move list (device_frames.h: frame_moves) and sealed in the
// device's CRC pieces. Warp collectives are replaced by what they compute (an OR, a max, a
// ballot: block_plane). Slow; its bytes are compared with the CPU encoder's.
#pragma once

#include <string.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "crc32c.h"
#include "device_frames.h"
#include "level1_ref.h"
#include "piece_table.h"

namespace hl {
namespace batchref {

// The emulated grid: few blocks a piece and small blocks, so that the strides wrap.
constexpr uint64_t kBlocks = 3, kThreads = 64, kWarps = kThreads / 32;

// f(piece, item) for every item < count(piece) of every active piece, in the order of a grid
// of kBlocks blocks a piece of `per_block` items (threads, or warps) each.
template <class Count, class F>
void each_item(const PieceTable& t, uint64_t per_block, Count count, F f) {
  for (uint64_t p = 0; p < t.pieces.size(); ++p) {
    if (!t.pieces[p].active) continue;
    const uint64_t n = count(p);
    for (uint64_t blk = 0; blk < kBlocks; ++blk)
      for (uint64_t th = 0; th < per_block; ++th)
        for (uint64_t i = blk * per_block + th; i < n; i += kBlocks * per_block) f(p, i);
  }
}
template <class F>
void each_piece(const PieceTable& t, F f) {
  for (uint64_t p = 0; p < t.pieces.size(); ++p)
    if (t.pieces[p].active) f(p);
}

// cub's device-wide exclusive sum.
template <typename T>
std::vector<T> exclusive_sum(const std::vector<T>& in) {
  T total;
  return l1ref::exclusive_scan(in, &total);
}

template <int DT>
struct Batch {
  typedef typename Elem<DT>::raw_t raw_t;
  PieceTable t;
  const raw_t* x;
  std::vector<EncodeState> st;
  std::vector<std::pair<double, double>> range;  // a piece's finite range, where ranged
  std::vector<uint8_t> slots;
  std::vector<uint32_t> codes, gathered, first_of, flag, map, first;
  std::vector<uint8_t> row_outlier;
  std::vector<uint64_t> out_count, width, rwidth, swidth;
  std::vector<uint32_t> values;

  Batch(PieceTable table, const raw_t* input) : t(std::move(table)), x(input) {
    const size_t n = t.pieces.size();
    st.resize(n);
    range.resize(n);
    slots.assign(t.slots, 0);
    codes.assign(t.elems, 0);
    gathered.assign(t.elems, 0);
    for (auto* v : {&first_of, &flag, &map, &first}) v->assign(t.rows, 0);
    row_outlier.assign(t.rows, 0);
    out_count.assign(t.rows, 0);
    width.assign(t.blocks, 0);
    rwidth.assign(t.rblocks, 0);
    swidth.assign(t.sblocks, 0);
    values.assign(t.values, 0);
  }

  const raw_t* xp(uint64_t p) const { return x + t.pieces[p].in_off; }

  void quantize() {
    each_piece(t, [&](uint64_t p) {
      const DevicePiece& e = t.pieces[p];
      st[p] = EncodeState();
      double lo = INFINITY, hi = -INFINITY;
      if (e.mode == HL_MODE_REL && e.eb > 0)
        for (uint64_t i = 0; i < e.n(); ++i) {
          const double v = Elem<DT>::to_double(xp(p)[i]);
          if (isfinite(v)) {
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
        }
      range[p] = {lo, hi};
      prepare_piece(&st[p], e, lo, hi);
    });
    std::fill(row_outlier.begin(), row_outlier.end(), 0);
    each_item(t, kThreads, [&](uint64_t p) { return t.pieces[p].n(); }, [&](uint64_t p, uint64_t i) {
      const DevicePiece& e = t.pieces[p];
      const ElementRule rule = st[p].rule;
      const uint32_t z = element_code<DT>(rule, xp(p)[i], i);
      codes[e.elem_base + i] = z;
      if (!rule.lossless && z == kOutlierMark) row_outlier[e.row_base + i / e.row_len] = 1;
    });
  }

  bool rows_equal(uint64_t p, uint64_t a, uint64_t b) const {
    const DevicePiece& e = t.pieces[p];
    const uint32_t* c = codes.data() + e.elem_base;
    const bool lossy = !st[p].rule.lossless;
    for (uint64_t i = 0; i < e.row_len; ++i) {
      const uint32_t ca = c[a * e.row_len + i], cb = c[b * e.row_len + i];
      if (ca != cb) return false;
      if (lossy && ca == kOutlierMark && xp(p)[a * e.row_len + i] != xp(p)[b * e.row_len + i])
        return false;
    }
    return true;
  }

  void dedup(bool any_dedup) {
    if (any_dedup) {
      std::vector<uint64_t> keys(t.rows);
      std::vector<uint32_t> rows(t.rows);
      each_item(t, kWarps, [&](uint64_t p) { return t.pieces[p].n_rows; }, [&](uint64_t p, uint64_t r) {
        const DevicePiece& e = t.pieces[p];
        uint32_t h = 0;
        for (uint64_t i = 0; e.dedups && i < e.row_len; ++i)
          h += row_hash_term(codes[e.elem_base + r * e.row_len + i],
                             (uint32_t)xp(p)[r * e.row_len + i], i, !st[p].rule.lossless);
        keys[e.row_base + r] = dedup_key(p, e.dedups ? row_hash_key(h, e.row_len) : 0);
        rows[e.row_base + r] = (uint32_t)r;
      });
      std::vector<size_t> order(t.rows);
      std::iota(order.begin(), order.end(), 0);
      const uint64_t mask = ((uint64_t)1 << dedup_key_bits(t.pieces.size())) - 1;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return (keys[a] & mask) < (keys[b] & mask); });
      std::vector<uint64_t> keys_sorted(t.rows), head(t.rows), run_start(t.rows);
      std::vector<uint32_t> rows_sorted(t.rows);
      for (size_t i = 0; i < order.size(); ++i) {
        keys_sorted[i] = keys[order[i]];
        rows_sorted[i] = rows[order[i]];
      }
      for (uint64_t q = 0; q < t.rows; ++q) head[q] = run_head(keys_sorted.data(), q);
      for (uint64_t q = 0, m = 0; q < t.rows; ++q) run_start[q] = m = std::max(m, head[q]);
      each_item(t, kWarps, [&](uint64_t p) { return t.pieces[p].n_rows; }, [&](uint64_t p, uint64_t q) {
        const DevicePiece& e = t.pieces[p];
        if (!e.dedups) {
          flag[e.row_base + q] = 0;
          return;
        }
        const uint32_t r = rows_sorted[e.row_base + q];
        uint32_t f = r;
        for (uint64_t o = run_start[e.row_base + q] - e.row_base; o < q; ++o)
          if (rows_equal(p, rows_sorted[e.row_base + o], r)) {
            f = rows_sorted[e.row_base + o];
            break;
          }
        first_of[e.row_base + r] = f;
        flag[e.row_base + r] = f == r;
      });
      const std::vector<uint32_t> uid = exclusive_sum(flag);
      each_item(t, kThreads, [&](uint64_t p) { return t.pieces[p].dedups ? t.pieces[p].n_rows : 0; },
                [&](uint64_t p, uint64_t r) {
                  const DevicePiece& e = t.pieces[p];
                  map[e.row_base + r] = scan_local(uid.data(), e.row_base, first_of[e.row_base + r]);
                  const uint32_t u = scan_local(uid.data(), e.row_base, r);
                  if (flag[e.row_base + r]) first[e.row_base + u] = (uint32_t)r;
                  if (r == e.n_rows - 1) st[p].n_unique_found = (uint64_t)u + flag[e.row_base + r];
                });
    }
    each_piece(t, [&](uint64_t p) {
      const DevicePiece& e = t.pieces[p];
      rows_layout(&st[p], e, codes.data() + e.elem_base, gathered.data() + e.elem_base);
    });
    each_item(t, kWarps, [&](uint64_t p) { return st[p].identity ? 0 : st[p].n_unique; },
              [&](uint64_t p, uint64_t u) {
                const DevicePiece& e = t.pieces[p];
                memcpy(&gathered[e.elem_base + u * e.row_len],
                       &codes[e.elem_base + (uint64_t)first[e.row_base + u] * e.row_len],
                       e.row_len * 4);
              });
    each_item(t, kWarps, [&](uint64_t p) { return t.pieces[p].n_rows; }, [&](uint64_t p, uint64_t u) {
      const DevicePiece& e = t.pieces[p];
      const EncodeState& s = st[p];
      uint64_t c = 0;
      if (!s.rule.lossless && u < s.n_unique &&
          row_outlier[e.row_base + (s.identity ? u : first[e.row_base + u])])
        for (uint64_t i = 0; i < e.row_len; ++i) {
          uint32_t& z = s.ucodes[u * e.row_len + i];
          if (z == kOutlierMark) {
            z = 0;
            ++c;
          }
        }
      out_count[e.row_base + u] = c;
    });
  }

  // A section's widths (block_widths_kernel; the code section also raises max_code), their
  // call-wide scan and sizes (section_bytes_kernel). vals(p): the piece's values; count(p).
  template <class Vals, class Count, class Bytes, class After>
  std::vector<uint64_t> size_section(std::vector<uint64_t>* w, Vals vals, Count count,
                                     uint64_t DevicePiece::*base, Bytes bytes, bool code,
                                     After after) {
    each_item(t, kWarps, [&](uint64_t p) { return hl_div_up(count(p), HL_BLOCK); },
              [&](uint64_t p, uint64_t blk) {
                const uint32_t* v = vals(p);
                uint32_t o = 0, m = 0;
                for (uint64_t i = blk * HL_BLOCK; i < count(p) && i < (blk + 1) * HL_BLOCK; ++i) {
                  o |= v[i];
                  m = std::max(m, v[i]);
                }
                if (code) st[p].max_code = std::max(st[p].max_code, m);
                (*w)[t.pieces[p].*base + blk] = bit_width(o);
              });
    std::vector<uint64_t> off = exclusive_sum(*w);
    each_piece(t, [&](uint64_t p) {
      const uint64_t nb = hl_div_up(count(p), HL_BLOCK);
      *bytes(p) = nb ? block_section_bytes(nb, scan_total(off.data(), w->data(), t.pieces[p].*base, nb))
                     : 0;
      after(p);
    });
    return off;
  }

  // pack_blocks_kernel: the block at sec(p) where written(p).
  template <class Vals, class Count, class Sec, class Written>
  void write_section(const std::vector<uint64_t>& w, const std::vector<uint64_t>& off, Vals vals,
                     Count count, uint64_t DevicePiece::*base, Sec sec, Written written) {
    each_item(t, kWarps, [&](uint64_t p) { return written(p) ? hl_div_up(count(p), HL_BLOCK) : 0; },
              [&](uint64_t p, uint64_t blk) {
                const uint64_t n = count(p), nb = hl_div_up(n, HL_BLOCK), b0 = t.pieces[p].*base;
                uint8_t* s = sec(p);
                const uint64_t cnt = std::min<uint64_t>(HL_BLOCK, n - blk * HL_BLOCK);
                s[blk] = (uint8_t)w[b0 + blk];
                for (uint32_t j = 0; j < w[b0 + blk]; ++j)
                  put_fixed_le(s + nb + 4 * (scan_local(off.data(), b0, blk) + j),
                               block_plane(vals(p) + blk * HL_BLOCK, cnt, j), 4);
              });
  }

  uint8_t* payload(uint64_t p) { return slots.data() + t.pieces[p].slot; }

  void sections() {
    auto map_vals = [&](uint64_t p) { return map.data() + t.pieces[p].row_base; };
    auto map_count = [&](uint64_t p) { return st[p].map_count; };
    const std::vector<uint64_t> moff = size_section(
        &width, map_vals, map_count, &DevicePiece::block_base,
        [&](uint64_t p) { return &st[p].map_bytes; }, false,
        [&](uint64_t p) { st[p].code_off = st[p].map_bytes; });
    write_section(width, moff, map_vals, map_count, &DevicePiece::block_base,
                  [&](uint64_t p) { return payload(p); }, [](uint64_t) { return true; });

    auto code_vals = [&](uint64_t p) { return (const uint32_t*)st[p].ucodes; };
    auto code_count = [&](uint64_t p) { return st[p].n_codes; };
    const std::vector<uint64_t> coff = size_section(
        &width, code_vals, code_count, &DevicePiece::block_base,
        [&](uint64_t p) { return &st[p].code_bytes; }, true,
        [&](uint64_t p) { radix_plan(&st[p]); });
    each_item(t, kThreads, [&](uint64_t p) { return st[p].radix_G; }, [&](uint64_t p, uint64_t j) {
      const EncodeState& s = st[p];
      values[t.pieces[p].value_base + j] =
          radix_value(s.ucodes, s.n_codes, s.radix_G, s.radix_g, s.radix_k, j);
    });
    auto radix_vals = [&](uint64_t p) { return values.data() + t.pieces[p].value_base; };
    auto radix_count = [&](uint64_t p) { return st[p].radix_G; };
    const std::vector<uint64_t> roff = size_section(
        &rwidth, radix_vals, radix_count, &DevicePiece::rblock_base,
        [&](uint64_t p) { return &st[p].radix_vals_bytes; }, false, [](uint64_t) {});
    auto shorts = [&](uint64_t p) {
      return !st[p].rule.lossless && short_applies(st[p].n_codes, st[p].max_code);
    };
    each_item(t, kWarps, [&](uint64_t p) { return shorts(p) ? short_n_blocks(st[p].n_codes) : 0; },
              [&](uint64_t p, uint64_t blk) {
                uint32_t o = 0;
                for (uint64_t i = blk * HL_SHORT_BLOCK;
                     i < st[p].n_codes && i < (blk + 1) * HL_SHORT_BLOCK; ++i)
                  o |= st[p].ucodes[i];
                swidth[t.pieces[p].sblock_base + blk] = bit_width(o);
              });
    const std::vector<uint64_t> soff = exclusive_sum(swidth);
    each_piece(t, [&](uint64_t p) {
      EncodeState& s = st[p];
      const uint64_t b0 = t.pieces[p].sblock_base;
      choose_packing(&s, shorts(p) ? scan_total(soff.data(), swidth.data(), b0, short_n_blocks(s.n_codes))
                                   : 0);
      if (s.packing == HL_PACK_RADIX) radix_put_head(payload(p) + s.code_off, s.radix_k, s.radix_g);
    });
    write_section(width, coff, code_vals, code_count, &DevicePiece::block_base,
                  [&](uint64_t p) { return payload(p) + st[p].code_off; },
                  [&](uint64_t p) { return st[p].packing == HL_PACK_BLOCK; });
    write_section(rwidth, roff, radix_vals, radix_count, &DevicePiece::rblock_base,
                  [&](uint64_t p) { return payload(p) + st[p].code_off + st[p].radix_head; },
                  [&](uint64_t p) { return st[p].packing == HL_PACK_RADIX; });
    // short_write_kernel: the mark, a nibble byte a thread, two blocks a warp
    each_piece(t, [&](uint64_t p) {
      if (st[p].packing == HL_PACK_SHORT) payload(p)[st[p].code_off] = HL_SHORT_MARK;
    });
    auto short_pairs = [&](uint64_t p) {
      return st[p].packing == HL_PACK_SHORT ? hl_div_up(short_n_blocks(st[p].n_codes), 2) : 0;
    };
    each_item(t, kThreads, short_pairs, [&](uint64_t p, uint64_t q) {
      const uint64_t nb = short_n_blocks(st[p].n_codes), b0 = t.pieces[p].sblock_base;
      payload(p)[st[p].code_off + 1 + q] = short_nibble_byte(
          (uint32_t)swidth[b0 + 2 * q], 2 * q + 1 < nb ? (uint32_t)swidth[b0 + 2 * q + 1] : 0u);
    });
    each_item(t, kWarps, short_pairs, [&](uint64_t p, uint64_t q) {
      const EncodeState& s = st[p];
      const uint64_t n = s.n_codes, nb = short_n_blocks(n), b0 = t.pieces[p].sblock_base;
      uint8_t* sec = payload(p) + s.code_off + short_head_bytes(n);
      for (uint64_t blk = 2 * q; blk < 2 * q + 2 && blk < nb; ++blk) {
        const uint64_t cnt = std::min<uint64_t>(HL_SHORT_BLOCK, n - blk * HL_SHORT_BLOCK);
        for (uint32_t j = 0; j < swidth[b0 + blk]; ++j)
          put_fixed_le(sec + 2 * (scan_local(soff.data(), b0, blk) + j),
                       short_plane(s.ucodes + blk * HL_SHORT_BLOCK, cnt, j), 2);
      }
    });
  }

  void outliers(uint8_t dtype) {
    const std::vector<uint64_t> out_off = exclusive_sum(out_count);
    each_piece(t, [&](uint64_t p) {
      const DevicePiece& e = t.pieces[p];
      decide_piece(&st[p], e, dtype, scan_total(out_off.data(), out_count.data(), e.row_base, e.n_rows));
    });
    auto rows_with = [&](uint64_t p) {
      const EncodeState& s = st[p];
      return s.rule.lossless || s.fallback || !s.n_outliers ? 0 : s.n_unique;
    };
    each_item(t, kWarps, rows_with, [&](uint64_t p, uint64_t u) {
      const DevicePiece& e = t.pieces[p];
      const EncodeState& s = st[p];
      if (out_count[e.row_base + u] == 0) return;
      const uint64_t d = e.row_len, r = s.identity ? u : first[e.row_base + u];
      const uint8_t pos_bytes = outlier_pos_bytes(s.n_unique * d);
      const uint64_t rec_bytes = pos_bytes + sizeof(raw_t);
      uint64_t k = scan_local(out_off.data(), e.row_base, u);
      for (uint64_t i = 0; i < d; ++i) {
        const raw_t raw = xp(p)[r * d + i];
        if (element_code<DT>(s.rule, raw, r * d + i) == kOutlierMark)
          put_outlier(payload(p) + s.outlier_off + rec_bytes * k++, u * d + i, raw, pos_bytes,
                      sizeof(raw_t));
      }
    });
  }

  void run(bool any_dedup, uint8_t dtype) {
    quantize();
    dedup(any_dedup);
    sections();
    outliers(dtype);
  }
};

// compress_into's layout of the pieces c (level 1) by the emulated batch: (layout bytes, sizes
// a piece, bytes a group), the unwritten gaps (prefixes) 0xab.
template <int DT>
std::string encode_frames(const typename Elem<DT>::raw_t* x, const Pieces& c, bool dedup,
                          const std::vector<int64_t>& groups, uint64_t prefix_bytes,
                          const std::string& ext, const std::vector<int64_t>& trailing,
                          std::vector<uint64_t>* sizes, std::vector<uint64_t>* group_bytes) {
  PieceTable table = piece_table(c, dedup);
  const bool any_dedup = table.dedup_rows > 0;
  Batch<DT> b(std::move(table), x);
  b.run(any_dedup, (uint8_t)DT);
  bool again = false;  // the second round: the pieces that fell back, lossless
  for (size_t p = 0; p < b.t.pieces.size(); ++p) {
    const bool redo = b.st[p].fallback && !b.st[p].error;
    b.t.pieces[p].active = redo;
    b.t.pieces[p].force_lossless = redo;
    again |= redo;
  }
  if (again) b.run(any_dedup, (uint8_t)DT);
  const size_t n = c.shapes.size();
  std::vector<SegmentDesc> descs(n);
  std::vector<uint32_t> seeds(n);
  std::vector<uint64_t> payload_bytes(n), slot(n);
  for (size_t i = 0; i < n; ++i) {
    const EncodeState& s = b.st[i];
    if (s.error) absolute_bound(c.params[i], b.range[i].first, b.range[i].second);  // throws
    SegmentFound r = piece_result(s, 0, 0).found;
    r.seed = seeds[i] = c.params[i].dither_seed;
    descs[i] = descriptor_of(r, c.params[i].mode, c.shapes[i]);
    payload_bytes[i] = r.payload_bytes;
    slot[i] = b.t.pieces[i].slot;
  }
  const FramesPlan plan = plan_device_frames(descs, c.shapes, groups, prefix_bytes, ext, trailing,
                                             (uint8_t)DT, seeds);
  const FrameMoves m = frame_moves(plan, payload_bytes, slot);
  std::string out(plan.end, '\xab');
  uint8_t* o = reinterpret_cast<uint8_t*>(&out[0]);
  for (const FrameCopy& cp : m.copies)
    memcpy(o + cp.dst, (cp.from_heads ? plan.heads.data() : b.slots.data()) + cp.src, cp.len);
  for (const FrameSeal& f : m.seals)
    put_fixed_le(o + f.at + 3,
                 crc32c_in_pieces(o + f.at + HL_FRAME_PREFIX, f.total - HL_FRAME_PREFIX, 1024), 4);
  *sizes = plan.sizes;
  *group_bytes = plan.group_bytes;
  return out;
}

}  // namespace batchref
}  // namespace hl
