"""`auto=True`: compress an all-to-all only where it pays, decided alike on every rank.

Whether compressing pays depends on the link, the cores and the message size, so it is
measured, not guessed. Each compressor with `auto=True` keeps, per process set, a *slot*:

  probe    after WARMUP untimed lossy calls, PROBE_CALLS calls alternate lossy and plain
           (the backend's own alltoall), and each rank times every call as the interval until the
           slot's next call: a whole training iteration when the slot is called once a step.
           That counts what the call costs where it is spent (compress, blocked communication,
           decode) and also what it costs the rest of the step: on cores shared with the
           training, a plain call's bytes cost the kernel's TCP stack time that a call-only
           timer never sees. (The gradient slot of the autograd alltoall alternates in step
           with the forward one, so probed iterations are all-lossy or all-plain.);
  agree    the ranks allgather, in the background, their size bucket and median times (one
           tiny allgather, launched at a fixed call number and read LAG calls later,
           so nobody waits for it). Every rank applies the same rule to the same rows: lossy
           when the slowest rank's lossy median beats the slowest plain median (by HYSTERESIS
           when that means switching, for the same sizes), else plain. A rank without times
           for its current size sends everyone back to probing;
  decided  the decision holds until the next agreement, AGREE_EVERY calls later; every REFRESH
           calls, the call before an agreement runs the losing mode once, so the decision
           follows a link or a load that changes.

The gradient all-to-all of an autograd alltoall is not timed on its own: its interval to its
next call would hold the next step's forward call, of the other mode while probing, so its plain
and lossy medians would come out alike and its decision a coin toss (seen at 0.1 Gbit/s: the
gradients sent plain at 4x the iteration). Its compressor *follows* the forward one (`pair`): each
gradient call takes the mode of the forward compressor's latest call on that group, so every
iteration is all-lossy or all-plain and the forward slot's times decide for both.

Since every input of the rule is agreed, all ranks take the same path on every call: a plain
call on one rank never meets a framed call on another. A rank whose message size leaves its
bucket forgets its times, and the next agreement sends everyone back to probing.
"""
import collections
import itertools
import math
import statistics
import time
import weakref
from collections import deque

import torch

from hvd_lossy.backend import as_backend
from hvd_lossy.collective import remote_bytes

WARMUP = 2        # first calls: lossy, untimed (allocation, caches and the first steps' noise)
PROBE_CALLS = 8   # 4 lossy, 4 plain
LAG = 4           # calls between launching an agreement and reading it
AGREE_EVERY = 16  # calls between agreements once decided
REFRESH = 200     # calls between runs of the losing mode, to see whether it still loses
HYSTERESIS = 0.05  # a decided slot switches only for a 5% better median
KEEP = 16         # timings kept per mode
LOSSY, PLAIN = "lossy", "plain"

_numbers = collections.defaultdict(itertools.count)  # per process set: slots made so far
_live = weakref.WeakSet()  # every slot whose compressor is alive, for report()


def _bucket(nbytes):
    """Size class of a message: half-octaves of the bytes a rank sends the others."""
    return -1 if nbytes <= 0 else int(math.floor(2 * math.log2(nbytes)))


class _Slot:
    def __init__(self, number, compressor, backend):
        self.number, self.backend = number, backend
        self.label = repr(compressor)
        self.calls = 0
        self.times = {LOSSY: deque(maxlen=KEEP), PLAIN: deque(maxlen=KEEP)}
        self.local_bucket = None
        self.buckets = None       # agreed: every rank's size bucket at the last decision
        self.decision = None      # agreed: LOSSY, PLAIN, or None while probing
        self.agreed = None        # the rule's inputs at the last agreement
        self.probe_from = WARMUP
        self.next_agreement = WARMUP + PROBE_CALLS
        self.refresh_at = -1
        self.pending = None       # (the backend's Work, call number at which to read it)
        self.counts = {LOSSY: 0, PLAIN: 0}
        self.last = None          # (start, mode) of the previous call
        self.last_mode = None     # the mode of the latest call, warm-up included
        self.leader = None        # a follower's: the forward compressor's slot (weakref)

    def choose(self, nbytes):
        """The mode of the next call: the same on every rank of the process set."""
        if self.leader is not None:
            leader = self.leader()
            mode = LOSSY if leader is None or leader.last_mode is None else leader.last_mode
            self.calls += 1
            self.counts[mode] += 1
            return mode
        now = time.perf_counter()
        if self.last is not None:  # the previous call's interval, in its own size bucket
            self.times[self.last[1]].append(now - self.last[0])
        k = self.calls
        self.calls += 1
        bucket = _bucket(nbytes)
        if bucket != self.local_bucket:  # other sizes: the times so far say nothing of them
            self.local_bucket = bucket
            for t in self.times.values():
                t.clear()
        if self.pending is not None and k >= self.pending[1]:
            rows = self.pending[0].wait().tolist()
            self.pending = None
            self._apply(rows, k)
        if k == self.next_agreement:
            self._launch_agreement(k)
        if self.decision is None:
            mode = LOSSY if k < self.probe_from or (k - self.probe_from) % 2 == 0 else PLAIN
        elif k == self.refresh_at:
            mode = PLAIN if self.decision == LOSSY else LOSSY
        else:
            mode = self.decision
        self.counts[mode] += 1
        self.last = (now, mode) if k >= WARMUP else None
        self.last_mode = mode
        return mode

    def _launch_agreement(self, k):
        def median(mode):
            t = self.times[mode]
            return statistics.median(t) if t else math.nan
        row = torch.tensor([[float(self.local_bucket), median(PLAIN), median(LOSSY)]],
                           dtype=torch.float64)
        work = self.backend.allgather_async(
            row, f"hvd_lossy.auto.{self.backend.key}.{self.number}.{k}", same_shape=True)
        self.pending = (work, k + LAG)
        self.next_agreement = -1  # set again once this one is read

    def _apply(self, rows, k):
        buckets = sorted({r[0] for r in rows})
        if any(math.isnan(r[1]) or math.isnan(r[2]) for r in rows):
            # a rank has no times for its current size (it changed): measure again
            self.decision, self.buckets, self.probe_from = None, None, k
            self.next_agreement = k + PROBE_CALLS
            self.agreed = None
            return
        plain = max(r[1] for r in rows)
        lossy = max(r[2] for r in rows)
        if self.decision is None or self.buckets != buckets:
            better = LOSSY if lossy < plain else PLAIN
        elif self.decision == LOSSY:
            better = PLAIN if plain < lossy * (1 - HYSTERESIS) else LOSSY
        else:
            better = LOSSY if lossy < plain * (1 - HYSTERESIS) else PLAIN
        self.decision, self.buckets = better, buckets
        self.agreed = {"plain_ms": plain * 1e3, "lossy_ms": lossy * 1e3}
        self.next_agreement = k + AGREE_EVERY
        if self.refresh_at < k:
            self.refresh_at = k + REFRESH - 1

    def report(self):
        key = self.backend.key
        leader = self.leader() if self.leader is not None else None
        if leader is not None:
            return {"compressor": self.label, "process_set": key if isinstance(key, int) else repr(key),
                    "calls": self.calls, "follows": leader.label,
                    "decision": leader.decision or "probing",
                    "lossy_calls": self.counts[LOSSY], "plain_calls": self.counts[PLAIN]}
        return {"compressor": self.label, "process_set": key if isinstance(key, int) else repr(key),
                "calls": self.calls, "decision": self.decision or "probing",
                "message_bytes": None if self.buckets is None else
                [round(2 ** (b / 2)) for b in self.buckets],
                "lossy_calls": self.counts[LOSSY], "plain_calls": self.counts[PLAIN],
                **(self.agreed or {})}


def pair(forward, gradient):
    """Makes the auto compressor `gradient` (forward's for_backward(), which the autograd
    alltoall sends the gradients with) follow `forward`'s mode on every group; a compressor
    that is its own for_backward() already shares its slot. Returns `gradient`."""
    if (gradient is not forward and getattr(gradient, "auto", False)
            and getattr(forward, "auto", False)):
        gradient._auto_leader = weakref.ref(forward)
    return gradient


def slot(compressor, group):
    """The slot of `compressor` on `group` (a Horovod ProcessSet or an hvd_lossy.backend
    backend), made at its first call there."""
    backend = as_backend(group)
    s = compressor._auto_slots.get(backend.key)
    if s is None:
        # Numbered in order of first use, which is collective, so the numbers agree.
        number = next(_numbers[backend.key])
        s = compressor._auto_slots[backend.key] = _Slot(number, compressor, backend)
        _live.add(s)
    leader = getattr(compressor, "_auto_leader", None)
    leader = leader() if leader is not None else None
    if leader is not None and s.leader is None:
        s.leader = weakref.ref(slot(leader, backend))
    return s


def start(tensor, splits, backend, compressor, start_lossy, start_plain):
    """Starts one alltoall of an auto compressor by the mode its slot agrees on."""
    nbytes, _local = remote_bytes(tensor, splits, backend)
    return start_lossy() if slot(compressor, backend).choose(nbytes) == LOSSY else start_plain()


def settle(key):
    """Waits for the agreements still under way on the group of backend key `key` (a group
    is torn down only once none is pending: torch.distributed aborts the process otherwise).
    Collective, like the agreements: every rank has the same ones pending."""
    for s in sorted(_live, key=_order):
        if s.backend.key == key and s.pending is not None:
            s.pending[0].wait()
            s.pending, s.next_agreement = None, s.calls  # agree again at the next call


def report():
    """The auto slots' state, for comm_stats()."""
    return [s.report() for s in sorted(_live, key=_order)]


def _order(s):
    key = s.backend.key  # Horovod's process set ids first, in order; then torch groups
    return (0, key, s.number) if isinstance(key, int) else (1, repr(key), s.number)
