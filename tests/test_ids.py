"""Rows' ids (`ids=`): duplicates found by the caller's keys instead of by hashing every row.

  - The frames are the bytes of content dedup, for every dtype, level and bound (lossless
    too), and for ids that lie: ids change the speed, never the frame.
  - Ids that lie (one id for rows that differ, NaN and Inf rows among them, rows one ulp apart)
    still decode within the bound on every element: the encoder compares each claimed
    duplicate's bits with its id's first row and codes a row that differs as its own.
  - The first stage numbers rows by id (the test hook): rows equal in bits under two ids stay
    apart there, which the second stage (equal codes) joins again.
  - Bad ids raise naming the value and what was expected; in a collective, on every rank
    (tests/mp/transport_ids.py under mpirun, tests/mp/dist_ids.py under torchrun).
  - Rows flagged in `_zero_rows` (hvd_lossy.reuse's references, filled with +0.0) are taken
    for one row each piece, in their place in the numbering, without being read: the same
    frames as their zeros coded by id.
"""
import _hl_test  # the test-only native hooks (tests/_hooks.py)
import pytest
import torch

import hvd_lossy
from tests._launch import assert_every_rank_passed, on_every_kernel_path, run_mpi

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def drawn(rows=600, dim=16, table_rows=40, seed=0, dtype=torch.float32):
    """Lookups of a small table (rows 5 and 7 equal in bits under their two ids) and their ids."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(table_rows, dim, generator=g)
    table[7] = table[5]
    ids = torch.randint(0, table_rows, (rows,), generator=g)
    return table[ids].to(dtype), ids


def lies(ids, kind):
    if kind == "truth":
        return ids
    if kind == "one id":
        return torch.zeros_like(ids)
    return torch.randint(0, 7, ids.shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level,eb,mode", [(1, 0.03, "rel"), (2, 0.03, "rel"), (1, 0.25, "abs")])
@pytest.mark.parametrize("kind", ["truth", "one id", "random ids"])
def test_lossy_frames_with_ids_are_the_bytes_of_content_dedup(dtype, level, eb, mode, kind):
    x, ids = drawn(dtype=dtype)
    rows = [100, 0, 250, 250]  # pieces, each its own segment and its own ids' scope
    by_content, sizes = hvd_lossy.compress_chunks(x, rows, eb, mode=mode, level=level)
    by_id, _ = hvd_lossy.compress_chunks(x, rows, eb, mode=mode, level=level, ids=lies(ids, kind))
    assert torch.equal(by_id, by_content)
    assert hvd_lossy.frame_info(by_id)["segments"][0]["n_unique"] < 100  # duplicates were found
    out = torch.empty(sum(rows), 16, dtype=dtype)
    cap = hvd_lossy.max_grouped_bytes(rows, [16], [2, 2], 4)
    grouped = torch.zeros(cap, dtype=torch.uint8)
    got = hvd_lossy.compress_grouped(x, rows, [eb] * 4, [2, 2], 4, grouped, mode=mode,
                                     level=level, ids=lies(ids, kind))
    plain = torch.zeros(cap, dtype=torch.uint8)
    assert got == hvd_lossy.compress_grouped(x, rows, [eb] * 4, [2, 2], 4, plain, mode=mode,
                                             level=level)
    assert torch.equal(grouped, plain)
    assert torch.equal(hvd_lossy.decompress(by_id, out=out), hvd_lossy.decompress(by_content))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("kind", ["truth", "random ids"])
def test_ids_give_content_dedups_bytes_where_rows_mix_byte_and_wide_codes(dtype, level, kind):
    """Rows whose codes fit a byte beside rows whose do not (codes of 256 and more, outliers'
    marks for NaN and Inf), in rows of 13 elements: the id path keeps some rows' codes as bytes
    and others' as 32-bit codes, and must still write content dedup's frame."""
    x, ids = drawn(dim=13, table_rows=60, dtype=torch.float32)
    x[ids % 3 == 0] *= 1e-3  # a third of the ids: codes below 256 at abs 1e-3
    x[ids == 11, 2] = float("nan")
    x[ids == 12, 5] = float("inf")
    x = x.to(dtype)
    rows = [300, 300]
    by_content, _ = hvd_lossy.compress_chunks(x, rows, 1e-3, mode="abs", level=level)
    by_id, _ = hvd_lossy.compress_chunks(x, rows, 1e-3, mode="abs", level=level,
                                         ids=lies(ids, kind))
    assert torch.equal(by_id, by_content)
    assert hvd_lossy.frame_info(by_id)["segments"][0]["n_unique"] < 300  # duplicates were found
    back = hvd_lossy.decompress(by_id)
    finite = torch.isfinite(x)
    assert torch.equal(back[~finite].isnan(), x[~finite].isnan())
    assert (back[finite].double() - x[finite].double()).abs().max() <= 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["truth", "one id"])
def test_lossless_frames_with_ids_decode_bit_for_bit(dtype, kind):
    # Lossless frames have no stage that merges equal codes, so rows 5 and 7 of the table
    # (equal bits, two ids) stay apart: one row more than by content, the same values. Ids
    # that lie lose a lossless frame the duplicates they hide (never a value).
    x, ids = drawn(dtype=dtype)
    by_content, _ = hvd_lossy.compress_chunks(x, [600], 0.0)
    by_id, _ = hvd_lossy.compress_chunks(x, [600], 0.0, ids=lies(ids, kind))
    decoded = hvd_lossy.decompress(by_id)
    assert torch.equal(decoded.view(torch.uint8), x.view(torch.uint8))
    unique = [hvd_lossy.frame_info(f)["segments"][0]["n_unique"] for f in (by_content, by_id)]
    if kind == "truth":
        assert unique[1] == unique[0] + 1, unique


def liars(dtype):
    """Rows under one id that differ: a row, the same with its last element one ulp up, -0.0
    for 0.0, NaN rows of two payloads, +-Inf, one with the largest value, and true duplicates
    among them."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 9, generator=g).to(dtype)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    x[1] = x[0]
    x[1].view(bits)[-1] += 1  # one ulp apart
    x[2] = 0.0
    x[3] = -0.0
    x[4] = float("nan")
    x[5].view(bits)[:] = -1  # a NaN of another payload
    x[6, 2], x[6, 5] = float("inf"), float("-inf")
    x[7] = x[0]
    x[8] = x[6]
    x[10] = x[0]
    x[10, 3] = 100.0  # the range's top, in a row that lies
    return x, torch.zeros(12, dtype=torch.int64)


def within_bound(decoded, x, eb_abs):
    """Every finite element within eb_abs in float64; NaN where NaN was, Inf kept exactly."""
    nan, inf = torch.isnan(x), torch.isinf(x)
    assert torch.equal(torch.isnan(decoded), nan)
    assert torch.equal(decoded[inf], x[inf])
    fin = torch.isfinite(x)
    err = (decoded[fin].double() - x[fin].double()).abs().max().item()
    assert err <= eb_abs, f"error {err} > bound {eb_abs}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eb", [0.03, 1e-4, 0.0])
def test_lying_ids_hold_the_bound_on_every_element(dtype, eb):
    x, ids = liars(dtype)
    frame, _ = hvd_lossy.compress_chunks(x, [12], eb, ids=ids)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    decoded = hvd_lossy.decompress(frame)
    within_bound(decoded, x, seg["eb_abs"])
    if eb == 0.0:
        assert torch.equal(decoded.view(torch.uint8), x.view(torch.uint8)), "lossless is bit exact"
    else:  # the range (and so the bound) counts the rows that lie: the frame of content dedup
        assert torch.equal(frame, hvd_lossy.compress_chunks(x, [12], eb)[0])


def test_ids_write_content_dedups_frame_over_many_blocks_on_every_kernel_path(tmp_path):
    """A segment of many quantizer blocks (the distinct rows by id are quantized a block at a
    time, gathered from the tensor), with rows too wide for byte codes, NaN and Inf rows, rows
    equal in bits under two ids and ids that lie: the frame is content dedup's on every kernel
    path, and the same bytes on all of them."""
    script = tmp_path / "ids_blocks.py"
    script.write_text(
        "import hashlib, torch, hvd_lossy\n"
        "g = torch.Generator().manual_seed(3)\n"
        "table = torch.randn(5000, 24, generator=g)\n"
        "table[11] = table[4]\n"
        "table[20, 3], table[21, 0], table[22] = float('nan'), float('inf'), 40.0\n"
        "ids = (torch.rand(30000, generator=g) ** 3 * 5000).long()\n"
        "x = table[ids]\n"
        "x[777, 5] += 1e-3  # its id's other rows differ from it: a lie\n"
        "liars = ids.clone(); liars[::97] = 4\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "for eb in (0.03, 1e-4):  # byte codes, and codes of 256 and more\n"
        "    content = hvd_lossy.compress_chunks(x, [30000], eb, level=1)[0]\n"
        "    for i in (ids, liars):\n"
        "        frame = hvd_lossy.compress_chunks(x, [30000], eb, level=1, ids=i)[0]\n"
        "        assert torch.equal(frame, content), eb\n"
        "    unique = hvd_lossy.frame_info(content)['segments'][0]['n_unique']\n"
        "    assert 3000 < unique < 15000, unique\n"
        "    out.append(hashlib.sha1(content.numpy().tobytes()).hexdigest())\n"
        "print(out)\n")
    runs = on_every_kernel_path(script)
    assert [r[0] for r in runs][2] == 0, "the last run is the portable path"
    assert runs[0][1:] == runs[1][1:] == runs[2][1:]


def test_first_stage_numbers_rows_by_id_and_keeps_rows_that_differ_apart():
    a, b, c = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    x = torch.stack([a, a, b, c, a, b, a])
    ids = torch.tensor([5, 5, 7, 5, 9, 7, 5])
    got_map, got_first = _hl_test.distinct_rows_by_id_f32(x.data_ptr(), 7, 8, ids.data_ptr())
    # id 5: rows 0, 1, 6 (row 3 claims it but differs: a row of its own); id 7: rows 2, 5;
    # id 9: row 4, equal in bits to id 5's row but apart at this stage
    assert (got_map, got_first) == ([0, 0, 1, 2, 3, 1, 0], [0, 2, 3, 4])


def test_first_stage_takes_flagged_zero_rows_for_one_row_in_their_place_unread():
    a, b = torch.randn(2, 8, generator=torch.Generator().manual_seed(5))
    nan = torch.full((8,), float("nan"))
    zero = torch.zeros(8)
    # rows 1, 3, 4 flagged: only the first is read (zeros), the others' memory is never looked at
    x = torch.stack([a, zero, b, nan, nan, a])
    ids = torch.tensor([5, 8, 7, 9, 8, 5])
    flags = torch.tensor([0, 1, 0, 1, 1, 0], dtype=torch.uint8)
    got = _hl_test.distinct_rows_by_id_f32(x.data_ptr(), 6, 8, ids.data_ptr(), flags.data_ptr())
    assert got == ([0, 1, 2, 1, 1, 0], [0, 1, 2])
    # without the flags the NaN rows are rows of their own
    assert _hl_test.distinct_rows_by_id_f32(x.data_ptr(), 6, 8, ids.data_ptr()) == (
        [0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 4])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level,eb,mode", [(1, 0.03, "rel"), (2, 0.25, "abs"), (1, 0.0, "abs")])
def test_flagged_zero_rows_code_the_frames_of_their_zeros_under_one_id(dtype, level, eb, mode):
    """The frame of the zeros coded with one id for all flagged rows; lossy, also the frame of
    the caller's ids (equal codes merge), where lossless keeps rows of two ids apart."""
    x, ids = drawn(dtype=dtype)
    flags = torch.zeros(600, dtype=torch.uint8)
    flags[torch.randperm(600, generator=torch.Generator().manual_seed(2))[:400]] = 1
    x[flags.bool()] = 0
    one_id = ids.masked_fill(flags.bool(), -1)
    rows = [100, 0, 250, 250]
    by_id, _ = hvd_lossy.compress_chunks(x, rows, eb, mode=mode, level=level, ids=one_id)
    flagged, _ = hvd_lossy.compress_chunks(x, rows, eb, mode=mode, level=level, ids=ids,
                                           _zero_rows=flags)
    assert torch.equal(flagged, by_id)
    if eb > 0:
        assert torch.equal(flagged, hvd_lossy.compress_chunks(x, rows, eb, mode=mode,
                                                              level=level, ids=ids)[0])
    assert hvd_lossy.frame_info(flagged)["segments"][0]["n_unique"] < 100 - 60
    cap = hvd_lossy.max_grouped_bytes(rows, [16], [2, 2], 4)
    grouped, plain = torch.zeros(cap, dtype=torch.uint8), torch.zeros(cap, dtype=torch.uint8)
    assert (hvd_lossy.compress_grouped(x, rows, [eb] * 4, [2, 2], 4, grouped, mode=mode,
                                       level=level, ids=ids, _zero_rows=flags)
            == hvd_lossy.compress_grouped(x, rows, [eb] * 4, [2, 2], 4, plain, mode=mode,
                                          level=level, ids=one_id))
    assert torch.equal(grouped, plain)
    out = hvd_lossy.decompress(flagged)
    assert torch.equal(out[flags.bool()], torch.zeros(400, 16, dtype=dtype))


@pytest.mark.parametrize("zero,error,named", [
    (torch.zeros(600, dtype=torch.bool), ValueError, "_zero_rows must be a contiguous CPU uint8 "
                                                     "tensor of shape (600,), got torch.bool"),
    (torch.zeros(599, dtype=torch.uint8), ValueError, "of shape (600,), got torch.uint8 of "
                                                      "shape (599,)"),
])
def test_bad_zero_rows_raise_naming_the_value_and_what_was_expected(zero, error, named):
    x, ids = drawn()
    with pytest.raises(error) as e:
        hvd_lossy.compress_chunks(x, [600], 0.03, ids=ids, _zero_rows=zero)
    assert named in str(e.value)
    with pytest.raises(ValueError, match=r"_zero_rows needs ids"):
        hvd_lossy.compress_chunks(x, [600], 0.03, _zero_rows=torch.zeros(600, dtype=torch.uint8))


@pytest.mark.parametrize("ids,error,named", [
    ([0] * 600, TypeError, "ids must be an int64 torch.Tensor with one key per row, got list"),
    (torch.zeros(600, dtype=torch.int32), TypeError, "ids must be an int64 tensor, got torch.int32"),
    (torch.zeros(599, dtype=torch.int64), ValueError, "ids must have shape (600,), one key per "
                                                      "row, got (599,)"),
    (torch.zeros(600, 1, dtype=torch.int64), ValueError, "ids must have shape (600,), one key "
                                                         "per row, got (600, 1)"),
])
def test_bad_ids_raise_naming_the_value_and_what_was_expected(ids, error, named):
    x, _ = drawn()
    with pytest.raises(error) as e:
        hvd_lossy.compress_chunks(x, [600], 0.03, ids=ids)
    assert named in str(e.value)
    out = torch.zeros(hvd_lossy.max_grouped_bytes([600], [16], [1], 0), dtype=torch.uint8)
    with pytest.raises(error) as e:
        hvd_lossy.compress_grouped(x, [600], [0.03], [1], 0, out, ids=ids)
    assert named in str(e.value)


def test_ids_need_rows_of_a_2d_tensor():
    x, ids = drawn()
    with pytest.raises(ValueError, match=r"ids need a 2-D tensor \(rows, dim\), got one of shape "
                                         r"\(600, 4, 4\)"):
        hvd_lossy.compress_chunks(x.view(600, 4, 4), [600], 0.03, ids=ids)


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3])
def test_alltoall_with_ids_under_mpirun_delivers_within_bound_and_bad_ids_raise_everywhere(np):
    output = run_mpi("tests/mp/transport_run.py", np=np, args=["ids"], timeout=120)
    assert_every_rank_passed(output, np)


@pytest.mark.mpi
def test_all_to_all_single_with_ids_under_torchrun_in_the_row_len_layout():
    output = run_mpi("tests/mp/dist_run.py", np=2, args=["ids"], launcher="torchrun", timeout=120)
    assert_every_rank_passed(output, 2)


@pytest.mark.mpi
@pytest.mark.parametrize("launcher,extra", [("mpirun", ["--overlap"]),
                                            ("torchrun", ["--backend", "torch"])])
def test_dlrm_example_with_ids_trains_exactly_as_without(tmp_path, launcher, extra):
    # The frames are the same bytes with and without ids, so the model is the same step by step.
    import json
    runs = {}
    for label, flags in (("content", []), ("ids", ["--ids"])):
        path = tmp_path / f"{label}.json"
        run_mpi("examples/dlrm/train.py", np=2, launcher=launcher, timeout=180,
                args=["--compression", "lossy", "--steps", "4", "--batch-size", "256",
                      "--eval-points", "0", "--no-progress", "--metrics-out", path, *extra,
                      *flags])
        runs[label] = json.loads(path.read_text())
    for key in ("auc", "logloss", "loss_curve", "a2a_bytes_plain", "a2a_bytes_sent",
                "data_checksum"):
        assert runs["ids"][key] == runs["content"][key], key
