"""hvd_lossy.distributed: torch.distributed's all_to_all_single with compression=, on the same
exchange as hvd_lossy.torch. The contracts live as named cases in the torchrun workers
(tests/mp/dist_*.py):
  collectives: Compression.none bit-identical to torch.distributed (float32/bfloat16/float16,
      sync and async); lossy output filled in place within each frame's bound; 1-D even splits;
      fp16 and auto=True; bad splits, a wrong output, output splits disagreeing with the senders
      raise RankError on every rank and the ranks stay in step; the autograd form's gradient
      returns with the splits reversed under the backward setting; the reference DLRM's
      flattened [batch, tables x dim] layout (row_len=, tables=) keeps each table's bound in
      both directions and dedups within each table.
  adaptive: the controller exchanges its statistics over the process group (no mpi4py, no
      Horovod) and keeps each table's bound on the flattened layout, forward and backward.
  dlrm: a hybrid-parallel DLRM written the torch.distributed way (custom autograd All2All
      around all_to_all_single(async_op=True)), switched by one import and compression=: with
      Compression.none its losses equal the plain torch.distributed run's exactly.
"""
import pytest
import torch

from tests._launch import assert_every_rank_passed, run_mpi

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or
                                not torch.distributed.is_gloo_available(),
                                reason="this torch has no gloo backend")


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3])
def test_all_to_all_single_adaptive_and_dlrm_under_torchrun_gloo(np):
    output = run_mpi("tests/mp/dist_run.py", np=np, args=["collectives", "adaptive", "dlrm"],
                     launcher="torchrun", timeout=150)
    assert_every_rank_passed(output, np)


def test_mpi_backend_is_tested_where_torch_has_it():
    if not torch.distributed.is_mpi_available():
        pytest.skip("this torch build has no MPI backend (the CPU wheel is built without it)")
    output = run_mpi("tests/mp/dist_run.py", np=2,
                     args=["--backend", "mpi", "collectives", "adaptive", "dlrm"])
    assert_every_rank_passed(output, 2)


def test_compressor_layout_settings_round_trip_and_refuse_bad_values():
    from hvd_lossy.compression import Compression, LossyCompressor  # noqa: F401 (eval namespace)
    c = Compression.lossy(0.03, row_len=16, tables=3)
    assert c.segments == 3 and c.row_len == 16
    assert LossyCompressor.from_config(c.get_config()) == c and eval(repr(c)) == c
    assert c.for_backward().row_len == 16
    with pytest.raises(ValueError, match="row_len must be None or an int >= 1, got 0"):
        Compression.lossy(0.03, row_len=0)
    with pytest.raises(ValueError, match="tables and segments name the same setting"):
        Compression.lossy(0.03, tables=2, segments=2)


def _readme_section():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("### Port your torch.distributed script", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")
    return {blocks[i].split("\n", 1)[0]: blocks[i].split("\n", 1)[1] for i in range(1, len(blocks), 2)}


@pytest.mark.mpi
def test_readme_torch_distributed_snippet_is_the_example_and_its_command_runs():
    import pathlib
    import shlex
    repo = pathlib.Path(__file__).resolve().parents[1]
    blocks = _readme_section()
    example = (repo / "examples/port_torch_distributed.py").read_text()
    for line in blocks["python"].strip().splitlines():  # the snippet's lines, verbatim
        assert line in example, line
    commands = blocks["bash"].strip().replace("\\\n", " ").splitlines()
    assert len(commands) == 2, commands
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == ".venv/bin/torchrun" and argv[1:4] == ["--standalone", "--nproc_per_node", "2"]
        outputs.append(run_mpi(argv[4], np=2, args=argv[5:], launcher="torchrun", timeout=180))
    assert "rank 0: received" in outputs[0] and "rank 1: received" in outputs[0], outputs[0]
    assert "auc " in outputs[1] and "steps 20" in outputs[1], outputs[1]


@pytest.mark.mpi
def test_dlrm_example_on_the_torch_backend_with_none_equals_plain_torch_distributed(tmp_path):
    import json
    runs = {}
    for label, flags in (("plain", ["--plain-horovod"]), ("none", ["--compression", "none"])):
        path = tmp_path / f"{label}.json"
        run_mpi("examples/dlrm/train.py", np=2, launcher="torchrun", timeout=180,
                args=["--backend", "torch", "--steps", "4", "--batch-size", "256", "--eval-points",
                      "0", "--no-progress", "--metrics-out", path, *flags])
        runs[label] = json.loads(path.read_text())
    for key in ("auc", "logloss", "loss_curve", "a2a_bytes_plain", "a2a_bytes_sent",
                "data_checksum"):
        assert runs["none"][key] == runs["plain"][key], key
    assert runs["none"]["world"] == 2 and runs["none"]["steps"] == 4


@pytest.mark.mpi
def test_dlrm_example_trains_identically_on_horovod_and_torch_with_none(tmp_path):
    # The torch stand-in sums the dense gradients in one fused all_reduce, as Horovod's
    # DistributedOptimizer fuses them: the same sums, so the same model step by step.
    import json
    runs = {}
    for backend, launcher in (("horovod", "mpirun"), ("torch", "torchrun")):
        path = tmp_path / f"{backend}.json"
        run_mpi("examples/dlrm/train.py", np=2, launcher=launcher, timeout=180,
                args=["--backend", backend, "--compression", "none", "--steps", "4",
                      "--batch-size", "256", "--eval-points", "0", "--no-progress",
                      "--metrics-out", path])
        runs[backend] = json.loads(path.read_text())
    for key in ("auc", "logloss", "loss_curve", "a2a_bytes_plain", "a2a_bytes_sent",
                "data_checksum"):
        assert runs["torch"][key] == runs["horovod"][key], key


@pytest.mark.mpi
def test_dlrm_example_on_the_torch_backend_resumes_where_the_whole_run_goes(tmp_path):
    # Adagrad keeps per-parameter state: a resumed run equals the whole one only if the
    # optimizer stand-in saves and restores it.
    import json
    common = ["--backend", "torch", "--optimizer", "adagrad", "--eval-points", "0",
              "--batch-size", "256", "--max-eval-rows", "256", "--no-progress"]

    def run(name, steps, *extra):
        run_mpi("examples/dlrm/train.py", np=2, launcher="torchrun", timeout=180,
                args=[*common, "--steps", steps, "--metrics-out", tmp_path / name, *extra])
        return json.loads((tmp_path / name).read_text())
    whole = run("whole.json", "6")
    run("first.json", "3", "--save", tmp_path / "ckpt")
    resumed = run("resumed.json", "6", "--resume", tmp_path / "ckpt")
    assert resumed["steps"] == 6 and resumed["loss_curve"] == whole["loss_curve"][3:]
    assert (resumed["auc"], resumed["logloss"]) == (whole["auc"], whole["logloss"])
