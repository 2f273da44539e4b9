"""Where a destination's frame bytes go at small sizes (issue #10): the wire benchmark's chunk
(13 Criteo tables of dim 32, `rows` lookups a table, rel-eb 0.03, level 2, one format-2 frame
of 13 segments, as rank 0 sends rank 1), cut into header, descriptors, row maps, rANS tables,
escapes, stream lengths, stream states, rANS bytes and outliers, next to the codes' order-0
entropy and what one table shared by the frame's segments would cost.

    python -m hvd_lossy.bench.frame_bytes [--rows 64,256,1024] [--json PATH]

Deterministic (no timing): the bytes are the codec's.
"""
import argparse
import json
import math
import pathlib

import torch

import hvd_lossy
from hvd_lossy.bench.wire import RANKS, TABLES

RANS_CHUNK = 4096
ESC = 255


def varint_at(data, at):
    """(value, position after it) of the LEB128 varint at data[at] (frame.h)."""
    v, shift = 0, 0
    while True:
        b = data[at]
        at += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, at


def rans_parts(section, n_codes):
    """Bytes of a compact rANS section by part (frame.h's layout)."""
    k, w = section[0] + 1, section[1]
    table = 2 + (k * w + 7) // 8
    n_esc, at = varint_at(section, table)
    for _ in range(n_esc):
        _v, at = varint_at(section, at)
    escapes = at - table
    n_streams = -(-n_codes // RANS_CHUNK)
    start = at
    for _ in range(n_streams - 1):
        _v, at = varint_at(section, at)
    lengths = at - start
    states = 4 * n_streams
    return {"rans_tables": table, "escapes": escapes, "stream_lengths": lengths,
            "stream_states": states, "rans_bytes": len(section) - at - states}


def _symbols(seg_rows, eb_abs):
    """Level-2 symbols of a segment's unique rows (the codec's quantizer, zigzag, escapes)."""
    q = torch.round(seg_rows.double() / (2 * eb_abs)).to(torch.int64)
    q = torch.unique(q, dim=0)  # the codec stores each distinct row once (order is free)
    z = torch.where(q >= 0, 2 * q, -2 * q - 1).flatten()
    return torch.clamp(z, max=ESC)


def _entropy_bytes(counts, model=None):
    """Bytes of coding `counts` with the distribution `model` (default: their own)."""
    model = counts if model is None else model
    total, mtotal = counts.sum().item(), model.sum().item()
    bits = 0.0
    for c, m in zip(counts.tolist(), model.tolist()):
        if c:
            bits -= c * math.log2(m / mtotal)
    return bits / 8 if total else 0.0


def breakdown(rows):
    from hvd_lossy.bench.alltoall import message
    from hvd_lossy.bench.criteo import load_sparse_ids
    ids, cards = load_sparse_ids()
    x, _ = message(torch.from_numpy(ids), cards, 0, RANKS, rows)
    chunk = x[x.shape[0] // RANKS:].contiguous()
    frame, _ = hvd_lossy.compress_chunks(chunk, [rows] * TABLES, 0.03, level=2)
    info = hvd_lossy.frame_info(frame)
    data = frame.numpy().tobytes()
    parts = dict(header=info["header_bytes"], descriptors=0, rans_tables=0, escapes=0,
                 stream_lengths=0, stream_states=0, rans_bytes=0, level1_codes=0, outliers=0)
    at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                    - s["outlier_bytes"] for s in info["segments"])
    parts["descriptors"] = at - info["header_bytes"]
    own_entropy, counts_all, seg_counts = 0.0, torch.zeros(ESC + 1, dtype=torch.int64), []
    for k, s in enumerate(info["segments"]):
        if s.get("map_bucketed"):  # absent before bucketed maps
            rans_len, start = varint_at(data, at)
            for name, n in rans_parts(data[start:start + rans_len], s["n_rows"]).items():
                parts["map_" + name] = parts.get("map_" + name, 0) + n
            parts["map_extra_bits"] = (parts.get("map_extra_bits", 0) + s["map_bytes"]
                                       - rans_len - (start - at))
            parts["map_lengths"] = parts.get("map_lengths", 0) + start - at
        elif s["map_coded"]:
            for name, n in rans_parts(data[at:at + s["map_bytes"]], s["n_rows"]).items():
                parts["map_" + name] = parts.get("map_" + name, 0) + n
        else:
            parts["maps_packed"] = parts.get("maps_packed", 0) + s["map_bytes"]
        at += s["map_bytes"]
        code = data[at:at + s["code_bytes"]]
        at += s["code_bytes"] + s["outlier_bytes"]
        parts["outliers"] += s["outlier_bytes"]
        if s["level"] == 2:
            for name, n in rans_parts(code, s["n_unique"] * s["row_len"]).items():
                parts[name] += n
        else:
            parts["level1_codes"] += len(code)
        sym = _symbols(chunk[k * rows:(k + 1) * rows], s["eb_abs"])
        counts = torch.bincount(sym, minlength=ESC + 1)
        seg_counts.append(counts)
        counts_all += counts
        own_entropy += _entropy_bytes(counts)
    shared = sum(_entropy_bytes(c, counts_all) for c in seg_counts)
    return {"rows": rows, "raw": chunk.numel() * 4, "frame_bytes": len(data), "parts": parts,
            "segments": len(info["segments"]),
            "entropy_own_tables": own_entropy, "entropy_one_shared_table": shared,
            "symbols_present": int((counts_all > 0).sum())}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hvd_lossy.bench.frame_bytes",
                                description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[64, 256, 1024])
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    results = [breakdown(r) for r in args.rows]
    for r in results:
        print(f"rows {r['rows']}: frame {r['frame_bytes']} B, ratio {r['raw'] / r['frame_bytes']:.2f}x")
        for name, n in r["parts"].items():
            print(f"  {name:>15} {n:7d} B  {100 * n / r['frame_bytes']:5.1f}%")
        print(f"  codes' order-0 entropy: own tables {r['entropy_own_tables']:.0f} B, one shared "
              f"table {r['entropy_one_shared_table']:.0f} B ({r['symbols_present']} symbols)")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "frame_bytes", "results": results}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
