"""`python -m hvd_lossy.bench codec --step`: one rank's codec work in a training step, at the
sizes and in the state training hands it over, beside the fp16 cast of the same tensors.

The 64 MB sets of `bench codec` come from memory; a training step's tensors are a few MB and
were just written by the layer that made them, so they sit in the caches, where the cast runs
several times faster and the codec's own arithmetic is what is left. This is rank 0 of the
plain-Horovod DLRM user script (`benchmarks/user_dlrm.py`: 2 ranks, dim 128, 21 tables, global
batch 1,024, Zipf ids with exponent 1.1 into tables of min(Criteo Kaggle cardinality, 200,000)
rows, DLRM's uniform init) with its dense gradients coded too:
  lookups    the half of its 11 tables' lookups that goes to the other rank (512 rows a table,
             table-major), relative bound 0.03, duplicates removed, as the all-to-all codes them;
  gradients  as many embedding gradients, dithered, relative bound 0.02 (the backward default);
  dense      490,000 dense gradients (the two MLPs' parameters) as 4,900 x 100, dithered, 0.02.
Each is written into its buffer just before it is coded (untimed), compressed with
compress_grouped into a reused send buffer and decoded into a reused tensor; the cast partners
are `half.copy_(x)` for a compress and `x.copy_(half)` for a decode, each also right after its
input was written. One thread; medians of --repeat steps; every decoded element is checked
against its bound.

With --against PATH every step also runs on another checkout's compiled codec
(PATH/hvd_lossy/_C*.so, built there in place), the two taking turns step by step (A, B, B, A,
...), so that both meet the same moments of a noisy machine: the other build's time over this
one's, per part, and whether the two wrote the same frames.
"""
import glob
import importlib.util
import os
import statistics
import time

import numpy as np
import torch

import hvd_lossy
from hvd_lossy import _codec
from hvd_lossy.bench.criteo import KAGGLE_CARDINALITIES

PARTS = ("lookups", "gradients", "dense")


def zipf(rng, n, size, a=1.1):
    """ids in [0, n) with P(k) ~ (k+1)^-a, as the user script draws them."""
    b = 1.0 - a
    k = ((rng.random(size) * ((n + 1.0) ** b - 1.0) + 1.0) ** (1.0 / b)) - 1.0
    return np.minimum(k.astype(np.int64), n - 1)


def step_tensors(seed=0, tables=21, dim=128, batch=1024, table_rows=200_000, dense=490_000):
    """{part: (tensor, segment rows, relative bound, dither seed or None)} of rank 0's step."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    mine = range(0, tables, 2)
    chunks = []
    for t in mine:
        n = min(KAGGLE_CARDINALITIES[t], table_rows)
        ids = torch.from_numpy(zipf(rng, n, batch)[batch // 2:])
        distinct, inverse = ids.unique(return_inverse=True)  # only the rows looked up are drawn
        rows = (torch.rand(len(distinct), dim, generator=g) * 2 - 1) * (1.0 / n) ** 0.5
        chunks.append(rows[inverse])
    look = torch.cat(chunks)
    segs = [batch // 2] * len(chunks)
    grad = torch.randn(look.shape, generator=g) * 1e-4
    cols = 100
    dense_x = (torch.randn(dense, generator=g) * 1e-3).view(dense // cols, cols)
    return {"lookups": (look, segs, 0.03, None), "gradients": (grad, segs, 0.02, 7),
            "dense": (dense_x, [dense_x.shape[0]], 0.02, 9)}


def load_build(path):
    """The compiled codec of another checkout: PATH/hvd_lossy/_C*.so, loaded beside this one."""
    found = sorted(glob.glob(os.path.join(path, "hvd_lossy", "_C*.so")))
    if not found:
        raise FileNotFoundError(f"no hvd_lossy/_C*.so under {path!r}: build it there first "
                                f"(python setup.py build_ext --inplace)")
    spec = importlib.util.spec_from_file_location("hvd_lossy_against._C", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(repeat=100, seed=0, against=None):
    """Median seconds a step of each part's compress and decode and of their casts, with the
    bytes on the wire; every decode checked against its bound. against: another build's _C
    (load_build), timed step by step in turn with this one."""
    hvd_lossy.set_num_threads(1)
    torch.set_num_threads(1)
    parts = step_tensors(seed)
    state = {}
    for name, (x, segs, eb, dither) in parts.items():
        cap = hvd_lossy.max_grouped_bytes(segs, list(x.shape[1:]), [len(segs)], 0)
        state[name] = dict(src=torch.empty_like(x), buf=torch.empty(cap, dtype=torch.uint8),
                           out=torch.empty_like(x), half=torch.empty(x.shape, dtype=torch.float16))
    builds = {"this": _codec._C, **({"against": against} if against is not None else {})}
    times = {b: {f"{name} {what}": [] for name in parts
                 for what in ("compress", "decode", "cast", "cast back")} for b in builds}
    sizes, frames = {}, {}

    def timed(build, key, fn):
        t0 = time.perf_counter()
        result = fn()
        times[build][key].append(time.perf_counter() - t0)
        return result

    def one_step(build, last):
        for name, (x, segs, eb, dither) in parts.items():
            s = state[name]
            s["src"].copy_(x)  # written by its producer just before
            n = sum(timed(build, f"{name} compress", lambda: hvd_lossy.compress_grouped(
                s["src"], segs, [eb] * len(segs), [len(segs)], 0, s["buf"], 0, dither=dither)))
            timed(build, f"{name} decode", lambda: hvd_lossy.decompress(s["buf"][:n], out=s["out"]))
            check(name, x, segs, eb, s["out"])  # this build's decode, before the cast reuses out
            sizes[name] = n
            if last:  # the frames compared between builds (they are the same bytes every step)
                frames[build, name] = s["buf"][:n].clone()
            s["src"].copy_(x)
            timed(build, f"{name} cast", lambda: s["half"].copy_(s["src"]))
            timed(build, f"{name} cast back", lambda: s["out"].copy_(s["half"]))

    order = list(builds)
    try:
        for k in range(repeat + 2):  # the first two warm the buffers and the codec's caches
            for build in order if k % 2 == 0 else order[::-1]:
                _codec._C = builds[build]
                one_step(build, k == repeat + 1)
    finally:
        _codec._C = builds["this"]
    med = {b: {k: statistics.median(v[2:]) for k, v in t.items()} for b, t in times.items()}
    result = {"repeat": repeat, "seconds": med["this"],
              "bytes": {name: {"raw": parts[name][0].numel() * 4, "wire": sizes[name]}
                        for name in parts}}
    if against is not None:
        result["against_seconds"] = med["against"]
        result["against_over_this"] = {k: med["against"][k] / med["this"][k] for k in med["this"]}
        result["same_frames"] = all(torch.equal(frames["this", n], frames["against", n])
                                    for n in parts)
    return result


def check(name, x, segs, eb, y):
    """Every decoded element of each segment within eb of the segment's finite range."""
    for xs, ys in zip(x.split(segs), y.split(segs)):
        finite = xs[torch.isfinite(xs)]
        bound = eb * float(finite.max() - finite.min())
        err = float((xs.double() - ys.double()).abs().max())
        if err > bound:
            raise AssertionError(f"{name}: a decoded element is {err} off, over its bound {bound}")


def print_step(r):
    s = r["seconds"]
    print(f"one rank's codec work a step (user script, 2 ranks, d128; one thread, medians of "
          f"{r['repeat']} steps, inputs just written): ms, and the fp16 cast's time over the "
          f"codec's (cast into / back from a reused tensor)")
    total = {"compress": 0.0, "decode": 0.0, "cast": 0.0, "cast back": 0.0}
    for name in PARTS:
        b = r["bytes"][name]
        for k in total:
            total[k] += s[f"{name} {k}"]
        print(f"  {name:9} {b['raw'] / 1e6:5.2f} MB, {b['raw'] / b['wire']:5.1f}x: compress "
              f"{s[name + ' compress'] * 1e3:6.3f} ms ({s[name + ' cast'] / s[name + ' compress']:.3f}x"
              f" of the cast), decode {s[name + ' decode'] * 1e3:6.3f} ms "
              f"({s[name + ' cast back'] / s[name + ' decode']:.3f}x)")
    print(f"  step      compress {total['compress'] * 1e3:.3f} ms + decode {total['decode'] * 1e3:.3f}"
          f" ms = {(total['compress'] + total['decode']) * 1e3:.3f} ms; the casts "
          f"{(total['cast'] + total['cast back']) * 1e3:.3f} ms")
    if "against_over_this" in r:
        q = r["against_over_this"]
        print("  --against's time over this build's: " + ", ".join(
            f"{name} compress {q[name + ' compress']:.3f} decode {q[name + ' decode']:.3f}"
            for name in PARTS) + f"; the same frames: {'yes' if r['same_frames'] else 'NO'}")
