"""Table-wise placement of embedding tables on ranks, balanced by size.

Each table lives whole on one rank (table-wise model parallelism, as production DLRMs shard the
many small Criteo tables). Placement is the classic greedy for makespan: tables largest first, each
onto the rank with the least bytes so far (ties: the lower rank), which is within 4/3 of the best
possible maximum load.
"""


def place_tables(sizes, world):
    """Owner rank of each table.

    Arguments:
        sizes: size of each table (rows, or bytes: any unit proportional to memory).
        world: number of ranks.
    Returns:
        list of owner ranks, one per table, in table order.
    """
    if world < 1:
        raise ValueError("world size must be >= 1, got %d" % world)
    if any(s < 0 for s in sizes):
        raise ValueError("table sizes must be >= 0, got %s" % list(sizes))
    load = [0] * world
    owners = [0] * len(sizes)
    # Sort by size descending, ties by table index, so every rank computes the same plan.
    for t in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda k: (load[k], k))
        owners[t] = r
        load[r] += sizes[t]
    return owners


def tables_of(owners, rank):
    """Tables owned by a rank, in global table order (the order of its all-to-all chunks)."""
    return [t for t, r in enumerate(owners) if r == rank]


def loads(owners, sizes, world):
    """Total size placed on each rank."""
    out = [0] * world
    for t, r in enumerate(owners):
        out[r] += sizes[t]
    return out
