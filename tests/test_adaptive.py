"""Specification of hvd_lossy.adaptive: schedules, policies, the controller and its compressor.

Unit tests run in one process; tests marked ``mpi`` launch tests/mp/adaptive_*.py under mpirun and
horovodrun --gloo.
"""
import json
import math

import numpy as np
import pytest
import torch

import hvd_lossy
from hvd_lossy.adaptive import (AdaptiveCompressor, Controller, TableSpec, TableStats,
                                make_policy, multiplier, plot_telemetry, read_telemetry)
from hvd_lossy.adaptive.policies import BudgetPolicy, PaperPolicy, SensitivityPolicy
from hvd_lossy.adaptive.stats import empty_rows

E = 1000


class OtherRank:
    """Pretends to be one rank of ``size`` whose peers hold the same configuration and have
    observed nothing."""

    name = "fake"

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def allgather_array(self, array):
        rows = [empty_rows(array.shape[0]) for _ in range(self.size)]
        rows[self.rank] = np.asarray(array)
        return np.stack(rows)

    def allgather_object(self, obj):
        return [obj] * self.size


def paper_formula(it, E):
    return 2 * max(1 - math.floor(10 * it / E) * 0.05, 0.5) if it < E else 1.0


# ----- schedules ---------------------------------------------------------------------------------

def test_step_schedule_is_two_at_start_one_at_E():
    assert multiplier("step", 0, E) == 2.0
    assert multiplier("step", E, E) == 1.0
    assert multiplier("step", 10 * E, E) == 1.0


@pytest.mark.parametrize("k", range(10))
def test_step_schedule_drops_by_a_tenth_every_E_over_10(k):
    it = E // 10 * k
    assert multiplier("step", it, E) == pytest.approx(2.0 - 0.1 * k, abs=1e-12)
    assert multiplier("step", it + E // 10 - 1, E) == pytest.approx(2.0 - 0.1 * k, abs=1e-12)


@pytest.mark.parametrize("it", [0, 1, 6553, 6554, 13107, 32768, 58982, 58983, 65535, 65536, 10**6])
def test_step_schedule_matches_the_paper_formula_at_default_E(it):
    assert multiplier("step", it) == pytest.approx(paper_formula(it, 65536), abs=1e-12)
    assert multiplier("step", 6554) == pytest.approx(1.9)  # first iteration past E/10


def test_linear_schedule_goes_from_two_to_one():
    assert multiplier("linear", 0, E) == 2.0
    assert multiplier("linear", E // 2, E) == pytest.approx(1.5)
    assert multiplier("linear", E // 10, E) == pytest.approx(1.9)
    assert multiplier("linear", E, E) == 1.0


def test_log_schedule_falls_from_two_to_one_faster_than_linear():
    values = [multiplier("log", it, E) for it in range(0, E + 1, 50)]
    assert values[0] == 2.0 and values[-1] == 1.0
    assert all(a > b for a, b in zip(values, values[1:-1]))
    assert multiplier("log", E // 10, E) < multiplier("linear", E // 10, E)
    assert multiplier("log", E - 1, E) > 1.0


def test_constant_schedule_is_one():
    assert {multiplier("constant", it, E) for it in (0, 1, E // 2, E, 5 * E)} == {1.0}


@pytest.mark.parametrize("schedule,it,E_,match", [
    ("cosine", 0, E, "schedule must be one of"), ("step", 0, 0, "E .* positive integer"),
    ("step", 0, -5, "positive integer"), ("step", 0, 10.5, "positive integer"),
    ("step", -1, E, "iteration must be"),
])
def test_bad_schedule_arguments_raise(schedule, it, E_, match):
    with pytest.raises(ValueError, match=match):
        multiplier(schedule, it, E_)


# ----- policies on crafted statistics ------------------------------------------------------------

def stats(name, cardinality, **kw):
    return TableStats(name=name, cardinality=cardinality, owner=0, **kw)


SIX = [stats("t1", 10), stats("t2", 10**6), stats("t3", 500), stats("t4", 10**4),
       stats("t5", 3), stats("t6", 10**7)]


def test_paper_policy_tightens_the_largest_third_and_loosens_the_smallest():
    bounds = make_policy("paper").table_bounds(SIX, 0.03, "rel")
    assert bounds == pytest.approx({"t6": 0.01, "t2": 0.01, "t4": 0.03, "t3": 0.03,
                                    "t1": 0.05, "t5": 0.05})


def test_paper_policy_classes_scale_with_base_and_can_be_set():
    assert make_policy("paper").table_bounds(SIX, 0.06, "rel")["t6"] == pytest.approx(0.02)
    p = make_policy({"name": "paper", "tighten": 0.005, "loosen": 0.1})
    b = p.table_bounds(SIX, 0.03, "rel")
    assert (b["t6"], b["t4"], b["t5"]) == (0.005, 0.03, 0.1)


def test_paper_policy_pin_overrides_the_automatic_class():
    p = PaperPolicy(pin={"t6": "loosen", "t5": "base"})
    assert p.classes(SIX)["t6"] == "loosen" and p.classes(SIX)["t5"] == "base"
    assert p.classes(SIX)["t2"] == "tighten"


def test_paper_policy_by_unique_ranks_on_observed_unique_fraction():
    crafted = [stats("a", 10, rows=100, unique_fraction=0.9),
               stats("b", 10**6, rows=100, unique_fraction=0.1),
               stats("c", 1000, rows=100, unique_fraction=0.5)]
    classes = PaperPolicy(by="unique").classes(crafted)
    assert classes == {"a": "tighten", "c": "base", "b": "loosen"}
    assert PaperPolicy().classes(crafted) == {"b": "tighten", "c": "base", "a": "loosen"}


def test_policy_config_may_be_a_json_string():
    p = make_policy('{"name": "budget", "target_ratio": 9, "shape": "uniform"}')
    assert p == BudgetPolicy(target_ratio=9.0, shape="uniform")


def test_paper_policy_with_one_table_uses_base():
    assert make_policy("paper").table_bounds([stats("x", 5)], 0.03, "rel") == {"x": 0.03}


def sens(name, grad, lo, hi, enc=1000.0):
    return stats(name, 100, values=enc, min=lo, max=hi, grad=grad, raw_bytes=4 * enc,
                 frame_bytes=enc / 2, enc_values=enc, log2_bound=math.log2(0.03))


def test_sensitivity_policy_bounds_are_inverse_to_sensitivity_with_base_geometric_mean():
    crafted = [sens("a", 0.1, 0, 1), sens("b", 0.1, 0, 2), sens("c", 0.05, 0, 1)]
    b = SensitivityPolicy(spread=100).table_bounds(crafted, 0.03, "rel")
    # c = grad x range: a 0.1, b 0.2, c 0.05
    assert b["a"] / b["b"] == pytest.approx(2.0)
    assert b["c"] / b["a"] == pytest.approx(2.0)
    assert (b["a"] * b["b"] * b["c"]) ** (1 / 3) == pytest.approx(0.03)


def test_sensitivity_policy_weights_the_mean_by_encoded_elements_and_clamps():
    crafted = [sens("a", 1.0, 0, 1, enc=3000.0), sens("b", 1e-6, 0, 1, enc=1000.0)]
    b = SensitivityPolicy(spread=4).table_bounds(crafted, 0.03, "rel")
    assert b["b"] == pytest.approx(0.12)  # clamped at base x spread
    assert (b["a"] ** 3 * b["b"]) ** 0.25 == pytest.approx(0.03)


def test_sensitivity_policy_ignores_range_in_abs_mode_and_keeps_unobserved_tables_at_base():
    crafted = [sens("a", 0.1, 0, 1), sens("b", 0.1, 0, 100), stats("c", 7)]
    b = SensitivityPolicy().table_bounds(crafted, 0.03, "abs")
    assert b["a"] == pytest.approx(b["b"]) == pytest.approx(0.03)
    assert b["c"] == 0.03


def framed(name, bits, eb, enc=10000.0, grad=0.1):
    return stats(name, 100, values=enc, min=0.0, max=1.0, grad=grad, raw_bytes=4 * enc,
                 frame_bytes=enc * bits / 8, enc_values=enc, log2_bound=math.log2(eb))


def predicted_ratio(crafted, bounds):
    raw = sum(s.raw_bytes for s in crafted)
    frame = sum(s.enc_values / 8 * max(1.0, s.bits_per_value + s.log2_bound
                                       - math.log2(bounds[s.name])) for s in crafted)
    return raw / frame


def test_budget_policy_meets_the_target_ratio_under_its_rate_model():
    crafted = [framed("a", 4.0, 0.03), framed("b", 6.0, 0.03, grad=1.0), framed("c", 3.0, 0.06)]
    for shape in ("uniform", "sensitivity"):
        b = BudgetPolicy(target_ratio=8.0, shape=shape).table_bounds(crafted, 0.03, "rel")
        assert predicted_ratio(crafted, b) == pytest.approx(8.0, rel=1e-6)
    uniform = BudgetPolicy(target_ratio=8.0, shape="uniform").table_bounds(crafted, 0.03, "rel")
    assert len(set(uniform.values())) == 1


def test_budget_policy_without_target_spends_what_one_global_base_bound_would():
    crafted = [framed("a", 4.0, 0.03), framed("b", 6.0, 0.03, grad=1.0), framed("c", 3.0, 0.06)]
    b = BudgetPolicy().table_bounds(crafted, 0.03, "rel")
    glob = {s.name: 0.03 for s in crafted}
    assert predicted_ratio(crafted, b) == pytest.approx(predicted_ratio(crafted, glob), rel=1e-6)
    assert b["b"] < b["a"]  # the sensitive table gets the tighter bound


def test_budget_policy_damps_towards_the_previous_bounds():
    crafted = [framed("a", 4.0, 0.03)]
    free = BudgetPolicy(target_ratio=16.0, damping=0.0).table_bounds(crafted, 0.03, "rel")["a"]
    damped = BudgetPolicy(target_ratio=16.0).table_bounds(crafted, 0.03, "rel", {"a": 0.03})
    assert damped["a"] == pytest.approx(math.sqrt(free * 0.03))


@pytest.mark.parametrize("spec,match", [
    ("nope", "policy must be one of"), ({"name": "paper", "pin": {"x": "tightest"}}, "pin"),
    ({"name": "sensitivity", "spread": 0.5}, "spread"), ({"name": "budget", "target_ratio": -1},
                                                        "target_ratio"),
    ({"name": "paper", "colour": 1}, "bad parameters"),
])
def test_bad_policy_config_raises(spec, match):
    with pytest.raises(ValueError, match=match):
        make_policy(spec)


# ----- the controller in one process -------------------------------------------------------------

TABLES = {"small": 10, "mid": 1000, "big": 10**6}


def test_bounds_are_table_bound_times_multiplier():
    c = Controller(TABLES, policy="paper", schedule="step", E=100, interval=5, comm="local")
    assert c.table_bound("big") == pytest.approx(0.01)
    assert c.bounds() == pytest.approx({"small": 0.1, "mid": 0.06, "big": 0.02})
    for _ in range(10):
        c.step()
    assert c.iteration == 10 and c.multiplier == pytest.approx(1.9)
    assert c.bound("mid") == pytest.approx(0.03 * 1.9)
    assert list(c.bounds()) == ["small", "mid", "big"]


def test_eval_mode_is_lossless_or_base_and_does_not_advance():
    c = Controller(TABLES, eval_bound="none", interval=1, comm="local").eval()
    c.step()
    assert c.iteration == 0 and set(c.bounds().values()) == {0.0}
    c.observe_lookups("mid", torch.ones(4, 2))
    assert c.train().exchange()[1].values == 0  # nothing recorded in eval mode
    b = Controller(TABLES, eval_bound="base", comm="local").eval()
    assert set(b.bounds().values()) == {0.03}


def test_exchange_happens_every_interval_and_merges_observations():
    c = Controller(TABLES, policy="sensitivity", interval=3, comm="local")
    c.observe_lookups("mid", torch.tensor([[1.0, 2.0], [1.0, 2.0], [5.0, -1.0]]))
    c.observe_gradients("mid", torch.tensor([[-0.5, 0.5]]))
    c.step(), c.step()
    assert c.stats()[1].values == 0  # not exchanged yet
    c.step()
    mid = c.stats()[1]
    assert (mid.values, mid.min, mid.max, mid.mean) == (6, -1.0, 5.0, pytest.approx(10 / 6))
    assert mid.unique_fraction == pytest.approx(2 / 3) and mid.grad == 0.5


def test_observations_are_sampled_every_sample_every_iterations():
    c = Controller(TABLES, interval=40, comm="local")
    assert c.get_config()["sample_every"] == 4
    seen = []
    for _ in range(40):
        seen.append(c.observe_lookups("mid", torch.ones(2, 2)) is not None)
        c.step()
    assert seen == [it % 4 == 0 for it in range(40)]
    assert c.stats()[1].rows == 2 * 10


def test_owners_default_round_robin_and_tables_of_lists_them_in_order():
    c = Controller({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, comm=OtherRank(0, 2))
    assert c.tables_of(0) == ["a", "c", "e"] and c.tables_of(1) == ["b", "d"]
    c = Controller([TableSpec("a", 5, 1), {"name": "b", "cardinality": 2, "owner": 1}],
                   comm=OtherRank(1, 2))
    assert c.tables_of(0) == [] and c.tables_of(1) == ["a", "b"]


def test_config_round_trips_through_repr_dict_and_json(tmp_path):
    c = Controller(TABLES, policy={"name": "budget", "target_ratio": 9.0}, schedule="log", E=500,
                   base=0.02, interval=7, mode="abs", eval_bound="table", grad_base=0.05,
                   sample_every=2, comm="local")
    assert eval(repr(c)).get_config() == c.get_config()
    assert Controller.from_config(c.get_config(), comm="local").get_config() == c.get_config()
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(c.get_config()))
    assert Controller.from_json(str(path), comm="local").get_config() == c.get_config()
    assert Controller.from_json({"tables": {"x": 3}, "policy": "uniform"}, comm="local").bounds() \
        == {"x": 0.06}


@pytest.mark.parametrize("kwargs,match", [
    (dict(base=0), "base must be a finite number > 0"), (dict(base=-0.01), "base"),
    (dict(E=0), "E .* positive integer"), (dict(schedule="cos"), "schedule must be one of"),
    (dict(policy="magic"), "policy must be one of"), (dict(interval=0), "interval"),
    (dict(mode="relative"), "mode must be one of"), (dict(eval_bound="off"), "eval_bound"),
    (dict(tables={"a": 0}), "cardinality of table 'a'"), (dict(tables={}), "at least one"),
    (dict(tables={"a": (3, 2)}), "owner of table 'a' must be a rank < 1"),
    (dict(policy={"name": "paper", "pin": {"ghost": "base"}}), "unknown tables \\['ghost'\\]"),
])
def test_bad_configuration_raises_value_error(kwargs, match):
    args = dict(tables=TABLES, comm="local")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Controller(**args)


def test_unknown_table_in_calls_raises():
    c = Controller(TABLES, comm="local")
    for call in (lambda: c.observe_lookups("ghost", torch.ones(1, 1)),
                 lambda: c.record_frame("ghost", 10, 5), lambda: c.table_bound("ghost")):
        with pytest.raises(ValueError, match="unknown table 'ghost'"):
            call()


def test_telemetry_lines_and_plot(tmp_path):
    path = tmp_path / "t.jsonl"
    c = Controller(TABLES, policy="sensitivity", interval=2, telemetry=str(path), comm="local")
    for it in range(6):
        for i, name in enumerate(TABLES):
            c.observe_lookups(name, torch.randn(32, 8) * (i + 1))
            c.observe_gradients(name, torch.randn(32, 8))
            c.record_frame(name, 1024, 128 * (i + 1))
        c.step()
    records = read_telemetry(path)
    assert [r["iteration"] for r in records] == [2, 4, 6]
    assert records[-1]["tables"]["mid"]["ratio"] == pytest.approx(4.0)
    assert records[-1]["tables"]["big"]["bound"] == pytest.approx(c.bound("big"))
    png = plot_telemetry(path, tmp_path / "t.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_summary_reports_bound_ratio_and_bytes_per_table():
    c = Controller(TABLES, interval=1, comm="local")
    c.record_frame("small", 4000, 1000)
    c.record_frame("small", 4000, 1000, direction="backward")
    c.step()
    c.record_frame("small", 4000, 500)
    c.step()
    s = c.summary()
    assert s["tables"]["small"]["ratio"] == pytest.approx(8000 / 1500)
    assert s["tables"]["small"]["class"] == "loosen"
    assert s["tables"]["small"]["bwd_ratio"] == 4.0 and s["tables"]["mid"]["ratio"] is None
    assert s["raw_bytes"] == 8000 and s["frame_bytes"] == 1500
    json.dumps(s)


# ----- the compressor in one process -------------------------------------------------------------

def two_rank_controller(rank=0, **kw):
    tables = [TableSpec("a", 10**6, 0), TableSpec("b", 50, 0), TableSpec("c", 1000, 1)]
    return Controller(tables, policy="paper", comm=OtherRank(rank, 2), **kw)


def test_plan_gives_one_frame_per_destination_and_table_with_its_bound():
    c = two_rank_controller()
    comp = AdaptiveCompressor(c, c.tables_of(0))
    plan = comp.plan([6, 4])
    b = c.bounds()
    assert plan == [(0, 3, b["a"]), (0, 3, b["b"]), (1, 2, b["a"]), (1, 2, b["b"])]
    assert b["a"] != b["b"]


def coded_row(lo, hi, unique):
    """A row of codec_stats as compress_grouped writes it: range and distinct rows, no moments."""
    row = np.full(hvd_lossy.STATS_PER_PIECE, math.nan)
    row[[hvd_lossy.STAT_MIN, hvd_lossy.STAT_MAX, hvd_lossy.STAT_UNIQUE]] = lo, hi, unique
    return row


def test_forward_observations_read_the_codecs_range_and_distinct_rows_where_it_coded():
    """The frames sent away are observed through what the codec reported while coding them
    (codec_stats), the chunk a rank keeps (None) through hvd_lossy.piece_stats, the codec's own
    passes; the moments (mean, spread) come from the kept chunk only."""
    c = two_rank_controller(E=10)
    comp = AdaptiveCompressor(c, c.tables_of(0))
    assert comp.wants_codec_stats() and not comp.for_backward().wants_codec_stats()
    # Rows that agree in their first columns: one distinct row to a 4-column hash, 4 to the codec.
    x = torch.randn(1, 16).repeat(12, 1)
    x[:, 8] = torch.arange(12.0) % 4
    plan = comp.plan([6, 6])
    sizes = [None, None, 100, 100]
    coded = [None, None, coded_row(-7.0, 9.0, 4.0), coded_row(-1.0, 1.0, 2.0)]
    comp.after_compress(plan, sizes, x, codec_stats=coded)
    c.exchange()
    a, b = (next(s for s in c.stats() if s.name == n) for n in ("a", "b"))
    own = x[:3]
    assert a.min == -7.0 and a.max == 9.0  # the codec's range, wider than the own rows'
    # distinct rows as the codec counts them: all 3 own rows (a 4-column hash would say 1) + 4
    assert a.unique_fraction == (3 + 4) / 6
    assert b.min == min(-1.0, x[3:6].min().item())
    assert a.mean == pytest.approx(own.double().mean().item())  # moments of the own rows only


def test_codec_stats_without_a_finite_range_fall_back_to_the_rows():
    c = two_rank_controller(E=10)
    comp = AdaptiveCompressor(c, c.tables_of(0))
    x = torch.randn(8, 4)
    plan = comp.plan([4, 4])
    nan = float("nan")
    comp.after_compress(plan, [None, None, 50, 50], x,
                        codec_stats=[None, None, coded_row(nan, nan, 2.0),
                                     coded_row(0.0, 1.0, nan)])
    c.exchange()
    a = next(s for s in c.stats() if s.name == "a")
    assert a.min == min(x[0:2].min().item(), x[4:6].min().item())
    assert a.mean == pytest.approx(torch.cat([x[0:2], x[4:6]]).double().mean().item())


def test_frames_carry_each_tables_bound_and_respect_it():
    c = two_rank_controller(E=10)
    comp = AdaptiveCompressor(c, c.tables_of(0))
    x = torch.cat([torch.randn(8, 16), torch.rand(8, 16) * 100, torch.randn(4, 16),
                   torch.rand(4, 16) * 100])
    plan = comp.plan([16, 8])
    frame, sizes = _one_frame(x, plan)
    comp.after_compress(plan, sizes, x)
    decoded = hvd_lossy.decompress(frame).double()
    offset = 0
    for (_dest, rows, eb), segment in zip(plan, hvd_lossy.frame_info(frame)["segments"]):
        piece = x[offset:offset + rows].double()
        err = (decoded[offset:offset + rows] - piece).abs().max().item()
        offset += rows
        asked = eb * (piece.max() - piece.min()).item()
        # the table's bound, rounded down as the frame stores it (24 bits)
        assert asked * (1 - 2 ** -12) <= segment["eb_abs"] <= asked
        assert err <= segment["eb_abs"]
    c.exchange()
    a = c.stats()[0]
    assert a.raw_bytes == 12 * 16 * 4 and a.frame_bytes == sizes[0] + sizes[2]
    assert a.values == 12 * 16  # the compressor observed the lookups it sent


def _one_frame(x, plan):
    """The plan's pieces of x as the alltoall codes a destination's: one format-2 frame, and
    each piece's share of its bytes."""
    rows, bounds = [p[1] for p in plan], [p[2] for p in plan]
    out = torch.empty(hvd_lossy.max_grouped_bytes(rows, list(x.shape[1:]), [len(plan)], 0), dtype=torch.uint8)
    sizes = hvd_lossy.compress_grouped(x, rows, bounds, [len(plan)], 0, out)
    return out[:sum(sizes)], sizes


def test_backward_compressor_lays_out_each_owners_tables():
    c = two_rank_controller(rank=1, grad_base=0.06)
    fwd = AdaptiveCompressor(c, c.tables_of(1), backward="table")
    bwd = fwd.for_backward()
    assert bwd.tables == [["a", "b"], ["c"]] and bwd.direction == "backward"
    plan = bwd.plan([4, 3])
    g = c.grad_bounds()
    assert plan == [(0, 2, g["a"]), (0, 2, g["b"]), (1, 3, g["c"])]
    assert g["c"] == pytest.approx(2 * c.bound("c"))
    assert AdaptiveCompressor(c, ["c"], backward=0.01).for_backward().plan([2, 1])[0][2] == 0.01
    from hvd_lossy.compression import Compression, NoneCompressor
    assert AdaptiveCompressor(c, ["c"], backward=None).for_backward() is NoneCompressor
    assert AdaptiveCompressor(c, ["c"], backward="fp16").for_backward() is Compression.fp16
    fixed = Compression.lossy(0.02)
    assert AdaptiveCompressor(c, ["c"], backward=fixed).for_backward() is fixed
    with pytest.raises(ValueError, match="backward must be a finite number >= 0, got -1.0"):
        AdaptiveCompressor(c, ["c"], backward=-1.0)
    with pytest.raises(TypeError, match="bound must be a number, got 'tables'"):
        AdaptiveCompressor(c, ["c"], bound="tables")


def test_dither_backward_makes_the_gradient_compressor_dither():
    c = two_rank_controller(rank=1, grad_base=0.06)
    fwd = AdaptiveCompressor(c, c.tables_of(1), backward="table", dither="backward")
    assert fwd.next_dither_seed(1, 2) is None
    bwd = fwd.for_backward()
    assert bwd.dither is True and bwd.next_dither_seed(1, 2) is not None
    assert AdaptiveCompressor(c, ["c"], backward=0.01, dither=True).for_backward().dither is True
    assert AdaptiveCompressor(c, ["c"]).for_backward().dither is False
    assert "dither='backward'" in repr(fwd) and fwd.get_config()["dither"] == "backward"
    with pytest.raises(ValueError, match="dither must be"):
        AdaptiveCompressor(c, ["c"], dither="yes")


def test_uneven_chunk_or_unknown_table_raises():
    c = two_rank_controller()
    with pytest.raises(ValueError, match="5 rows, not divisible into equal parts for its 2"):
        AdaptiveCompressor(c, ["a", "b"]).plan([4, 5])
    with pytest.raises(ValueError, match="unknown table 'zz'"):
        AdaptiveCompressor(c, ["a", "zz"])
    with pytest.raises(ValueError, match="one per rank"):
        AdaptiveCompressor(c, [["a"], ["b"], ["c"]])


def test_eval_mode_frames_are_lossless():
    c = two_rank_controller().eval()
    plan = AdaptiveCompressor(c, ["a", "b"]).plan([2, 2])
    assert {p[2] for p in plan} == {0.0}


def test_compressor_config_round_trips():
    c = Controller(TABLES, comm="local")
    from hvd_lossy.compression import Compression
    for backward in (0.02, "table", None, "fp16", Compression.lossy(0.01, backward=None)):
        comp = AdaptiveCompressor(c, ["small", "big"], backward=backward, level=2)
        again = AdaptiveCompressor.from_config(comp.get_config(), comm="local")
        assert again == comp and again.controller.get_config() == c.get_config()
        json.dumps(comp.get_config())


def test_adaptive_defaults_are_the_measured_recipe_dithered_gradients_at_0_02():
    from hvd_lossy.compression import Compression
    comp = Compression.adaptive(Controller(TABLES, comm="local", base=0.03), ["small"])
    assert (comp.backward, comp.dither) == (0.02, "backward")
    assert comp.for_backward().dither is True
    assert Compression.adaptive(Controller(TABLES, comm="local", base=0.01), ["small"]).backward == 0.01
    abs_ctl = Controller(TABLES, comm="local", mode="abs")
    assert Compression.adaptive(abs_ctl, ["small"]).backward == "table"
    old = Compression.adaptive(Controller(TABLES, comm="local"), ["small"], backward="table",
                               dither=False)
    assert (old.backward, old.dither) == ("table", False)


# ----- several processes -------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_ranks_agree_on_bounds_and_bad_configs_raise_everywhere(launcher, tmp_path):
    """tests/mp/adaptive_controller.py: identical bounds from different local statistics, bad
    configurations raise on every rank, and under horovodrun --gloo the Horovod fallback."""
    from tests._launch import run_mpi

    out = run_mpi("tests/mp/adaptive_controller.py", np=2, launcher=launcher, timeout=120,
                  args=["mpi" if launcher == "mpirun" else "gloo", tmp_path / "t.jsonl"])
    assert out.count("adaptive controller OK") == 2, out


@pytest.mark.mpi
def test_adaptive_alltoall_decodes_each_table_within_its_bound():
    """tests/mp/adaptive_alltoall.py: forward and backward through hvd_lossy.torch.alltoall."""
    from tests._launch import run_mpi

    out = run_mpi("tests/mp/adaptive_alltoall.py", np=2, timeout=120)
    assert out.count("adaptive alltoall OK") == 2, out


def test_budget_policy_reaches_its_target_ratio_on_real_frames():
    """Closed loop through the codec: frames calibrate the rate model, the next bounds meet the
    byte budget (overall forward ratio within 5% of the target once settled)."""
    torch.manual_seed(0)
    cards = {"t%d" % i: c for i, c in enumerate([3, 40, 900, 20000, 10**6, 10**7])}
    weights = {n: torch.randn(min(c, 4000), 16) * 0.05 * (i + 1)
               for i, (n, c) in enumerate(cards.items())}
    for target in (8.0, 14.0):
        c = Controller(cards, policy={"name": "budget", "target_ratio": target},
                       schedule="constant", interval=3, comm="local")
        comp = AdaptiveCompressor(c, list(cards))
        raw = sent = 0
        for it in range(24):
            x = torch.cat([w[torch.randint(0, w.shape[0], (256,))] for w in weights.values()])
            for i, name in enumerate(cards):
                c.observe_gradients(name, torch.full((4, 4), 10.0 ** -i))
            plan = comp.plan([x.shape[0]])
            _, sizes = _one_frame(x, plan)
            comp.after_compress(plan, sizes, x)
            if it >= 12:
                raw, sent = raw + x.numel() * 4, sent + sum(sizes)
            c.step()
        assert raw / sent == pytest.approx(target, rel=0.05)
        assert len(set(c.bounds().values())) > 1  # shaped by sensitivity, not one bound


def test_one_compressor_serves_two_exchanges_in_flight():
    """plan() of a second exchange between plan() and after_compress() of the first (two
    alltoall_async calls with one compressor) records each frame with its own table."""
    def recorded(interleave):
        c = two_rank_controller(E=10)
        comp = AdaptiveCompressor(c, [["a", "b"], ["c"]])
        first_x, second_x = torch.randn(6, 16), torch.rand(12, 16) * 100
        first = comp.plan([4, 2])    # a, b to rank 0; c to rank 1
        steps = [lambda: comp.after_compress(first, [100, 110, 120], first_x)]
        second = comp.plan([0, 12])  # nothing to rank 0 (still one frame per table), c to rank 1
        steps.append(lambda: comp.after_compress(second, [10, 11, 130], second_x))
        for step in (reversed(steps) if interleave else steps):
            step()
        c.exchange()
        return {s.name: (s.raw_bytes, s.frame_bytes) for s in c.stats()}

    got = recorded(interleave=True)
    assert got == recorded(interleave=False)
    assert got["c"] == ((2 + 12) * 16 * 4, 120 + 130) and got["a"] == (2 * 16 * 4, 100)


@pytest.mark.mpi
def test_adaptive_alltoall_in_a_process_set_talks_over_the_set_and_lays_tables_out_by_set_rank():
    """tests/mp/adaptive_process_set.py: 3 ranks, a set of 2; bounds land on the right tables
    forward and backward, the controller exchanges over the set, a mismatched one raises."""
    from tests._launch import run_mpi

    out = run_mpi("tests/mp/adaptive_process_set.py", np=3, timeout=120)
    assert sorted(out.count(f"rank {r}: adaptive process set OK") for r in range(3)) == [1, 1, 1], out


# ----- the controller's MPI exchange -------------------------------------------------------------

class _Request:
    """An mpi4py request that completes at its `polls`-th Test()."""

    def __init__(self, polls):
        self.left = polls

    def Test(self):
        self.left -= 1
        return self.left <= 0


def test_mpi_exchange_waits_by_polling_and_sleeping_not_by_spinning_in_mpi():
    from hvd_lossy.adaptive.comm import MAX_POLL_SLEEP, wait_yielding
    naps = []
    wait_yielding(_Request(polls=12), sleep=naps.append)
    assert len(naps) == 11  # one nap between every two polls, none after the last
    assert naps[0] == pytest.approx(20e-6) and naps == sorted(naps)
    assert max(naps) == MAX_POLL_SLEEP  # backs off to its cap, never beyond


def test_mpi_comm_allgathers_through_a_nonblocking_request():
    from hvd_lossy.adaptive.comm import MPIComm

    class TwoRanks:  # mpi4py's Iallgather on rank 1 of 2, the peer's row all 7s
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def Iallgather(self, send, recv):
            recv[0], recv[1] = 7, send
            return _Request(polls=3)

    got = MPIComm(TwoRanks()).allgather_array(np.array([1.0, 2.0]))
    assert got.tolist() == [[7.0, 7.0], [1.0, 2.0]]
