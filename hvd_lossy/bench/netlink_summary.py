"""The summaries and tables of `python -m hvd_lossy.bench netlink` (hvd_lossy.bench.netlink):
its runs' records, one per (rate, ranks, setting, mode) or all-to-all size, as medians over the
rounds with speedups against the baseline mode, the rounds' spread and auto's decisions; the
printed tables and the PNG. Pure functions of the records, so they read the JSON of any run."""
import collections
import statistics

import numpy as np

DLRM_BASELINE = "uncompressed"
A2A_BASELINE = "plain"
BOOTSTRAP_RESAMPLES = 10_000
_POOL_STRIDE = 1_000_000  # rounds a file, at the most, when pooled


def _median(xs):
    return statistics.median(xs) if xs else None


def _mean(xs):
    return statistics.fmean(xs) if xs else None


def _grouped(rows, keys):
    """(values of `keys`, the rows that share them) pairs, in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups.items()


def _add_speedups(out, baseline, keys, seconds):
    """Sets each record's speedup over the record of mode `baseline` that shares its `keys`,
    by their `seconds` fields; returns those baseline records (None where none), in order."""
    bases = []
    for rec in out:
        base = next((b for b in out if b["mode"] == baseline
                     and all(b[k] == rec[k] for k in keys)), None)
        t0 = base and base[seconds]
        rec["speedup"] = t0 / rec[seconds] if t0 and rec[seconds] else None
        bases.append(base)
    return bases


def summarise_dlrm(runs):
    """One record per (rate, ranks, setting, mode): medians over the repeats, speedup against
    uncompressed at the same rate, ranks and setting."""
    out = []
    for (rate, ranks, setting, mode), rs in _grouped(
            runs, ("bandwidth_gbit", "ranks", "setting", "mode")):
        ok = [r for r in rs if r["status"] == "ok"]
        rec = {"bandwidth_gbit": rate, "ranks": ranks, "setting": setting, "mode": mode,
               "runs": len(rs), "ok_runs": len(ok), "status": "ok" if ok else "failed",
               "iter_seconds_median": _median([r["iter_seconds_median"] for r in ok]),
               "steps_seconds_total": _median([r["steps_seconds_total"] for r in ok if "steps_seconds_total" in r]),
               "auc": _mean([r["auc"] for r in ok if r.get("auc") is not None]),
               "wire_bytes": _median([r["wire_bytes"] for r in ok]),
               "a2a_bytes_sent": _median([r["a2a_bytes_sent"] for r in ok if "a2a_bytes_sent" in r]),
               "compression_ratio": _median([r["compression_ratio"] for r in ok if "compression_ratio" in r]),
               "train_args": rs[0]["train_args"]}
        if not ok:
            rec["error"] = rs[0]["error"]
        out.append(rec)
    bases = _add_speedups(out, DLRM_BASELINE, ("bandwidth_gbit", "ranks", "setting"),
                          "iter_seconds_median")
    for rec in out:
        ratios = _paired_ratios(runs, rec, DLRM_BASELINE)
        rec["speedup_paired"] = _median(ratios) or None
        # the rounds' spread: what a single round of this machine moves a paired figure by
        rec["paired_range"] = [min(ratios), max(ratios)] if ratios else None
        rec["speedup_geomean"], rec["speedup_interval"] = paired_interval(ratios)
        rec["auto_decisions"] = _auto_decisions(runs, rec)
    for rec, base in zip(out, bases):  # what a user waits for, probing and warm-up included
        t0, t = base and base["steps_seconds_total"], rec["steps_seconds_total"]
        rec["speedup_total"] = t0 / t if t0 and t else None
    for rec, base in zip(out, bases):
        rec["auc_delta"] = (rec["auc"] - base["auc"]) if base and base["auc"] is not None and \
            rec["auc"] is not None else None
        free = next((b for b in out if b["mode"] == DLRM_BASELINE and b["bandwidth_gbit"] is None
                     and b["ranks"] == rec["ranks"] and b["setting"] == rec["setting"]), None)
        t_free, t_here = free and free["iter_seconds_median"], base and base["iter_seconds_median"]
        rec["ceiling"] = t_here / t_free if t_free and t_here else None
        rec["ceiling_share"], rec["ceiling_share_interval"] = (None, None) if free is None or \
            rec["bandwidth_gbit"] is None else ratio_interval(_steps_by_run(runs, free, rec))
    return out


def _steps_by_run(runs, num, den):
    """Per run of the benchmark (one JSON; pool_runs numbers each file's rounds apart), the
    median steps of cell num's ok runs and of cell den's: [(nums, dens)], runs with both."""
    groups = {}
    for r in filter(_timed, runs):
        g = groups.setdefault((r.get("repeat") or 0) // _POOL_STRIDE, ([], []))
        for side, rec in zip(g, (num, den)):
            if _same_cell(r, rec):
                side.append(r["iter_seconds_median"])
    return [g for g in groups.values() if g[0] and g[1]]


def _timed(r):
    """Whether run r ended ok with a median step."""
    return r["status"] == "ok" and bool(r.get("iter_seconds_median"))


def _same_cell(r, rec):
    return all(r[k] == rec[k] for k in ("bandwidth_gbit", "ranks", "setting", "mode"))


def _paired_ratios(runs, rec, baseline):
    """Per round, in round order, the baseline's median step / rec's mode's, each round's two
    runs taken back to back (rounds where both ran)."""
    def steps(mode):
        return {r.get("repeat"): r["iter_seconds_median"] for r in runs
                if _timed(r) and _same_cell(r, dict(rec, mode=mode))}
    mine, base = steps(rec["mode"]), steps(baseline)
    return [base[k] / mine[k] for k in sorted(k for k in mine if k is not None and k in base)]


def paired_interval(ratios, resamples=BOOTSTRAP_RESAMPLES, seed=0):
    """(the geometric mean of a cell's paired ratios, [low, high] its 95% bootstrap interval),
    or (None, None) under two rounds. A target within a few percent of 1 is decided by the
    interval, not by one round or the median of a few: rounds on a busy 2-core machine move
    +-15-25% (the mean of logs, resampled with a fixed seed, so a summary reads the same twice)."""
    if len(ratios) < 2:
        return None, None
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    picks = np.random.default_rng(seed).integers(0, len(logs), (resamples, len(logs)))
    low, high = np.exp(np.percentile(logs[picks].mean(axis=1), [2.5, 97.5]))
    return float(np.exp(logs.mean())), [float(low), float(high)]


def ratio_interval(groups, resamples=BOOTSTRAP_RESAMPLES, seed=0):
    """The ratio of two samples' geometric means with its 95% bootstrap interval, the samples
    resampled apart: (ratio, [low, high]), or (None, None) under two of either. For a share of
    the ceiling, plain's steps on the unlimited link over a mode's at a rate: rates run one
    after another, minutes apart, so no round pairs them, but a run of the benchmark does:
    groups is [(nums, dens)] a run, each run's log ratio weighted by its dens (a slow batch of
    the machine must not lift or sink only one side of a pooled figure)."""
    groups = [(np.log(np.asarray(n, dtype=np.float64)), np.log(np.asarray(d, dtype=np.float64)))
              for n, d in groups]
    if sum(len(n) for n, _ in groups) < 2 or sum(len(d) for _, d in groups) < 2:
        return None, None
    rng = np.random.default_rng(seed)
    weights = np.array([len(d) for _, d in groups], dtype=np.float64)
    weights /= weights.sum()

    def resampled(x):
        return x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)

    point = sum(w * (n.mean() - d.mean()) for w, (n, d) in zip(weights, groups))
    boot = sum(w * (resampled(n) - resampled(d)) for w, (n, d) in zip(weights, groups))
    low, high = np.exp(np.percentile(boot, [2.5, 97.5]))
    return float(np.exp(point)), [float(low), float(high)]


def pool_runs(run_lists):
    """The training runs of several netlink JSONs (their "dlrm_runs") as one list to summarise:
    each file's rounds renumbered apart, so a round's pair stays within its own run of the
    benchmark and cells of the same (rate, ranks, setting, mode) pool their rounds."""
    pooled = []
    for k, runs in enumerate(run_lists):
        for r in runs:
            r = dict(r)
            if r.get("repeat") is not None:
                r["repeat"] = k * _POOL_STRIDE + r["repeat"]
            pooled.append(r)
    return pooled


def _auto_decisions(runs, rec):
    """Per ok run of the cell, in round order, what its first auto compressor (the forward
    one) decided and how many of its calls were lossy: [decision, lossy_calls, calls]; None
    where no run reported auto."""
    out = []
    for r in sorted((r for r in runs if r["status"] == "ok" and _same_cell(r, rec)),
                    key=lambda r: r.get("repeat") or 0):
        report = (r.get("auto") or [None])[0]
        if report:
            out.append([report.get("decision"), report.get("lossy_calls"), report.get("calls")])
    return out or None


def _decisions_text(decisions):
    """auto_decisions as 'plain 4 (5-8 lossy)': each decision's runs, the lossy calls' range."""
    if not decisions:
        return ""
    counts = collections.Counter(d for d, _n, _c in decisions)
    lossy = [n for _d, n, _c in decisions if n is not None]
    calls = f" ({min(lossy)}-{max(lossy)} lossy)" if lossy else ""
    return ", ".join(f"{d} {k}" for d, k in sorted(counts.items(), key=str)) + calls


def summarise_alltoall(rows):
    """One record per (rate, ranks, mode, bytes): medians over the repeats, speedup vs plain."""
    out = []
    for (rate, ranks, mode, size), rs in _grouped(rows, ("bandwidth_gbit", "ranks", "mode",
                                                         "bytes")):
        ok = [r for r in rs if r["status"] == "ok"]
        failed = [r for r in rs if r["status"] != "ok"]
        rec = {"bandwidth_gbit": rate, "ranks": ranks, "mode": mode, "bytes": size,
               "status": "ok" if ok and not failed else "failed",
               "ms_per_call": _median([r["ms_per_call"] for r in ok]),
               "ms_per_call_runs": [r["ms_per_call"] for r in ok],
               "wire_bytes": _median([r["link_bytes_per_call"] for r in ok])}
        if failed:
            rec["error"] = failed[0]["error"]
        out.append(rec)
    _add_speedups(out, A2A_BASELINE, ("bandwidth_gbit", "ranks", "bytes"), "ms_per_call")
    return out


def rate_label(rate):
    return "unlimited" if rate is None else f"{rate:g} Gbit/s"


def _fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def _range_text(pair):
    return "-" if not pair else f"{pair[0]:.2f}-{pair[1]:.2f}"


def _interval_text(geomean, interval):
    return "-" if geomean is None else f"{geomean:.3f} [{interval[0]:.3f}-{interval[1]:.3f}]"


def dlrm_table(records):
    lines = [f"{'link':>12} {'ranks':>5} {'setting':>12} {'mode':>12} {'ms/step':>9} {'speedup':>8} "
             f"{'paired':>8} {'rounds':>11} {'geomean [95%]':>20} {'total x':>8} {'ceiling':>8} "
             f"{'of ceiling [95%]':>20} "
             f"{'AUC':>7} {'dAUC':>8} "
             f"{'link MB':>9} {'a2a ratio':>9}  auto"]
    for r in records:
        row = (f"{rate_label(r['bandwidth_gbit']):>12} {r['ranks']:>5} {r['setting']:>12} {r['mode']:>12} "
               f"{_fmt(r['iter_seconds_median'] and 1e3 * r['iter_seconds_median'], '9.1f'):>9} "
               f"{_fmt(r['speedup'], '7.2f') + ('x' if r['speedup'] else ''):>8} "
               f"{_fmt(r.get('speedup_paired'), '7.2f') + ('x' if r.get('speedup_paired') else ''):>8} "
               f"{_range_text(r.get('paired_range')):>11} "
               f"{_interval_text(r.get('speedup_geomean'), r.get('speedup_interval')):>20} "
               f"{_fmt(r['speedup_total'], '7.2f') + ('x' if r['speedup_total'] else ''):>8} "
               f"{_fmt(r['ceiling'], '7.2f') + ('x' if r['ceiling'] else ''):>8} "
               f"{_interval_text(r.get('ceiling_share'), r.get('ceiling_share_interval')):>20} "
               f"{_fmt(r['auc'], '.4f'):>7} {_fmt(r['auc_delta'], '+.4f'):>8} "
               f"{_fmt(r['wire_bytes'] and r['wire_bytes'] / 1e6, '9.1f'):>9} "
               f"{_fmt(r['compression_ratio'], '8.1f') + ('x' if r['compression_ratio'] else ''):>9}"
               f"  {_decisions_text(r.get('auto_decisions'))}".rstrip())
        if r["status"] != "ok":
            row += f"  FAILED: {r['error']}"
        lines.append(row)
    return "\n".join(lines)


def alltoall_table(records):
    modes = list(dict.fromkeys(r["mode"] for r in records))
    keys = list(dict.fromkeys((r["bandwidth_gbit"], r["ranks"], r["bytes"]) for r in records
                              if r["bytes"] is not None))
    cell = {(r["bandwidth_gbit"], r["ranks"], r["bytes"], r["mode"]): r for r in records}
    lines = [f"{'link':>12} {'ranks':>5} {'MiB/rank':>9} " + " ".join(f"{m:>11}" for m in modes)
             + "   (ms per call, slowest rank; median over repeats)"]
    for rate, ranks, size in keys:
        cells = [cell.get((rate, ranks, size, m)) for m in modes]
        lines.append(f"{rate_label(rate):>12} {ranks:>5} {size / 2**20:9.4g} " + " ".join(
            f"{_fmt(c and c['ms_per_call'], '11.2f') if c and c['status'] == 'ok' else 'failed':>11}"
            for c in cells))
    errors = {r["mode"]: r["error"] for r in records if r["status"] != "ok"}
    lines += [f"  {m} failed: {e}" for m, e in errors.items()]
    return "\n".join(lines)


def write_png(path, dlrm, a2a):
    """Speedup against bandwidth: one panel per DLRM setting (a line per mode and rank count),
    and one for the all-to-all at its largest message."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted({r["bandwidth_gbit"] for r in dlrm + a2a}, key=lambda g: (g is None, g or 0))
    x = {g: i for i, g in enumerate(rates)}
    panels = [(f"DLRM, {s}", [r for r in dlrm if r["setting"] == s], lambda r: f"{r['mode']}, {r['ranks']} ranks")
              for s in dict.fromkeys(r["setting"] for r in dlrm)]
    # The largest message of each rank count (sizes differ a little: whole samples per rank).
    top = {}
    for r in a2a:
        if r["bytes"]:
            top[r["ranks"]] = max(top.get(r["ranks"], 0), r["bytes"])
    if top:
        panels.append((f"all-to-all, {max(top.values()) / 2**20:.3g} MiB a rank",
                       [r for r in a2a if r["bytes"] and r["bytes"] == top[r["ranks"]]],
                       lambda r: f"{r['mode']}, {r['ranks']} ranks"))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 4.2), squeeze=False)
    for ax, (title, recs, label) in zip(axes[0], panels):
        lines = {}
        for r in recs:  # the baselines are the dashed line at 1
            if r["speedup"] is not None and r["mode"] not in (DLRM_BASELINE, A2A_BASELINE):
                lines.setdefault((label(r), r["ranks"]), []).append((x[r["bandwidth_gbit"]], r["speedup"]))
        styles = ["-", "--", ":", "-."]  # one per rank count
        all_ranks = sorted({k[1] for k in lines})
        for (name, ranks), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                    ls=styles[all_ranks.index(ranks) % len(styles)])
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(rates)), [("unlimited" if g is None else f"{g:g}") for g in rates])
        ax.set_xlabel("link (Gbit/s)")
        ax.set_ylabel("speedup vs uncompressed")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
