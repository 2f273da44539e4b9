"""Faults: a rank that dies (SIGKILL) in the middle of a run must not leave its peers hanging
in a collective; they exit non-zero within 30 s, under mpirun and under horovodrun --gloo.
(Bad input on one rank raising RankError everywhere is tests/mp/transport_errors.py.)"""
import os
import pathlib
import time

import pytest

from tests._launch import launch

DEADLINE_S = 30  # the contract: no hang; not a speed target


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_sigkill_of_one_rank_makes_every_other_rank_exit_non_zero_within_30_s(launcher, tmp_path):
    status, output, cmd = launch("tests/mp/fault_kill.py", np=3, args=[tmp_path],
                                 launcher=launcher, timeout=180)
    assert status is not None, f"{cmd} hung after the kill:\n{output}"
    assert (tmp_path / "killed_at").exists(), f"the victim never got to its kill:\n{output}"
    assert status != 0, f"{cmd} exited 0 although a rank was killed:\n{output}"
    assert "survived its peer's death" not in output, output
    deadline = float((tmp_path / "killed_at").read_text()) + DEADLINE_S
    pids = [int(p.read_text()) for p in sorted(pathlib.Path(tmp_path).glob("pid.*"))]
    assert len(pids) == 3, output
    # The launcher may return while its last ranks are still being torn down: they must be
    # gone by the deadline.
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, 9)  # do not leave them behind for the next test
    assert not alive, f"ranks {alive} outlived the kill by {DEADLINE_S} s:\n{output}"
    print(f"{launcher}: every rank gone {time.time() - deadline + DEADLINE_S:.1f} s after the kill")
    assert time.time() <= deadline + 1, f"the launch ended more than {DEADLINE_S} s after the kill"
