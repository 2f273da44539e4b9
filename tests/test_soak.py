"""The soak harness (hvd_lossy/bench/soak.py): random compressed all-to-alls across 3 ranks,
every received element checked against what its sender had, regenerated from seeds. The
benchmark run (>= 10^5 calls) is recorded in benchmarks/RESULTS.md; here it runs at CI size,
and its checker is shown to catch what it must."""
import random
import re

import pytest
import torch

from hvd_lossy.bench import soak
from tests._launch import run_mpi


def a_call(**fields):
    c = soak.Call(random.Random(1), 7, {"world": ([0, 1], None)})
    c.__dict__.update(fields)
    return c


@pytest.mark.parametrize("spoil,what", [
    (lambda y, b: y.view(-1).__setitem__(0, y.view(-1)[0].double() + 1.5 * b), "out of bound"),
    (lambda y, b: y.__setitem__(slice(None), y.flip(0)), "rows reordered"),
    (lambda y, b: y.view(-1).__setitem__(1, 0.0), "NaN lost"),
    (lambda y, b: y.view(-1).__setitem__(2, float("-inf")), "Inf changed sign"),
])
def test_checker_counts_every_kind_of_wrong_element(spoil, what):
    c = a_call(dtype=torch.float32, trailing=(4,), mode="abs", eb=0.01, specials=False)
    ref = torch.randn(6, 4) + torch.arange(6.0)[:, None] * 10  # distinct rows
    ref.view(-1)[1], ref.view(-1)[2] = float("nan"), float("inf")
    got = ref.clone()
    checker = soak.Checker()
    checker.piece(got, ref, c, exact=False, what="clean")
    assert checker.violations == 0 and checker.elements == ref.numel()
    spoil(got, c.eb)
    checker.piece(got, ref, c, exact=False, what=what)
    assert checker.violations == 1, what


def test_checker_holds_the_own_chunk_to_bit_identity_and_shapes_to_equality():
    c = a_call(dtype=torch.float16, trailing=(2,), mode="rel", eb=0.05, specials=False)
    ref = torch.randn(3, 2).half()
    checker = soak.Checker()
    nudged = ref.clone()
    nudged[0, 0] += 0.01  # well inside 5% of the range of randn values
    assert not torch.equal(nudged, ref)
    checker.piece(nudged, ref, c, exact=False, what="within the bound")
    checker.piece(nudged, ref, c, exact=True, what="own chunk")
    checker.piece(ref[:2], ref, c, exact=False, what="rows lost")
    assert checker.violations == 2 and len(checker.first) == 2


def test_every_rank_regenerates_the_same_inputs_from_seeds():
    c = a_call(dtype=torch.bfloat16, trailing=(3, 5), specials=True, scale=1.0)
    a, b = soak.values(3, 7, 1, 20, c), soak.values(3, 7, 1, 20, c)
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert not torch.equal(soak.values(3, 7, 2, 20, c).nan_to_num(), a.nan_to_num())


@pytest.mark.mpi
@pytest.mark.parametrize("launcher,rounds", [("mpirun", 120), ("horovodrun", 10)],
                         ids=["mpirun-np3", "horovodrun-np3-gloo"])
def test_soak_of_random_compressed_alltoalls_on_3_ranks_has_no_violations(launcher, rounds,
                                                                          tmp_path):
    """Mixed dtypes, widths, zero/uneven splits, abs/rel bounds, levels, dither, NaN/Inf,
    autograd, async calls finished out of order, two overlapping process sets in flight."""
    out = run_mpi("hvd_lossy.bench", np=3, timeout=150, launcher=launcher,
                  args=["soak", "--rounds", rounds, "--json", tmp_path / "soak.json"])
    lines = re.findall(r"rank (\d): soak (\d+) calls, (\d+) elements checked, (\d+) violations",
                       out)
    assert sorted(int(r) for r, *_ in lines) == [0, 1, 2], out
    assert all(int(v) == 0 and int(n) > 0 and int(e) > 0 for _r, n, e, v in lines), out
    import json
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["violations"] == 0 and report["calls"] >= rounds and report["process_sets"]
