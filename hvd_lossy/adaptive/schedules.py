"""Iteration-wise schedules: a multiplier on every table's error bound.

Training tolerates more error early than late (Feng et al., SC'24), so the bound of every table is
scaled by ``multiplier(schedule, it, E)``, which starts at 2.0 and reaches 1.0 at iteration ``E``
and stays there. The schedules differ only in how they get from 2 to 1:

``step``      the paper's stepwise decay, ``2 * max(1 - floor(10 * it / E) * 0.05, 0.5)`` for
              ``it < E``: 2.0, 1.9, ..., 1.1, each held for E/10 iterations, then 1.0.
``linear``    ``2 * (1 - 0.5 * it / E)`` for ``it < E``, then 1.0.
``log``       ``2 - log(1 + it) / log(1 + E)`` for ``it < E``, then 1.0. Our definition: it falls
              fast at first and slowly later (already 1.21 at E/10 for E = 65,536), for models whose
              early iterations are the most tolerant.
``constant``  1.0 always (no iteration-wise adaptation).
"""

import math

__all__ = ["SCHEDULES", "multiplier", "check_schedule"]

SCHEDULES = ("step", "linear", "log", "constant")


def check_schedule(schedule, E):
    """Raise ValueError unless ``schedule`` is a known name and ``E`` a positive integer."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if isinstance(E, bool) or not isinstance(E, int) or E <= 0:
        raise ValueError(f"E (iterations until the multiplier reaches 1.0) must be a positive "
                         f"integer, got {E!r}")


def multiplier(schedule, it, E=65536):
    """Multiplier on the error bound at training iteration ``it``.

    Arguments:
        schedule: One of ``"step"``, ``"linear"``, ``"log"``, ``"constant"``.
        it: Training iteration, an integer >= 0 (0 is the first iteration).
        E: Iterations until the multiplier reaches 1.0 (positive integer, default 65,536).

    Returns:
        A float in [1.0, 2.0]: 2.0 at ``it = 0`` (1.0 for ``constant``), 1.0 from ``it = E`` on.
    """
    check_schedule(schedule, E)
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ValueError(f"iteration must be an integer >= 0, got {it!r}")
    if schedule == "constant" or it >= E:
        return 1.0
    if schedule == "step":
        # Integer floor of 10*it/E (no float rounding at the step edges), and 2*max(1 - k*0.05,
        # 0.5) written as max(20 - k, 10)/10 so that 1.9, 1.8, ... are the nearest doubles.
        k = (10 * it) // E
        return max(20 - k, 10) / 10
    if schedule == "linear":
        return 2.0 * (1.0 - 0.5 * it / E)
    return 2.0 - math.log1p(it) / math.log1p(E)
