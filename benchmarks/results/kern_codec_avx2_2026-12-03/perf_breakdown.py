# usage: prof.py dim share what [iters]
import sys, time, torch, hvd_lossy
from hvd_lossy.bench.codec import workloads
dim, share, what = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
iters = int(sys.argv[4]) if len(sys.argv) > 4 else 20
hvd_lossy.set_num_threads(1); torch.set_num_threads(1)
x = torch.load(f"/tmp/kern/w{dim}_{int(share*100)}.pt")
frame = hvd_lossy.compress(x, 0.03)
dframe = hvd_lossy.compress(x, 0.03, dither=1)
out = torch.empty_like(x)
half_out = torch.empty_like(x.half())
fns = {"c": lambda: hvd_lossy.compress(x, 0.03), "cd": lambda: hvd_lossy.compress(x, 0.03, dither=1),
       "d": lambda: hvd_lossy.decompress(frame, out=out), "dd": lambda: hvd_lossy.decompress(dframe, out=out),
       "h": lambda: half_out.copy_(x)}
sel = what.split(",")
print("ratio", x.numel()*4/frame.numel(), "dither ratio", x.numel()*4/dframe.numel(), file=sys.stderr)
ts = {k: [] for k in sel}
for _ in range(iters):
    for k in sel:
        t0 = time.thread_time(); fns[k](); ts[k].append(time.thread_time() - t0)
import statistics
med = {k: statistics.median(v) for k, v in ts.items()}
for k in sel:
    print(f"{k}: {med[k]*1e3:.2f} ms" + (f"  ratio to copy_ {med['h']/med[k]:.3f}" if 'h' in med else ""), file=sys.stderr)
