# prof2.py dim share iters -> json line of median wall ms and cpu ms for c, cd, d, h (x->half copy_), b (half->float copy_)
import sys, time, json, statistics, torch, hvd_lossy
dim, share, iters = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
hvd_lossy.set_num_threads(1); torch.set_num_threads(1)
x = torch.load(f"/tmp/kern/w{dim}_{int(share*100)}.pt")
frame = hvd_lossy.compress(x, 0.03)
out = torch.empty_like(x); half = x.half(); half_out = torch.empty_like(half); float_out = torch.empty_like(x)
fns = {"c": lambda: hvd_lossy.compress(x, 0.03), "cd": lambda: hvd_lossy.compress(x, 0.03, dither=1),
       "d": lambda: hvd_lossy.decompress(frame, out=out), "h": lambda: half_out.copy_(x), "b": lambda: float_out.copy_(half)}
wall = {k: [] for k in fns}; cpu = {k: [] for k in fns}
for f in fns.values(): f()
for _ in range(iters):
    for k, f in fns.items():
        w0, c0 = time.perf_counter(), time.thread_time(); f()
        cpu[k].append(time.thread_time() - c0); wall[k].append(time.perf_counter() - w0)
print(json.dumps({"wall": {k: statistics.median(v) * 1e3 for k, v in wall.items()},
                  "cpu": {k: statistics.median(v) * 1e3 for k, v in cpu.items()}}))
