"""A token-bucket link (tc tbf) in steady state: what one training iteration's calls cost on it.

The emulation's link is a token bucket of `burst` bytes filled at the link's rate. While the link
idles (compute, codec, a call's fixed cost, the work between timed steps) the bucket refills, up
to the burst; a send first spends what the bucket holds (those bytes pass at once) and then
moves at the rate. Whatever a send leaves in the bucket carries over to the next send, so the
iteration is simulated phase by phase, in the steady state that a long run settles into.

Phases, in the order the iteration runs them (the list repeats):
  (IDLE, seconds)                       the link idles
  (SEND, bytes)                         bytes to move
  (CALL, bytes, fixed_s, floor_s)       a collective: its fixed cost (idle link), its bytes, and
                                        no shorter than floor_s all told: the call's CPU path
                                        (measured where the link is no limit) runs alongside its
                                        bytes, and the link idles for whatever it lasts longer.

Over a whole iteration the link never carries more than rate x iteration time, with or without a
burst: the bucket only lets the link work during the iteration's idle phases.
"""

IDLE, SEND, CALL = "idle", "send", "call"


def check_phases(phases):
    for phase in phases:
        kind, amounts = phase[0], phase[1:]
        if (kind, len(amounts)) not in ((IDLE, 1), (SEND, 1), (CALL, 3)):
            raise ValueError(f"a phase is ('{IDLE}', seconds), ('{SEND}', bytes) or ('{CALL}', bytes, fixed_s, "
                             f"floor_s), got {phase!r}")
        if any(a < 0 for a in amounts):
            raise ValueError(f"a phase's amounts must be >= 0, got {phase!r}")


def _send(nbytes, level, rate):
    """(seconds, level after) of sending nbytes from a bucket at `level`."""
    free = min(level, nbytes)
    return (nbytes - free) / rate, level - free


def one_iteration(phases, rate, burst, level):
    """(seconds of each phase, the bucket's level after them) starting at `level` bytes."""
    seconds = []
    for phase in phases:
        if phase[0] == IDLE:
            level = min(burst, level + phase[1] * rate)
            seconds.append(phase[1])
        elif phase[0] == SEND:
            t, level = _send(phase[1], level, rate)
            seconds.append(t)
        else:
            nbytes, fixed, floor = phase[1:]
            level = min(burst, level + fixed * rate)
            t, level = _send(nbytes, level, rate)
            rest = max(floor - fixed - t, 0.0)
            level = min(burst, level + rest * rate)
            seconds.append(fixed + t + rest)
    return seconds, level


def net_refill(phases, rate):
    """Bytes an iteration refills less the bytes it sends, before the bucket's clamps. A call
    refills rate x max(fixed, floor) whatever the level: the longer its send waits, the less of
    its floor is left to idle (and the send only waits on an empty bucket)."""
    net = 0.0
    for phase in phases:
        if phase[0] == IDLE:
            net += phase[1] * rate
        elif phase[0] == SEND:
            net -= phase[1]
        else:
            net += max(phase[2], phase[3]) * rate - phase[1]
    return net


def steady_state(phases, rate, burst):
    """Seconds of each phase of one iteration in steady state on a link of `rate` bytes/s with a
    bucket of `burst` bytes (phases: see the module docstring).

    One iteration maps the bucket's starting level L to min(H, max(Lo, L + net)), net =
    net_refill (each phase is a clamped shift of the level, and so is a chain of them). Its
    fixed point is Lo when the sends outrun the refills (a send drains the bucket every
    iteration), else H (the bucket reaches its cap): one iteration from an empty, or from a
    full, bucket lands on it."""
    check_phases(phases)
    if not rate > 0:
        raise ValueError(f"rate must be > 0 bytes/s, got {rate!r}")
    if burst < 0:
        raise ValueError(f"burst must be >= 0 bytes, got {burst!r}")
    _, start = one_iteration(phases, rate, burst, 0.0 if net_refill(phases, rate) < 0 else burst)
    return one_iteration(phases, rate, burst, start)[0]
