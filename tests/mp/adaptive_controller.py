"""Worker: the adaptive controller across 2 ranks (mpirun, or horovodrun --gloo).

    python adaptive_controller.py mpi|gloo TELEMETRY_PATH

1. ranks observe different statistics, exchange, and hold bit-identical bounds equal to what one
   process holding all ranks' observations computes;
2. bad or mismatched configurations raise ValueError on every rank (no hang);
3. under horovodrun --gloo the controller falls back to Horovod's collectives and warns once.
Exits non-zero (an AssertionError) on any failure.
"""
import sys
import warnings

import torch

import horovod.torch as hvd
from hvd_lossy.adaptive import Controller

launcher, telemetry = sys.argv[1], sys.argv[2]
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, size
TABLES = {"small": (10, 0), "mid": (1000, 1), "big": (10**6, 0)}


def observations(r):
    """What rank r observes: deterministic, different on each rank."""
    g = torch.Generator().manual_seed(100 + r)
    out = []
    for i, name in enumerate(TABLES):
        lookups = torch.randn(64, 8, generator=g) * (1 + i + 3 * r)
        grads = torch.randn(64, 8, generator=g) * (0.01 * (i + 1) if r == 0 else 0.5 / (i + 1))
        out.append((name, lookups, grads, 2048 * (1 + r), 300 + 100 * i + 50 * r))
    return out


def feed(controller, r):
    for name, lookups, grads, raw, frame in observations(r):
        controller.observe_lookups(name, lookups)
        controller.observe_gradients(name, grads)
        controller.record_frame(name, raw, frame)


def make(comm=None, **kw):
    args = dict(tables=TABLES, policy="sensitivity", interval=3, telemetry=telemetry, comm=comm)
    args.update(kw)
    return Controller(**args)


# ----- 1. the fallback choice, and the exchange -----
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    c = make()
    make(telemetry=None)
fallback_warnings = [w for w in caught if "Horovod's collectives" in str(w.message)]
if launcher == "gloo":
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_size() == 1, "horovodrun --gloo: mpi4py world should be 1 process"
    assert c.comm_backend == "horovod", c.comm_backend
    assert len(fallback_warnings) == 1, [str(w.message) for w in caught]
else:
    assert c.comm_backend == "mpi", c.comm_backend
    assert not fallback_warnings, [str(w.message) for w in fallback_warnings]

feed(c, rank)
c.step(), c.step()
before = c.bounds()
c.step()  # third step: exchange
after = c.bounds()
assert before == {n: 0.03 * 2 for n in TABLES}, before
everyone = hvd.allgather_object((after, [s.to_json() for s in c.stats()]))
assert everyone[0] == everyone[1], f"ranks hold different bounds/statistics: {everyone}"

# One process that observed everything both ranks did computes the same bounds.
alone = make(comm="local", tables={n: v[0] for n, v in TABLES.items()}, telemetry=None)
for r in range(size):
    feed(alone, r)
alone.exchange()
for name in TABLES:
    assert abs(after[name] - alone.bounds()[name]) <= 1e-12 * after[name], (after, alone.bounds())
# ...and differs from what either rank would compute from its own observations only.
mine = make(comm="local", tables={n: v[0] for n, v in TABLES.items()}, telemetry=None)
feed(mine, rank)
mine.exchange()
assert mine.bounds() != after, (rank, mine.bounds(), after)
assert len(set(after.values())) == 3, after  # sensitivity differs per table
merged = {s.name: s for s in c.stats()}
local_max = max(float(x.max()) for n, x, *_ in observations(0) if n == "big")
assert merged["big"].max >= local_max and merged["big"].rows == 128

if rank == 0:
    from hvd_lossy.adaptive import read_telemetry

    lines = read_telemetry(telemetry)
    assert [r["iteration"] for r in lines] == [3], lines
    assert lines[0]["tables"]["mid"]["bound"] == after["mid"]

# ----- 2. bad configurations raise on every rank -----


def expect_error(match, **kw):
    try:
        make(telemetry=None, **kw)
    except ValueError as e:
        assert match in str(e), f"rank {rank}: expected {match!r} in {e}"
        return str(e)
    raise AssertionError(f"rank {rank}: no error for {kw}")


# rank 1 alone is wrong: rank 1 gets its own message, rank 0 learns which rank failed.
expect_error("base must be" if rank == 1 else "failed on rank(s) [1]",
             base=-0.01 if rank == 1 else 0.03)
expect_error("schedule must be one of" if rank == 0 else "failed on rank(s) [0]",
             schedule="cosine" if rank == 0 else "step")
# Both valid, but different table lists.
tables = dict(TABLES)
if rank == 1:
    tables["extra"] = (7, 1)
msg = expect_error("ranks disagree", tables=tables)
assert "tables" in msg and "extra" in msg, msg
expect_error("ranks disagree", E=65536 + rank)
# Wrong on every rank.
expect_error("E (iterations", E=0)
expect_error("policy must be one of", policy="magic")
expect_error("unknown tables ['ghost']", policy={"name": "paper", "pin": {"ghost": "base"}})
expect_error("owner of table 'mid' must be a rank < 2", tables={"mid": (5, 2)})

# The ranks are still in step: a good controller exchanges fine afterwards.
c = make(telemetry=None, interval=1)
c.step()
assert hvd.allgather_object(c.bounds())[0] == c.bounds()
print(f"rank {rank}: adaptive controller OK ({launcher}, backend {c.comm_backend})", flush=True)
