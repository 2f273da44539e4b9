"""Worker: the last rank SIGKILLs itself in the middle of a run of lossy all-to-alls; the
others must not hang. Every rank writes its pid to DIR/pid.RANK at start, the victim the time of
its kill to DIR/killed_at (tests/test_faults.py checks that no rank outlives the launch).

    mpirun -np 3 python tests/mp/fault_kill.py DIR
"""
import os
import pathlib
import signal
import sys
import time

import torch

import hvd_lossy.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
out = pathlib.Path(sys.argv[1])
(out / f"pid.{R}").write_text(str(os.getpid()))
lossy = hvd.Compression.lossy(0.01)
for i in range(100000):
    if R == N - 1 and i == 20:
        (out / "killed_at").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(4 * N, 8)
    handle = hvd.alltoall_async(x, compression=lossy)
    hvd.synchronize(handle)
print(f"rank {R}: survived its peer's death", flush=True)
