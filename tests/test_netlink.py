"""`python -m hvd_lossy.bench netlink`: refusals that name what is missing, the namespace gone
after failures and signals, the summaries' arithmetic, the JSON/PNG of a real --quick run, and
the main job's emulated-link comparison. Tests that need root, ip and tc skip (with the reason)
elsewhere; the refusal and summary tests run anywhere."""
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from hvd_lossy.bench import netlink

REPO = pathlib.Path(__file__).resolve().parents[1]


def _tools(tmp_path, names, ip_script="exit 0"):
    """A PATH folder holding fake `names` (exit 0); `ip` runs `ip_script` when given."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        body = ip_script if name == "ip" else "exit 0"
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return str(folder)


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def _link_or_skip(name):
    problems = netlink.missing_requirements()
    if problems:
        pytest.skip("no emulated link on this machine: " + "; ".join(problems))
    try:
        netlink.preflight(name)
    except netlink.Unavailable as e:
        pytest.skip(str(e))


# ---------------------------------------------------------------- refusals


def test_missing_tc_and_mpirun_are_named_and_present_ip_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _tools(tmp_path, ["ip"]))
    problems = " ".join(netlink.missing_requirements())
    assert "`tc` not found on PATH" in problems and "`mpirun` not found on PATH" in problems
    assert "`ip`" not in problems


def test_the_command_refuses_without_tc_with_exit_3_and_creates_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvd_lossy.bench", "netlink", "--quick",
                           "--namespace", f"hvdl-t{os.getpid()}-notc"],
                          env=_env(PATH=_tools(tmp_path, ["ip", "mpirun"])), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == netlink.EXIT_UNAVAILABLE == 3, proc.stderr
    assert "cannot emulate a link: `tc` not found on PATH (iproute2: limits its loopback)" in proc.stderr
    assert "Traceback" not in proc.stderr
    if netlink.shutil.which("ip"):
        assert f"hvdl-t{os.getpid()}-notc" not in netlink.namespaces()


def test_non_root_is_refused_naming_the_effective_uid(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _tools(tmp_path, ["ip", "tc", "mpirun"]))
    monkeypatch.setattr(netlink.os, "geteuid", lambda: 1000)
    with pytest.raises(netlink.Unavailable, match=r"not root \(euid 1000\): network namespaces and qdiscs need root"):
        netlink.preflight()


def test_a_namespace_that_cannot_be_created_is_refused_with_ip_s_own_words(tmp_path, monkeypatch):
    # An `ip` that lists nothing and fails `netns add` as it does in an unprivileged container.
    script = ('[ "$1 $2" = "netns add" ] && { echo "mount --make-shared /run/netns failed: '
              'Operation not permitted" >&2; exit 1; }; exit 0')
    monkeypatch.setenv("PATH", _tools(tmp_path, ["ip", "tc", "mpirun"], ip_script=script))
    monkeypatch.setattr(netlink.os, "geteuid", lambda: 0)
    with pytest.raises(netlink.Unavailable, match=r"cannot create network namespace hvdl-x: `ip netns add` "
                                                  r"said: mount --make-shared /run/netns failed: Operation not permitted"):
        netlink.preflight("hvdl-x")


def test_check_flag_says_why_not_and_exits_3(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvd_lossy.bench", "netlink", "--check"],
                          env=_env(PATH=_tools(tmp_path, ["tc", "mpirun"])), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "`ip` not found on PATH (iproute2: creates the network namespace)" in proc.stderr


def test_only_our_own_namespace_names_are_accepted():
    with pytest.raises(ValueError, match=r"must start with 'hvdl-' .* got 'eth0'"):
        netlink.Namespace("eth0")
    with pytest.raises(ValueError, match="got 'hvdl-a/b'"):
        netlink.Namespace("hvdl-a/b")


# ---------------------------------------------------------------- command line and summaries


def test_rates_are_gbit_numbers_or_unlimited():
    assert netlink._rates("1, 25,unlimited") == [1.0, 25.0, None]
    with pytest.raises(netlink.argparse.ArgumentTypeError, match="got 'fast'"):
        netlink._rates("1,fast")
    with pytest.raises(netlink.argparse.ArgumentTypeError, match="must be > 0 Gbit/s, got '0'"):
        netlink._rates("0")


def test_quick_fills_only_what_was_not_given_and_flags_after_dashes_go_to_train():
    opts = netlink.parse(["--quick", "--rates", "10,unlimited", "--", "--seed", "3"])
    assert opts.rates == [10.0, None] and opts.ranks == [2] and opts.repeat == 1
    assert opts.train_args == ["--seed", "3"]
    full = netlink.parse([])
    assert full.rates == [1.0, 10.0, 25.0, 100.0, None] and full.ranks == [2, 3]
    assert full.settings == ["criteo-d128", "readme"]
    assert full.dlrm_modes == netlink.DEFAULT_DLRM_MODES and "lossy-overlap" not in full.dlrm_modes
    assert "--overlap" in netlink.DLRM_MODES["lossy-overlap"]  # asked for by name


def test_batches_are_the_nearest_multiple_of_the_ranks_so_3_ranks_can_train():
    assert [netlink.batch_for(1024, n) for n in (2, 3, 5)] == [1024, 1023, 1025]
    assert netlink.batch_for(128, 3) == 129 and netlink.batch_for(4, 8) == 8
    opts = netlink.parse([])
    assert netlink.SETTINGS["readme"](opts, 2) == []  # README defaults untouched where they work
    assert netlink.SETTINGS["readme"](opts, 3) == ["--batch-size", "129"]
    flags = netlink.SETTINGS["criteo-d128"](opts, 3)
    assert flags[flags.index("--batch-size") + 1] == "1023" and flags[flags.index("--embedding-dim") + 1] == "128"


def test_horovod_and_mpi_settings_are_the_same_environment_for_every_mode():
    yield_on = {"OMPI_MCA_mpi_yield_when_idle": "1"}  # set for plain Horovod's runs too
    opts = netlink.parse(["--cycle-time", "2.5", "--fusion-mb", "32"])
    assert netlink.horovod_env(opts) == {"HOROVOD_CYCLE_TIME": "2.5",
                                         "HOROVOD_FUSION_THRESHOLD": str(32 << 20), **yield_on}
    assert netlink.horovod_env(netlink.parse([])) == yield_on  # Horovod's own settings otherwise
    # off is said explicitly, or hvd_lossy.torch.init() would turn it on for the lossy modes only
    assert netlink.horovod_env(netlink.parse(["--mpi-yield", "off"])) == {
        "OMPI_MCA_mpi_yield_when_idle": "0"}
    cmd = netlink.mpirun(3, ["HOROVOD_CYCLE_TIME"], ["python", "x.py"])
    assert cmd[cmd.index("-np") + 1] == "3" and ["-x", "HOROVOD_CYCLE_TIME"] == cmd[-4:-2]
    assert ["--mca", "btl", "tcp,self"] == cmd[5:8]


def test_modes_take_turns_each_round_starting_one_mode_later(monkeypatch):
    order = []

    class Link:
        def set_rate(self, rate):
            order.append(("rate", rate))

    def run(kind):
        def record(ns, rate, ranks, *rest):
            order.append((kind, rest[-4], rest[-3]))  # (mode, round)
            return {"status": "ok", "iter_seconds_median": 0.1, "wire_bytes": 1, "auc": 0.7}
        return record
    monkeypatch.setattr(netlink, "run_dlrm", run("dlrm"))
    monkeypatch.setattr(netlink, "run_user", run("user"))
    opts = netlink.parse(["--parts", "dlrm,user", "--rates", "10", "--repeat", "4", "--ranks", "2",
                          "--settings", "criteo-d128",
                          "--dlrm-modes", "uncompressed,lossy,auto",
                          "--user-modes", "uncompressed,lossy"])
    netlink.measure(Link(), opts, log=lambda *_: None)
    dlrm = [(m, r) for kind, m, r in order[1:] if kind == "dlrm"]
    user = [(m, r) for kind, m, r in order[1:] if kind == "user"]
    assert [m for m, _r in dlrm] == ["uncompressed", "lossy", "auto", "lossy", "auto",
                                     "uncompressed", "auto", "uncompressed", "lossy",
                                     "uncompressed", "lossy", "auto"]
    assert [m for m, _r in user] == ["uncompressed", "lossy", "lossy", "uncompressed"] * 2
    assert [r for _m, r in dlrm] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert netlink.turns([], 3) == []


def _run(rate, mode, t, auc=0.7, wire=100, status="ok", ranks=2):
    rec = {"bandwidth_gbit": rate, "ranks": ranks, "setting": "s", "mode": mode, "train_args": [],
           "wire_bytes": wire, "status": status}
    if status == "ok":
        rec.update(iter_seconds_median=t, steps_seconds_total=t and 10 * t, auc=auc, a2a_bytes_sent=wire,
                   compression_ratio=1.0)
    else:
        rec["error"] = "train.py: error: boom"
    return rec


def test_dlrm_speedup_is_against_uncompressed_at_the_same_rate_and_ranks():
    runs = [_run(1.0, "uncompressed", 0.3), _run(1.0, "lossy", 0.1, auc=0.69, wire=10),
            _run(1.0, "lossy", 0.2, auc=0.71, wire=20), _run(None, "uncompressed", 0.05),
            _run(None, "lossy", 0.1), _run(1.0, "auto", None, status="failed"),
            _run(1.0, "lossy", 0.6, ranks=3)]
    got = {(r["bandwidth_gbit"], r["mode"], r["ranks"]): r for r in netlink.summarise_dlrm(runs)}
    lossy = got[(1.0, "lossy", 2)]
    assert lossy["iter_seconds_median"] == pytest.approx(0.15) and lossy["speedup"] == pytest.approx(2.0)
    assert lossy["auc"] == pytest.approx(0.70) and lossy["auc_delta"] == pytest.approx(0.0)
    assert lossy["wire_bytes"] == 15 and lossy["runs"] == 2
    assert got[(None, "lossy", 2)]["speedup"] == pytest.approx(0.5)
    assert got[(1.0, "uncompressed", 2)]["speedup"] == 1.0
    assert got[(1.0, "lossy", 3)]["speedup"] is None  # no uncompressed run with 3 ranks
    auto = got[(1.0, "auto", 2)]
    assert auto["status"] == "failed" and auto["error"] == "train.py: error: boom" and auto["speedup"] is None


def test_the_paired_speedup_is_the_median_of_each_rounds_back_to_back_ratio():
    # round 1 ran in a slow spell of the machine: it moves the medians of steps, not the pairs
    steps = {0: (0.100, 0.095), 1: (0.200, 0.190), 2: (0.110, 0.100), 3: (0.105, 0.120)}
    runs = []
    for rep, (plain, lossy) in steps.items():
        runs += [dict(_run(None, "uncompressed", plain), repeat=rep),
                 dict(_run(None, "lossy", lossy), repeat=rep)]
    runs.append(dict(_run(None, "auto", 0.1), repeat=5))  # a round without a plain run
    got = {r["mode"]: r for r in netlink.summarise_dlrm(runs)}
    ratios = sorted(p / q for p, q in steps.values())
    assert got["lossy"]["speedup_paired"] == pytest.approx((ratios[1] + ratios[2]) / 2)
    assert got["lossy"]["speedup"] == pytest.approx(0.1075 / 0.110)  # the medians: below 1
    assert got["uncompressed"]["speedup_paired"] == pytest.approx(1.0)
    assert got["auto"]["speedup_paired"] is None
    assert "paired" in netlink.dlrm_table(netlink.summarise_dlrm(runs)).splitlines()[0]


def test_the_rounds_spread_and_autos_decisions_stand_beside_each_paired_figure():
    """One round of this machine moves a paired figure by several percent, and auto's figure
    means little without what it ran: both are in the record and the table."""
    steps = {0: (0.100, 0.090, "plain", 5), 1: (0.100, 0.110, "lossy", 112), 2: (0.120, 0.100,
                                                                             "plain", 8)}
    runs = []
    for rep, (plain, auto_t, decision, lossy_calls) in steps.items():
        runs.append(dict(_run(None, "uncompressed", plain), repeat=rep))
        runs.append(dict(_run(None, "auto", auto_t), repeat=rep,
                         auto=[{"decision": decision, "lossy_calls": lossy_calls, "calls": 120},
                               {"follows": "c", "decision": decision, "lossy_calls": 0}]))
    runs.append(dict(_run(None, "lossy", 0.1), repeat=0))
    got = {r["mode"]: r for r in netlink.summarise_dlrm(runs)}
    assert got["auto"]["paired_range"] == pytest.approx([0.100 / 0.110, 0.120 / 0.100])
    assert got["auto"]["auto_decisions"] == [["plain", 5, 120], ["lossy", 112, 120],
                                             ["plain", 8, 120]]  # the forward compressor's
    assert got["lossy"]["paired_range"] == pytest.approx([1.0, 1.0])  # one round
    assert got["lossy"]["auto_decisions"] is None
    lines = netlink.dlrm_table(netlink.summarise_dlrm(runs)).splitlines()
    assert "rounds" in lines[0]
    auto_line = next(line for line in lines if " auto " in line)
    assert "0.91-1.20" in auto_line and auto_line.endswith("lossy 1, plain 2 (5-112 lossy)")


def test_the_ceiling_is_the_baselines_step_on_the_unlimited_link_over_its_step_at_the_rate():
    runs = [_run(1.0, "uncompressed", 0.4), _run(1.0, "lossy", 0.25), _run(10.0, "uncompressed", 0.12),
            _run(None, "uncompressed", 0.1), _run(None, "lossy", 0.11), _run(1.0, "lossy", 0.5, ranks=3)]
    got = {(r["bandwidth_gbit"], r["mode"], r["ranks"]): r for r in netlink.summarise_dlrm(runs)}
    assert got[(1.0, "lossy", 2)]["ceiling"] == pytest.approx(4.0)  # free communication: 0.4 -> 0.1
    assert got[(1.0, "uncompressed", 2)]["ceiling"] == pytest.approx(4.0)
    assert got[(10.0, "uncompressed", 2)]["ceiling"] == pytest.approx(1.2)
    assert got[(None, "lossy", 2)]["ceiling"] == pytest.approx(1.0)
    assert got[(1.0, "lossy", 3)]["ceiling"] is None  # no baseline with 3 ranks


def _rounds(mode, pairs, rate=None):
    """Runs of uncompressed and `mode` per round: pairs[k] = (plain's step, mode's step)."""
    runs = []
    for rep, (plain, other) in enumerate(pairs):
        runs += [dict(_run(rate, "uncompressed", plain), repeat=rep),
                 dict(_run(rate, mode, other), repeat=rep)]
    return runs


def test_a_cells_geometric_mean_and_its_95_interval_come_from_its_paired_rounds():
    """A target within a few percent of 1 is judged by an interval over rounds, which the
    record carries beside the median: the rounds' geometric mean and a bootstrap interval
    that spans it, stays within the rounds, narrows with more of them and reads the same
    twice."""
    pairs = [(0.100, 0.095), (0.200, 0.190), (0.110, 0.100), (0.105, 0.120), (0.100, 0.098)]
    ratios = [p / q for p, q in pairs]
    got = {r["mode"]: r for r in netlink.summarise_dlrm(_rounds("lossy", pairs))}["lossy"]
    geomean = (ratios[0] * ratios[1] * ratios[2] * ratios[3] * ratios[4]) ** (1 / 5)
    assert got["speedup_geomean"] == pytest.approx(geomean)
    low, high = got["speedup_interval"]
    assert min(ratios) <= low < geomean < high <= max(ratios)
    again = {r["mode"]: r for r in netlink.summarise_dlrm(_rounds("lossy", pairs))}["lossy"]
    assert again["speedup_interval"] == got["speedup_interval"]
    more = {r["mode"]: r for r in netlink.summarise_dlrm(_rounds("lossy", pairs * 8))}["lossy"]
    assert more["speedup_geomean"] == pytest.approx(geomean)
    assert more["speedup_interval"][1] - more["speedup_interval"][0] < (high - low) / 2
    one = {r["mode"]: r for r in netlink.summarise_dlrm(_rounds("lossy", pairs[:1]))}["lossy"]
    assert one["speedup_geomean"] is None and one["speedup_interval"] is None
    line = next(x for x in netlink.dlrm_table(netlink.summarise_dlrm(_rounds("lossy", pairs)))
                .splitlines() if " lossy " in x)
    assert f"{geomean:.3f} [{low:.3f}-{high:.3f}]" in line


def test_the_share_of_the_ceiling_at_a_rate_is_plains_unlimited_steps_over_the_modes_with_an_interval():
    """The 1 Gbit/s target is a share of the ceiling (speedup over ceiling = plain's step on the
    unlimited link over the mode's at the rate). Both come from rounds minutes apart, so the
    record gives their geometric means' ratio with an interval from resampling each apart."""
    free = [0.050, 0.055, 0.060, 0.052]
    at_1g = [0.058, 0.054, 0.066, 0.057]
    runs = _rounds("lossy", [(0.170, t) for t in at_1g], rate=1.0)
    runs += [dict(_run(None, "uncompressed", t), repeat=k) for k, t in enumerate(free)]
    got = {(r["bandwidth_gbit"], r["mode"]): r for r in netlink.summarise_dlrm(runs)}
    lossy = got[(1.0, "lossy")]
    geo = lambda xs: math.prod(xs) ** (1 / len(xs))  # noqa: E731
    share = geo(free) / geo(at_1g)
    assert lossy["ceiling_share"] == pytest.approx(share)
    assert lossy["ceiling_share"] == pytest.approx(lossy["speedup_geomean"] / lossy["ceiling"],
                                                   rel=0.05)  # medians there, means here
    low, high = lossy["ceiling_share_interval"]
    assert min(free) / max(at_1g) <= low < share < high <= max(free) / min(at_1g)
    assert got[(1.0, "uncompressed")]["ceiling_share"] == pytest.approx(geo(free) / 0.170)
    assert got[(None, "uncompressed")]["ceiling_share"] is None  # no rate: no share
    alone = {(r["bandwidth_gbit"], r["mode"]): r for r in netlink.summarise_dlrm(runs[:8])}
    assert alone[(1.0, "lossy")]["ceiling_share"] is None  # no unlimited link measured
    line = next(x for x in netlink.dlrm_table(netlink.summarise_dlrm(runs)).splitlines()
                if " lossy " in x)
    assert f"{share:.3f} [{low:.3f}-{high:.3f}]" in line
    # pooled with a later run of the unlimited link alone, in a faster spell of the machine:
    # a share pairs each run's own sides, so that run changes nothing
    faster = [dict(_run(None, "uncompressed", t / 2), repeat=k) for k, t in enumerate(free)]
    pooled = netlink.summarise_dlrm(netlink.pool_runs([runs, faster]))
    again = {(r["bandwidth_gbit"], r["mode"]): r for r in pooled}[(1.0, "lossy")]
    assert again["ceiling_share"] == pytest.approx(share)
    assert again["ceiling_share_interval"] == pytest.approx([low, high])


def test_pool_summarises_several_runs_json_pairing_each_files_rounds_within_it(tmp_path,
                                                                            monkeypatch, capsys):
    """--pool reads --json outputs and measures nothing (no root, no namespace): their cells
    pool, and a round's pair never crosses files, whose round numbers repeat."""
    monkeypatch.setattr(netlink, "missing_requirements",
                        lambda: pytest.fail("--pool must not need an emulated link"))
    first = _rounds("auto", [(0.100, 0.100), (0.100, 0.125)])
    second = _rounds("auto", [(0.200, 0.160), (0.200, 0.200)])
    paths = []
    for k, runs in enumerate((first, second)):
        paths.append(tmp_path / f"run{k}.json")
        paths[-1].write_text(json.dumps({"command": f"run {k}", "dlrm_runs": runs}))
    out = tmp_path / "pooled.json"
    assert netlink.main(["--pool", *map(str, paths), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    auto = next(r for r in report["dlrm"] if r["mode"] == "auto")
    assert auto["runs"] == 4 and auto["paired_range"] == pytest.approx([0.8, 1.25])
    assert auto["speedup_geomean"] == pytest.approx((1.0 * 0.8 * 1.25 * 1.0) ** 0.25)
    assert report["commands"] == ["run 0", "run 1"]
    assert "2 runs pooled" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text(json.dumps({"dlrm": []}))
    with pytest.raises(SystemExit, match="bad.json: no 'dlrm_runs' list"):
        netlink.main(["--pool", str(tmp_path / "bad.json")])


def test_the_total_speedup_counts_every_step_so_probing_costs_show():
    runs = [_run(None, "uncompressed", 0.1), _run(None, "auto", 0.1)]
    runs[1]["steps_seconds_total"] = 1.25  # the median step ties, but probing cost 0.25 s in all
    got = {r["mode"]: r for r in netlink.summarise_dlrm(runs)}
    assert got["auto"]["speedup"] == pytest.approx(1.0)
    assert got["auto"]["speedup_total"] == pytest.approx(0.8)


def test_user_script_runs_are_summarised_beside_the_examples_without_auc():
    runs = [dict(_run(1.0, m, t), setting=netlink.USER_SETTING, auc=None) for m, t in
            (("uncompressed", 0.3), ("lossy", 0.1))]
    for r in runs:
        del r["a2a_bytes_sent"], r["compression_ratio"]
    got = {r["mode"]: r for r in netlink.summarise_dlrm(runs + [_run(1.0, "uncompressed", 0.9)])}
    assert got["lossy"]["speedup"] == pytest.approx(3.0)  # against the user script's own plain run
    assert got["lossy"]["auc"] is None and got["lossy"]["auc_delta"] is None
    assert "user-d128" in netlink.dlrm_table(netlink.summarise_dlrm(runs))
    opts = netlink.parse(["--parts", "user", "--user-modes", "uncompressed,auto"])
    assert opts.parts == ["user"] and opts.user_modes == ["uncompressed", "auto"]
    assert set(netlink.USER_MODES) == {"uncompressed", "fp16", "lossy", "auto", "lossy-fp16-backward",
                                       "none"}
    assert "none" not in netlink.parse(["--parts", "user"]).user_modes
    assert "none" not in netlink.parse([]).dlrm_modes
    assert netlink.parse(["--parts", "user"]).user_modes == ["uncompressed", "fp16", "lossy", "auto"]


@pytest.mark.parametrize("part", ["dlrm", "user"])
def test_keep_metrics_keeps_each_scripts_own_json_with_its_step_times(tmp_path, monkeypatch, part):
    """A summary keeps a run's median step; where a run lost its time (a probing step, a slow
    first step) is only in the script's own JSON, which --keep-metrics keeps for both scripts."""
    steps = [0.3, 0.1, 0.1]
    own = ({"iter_seconds": steps, "steps": 3, "auc": 0.7, "logloss": 0.5, "a2a_bytes_sent": 1,
            "a2a_bytes_plain": 2, "compression_ratio": 2.0, "train_seconds": 0.5}
           if part == "dlrm" else {"mode": "plain", "step_seconds": steps, "report": None})

    def fake_run(ns, ranks, argv, opts, timeout):
        out = argv[argv.index("--metrics-out" if part == "dlrm" else "--json") + 1]
        pathlib.Path(out).write_text(json.dumps(own))
        return {"rc": 0, "wire_bytes": 5, "seconds": 1.0, "output": ""}
    monkeypatch.setattr(netlink, "run_in", fake_run)
    kept = tmp_path / "kept"
    kept.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    opts = netlink.parse(["--parts", part, "--keep-metrics", str(kept), "--steps", "3",
                          "--warmup", "1"])
    run = netlink.run_dlrm if part == "dlrm" else netlink.run_user
    setting = "criteo-d128" if part == "dlrm" else netlink.USER_SETTING
    rec = run(None, 10.0, 2, setting, "uncompressed", 0, opts, work)
    assert rec["status"] == "ok" and rec["iter_seconds_median"] == pytest.approx(0.1)
    files = list(kept.iterdir())
    assert len(files) == 1 and json.loads(files[0].read_text()) == own
    assert not list(work.iterdir())  # moved, not copied


def test_lossy_lookups_with_float16_gradients_are_a_mode_of_both_scripts_asked_for_by_name():
    assert netlink.DLRM_MODES["lossy-fp16-backward"][-2:] == ["--backward-error-bound", "fp16"]
    assert "lossy-fp16-backward" not in netlink.parse([]).dlrm_modes
    assert netlink.parse(["--dlrm-modes", "lossy-fp16-backward"]).dlrm_modes == ["lossy-fp16-backward"]
    assert netlink.USER_MODES["lossy-fp16-backward"][:2] == ["--mode", "lossy-fp16-backward"]
    auto = netlink.DLRM_MODES["auto-fp16-backward"]
    assert auto == netlink.DLRM_MODES["lossy-fp16-backward"] + ["--auto"]
    assert "auto-fp16-backward" not in netlink.parse([]).dlrm_modes


def test_reuse_is_an_example_mode_asked_for_by_name_whose_flags_the_example_accepts():
    sys.path.insert(0, str(REPO / "examples" / "dlrm"))
    import cli
    assert "reuse" not in netlink.parse([]).dlrm_modes
    assert netlink.parse(["--dlrm-modes", "lossy,reuse"]).dlrm_modes == ["lossy", "reuse"]
    opts = netlink.parse(["--steps", "2"])
    args = cli.parser().parse_args(netlink.SETTINGS["criteo-d128"](opts, 2)
                                   + netlink.DLRM_MODES["reuse"] + netlink.COMMON_TRAIN)
    cli.check(args, 2)
    assert (args.compression, args.error_bound, args.reuse, args.ids) == ("lossy", 0.03, True, True)
    args = cli.parser().parse_args(netlink.SETTINGS["criteo-d128"](opts, 2)
                                   + netlink.DLRM_MODES["none"] + netlink.COMMON_TRAIN)
    assert (args.compression, args.plain_horovod) == ("none", False)  # the drop-in, not Horovod's


def _user_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("user_dlrm", REPO / "benchmarks" / "user_dlrm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_user_script_feeds_its_top_mlp_dlrms_pairwise_dots_or_the_concatenation_by_setting():
    import torch
    user = _user_script()
    bottom, emb = torch.randn(5, 4), torch.randn(5, 3, 4)
    got = user.interact(bottom, emb, "dot")
    feats = [bottom] + [emb[:, t] for t in range(3)]
    pairs = [(i, j) for i in range(4) for j in range(i)]  # each pair once, no self-products
    assert got.shape == (5, 4 + 6)
    assert torch.allclose(got[:, :4], bottom)
    for k, (i, j) in enumerate(pairs):
        assert torch.allclose(got[:, 4 + k], (feats[i] * feats[j]).sum(1), atol=1e-6)
    assert torch.equal(user.interact(bottom, emb, "cat"), torch.cat([bottom, emb.flatten(1)], 1))
    assert user.parse([]).interaction == "dot"
    for setting, flags in netlink.USER_SETTINGS.items():
        assert setting.startswith("user-d128")
        got = user.parse(flags)
        assert got.interaction == ("cat" if setting.endswith("-cat") else "dot")
        assert got.dense_fp16 == setting.endswith("-dense-fp16")
        assert got.dense_lossy == setting.endswith("-dense-lossy")
    import horovod.torch
    import hvd_lossy.torch
    for hvd in (horovod.torch, hvd_lossy.torch):  # the plain modes' module and the drop-in's
        assert user.dense_compression(hvd, user.parse(["--dense-fp16"]), None) is hvd.Compression.fp16
        assert user.dense_compression(hvd, user.parse([]), None) is hvd.Compression.none
        # --dense-lossy: the all-to-all's compressor where the mode has one, else as without it
        assert user.dense_compression(hvd, user.parse(["--dense-lossy"]), None) is hvd.Compression.none
    lossy = hvd_lossy.torch.Compression.lossy(0.03)
    assert user.dense_compression(hvd_lossy.torch, user.parse(["--dense-lossy"]), lossy) is lossy
    assert user.dense_compression(hvd_lossy.torch, user.parse([]), lossy) is hvd_lossy.torch.Compression.none
    assert netlink.parse(["--parts", "user"]).user_settings == [netlink.USER_SETTING]
    assert netlink.parse(["--user-settings", "user-d128,user-d128-cat"]).user_settings == [
        "user-d128", "user-d128-cat"]
    with pytest.raises(SystemExit):
        netlink.parse(["--user-settings", "user-d64"])


@pytest.mark.parametrize("setting", sorted(netlink.USER_SETTINGS))
def test_the_user_scripts_float16_gradient_mode_codes_the_lookups_and_casts_the_gradients(tmp_path,
                                                                                        setting):
    from tests._launch import run_mpi
    out = tmp_path / "user.json"
    run_mpi("benchmarks/user_dlrm.py", args=[
        *netlink.USER_MODES["lossy-fp16-backward"], *netlink.USER_SETTINGS[setting], "--steps", "2",
        "--tables", "4", "--dim", "8", "--global-batch", "64", "--table-rows", "1000", "--json", str(out)])
    got = json.loads(out.read_text())
    assert got["mode"] == "lossy-fp16-backward" and len(got["step_seconds"]) == 2
    report = got["report"]
    assert report["total"]["calls"] == 4  # each step: the lookups' all-to-all and its gradient's
    assert report["last"]["compression"] == "Compression.fp16" and report["last"]["ratio"] == 2.0
    assert report["total"]["ratio"] > 2.0  # the lookups' frames are smaller still


def test_alltoall_summary_takes_the_median_round_and_keeps_failures_with_their_error():
    rows = [{"bandwidth_gbit": 1.0, "ranks": 2, "mode": m, "bytes": 1 << 20, "ms_per_call": t,
             "link_bytes_per_call": w, "status": "ok"} for m, t, w in
            (("plain", 8.0, 2e6), ("plain", 6.0, 2e6), ("plain", 7.0, 2e6), ("lossy 0.03", 2.0, 2e5))]
    rows.append({"bandwidth_gbit": 1.0, "ranks": 2, "mode": "auto", "bytes": 1 << 20, "status": "failed",
                 "error": "TypeError: no auto"})
    got = {r["mode"]: r for r in netlink.summarise_alltoall(rows)}
    assert got["plain"]["ms_per_call"] == 7.0 and got["plain"]["ms_per_call_runs"] == [8.0, 6.0, 7.0]
    assert got["lossy 0.03"]["speedup"] == pytest.approx(3.5) and got["lossy 0.03"]["wire_bytes"] == 2e5
    assert got["auto"]["status"] == "failed" and got["auto"]["error"] == "TypeError: no auto"
    assert "auto failed: TypeError: no auto" in netlink.alltoall_table(list(got.values()))


def test_a_failed_launch_is_reported_by_its_own_error_line():
    out = "noise\ntrain.py: error: --auto: this hvd_lossy's compressors do not take auto=True\nmpirun noise\n"
    assert netlink.error_of(out, 2) == "train.py: error: --auto: this hvd_lossy's compressors do not take auto=True"
    assert netlink.error_of("a\nb\nc\nd", 1) == "exit status 1: b | c | d"


# ---------------------------------------------------------------- real runs (root, ip, tc)


@pytest.mark.mpi
def test_a_failure_inside_the_run_deletes_the_namespace(monkeypatch):
    name = f"hvdl-t{os.getpid()}-fail"
    _link_or_skip(name + "-probe")
    seen = []

    def fail(ns, *args, **kwargs):
        seen.append((ns.name in netlink.namespaces(), ns.rate))
        raise RuntimeError("forced failure")
    monkeypatch.setattr(netlink, "run_dlrm", fail)
    with pytest.raises(RuntimeError, match="forced failure"):
        netlink.main(["--quick", "--parts", "dlrm", "--namespace", name])
    assert seen == [(True, 1.0)]  # it existed, limited to 1 Gbit/s, when the run failed
    assert name not in netlink.namespaces()


def _default_sigint():
    # A suite started in the background (`cmd &`) inherits SIGINT ignored, and Python then keeps
    # it ignored: give the benchmark the SIGINT a user's terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.mpi
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_a_signal_mid_run_ends_the_ranks_and_deletes_the_namespace(sig, status):
    name = f"hvdl-t{os.getpid()}-sig{int(sig)}"
    _link_or_skip(name + "-probe")
    # --iters 400: a run of many seconds, so the signal lands mid-run even on a quiet machine
    # (a bare --quick run can end before the ranks are seen and signalled)
    proc = subprocess.Popen([sys.executable, "-m", "hvd_lossy.bench", "netlink", "--quick", "--parts",
                             "alltoall", "--iters", "400", "--namespace", name], env=_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(pids) < 3:  # mpirun and two ranks inside
            pids = netlink._ip("netns", "pids", name, check=False).stdout.split()
            time.sleep(0.2)
        assert len(pids) >= 3, f"the ranks never started in {name}"
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, output
    assert name not in netlink.namespaces()
    assert [pid for pid in pids if _running(pid)] == []


def _running(pid):
    """False for a process that is gone or a zombie (dead; in a container whose pid 1 does not
    reap, orphaned ranks stay zombies)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.mpi
def test_quick_run_writes_the_documented_json_and_png(tmp_path):
    name = f"hvdl-t{os.getpid()}-quick"
    _link_or_skip(name + "-probe")
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    proc = subprocess.run([sys.executable, "-m", "hvd_lossy.bench", "netlink", "--quick", "--namespace", name,
                           "--dlrm-modes", "uncompressed,auto", "--cycle-time", "2", "--fusion-mb", "32",
                           "--json", str(out_json), "--png", str(out_png)],
                          env=_env(), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert name not in netlink.namespaces()
    report = json.loads(out_json.read_text())
    assert report["horovod"]["cycle_time_ms"] == 2 and report["horovod"]["fusion_mb"] == 32
    assert report["horovod"]["env"] == {"HOROVOD_CYCLE_TIME": "2", "HOROVOD_FUSION_THRESHOLD": str(32 << 20),
                                        "OMPI_MCA_mpi_yield_when_idle": "1"}
    assert report["horovod"]["mpi_yield_when_idle"] == "on"
    dlrm = {r["mode"]: r for r in report["dlrm"]}
    assert set(dlrm) == {"uncompressed", "auto"}  # (lossy and adaptive: the main job's test)
    for r in dlrm.values():
        assert r["bandwidth_gbit"] == 1.0 and r["ranks"] == 2
        assert {"iter_seconds_median", "speedup", "auc", "wire_bytes"} <= set(r)
    base = dlrm["uncompressed"]
    assert base["status"] == "ok" and base["speedup"] == 1.0
    assert base["iter_seconds_median"] > 0 and 0 < base["auc"] < 1
    # 6 steps of (256 x 26 x 16) float32 lookups and their gradients crossed the link at least
    assert base["wire_bytes"] > 6 * 2 * 256 * 26 * 16 * 4 / 2
    auto = dlrm["auto"]  # until hvd_lossy has auto=True this fails, with the reason, alone
    assert (auto["status"] == "ok" and auto["speedup"] > 0) or "auto" in auto["error"]
    if auto["status"] == "ok":  # every run records its slots' decisions, the baseline none
        runs = {r["mode"]: r for r in report["dlrm_runs"]}
        assert runs["auto"]["auto"] and all("decision" in s for s in runs["auto"]["auto"])
        assert runs["uncompressed"]["auto"] is None
    a2a = {(r["mode"], r["bytes"]): r for r in report["alltoall"]}
    assert {m for m, _ in a2a} == set(netlink.A2A_MODES)
    big = max(b for _, b in a2a if b)
    assert a2a[("plain", big)]["ms_per_call"] > 0 and a2a[("plain", big)]["speedup"] == 1.0
    assert 0 < a2a[("lossy 0.03", big)]["wire_bytes"] < a2a[("plain", big)]["wire_bytes"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "speedup" in proc.stdout and "ms per call" in proc.stdout


@pytest.mark.mpi
def test_main_job_compares_over_an_emulated_link_or_says_why_not(tmp_path):
    env = _env(PY=sys.executable, OUT=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "run_main.sh"), "--steps", "3"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    emulated = proc.stdout.split("== 2. over shared memory")[0]
    if netlink.missing_requirements():
        assert "SKIPPED: cannot emulate a link: " in emulated
    else:
        rows = {line.split()[4]: line.split() for line in emulated.splitlines() if "bundled-d128" in line}
        assert set(rows) == {"uncompressed", "adaptive"}, emulated
        assert rows["uncompressed"][6] == "1.00x" and rows["adaptive"][6].endswith("x")
        report = json.loads((tmp_path / "netlink.json").read_text())
        assert [r["mode"] for r in report["dlrm"]] == ["uncompressed", "adaptive"]
        assert all(r["steps"] == 3 for r in report["dlrm_runs"])
        base, adaptive = report["dlrm"]
        # The tx_bytes deltas are real: the compressed run put fewer bytes on the link.
        assert 0 < adaptive["wire_bytes"] < base["wire_bytes"]
    assert "adaptive vs uncompressed: dAUC" in proc.stdout  # the shared-memory table follows
