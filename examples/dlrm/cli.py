"""Command line of the DLRM example, and the checks that turn nonsense input into one clear
message instead of a traceback from inside a collective."""

import argparse
import os
import sys

import torch

import data
from hvd_lossy.adaptive.policies import POLICIES
from hvd_lossy.adaptive.schedules import SCHEDULES

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                            "criteo_kaggle_sample")


# Relative gradient bound of the default training recipe (dithered, see --dither).
DEFAULT_GRAD_BOUND = 0.02
# Global batch when --batch-size is not given, rounded down to a multiple of the ranks.
DEFAULT_BATCH = 128
# Flags that only the adaptive controller reads; given with another --compression they are refused.
ADAPTIVE_ONLY = ("policy", "schedule", "schedule_iters", "interval", "grad_base")
# Where the model and the exchange live (--device).
DEVICES = ("cpu", "cuda")
# What mpirun and horovodrun set in each rank's environment: the rank is known before hvd.init(),
# so argument errors (which come first) are printed once.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK")
# ... and the number of processes they started (torchrun's WORLD_SIZE too).
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE", "WORLD_SIZE")


class UsageError(ValueError):
    """Arguments that cannot work; every rank raises it identically and exits non-zero."""


def _ints(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers, got %r" % text) from None


def _word_or_number(*words, minimum=None):
    """An argparse type: one of `words` as it is, else a number (at least `minimum`)."""
    expected = ", ".join(repr(w) for w in words) + (
        " or a number" if minimum is None else f" or a bound >= {minimum:g}")

    def parse(text):
        if text in words:
            return text
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or (minimum is not None and value < minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_backward = _word_or_number("same", "none", "fp16")
_dense = _word_or_number("none", "same", minimum=0)


def launcher_size():
    """Processes the launcher started (1 without one)."""
    for name in SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def launcher_rank():
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default, except None ones, whose meaning the help text states."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Every rank parses the same flags and exits alike; only rank 0 prints help and errors, and
    an error is one line."""

    def _print_message(self, message, file=None):
        if launcher_rank() == 0:
            super()._print_message(message, file)

    def error(self, message):
        self._print_message("%s: error: %s (see --help)\n" % (self.prog, message), sys.stderr)
        self.exit(2)


def parser():
    p = Parser(
        prog="train.py", formatter_class=HelpFormatter,
        description="Hybrid-parallel DLRM on Criteo with an error-bounded lossy embedding all-to-all.")
    src = p.add_argument_group("data")
    src.add_argument("--data", default=DEFAULT_DATA,
                     help="folder with train.txt (and dev.txt/test.txt) in the Criteo Kaggle format; "
                          "the default is the bundled sample")
    src.add_argument("--synthetic", type=int, default=0, metavar="N",
                     help="train on N synthetic rows with a planted signal instead of --data")
    src.add_argument("--synthetic-test", type=int, default=0, metavar="N",
                     help="held-out synthetic rows (default: N/10, at least one batch)")
    src.add_argument("--max-table-rows", type=int, default=None,
                     help="cap on rows per embedding table (default: 100000 for synthetic data and "
                          "hashing, none for a vocabulary)")
    src.add_argument("--categorical", choices=["vocab", "hash"], default=None,
                     help="ids to rows: vocabulary from the training files with an OOV row, or "
                          "hashing (default: vocab, hash when streaming)")
    src.add_argument("--max-rows", type=int, default=None,
                     help="read at most this many rows per file (streaming: training rows in all)")
    src.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                     help="read the training files in order as training goes, each rank parsing "
                          "only its slice, instead of holding every row on every rank (default: "
                          "on for Terabyte day_N folders, off otherwise)")
    src.add_argument("--max-eval-rows", type=int, default=None,
                     help="held-out rows to evaluate on (default: all; streaming: 1,000,000)")

    m = p.add_argument_group("model and optimisation")
    m.add_argument("--embedding-dim", type=int, default=16, help="embedding width D")
    m.add_argument("--bottom-mlp", type=_ints, default=[64], help="hidden sizes (output is --embedding-dim)")
    m.add_argument("--top-mlp", type=_ints, default=[64, 32], help="hidden sizes (output is one logit)")
    m.add_argument("--batch-size", type=int, default=None,
                   help="global batch, split evenly over ranks (default: %d rounded down to a multiple "
                        "of the ranks: 128 on 1, 2 or 4 ranks, 126 on 3)" % DEFAULT_BATCH)
    m.add_argument("--epochs", type=int, default=1, help="passes over the training rows")
    m.add_argument("--steps", type=int, default=None, help="stop after this many steps (overrides --epochs)")
    m.add_argument("--lr", type=float, default=0.03, help="learning rate of the dense part")
    m.add_argument("--emb-lr", type=float, default=0.05, help="learning rate of the embeddings")
    m.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad",
                   help="optimizer of the dense part and of the embeddings")
    m.add_argument("--seed", type=int, default=0, help="fixes the initial model and the data order")
    m.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    m.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where tables, MLPs, batches and the exchange live: cpu, or cuda (rank "
                        "on GPU local_rank of its node; Horovod's alltoall then carries device "
                        "frames, and --backend torch runs on NCCL)")

    c = p.add_argument_group("all-to-all compression")
    c.add_argument("--compression", choices=["none", "fp16", "lossy", "adaptive"], default="none",
                   help="what the embedding all-to-all sends (the README's table)")
    c.add_argument("--error-bound", type=float, default=0.03,
                   help="forward error bound (lossy), or the adaptive controller's base bound")
    c.add_argument("--eb-mode", choices=["rel", "abs"], default="rel",
                   help="rel: bound relative to each chunk's value range; abs: absolute")
    c.add_argument("--backward-error-bound", type=_backward, default=None,
                   help="gradient all-to-all: an error bound in --eb-mode, 'same' as forward (for "
                        "adaptive: the controller's per-table bounds), 'none' (uncompressed) or "
                        "'fp16'. Default: %g with --eb-mode rel (with the default dither it kept "
                        "AUC within 0.001 in benchmarks/RESULTS.md), 'same' with abs"
                        % DEFAULT_GRAD_BOUND)
    c.add_argument("--dither", choices=["none", "backward", "all"], default="backward",
                   help="subtractive dither (same bound, unbiased error): on the gradient frames "
                        "only (default: gradients are what a biased rounding hurts), on every "
                        "frame, or none")
    c.add_argument("--level", type=int, choices=[1, 2], default=1,
                   help="codec level: 1 bit packing (fastest), 2 adds an entropy coder (smaller)")
    c.add_argument("--lossy-frames", choices=["table", "destination"], default="table",
                   help="lossy: one frame per (destination, table), so a relative bound is relative to "
                        "each table's range (default), or one frame per destination")
    c.add_argument("--auto", action="store_true",
                   help="lossy/adaptive: pass auto=True to the compressor (the library then decides "
                        "per call whether compressing pays on this link); only passed when given, "
                        "so an hvd_lossy without it fails with a clear error")
    c.add_argument("--policy", default=None, choices=sorted(POLICIES),
                   help="adaptive: how the controller sets per-table bounds (default: paper)")
    c.add_argument("--schedule", default=None, choices=list(SCHEDULES),
                   help="adaptive: per-iteration multiplier of the bounds (default: step)")
    c.add_argument("--schedule-iters", type=int, default=None, metavar="E",
                   help="adaptive: iterations until the schedule's multiplier reaches 1 (default: the run's steps)")
    c.add_argument("--interval", type=int, default=None,
                   help="adaptive: iterations between re-plans of the bounds (default: steps/20, at most 100)")
    c.add_argument("--grad-base", type=float, default=None,
                   help="adaptive with --backward-error-bound same: the controller's gradient base "
                        "bound (a table's gradient bound is its lookup bound x grad-base / "
                        "error-bound; default: --error-bound)")
    c.add_argument("--overlap", action="store_true",
                   help="start the lookups' all-to-all asynchronously and run the bottom MLP while "
                        "it travels (hvd_lossy alltoall_async(differentiable=True); not with "
                        "--plain-horovod, whose async all-to-all has no autograd)")
    c.add_argument("--ids", action="store_true",
                   help="lossy/adaptive: hand the all-to-all each lookup's id (ids=), so the "
                        "codec finds duplicate rows by id instead of hashing every row (the same "
                        "frames, not faster today; training lookups only)")
    c.add_argument("--reuse", action="store_true",
                   help="lossy/adaptive: send lookups a rank already holds from an earlier step as "
                        "references or residuals (reuse=True, ids= and recv_ids=; implies --ids; "
                        "lookups only; gradients are never reused, and with lossy they travel "
                        "summed by id)")
    c.add_argument("--dense-compression", type=_dense, default="none",
                   help="the dense gradients' allreduce: none (Horovod's, as they are; default), "
                        "same: coded as the all-to-all's gradients are (--backward-error-bound, "
                        "--dither), or a bound of their own in --eb-mode (dithered as the "
                        "gradients), a step's one frame a rank in one allgather "
                        "(hvd_lossy.torch.DistributedOptimizer; its bytes count in the backward "
                        "all-to-all's); Horovod, lossy or adaptive, no --auto")
    c.add_argument("--eval-compression", choices=["none", "same"], default="none",
                   help="evaluation lookups: uncompressed (default; measures the trained model) or "
                        "through the training compressor")
    c.add_argument("--plain-horovod", action="store_true",
                   help="use the library's own all-to-all directly: horovod.torch.alltoall, or "
                        "torch.distributed.all_to_all_single with --backend torch (reference for "
                        "--compression none)")
    c.add_argument("--backend", choices=["horovod", "torch", "local"], default="horovod",
                   help="collectives: horovod (launch with mpirun), torch.distributed with gloo, "
                        "NCCL with --device cuda (launch with torchrun), or local: one process "
                        "without either (a rank's own chunk is never coded, so nothing is "
                        "compressed); the same model, data and frames")

    o = p.add_argument_group("output")
    o.add_argument("--label", default=None, help="name of this run in the metrics (default: --compression)")
    o.add_argument("--metrics-out", default=None, metavar="PATH", help="write the metrics JSON here (rank 0)")
    o.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots here (rank 0)")
    o.add_argument("--eval-points", type=int, default=5,
                   help="intermediate evaluations on a held-out prefix, for the AUC curve")
    o.add_argument("--save", default=None, metavar="DIR",
                   help="after training, write a checkpoint here (one file per rank)")
    o.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from a --save checkpoint of the same settings and ranks; "
                        "--steps/--epochs still count from the start")
    o.add_argument("--log-every", type=int, default=None, metavar="N",
                   help="rank 0 prints step, loss and samples/s every N steps (default: about 10 "
                        "lines a run; 0: none)")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is one only when stderr is a terminal)")
    return p


def check_device(args):
    """Raises UsageError when --device names a device this process cannot use, or --backend
    local runs under a launcher of several processes (checked before any collective library
    starts, which would fail less clearly)."""
    if args.backend == "local" and launcher_size() > 1:
        # each process would train alone as rank 0 of 1, none of them the run asked for
        raise UsageError("--backend local is one process, but the launcher started %d; use "
                         "--backend horovod or torch" % launcher_size())
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch %s sees no CUDA device (torch.cuda.is_available() "
                         "is False; built for CUDA %s); use --device cpu"
                         % (torch.__version__, torch.version.cuda or "none"))


def check(args, world):
    """Raises UsageError for arguments that cannot work with `world` ranks."""
    given = [f for f in ADAPTIVE_ONLY if getattr(args, f) is not None]
    if given and args.compression != "adaptive":
        raise UsageError("%s appl%s only to --compression adaptive, got --compression %s"
                         % (", ".join("--" + f.replace("_", "-") for f in given),
                            "ies" if len(given) == 1 else "y", args.compression))
    if args.batch_size is None:
        args.batch_size = max(DEFAULT_BATCH // world, 1) * world
    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1, got %d" % args.batch_size)
    if args.batch_size % world:
        raise UsageError("--batch-size %d is not divisible by the %d ranks (each rank takes B/world rows)"
                         % (args.batch_size, world))
    if world > data.N_SPARSE:
        raise UsageError("%d ranks but only %d embedding tables; table-wise sharding needs a table per rank"
                         % (world, data.N_SPARSE))
    if args.embedding_dim < 1:
        raise UsageError("--embedding-dim must be >= 1, got %d" % args.embedding_dim)
    if args.max_table_rows is not None and args.max_table_rows < 2:
        raise UsageError("--max-table-rows must be >= 2 (a one-row table cannot tell ids apart), got %d"
                         % args.max_table_rows)
    if args.synthetic < 0:
        raise UsageError("--synthetic must be >= 0 rows, got %d" % args.synthetic)
    if args.synthetic and args.max_table_rows is None:
        args.max_table_rows = 100000
    if args.max_eval_rows is not None and args.max_eval_rows < 1:
        raise UsageError("--max-eval-rows must be >= 1, got %d" % args.max_eval_rows)
    if args.synthetic and (args.stream or args.max_eval_rows):
        raise UsageError("--stream and --max-eval-rows read --data files; --synthetic generates "
                         "its rows (see --synthetic-test)")
    if args.log_every is not None and args.log_every < 0:
        raise UsageError("--log-every must be >= 0 steps, got %d" % args.log_every)
    if args.epochs < 1 or (args.steps is not None and args.steps < 1):
        raise UsageError("--epochs and --steps must be >= 1, got %d and %s" % (args.epochs, args.steps))
    if args.lr <= 0 or args.emb_lr <= 0:
        raise UsageError("--lr and --emb-lr must be > 0, got %g and %g" % (args.lr, args.emb_lr))
    if args.backward_error_bound is None:
        args.backward_error_bound = DEFAULT_GRAD_BOUND if args.eb_mode == "rel" else "same"
    backward = args.backward_error_bound
    if args.error_bound < 0 or (isinstance(backward, float) and backward < 0):
        raise UsageError("error bounds must be >= 0, got --error-bound %g --backward-error-bound %s"
                         % (args.error_bound, args.backward_error_bound))
    if args.plain_horovod and args.compression != "none":
        raise UsageError("--plain-horovod uses horovod.torch.alltoall, which cannot compress; "
                         "got --compression %s" % args.compression)
    if args.auto and args.compression not in ("lossy", "adaptive"):
        raise UsageError("--auto applies to --compression lossy or adaptive, got --compression %s"
                         % args.compression)
    if args.ids and args.compression not in ("lossy", "adaptive"):
        raise UsageError("--ids applies to --compression lossy or adaptive, got --compression %s"
                         % args.compression)
    if args.reuse and args.compression not in ("lossy", "adaptive"):
        raise UsageError("--reuse applies to --compression lossy or adaptive, got --compression %s"
                         % args.compression)
    if args.reuse and (args.auto or args.dither == "all"):
        raise UsageError("--reuse needs undithered lookups and no --auto (a plain call in between "
                         "would leave what each rank holds unknown to its peers)")
    if args.reuse:
        args.ids = True
    if args.dense_compression != "none" and (args.compression not in ("lossy", "adaptive")
                                             or args.backend != "horovod" or args.auto):
        raise UsageError("--dense-compression %s needs --compression lossy or adaptive on the "
                         "horovod backend without --auto, got --compression %s --backend %s%s"
                         % (args.dense_compression, args.compression, args.backend,
                            " --auto" if args.auto else ""))
    if args.plain_horovod and args.overlap:
        raise UsageError("--overlap needs hvd_lossy's differentiable alltoall_async; "
                         "horovod.torch.alltoall_async (--plain-horovod) has no autograd")


def check_source(source, args):
    """Raises UsageError when the data cannot fill one global batch or a table is degenerate."""
    for name, rows in zip(data.TABLE_NAMES, source.cardinalities):
        if rows < 2:
            raise UsageError("table %s has %d row(s); need >= 2" % (name, rows))
    if source.steps_per_epoch < 1:
        raise UsageError("--batch-size %d is larger than the %d training rows"
                         % (args.batch_size, _train_rows(source)))
    if source.n_eval < 1:
        raise UsageError("no held-out rows to evaluate on")


def _train_rows(source):
    if hasattr(source, "n_train"):
        return source.n_train
    return len(source.train) if hasattr(source, "train") else source.gen.n["train"]
