"""`python -m hvd_lossy.bench codec --reuse`: how much of each call a destination already holds,
and the bytes hvd_lossy.reuse sends for it against today's frames.

Calls of one destination's chunk (--reuse-tables segments of --reuse-rows rows, dim --reuse-dim)
look up Zipf ids in tables whose every row moves by --reuse-step bounds' worth of noise between
calls (an optimizer step); each chunk is coded as today (compress_chunks, dedup by id) and by a
ReuseEncoder, whose peer's ReuseDecoder decodes it. Reported per call window: the shares of rows
sent as references (the held row itself), residuals (the held row corrected) and fresh, and the
bytes of both. Every decoded element is checked against the current value. Bytes are
deterministic for a seed; nothing is timed.
"""
import torch

import hvd_lossy
from hvd_lossy import reuse


def zipf_ids(g, n, table_rows, a):
    p = 1.0 / torch.arange(1, table_rows + 1, dtype=torch.float64) ** a
    return torch.multinomial(p, n, replacement=True, generator=g)


def measure(calls=40, rows=1024, dim=32, tables=4, table_rows=20_000, zipf=1.05, step=0.3,
            bound=0.03, seed=0, windows=4):
    """A list of windows of calls, each {"calls", "today_bytes", "reuse_bytes", "references",
    "residuals", "fresh", "rows"}, and the totals under "total"."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(tables, table_rows, dim, generator=g) * 0.05
    enc = reuse.ReuseEncoder(bound, capacity=1 << 16)
    dec = reuse.ReuseDecoder(capacity=1 << 16)
    seg_rows = [rows] * tables
    keys = ("today_bytes", "reuse_bytes", "references", "residuals", "fresh", "rows")
    out, window = [], dict.fromkeys(keys, 0)
    per = max(1, calls // windows)
    for call in range(calls):
        ids = [zipf_ids(g, rows, table_rows, zipf) for _ in range(tables)]
        x = torch.cat([weights[t][i] for t, i in enumerate(ids)])
        flat = torch.cat(ids)
        window["today_bytes"] += hvd_lossy.compress_chunks(x, seg_rows, bound, ids=flat)[1][0]
        frame, predicted = enc.encode(x, flat, seg_rows)
        x_hat = dec.decode(frame, flat, predicted)
        for xs, hs in zip(x.split(seg_rows), x_hat.split(seg_rows)):
            eb = reuse.absolute_bound(xs, bound, "rel")
            if float((xs.double() - hs.double()).abs().max()) > eb:
                raise AssertionError(f"call {call}: a decoded element misses the bound {eb}")
        window["reuse_bytes"] += frame.numel()
        for k in ("references", "residuals", "fresh", "rows"):
            window[k] += enc.last[k]
        eb_now = reuse.absolute_bound(x, bound, "rel")
        weights += step * eb_now * torch.randn(weights.shape, generator=g)
        if (call + 1) % per == 0 or call + 1 == calls:
            out.append({"calls": call + 1, **window})
            window = dict.fromkeys(keys, 0)
    total = {k: sum(w[k] for w in out) for k in keys}
    return {"windows": out, "total": total}


def print_share(result, step):
    print(f"reuse share (rows moving {step} bounds a call): calls, references / residuals / "
          f"fresh of the rows, bytes today -> with reuse")
    for w in result["windows"] + [dict(result["total"], calls="all")]:
        n = max(w["rows"], 1)
        print(f"  {w['calls']!s:>5}: {w['references'] / n:6.1%} / {w['residuals'] / n:6.1%} / "
              f"{w['fresh'] / n:6.1%}   {w['today_bytes']:>9} -> {w['reuse_bytes']:>9} "
              f"({w['today_bytes'] / max(w['reuse_bytes'], 1):.2f}x fewer)")
