"""A token-bucket link (tc tbf) in steady state: what one training iteration's sends cost on it.

The emulation's link is a token bucket of `burst` bytes filled at the link's rate. While the link
idles (compute, codec, a call's fixed cost, the work between timed steps) the bucket refills, up
to the burst; a send first spends what the bucket holds (those bytes pass at once) and then
moves at the rate. Whatever a send leaves in the bucket carries over to the next send, so the
iteration is simulated phase by phase, cycle after cycle, until the bucket's level at the
iteration's start repeats (the steady state that a long run settles into).

Over a whole iteration the link never carries more than rate x iteration time, with or without a
burst: the bucket only lets the link work during the iteration's idle phases.
"""

IDLE, SEND = "idle", "send"


def check_phases(phases):
    for kind, amount in phases:
        if kind not in (IDLE, SEND):
            raise ValueError(f"a phase is ('{IDLE}', seconds) or ('{SEND}', bytes), got kind {kind!r}")
        if amount < 0:
            raise ValueError(f"a phase's {'seconds' if kind == IDLE else 'bytes'} must be >= 0, got {amount!r}")


def one_iteration(phases, rate, burst, level):
    """(seconds of each phase, the bucket's level after them) starting at `level` bytes."""
    seconds = []
    for kind, amount in phases:
        if kind == IDLE:
            level = min(burst, level + amount * rate)
            seconds.append(amount)
        else:
            free = min(level, amount)
            level -= free
            seconds.append((amount - free) / rate)
    return seconds, level


def steady_state(phases, rate, burst):
    """Seconds of each phase of one iteration in steady state on a link of `rate` bytes/s with a
    bucket of `burst` bytes. phases: [("idle", seconds) | ("send", bytes), ...] in the order the
    iteration runs them; the list repeats (the last phase is followed by the first).

    One iteration maps the bucket's starting level L to min(H, max(Lo, L + net)), net = what the
    idle phases refill less what the sends take (a chain of clamped shifts is one clamped shift).
    Its fixed point is Lo when the sends outrun the refills (a send drains the bucket every
    iteration), else H (the bucket reaches its cap): one iteration from 0, or from a full
    bucket, lands on it."""
    check_phases(phases)
    if not rate > 0:
        raise ValueError(f"rate must be > 0 bytes/s, got {rate!r}")
    if burst < 0:
        raise ValueError(f"burst must be >= 0 bytes, got {burst!r}")
    net = sum(a * rate if k == IDLE else -a for k, a in phases)
    _, start = one_iteration(phases, rate, burst, 0.0 if net < 0 else burst)
    return one_iteration(phases, rate, burst, start)[0]
