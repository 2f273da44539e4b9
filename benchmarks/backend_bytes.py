"""Same frames over either backend: the bytes and the decoded values of a lossy all-to-all of
deterministic DLRM-like lookups, carried by Horovod (hvd_lossy.torch.alltoall) or by a
torch.distributed group (hvd_lossy.distributed.all_to_all_single), in the [rows, dim]
table-major layout and in the reference DLRM's flattened row_len layout.

    mpirun -np 2 python benchmarks/backend_bytes.py horovod OUT.json
    torchrun --standalone --nproc_per_node 2 benchmarks/backend_bytes.py torch OUT.json

Each writes, per rank, the wire bytes and a sha256 of the received values (in table-major order)
per call; the two backends' files must agree.
"""
import hashlib
import json
import sys

import torch

K, B, D, CALLS = 3, 256, 32, 4  # tables per rank, rows per destination, dim, calls


def lookups(rank, world, call):
    """[world * K * B, D]: destination-major, table-major within; duplicates as in lookups."""
    g = torch.Generator().manual_seed(1000 * call + rank)
    tables = [torch.rand((64, D), generator=g) * 10.0 ** (t - 1) for t in range(K)]
    return torch.cat([tables[t][torch.randint(0, 64, (B,), generator=g)]
                      for _dest in range(world) for t in range(K)])


def interleaved(x, world):
    """The same values as the reference DLRM flattens them: per destination [B, K x D]."""
    return x.view(world, K, B, D).transpose(1, 2).reshape(-1)


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def main(backend, out_path):
    rows = []
    if backend == "horovod":
        import hvd_lossy.torch as lib
        lib.init()
        rank, world = lib.rank(), lib.size()
    else:
        import hvd_lossy.distributed as lib
        lib.init_process_group("gloo")
        rank, world = lib.get_rank(), lib.get_world_size()
    c = lib.Compression.lossy(0.01, segments=K)
    flat_c = lib.Compression.lossy(0.01, row_len=D, tables=K)
    for call in range(CALLS):
        x = lookups(rank, world, call)
        if backend == "horovod":
            out, _ = lib.alltoall(x, splits=[K * B] * world, compression=c)
            layouts = [("rows", out)]
        else:
            out = torch.empty_like(x)
            lib.all_to_all_single(out, x, compression=c)
            layouts = [("rows", out)]
            wire_rows = lib.comm_stats()["last"]["wire_bytes"]
            flat = torch.empty(x.numel())
            lib.all_to_all_single(flat, interleaved(x, world), compression=flat_c)
            # back to table-major, to compare the values with the other layouts'
            layouts.append(("row_len", flat.view(world, B, K, D).transpose(1, 2).reshape(-1, D)))
        stats = lib.comm_stats()["last"]
        rows.append({"call": call, "wire_bytes": stats["wire_bytes"] if backend == "horovod"
                     else wire_rows, "row_len_wire_bytes": None if backend == "horovod"
                     else stats["wire_bytes"], "raw_bytes": stats["raw_bytes"],
                     **{f"sha_{name}": digest(v) for name, v in layouts}})
    gathered = {"backend": backend, "world": world, "rank": rank, "calls": rows}
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump(gathered, f, indent=1)
    print(json.dumps(gathered), flush=True)
    if backend == "torch":
        lib.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
