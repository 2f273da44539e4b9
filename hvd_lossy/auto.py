"""`auto=True`: compress an all-to-all only where it pays, decided alike on every rank.

Whether compressing pays depends on the link, the cores and the message size, so it is
measured, not guessed. What is measured is each call's *exchange cost*: the time the calling
thread spends in it (compressing and launching, then waiting and decoding; work the caller
overlaps between launch and wait is not counted), with the gradient all-to-all of an autograd
alltoall added to the forward call it belongs to. That cost is far steadier than a training
step's time: the step's compute noise (+-15% on a loaded machine) is left out, and the ranks'
skew too, by taking a call's cost as its *cheapest rank's*: the rank that arrived last waited
only for the bytes, so its cost is compress + transfer + decode with no waiting for peers.

But the exchange cost may not see everything a mode costs: before Open MPI was made to yield
(backend.yield_when_idle), the model's own work was measured 10-25 ms a step slower beside the
codec in the DLRM example, three times the exchange's own difference. So each call's *period* is
measured as well: from its start to the next call's start on the same slot, which spans the
iteration the call's mode ran (its gradient call, the model's work, the optimizer). Either
measure saying plain decides plain. Lossy needs both, the period's by HYSTERESIS, every lossy
period below every plain one; or, while probing, three calls of each or more with every lossy
cost below every plain one and lossy's shortest period HYSTERESIS below plain's shortest. One
slow period held the first rule back: in the example the first lossy call's period ran 75-92 ms
in seven runs at 10 and 100 Gbit/s, against 51-64 ms for most later ones, and at 10 Gbit/s,
where lossy's steps were clearly shorter, it ran 10 plain calls of 30 in each of 15 runs. Two
calls of each were too few for the second: at 100 Gbit/s and on the unlimited link a plain
call's cost ran 5-8 or 10-14 ms by turns, and two slow ones in a row decided lossy where plain
was faster. With the yield the model's own work took the same time in both modes (RESULTS,
"auto's period guard"); the periods stay as the guard the costs need.

Each compressor with `auto=True` keeps, per process set, a *slot*:

  warm-up  the first WARMUP calls, one lossy then one plain, are not counted: a mode's first
           call pays for allocation, the codec's caches and Horovod's buffers, so the first look
           compares no mode's first call; and a training's first steps are slow (the DLRM
           example's first two take 1.5-3x a later one);
  probe    then the calls alternate lossy and plain: lossy, plain (the first look), then the
           Thue-Morse sequence (lossy, plain, plain, lossy, plain, lossy, lossy, plain, ...). So a
           trend in the step times (steps that still speed up after the warm-up) cancels in every
           four calls, and work a training does every 2, 4 or 8 steps falls on both modes alike: a
           sequence of period 4 put the DLRM example's slow step, every fourth (66-88 ms against
           46-59), on the same mode's calls in every run, and it decided plain at 10 Gbit/s in
           one run of four. The call after the first look runs before its agreement is read:
           lossy costs less there on a slow link (a plain call cost 0.1 s more than a lossy one
           at 1 Gbit/s in the example) than plain does on a fast one. After the first call of
           each (FIRST_LOOK), then every PROBE_CALLS calls, the ranks allgather, in the
           background, their size bucket
           and the costs of the latest calls of each mode (one tiny allgather, read LAG calls later,
           so nobody waits for it). Every rank applies the same rule to the same rows (`_rule`):
           with per-call costs as the cheapest rank's, a mode wins once its costs are all below the
           other's (SEPARATE calls each; a clear case is decided after a few calls, so a short run
           pays little for probing, and a close one costs little per probed call) or, after
           MAX_PROBE calls of each, by the lower median. A tie goes to plain: auto never pays for a
           gain it cannot see; so does a lossy median cost HYSTERESIS above plain's after SEPARATE
           calls each, even where one slow plain call (a mode's first often is) keeps the costs
           overlapping, and a lossy median cost no lower than plain's after NO_GAIN calls each:
           where the two cost about the same (the user script on fast links, where a lossy step
           ran about 4% longer), probing on to MAX_PROBE ran 11 lossy calls of 30 in 14 runs of
           32, and the calls after NO_GAIN each could only find a gain too small to pay for
           themselves. So does, after NO_GAIN calls each, a lossy median cost that saves less
           than GAIN_SHARE of plain's median period (`_saves_too_little`): the period, which lossy
           must shorten by HYSTERESIS, holds the exchange, and a lossy cost a little below
           plain's had kept those probes going. A rank without costs for its current size sends
           everyone back to probing;
  decided  agreements come every AGREE_EVERY calls. The losing mode runs twice FIRST_REFRESH
           calls after the decision, then after twice as many calls each time, up to every
           REFRESH, and the agreement after those two calls judges it by them alone, against
           the winner's latest calls: the decision switches where the other mode's median is
           HYSTERESIS better. Between refreshes the loser has no call to judge it by, and the
           decision holds: its older calls against the winner's latest would compare phases of
           the run (an AVX2 run at 10 Gbit/s switched to plain after 23 lossy calls on the
           probe's plain calls, 20 calls old). A decision taken on the probe's early calls is
           checked against the current steps soon (in runs of 120 steps the example once kept
           lossy for 117 calls on the strength of its first plain calls), and the decision
           follows a link or a load that changes, a refresh gap later.

Plain is also decided at the first look, after one call of each, from a lossy call's *floor*:
its codec time (compressing and decoding, its call's statistics; the cheapest rank's) plus its
share of the bytes times the cheapest plain call. If a plain call costs P = L + raw/R (a latency
L and a rate R, both unknown), a lossy call's transfer costs L + wire/R >= (wire/raw) * P, so
the floor is a floor of what the lossy call cost and needs no second sample of a noisy cost.
Plain is decided when the floor comes within HYSTERESIS of plain's (median) cost: lossy could
gain less than auto acts on. Or within FLOOR_MARGIN of plain's cheapest call, where the lossy
calls' median cost is no lower than that call's: the floor leaves out the launch, Horovod's ticks
and the Python around the codec, and in the DLRM example on an unlimited link a lossy call's
whole cost ran 1.3-1.9x its floor. (The cheapest, as a training's early steps slow some plain
calls: the example's plain calls at steps 2-4 cost up to 2x the later ones.) On a link slow
enough for lossy to win clearly, the floor is far below plain's cost (0.41-0.47x at 10 Gbit/s,
0.08x at 1 Gbit/s in the example), so neither rule fires on one noisy call there. On a link
about as fast as the codec or faster, the case where probing costs most, plain then runs from
the sixth call, after three lossy ones (the warm-up's, the first look's and the one while its
agreement travels). The clear case the other way is decided at the first look too: lossy, where its
cost is under CLEAR times plain's and its period shorter by HYSTERESIS (at 1 Gbit/s in the
example a lossy call cost 9-12 ms against plain's 86-107), so a slow link's run pays for two
plain calls, each about 0.1 s there. In the example (2026-12-05, 40 steps): 3 lossy calls on
an unlimited or a 100 Gbit/s link in 33 runs of 34, where 5-12 ran before (with both warm-up
calls lossy, the same rules ran 7-9: the first look's plain call was its mode's first); 2
plain calls at 1 Gbit/s in 17 runs of 17.

The gradient all-to-all of an autograd alltoall *follows* the forward one (`pair`): each
gradient call takes the mode of the forward compressor's latest call on that group, so an
iteration is all-lossy or all-plain, and its cost is added to that forward call's. The dense
gradients of a DistributedOptimizer given the compressor follow and add to it the same way
(hvd_lossy.optimizer), so the bytes a mode saves there count in its cost.

Since every input of the rule is agreed, all ranks take the same path on every call: a plain
call on one rank never meets a framed call on another. A rank whose message size leaves its
bucket forgets its costs, and the next agreement sends everyone back to probing.
"""
import collections
import itertools
import math
import statistics
import time
import weakref

import torch

from hvd_lossy.backend import as_backend
from hvd_lossy.collective import remote_bytes

WARMUP = 2        # first calls, lossy then plain, not counted (each mode's first, early steps)
PROBE_CALLS = 4   # calls between agreements while probing: 2 plain, 2 lossy
FIRST_LOOK = 2    # probed calls before the first agreement: 1 plain, 1 lossy (the floor rule)
LAG = 1           # calls between launching an agreement and reading it
SEPARATE = 2      # calls of each mode whose costs, all below the other's, decide
NO_GAIN = SEPARATE + 1  # calls of each after which a lossy median cost >= plain's decides plain
MAX_PROBE = 8     # calls of each mode after which the medians decide
AGREE_EVERY = 16  # calls between agreements once decided
FIRST_REFRESH = 3 * AGREE_EVERY  # calls from a decision to the losing mode's first run again
REFRESH = 192     # the most calls between runs of the losing mode (a multiple of AGREE_EVERY)
HYSTERESIS = 0.05  # a decided slot switches only for a 5% lower median
# A lossy call measured no cheaper than plain decides plain while its floor is within this of
# plain's cost: its whole cost ran 1.3-1.9x its floor in the DLRM example on an unlimited link.
FLOOR_MARGIN = 0.2
# Lossy's exchange must save this share of plain's period, after NO_GAIN calls each, for the
# probe to go on: half of HYSTERESIS, which its period must gain by to decide lossy. At 10
# Gbit/s the user script's lossy calls saved 3-13 ms of 59-94 ms periods; on an unlimited link
# they cost from 4 ms more to 3 ms less (benchmarks/RESULTS.md, "auto's own cost").
GAIN_SHARE = HYSTERESIS / 2
# Lossy costing under this fraction of plain decides at the first look (its period shorter too):
# 0.10-0.11 there at 1 Gbit/s in the DLRM example; 0.49-0.94 at 10 Gbit/s, where the probe goes
# on in all but one run of ten (lossy wins there too).
CLEAR = 0.5
KEEP = MAX_PROBE  # costs kept per mode
# Calls by which a slot whose sizes stay has decided: the last probe agreement is read then.
DECIDED_WITHIN = WARMUP + 2 * MAX_PROBE + PROBE_CALLS + LAG
LOSSY, PLAIN = "lossy", "plain"

_numbers = collections.defaultdict(itertools.count)  # per process set: slots made so far
_live = weakref.WeakSet()  # every slot whose compressor is alive, for report()


def _bucket(nbytes):
    """Size class of a message: half-octaves of the bytes a rank sends the others."""
    return -1 if nbytes <= 0 else int(math.floor(2 * math.log2(nbytes)))


def _rule(decision, plain, lossy, floors=(), plain_periods=(), lossy_periods=()):
    """The agreed mode from the calls' exchange costs of each mode (lists, seconds, the cheapest
    rank's per call), or None to go on probing. floors: the lossy calls' floors (codec time plus
    the transfer's least cost), each a lower bound of that call's cost. *_periods: the calls'
    periods (start to the next call's start). Where both modes have some, lossy needs both
    measures, or while probing _lossy_early; either measure deciding plain decides plain."""
    by_cost = _compare(decision, plain, lossy, floors, steady=True)
    if not plain_periods or not lossy_periods:
        return by_cost
    if decision is None and _saves_too_little(plain, lossy, plain_periods):
        return PLAIN
    if by_cost != PLAIN and decision is None and \
            _lossy_early(plain, lossy, plain_periods, lossy_periods):
        return LOSSY
    by_period = _compare(decision, plain_periods, lossy_periods)
    if PLAIN in (by_cost, by_period):
        return PLAIN
    if by_cost == by_period == LOSSY:
        return LOSSY
    return decision  # probing: None, go on; decided: keep it until both agree otherwise


def _saves_too_little(plain, lossy, plain_periods):
    """While probing, after NO_GAIN calls of each: whether lossy's median exchange cost saves
    less than GAIN_SHARE of plain's median period. The period holds the exchange, so lossy can
    shorten it by little more than the exchange saves; a call's period is noisier (+-15%) than
    its cost, and where the two modes cost about the same, probing on to MAX_PROBE for a period
    GAIN_SHARE shorter ran up to 11 lossy calls of 30 (the user script on an unlimited link,
    where a lossy step ran 2-5% longer) and almost always ended on plain."""
    if min(len(plain), len(lossy)) < NO_GAIN:
        return False
    saved = statistics.median(plain) - statistics.median(lossy)
    return saved < GAIN_SHARE * statistics.median(plain_periods)


def _lossy_early(plain, lossy, plain_periods, lossy_periods):
    """While probing, lossy before SEPARATE calls of each where the case is clear: every lossy
    cost below CLEAR times every plain one and every lossy period HYSTERESIS below every plain
    one, a gap no call's noise closes; or on SEPARATE + 1 calls of each or more, every lossy cost
    below every plain one and lossy's shortest period HYSTERESIS below plain's shortest (the
    shortest: one slow period would hold back a rule on all of them)."""
    calls = min(len(plain), len(lossy), len(plain_periods), len(lossy_periods))
    if calls and max(lossy) < min(plain) * CLEAR and \
            max(lossy_periods) < min(plain_periods) * (1 - HYSTERESIS):
        return True
    if calls <= SEPARATE:
        return False
    return max(lossy) < min(plain) and min(lossy_periods) < min(plain_periods) * (1 - HYSTERESIS)


def _compare(decision, plain, lossy, floors=(), steady=False):
    """_rule on one measure. steady: the exchange cost, which takes plain as soon as lossy's
    median is HYSTERESIS above plain's (one slow plain call, such as a mode's first, would
    otherwise keep the costs overlapping until MAX_PROBE), or no lower than plain's after
    NO_GAIN calls each (MAX_PROBE would decide plain on it too). Otherwise the period, whose noise
    (+-15% a step) puts two calls of each in either order one time in six: lossy must win it by
    HYSTERESIS, or an even case would be called lossy that often."""
    margin = 0.0 if steady else HYSTERESIS
    if decision is None:
        if plain and floors:
            cost, floor = statistics.median(plain), min(floors)
            if floor > cost * (1 - HYSTERESIS):
                return PLAIN  # lossy's best case gains less than HYSTERESIS
            best = min(plain)  # a training's early steps slow some plain calls, never speed one
            if lossy and statistics.median(lossy) >= best and floor > best * (1 - FLOOR_MARGIN):
                return PLAIN  # lossy measured dearer, and its best case gains little
        if len(plain) < SEPARATE or len(lossy) < SEPARATE:
            return None
        if max(lossy) < min(plain) * (1 - margin):
            return LOSSY
        if max(plain) <= min(lossy):
            return PLAIN
        if steady and statistics.median(lossy) > statistics.median(plain) * (1 + HYSTERESIS):
            return PLAIN
        if steady and min(len(plain), len(lossy)) >= NO_GAIN and \
                statistics.median(lossy) >= statistics.median(plain):
            return PLAIN  # no gain in sight: more probing costs more than it could find
        if min(len(plain), len(lossy)) < MAX_PROBE:
            return None
        wins = statistics.median(lossy) < statistics.median(plain) * (1 - margin)
        return LOSSY if wins else PLAIN
    p, q = statistics.median(plain), statistics.median(lossy)
    if decision == LOSSY:
        return PLAIN if p < q * (1 - HYSTERESIS) else LOSSY
    return LOSSY if q < p * (1 - HYSTERESIS) else PLAIN


class _Slot:
    def __init__(self, number, compressor, backend):
        self.number, self.backend = number, backend
        self.label = repr(compressor)
        self.calls = 0
        self.modes = {}           # call number -> mode, of the calls counted
        self.costs = {}           # call number -> exchange cost so far (seconds)
        self.floors = {}          # lossy call number -> its codec time so far (seconds)
        self.shares = {}          # lossy call number -> the smallest wire / raw bytes of its calls
        self.started = {}         # call number -> perf_counter() at its start
        self.periods = {}         # call number -> seconds from its start to the next call's
        self.local_bucket = None
        self.buckets = None       # agreed: every rank's size bucket at the last decision
        self.decision = None      # agreed: LOSSY, PLAIN, or None while probing
        self.agreed = None        # the rule's inputs at the last agreement
        self.probe_from = WARMUP
        self.next_agreement = WARMUP + FIRST_LOOK
        self.refresh_at = -1
        self._restart_refresh()
        self.pending = None       # (the backend's Work, call number at which to read it)
        self.counts = {LOSSY: 0, PLAIN: 0}
        self.last_mode = None     # the mode of the latest call, warm-up included
        self.leader = None        # a follower's: the forward compressor's slot (weakref)

    def choose(self, nbytes):
        """(the mode of the next call, the same on every rank of the process set, and a
        function the call reports its cost to)."""
        if self.leader is not None:
            leader = self.leader()
            mode = LOSSY if leader is None or leader.last_mode is None else leader.last_mode
            self.calls += 1
            self.counts[mode] += 1
            k = None if leader is None else leader.calls - 1
            return mode, (lambda s, record=None: leader.add_cost(k, s, record)) \
                if leader is not None else _ignore
        k = self.calls
        self.calls += 1
        now = time.perf_counter()
        if k - 1 in self.started:
            self.periods[k - 1] = now - self.started.pop(k - 1)
        bucket = _bucket(nbytes)
        if bucket != self.local_bucket:  # other sizes: the costs so far say nothing of them
            self.local_bucket = bucket
            for book in (self.modes, self.costs, self.floors, self.shares, self.periods):
                book.clear()
        if self.pending is not None and k >= self.pending[1]:
            rows = self.pending[0].wait().tolist()
            self.pending = None
            self._apply(rows, k)
        if k == self.next_agreement:
            self._launch_agreement(k)
        if k < WARMUP:
            mode = LOSSY if k == 0 else PLAIN
        elif self.decision is None:
            i = k - self.probe_from  # L, P (the first look), then Thue-Morse: L, P, P, L, P, ...
            mode = LOSSY if (i == 0 if i < 2 else _thue_morse(i - 2) == 0) else PLAIN
        elif k in (self.refresh_at, self.refresh_at + 1):
            mode = _other(self.decision)
        else:
            mode = self.decision
        self.counts[mode] += 1
        self.last_mode = mode
        if k < WARMUP:
            return mode, _ignore
        self.modes[k] = mode
        self.costs[k] = math.nan  # until the call finishes
        self.started[k] = now
        if mode == LOSSY:
            self.floors[k] = 0.0  # a floor too low only keeps the rule from firing
            self.shares[k] = 1.0
        return mode, lambda s, record=None: self.add_cost(k, s, record, own=True)

    def add_cost(self, k, seconds, record=None, own=False):
        """Adds to call k's cost: its own time (own) or its gradient call's; and to a lossy
        call's floor the codec time of `record`, the call's statistics (None: not known, which
        leaves the floor unknown), whose wire / raw bytes also bound the floor's transfer."""
        if k in self.costs:
            c = self.costs[k]
            self.costs[k] = seconds + (0.0 if own and math.isnan(c) else c)
        if k in self.floors:
            self.floors[k] += math.nan if record is None else record.compress_s + record.decompress_s
            if record is not None and record.raw_bytes > 0:
                self.shares[k] = min(self.shares[k], record.wire_bytes / record.raw_bytes)

    def _latest(self, mode, before):
        first = self.fresh_from.get(mode, -1)
        calls = [k for k, m in self.modes.items() if m == mode and first <= k < before]
        return sorted(calls)[-KEEP:]

    def _launch_agreement(self, k):
        # The calls are agreed (every rank took the same modes), so every rank names the same
        # ones; their costs are complete: the previous call and its gradient finished before
        # this one started.
        row = [float(self.local_bucket)]
        calls = {mode: self._latest(mode, k) for mode in (PLAIN, LOSSY)}
        for mode in (PLAIN, LOSSY):
            row += [float(len(calls[mode]))] + _padded([self.costs[c] for c in calls[mode]])
        for book in (self.floors, self.shares):
            row += _padded([book[c] for c in calls[LOSSY]])
        for mode in (PLAIN, LOSSY):
            row += _padded([self.periods.get(c, math.nan) for c in calls[mode]])
        for old in [c for c in self.modes if c < k - 4 * REFRESH]:  # bounded bookkeeping
            for book in (self.modes, self.costs, self.floors, self.shares, self.periods):
                book.pop(old, None)
        work = self.backend.allgather_async(
            torch.tensor([row], dtype=torch.float64),
            f"hvd_lossy.auto.{self.backend.key}.{self.number}.{k}", same_shape=True)
        self.pending = (work, k + LAG)
        self.next_agreement = -1  # set again once this one is read

    def _apply(self, rows, k):
        buckets = sorted({r[0] for r in rows})
        costs, floors, periods = {}, [], {}
        for i, mode in enumerate((PLAIN, LOSSY)):
            at = 1 + i * (KEEP + 1)
            n = {int(r[at]) for r in rows}
            if len(n) != 1:  # a rank's costs were cleared (its size changed): measure again
                costs = None
                break
            # a call's cost: its cheapest rank's; a call not finished on some rank is left out
            n = n.pop()
            costs[mode] = _cheapest(rows, at + 1, n)
            periods[mode] = _cheapest(rows, _PERIODS + i * KEEP, n)
        if costs is not None and costs[PLAIN]:  # the lossy calls' floors (after both modes' costs)
            n = int(rows[0][1 + KEEP + 1])
            least = min(costs[PLAIN])
            floors = [min(r[_FLOORS + j] for r in rows) + min(r[_FLOORS + KEEP + j] for r in rows)
                      * least for j in range(n)]
            floors = [f for f in floors if not math.isnan(f)]
        if costs is None:
            self._probe_again(k)
            return
        if self.decision is not None and not (costs[PLAIN] and costs[LOSSY]):
            if self.buckets == buckets and costs[self.decision]:
                # The losing mode has not run since the decision: nothing new to judge it by
                # (its older calls, up to a refresh gap old, against the winner's latest would
                # be a comparison across the run's phases).
                self.next_agreement = k + AGREE_EVERY
            else:
                self._probe_again(k)
            return
        if self.buckets != buckets:
            self.decision = None
            self._restart_refresh()
        better = _rule(self.decision, costs[PLAIN], costs[LOSSY], floors,
                       periods[PLAIN], periods[LOSSY])
        if better is None:  # still probing: after the first look, every PROBE_CALLS calls
            first_look = k <= self.probe_from + FIRST_LOOK + LAG
            self.next_agreement = self.probe_from + PROBE_CALLS if first_look else k + PROBE_CALLS
            return
        self.decision, self.buckets = better, buckets
        self.fresh_from[_other(better)] = k  # the loser is judged by its next (refresh) calls
        self.agreed = {"plain_ms": statistics.median(costs[PLAIN]) * 1e3,
                       "lossy_ms": statistics.median(costs[LOSSY]) * 1e3}
        if floors:
            self.agreed["lossy_floor_ms"] = statistics.median(floors) * 1e3
        if periods[PLAIN] and periods[LOSSY]:
            self.agreed.update(plain_period_ms=statistics.median(periods[PLAIN]) * 1e3,
                               lossy_period_ms=statistics.median(periods[LOSSY]) * 1e3)
        self.next_agreement = k + AGREE_EVERY
        if self.refresh_at < k:  # both calls well before the agreement that reads them
            self.refresh_at = k + self.refresh_gap - AGREE_EVERY // 2
            self.refresh_gap = min(2 * self.refresh_gap, REFRESH)

    def _probe_again(self, k):
        """Back to probing from call k: a rank's costs were cleared, or the decided mode has
        none."""
        self.decision, self.buckets, self.probe_from = None, None, k
        self._restart_refresh()
        self.next_agreement = k + FIRST_LOOK
        self.agreed = None

    def _restart_refresh(self):
        """A new decision is checked soon again, each mode judged by all its latest calls."""
        self.refresh_gap = FIRST_REFRESH  # calls from a decision to the losing mode's next run
        self.fresh_from = {}  # mode -> its first call the rule may use (the loser's: a refresh's)

    def report(self):
        key = self.backend.key
        leader = self.leader() if self.leader is not None else None
        base = {"compressor": self.label, "process_set": key if isinstance(key, int) else repr(key),
                "calls": self.calls}
        counts = {"lossy_calls": self.counts[LOSSY], "plain_calls": self.counts[PLAIN]}
        if leader is not None:
            return {**base, "follows": leader.label, "decision": leader.decision or "probing", **counts}
        return {**base, "decision": self.decision or "probing",
                "message_bytes": None if self.buckets is None else
                [round(2 ** (b / 2)) for b in self.buckets],
                **counts, **(self.agreed or {})}


# Where the agreement row's sections start: the bucket; per mode its number of calls and their
# costs; the lossy calls' codec times, then their wire shares; per mode the calls' periods.
_FLOORS = 1 + 2 * (KEEP + 1)
_PERIODS = _FLOORS + 2 * KEEP


def _other(mode):
    return PLAIN if mode == LOSSY else LOSSY


def _thue_morse(j):
    """The j-th term of the Thue-Morse sequence: the parity of j's one bits."""
    return bin(j).count("1") & 1


def _padded(values):
    return values + [math.nan] * (KEEP - len(values))


def _cheapest(rows, at, n):
    """Per call j < n, the smallest of the ranks' r[at + j]; calls a rank lacks are left out."""
    per_call = ([r[at + j] for r in rows] for j in range(n))
    return [min(c) for c in per_call if not any(map(math.isnan, c))]


def _ignore(_seconds, _record=None):
    pass


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
    """Starts one alltoall of an auto compressor by the mode its slot agrees on; the returned
    handle reports the call's exchange cost to the slot when it finishes."""
    t0 = time.perf_counter()
    nbytes, _local = remote_bytes(tensor, splits, backend)
    mode, report_cost = slot(compressor, backend).choose(nbytes)
    handle = start_lossy() if mode == LOSSY else start_plain()
    return _Timed(handle, time.perf_counter() - t0, report_cost)


class _Timed:
    """A started call (any of the backends' handles: everything else passes through) whose
    first wait() reports the call's exchange cost: its start plus its wait."""

    def __init__(self, handle, launched, report_cost):
        self._handle, self._launched, self._report = handle, launched, report_cost

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        result = self._handle.wait(*args, **kwargs)
        if self._report is not None:
            record = getattr(self._handle, "record", None)  # a lossy call's statistics
            self._report(self._launched + time.perf_counter() - t0, record)
            self._report = None
        return result

    def __getattr__(self, name):
        return getattr(self._handle, name)


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
