"""The codec at the exact chunk sizes of the validation's rank counts, against the model's codec
term (benchmarks/perfmodel_validate.py validates at P = 2, 4, 8; rows a chunk = 512 / P):

    python benchmarks/perfmodel_codec_sizes.py --json benchmarks/results/perfmodel_codec_sizes.json

For rank 0 of val-d128 at each P (its tables as the example places them), one thread, format 2 as
the example sends: the lookups it compresses (its k tables for each of the P-1 others, one group
a destination) and decodes (the 26-k other tables' chunks), the dithered gradients it compresses
and decodes on the way back, and fp16's casts of the same bytes. Side by side, in the same
process (so the machine's load hits both alike): the model's codec_work for rank 0 with the rates
fitted here, as `calibrate --parts codec` fits them (13 pieces of 64 and 1,024 rows, format 1).
"""
import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hvd_lossy  # noqa: E402
from hvd_lossy import perfmodel  # noqa: E402
from _timing import median_s  # noqa: E402
from perfmodel_calibrate import measure_codec, provenance  # noqa: E402

DIM, BATCH, HEADER = 128, 512, 152
LOOKUP_BOUND, GRAD_BOUND, DITHER = 0.03, 0.02, 7


def lookups(n, rng):
    ids = torch.from_numpy(np.minimum(rng.zipf(1.1, n) - 1, 99_999))
    return ((torch.rand(100_000, DIM) * 2 - 1) * 100_000 ** -0.5)[ids]


def coded_seconds(x, rows, groups, bound, dither):
    """(compress, decompress) seconds of `x` cut in pieces of `rows`, `groups` pieces a frame."""
    n = x.shape[0] // rows
    sizes = [rows] * n
    out = torch.empty(hvd_lossy.max_grouped_bytes(sizes, [DIM], groups, HEADER, format=2), dtype=torch.uint8)
    got = hvd_lossy.compress_grouped(x, sizes, [bound] * n, groups, HEADER, out, 0, dither=dither, format=2)
    sources, offset, k = [], 0, 0
    for g in groups:
        nbytes = sum(got[k:k + g])
        sources.append((offset + HEADER, nbytes, g * rows))
        offset, k = offset + HEADER + nbytes, k + g
    y = torch.empty_like(x)
    assert all(e is None for e in hvd_lossy.decompress_into(out, sources, y))
    c = median_s(lambda: hvd_lossy.compress_grouped(x, sizes, [bound] * n, groups, HEADER, out, 0, dither=dither,
                                                    format=2))
    d = median_s(lambda: hvd_lossy.decompress_into(out, sources, y))
    return c, d


def at_ranks(P, fits, rng):
    rows = BATCH // P
    cards = [min(c, 100_000) for c in perfmodel.KAGGLE]
    owned = perfmodel.place_tables(cards, P)
    k, T = len(owned[0]), len(cards)
    sent, received = perfmodel.a2a_bytes(owned, T, rows, DIM, P)
    out_pieces, in_pieces = k * (P - 1), T - k
    fwd_c, _ = coded_seconds(lookups(out_pieces * rows, rng), rows, [k] * (P - 1), LOOKUP_BOUND, None)
    _, fwd_d = coded_seconds(lookups(in_pieces * rows, rng), rows, [len(o) for o in owned[1:] if o], LOOKUP_BOUND,
                             None)
    bwd_c, _ = coded_seconds(torch.randn(in_pieces * rows, DIM) * 1e-3, rows, [len(o) for o in owned[1:] if o],
                             GRAD_BOUND, DITHER)
    _, bwd_d = coded_seconds(torch.randn(out_pieces * rows, DIM) * 1e-3, rows, [k] * (P - 1), GRAD_BOUND, DITHER)
    x = torch.randn(out_pieces * rows, DIM)
    r = torch.randn(in_pieces * rows, DIM)
    casts = (median_s(lambda: x.half()) + median_s(lambda: r.half().float()) + median_s(lambda: r.half())
             + median_s(lambda: x.half().float()))
    model = perfmodel.codec_work("lossy", sent, received, [out_pieces] * P, fits)[0]
    model_fp16 = perfmodel.codec_work("fp16", sent, received, [out_pieces] * P, fits)[0]
    measured = fwd_c + fwd_d + bwd_c + bwd_d
    return {"ranks": P, "rows_per_chunk": rows, "tables_owned": k, "pieces_out": out_pieces, "pieces_in": in_pieces,
            "lookups_compress_s": fwd_c, "lookups_decompress_s": fwd_d, "gradients_compress_s": bwd_c,
            "gradients_decompress_s": bwd_d, "codec_s": measured, "model_codec_s": model,
            "model_over_measured": model / measured, "fp16_casts_s": casts, "model_fp16_s": model_fp16}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4, 8])
    p.add_argument("--json", type=pathlib.Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    fits = measure_codec()
    fits["auto_call_s"] = 0.0
    rng = np.random.default_rng(1)
    rows = [at_ranks(P, fits, rng) for P in args.ranks]
    print(f"{'ranks':>5} {'rows':>5} {'pieces out/in':>13} {'codec ms':>9} {'model ms':>9} {'model/meas':>10} "
          f"{'fp16 ms':>8} {'model fp16':>10}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['rows_per_chunk']:>5} {r['pieces_out']:>6}/{r['pieces_in']:<6} "
              f"{1e3 * r['codec_s']:>9.3f} {1e3 * r['model_codec_s']:>9.3f} {r['model_over_measured']:>10.2f} "
              f"{1e3 * r['fp16_casts_s']:>8.3f} {1e3 * r['model_fp16_s']:>10.3f}")
    if args.json:
        prov = dict(provenance("rank 0's codec work at val-d128's chunk sizes, one thread, format 2"),
                    command="python benchmarks/perfmodel_codec_sizes.py " + " ".join(sys.argv[1:]))
        args.json.write_text(json.dumps({"provenance": prov, "fits": fits, "runs": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
