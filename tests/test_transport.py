"""The Horovod transport: hvd_lossy.torch's compressed collectives, run on real multi-process
launches. The contracts live as named cases in the workers (tests/mp/transport_*.py):
  collectives: every received element within the frame's bound, for float32/float16/bfloat16,
      1-D and n-D, uneven and zero splits, async, autograd with reversed splits, several
      frames per destination, a destination's pieces in one compact frame; Compression.none
      bit-identical to Horovod; allgather/broadcast;
      reductions refuse lossy compressors; statistics.
  errors: bad splits, dtype/shape disagreement, uncompressible dtype, a corrupt frame, frames
      disagreeing with their announcement, a failing compressor: RankError on every rank,
      naming the rank, and the ranks stay in step.
  process_sets: lossy collectives within a process set; ranks outside it stay in step.
Each launch runs both workers to pay the start-up (torch + Horovod) once.
"""
import os
import re

import itertools
import math
import types

import pytest
import torch

from tests._launch import assert_every_rank_passed, run_mpi

LAUNCHES = [
    pytest.param("mpirun", 2, id="mpirun-np2"),
    pytest.param("mpirun", 3, id="mpirun-np3-oversubscribed"),
    pytest.param("horovodrun", 2, id="horovodrun-np2-gloo"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("launcher,np", LAUNCHES)
def test_collectives_deliver_within_bound_and_errors_raise_on_every_rank(launcher, np):
    output = run_mpi("tests/mp/transport_run.py", np=np, args=["collectives", "errors", "optimizer", "process_sets"],
                     launcher=launcher, timeout=120)
    # horovodrun prefixes lines with "[rank]<stdout>:", and ranks' lines may run together
    assert_every_rank_passed(output, np)


def test_reexports_everything_horovod_torch_has():
    import horovod.torch as horovod

    import hvd_lossy.torch as hvd
    missing = [k for k in vars(horovod) if not k.startswith("__") and not hasattr(hvd, k)]
    assert not missing
    unchanged = ("rank", "size", "local_rank", "broadcast_parameters",
                 "broadcast_optimizer_state", "join", "barrier", "Sum", "Average", "mpi_ops")
    assert all(getattr(hvd, k) is getattr(horovod, k) for k in unchanged)


def test_yield_when_idle_turns_open_mpis_yield_on_unless_the_launch_or_the_user_chose():
    from hvd_lossy.backend import YIELD_VARIABLE, yield_when_idle
    env = {}
    assert yield_when_idle(env) == "1" and env == {YIELD_VARIABLE: "1"}
    env = {YIELD_VARIABLE: "0"}  # what `mpirun --mca mpi_yield_when_idle 0` puts in each rank
    assert yield_when_idle(env) == "0" and env == {YIELD_VARIABLE: "0"}
    env = {"HVD_LOSSY_MPI_YIELD": "0"}  # keep Open MPI's own default
    assert yield_when_idle(env) is None and YIELD_VARIABLE not in env


def test_init_sets_the_yield_before_horovod_starts_mpi(monkeypatch):
    import hvd_lossy.torch as hvd
    from hvd_lossy.backend import YIELD_VARIABLE
    monkeypatch.delenv(YIELD_VARIABLE, raising=False)
    monkeypatch.delenv("HVD_LOSSY_MPI_YIELD", raising=False)
    seen = []
    monkeypatch.setattr(hvd._hvd, "init", lambda *a, **k: seen.append((os.environ.get(YIELD_VARIABLE), a, k)))
    hvd.init(process_sets=None)
    assert seen == [("1", (), {"process_sets": None})]


def test_lossy_compressor_is_a_horovod_compressor_whose_config_round_trips():
    import json

    from horovod.torch.compression import Compressor

    from hvd_lossy.compression import Compression, LossyCompressor  # noqa: F401 (eval namespace)
    c = Compression.lossy(0.03, mode="abs", level=2, backward=Compression.lossy(0.1, backward=None))
    assert isinstance(c, Compressor)
    assert LossyCompressor.from_config(json.loads(json.dumps(c.get_config()))) == c
    assert eval(repr(c)) == c
    assert c.for_backward() == Compression.lossy(0.1, backward=None)
    assert Compression.lossy(0.03, backward=0.05).for_backward().error_bound == 0.05
    assert Compression.lossy(0.03, backward=None).for_backward() is Compression.none


def test_a_compression_given_as_a_string_says_what_to_pass():
    import hvd_lossy.torch as hvd
    with pytest.raises(TypeError, match=r"got the string 'lossy': pass .*Compression.lossy\(0.03\)"):
        hvd.alltoall(torch.ones(2, 2), compression="lossy")


def test_lossy_defaults_are_the_measured_recipe_dithered_gradients_at_0_02():
    from hvd_lossy.compression import GRADIENT_BOUND, Compression, LossyCompressor
    c = Compression.lossy(0.03)
    assert (c.backward, c.dither, c.level) == (GRADIENT_BOUND, "backward", 1) == (0.02, "backward", 1)
    back = c.for_backward()
    assert (back.error_bound, back.dither, back.mode) == (0.02, True, "rel")
    assert c.next_dither_seed() is None  # the lookups themselves keep dedup and are not dithered
    assert Compression.lossy(0.01).backward == 0.01  # never looser than the lookups
    assert Compression.lossy(0.5, mode="abs").backward == "same"  # abs units: nothing measured
    assert Compression.lossy(0.03, backward="same", dither=False).for_backward().dither is False
    plain = LossyCompressor(0.03)  # the class is the plain codec; configs mean what they say
    assert (plain.backward, plain.dither) == ("same", False)


def test_lossy_compressor_round_trips_one_frame_within_bound():
    from hvd_lossy.compression import Compression
    x = torch.rand(50, 8) * 4 - 2
    frame, ctx = Compression.lossy(0.01).compress(x)
    assert frame.dtype == torch.uint8 and frame.dim() == 1
    y = Compression.lossy(0.01).decompress(frame, ctx)
    assert float((y.double() - x.double()).abs().max()) <= 0.01 * float(x.max() - x.min())


def test_default_plan_is_one_frame_per_destination_with_own_bound():
    from hvd_lossy.compression import Compression
    assert Compression.lossy(0.02).plan([3, 0, 5]) == [(0, 3, 0.02), (1, 0, 0.02), (2, 5, 0.02)]


def test_segments_cut_each_chunk_into_one_frame_per_table():
    import json

    from hvd_lossy.compression import Compression, LossyCompressor
    # forward: every destination's chunk holds this rank's 2 tables of 4 rows each
    c = Compression.lossy(0.03, backward="same", segments=2, backward_segments=[2, 3, 0])
    assert c.plan([8, 8, 8]) == [(0, 4, 0.03), (0, 4, 0.03), (1, 4, 0.03), (1, 4, 0.03),
                                 (2, 4, 0.03), (2, 4, 0.03)]
    # backward: the chunk for rank r holds rank r's tables
    b = c.for_backward()
    assert b.plan([8, 12, 0]) == [(0, 4, 0.03), (0, 4, 0.03), (1, 4, 0.03), (1, 4, 0.03),
                                  (1, 4, 0.03), (2, 0, 0.03)]
    assert LossyCompressor.from_config(json.loads(json.dumps(c.get_config()))) == c
    assert eval(repr(c)) == c
    with pytest.raises(ValueError, match="chunk for rank 1 has 7 rows, not divisible into 2"):
        c.plan([8, 7, 8])
    with pytest.raises(ValueError, match="chunk for rank 2 has 4 rows but 0 segments"):
        b.plan([8, 12, 4])
    with pytest.raises(ValueError, match="segments must be >= 1, got 0"):
        Compression.lossy(0.03, segments=0)


def test_segments_bound_each_table_by_its_own_range():
    from hvd_lossy.compression import Compression
    import hvd_lossy
    wide, narrow = torch.rand(4, 8) * 2 - 1, torch.rand(4, 8) * 0.002 - 0.001
    chunk = torch.cat([wide, narrow])
    plan = Compression.lossy(0.03, segments=2).plan([8])
    frame, _ = hvd_lossy.compress_chunks(chunk, [r for _, r, _ in plan], [e for _, _, e in plan])
    narrow_back = hvd_lossy.decompress(frame)[4:]
    assert float((narrow_back - narrow).abs().max()) <= 0.03 * float(narrow.max() - narrow.min())


def test_dither_backward_dithers_the_gradient_frames_only():
    import json

    import hvd_lossy
    from hvd_lossy.compression import Compression, LossyCompressor
    c = Compression.lossy(0.03, backward=0.02, dither="backward", segments=2)
    assert c.next_dither_seed() is None  # lookups keep plain rounding (and dedup)
    b = c.for_backward()
    assert b.dither is True and b.error_bound == 0.02 and b.segments == 2
    seeds = [b.next_dither_seed(rank=1, size=2) for _ in range(3)]
    assert len(set(seeds)) == 3 and all(hvd_lossy.DITHER_SEEDS // 2 <= s < hvd_lossy.DITHER_SEEDS
                                        for s in seeds)  # rank 1's half of the seeds
    other = Compression.lossy(0.03, backward=0.02, dither="backward").for_backward()
    # Each compressor counts its own seeds, so a fresh one repeats a run exactly (the DLRM
    # example's runs in one process rely on it).
    assert [other.next_dither_seed(1, 2) for _ in range(3)] == seeds
    assert Compression.lossy(0.03, dither="backward").for_backward().dither is True
    assert LossyCompressor.from_config(json.loads(json.dumps(c.get_config()))) == c
    assert eval(repr(c)) == c
    frame, _ = Compression.lossy(0.03, dither=True).compress(torch.randn(8, 4))
    assert hvd_lossy.frame_info(frame)["segments"][0]["dither_seed"] is not None


@pytest.mark.parametrize("kwargs,error,named", [
    ({"error_bound": 0.1, "dither": "forward"}, ValueError, "'forward'"),
    ({"error_bound": 0.1, "dither": 1}, ValueError, "got 1"),
    ({"error_bound": -0.01}, ValueError, "-0.01"), ({"error_bound": float("nan")}, ValueError, "nan"),
    ({"error_bound": "0.1"}, TypeError, "'0.1'"), ({"error_bound": 0.1, "mode": "relative"}, ValueError, "'relative'"),
    ({"error_bound": 0.1, "level": 3}, ValueError, "got 3"), ({"error_bound": 0.1, "backward": "fp32"}, ValueError, "'fp32'"),
])
def test_bad_compressor_settings_raise_naming_the_value(kwargs, error, named):
    from hvd_lossy.compression import Compression
    with pytest.raises(error) as info:
        Compression.lossy(**kwargs)
    assert named in str(info.value)


def test_reductions_refuse_lossy_compressors_before_communicating():
    import hvd_lossy.torch as hvd
    lossy, t = hvd.Compression.lossy(0.02), torch.ones(4)
    calls = {
        "allreduce": lambda: hvd.allreduce(t, compression=lossy),
        "allreduce_async": lambda: hvd.allreduce_async(t, compression=lossy),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([t], None, None, lossy),
        "reducescatter": lambda: hvd.reducescatter(t, compression=lossy),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="summing compressed bytes is meaningless"):
            call()
    with pytest.raises(TypeError, match="takes no compression argument"):
        hvd.allreduce_async(t, compression=hvd.Compression.fp16)


@pytest.mark.mpi
@pytest.mark.slow
def test_alltoall_benchmark_reports_wire_bytes_and_the_target(tmp_path):
    import json
    out = tmp_path / "alltoall.json"
    run_mpi("hvd_lossy.bench", np=2, args=["alltoall", "--sizes", "0.0625", "--iters", "1",
                               "--bounds", "0.03", "--json", out], timeout=120)
    report = json.loads(out.read_text())
    by_method = {r["method"]: r for r in report["results"]}
    assert set(by_method) == {"plain", "fp16", "lossy 0.03"}
    # 2 ranks, even splits: half of each message is the own chunk, which stays local
    assert by_method["plain"]["wire_bytes"] == by_method["plain"]["message_bytes"] / 2
    assert by_method["fp16"]["reduction"] == 2.0
    assert report["target"]["worst"] == by_method["lossy 0.03"]["reduction"] > 1
    assert report["cpu"]["simd_level"] in (0, 1, 2)  # the kernel path beside the figures


class _FakeSet:
    process_set_id = 0


class _OneRank:
    """A backend of one rank whose allgather is done at once: the slot's agreements in-process."""
    key = 0

    def allgather_async(self, row, name, same_shape):
        return types.SimpleNamespace(wait=lambda: row)


def _drive(slot, cost_of, calls, nbytes=1 << 20, compute_of=lambda mode: 0.05):
    """Runs `calls` calls through an auto slot, each costing cost_of(mode) seconds, in
    iterations that take that plus compute_of(mode) seconds on auto's clock; their modes."""
    from hvd_lossy import auto
    clock = types.SimpleNamespace(now=100.0)
    saved, auto.time = auto.time, types.SimpleNamespace(perf_counter=lambda: clock.now)
    modes = []
    try:
        for _ in range(calls):
            mode, report = slot.choose(nbytes)
            cost = cost_of(mode)  # once a call: cost_of may change with the calls
            report(cost)
            modes.append(mode)
            clock.now += cost + compute_of(mode)
    finally:
        auto.time = saved
    return modes


def _row(bucket, plain, lossy, codec=(), shares=None, plain_periods=(), lossy_periods=()):
    """One rank's agreement row (auto._Slot._launch_agreement's layout)."""
    from hvd_lossy import auto
    pad = auto._padded
    shares = [0.0] * len(codec) if shares is None else list(shares)  # floor = codec time
    return ([float(bucket), len(plain), *pad(list(plain)), len(lossy), *pad(list(lossy))]
            + pad(list(codec)) + pad(shares) + pad(list(plain_periods)) + pad(list(lossy_periods)))


def test_auto_rule_decides_a_clear_case_after_a_few_calls_and_a_close_one_by_medians():
    from hvd_lossy import auto
    assert auto._rule(None, [2.0], [1.0]) is None  # one call each says nothing yet
    assert auto._rule(None, [2.0, 2.1], [1.0, 1.1]) == auto.LOSSY  # every lossy cost below plain's
    assert auto._rule(None, [1.0, 1.1], [2.0, 2.1]) == auto.PLAIN
    assert auto._rule(None, [1.0, 2.0], [1.5, 1.6]) is None  # overlapping: probe on
    # overlapping only through one slow plain call, lossy's median HYSTERESIS above: plain now
    assert auto._rule(None, [1.0, 3.0], [2.2, 2.3]) == auto.PLAIN
    assert auto._rule(None, [1.0, 3.0], [1.9, 2.3]) is None  # medians within HYSTERESIS
    # that shortcut is the exchange cost's; the noisier period needs separation or MAX_PROBE
    assert auto._rule(None, [2.0, 2.1], [1.0, 1.1], plain_periods=[10, 30],
                      lossy_periods=[21, 22]) is None
    n = auto.MAX_PROBE
    assert auto._rule(None, [1.2, 2.0] * (n // 2), [1.4, 1.6] * (n // 2)) == auto.LOSSY  # medians
    assert auto._rule(None, [1.0] * n, [1.0] * n) == auto.PLAIN  # a tie: nothing to gain
    # decided: the other mode must be HYSTERESIS better
    assert auto._rule(auto.LOSSY, [0.98], [1.0]) == auto.LOSSY
    assert auto._rule(auto.LOSSY, [0.9], [1.0]) == auto.PLAIN
    assert auto._rule(auto.PLAIN, [1.0], [0.9]) == auto.LOSSY


def test_auto_rule_decides_plain_once_lossy_shows_no_gain_after_no_gain_calls_each():
    """Where a lossy call costs about a plain one (fast links), probing on to MAX_PROBE ran
    lossy calls that could only find a gain too small to pay for them: a lossy median cost no
    lower than plain's after NO_GAIN calls each decides plain, as MAX_PROBE would."""
    from hvd_lossy import auto
    plain = [8.0, 9.0, 10.0]
    assert auto.NO_GAIN == 3 and len(plain) == auto.NO_GAIN
    assert auto._rule(None, plain, [8.5, 9.2, 9.9]) == auto.PLAIN  # within HYSTERESIS, no lower
    assert auto._rule(None, plain[::2], [8.6, 9.6]) is None  # two calls each: probe on
    assert auto._rule(None, plain, [8.5, 8.8, 9.9]) is None  # lossy's median lower: probe on
    # the cost, the steadier measure, decides it even where the periods favour lossy
    assert auto._rule(None, plain, [8.5, 9.2, 9.9], plain_periods=[70, 72, 74],
                      lossy_periods=[60, 62, 64]) == auto.PLAIN


def test_auto_rule_decides_plain_after_no_gain_calls_each_when_lossy_saves_too_little_of_a_step():
    """The period holds the exchange: a lossy call that saves under GAIN_SHARE of plain's period
    cannot shorten it by the HYSTERESIS that deciding lossy needs, so after NO_GAIN calls each
    the probe stops on plain, whatever the noisier periods show; a saving above it probes on."""
    from hvd_lossy import auto
    assert auto.GAIN_SHARE == auto.HYSTERESIS / 2 == 0.025
    plain, periods = [8.0, 9.0, 10.0], [58.0, 60.0, 62.0]  # ms: the user script, unlimited link
    saving = auto.GAIN_SHARE * 60.0  # 1.5 ms
    lossy = [c - saving + 0.1 for c in plain]  # saves 1.4 ms of a 60 ms step: too little
    assert auto._rule(None, plain, lossy) is None  # costs alone: lossy lower, probe on
    assert auto._rule(None, plain, lossy, plain_periods=periods,
                      lossy_periods=[50.0, 51.0, 52.0]) == auto.PLAIN
    lossy = [c - saving - 0.1 for c in plain]  # saves 1.6 ms: enough to probe on
    assert auto._rule(None, plain, lossy, plain_periods=periods,
                      lossy_periods=[57.0, 59.0, 61.0]) is None
    # two calls each say nothing yet; a decided slot is judged by HYSTERESIS as before
    assert auto._rule(None, plain[:2], [7.9, 8.9], plain_periods=periods[:2],
                      lossy_periods=[57.0, 59.0]) is None
    assert auto._rule(auto.LOSSY, plain, [7.9, 8.9, 9.9], plain_periods=periods,
                      lossy_periods=periods) == auto.LOSSY
    # at 10 Gbit/s (ms): lossy saves 6 of 64, far above the share, and wins on both measures
    assert auto._rule(None, [14.0, 14.5, 15.0], [8.0, 8.5, 9.0], plain_periods=[64.0, 65.0, 66.0],
                      lossy_periods=[57.0, 58.0, 59.0]) == auto.LOSSY


def test_auto_rule_decides_plain_from_one_call_each_when_lossy_cannot_gain_enough():
    """A lossy call's floor (its codec time plus its bytes' least transfer) is a floor of its
    cost: once it is within HYSTERESIS of plain's median cost, lossy could gain less than auto
    acts on, and one call of each decides plain; a floor further below says nothing."""
    from hvd_lossy import auto
    assert auto._rule(None, [1.0], [3.0], floors=[1.2]) == auto.PLAIN
    assert auto._rule(None, [1.0], [3.0], floors=[1.2], plain_periods=[9.0],
                      lossy_periods=[8.0]) == auto.PLAIN  # a floor needs no second measure
    # lossy measured cheaper, but by at most 4% ...
    assert auto._rule(None, [1.0], [0.97], floors=[0.96]) == auto.PLAIN
    assert auto._rule(None, [1.0], [0.97], floors=[0.94]) is None  # ... or perhaps 6%: probe on
    assert auto._rule(None, [1.0, 1.3], [0.99], floors=[0.98]) is None  # far below plain's median
    # within FLOOR_MARGIN of plain's cheapest call, but lossy measured cheaper than it
    assert auto._rule(None, [1.0, 1.3], [0.99], floors=[1.1 * 0.96]) is None
    assert auto._rule(None, [1.0, 1.3], [1.12], floors=[1.1]) == auto.PLAIN
    # the DLRM example on an unlimited link (ms): floor 5.3, whole cost 6.3, plain 5.2
    assert auto._rule(None, [5.2], [6.3], floors=[5.3]) == auto.PLAIN
    assert auto._rule(None, [2.0], [1.0], floors=[0.5]) is None
    assert auto._rule(None, [2.0, 2.1], [1.0, 1.1], floors=[0.5, 0.6]) == auto.LOSSY
    assert auto._rule(None, [], [3.0], floors=[1.2]) is None  # nothing to compare with


def test_auto_rule_decides_plain_from_one_call_each_when_lossy_cost_more_and_its_floor_is_close():
    """A floor within FLOOR_MARGIN of plain's cost and a lossy call measured dearer decide plain
    (the floor leaves out what a lossy call pays around its codec); a floor far below plain's
    cost, as on a slow link, leaves one noisy lossy call undecided."""
    from hvd_lossy import auto
    # the example's first look on an unlimited link (ms): floor 0.94x plain's cost
    assert auto._rule(None, [7.68], [11.49], floors=[7.23]) == auto.PLAIN
    assert auto._rule(None, [7.68], [7.5], floors=[7.23]) is None  # lossy measured cheaper
    # plain's cheapest call is the measure: a training's early steps slow some plain calls (the
    # example's second look, a plain call at step 2 slowed 2x)
    assert auto._rule(None, [11.66, 5.47], [7.89, 6.85], floors=[6.66, 5.18]) == auto.PLAIN
    assert auto._rule(None, [11.66, 5.47], [5.6, 5.3], floors=[5.2, 5.18]) is None
    margin = 1 - auto.FLOOR_MARGIN
    assert auto._rule(None, [10.0], [12.0], floors=[10.0 * margin + 0.01]) == auto.PLAIN
    assert auto._rule(None, [10.0], [12.0], floors=[10.0 * margin - 0.01]) is None
    # 10 Gbit/s in the example: floor 0.43x plain's cost; a lossy call slowed 1.2x by noise
    assert auto._rule(None, [12.8], [15.0], floors=[5.5]) is None


def test_auto_rule_takes_lossy_only_where_the_whole_iteration_is_faster_too():
    """A call's period (its start to the next call's) holds what its exchange cost misses (the
    model's own work slowed beside the codec): lossy needs both measures, plain either."""
    from hvd_lossy import auto
    cheap_exchange = ([2.0, 2.1], [1.0, 1.1])  # plain's costs, lossy's: lossy's exchange wins
    assert auto._rule(None, *cheap_exchange, plain_periods=[10, 10.2],
                      lossy_periods=[9.0, 9.1]) == auto.LOSSY
    assert auto._rule(None, *cheap_exchange, plain_periods=[10, 10.2],
                      lossy_periods=[11.0, 11.5]) == auto.PLAIN  # but the iteration is slower
    assert auto._rule(None, *cheap_exchange, plain_periods=[10, 11],
                      lossy_periods=[10.5, 10.6]) is None  # periods overlap: probe on
    # the noisy period must favour lossy by HYSTERESIS: apart, but by 2%, is no verdict yet...
    assert auto._rule(None, *cheap_exchange, plain_periods=[10, 10.2],
                      lossy_periods=[9.8, 9.8]) is None
    # ...and after MAX_PROBE calls of each, medians 2% apart leave plain
    n = auto.MAX_PROBE
    assert auto._rule(None, [2.0] * n, [1.0] * n, plain_periods=[10.0] * n,
                      lossy_periods=[9.8] * n) == auto.PLAIN
    assert auto._rule(None, [2.0] * n, [1.0] * n, plain_periods=[10.0] * n,
                      lossy_periods=[9.0] * n) == auto.LOSSY
    assert auto._rule(None, [1.0, 1.1], [2.0, 2.1], plain_periods=[10, 10.2],
                      lossy_periods=[9.0, 9.1]) == auto.PLAIN  # either saying plain decides
    # decided: lossy is kept until either measure finds plain HYSTERESIS better; plain until both
    # find lossy better
    assert auto._rule(auto.LOSSY, [1.0], [0.5], plain_periods=[9.0], lossy_periods=[10.0]) == auto.PLAIN
    assert auto._rule(auto.PLAIN, [1.0], [0.5], plain_periods=[9.8], lossy_periods=[10.0]) == auto.PLAIN
    assert auto._rule(auto.PLAIN, [1.0], [0.5], plain_periods=[10.0], lossy_periods=[9.0]) == auto.LOSSY


def test_auto_rule_takes_lossy_early_on_three_calls_of_each_by_the_shortest_periods():
    """One slow lossy period (the first after the warm-up often is) holds back a rule on every
    period; on three calls of each, lossy's shortest period HYSTERESIS below plain's shortest
    and every lossy cost below every plain one decide lossy while probing."""
    from hvd_lossy import auto
    costs = dict(plain=[2.0, 2.1, 2.05], lossy=[1.0, 1.1, 1.05])
    assert auto._rule(None, **costs, plain_periods=[10.0, 10.2, 10.1],
                      lossy_periods=[13.0, 9.4, 9.3]) == auto.LOSSY
    assert auto._rule(None, **costs, plain_periods=[10.0, 10.2, 10.1],
                      lossy_periods=[13.0, 9.8, 9.7]) is None  # shortest only 3% below
    assert auto._rule(None, plain=[2.0, 2.1], lossy=[1.0, 1.1], plain_periods=[10.0, 10.2],
                      lossy_periods=[13.0, 9.0]) is None  # two calls each: too few
    assert auto._rule(None, plain=[2.0, 0.9, 1.4], lossy=[1.0, 1.1, 1.05],  # costs not apart
                      plain_periods=[10.0, 10.2, 10.1], lossy_periods=[13.0, 9.0, 9.1]) is None
    # not once decided: a decision is checked by the medians
    assert auto._rule(auto.PLAIN, **costs, plain_periods=[10.0, 10.2, 10.1],
                      lossy_periods=[13.0, 9.4, 9.9]) == auto.PLAIN


def test_auto_rule_takes_lossy_from_one_call_each_in_a_clear_case():
    """Every lossy cost under CLEAR times every plain one, and every lossy period HYSTERESIS
    below every plain one: a gap no call's noise closes decides lossy at the first look."""
    from hvd_lossy import auto
    # 1 Gbit/s in the DLRM example (ms): cost 9.4 against 100, period 54 against 150
    assert auto._rule(None, [100.0], [9.4], plain_periods=[150.0],
                      lossy_periods=[54.0]) == auto.LOSSY
    assert auto._rule(None, [100.0], [9.4], plain_periods=[150.0],
                      lossy_periods=[146.0]) is None  # the iteration not clearly shorter
    # 10 Gbit/s: lossy at 0.55x plain's cost is no clear case on one call each
    assert auto._rule(None, [12.8], [7.0], plain_periods=[60.0], lossy_periods=[48.0]) is None
    assert auto._rule(None, [100.0], [9.4]) is None  # no periods: one call each says nothing
    assert auto._rule(None, [100.0], [9.4], floors=[99.0], plain_periods=[150.0],
                      lossy_periods=[54.0]) == auto.PLAIN  # the floor's plain still decides
    assert auto._rule(auto.PLAIN, [100.0], [9.4], plain_periods=[150.0],
                      lossy_periods=[54.0]) == auto.LOSSY  # decided: the medians, as before


def test_auto_runs_plain_twice_after_the_warm_up_in_a_clear_case_for_lossy():
    """On a slow link (a plain call 10x a lossy one) the first look decides lossy, so a short
    run pays for its warm-up's plain call and the first look's alone."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    modes = _drive(s, {auto.LOSSY: 0.01, auto.PLAIN: 0.1}.get, 30)
    assert s.decision == auto.LOSSY
    assert modes.count(auto.PLAIN) == 2, modes


def test_auto_slot_measures_each_calls_period_and_decides_plain_when_lossy_iterations_are_slower():
    """The DLRM example's case: lossy's exchange costs less than plain's, but its iteration takes
    longer. The slot times each call's period itself and ends on plain within the probe."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    modes = _drive(s, {auto.LOSSY: 1e-3, auto.PLAIN: 2e-3}.get, 30,
                   compute_of={auto.LOSSY: 0.099, auto.PLAIN: 0.088}.get)
    assert s.decision == auto.PLAIN, modes
    assert s.agreed["plain_period_ms"] == pytest.approx(90)
    assert s.agreed["lossy_period_ms"] == pytest.approx(100)
    assert modes[-10:] == [auto.PLAIN] * 10


def test_auto_slot_decides_plain_after_two_calls_of_each_when_one_plain_call_was_slow():
    """A mode's first call is often slow (Horovod sizes its buffers): with lossy clearly dearer
    otherwise, that one plain call must not keep lossy probing until MAX_PROBE."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    plain_calls = []

    def cost_of(mode):
        if mode == auto.PLAIN:
            plain_calls.append(1)
            return 0.030 if len(plain_calls) == 1 else 0.008
        return 0.013

    modes = _drive(s, cost_of, 40)
    assert s.decision == auto.PLAIN, modes
    assert modes.count(auto.LOSSY) < auto.MAX_PROBE, modes  # at the second agreement, not by medians


def test_auto_checks_a_decision_taken_on_slow_early_calls_against_the_current_ones_soon():
    """The example's first plain calls can fall on steps that are still slow: lossy then looks
    cheaper and is decided. The losing mode runs again FIRST_REFRESH calls later and is judged by
    those calls alone, not the probe's, so a 120-step run switches back within ~50 calls
    (before, the probe's costs stood until call 200)."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())

    def cost_of(mode):
        if mode == auto.PLAIN:
            return 0.030 if s.calls <= 10 else 0.006  # slow only while the run warms up
        return 0.009

    modes = _drive(s, cost_of, 120)
    switched = len(modes) - modes[::-1].index(auto.LOSSY)  # the first call after the last lossy one
    assert modes[20] == auto.LOSSY and switched < auto.WARMUP + 2 * auto.MAX_PROBE + auto.FIRST_REFRESH, modes
    assert s.decision == auto.PLAIN and modes[-50:] == [auto.PLAIN] * 50


def test_auto_judges_the_losing_mode_only_by_its_calls_since_the_decision():
    """A run's later phase can slow every call (here 2.4x after the decision). The winner's slower
    calls are not weighed against the loser's probe calls from the faster phase: the decision holds
    until the loser's refresh, whose calls, slowed alike, keep it."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    decided_at = []

    def cost_of(mode):
        if s.decision is not None and not decided_at:
            decided_at.append(s.calls)
        slow = 2.4 if decided_at else 1.0
        return slow * (0.005 if mode == auto.LOSSY else 0.010)

    modes = _drive(s, cost_of, 160)
    assert s.decision == auto.LOSSY
    after = modes[decided_at[0]:]
    # the refreshes' plain calls alone (two at FIRST_REFRESH, two a doubled gap later)
    assert after.count(auto.PLAIN) == 4, after
    runs = [i for i in range(1, len(after)) if after[i] == auto.PLAIN != after[i - 1]]
    assert len(runs) == 2 and all(after[i + 1] == auto.PLAIN for i in runs), after


def test_auto_switches_at_a_refresh_where_the_losing_mode_became_faster():
    """The refresh still follows a link or a load that changes: plain, dearer in the probe,
    cheaper from then on, is taken at the agreement after its refresh calls."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    modes = _drive(s, lambda mode: 0.005 if mode == auto.LOSSY else
                   (0.010 if s.decision is None else 0.002), 120)
    first_lossy_decided = auto.WARMUP + auto.FIRST_LOOK + auto.LAG
    assert s.decision == auto.PLAIN
    switched = len(modes) - modes[::-1].index(auto.LOSSY)
    assert switched <= first_lossy_decided + 2 * auto.PROBE_CALLS + auto.FIRST_REFRESH, modes
    assert modes[-40:] == [auto.PLAIN] * 40


def test_auto_probes_plain_and_lossy_in_an_order_neither_a_trend_nor_a_cadence_favours():
    """A linear trend cancels in every four probed calls, and a step slowed every 2, 4 or 8
    calls (a training's periodic work) falls on both modes alike."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    n = 2 + 32
    modes = _drive(s, lambda mode: math.nan, auto.WARMUP + n)[auto.WARMUP:]  # no cost decides
    assert modes[:2] == [auto.LOSSY, auto.PLAIN]  # the first look
    p, l = auto.PLAIN, auto.LOSSY
    assert modes[2:10] == [l, p, p, l, p, l, l, p]
    probe = modes[2:]
    for start in range(0, len(probe), 4):
        four = probe[start:start + 4]
        assert sum(i for i, m in enumerate(four) if m == l) == 3 and four.count(l) == 2, four
    for every in (2, 4, 8):
        for phase in range(every):
            hit = probe[phase::every]
            assert hit.count(l) == hit.count(p), (every, phase, hit)


def test_auto_takes_each_calls_cheapest_rank_and_leaves_out_unfinished_calls():
    """The rank that arrived last waited only for the bytes: a call's cost is its cheapest
    rank's, so one rank's compute noise (its peers' waiting) does not decide."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    rank0 = _row(20, [1.0, 1.1], [9.0, 9.0], codec=[0.3, 0.2], shares=[0.5, 0.5])  # lossy looks slow
    rank1 = _row(20, [5.0, math.nan], [0.5, 0.6], codec=[0.4, 0.1])  # (it waited)
    s._apply([rank0, rank1], k=10)
    assert s.decision is None  # plain's second call unfinished on rank 1: one call left
    rank1 = _row(20, [5.0, 5.0], [0.5, 0.6], codec=[0.4, 0.1], shares=[0.25, 0.5])
    s._apply([rank0, rank1], k=14)
    assert s.decision == auto.LOSSY
    # floors: the cheapest codec time plus the smallest share of the cheapest plain call (1.0)
    assert s.agreed == {"plain_ms": 1050.0, "lossy_ms": 550.0,
                        "lossy_floor_ms": pytest.approx((0.3 + 0.25 + 0.1 + 0.5) / 2 * 1e3)}
    assert s.next_agreement == 14 + auto.AGREE_EVERY


def test_auto_measures_again_when_any_rank_lacks_costs_for_its_size():
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    assert set(_drive(s, {auto.LOSSY: 1e-3, auto.PLAIN: 5e-3}.get, 12)) == {auto.LOSSY, auto.PLAIN}
    assert s.decision == auto.LOSSY
    s._apply([_row(20, [1.0, 1.0], [0.1, 0.1], codec=[0.0, 0.0]),
              _row(22, [], [])], k=26)  # rank 1's size changed: it has no costs
    assert s.decision is None and s.probe_from == 26 and s.next_agreement == 26 + auto.FIRST_LOOK


@pytest.mark.parametrize("plain_s, lossy_s, want", [(5e-3, 1e-3, "lossy"), (1e-3, 1.5e-3, "plain")],
                         ids=["slow link", "fast link"])
def test_auto_pays_little_for_probing_a_clear_case(plain_s, lossy_s, want):
    """A short run (30 calls) decides within a few calls, and the losing mode runs at most
    three times after the warm-up."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    modes = _drive(s, {auto.LOSSY: lossy_s, auto.PLAIN: plain_s}.get, 30)
    assert s.decision == want
    losing = auto.PLAIN if want == auto.LOSSY else auto.LOSSY
    assert modes[auto.WARMUP:].count(losing) <= 3, modes
    assert modes[-20:] == [want] * 20


def _stats(codec_s, wire, raw):
    from hvd_lossy.stats import CallStats
    return CallStats(op="alltoall", compress_s=codec_s / 2, decompress_s=codec_s / 2,
                     wire_bytes=wire, raw_bytes=raw)


def test_auto_runs_lossy_twice_after_the_warm_up_when_its_floor_leaves_it_no_gain():
    """On a link faster than the codec the first look decides: one probed call of each and the
    call while its agreement travels (lossy), then plain from the call that reads the agreement.
    The floor is the codec time (the gradient call's too) plus the least the compressed bytes
    can take to travel: their share of the plain call's cost (here 0.9 + 0.25 * 1.0 ms, above
    0.95 ms: lossy could not gain HYSTERESIS of plain's 1 ms). The warm-up runs each mode once,
    so neither look is a mode's first call."""
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    modes = []
    for _ in range(30):
        mode, report = s.choose(1 << 20)
        if mode == auto.LOSSY:
            report(3e-3, _stats(0.5e-3, 25, 100))  # the forward call: cost, statistics ...
            s.add_cost(s.calls - 1, 1e-3, _stats(0.4e-3, 40, 100))  # ... and its gradient call's
        else:
            report(1e-3)
        modes.append(mode)
    assert modes[:auto.WARMUP] == [auto.LOSSY, auto.PLAIN]  # each mode's first call
    assert modes[auto.WARMUP:].count(auto.LOSSY) == 2, modes
    first_plain_for_good = auto.WARMUP + auto.FIRST_LOOK + auto.LAG
    assert modes[first_plain_for_good:] == [auto.PLAIN] * (30 - first_plain_for_good), modes
    assert s.decision == auto.PLAIN and s.agreed["lossy_floor_ms"] == pytest.approx(1.15)


def test_auto_hands_a_lossy_calls_statistics_to_its_slot():
    from hvd_lossy import auto
    got = []
    record = _stats(0.75, 10, 40)
    lossy = types.SimpleNamespace(wait=lambda: "out", record=record)
    assert auto._Timed(lossy, 1.0, lambda s, rec: got.append(rec)).wait() == "out"
    plain = types.SimpleNamespace(wait=lambda: "out")  # Horovod's own handle: no statistics
    auto._Timed(plain, 1.0, lambda s, rec: got.append(rec)).wait()
    assert got == [record, None]
    s = auto._Slot(0, "c", _OneRank())
    for _ in range(auto.WARMUP + 1):  # the first look's lossy call
        mode, report = s.choose(1 << 20)
    assert mode == auto.LOSSY
    report(2.0, record)
    k = s.calls - 1
    assert (s.costs[k], s.floors[k], s.shares[k]) == (2.0, 0.75, 0.25)
    s.add_cost(k, 1.0, None)  # a gradient call without statistics: the floor is unknown
    assert s.costs[k] == 3.0 and math.isnan(s.floors[k])


def test_auto_decides_a_close_case_within_its_probe_limit():
    from hvd_lossy import auto
    s = auto._Slot(0, "c", _OneRank())
    noisy = itertools.cycle([1.0, 1.3, 0.8, 1.2])
    _drive(s, lambda mode: next(noisy) * (1e-3 if mode == auto.LOSSY else 1.02e-3),
           auto.WARMUP + 2 * auto.MAX_PROBE + auto.PROBE_CALLS + auto.LAG)
    assert s.decision in (auto.LOSSY, auto.PLAIN)


def test_auto_gradient_compressor_follows_the_forward_calls_mode_and_adds_its_cost():
    """The autograd alltoall's gradient compressor takes the mode of the forward compressor's
    latest call (auto.pair), so every probed iteration is all-lossy or all-plain, and its cost
    counts for that forward call."""
    from hvd_lossy import auto
    from hvd_lossy.compression import Compression
    fwd = Compression.lossy(0.03, backward=0.02, auto=True)
    bwd = auto.pair(fwd, fwd.for_backward())
    assert bwd is not fwd and bwd.auto
    lead, follow = auto.slot(fwd, _FakeSet()), auto.slot(bwd, _FakeSet())
    for _ in range(auto.WARMUP):  # forward calls without a backward one (evaluation): the counts part
        lead.choose(1000)
    pairs = []
    for _ in range(auto.FIRST_LOOK):  # the calls before the first agreement
        (f, report_f), (g, report_g) = lead.choose(1000), follow.choose(1000)
        report_f(1.0)
        report_g(0.5)
        pairs.append((f, g))
    assert all(f == g for f, g in pairs), pairs
    assert {f for f, _g in pairs} == {auto.LOSSY, auto.PLAIN}  # the probe alternates both
    assert [lead.costs[k] for k in sorted(lead.costs)] == [1.5] * auto.FIRST_LOOK
    report = follow.report()
    assert report["follows"] == lead.label and report["lossy_calls"] + report["plain_calls"] == auto.FIRST_LOOK
    same = Compression.lossy(0.03, backward="same", dither=False, auto=True)
    assert auto.pair(same, same.for_backward()) is same  # one compressor, one slot


@pytest.mark.parametrize("bad", ["0.03", True, torch.tensor(0.03), None],
                         ids=["str", "bool", "tensor", "None"])
def test_every_error_bound_entry_point_applies_one_rule(bad):
    """compress, compress_chunks, Compression.lossy and the adaptive controller's base refuse
    the same values with the same TypeError, naming the setting (before: the codec took "0.03"
    and True)."""
    import hvd_lossy
    from hvd_lossy.adaptive import Controller
    from hvd_lossy.compression import Compression
    x = torch.rand(4, 8)
    entry_points = {
        "compress": lambda: hvd_lossy.compress(x, bad),
        "compress_chunks": lambda: hvd_lossy.compress_chunks(x, [4], bad),
        "compress_chunks list": lambda: hvd_lossy.compress_chunks(x, [4], [bad]),
        "Compression.lossy": lambda: Compression.lossy(bad),
    }
    messages = set()
    for what, call in entry_points.items():
        with pytest.raises(TypeError) as info:
            call()
        messages.add(str(info.value))
    assert messages == {f"error_bound must be a number, got {bad!r}"}
    with pytest.raises(TypeError) as info:
        Controller({"t": 4}, base=bad, comm="local")
    assert str(info.value) == f"base must be a number, got {bad!r}"


@pytest.mark.parametrize("value,expected", [(0, 0.0), (0.03, 0.03), (3, 3.0)])
def test_error_bound_rule_accepts_real_numbers_as_floats(value, expected):
    import numpy as np

    import hvd_lossy
    assert hvd_lossy.check_error_bound(value) == expected
    assert hvd_lossy.check_error_bound(np.float32(value)) == pytest.approx(expected)
    assert hvd_lossy.compress(torch.rand(4, 8), np.float64(value)).dtype == torch.uint8


@pytest.mark.parametrize("size,frames", [(8, 208), (3, 7), (1, 1)])
def test_dither_seeds_never_repeat_within_the_period_the_docstring_states(size, frames):
    """Every rank's seed ranges of successive calls are disjoint from each other and from every
    other rank's, for 2^24 // size // frames calls (8 ranks x 208 frames: 10,082 calls; the old
    scheme repeated after about 1,800); then the rank's block starts over."""
    import hvd_lossy
    from hvd_lossy.compressor import dither_seed_range
    block = hvd_lossy.DITHER_SEEDS // size
    calls = min(block // frames, 20000)
    ranges = []
    for rank in range(size):
        used = 0
        for _ in range(calls):
            seed, used = dither_seed_range(used, rank, size, frames)
            ranges.append((seed, seed + frames))
    ranges.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    assert ranges[0][0] >= 0 and ranges[-1][1] <= hvd_lossy.DITHER_SEEDS
    if calls == block // frames:  # the next call starts the block over
        assert dither_seed_range(used, size - 1, size, frames)[0] == (size - 1) * block


@pytest.mark.mpi
def test_resident_memory_stays_flat_over_lossy_alltoalls_after_warm_up():
    """tests/mp/memory_flat.py: RSS grows by at most 5 MiB over 600 calls (sync, async,
    autograd, dither, both levels) after 200 warm-up calls; the benchmark number over 10^4
    calls is in benchmarks/RESULTS.md."""
    output = run_mpi("tests/mp/memory_flat.py", np=2, args=[600, 200], timeout=150)
    # the ranks' lines may run together in the launcher's output
    assert sorted(re.findall(r"rank (\d): RSS growth -?\d+ bytes over 600 calls", output)) \
        == ["0", "1"], output


def test_a_local_error_names_its_values_as_the_message_every_rank_raises_does():
    """The exception a rank chains under its RankError reads like the RankError's own text."""
    from hvd_lossy.protocol import _LocalError
    assert str(_LocalError(3, 10, 12)) == "splits sum to 10 but the tensor has 12 rows in dim 0"
    assert str(_LocalError(16, 2, 1)).startswith("the reuse cache of rank 1 for rank 2 is not")
    assert str(_LocalError(9, detail="ids must be int64")) == "ids must be int64"
