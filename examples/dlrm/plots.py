"""PNG plots of one run's metrics (the dict train.py writes with --metrics-out).

    python examples/dlrm/plots.py metrics.json plots/     # or train.py --plots plots/
"""

import json
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def write_all(m, out_dir):
    """Writes loss.png, auc.png, tables.png and time_split.png into out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [_loss(m, out_dir), _auc(m, out_dir), _tables(m, out_dir), _time_split(m, out_dir)]
    return [p for p in paths if p]


def _save(fig, out_dir, name, tight=True):
    path = os.path.join(out_dir, name)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _title(m, width=80):
    """The run's label, ranks and batch, then its compressor wrapped to `width` characters (a
    compressor's repr is longer than a plot is wide)."""
    head = "%s, %d ranks, batch %d" % (m.get("label") or m.get("compression", "run"), m["world"],
                                       m["batch_size"])
    detail = m.get("compressor")
    return head if not detail else head + "\n" + textwrap.fill(str(detail), width)


def _loss(m, out_dir):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    loss = np.asarray(m["loss_curve"])
    ax.plot(np.arange(1, len(loss) + 1), loss, lw=0.6, alpha=0.4, label="step")
    w = max(len(loss) // 50, 1)
    if len(loss) >= w:
        smooth = np.convolve(loss, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(w, len(loss) + 1), smooth, lw=1.5, label="mean of %d" % w)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (BCE, global batch)")
    ax.set_title(_title(m), fontsize=9)
    ax.legend()
    return _save(fig, out_dir, "loss.png")


def _auc(m, out_dir):
    curve = m.get("eval_curve") or []
    steps = [e["step"] for e in curve] + [m["steps"]]
    aucs = [e["auc"] for e in curve] + [m["auc"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps[:-1], aucs[:-1], "o-", label="held-out prefix")
    ax.plot(steps[-1:], aucs[-1:], "s", label="final, all held-out rows")
    ax.set_xlabel("step")
    ax.set_ylabel("AUC")
    ax.set_title(_title(m), fontsize=9)
    ax.legend()
    return _save(fig, out_dir, "auc.png")


def _tables(m, out_dir):
    """Per table, in table order and labelled by name: the final error bound (with the range it
    took over the run, for adaptive runs) and the final forward and backward ratios."""
    tables = m.get("tables") or {}
    history = m.get("table_history") or []
    names = [n for n in m.get("table_names") or sorted(tables, key=lambda n: (len(n), n))
             if n in tables]
    x = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    bounds = np.array([tables[n].get("bound", np.nan) for n in names], float)
    a1.bar(x, bounds, color="tab:blue", label="final")
    if history:
        seen = [[(h["tables"].get(n) or {}).get("bound", np.nan) for h in history] for n in names]
        lo, hi = np.nanmin(seen, axis=1), np.nanmax(seen, axis=1)
        a1.vlines(x, lo, hi, color="black", lw=1.5, label="range over the run")
        a1.legend(fontsize=8)
    for key, label, offset in (("ratio", "forward", -0.2), ("bwd_ratio", "backward", 0.2)):
        values = [tables[n].get(key) for n in names]
        if any(v is not None for v in values):
            a2.bar(x + offset, [np.nan if v is None else v for v in values], width=0.4, label=label)
    a2.legend(fontsize=8)
    a2.set_xticks(x, names, rotation=90, fontsize=8)
    a2.set_xlabel("table")
    a1.set_ylabel("error bound")
    a2.set_ylabel("compression ratio")
    a1.set_title("per-table bound and ratio: " + _title(m), fontsize=8)
    return _save(fig, out_dir, "tables.png")


def _time_split(m, out_dir):
    split = m.get("time_split") or []
    if not split:
        return None
    keys = [("compute_s", "compute"), ("compress_s", "compress + decompress"), ("comm_s", "communicate")]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5), gridspec_kw={"width_ratios": [3, 1]})
    steps = np.arange(1, len(split) + 1)
    bottom = np.zeros(len(split))
    for key, label in keys:
        v = np.array([s[key] for s in split]) * 1e3
        a1.fill_between(steps, bottom, bottom + v, step="mid", label=label, alpha=0.7)
        bottom += v
    a1.set_xlabel("step")
    a1.set_ylabel("ms per step (rank 0)")
    a1.legend(fontsize=8)
    totals = [sum(s[key] for s in split) for key, _ in keys]
    # Horizontal bars: the three labels are too long to sit side by side under a narrow panel.
    a2.barh([label.replace(" + ", "\n+ ") for _, label in keys][::-1], totals[::-1])
    a2.set_xlabel("seconds, whole run")
    a2.tick_params(axis="y", labelsize=8)
    a1.set_title(_title(m), fontsize=9)
    return _save(fig, out_dir, "time_split.png")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plots.py METRICS.json OUT_DIR")
    with open(sys.argv[1]) as f:
        print("\n".join(write_all(json.load(f), sys.argv[2])))
