"""--save / --resume: each rank writes and reads its own part of the model (the dense part is
replicated, the tables are sharded), so a checkpoint is a folder of one file per rank.

A resumed run continues at the saved step with the saved weights and optimizer state and reads
the same rows next (the data order depends only on the seed and the epoch), so `--steps N`
still means N steps from the start. Runs with --compression none resume bit for bit; the
compressors start their own state afresh (dither seeds, the adaptive controller's statistics
and schedule position are not saved).
"""

import os

import torch

import cli

# Settings a checkpoint is only valid under: a different one would load the wrong shapes or shard.
MUST_MATCH = ("embedding_dim", "bottom_mlp", "top_mlp", "batch_size", "seed", "optimizer",
              "data", "synthetic", "max_table_rows", "categorical")


def _path(folder, rank):
    return os.path.join(folder, "rank%d.pt" % rank)


def save(folder, rank, world, step, args, dense_arch, tables, dense_opt, emb_opt):
    os.makedirs(folder, exist_ok=True)
    torch.save({"step": step, "world": world,
                "settings": {k: getattr(args, k) for k in MUST_MATCH},
                "dense": dense_arch.state_dict(), "tables": tables.state_dict(),
                "dense_opt": dense_opt.state_dict(),
                "emb_opt": emb_opt.state_dict() if emb_opt else None}, _path(folder, rank))


def load(folder, rank, world, args, dense_arch, tables, dense_opt, emb_opt):
    """Restores this rank's part; returns the step to continue from. UsageError when the folder
    does not hold a checkpoint of this rank for these settings."""
    path = _path(folder, rank)
    if not os.path.isfile(path):
        raise cli.UsageError("--resume %s: no %s (a checkpoint is written by --save)"
                             % (folder, os.path.basename(path)))
    # on the host: load_state_dict copies into the parameters wherever they live (--device)
    state = torch.load(path, weights_only=False, map_location="cpu")
    if state["world"] != world:
        raise cli.UsageError("--resume %s was saved by %d ranks, this run has %d (the tables are "
                             "sharded per rank)" % (folder, state["world"], world))
    differ = ["--%s %s (saved: %s)" % (k.replace("_", "-"), getattr(args, k), v)
              for k, v in state["settings"].items() if getattr(args, k) != v]
    if differ:
        raise cli.UsageError("--resume %s was saved with other settings: %s"
                             % (folder, ", ".join(differ)))
    dense_arch.load_state_dict(state["dense"])
    tables.load_state_dict(state["tables"])
    dense_opt.load_state_dict(state["dense_opt"])
    if emb_opt:
        emb_opt.load_state_dict(state["emb_opt"])
    return state["step"]
