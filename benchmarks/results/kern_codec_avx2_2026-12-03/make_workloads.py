import torch, hvd_lossy
from hvd_lossy.bench.codec import workloads
for dim in (32, 128):
    for share in (0.30, 0.55):
        (name, (x, rows)), = workloads(64, ["realistic"], 1_000_000, [dim], [share]).items()
        torch.save(x, f"/tmp/kern/w{dim}_{int(share*100)}.pt")
