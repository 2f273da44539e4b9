"""PNG plots of one run's metrics (the dict train.py writes with --metrics-out).

    python examples/dlrm/plots.py metrics.json plots/     # or train.py --plots plots/
"""

import json
import os
import sys

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


def _title(m):
    name = m.get("compressor", m.get("compression", ""))
    return "%s, %d ranks, batch %d" % (name, m["world"], m["batch_size"])


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
    """Per-table error bound and compression ratio over time when the run recorded them (adaptive),
    else the final values as bars."""
    tables = m.get("tables") or {}
    history = m.get("table_history") or []
    names = sorted(tables, key=lambda n: (len(n), n))  # C1, C2, ..., C26
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8.5, 6), sharex=bool(history))
    if history:
        steps = [h["step"] for h in history]
        cmap = plt.get_cmap("tab20")
        for i, name in enumerate(names):
            bounds = [(h["tables"].get(name) or {}).get("bound", np.nan) for h in history]
            ratios = [(h["tables"].get(name) or {}).get("ratio", np.nan) for h in history]
            style = dict(lw=1, color=cmap(i % 20), ls="-" if i < 20 else "--")
            a1.plot(steps, bounds, label=name, **style)
            a2.plot(steps, [np.nan if r is None else r for r in ratios], **style)
        a2.set_xlabel("step")
        fig.legend(loc="center right", fontsize=7, ncol=1)
        fig.subplots_adjust(right=0.85)
    else:
        x = np.arange(len(names))
        a1.bar(x, [tables[n].get("bound", np.nan) for n in names])
        a2.bar(x, [tables[n].get("ratio", np.nan) for n in names])
        a2.set_xticks(x, names, rotation=90, fontsize=7)
    a1.set_ylabel("error bound")
    a2.set_ylabel("compression ratio")
    a1.set_title("per-table bound and ratio\n" + _title(m), fontsize=8)
    return _save(fig, out_dir, "tables.png", tight=not history)


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
    a2.bar([label.split()[0] for _, label in keys], totals)
    a2.set_ylabel("seconds, whole run")
    a1.set_title(_title(m), fontsize=9)
    return _save(fig, out_dir, "time_split.png")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plots.py METRICS.json OUT_DIR")
    with open(sys.argv[1]) as f:
        print("\n".join(write_all(json.load(f), sys.argv[2])))
