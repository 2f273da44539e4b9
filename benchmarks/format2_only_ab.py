"""Same harness for both trees: the transport's native paths (compress_grouped, decompress_into)
on the bench's workloads, one thread, medians of 9 calls paired with the fp16 cast into a reused
tensor (copy_). argv: tree label, json out."""
import json, sys, time, inspect
import torch, hvd_lossy
from hvd_lossy import _codec
from hvd_lossy.bench import codec as bc
torch.set_num_threads(1); hvd_lossy.set_num_threads(1)
fmt = {"format": 2} if "format" in inspect.signature(hvd_lossy.compress_grouped).parameters else {}
res = {"tree": sys.argv[1], "file": hvd_lossy.__file__, "fmt": bool(fmt), "simd_level": hvd_lossy._C.simd_level() if hasattr(hvd_lossy._C, "simd_level") else None, "runs": []}
torch.manual_seed(0)
for name, (x, rows) in bc.workloads(64, __import__("os").environ.get("AB_WL", "realistic,criteo").split(","), 1_000_000).items():
    for dither in (None, 7):
        trailing = list(x.shape[1:])
        cap = hvd_lossy.max_grouped_bytes(rows, trailing, [len(rows)], 0, **fmt)
        out = torch.empty(cap, dtype=torch.uint8)
        comp = lambda: hvd_lossy.compress_grouped(x, rows, [0.03] * len(rows), [len(rows)], 0, out, dither=dither, **fmt)
        sizes = comp(); n = sum(sizes)
        y = torch.empty_like(x)
        dec = lambda: hvd_lossy.decompress_into(out[:n], [(0, n, x.shape[0])], y)
        assert dec() == [None]
        h = torch.empty_like(x, dtype=torch.float16)
        cast = lambda: h.copy_(x)
        t = {"c": [], "d": [], "h": []}
        for _ in range(int(__import__("os").environ.get("AB_REP", "9"))):
            for k, f in (("c", comp), ("h", cast), ("d", dec)):
                s = time.perf_counter(); f(); t[k].append(time.perf_counter() - s)
        med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
        raw = x.numel() * 4
        res["runs"].append({"workload": name, "dither": dither is not None, "bytes": n,
                            "compress_GBps": raw / med["c"] / 1e9, "decompress_into_GBps": raw / med["d"] / 1e9,
                            "cast_into_GBps": raw / med["h"] / 1e9})
json.dump(res, open(sys.argv[2], "w"), indent=1)
print(json.dumps(res["runs"]))
