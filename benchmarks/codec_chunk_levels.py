"""Codec time of one destination's chunk of a DLRM step, level 1 against level 2, one core.

    python benchmarks/codec_chunk_levels.py

The chunk: 13 tables x 512 lookups x dim 128 float32 (ids skewed to the first rows, u^4 of a
uniform u, into 100k-row tables initialised as DLRM does), compressed straight into a send
buffer as the alltoall does (compress_grouped) and decoded into a tensor (decompress_into); the
gradients are Gaussian, dithered. Prints ms and GB/s per call (median of 30) and the ratio.
"""
import torch

import hvd_lossy
from _timing import median_s

TABLES, ROWS, DIM, TABLE_ROWS, HEADER = 13, 512, 128, 100000, 152


def main():
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    scale = TABLE_ROWS ** -0.5
    tables = [(torch.rand(TABLE_ROWS, DIM, generator=g) * 2 - 1) * scale for _ in range(TABLES)]
    ids = [(TABLE_ROWS * torch.rand(ROWS, generator=g) ** 4).long() for _ in range(TABLES)]
    lookups = torch.cat([t[i] for t, i in zip(tables, ids)])
    grads = torch.randn(TABLES * ROWS, DIM, generator=g) * 1e-3
    rows = [ROWS] * TABLES
    out = torch.empty(hvd_lossy.max_grouped_bytes(rows, [DIM], [TABLES], HEADER), dtype=torch.uint8)
    for name, x, bound, dither in (("lookups", lookups, 0.03, None), ("gradients, dithered", grads, 0.02, 7)):
        for level in (1, 2):
            def compress():
                return hvd_lossy.compress_grouped(x, rows, [bound] * TABLES, [TABLES], HEADER, out, 0,
                                                  level=level, dither=dither)
            sizes = compress()
            y = torch.empty_like(x)
            c = 1e3 * median_s(compress, 30)
            d = 1e3 * median_s(lambda: hvd_lossy.decompress_into(out, [(HEADER, sum(sizes), TABLES * ROWS)], y))
            mb = x.numel() * 4 / 1e6
            print(f"{name}, level {level}: {mb:.2f} MB, ratio {x.numel() * 4 / sum(sizes):.1f}, "
                  f"compress {c:.2f} ms ({mb / c:.2f} GB/s), decode {d:.2f} ms ({mb / d:.2f} GB/s)")


if __name__ == "__main__":
    main()
