"""`python -m hvd_lossy.bench codec --reuse`: how much of each call a destination already holds,
and the bytes hvd_lossy.reuse sends for it against today's frames.

Calls of one destination's chunk (--reuse-tables segments of --reuse-rows rows, dim --reuse-dim)
look up Zipf ids in tables whose every row moves by --reuse-step bounds' worth of noise between
calls (an optimizer step); each chunk is coded as today (compress_chunks, dedup by id) and by a
ReuseEncoder, whose peer's ReuseDecoder decodes it. Reported per call window: the shares of rows
sent as references (the held row itself), residuals (the held row corrected) and fresh, and the
bytes of both. Every decoded element is checked against the current value. Bytes are
deterministic for a seed.

Then the compress time a row of one call shaped like the example's forward one (13 segments of
512 rows, dim 128 unless --dims), one thread, medians of --repeat calls taken in turn: coded as
today (compress_chunks, dedup by id), through a ReuseEncoder that holds none of the rows (every
row fresh), and through one that holds them all unchanged (every row a reference); and the
encoders' frames decoded and checked.
"""
import statistics
import time

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


def looked_up(g, rows, tables, dim, table_rows, zipf):
    """(x, ids) of one call: Zipf ids a segment, each distinct id's row drawn once, so that a
    repeated id repeats its row."""
    ids = torch.cat([zipf_ids(g, rows, table_rows, zipf) + t * table_rows for t in range(tables)])
    uniq, inverse = ids.unique(return_inverse=True)
    return (torch.randn(len(uniq), dim, generator=g) * 0.05)[inverse], ids


def time_rows(rows=512, tables=13, dim=128, table_rows=100_000, zipf=1.05, bound=0.03,
              repeat=20, seed=0):
    """Compress time a row (seconds) of one call coded three ways, in turn, one thread: "coded"
    (compress_chunks as today), "fresh" (a ReuseEncoder holding none of its ids: each call
    gives it new ones) and "reused" (one holding every row unchanged). Each encoder's frame is
    then decoded by its peer (outside the clock) and every element checked against its bound."""
    hvd_lossy.set_num_threads(1)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    x, ids = looked_up(g, rows, tables, dim, table_rows, zipf)
    seg_rows = [rows] * tables
    ebs = [reuse.absolute_bound(xs, bound, "rel") for xs in x.split(seg_rows)]
    pairs = {k: (reuse.ReuseEncoder(bound, capacity=1 << 14), reuse.ReuseDecoder(1 << 14))
             for k in ("fresh", "reused")}

    def through(kind, keys, clock):
        enc, dec = pairs[kind]
        t0 = time.perf_counter()
        frame, predicted = enc.encode(x, keys, seg_rows)
        clock.append(time.perf_counter() - t0)
        out = dec.decode(frame, keys, predicted)
        for xs, hs, eb in zip(x.split(seg_rows), out.split(seg_rows), ebs):
            if float((xs.double() - hs.double()).abs().max()) > eb:
                raise AssertionError(f"{kind}: a decoded element misses its bound {eb}")
        return enc.last

    through("reused", ids, [])  # now held
    times = {"coded": [], "fresh": [], "reused": []}
    for call in range(max(1, repeat)):
        t0 = time.perf_counter()
        hvd_lossy.compress_chunks(x, seg_rows, bound, ids=ids)
        times["coded"].append(time.perf_counter() - t0)
        through("fresh", ids + (call + 1) * tables * table_rows, times["fresh"])
        last = through("reused", ids, times["reused"])
    n = x.shape[0]
    per_row = {k: statistics.median(v) / n for k, v in times.items()}
    # (ids that share a slot of the direct-mapped caches evict each other: those come fresh)
    return {"rows": n, "dim": dim, "segments": tables, "repeat": repeat,
            "reused_call": last, "seconds_per_row": per_row,
            "reused_over_coded": per_row["reused"] / per_row["coded"],
            "reused_over_fresh": per_row["reused"] / per_row["fresh"]}


def print_time(t):
    ns = {k: v * 1e9 for k, v in t["seconds_per_row"].items()}
    print(f"compress time a row ({t['segments']} x {t['rows'] // t['segments']} rows, dim "
          f"{t['dim']}, one thread, medians of {t['repeat']} calls): coded {ns['coded']:.0f} ns, "
          f"fresh {ns['fresh']:.0f} ns, reused {ns['reused']:.0f} ns (its call "
          f"{t['reused_call']['references'] / t['rows']:.1%} references); a reused row takes "
          f"{t['reused_over_coded']:.2f}x a coded row's time, {t['reused_over_fresh']:.2f}x "
          f"a fresh one's")
