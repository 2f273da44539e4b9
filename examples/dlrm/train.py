"""Hybrid-parallel DLRM on Criteo with a compressed embedding all-to-all.

    mpirun -np 2 python examples/dlrm/train.py --compression lossy --error-bound 0.03
    horovodrun -np 2 python examples/dlrm/train.py --synthetic 1000000 --batch-size 2048 \
        --compression adaptive --metrics-out m.json --plots plots/

Dense parts (bottom MLP, interaction, top MLP) are replicated and data-parallel: their gradients
are summed with hvd.DistributedOptimizer. Embedding tables are sharded table-wise (largest first
onto the least-loaded rank) and model-parallel: lookups and their gradients move through
hvd_lossy.torch.alltoall (exchange.py). The loss of each rank is its rows' BCE sum divided by the
global batch, so the summed dense gradients and each owner's embedding gradients are exactly those
of the global-batch mean loss.
"""

import hashlib
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import backend  # noqa: E402
import checkpoint  # noqa: E402
import cli  # noqa: E402
import comm  # noqa: E402
import data  # noqa: E402
import metrics  # noqa: E402
import sharding  # noqa: E402
import sources  # noqa: E402
from exchange import EmbeddingExchange  # noqa: E402
from backend import hvd  # noqa: E402
from model import DenseArch, LocalTables  # noqa: E402


# torch's sparse Adagrad/SGD warn once per process about disabled invariant checks; the sparse
# gradients here come from nn.Embedding and are well-formed.
warnings.filterwarnings("ignore", message="Sparse invariant checks")


def build_model(args, source, rank, world, device=torch.device("cpu")):
    """Dense part (same init on every rank), local tables, their optimizers and the exchange,
    on `device` (initialised on the host first, so every device starts from the same model)."""
    dim = args.embedding_dim
    owners = sharding.place_tables([n * dim for n in source.cardinalities], world)
    owned = sharding.tables_of(owners, rank)
    torch.manual_seed(args.seed)
    dense_arch = DenseArch(data.N_DENSE, data.N_SPARSE, dim, args.bottom_mlp,
                           args.top_mlp).to(device)
    hvd.broadcast_parameters(dense_arch.state_dict(), root_rank=0)
    tables = LocalTables(source.cardinalities, owned, dim, args.seed).to(device)
    opt_cls = torch.optim.Adagrad if args.optimizer == "adagrad" else torch.optim.SGD
    # op=Sum: each rank's loss is already divided by the global batch (see the module docstring).
    dense = comm.dense_compression(args)  # None: Horovod's own allreduce
    coded = {} if dense is None else {"compression": dense}
    dense_opt = (hvd if dense is None else backend.lossy()).DistributedOptimizer(
        opt_cls(dense_arch.parameters(), lr=args.lr),
        named_parameters=dense_arch.named_parameters(), op=hvd.Sum, **coded)
    emb_opt = opt_cls(tables.parameters(), lr=args.emb_lr) if owned else None
    return owners, owned, dense_arch, tables, dense_opt, emb_opt


def forward(batch, ex, dense_arch, tables, b, overlap=False):
    """(logits of this rank's slice, the owned tables' lookups for the global batch). With
    overlap, the bottom MLP runs while the lookups' all-to-all is in flight."""
    dense, sparse, _ = batch[:3]
    ids = ex.gather_ids(sparse)
    lookups = tables(ids)
    if overlap:
        pending = ex.start(lookups, b, ids)
        bottom = dense_arch.forward_bottom(dense)
        emb = ex.finish(pending)
    else:
        emb = ex.exchange(lookups, b, ids)
        bottom = dense_arch.forward_bottom(dense)
    return dense_arch.forward_top(bottom, emb), lookups


def use_device(args):
    """The torch.device of --device: cuda is this rank's GPU, number local_rank of its node,
    made current so that NCCL, Horovod and hvd_lossy's codec all work there."""
    if args.device != "cuda":
        return torch.device("cpu")
    n = torch.cuda.device_count()
    local = backend.local_rank()
    if local >= n:
        raise cli.UsageError("--device cuda: local rank %d but this node has %d GPU(s); start at "
                             "most %d ranks a node" % (local, n, n))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def on_device(batch, device):
    """The batch's tensors on `device` (the host copies are what the data checksum reads)."""
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def settle(device):
    """Waits for the device's queued work, so that a step's wall time is the step's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(source, ex, link, dense_arch, tables, rank, world, limit=None,
             device=torch.device("cpu")):
    """auc/logloss/accuracy over the held-out rows (or their first `limit`), gathered across ranks."""
    b = source.batch_size // world
    logits, labels = [], []
    dense_arch.eval()
    with torch.no_grad(), link.evaluating():
        for batch in sources.eval_batches(source, rank, world, limit):
            batch = on_device(batch, device)
            out, _ = forward(batch, ex, dense_arch, tables, b)
            valid = batch[3]
            logits.append(out[valid])
            labels.append(batch[2][valid])
    dense_arch.train()
    # allgather concatenates in rank order; the order of rows does not matter to the metrics.
    all_logits = hvd.allgather(torch.cat(logits).double(), name="eval.logits").cpu().numpy()
    all_labels = hvd.allgather(torch.cat(labels).double(), name="eval.labels").cpu().numpy()
    return metrics.evaluate(all_labels, all_logits)


def train(args):
    rank, world = hvd.rank(), hvd.size()
    cli.check(args, world)
    torch.set_num_threads(args.threads)
    device = use_device(args)
    source, notes = sources.build(args, world)
    if rank == 0:
        for line in notes:
            print("data: %s" % line, flush=True)
    cli.check_source(source, args)
    owners, owned, dense_arch, tables, dense_opt, emb_opt = build_model(args, source, rank, world,
                                                                        device)
    total = args.steps if args.steps else args.epochs * source.steps_per_epoch
    link = comm.Link(args, owners, rank, world, source.cardinalities, total)
    ex = EmbeddingExchange(owners, rank, world, link.alltoall, lambda t: hvd.allgather(t, name="ids"),
                           alltoall_start=link.alltoall_start, send_ids=args.ids,
                           recv_ids=getattr(args, "reuse", False))
    b = args.batch_size // world

    eval_at = _eval_steps(total, args.eval_points)
    curve_rows = min(source.n_eval, 8 * args.batch_size)
    checksum = hashlib.sha256()
    losses, evals, iter_s, splits, starts = [], [], [], [], []
    bar = _progress(total, rank == 0 and not args.no_progress and sys.stderr.isatty())
    log = StepLog(total, args.batch_size, _log_every(args.log_every, total) if rank == 0 else 0)
    step = 0
    if args.resume:
        step = checkpoint.load(args.resume, rank, world, args, dense_arch, tables, dense_opt, emb_opt)
        if step >= total:
            raise cli.UsageError("--resume %s is at step %d and this run ends at step %d: nothing "
                                 "left to train (--steps/--epochs count from the start)"
                                 % (args.resume, step, total))
        if rank == 0:
            print("resumed at step %d of %d from %s" % (step, total, args.resume), flush=True)
    log.last_step = step
    link.reset()
    t_start = time.perf_counter()
    first_epoch, first_k = divmod(step, source.steps_per_epoch)
    for epoch in range(first_epoch, args.epochs if not args.steps else sys.maxsize):
        for k in range(first_k if epoch == first_epoch else 0, source.steps_per_epoch):
            if step >= total:
                break
            batch = source.batch(epoch, k, rank, world)
            for t in batch:
                checksum.update(t.numpy().tobytes())
            batch = on_device(batch, device)
            t0 = time.perf_counter()
            starts.append(t0 - t_start)
            link.begin_step()
            logits, _ = forward(batch, ex, dense_arch, tables, b, overlap=args.overlap)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, batch[2], reduction="sum") / args.batch_size
            dense_opt.zero_grad()
            if emb_opt:
                emb_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            if emb_opt:
                emb_opt.step()
            link.step(step + 1)
            settle(device)
            iter_s.append(time.perf_counter() - t0)
            splits.append(link.step_split(iter_s[-1], ex))
            global_loss = hvd.allreduce(loss.detach(), op=hvd.Sum, name="loss").item()
            losses.append(global_loss)
            step += 1
            bar.update(1)
            bar.set_postfix(loss="%.4f" % global_loss)
            log.step(step, global_loss)
            if step in eval_at:
                ev = evaluate(source, ex, link, dense_arch, tables, rank, world, curve_rows, device)
                evals.append(dict(ev, step=step))
        if step >= total:
            break
    train_seconds = time.perf_counter() - t_start
    if args.save:
        checkpoint.save(args.save, rank, world, step, args, dense_arch, tables, dense_opt, emb_opt)
    bar.close()
    wire = link.totals()
    final = evaluate(source, ex, link, dense_arch, tables, rank, world, device=device)
    digests = hvd.allgather_object(checksum.hexdigest(), name="checksum")
    result = dict(
        final, label=args.label or args.compression, steps=step,
        epochs_run=step / source.steps_per_epoch, world=world, device=str(device),
        batch_size=args.batch_size, train_seconds=train_seconds,
        iter_seconds_median=statistics.median(iter_s), iter_seconds=iter_s,
        # a step's start on this rank's clock: the period between starts is the whole iteration
        # (batch, checksum and the loss's allreduce included), iter_seconds only the timed part
        step_starts=starts, loss_final=losses[-1],
        data_checksum=hashlib.sha256("".join(digests).encode()).hexdigest(),
        loss_curve=losses, eval_curve=evals, time_split=splits,
        table_names=data.TABLE_NAMES, table_rows=source.cardinalities, owners=owners,
        data_notes=notes,
        args=vars(args))
    result.update(wire)
    result.update(link.table_report())
    return result


class StepLog:
    """Rank 0's line every `every` steps: step, loss and samples/s since the previous line (a
    progress bar under mpirun, whose output is no terminal, would be one endless line)."""

    def __init__(self, total, batch_size, every):
        self.total, self.batch_size, self.every = total, batch_size, every
        self.last_step, self.last_t = 0, time.perf_counter()

    def step(self, step, loss):
        if not self.every or (step % self.every and step != self.total):
            return
        now = time.perf_counter()
        rate = (step - self.last_step) * self.batch_size / max(now - self.last_t, 1e-9)
        print("step %d/%d  loss %.4f  %.0f samples/s" % (step, self.total, loss, rate), flush=True)
        self.last_step, self.last_t = step, now


def _log_every(every, total):
    """--log-every, or about ten lines a run when it is not given."""
    return max(total // 10, 1) if every is None else every


def _eval_steps(total, points):
    return {max(1, round(total * (i + 1) / (points + 1))) for i in range(points)} if points else set()


def _progress(total, enabled):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if enabled and tqdm is not None:
        return tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)

    class _Silent:
        def update(self, n):
            pass

        def set_postfix(self, **kw):
            pass

        def close(self):
            pass
    return _Silent()


def write_outputs(args, result):
    if args.metrics_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.metrics_out)), exist_ok=True)
        with open(args.metrics_out, "w") as f:
            json.dump(result, f, indent=1, default=_json_default)
    if args.plots:
        import plots
        plots.write_all(result, args.plots)


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError("not JSON serialisable: %r" % type(x))


def summary_line(r):
    return ("auc %.4f  logloss %.4f  acc %.4f  steps %d  %.1f s  a2a %.2f MB sent / %.2f MB plain (x%.1f)"
            % (r["auc"], r["logloss"], r["accuracy"], r["steps"], r["train_seconds"],
               r["a2a_bytes_sent"] / 1e6, r["a2a_bytes_plain"] / 1e6, r["compression_ratio"]))


def main(argv=None):
    args = cli.parser().parse_args(argv)
    try:
        cli.check_device(args)
    except cli.UsageError as e:  # before any collective library starts: one line, status 2
        if cli.launcher_rank() == 0:
            print("train.py: error: %s" % e, file=sys.stderr)
        sys.exit(2)
    backend.use(args.backend, args.device)
    backend.init()
    try:
        result = train(args)
    except (cli.UsageError, data.DataError) as e:
        # Every rank reaches the same verdict from the same input; one message is enough.
        if hvd.rank() == 0:
            print("train.py: error: %s" % e, file=sys.stderr)
        sys.exit(2)
    if hvd.rank() == 0:
        write_outputs(args, result)
        print(summary_line(result))
    backend.finish()


if __name__ == "__main__":
    main()
