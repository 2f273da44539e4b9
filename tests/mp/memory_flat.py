"""Worker: resident memory stays flat over many lossy all-to-alls once warm (2 ranks, mpirun).

    python tests/mp/memory_flat.py CALLS WARMUP

A fixed mix of calls (float32 and bfloat16, levels 1 and 2, dither, async, autograd) repeats;
after WARMUP calls every cache has reached its steady state, so the RSS measured after CALLS
more must not have grown by more than 5 MiB. Prints "rank R: RSS growth B bytes over CALLS
calls".
"""
import gc
import os
import sys

import torch

import hvd_lossy.torch as hvd

LIMIT = 5 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


hvd.init()
R, N = hvd.rank(), hvd.size()
calls, warmup = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator().manual_seed(R)
inputs = [torch.randn(64 * N, 32, generator=g), torch.randn(16 * N, 8, generator=g).bfloat16()]
compressors = [hvd.Compression.lossy(0.01), hvd.Compression.lossy(0.02, level=2),
               hvd.Compression.lossy(0.01, mode="abs", dither=True)]


def step(i):
    x = inputs[i % 2]
    c = compressors[i % 3]
    if i % 5 == 0:
        x = x.float().requires_grad_()
        out = hvd.alltoall(x, compression=c)
        out.sum().backward()
    elif i % 5 == 1:
        hvd.synchronize(hvd.alltoall_async(x, compression=c))
    else:
        hvd.alltoall(x, compression=c)


for i in range(warmup):
    step(i)
gc.collect()
before = rss()
for i in range(warmup, warmup + calls):
    step(i)
gc.collect()
growth = rss() - before
print(f"rank {R}: RSS growth {growth} bytes over {calls} calls", flush=True)
assert growth <= LIMIT, f"rank {R}: RSS grew by {growth} bytes over {calls} calls, limit {LIMIT}"
