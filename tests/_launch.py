"""Launches multi-process test workers under mpirun, horovodrun or torchrun, never waiting
forever.

    from tests._launch import run_mpi
    run_mpi("tests/mp/transport_alltoall.py", np=2)
    run_mpi("tests/mp/dist_run.py", np=3, launcher="torchrun")   # torch.distributed workers

A worker script asserts and exits non-zero on failure; run_mpi fails the calling test with the
workers' output when the launch exits non-zero or runs past its timeout. on_every_kernel_path
runs one script in a fresh process per CPU kernel path (default, AVX-512 off, AVX2 off).
"""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _mpirun(np):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np),
            # Loopback TCP only: no network interfaces needed, no InfiniBand probing.
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            "--mca", "oob_tcp_if_include", "lo",
            "-x", "PYTHONPATH", "-x", "PATH", "-x", "OMP_NUM_THREADS", "-x", "HOROVOD_LOG_LEVEL"]


def _horovodrun(np):
    exe = shutil.which("horovodrun", path=str(pathlib.Path(sys.executable).parent)) or "horovodrun"
    return [exe, "-np", str(np), "-H", f"localhost:{np}", "--gloo", "--network-interface", "lo"]


def _torchrun(np):
    exe = shutil.which("torchrun", path=str(pathlib.Path(sys.executable).parent)) or "torchrun"
    # --standalone: a private rendezvous on a free local port, so parallel runs never meet.
    return [exe, "--standalone", "--nproc_per_node", str(np), "--no-python"]


def launch(script, np=2, args=(), launcher="mpirun", timeout=90, env=None):
    """Runs `python script *args` on `np` processes (arguments as for run_mpi) and returns
    (exit status of the launcher, combined output, command line); past `timeout` seconds it
    kills the launch and every rank, and the status is None."""
    if launcher == "mpirun":
        cmd = _mpirun(np)
    elif launcher == "horovodrun":
        cmd = _horovodrun(np)
    elif launcher == "torchrun":
        cmd = _torchrun(np)
    else:
        raise ValueError(f"launcher must be 'mpirun', 'horovodrun' or 'torchrun', got {launcher!r}")
    target = [str(REPO / script)] if script.endswith(".py") else ["-m", script]
    cmd += [sys.executable, *target, *map(str, args)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
    full_env.setdefault("OMP_NUM_THREADS", "1")  # 2 slow cores shared by all ranks
    full_env.setdefault("HOROVOD_LOG_LEVEL", "warning")
    full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        output, _ = proc.communicate()
        return None, output, " ".join(cmd)
    return proc.returncode, output, " ".join(cmd)


def run_mpi(script, np=2, args=(), launcher="mpirun", timeout=90, env=None):
    """Runs `python script *args` on `np` processes and fails the test unless all exit 0.

    Arguments:
        script: path of the worker (".py"), absolute or relative to the repository root, or
                a module name to run as `python -m script`.
        np: number of processes.
        args: extra command-line arguments for the worker.
        launcher: "mpirun" (Open MPI, oversubscribed), "horovodrun" (Gloo controller) or
                  "torchrun" (torch.distributed's launcher; the worker initialises its group).
        timeout: seconds before the whole launch is killed and the test fails.
        env: extra environment variables.

    Returns:
        the combined stdout and stderr of all processes.
    """
    status, output, cmd = launch(script, np, args, launcher, timeout, env)
    if status is None:
        pytest.fail(f"{cmd} did not finish in {timeout} s (hang?); output:\n{output}")
    if status != 0:
        pytest.fail(f"{cmd} exited with {status}; output:\n{output}")
    return output


def assert_every_rank_passed(output, np):
    """Every one of np ranks printed the case runner's closing line once (tests/mp/cases.py)."""
    passed = sorted(int(r) for r in re.findall(r"rank (\d+): \d+ cases passed", output))
    assert passed == list(range(np)), output


def on_every_kernel_path(script):
    """The Python literal `script` prints, run on the default kernels, with AVX-512 off and with
    AVX2 off (in that order)."""
    def run(**flags):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_LOSSY_NO_")}
        env.update(flags)
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return eval(done.stdout)

    return [run(), run(HVD_LOSSY_NO_AVX512="1"), run(HVD_LOSSY_NO_AVX2="1")]


def same_on_every_kernel_path(script):
    """on_every_kernel_path of a script whose printed list starts with the simd_level it ran
    at: the three runs are the default, AVX2 at most and portable, and the rest of their lists
    are equal. Returns the runs."""
    runs = on_every_kernel_path(script)
    assert runs[2][0] == 0 and runs[1][0] <= 1 and runs[0][0] >= runs[1][0]
    assert runs[0][1:] == runs[1][1:] == runs[2][1:]
    return runs
