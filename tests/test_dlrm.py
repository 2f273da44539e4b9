"""The DLRM example (examples/dlrm): loader, synthetic data, sharding, metrics, model pieces, and
2-rank runs under mpirun."""

import itertools
import json
import os
import sys
import threading

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DLRM = os.path.join(ROOT, "examples", "dlrm")
SAMPLE = os.path.join(ROOT, "data", "criteo_kaggle_sample")
sys.path.insert(0, DLRM)

import cli  # noqa: E402
import data  # noqa: E402
import files  # noqa: E402
import sources  # noqa: E402
import metrics  # noqa: E402
import sharding  # noqa: E402
import synthetic  # noqa: E402
from exchange import EmbeddingExchange  # noqa: E402
from model import LocalTables, interact  # noqa: E402


def _row(label="0", dense=None, cats=None):
    dense = dense if dense is not None else ["1"] * 13
    cats = cats if cats is not None else ["68fd1e64"] * 26
    return "\t".join([label] + dense + cats) + "\n"


# ---------------------------------------------------------------- loader


def test_bundled_sample_loads_with_all_fields():
    labels, dense, ids = data.read_raw(os.path.join(SAMPLE, "train.txt"))
    assert labels.shape == (7200,) and dense.shape == (7200, 13) and ids.shape == (7200, 26)
    assert set(np.unique(labels)) == {0.0, 1.0}
    assert 0.18 < labels.mean() < 0.25  # the README's click rate, 0.215
    # First row of train.txt: I1=1, I4=0, I12 missing; C20 (index 19) = 07b5194c... see the file.
    with open(os.path.join(SAMPLE, "train.txt")) as f:
        fields = f.readline().rstrip("\n").split("\t")
    for j in range(13):
        want = 0.0 if fields[1 + j] == "" else np.log1p(max(int(fields[1 + j]), 0))
        assert dense[0, j] == pytest.approx(want, rel=1e-6)
    for j in range(26):
        v = fields[14 + j]
        assert ids[0, j] == (data.MISSING_ID if v == "" else int(v, 16))


def test_dense_transform_is_log1p_with_negatives_clamped_and_missing_zero():
    raw = np.array([[0.0, 3.0, -2.0]])
    missing = np.array([[False, False, False]])
    assert np.allclose(data.transform_dense(raw, missing), [[0.0, np.log(4.0), 0.0]])
    assert data.transform_dense(np.array([[5.0]]), np.array([[True]]))[0, 0] == 0.0


def test_missing_file_is_a_data_error_naming_the_path(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(data.DataError, match="nope.txt does not exist"):
        data.read_raw(str(path))
    with pytest.raises(data.DataError, match="not a folder"):
        files.load_splits(str(tmp_path / "missing_dir"))


def test_wrong_column_count_is_a_data_error_naming_the_line(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(_row() + _row() + "0\t1\t2\n")
    with pytest.raises(data.DataError, match=r"line 3 has 3 tab-separated fields, expected 40"):
        data.read_raw(str(path))


@pytest.mark.parametrize("bad, match", [
    (_row(label="2"), "label must be 0 or 1"),
    (_row(dense=["x"] + ["1"] * 12), "line 1"),
    (_row(cats=["zz"] + ["68fd1e64"] * 25), "line 1"),
    (_row(cats=["123456789"] + ["68fd1e64"] * 25), "at most 8 hex digits"),
])
def test_unparseable_field_is_a_data_error(tmp_path, bad, match):
    path = tmp_path / "train.txt"
    path.write_text(bad)
    with pytest.raises(data.DataError, match=match):
        data.read_raw(str(path))


def test_vocabulary_maps_unseen_ids_to_the_oov_row_and_orders_by_frequency():
    ids = np.array([[5], [7], [7], [9], [7], [9]], np.uint64)
    vocab = data.Vocabulary.fit(ids)
    assert vocab.cardinalities == [4]  # OOV + 3 seen ids
    enc = vocab.encode(np.array([[7], [9], [5], [1234]], np.uint64))
    assert enc[:, 0].tolist() == [1, 2, 3, 0]
    capped = data.Vocabulary.fit(ids, max_table_rows=2)
    assert capped.cardinalities == [2]
    assert capped.encode(np.array([[7], [9]], np.uint64))[:, 0].tolist() == [1, 0]


def test_load_splits_encodes_every_split_within_its_tables():
    for mode, cap in (("vocab", None), ("hash", 1000)):
        splits = files.load_splits(SAMPLE, mode, cap)
        assert set(splits) == {"train", "dev", "test"}
        for ds in splits.values():
            assert ds.sparse.min() >= 0
            assert (ds.sparse < np.array(ds.cardinalities)).all()
        if cap:
            assert max(splits["train"].cardinalities) == cap
    # Vocabulary from train: every train id has its own row, so no train id is OOV.
    assert (files.load_splits(SAMPLE)["train"].sparse > 0).all()


# ---------------------------------------------------------------- real data folders

FIXTURES = os.path.join(ROOT, "tests", "data")  # provenance in tests/data/README.md
DAYS = os.path.join(FIXTURES, "terabyte_days")
SHARED_1TB = "/work/shared/data/criteo_1tb_sample/sample.txt"


def test_kaggle_folder_with_unlabelled_test_txt_leaves_it_out_and_says_what_is_held_out():
    layout = files.find_layout(os.path.join(FIXTURES, "kaggle_unlabelled_test"))
    assert [os.path.basename(p) for p in layout.train] == ["train.txt"] and layout.held_out == []
    assert "test.txt has no labels (39 fields" in layout.notes[0]
    assert "held out: the last 10% of the training rows" in layout.notes[1]
    with pytest.raises(data.DataError, match="39 tab-separated fields, expected 40 .*: no label"):
        data.read_raw(os.path.join(FIXTURES, "kaggle_unlabelled_test", "test.txt"))


def test_terabyte_days_train_in_day_order_and_hold_out_the_last_day(tmp_path):
    layout = files.find_layout(DAYS)
    assert layout.kind == "terabyte"
    assert [os.path.basename(p) for p in layout.train] == ["day_0.gz", "day_1.gz"]
    assert [os.path.basename(p) for p in layout.held_out] == ["day_2.gz"]
    assert layout.notes == ["held out: day_2.gz (the last day present)"]
    for name in ("day_10", "day_2", "day_0.gz"):
        (tmp_path / name).write_text(_row())
    assert [os.path.basename(p) for p in files.find_layout(str(tmp_path)).train] == ["day_0.gz", "day_2"]
    (tmp_path / "day_2.gz").write_text("")
    with pytest.raises(data.DataError, match="day_2 twice"):
        files.find_layout(str(tmp_path))
    with pytest.raises(data.DataError, match="neither train.txt .* nor day_0 ... day_23"):
        files.find_layout(str(tmp_path / ".."))


def test_gzipped_day_files_hold_the_shared_sample_rows_unchanged():
    if not os.path.exists(SHARED_1TB):
        pytest.skip("the shared data folder is not on this machine")
    layout = files.find_layout(DAYS)
    labels, dense, ids = files.read_rows(layout.train + layout.held_out, 0, None)
    want = data.read_raw(SHARED_1TB)
    assert all(np.array_equal(a, b) for a, b in zip((labels, dense, ids), want))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_stream_gives_each_rank_its_slice_of_each_global_batch_across_files(world):
    paths = files.find_layout(DAYS).train  # 400 rows each
    labels, _, ids = (np.concatenate(x) for x in zip(*(data.read_raw(p) for p in paths)))
    big_b, b = 66 * world, 66  # some batch spans day_0 and day_1 at every world size
    streams = [files.RowStream(paths, big_b, 800) for _ in range(world)]  # one per rank
    for k in list(range(800 // big_b)) + [1]:  # in order, then back (a resumed run reopens)
        for r in range(world):
            got_labels, _, got_ids = streams[r].batch(0, k, r, world)
            lo = k * big_b + r * b
            assert np.array_equal(got_ids, ids[lo:lo + b]), (k, r)
            assert np.array_equal(got_labels, labels[lo:lo + b]), (k, r)
    stream = files.RowStream(paths, 64, 10_000)
    with pytest.raises(data.DataError, match="ended after 800 rows, before batch 13"):
        for k in range(13):
            stream.batch(0, k, 0, 1)


def test_a_terabyte_folder_streams_by_default_with_hashed_ids_and_capped_tables():
    args = cli.parser().parse_args(["--data", DAYS, "--batch-size", "64"])
    cli.check(args, 2)
    source, notes = sources.build(args, 2)
    assert isinstance(source, sources.StreamSource) and args.categorical == "hash"
    assert source.cardinalities == [min(c, 100_000) for c in data.TERABYTE_CARDINALITIES]
    assert source.steps_per_epoch == 800 // 64 and source.n_eval == 200
    assert any("streaming day_0.gz, day_1.gz in order" in n for n in notes)
    _, sparse, _ = source.batch(0, 0, 1, 2)
    assert sparse.shape == (32, 26) and (sparse < torch.tensor(source.cardinalities)).all()
    vocab = cli.parser().parse_args(["--data", DAYS, "--categorical", "vocab"])
    cli.check(vocab, 2)
    with pytest.raises(data.DataError, match="--stream .* needs --categorical hash"):
        sources.build(vocab, 2)


# ---------------------------------------------------------------- synthetic data


def test_synthetic_rows_depend_only_on_seed_not_on_how_they_are_read():
    a = synthetic.SyntheticCriteo(20000, 1000, seed=3, max_table_rows=50000)
    b = synthetic.SyntheticCriteo(20000, 1000, seed=3, max_table_rows=50000)
    whole = a.rows("train", 0, 12000)
    parts = [b.rows("train", lo, hi) for lo, hi in ((0, 1), (1, 5000), (5000, 12000))]
    for x, y in zip(whole, (np.concatenate(p) for p in zip(*parts))):
        assert np.array_equal(x, y)
    other = synthetic.SyntheticCriteo(20000, 1000, seed=4, max_table_rows=50000).rows("train", 0, 12000)
    assert not np.array_equal(whole[1], other[1])
    assert not np.array_equal(a.rows("test", 0, 1000)[1], whole[1][:1000])


def test_synthetic_rows_far_into_a_large_stream_need_only_their_chunk():
    gen = synthetic.SyntheticCriteo(50_000_000, 10, seed=1, max_table_rows=1000)
    dense, sparse, labels = gen.rows("train", 40_000_000, 40_000_100)
    assert dense.shape == (100, 13) and sparse.shape == (100, 26) and labels.shape == (100,)
    assert len(gen._cache) == 1


def test_synthetic_tables_are_capped_kaggle_sizes_with_zipf_skew():
    gen = synthetic.SyntheticCriteo(40000, 10, seed=0, max_table_rows=100000)
    assert gen.cardinalities == [min(c, 100000) for c in data.KAGGLE_CARDINALITIES]
    _, sparse, _ = gen.rows("train", 0, 40000)
    assert (sparse >= 0).all() and (sparse < np.array(gen.cardinalities)).all()
    big = sparse[:, 2]  # 100,000-row table: the head holds much more than a uniform share
    top10 = np.sort(np.bincount(big))[::-1][:10].sum() / len(big)
    assert top10 > 0.2  # uniform would give 1e-4


def test_synthetic_labels_carry_the_planted_teacher_signal():
    gen = synthetic.SyntheticCriteo(30000, 10, seed=2, max_table_rows=100000)
    dense, sparse, labels = gen.rows("train", 0, 30000)
    assert 0.15 < labels.mean() < 0.35
    teacher = gen.teacher_logit(dense, sparse)
    assert metrics.auc(labels, teacher) > 0.75
    # The signal is in the ids, where the embeddings must find it: the id part alone beats chance.
    assert metrics.auc(labels, gen.teacher_logit(np.zeros_like(dense), sparse)) > 0.7


# ---------------------------------------------------------------- sharding


def _brute_force_makespan(sizes, world):
    return min(max(sharding.loads(list(p), sizes, world))
               for p in itertools.product(range(world), repeat=len(sizes)))


def test_placement_is_greedy_largest_first_onto_least_loaded_rank():
    # 9 -> rank 0; 7 -> rank 1; 5 -> rank 1 (load 7 < 9); 1 -> rank 0 (load 9 < 12).
    assert sharding.place_tables([5, 9, 1, 7], 2) == [1, 0, 0, 1]
    owners = sharding.place_tables(data.KAGGLE_CARDINALITIES, 4)
    assert sorted(set(owners)) == [0, 1, 2, 3]
    assert owners == sharding.place_tables(data.KAGGLE_CARDINALITIES, 4)


@pytest.mark.parametrize("seed", range(5))
def test_placement_load_is_within_four_thirds_of_optimal(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 100, 8).tolist()
    for world in (2, 3):
        greedy = max(sharding.loads(sharding.place_tables(sizes, world), sizes, world))
        assert greedy <= 4 / 3 * _brute_force_makespan(sizes, world)


def test_placement_balances_the_kaggle_tables_on_two_ranks():
    sizes = [min(c, 100000) for c in data.KAGGLE_CARDINALITIES]
    load = sharding.loads(sharding.place_tables(sizes, 2), sizes, 2)
    assert max(load) - min(load) <= max(sizes)
    assert sharding.tables_of([1, 0, 1], 1) == [0, 2]


# ---------------------------------------------------------------- metrics


def _pairwise_auc(labels, scores):
    pos = scores[labels == 1]
    neg = scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_auc_equals_brute_force_pairwise_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 20, 300).astype(float) + labels * rng.integers(0, 3)  # many ties
    assert metrics.auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_auc_of_one_class_is_nan_and_metrics_match_definitions():
    assert np.isnan(metrics.auc(np.ones(4), np.arange(4.0)))
    ev = metrics.evaluate(np.array([1.0, 0.0]), np.array([0.0, -2.0]))
    p = 1 / (1 + np.exp(2.0))
    assert ev["logloss"] == pytest.approx(-(np.log(0.5) + np.log(1 - p)) / 2)
    assert ev["accuracy"] == 0.5 and ev["auc"] == 1.0


# ---------------------------------------------------------------- model and exchange


def test_interaction_is_all_pairwise_dots_after_the_bottom_output():
    torch.manual_seed(0)
    bottom, lookups = torch.randn(3, 4), torch.randn(3, 5, 4)
    out = interact(bottom, lookups)
    feats = [bottom] + [lookups[:, t] for t in range(5)]
    want = [(feats[i] * feats[j]).sum(1) for i in range(6) for j in range(i)]
    assert out.shape == (3, 4 + 15)
    assert torch.allclose(out[:, :4], bottom)
    assert torch.allclose(out[:, 4:], torch.stack(want, 1), atol=1e-6)


def test_table_init_depends_on_table_and_seed_not_on_owner():
    cards = [10, 20, 30]
    a = LocalTables(cards, [0, 2], 4, seed=7)
    b = LocalTables(cards, [2], 4, seed=7)
    assert torch.equal(a.tables[1].weight, b.tables[0].weight)
    assert not torch.equal(LocalTables(cards, [2], 4, seed=8).tables[0].weight, b.tables[0].weight)


class _ThreadWorld:
    """alltoall/allgather among threads, to check the exchange's layout without MPI."""

    def __init__(self, world):
        self.world, self.box = world, {}
        self.barrier = threading.Barrier(world)

    def ops(self, rank):
        def allgather(t):
            self.box[("g", rank)] = t
            self.barrier.wait()
            out = torch.cat([self.box[("g", r)] for r in range(self.world)])
            self.barrier.wait()
            return out

        def alltoall(t, splits):
            self.box[("a", rank)] = (t, splits.tolist())
            self.barrier.wait()
            got = []
            for src in range(self.world):
                st, ss = self.box[("a", src)]
                got.append(st[sum(ss[:rank]):sum(ss[:rank + 1])])
            self.barrier.wait()
            return torch.cat(got), None
        return alltoall, allgather


@pytest.mark.parametrize("world", [1, 2, 3])
def test_exchange_gives_each_rank_all_tables_for_its_rows_in_global_order(world):
    cards = [17, 5, 40, 9, 23, 11, 8]
    dim, b = 3, 4
    owners = sharding.place_tables(cards, world)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(np.stack([rng.integers(0, c, b * world) for c in cards], 1))
    full = LocalTables(cards, range(len(cards)), dim, seed=1)
    want = full(ids).transpose(0, 1)  # (B, T, D)
    tw, results = _ThreadWorld(world), {}

    def run(rank):
        a2a, ag = tw.ops(rank)
        ex = EmbeddingExchange(owners, rank, world, a2a, ag)
        tables = LocalTables(cards, sharding.tables_of(owners, rank), dim, seed=1)
        with torch.no_grad():
            results[rank] = ex.exchange(tables(ex.gather_ids(ids[rank * b:(rank + 1) * b])), b)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for r in range(world):
        assert torch.equal(results[r], want[r * b:(r + 1) * b])


def test_exchange_sends_each_rows_id_beside_it_with_send_ids():
    cards = [17, 5, 40, 9, 23, 11, 8]
    dim, b, world, rank = 3, 4, 2, 1
    owners = sharding.place_tables(cards, world)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(np.stack([rng.integers(0, c, b * world) for c in cards], 1))
    tables = LocalTables(cards, sharding.tables_of(owners, rank), dim, seed=1)
    sent = {}

    def start(tensor, splits, **kwargs):
        sent.update(tensor=tensor.detach(), **kwargs)
        return lambda: (tensor, splits)
    for send_ids in (False, True):  # the last: with ids
        sent.clear()
        ex = EmbeddingExchange(owners, rank, world, None, lambda t: t, alltoall_start=start,
                               send_ids=send_ids)
        with torch.no_grad():
            ex.start(tables(ids), b, ids)
        assert ("ids" in sent) == send_ids
    local = sharding.tables_of(owners, rank)
    # sent row i: destination i // (n_local b), table (i // b) % n_local: that table's row of its id
    for i, (row, key) in enumerate(zip(sent["tensor"], sent["ids"].tolist())):
        table = (i // b) % len(local)
        assert torch.equal(row, tables.tables[table].weight[key].detach()), i


def test_ids_apply_only_to_compressors_that_code():
    with pytest.raises(cli.UsageError, match="--ids applies to --compression lossy or adaptive, "
                                             "got --compression none"):
        cli.check(cli.parser().parse_args(["--ids"]), 2)
    cli.check(cli.parser().parse_args(["--compression", "lossy", "--ids"]), 2)


# ---------------------------------------------------------------- per-table lossy frames


def test_lossy_frames_cut_each_chunk_into_one_frame_per_table_both_ways():
    from frames import table_compressors
    fwd = table_compressors(0.03, "rel", 1, "same", [["C1", "C2"], ["C3"]], rank=0)
    assert fwd.plan([8, 8]) == [(0, 4, 0.03), (0, 4, 0.03), (1, 4, 0.03), (1, 4, 0.03)]
    bwd = fwd.for_backward()
    assert bwd.plan([8, 4]) == [(0, 4, 0.03), (0, 4, 0.03), (1, 4, 0.03)]
    with pytest.raises(ValueError, match="not divisible"):
        fwd.plan([7, 8])
    assert table_compressors(0.03, "rel", 1, 0.01, [["C1"]], 0).for_backward().error_bound == 0.01
    assert table_compressors(0.03, "rel", 2, None, [["C1"]], 0).for_backward().__name__ == "NoneCompressor"


def test_table_frames_bound_each_table_by_its_own_range_and_count_its_bytes():
    import hvd_lossy
    from frames import table_compressors
    torch.manual_seed(0)
    wide, narrow = torch.rand(16, 8) * 2 - 1, (torch.rand(16, 8) * 2 - 1) * 1e-3
    chunk = torch.cat([wide, narrow])
    comp = table_compressors(0.03, "rel", 1, "same", [["wide", "narrow"]], rank=0)
    plan = comp.plan([32])
    rows, bounds = [p[1] for p in plan], [p[2] for p in plan]
    out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, [8], [len(rows)], 0), dtype=torch.uint8)
    # One frame of a segment a table, as the all-to-all sends it; sizes are a segment each.
    sizes = hvd_lossy.compress_grouped(chunk, rows, bounds, [len(rows)], 0, out, mode="rel")
    comp.after_compress(plan, sizes, chunk)
    got_narrow = hvd_lossy.decompress(out[:sum(sizes)])[16:]
    span = (narrow.max() - narrow.min()).item()
    # One mixed frame would allow errors of 3% of the wide table's range, 1000x the narrow values.
    assert (got_narrow.double() - narrow.double()).abs().max().item() <= 0.03 * span
    assert comp.table_bytes == {"wide": [16 * 8 * 4, sizes[0]], "narrow": [16 * 8 * 4, sizes[1]]}


# ---------------------------------------------------------------- benchmark summary


def _run(label, seed, auc, logloss, ratio, checksum="c"):
    return {"label": label, "compression": label, "auc": auc, "logloss": logloss, "compression_ratio": ratio,
            "a2a_bytes_sent": 100 / ratio, "a2a_bytes_plain": 100, "train_seconds": 1.0, "steps": 5,
            "data_checksum": checksum + str(seed), "args": {"synthetic": 1000, "data": "x", "seed": seed}}


def test_quality_summary_pairs_compressed_runs_with_the_uncompressed_run_of_the_same_seed():
    import quality
    runs = [_run("none", 0, 0.70, 0.50, 1), _run("none", 1, 0.74, 0.48, 1),
            _run("lossy", 0, 0.7005, 0.501, 20), _run("lossy", 1, 0.7390, 0.479, 20)]
    res = quality.summarise(runs)["synthetic_1000"]
    assert res["none"]["auc_spread"] == pytest.approx(0.04)
    assert res["lossy"]["dauc"] == pytest.approx([0.0005, -0.001])
    assert res["lossy"]["dauc_mean"] == pytest.approx(-0.00025)
    assert res["lossy"]["same_data"] is True
    assert all(res["lossy"]["meets_targets"].values())
    runs[2]["data_checksum"] = "other"
    assert quality.summarise(runs)["synthetic_1000"]["lossy"]["same_data"] is False


# ---------------------------------------------------------------- plots


def test_plot_titles_wrap_a_long_compressor_and_lead_with_the_run_label():
    import plots
    m = {"label": "adaptive", "world": 2, "batch_size": 128, "compressor": "adaptive(" + "x=1, " * 40 + ")"}
    lines = plots._title(m).split("\n")
    assert lines[0] == "adaptive, 2 ranks, batch 128" and len(lines) > 2
    assert max(len(line) for line in lines) <= 80


def test_tables_plot_puts_every_table_at_its_own_index_under_its_name(tmp_path, monkeypatch):
    import plots
    drawn = {}
    monkeypatch.setattr(plots.plt.Axes, "set_xticks",
                        lambda self, ticks, labels=None, **kw: drawn.update(ticks=list(ticks), labels=list(labels)))
    names = data.TABLE_NAMES
    tables = {n: {"bound": 0.01 * (i + 1), "ratio": float(i), "bwd_ratio": 1.0} for i, n in enumerate(names)}
    m = {"label": "lossy", "world": 2, "batch_size": 128, "table_names": names, "tables": tables}
    assert plots._tables(m, str(tmp_path)).endswith("tables.png")
    assert drawn["labels"] == names and drawn["ticks"] == list(range(26))  # C1..C26, not C1, C10, ...


# ---------------------------------------------------------------- command line


def test_batch_size_not_divisible_by_ranks_is_a_usage_error():
    args = cli.parser().parse_args(["--batch-size", "101"])
    with pytest.raises(cli.UsageError, match="--batch-size 101 is not divisible by the 2 ranks"):
        cli.check(args, 2)


def test_default_gradient_bound_is_the_measured_recipe_in_rel_mode_and_same_in_abs():
    rel = cli.parser().parse_args([])
    cli.check(rel, 2)
    assert rel.backward_error_bound == cli.DEFAULT_GRAD_BOUND == 0.02 and rel.dither == "backward"
    absolute = cli.parser().parse_args(["--eb-mode", "abs", "--error-bound", "1e-4"])
    cli.check(absolute, 2)
    assert absolute.backward_error_bound == "same"
    explicit = cli.parser().parse_args(["--backward-error-bound", "none"])
    cli.check(explicit, 2)
    assert explicit.backward_error_bound == "none"


def test_help_shows_defaults_and_the_choices_of_policy_and_schedule():
    text = " ".join(cli.parser().format_help().split())
    assert "--embedding-dim EMBEDDING_DIM embedding width D (default: 16)" in text
    assert "{budget,paper,sensitivity,uniform}" in text and "{step,linear,log,constant}" in text
    assert "(default: None)" not in text  # None defaults say what they mean in words


def test_default_batch_is_128_rounded_down_to_a_multiple_of_the_ranks():
    for world, batch in ((1, 128), (2, 128), (3, 126), (5, 125)):
        args = cli.parser().parse_args([])
        cli.check(args, world)
        assert args.batch_size == batch, (world, args.batch_size)


@pytest.mark.parametrize("flags", [["--policy", "uniform"], ["--schedule", "log"],
                                   ["--interval", "5"], ["--grad-base", "0.02"]])
def test_adaptive_only_flags_are_refused_with_other_compressions(flags):
    with pytest.raises(cli.UsageError, match="%s applies only to --compression adaptive, got "
                                             "--compression lossy" % flags[0]):
        cli.check(cli.parser().parse_args(["--compression", "lossy", *flags]), 2)
    cli.check(cli.parser().parse_args(["--compression", "adaptive", *flags]), 2)


def test_step_log_prints_samples_per_second_every_n_steps_and_at_the_end(capsys):
    import train
    log = train.StepLog(total=7, batch_size=64, every=3)
    for step in range(1, 8):
        log.step(step, 0.5)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["3/7", "6/7", "7/7"]
    assert all(line.endswith("samples/s") for line in lines)
    assert train._log_every(None, 7812) == 781 and train._log_every(0, 10) == 0


def test_compare_on_a_missing_file_is_one_line_and_status_2(tmp_path):
    import subprocess
    proc = subprocess.run([sys.executable, os.path.join(DLRM, "compare.py"), str(tmp_path / "x.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "compare.py: error: cannot read metrics file" in proc.stderr and "x.json" in proc.stderr


def test_overlap_with_plain_horovod_is_a_usage_error():
    args = cli.parser().parse_args(["--plain-horovod", "--overlap"])
    with pytest.raises(cli.UsageError, match="--overlap needs hvd_lossy's differentiable alltoall_async"):
        cli.check(args, 2)


@pytest.mark.parametrize("flags,named", [
    ([], "--compression none --backend horovod"),
    (["--compression", "lossy", "--backend", "torch"], "--compression lossy --backend torch"),
    (["--compression", "lossy", "--auto"], "--compression lossy --backend horovod --auto"),
])
def test_dense_compression_needs_a_lossy_all_to_all_on_horovod_without_auto(flags, named):
    args = cli.parser().parse_args(["--dense-compression", "same", *flags])
    with pytest.raises(cli.UsageError, match="--dense-compression same needs --compression lossy "
                       "or adaptive on the horovod backend without --auto, got " + named):
        cli.check(args, 2)
    cli.check(cli.parser().parse_args(["--dense-compression", "same", "--compression", "lossy"]), 2)


def test_dense_compression_takes_a_bound_of_its_own_for_the_optimizers_gradient_coding():
    import comm
    args = cli.parser().parse_args(["--compression", "lossy", "--dense-compression", "0.01"])
    cli.check(args, 2)
    coding = comm.dense_compression(args).for_backward()  # what the optimizer codes with
    assert (coding.error_bound, coding.mode, coding.dither) == (0.01, "rel", True)
    same = cli.parser().parse_args(["--compression", "lossy", "--dense-compression", "same"])
    cli.check(same, 2)
    assert comm.dense_compression(same).for_backward().error_bound == cli.DEFAULT_GRAD_BOUND
    for bad in ("-0.5", "tight"):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(["--dense-compression", bad])


def test_one_row_tables_are_a_usage_error():
    with pytest.raises(cli.UsageError, match="--max-table-rows must be >= 2"):
        cli.check(cli.parser().parse_args(["--max-table-rows", "1"]), 2)


# ---------------------------------------------------------------- 2-rank runs


@pytest.mark.mpi
def test_two_rank_runs_reproduce_plain_horovod_and_see_the_same_data(tmp_path):
    from tests._launch import run_mpi
    out = run_mpi("tests/mp/dlrm_smoke.py", np=2, args=[tmp_path], timeout=240)
    assert out.count("dlrm_smoke rank") == 2


@pytest.mark.mpi
def test_nonsense_input_gives_one_clear_message_and_exit_status_2_on_every_rank(tmp_path):
    from tests._launch import run_mpi
    out = run_mpi("tests/mp/dlrm_errors.py", np=2, args=[tmp_path], timeout=120)
    assert out.count("dlrm_errors rank") == 2


@pytest.mark.mpi
def test_train_script_runs_under_horovodrun_and_writes_metrics(tmp_path):
    from tests._launch import run_mpi
    metrics_path = tmp_path / "m.json"
    run_mpi("examples/dlrm/train.py", np=2, launcher="horovodrun", timeout=180,
            args=["--steps", "4", "--batch-size", "256", "--eval-points", "0", "--no-progress",
                  "--compression", "adaptive", "--metrics-out", metrics_path])
    m = json.loads(metrics_path.read_text())
    assert m["world"] == 2 and m["steps"] == 4 and m["compression_ratio"] > 1


@pytest.mark.mpi
def test_a_saved_and_resumed_run_continues_exactly_where_the_whole_run_goes(tmp_path):
    from tests._launch import run_mpi
    common = ["--steps", "6", "--eval-points", "0", "--batch-size", "256", "--max-eval-rows", "256"]

    def run(name, *extra, steps="6"):
        run_mpi("examples/dlrm/train.py", np=2, timeout=180, args=[
            *common[:1], steps, *common[2:], "--metrics-out", tmp_path / name, *extra])
        return json.loads((tmp_path / name).read_text())
    whole = run("whole.json")
    run("first.json", "--save", tmp_path / "ckpt", steps="3")
    resumed = run("resumed.json", "--resume", tmp_path / "ckpt")
    assert resumed["steps"] == 6 and resumed["loss_curve"] == whole["loss_curve"][3:]
    assert (resumed["auc"], resumed["logloss"]) == (whole["auc"], whole["logloss"])


# ---------------------------------------------------------------- --auto


def test_auto_applies_only_to_compressors_that_can_take_it():
    with pytest.raises(cli.UsageError, match="--auto applies to --compression lossy or adaptive, got --compression fp16"):
        cli.check(cli.parser().parse_args(["--compression", "fp16", "--auto"]), 2)
    cli.check(cli.parser().parse_args(["--compression", "adaptive", "--auto"]), 2)


@pytest.mark.parametrize("frames", ["table", "destination"])
def test_auto_reaches_the_forward_and_gradient_compressors(frames):
    import comm
    for auto in (False, True):
        args = cli.parser().parse_args(["--compression", "lossy", "--lossy-frames", frames,
                                        *(["--auto"] if auto else [])])
        cli.check(args, 2)
        compressor, _ = comm.make_compression(args, [0, 1] * 13, 0, 2, [10] * 26, total_steps=10)
        assert compressor.auto is auto and compressor.for_backward().auto is auto, (frames, auto)


# ---------------------------------------------------------------- --device, --backend local


def _train_metrics(tmp_path, name, *flags, horovod_importable=True):
    """Runs train.py in a fresh interpreter (no launcher) and returns its metrics. Without
    horovod_importable, `import horovod` fails in it, as on a GPU machine without Horovod."""
    import subprocess
    out = tmp_path / name
    block = "" if horovod_importable else "sys.modules['horovod'] = None; "
    code = ("import runpy, sys; %ssys.argv = ['train.py'] + sys.argv[1:]; "
            "runpy.run_path(%r, run_name='__main__')" % (block, os.path.join(DLRM, "train.py")))
    proc = subprocess.run([sys.executable, "-c", code, "--steps", "3", "--eval-points", "0",
                           "--no-progress", "--max-eval-rows", "256", "--metrics-out", str(out),
                           *flags], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_device_is_cpu_unless_asked_and_an_unknown_one_is_refused_by_name(capsys):
    assert cli.parser().parse_args([]).device == "cpu"
    assert cli.parser().parse_args(["--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(["--device", "tpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--device" in err and "'tpu'" in err and "'cuda'" in err


def test_device_cuda_without_cuda_is_a_usage_error_naming_it(monkeypatch):
    args = cli.parser().parse_args(["--device", "cuda"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(cli.UsageError, match=r"--device cuda: torch .* sees no CUDA device.*use --device cpu"):
        cli.check_device(args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cli.check_device(args)  # accepted where torch sees a GPU
    cli.check_device(cli.parser().parse_args(["--device", "cpu"]))


def test_train_with_device_cuda_and_no_gpu_exits_2_with_one_line(tmp_path):
    import subprocess
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is valid here")
    proc = subprocess.run([sys.executable, os.path.join(DLRM, "train.py"), "--backend", "local",
                           "--device", "cuda", "--steps", "1"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("train.py: error: --device cuda: torch %s sees no CUDA device "
                                   "(torch.cuda.is_available() is False; built for CUDA %s); "
                                   "use --device cpu" % (torch.__version__,
                                                         torch.version.cuda or "none"))


def test_local_backend_under_a_launcher_of_several_processes_is_a_usage_error(monkeypatch):
    for name in cli.SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    args = cli.parser().parse_args(["--backend", "local"])
    cli.check_device(args)  # one process, no launcher
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(cli.UsageError, match="--backend local is one process, but the launcher started 2"):
        cli.check_device(args)
    cli.check_device(cli.parser().parse_args(["--backend", "horovod"]))


def test_local_rank_comes_from_the_backend_else_the_launchers_environment(monkeypatch):
    import backend
    for name in backend.LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(backend.hvd, "_impl", None)
    assert backend.local_rank() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert backend.local_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "5")  # torchrun's name is trusted first
    assert backend.local_rank() == 5

    class Horovod:
        def local_rank(self):
            return 1
    monkeypatch.setattr(backend.hvd, "_impl", Horovod())
    assert backend.local_rank() == 1


def test_every_mode_starts_horovod_through_hvd_lossys_init_so_mpi_starts_alike(monkeypatch):
    import backend
    called = []

    class Module:
        def __init__(self, name):
            self.name = name

        def init(self):
            called.append(self.name)
    monkeypatch.setattr(backend.hvd, "_impl", Module("horovod.torch"))
    monkeypatch.setattr(backend._lossy, "_impl", Module("hvd_lossy.torch"))
    monkeypatch.setattr(backend, "_chosen", "horovod")  # --plain-horovod runs choose it too
    backend.init()
    monkeypatch.setattr(backend, "_chosen", "local")
    backend.init()
    assert called == ["hvd_lossy.torch", "horovod.torch"]


def test_one_rank_alltoall_hands_back_the_rank_its_own_chunk_and_refuses_other_splits():
    import backend
    lossy = backend._LocalLossy()
    x = torch.randn(6, 4, requires_grad=True)
    out, recv = lossy.alltoall(x, torch.tensor([6], dtype=torch.int32),
                               compression=lossy.Compression.lossy(0.5))
    assert torch.equal(out, x) and out is not x and recv.tolist() == [6]
    out.sum().backward()  # autograd runs through it, as through Horovod's
    assert torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(ValueError, match=r"one rank sends all 6 rows to itself, got splits \[3, 3\]"):
        lossy.alltoall(x, [3, 3])


def test_device_cpu_trains_as_before_in_one_process_without_horovod(tmp_path):
    before = _train_metrics(tmp_path, "before.json", "--backend", "local")
    cpu = _train_metrics(tmp_path, "cpu.json", "--backend", "local", "--device", "cpu",
                         "--compression", "lossy", horovod_importable=False)
    assert before["device"] == cpu["device"] == "cpu" and cpu["steps"] == 3
    # one rank keeps its chunk: the lossy run is the plain run's numbers, bit for bit
    assert cpu["loss_curve"] == before["loss_curve"]
    assert (cpu["auc"], cpu["logloss"]) == (before["auc"], before["logloss"])


@pytest.mark.mpi
def test_one_process_local_run_is_the_one_rank_horovod_run(tmp_path):
    from tests._launch import run_mpi
    run_mpi("examples/dlrm/train.py", np=1, timeout=180, args=[
        "--steps", "3", "--eval-points", "0", "--no-progress", "--max-eval-rows", "256",
        "--device", "cpu", "--metrics-out", tmp_path / "hvd.json"])
    horovod = json.loads((tmp_path / "hvd.json").read_text())
    local = _train_metrics(tmp_path, "local.json", "--backend", "local")
    assert local["loss_curve"] == horovod["loss_curve"] and local["world"] == horovod["world"] == 1
    assert local["data_checksum"] == horovod["data_checksum"]
