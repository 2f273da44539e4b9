"""Table-wise policies: each table's error bound from the merged statistics.

A policy maps the merged per-table statistics of the last interval (``TableStats``, identical on
every rank) and the base bound to a *table bound* per table; the controller multiplies it by the
schedule's multiplier. Policies are pure and deterministic, so every rank computes the same bounds.

``uniform``      every table at ``base`` (one global bound: the baseline).
``paper``        the paper's three classes, chosen automatically: tables ranked by cardinality
                 (``by="cardinality"``, the default; ties by observed unique-row fraction, then
                 name) or by observed unique-row fraction (``by="unique"``; cardinality until
                 observed); the top third (``round(n/3)`` tables) is TIGHTEN, the bottom third
                 LOOSEN, the rest BASE. TIGHTEN/BASE/LOOSEN default to base/3, base, 5*base/3
                 (0.01/0.03/0.05 at base 0.03). ``pin={table: class}`` fixes a table by hand.
``sensitivity``  continuous: a table's sensitivity is c = mean|gradient| x error unit (value range
                 of its lookups in mode "rel", 1 in mode "abs"): to first order an error of e on
                 its lookups moves the loss by about c*e. Under the rate model below, the
                 bounds minimising sum(values * c * eb) at fixed bytes are eb proportional to
                 1/c, scaled so the encoded-values-weighted geometric mean equals ``base``,
                 which spends what a global bound ``base`` spends in bytes. Bounds are clamped to
                 [base/spread, base*spread]; tables without gradients stay at ``base``.
``budget``       fits the bytes: the same shape as ``sensitivity`` (or uniform, ``shape="uniform"``)
                 scaled so the predicted bytes meet a target: overall ratio ``target_ratio``
                 (raw/compressed bytes of the forward frames, at multiplier 1.0: the schedule
                 still loosens every bound early), or when None the bytes a global ``base``
                 would give. Two runs at the same ``target_ratio`` (one ``shape="uniform"``)
                 spend equal bytes: that is how adaptive and global bounds are compared.

Rate model (``budget``, and the reason for the geometric mean): a table whose frames took ``bits``
bits per encoded element at effective bound ``eb0`` takes ``max(1, bits + log2(eb0) - log2(eb))``
bits at bound ``eb``, plus its fixed bytes (frame headers): halving the bound costs one more
bit per element, as in any quantizer whose bin width is the bound. It is calibrated again every
interval from the frames just sent.
"""

import json
import math

import numpy as np

__all__ = ["Policy", "UniformPolicy", "PaperPolicy", "SensitivityPolicy", "BudgetPolicy",
           "POLICIES", "make_policy"]

MIN_BITS = 1.0  # floor of the rate model: bits per encoded element at very loose bounds
CLASSES = ("tighten", "base", "loosen")


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class Policy:
    """Base class: ``table_bounds(stats, base, mode) -> {name: bound}``; JSON-able config."""

    name = None

    def table_bounds(self, stats, base, mode, previous=None):
        """Table bounds (before the schedule's multiplier).

        Arguments:
            stats: list of ``TableStats`` in table order, merged over all ranks.
            base: the base bound (relative to the value range in mode "rel", absolute in "abs").
            mode: ``"rel"`` or ``"abs"``.
            previous: the table bounds in force until now (dict name -> bound), or None.

        Returns:
            dict table name -> bound > 0.
        """
        raise NotImplementedError

    def check_tables(self, names):
        """Raise ValueError if the config names a table not in ``names``."""

    def get_config(self):
        return {"name": self.name, **self._params()}

    def _params(self):
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()


class UniformPolicy(Policy):
    """Every table at ``base``: one global bound."""

    name = "uniform"

    def table_bounds(self, stats, base, mode, previous=None):
        return {s.name: base for s in stats}


class PaperPolicy(Policy):
    """Three classes TIGHTEN/BASE/LOOSEN by table rank (see the module docstring)."""

    name = "paper"

    def __init__(self, tighten=None, loosen=None, by="cardinality", pin=None):
        self.tighten = None if tighten is None else _positive("tighten", tighten)
        self.loosen = None if loosen is None else _positive("loosen", loosen)
        if by not in ("cardinality", "unique"):
            raise ValueError(f"paper policy: by must be 'cardinality' or 'unique', got {by!r}")
        self.by = by
        self.pin = dict(pin or {})
        for table, cls in self.pin.items():
            if cls not in CLASSES:
                raise ValueError(f"paper policy: pin[{table!r}] must be one of {list(CLASSES)}, "
                                 f"got {cls!r}")

    def _params(self):
        return {"tighten": self.tighten, "loosen": self.loosen, "by": self.by, "pin": self.pin}

    def check_tables(self, names):
        unknown = sorted(set(self.pin) - set(names))
        if unknown:
            raise ValueError(f"paper policy: pin names unknown tables {unknown}; tables are "
                             f"{list(names)}")

    def classes(self, stats):
        """dict table name -> "tighten" | "base" | "loosen"."""
        # by="unique" needs every table's fraction; until then, cardinality decides.
        by_unique = self.by == "unique" and all(not math.isnan(t.unique_fraction) for t in stats)

        def key(s):
            uf = 0.0 if math.isnan(s.unique_fraction) else s.unique_fraction
            return (-uf, -s.cardinality, s.name) if by_unique else (-s.cardinality, -uf, s.name)

        ranked = [s.name for s in sorted(stats, key=key)]
        third = int(math.floor(len(ranked) / 3 + 0.5))
        out = {}
        for i, name in enumerate(ranked):
            out[name] = "tighten" if i < third else ("loosen" if i >= len(ranked) - third
                                                     else "base")
        out.update(self.pin)
        return out

    def table_bounds(self, stats, base, mode, previous=None):
        value = {"tighten": self.tighten if self.tighten is not None else base / 3,
                 "base": base,
                 "loosen": self.loosen if self.loosen is not None else base * 5 / 3}
        return {name: value[cls] for name, cls in self.classes(stats).items()}


def _sensitivity_logw(stats, mode):
    """log(1/c) per table, +inf where c == 0 (insensitive), nan where unknown."""
    out = []
    for s in stats:
        unit = s.range if mode == "rel" else 1.0
        c = s.grad * unit if s.has_grads and (mode == "abs" or s.has_lookups) else math.nan
        out.append(math.nan if math.isnan(c) else (math.inf if c <= 0 else -math.log(c)))
    return np.array(out, dtype=np.float64)


def _encoded_weights(stats):
    """Weight of each table in the geometric mean: elements it encodes per interval."""
    w = []
    for s in stats:
        if s.has_frames:
            w.append(s.enc_values)
        elif s.has_lookups:
            uf = 1.0 if math.isnan(s.unique_fraction) else s.unique_fraction
            w.append(s.values * uf)
        else:
            w.append(1.0)
    return np.array(w, dtype=np.float64)


def _solve_shift(f, target, lo, hi, iters=100):
    """Bisection for s in [lo, hi] with f(s) == target, f increasing; clamps at the ends."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class SensitivityPolicy(Policy):
    """Bounds inversely proportional to sensitivity, geometric mean = base (module docstring)."""

    name = "sensitivity"

    def __init__(self, spread=4.0):
        self.spread = _positive("spread", spread)
        if self.spread < 1:
            raise ValueError(f"sensitivity policy: spread must be >= 1, got {spread!r}")

    def _params(self):
        return {"spread": self.spread}

    def table_bounds(self, stats, base, mode, previous=None):
        logw = _sensitivity_logw(stats, mode)
        known = ~np.isnan(logw)
        bounds = {s.name: base for s in stats}
        if not known.any():
            return bounds
        w = _encoded_weights(stats)[known]
        lw = logw[known]
        lo, hi = math.log(base / self.spread), math.log(base * self.spread)
        finite = lw[np.isfinite(lw)]
        lw_min, lw_max = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)

        def mean_log(shift):
            return float(np.average(np.clip(lw + shift, lo, hi), weights=w))

        # Shift log(1/c) so the weighted mean of the clamped log bounds is log(base); insensitive
        # tables (c == 0, log(1/c) = inf) sit at the upper clamp.
        shift = _solve_shift(mean_log, math.log(base), lo - lw_max - 1, hi - lw_min + 1)
        log_eb = np.clip(lw + shift, lo, hi)
        for s, v in zip([s for s, k in zip(stats, known) if k], log_eb):
            bounds[s.name] = float(math.exp(v))
        return bounds


class BudgetPolicy(Policy):
    """Bounds that meet a byte budget under the rate model (module docstring)."""

    name = "budget"

    def __init__(self, target_ratio=None, shape="sensitivity", spread=4.0, min_bound=1e-4,
                 max_bound=0.5, damping=0.5):
        self.target_ratio = None if target_ratio is None else _positive("target_ratio",
                                                                       target_ratio)
        if shape not in ("sensitivity", "uniform"):
            raise ValueError(f"budget policy: shape must be 'sensitivity' or 'uniform', "
                             f"got {shape!r}")
        self.shape = shape
        self.spread = SensitivityPolicy(spread).spread
        self.min_bound = _positive("min_bound", min_bound)
        self.max_bound = _positive("max_bound", max_bound)
        if isinstance(damping, bool) or not isinstance(damping, (int, float)) or \
                not 0 <= damping < 1:
            raise ValueError(f"budget policy: damping must be in [0, 1), got {damping!r}")
        self.damping = float(damping)
        if self.min_bound >= self.max_bound:
            raise ValueError(f"budget policy: min_bound ({min_bound}) must be < max_bound "
                             f"({max_bound})")

    def _params(self):
        return {"target_ratio": self.target_ratio, "shape": self.shape, "spread": self.spread,
                "min_bound": self.min_bound, "max_bound": self.max_bound, "damping": self.damping}

    def table_bounds(self, stats, base, mode, previous=None):
        if self.shape == "uniform":
            shape = {s.name: base for s in stats}
        else:
            shape = SensitivityPolicy(self.spread).table_bounds(stats, base, mode)
        framed = [s for s in stats if s.has_frames]
        if not framed:
            return shape
        # Per table: predicted bytes at bound eb = fixed + enc_values/8 * max(1, a - log2 eb).
        enc = np.array([s.enc_values for s in framed])
        fixed = np.array([s.fixed_bytes for s in framed])
        a = np.array([s.bits_per_value + s.log2_bound for s in framed])
        log2_shape = np.log2([shape[s.name] for s in framed])
        lo2, hi2 = math.log2(self.min_bound), math.log2(self.max_bound)

        def frame_bytes(log2_eb):
            return float((fixed + enc / 8 * np.maximum(MIN_BITS, a - log2_eb)).sum())

        if self.target_ratio is not None:
            target = sum(s.raw_bytes for s in framed) / self.target_ratio
        else:
            target = frame_bytes(np.full(len(framed), math.log2(base)))
        # Scale every bound by 2**k: bytes fall as k rises; solve -bytes(k) == -target.
        k = _solve_shift(lambda k: -frame_bytes(np.clip(log2_shape + k, lo2, hi2)), -target,
                         lo2 - log2_shape.max(), hi2 - log2_shape.min())
        out = {}
        for name, b in shape.items():
            log2_eb = math.log2(b) + k
            if previous and name in previous:
                # The rate is a staircase (whole bits per block), so an undamped fit can jump
                # between two steps every interval; move part of the way in log space.
                log2_eb = self.damping * math.log2(previous[name]) + (1 - self.damping) * log2_eb
            out[name] = float(min(max(2.0 ** log2_eb, self.min_bound), self.max_bound))
        return out


POLICIES = {cls.name: cls for cls in (UniformPolicy, PaperPolicy, SensitivityPolicy,
                                      BudgetPolicy)}


def make_policy(spec):
    """A Policy from a name, a config dict ``{"name": ..., **params}`` (or that dict as a JSON
    string, for command lines), or a Policy."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        spec = json.loads(spec) if spec.lstrip().startswith("{") else {"name": spec}
    if not isinstance(spec, dict):
        raise TypeError(f"policy must be a name, a dict with 'name', or a Policy, got "
                        f"{type(spec).__name__}")
    params = dict(spec)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    try:
        return POLICIES[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None
