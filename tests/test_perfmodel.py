"""The performance model's contract: its terms, the calibration it reads, its command line, the
committed validation record and the README section that quotes it. No timing."""
import json
import math
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from hvd_lossy import perfmodel
from hvd_lossy.perfmodel import bucket
from hvd_lossy.perfmodel.bucket import IDLE, SEND

REPO = pathlib.Path(__file__).resolve().parents[1]
VALIDATION = REPO / "benchmarks" / "results" / "perfmodel_validation.json"

CURVE = {"rows": [16, 256, 4096], "ratio": [4.0, 8.0, 16.0]}
CALIB = {"ratio": {"lossy": {"fwd": CURVE, "bwd": {"rows": [16, 4096], "ratio": [3.0, 6.0]}},
                   "adaptive": {"fwd": CURVE, "bwd": CURVE}},
         "codec": {"lookups": {"compress_gbps": 5.0, "decompress_gbps": 15.0, "piece_s": 2e-6},
                   "gradients": {"compress_gbps": 3.0, "decompress_gbps": 8.0, "piece_s": 2e-6},
                   "fp16": {"to_half_gbps": 5.0, "to_float_gbps": 3.0}, "auto_call_s": 65e-6}}


def workload(**kw):
    w = dict(ranks=8, batch=4096, dim=64, cardinalities=perfmodel.KAGGLE, dense_params=100_000,
             compute_s=0.01, host_cores=None)
    w.update(kw)
    return w


def network(gbit=10.0, **kw):
    n = dict(bandwidth_gbit=gbit, link="per_rank", latency_s=1e-4, efficiency=1.0)
    n.update(kw)
    return n


def test_ratio_curve_is_exact_at_measured_rows_and_log_linear_between():
    assert perfmodel.ratio_at(CURVE, 16) == 4.0
    assert perfmodel.ratio_at(CURVE, 256) == 8.0
    assert perfmodel.ratio_at(CURVE, 64) == pytest.approx(6.0)  # halfway in log(rows)
    assert 8.0 < perfmodel.ratio_at(CURVE, 1000) < 16.0


def test_ratio_curve_is_not_extrapolated_beyond_the_measured_rows():
    assert perfmodel.ratio_at(CURVE, 1) == 4.0
    assert perfmodel.ratio_at(CURVE, 1_000_000) == 16.0


@pytest.mark.parametrize("curve, match", [({"rows": [16, 16], "ratio": [1, 2]}, "ascending"),
                                          ({"rows": [16, 32], "ratio": [1]}, "as many")])
def test_a_malformed_ratio_curve_is_refused_naming_what_is_wrong(curve, match):
    with pytest.raises(ValueError, match=match):
        perfmodel.ratio_at(curve, 20)


@pytest.mark.parametrize("mode", perfmodel.MODES)
@pytest.mark.parametrize("link", perfmodel.LINKS)
def test_a_faster_link_never_makes_a_step_slower(mode, link):
    times = [perfmodel.predict(mode, workload(), network(g, link=link), CALIB)["seconds"]
             for g in (0.1, 1, 10, 100, 1000)]
    assert all(b <= a for a, b in zip(times, times[1:])), times


def test_compression_pays_on_a_slow_link_and_not_on_a_fast_one():
    slow = perfmodel.predict("lossy", workload(), network(0.5), CALIB)
    fast = perfmodel.predict("lossy", workload(), network(1e5), CALIB)
    assert slow["speedup"] > 1.5 and fast["speedup"] < 1.0


def test_plain_is_its_own_baseline():
    assert perfmodel.predict("plain", workload(), network(), CALIB)["speedup"] == 1.0


def test_the_dominant_term_is_the_all_to_all_on_a_slow_link_and_compute_on_a_fast_one():
    assert perfmodel.predict("plain", workload(), network(0.1), CALIB)["dominant"] == "a2a"
    assert perfmodel.predict("plain", workload(compute_s=1.0), network(1e4), CALIB)["dominant"] == "compute"


def test_bytes_of_a_compressed_all_to_all_follow_the_ratio_at_rows_a_chunk():
    w, n = workload(dim=64, batch=8 * 256), network(1.0, latency_s=0.0)  # 256 rows a chunk: ratio 8
    plain = perfmodel.step_terms("plain", w, n, CALIB)["fwd_a2a"]
    lossy = perfmodel.step_terms("lossy", w, n, CALIB)["fwd_a2a"]
    assert lossy == pytest.approx(plain / 8.0)


def test_reuse_divides_the_compressed_forward_bytes_only():
    w, n = workload(dim=64, batch=8 * 256), network(1.0, latency_s=0.0)
    reused = workload(dim=64, batch=8 * 256, reuse_fewer=3.0)
    for mode in ("lossy", "adaptive"):
        before, after = (perfmodel.step_terms(mode, x, n, CALIB) for x in (w, reused))
        assert after["fwd_a2a"] == pytest.approx(before["fwd_a2a"] / 3.0)
        assert after["bwd_a2a"] == before["bwd_a2a"]  # gradients are never reused
    for mode in ("plain", "fp16"):
        assert perfmodel.step_terms(mode, reused, n, CALIB) == perfmodel.step_terms(mode, w, n,
                                                                                     CALIB)
    assert perfmodel.predict("lossy", reused, n, CALIB)["ratio"][0] == pytest.approx(8.0 * 3.0)
    with pytest.raises(ValueError, match="reuse_fewer must be a number > 0, got 0"):
        perfmodel.step_terms("lossy", workload(reuse_fewer=0), n, CALIB)


def test_coded_dense_gradients_travel_as_an_allgather_of_frames_and_add_their_coding():
    n = network(1.0, latency_s=0.0)
    for ranks, fewer in ((2, 20.0), (64, 20.0)):
        w = workload(ranks=ranks, batch=ranks * 64, dense_params=1_000_000)
        coded = dict(w, dense_fewer=fewer)
        for mode in ("lossy", "adaptive"):
            before, after = (perfmodel.step_terms(mode, x, n, CALIB) for x in (w, coded))
            # a ring allreduce moves 2 (P-1)/P of the dense bytes a rank, the allgather (P-1)/fewer
            expected = (ranks - 1) / fewer / (2 * (ranks - 1) / ranks)
            assert after["allreduce"] == pytest.approx(before["allreduce"] * expected)
            raw = 1_000_000 * 4
            coding = raw / 3e9 + ranks * raw / 8e9  # CALIB's gradient rates: one compress, P decodes
            assert after["codec"] == pytest.approx(before["codec"] + coding)
        for mode in ("plain", "fp16"):  # nothing to code the dense gradients with
            assert perfmodel.step_terms(mode, coded, n, CALIB) == perfmodel.step_terms(mode, w, n, CALIB)
    # 2 ranks: 20x fewer bytes; 64 ranks: 63 frames a rank against the ring's 2 tensors, 1.6x more
    assert perfmodel.step_terms("lossy", dict(workload(ranks=64, batch=64 * 64, dense_params=10**6),
                                              dense_fewer=20.0), n, CALIB)["allreduce"] > \
        perfmodel.step_terms("lossy", workload(ranks=64, batch=64 * 64, dense_params=10**6), n,
                             CALIB)["allreduce"]
    with pytest.raises(ValueError, match="dense_fewer must be a number > 0, got 0"):
        perfmodel.step_terms("lossy", workload(dense_fewer=0), n, CALIB)


def test_gradients_summed_by_id_divide_lossys_gradient_bytes_and_adaptives_stay_per_lookup():
    w, n = workload(dim=64, batch=8 * 256), network(1.0, latency_s=0.0)
    summed = workload(dim=64, batch=8 * 256, reuse_grad_fewer=2.5)
    before, after = (perfmodel.step_terms("lossy", x, n, CALIB) for x in (w, summed))
    assert after["bwd_a2a"] == pytest.approx(before["bwd_a2a"] / 2.5)
    assert after["fwd_a2a"] == before["fwd_a2a"]
    for mode in ("adaptive", "plain", "fp16"):
        assert perfmodel.step_terms(mode, summed, n, CALIB) == perfmodel.step_terms(mode, w, n,
                                                                                     CALIB)
    lossy = perfmodel.predict("lossy", summed, n, CALIB)["ratio"]
    assert lossy[1] == pytest.approx(perfmodel.predict("lossy", w, n, CALIB)["ratio"][1] * 2.5)
    with pytest.raises(ValueError, match="reuse_grad_fewer must be a number > 0, got -1"):
        perfmodel.step_terms("lossy", workload(reuse_grad_fewer=-1), n, CALIB)


def test_reuse_multiplies_the_lookups_codec_work_and_nothing_else():
    w, n = workload(dim=64, batch=8 * 256), network(1.0, latency_s=0.0)
    costly = workload(dim=64, batch=8 * 256, reuse_codec=3.0)
    sent, received, pieces = [1e6] * 8, [2e6] * 8, [4] * 8
    codec = CALIB["codec"]
    look = codec["lookups"]
    lookups = 1e6 / (look["compress_gbps"] * 1e9) + 2e6 / (look["decompress_gbps"] * 1e9)
    base = perfmodel.codec_work("lossy", sent, received, pieces, codec)
    tripled = perfmodel.codec_work("lossy", sent, received, pieces, codec, 3.0)
    assert tripled == pytest.approx([b + 2 * lookups for b in base])
    for mode in ("lossy", "adaptive"):
        before, after = (perfmodel.step_terms(mode, x, n, CALIB) for x in (w, costly))
        assert after["codec"] > before["codec"]
        assert {k: v for k, v in after.items() if k != "codec"} == \
            {k: v for k, v in before.items() if k != "codec"}
    for mode in ("plain", "fp16"):
        assert perfmodel.step_terms(mode, costly, n, CALIB) == perfmodel.step_terms(mode, w, n,
                                                                                     CALIB)
    with pytest.raises(ValueError, match="reuse_codec must be a number > 0, got 0"):
        perfmodel.step_terms("lossy", workload(reuse_codec=0), n, CALIB)


def test_a_shared_link_carries_every_ranks_bytes_and_a_cluster_only_the_busiest_ranks():
    w = workload(sharding="balanced")
    shared = perfmodel.step_terms("plain", w, network(1.0, link="shared", latency_s=0.0), CALIB)["fwd_a2a"]
    per_rank = perfmodel.step_terms("plain", w, network(1.0, latency_s=0.0), CALIB)["fwd_a2a"]
    assert shared == pytest.approx(8 * per_rank)


RATE, BURST = 1e6, 5e5  # bytes/s, bytes


def test_without_a_burst_every_send_takes_its_bytes_over_the_rate():
    seconds = bucket.steady_state([(IDLE, 1.0), (SEND, 3e6), (IDLE, 0.5), (SEND, 1e6)], RATE, 0)
    assert seconds == pytest.approx([1.0, 3.0, 0.5, 1.0])


def test_an_idle_phase_refills_the_bucket_up_to_the_burst_and_no_further():
    short = bucket.steady_state([(IDLE, 0.1), (SEND, 2e6)], RATE, BURST)
    long = bucket.steady_state([(IDLE, 10.0), (SEND, 2e6)], RATE, BURST)
    assert short[1] == pytest.approx((2e6 - 0.1 * RATE) / RATE)
    assert long[1] == pytest.approx((2e6 - BURST) / RATE)


def test_what_a_small_send_leaves_in_the_bucket_goes_to_the_next_send():
    # 0.4 s refill 400 kB; the first send takes 100 kB of it, the second gets the other 300 kB
    seconds = bucket.steady_state([(IDLE, 0.4), (SEND, 1e5), (SEND, 1e6)], RATE, BURST)
    assert seconds[1] == 0.0 and seconds[2] == pytest.approx((1e6 - 3e5) / RATE)


@pytest.mark.parametrize("phases", [
    [(IDLE, 0.3), (SEND, 4e5), (IDLE, 0.01), (SEND, 2e6)],
    [(IDLE, 2.0), (SEND, 1e4), (IDLE, 0.2), (SEND, 1e4)],
    [(SEND, 7e5), (IDLE, 0.6), (SEND, 1e5), (IDLE, 0.05), (SEND, 3e5)]])
def test_an_iteration_never_carries_more_than_the_rate_times_its_length(phases):
    seconds = bucket.steady_state(phases, RATE, BURST)
    sent = sum(a for k, a in phases if k == SEND)
    assert sum(seconds) >= sent / RATE - 1e-9
    assert all(s >= 0 for s in seconds)


def test_the_steady_state_repeats_itself():
    phases = [(IDLE, 0.3), (SEND, 4e5), (IDLE, 0.01), (SEND, 2e6)]
    seconds = bucket.steady_state(phases, RATE, BURST)
    level = 0.0
    for _ in range(50):  # a long run from an empty bucket settles into it
        last, level = bucket.one_iteration(phases, RATE, BURST, level)
    assert last == pytest.approx(seconds)


@pytest.mark.parametrize("phases, match", [([("wait", 1.0)], "kind 'wait'"), ([(SEND, -1)], "bytes must be >= 0")])
def test_a_malformed_phase_is_refused_naming_it(phases, match):
    with pytest.raises(ValueError, match=match):
        bucket.steady_state(phases, RATE, BURST)


def test_on_a_token_bucket_link_the_idle_work_overlaps_the_bytes_up_to_the_link_bound():
    net = network(0.1, link="shared", burst_bytes=512 * 1024)
    bare = network(0.1, link="shared")
    for host in (0.0, 0.005, 0.02):
        w = workload(compute_s=0.01, host_cores=2, host_s=host)
        with_bucket = sum(perfmodel.step_terms("plain", w, net, CALIB).values())
        without = sum(perfmodel.step_terms("plain", w, bare, CALIB).values())
        wire = sum(perfmodel.step_terms("plain", workload(compute_s=0.0), network(0.1, link="shared", latency_s=0.0),
                                        CALIB).values())
        assert wire - 1e-9 <= with_bucket < without  # never below the bytes' time, always below the bare link's
    # the bytes outweigh the idle work, so more host work before the ids is absorbed by the bucket
    assert sum(perfmodel.step_terms("plain", workload(compute_s=0.01, host_s=0.02), net, CALIB).values()) == \
        pytest.approx(sum(perfmodel.step_terms("plain", workload(compute_s=0.01, host_s=0.0), net, CALIB).values()))


def test_the_host_work_between_timed_steps_adds_to_the_iteration_on_a_plain_link():
    base = perfmodel.predict("plain", workload(), network(), CALIB)
    more = perfmodel.predict("plain", workload(host_s=0.004), network(), CALIB)
    assert more["seconds"] == pytest.approx(base["seconds"] + 0.004) and more["terms"]["host"] == 0.004


def test_a_mode_measured_in_situ_takes_its_own_codec_cost_and_the_others_their_throughputs():
    w = workload(codec_s={"adaptive": 0.007})
    assert perfmodel.step_terms("adaptive", w, network(), CALIB)["codec"] == 0.007
    assert perfmodel.step_terms("lossy", w, network(), CALIB)["codec"] == \
        perfmodel.step_terms("lossy", workload(), network(), CALIB)["codec"]


def test_codec_work_of_ranks_sharing_cores_is_spread_over_them():
    own = perfmodel.step_terms("lossy", workload(host_cores=None), network(), CALIB)["codec"]
    shared = perfmodel.step_terms("lossy", workload(host_cores=2), network(), CALIB)["codec"]
    assert shared > own


def test_auto_costs_at_most_the_faster_path_plus_its_calls():
    for g in (0.5, 1e5):
        w, n = workload(), network(g)
        auto = perfmodel.predict("auto", w, n, CALIB)
        best = min(perfmodel.predict(m, w, n, CALIB)["seconds"] for m in ("plain", "lossy"))
        assert auto["seconds"] == pytest.approx(best + 2 * CALIB["codec"]["auto_call_s"])


@pytest.mark.parametrize("kw, match", [(dict(ranks=1), "ranks must be an int >= 2"),
                                       (dict(batch=1000, ranks=3), "split evenly")])
def test_bad_workloads_are_refused_with_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        perfmodel.predict("plain", workload(**kw), network(), CALIB)


def test_an_unknown_mode_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="mode must be one of"):
        perfmodel.predict("zstd", workload(), network(), CALIB)


def test_every_committed_preset_input_says_where_it_came_from():
    calib = perfmodel.load_calibration()
    for name, p in calib["presets"].items():
        for part in ("workload", "network"):
            for key, field in p[part].items():
                assert field["source"].startswith(("measured", "assumed", "counted", "published", "the ",
                                                   "a ", "dev ")), (name, key, field)


def test_the_cli_prints_a_table_and_writes_json(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "hvd_lossy.perfmodel", "--ranks", "8,64", "--bandwidth", "25",
                           "--json", str(out)], capture_output=True, text=True, cwd=REPO, check=True)
    assert "speedup" in proc.stdout
    rows = json.loads(out.read_text())["predictions"]
    assert {(r["ranks"], r["mode"]) for r in rows} == {(p, m) for p in (8, 64) for m in perfmodel.MODES}
    assert all(r["seconds"] > 0 and r["dominant"] in ("compute", "host", "ids", "a2a", "codec", "allreduce")
               for r in rows)


def test_the_cli_refuses_a_bandwidth_that_is_not_positive():
    proc = subprocess.run([sys.executable, "-m", "hvd_lossy.perfmodel", "--bandwidth", "0"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "values > 0" in proc.stderr


def test_the_validation_record_has_the_documented_schema_and_at_least_six_runs_including_8_ranks():
    record = json.loads(VALIDATION.read_text())
    runs = record["runs"]
    assert len(runs) >= 6 and any(r["ranks"] == 8 for r in runs)
    for r in runs:
        assert {"ranks", "bandwidth_gbit", "mode", "measured_s", "predicted_s"} <= set(r)
        assert r["mode"] in perfmodel.MODES and r["measured_s"] > 0 and r["predicted_s"] > 0
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)


def test_the_recorded_predictions_are_the_committed_model_on_the_committed_calibration():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import perfmodel_validate
    calib = perfmodel.load_calibration()
    for r in json.loads(VALIDATION.read_text())["runs"]:
        again = perfmodel_validate.predicted(r["setting"], r["ranks"], r["bandwidth_gbit"], r["mode"], calib)
        assert again["seconds"] == pytest.approx(r["predicted_s"], rel=1e-9)


def readme_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## When does compression pay?", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_section_has_commands():
    assert readme_commands()


@pytest.mark.parametrize("command", readme_commands() if "## When does compression pay?" in
                         (REPO / "README.md").read_text() else [])
def test_every_command_of_the_readme_section_runs_as_written(command, tmp_path):
    argv = shlex.split(command)
    assert argv[0] == "python", f"README commands start with python, got {command!r}"
    proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_projection_speedup_is_finite_for_every_published_cardinality_set():
    calib = perfmodel.load_calibration()
    for data in perfmodel.CARDINALITIES:
        rows = perfmodel.sweep(f"cluster-{data}", calib, [8, 1024], [25, 400], perfmodel.MODES)
        assert all(math.isfinite(r["speedup"]) and r["speedup"] > 0 for r in rows)
