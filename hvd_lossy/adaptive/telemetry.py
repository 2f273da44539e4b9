"""Telemetry: one JSON line per exchange, and a plot of bounds and ratios over iterations.

Each line: ``{"iteration", "multiplier", "policy", "schedule", "tables": {name: {"bound",
"table_bound", "ratio", "raw_bytes", "frame_bytes", "range", "std", "unique_fraction", "grad",
...}}}``, where ``bound`` is the effective bound used from this iteration on and ``ratio`` the
ratio achieved over the interval that just ended (null when no frame was recorded).
"""

import json
import math

__all__ = ["write_line", "read_lines", "plot_telemetry", "telemetry_record", "summary"]


def _header(controller):
    return {"iteration": controller.iteration, "multiplier": controller.multiplier,
            "policy": controller.policy.get_config(), "schedule": controller.schedule}


def telemetry_record(controller):
    """The telemetry line of the exchange that just happened (see the module docstring)."""
    bounds = controller.bounds()
    tables = {}
    for s in controller.stats():
        d = s.to_json()
        for k in ("name", "cardinality", "owner"):
            d.pop(k)
        d.update(bound=bounds[s.name], table_bound=controller.table_bound(s.name))
        tables[s.name] = d
    return {**_header(controller), "tables": tables}


def _bytes(raw, frame, prefix):
    return {prefix + "raw_bytes": raw, prefix + "frame_bytes": frame,
            prefix + "ratio": raw / frame if frame > 0 else None}


def summary(controller):
    """``Controller.summary()``: per-table bound, class, bytes and ratios over the run so far."""
    bounds = controller.bounds()
    classes = getattr(controller.policy, "classes", lambda stats: {})(controller.stats())
    tables = {}
    for s in controller.totals():
        tables[s.name] = {"bound": bounds[s.name], "table_bound": controller.table_bound(s.name),
                          "class": classes.get(s.name), "owner": s.owner,
                          "cardinality": s.cardinality,
                          **_bytes(s.raw_bytes, s.frame_bytes, ""),
                          **_bytes(s.bwd_raw_bytes, s.bwd_frame_bytes, "bwd_")}
    out = {**_header(controller), "tables": tables}
    for prefix in ("", "bwd_"):
        out.update(_bytes(sum(t[prefix + "raw_bytes"] for t in tables.values()),
                          sum(t[prefix + "frame_bytes"] for t in tables.values()), prefix))
    return out


def write_line(path, record):
    """Append one JSON record to ``path`` (non-finite floats written as null)."""
    with open(path, "a") as f:
        f.write(json.dumps(_clean(record), sort_keys=True) + "\n")


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def read_lines(path):
    """The records of a telemetry JSON-lines file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_telemetry(jsonl, png, title=None):
    """Plot per-table bound and achieved ratio against the iteration.

    Arguments:
        jsonl: path of a telemetry file written by the controller.
        png: path of the PNG to write.
        title: optional figure title.

    Returns:
        ``png``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_lines(jsonl)
    if not records:
        raise ValueError(f"telemetry file {jsonl!r} holds no records")
    names = list(records[-1]["tables"])
    its = [r["iteration"] for r in records]
    fig, (ax_b, ax_r) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name in names:
        def series(key):
            return [(r["tables"].get(name) or {}).get(key) for r in records]

        bound = [math.nan if v is None else v for v in series("bound")]
        ratio = [math.nan if v is None else v for v in series("ratio")]
        (line,) = ax_b.plot(its, bound, drawstyle="steps-post", label=name)
        ax_r.plot(its, ratio, marker=".", color=line.get_color())
    ax_b.set_yscale("log")
    ax_b.set_ylabel("error bound (from this iteration)")
    ax_r.set_ylabel("achieved ratio (raw/compressed)")
    ax_r.set_xlabel("iteration")
    ax_b.legend(fontsize="x-small", ncol=max(1, len(names) // 10), loc="best")
    for ax in (ax_b, ax_r):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title or f"hvd_lossy adaptive bounds ({records[-1].get('policy', {}).get('name')}"
                          f", schedule {records[-1].get('schedule')})")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
