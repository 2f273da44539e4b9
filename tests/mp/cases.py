"""The case runner every multi-process worker uses, whatever launched it (mpirun, horovodrun,
torchrun): the test_* functions of a module, run in name order on every rank."""
import os
import sys
import time
import traceback


def cases_of(namespace):
    """The test_* functions of a worker module, in name order (the same on every rank)."""
    return [v for k, v in sorted(namespace.items()) if k.startswith("test_")]


def run_cases(cases, rank):
    """Runs each case; any failure prints the traceback with the rank and exits non-zero at once
    (os._exit: the peers may be blocked in a collective, and a library's shutdown could wait for
    them). Ends with the line the launching test looks for on every rank."""
    for case in cases:
        t0 = time.perf_counter()
        try:
            case()
        except BaseException:
            print(f"rank {rank}: case {case.__name__} failed", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        if rank == 0:
            print(f"{case.__name__}: {time.perf_counter() - t0:.2f} s", flush=True)
    print(f"rank {rank}: {len(cases)} cases passed", flush=True)
