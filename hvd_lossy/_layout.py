"""The alltoall of hvd_lossy.distributed.all_to_all_single: torch.distributed's arguments
(output filled in place, split sizes for both sides) on hvd_lossy.alltoall's exchange.

With a compressor's `row_len`, the input is the reference DLRM's flattened layout: the chunk for
destination d is `[rows_d, tables_d x row_len]`, its tables side by side. The codec wants each
table's rows as one frame of consecutive rows (one bound per table, duplicates found within a
table), so `arrange` copies each chunk into table-major order once (`[tables_d, rows_d,
row_len]`), and the receiver decodes table-major and copies each chunk back into `output`'s
interleaved layout once. How many tables a received chunk holds is read from its frame
(one segment per table), so the receiver needs no layout of its own.
"""
import torch

import hvd_lossy
from hvd_lossy.alltoall import Alltoall, checked_ids, split_list
from hvd_lossy.collective import new_output
from hvd_lossy.compressor import LossyCompressor
from hvd_lossy.protocol import GRANK, ROWS, _LocalError


def _bad(detail):
    return _LocalError(9, detail=detail)


def table_major(t, rows, tables):
    """Views `[tables_i, rows_i / tables_i, ...]` of each non-empty chunk of `t` (`[N, ...]`:
    chunk i, `[rows_i / tables_i, tables_i x ...]`, is rows_i entries of dim 0)."""
    chunks, lo = [], 0
    for n, k in zip(rows, tables):
        if n:
            chunks.append(t[lo:lo + n].view(n // k, k, *t.shape[1:]).transpose(0, 1))
        lo += n
    return chunks


def interleave_into(dest, src, rows, tables):
    """table_major undone: each chunk of `src` (`[N, ...]`, its tables one after the other)
    copied into `dest` (the same shape) with its tables side by side again."""
    at = 0
    for n, k in zip(rows, tables):
        if n:
            dest[at:at + n].view(n // k, k, *dest.shape[1:]).copy_(
                src[at:at + n].view(k, n // k, *src.shape[1:]).transpose(0, 1))
        at += n


class _TablesPlan:
    """A plain LossyCompressor with its tables per destination given by the call (the gradient
    of the autograd form, whose chunk for rank d holds rank d's tables); all else delegated."""

    def __init__(self, compressor, tables):
        self._c, self._tables = compressor, tables

    def __getattr__(self, name):
        return getattr(self._c, name)

    def plan(self, splits):
        out = []
        for dest, rows in enumerate(splits):
            k = self._tables[dest]
            if rows and (k < 1 or rows % k):
                raise ValueError(f"chunk for rank {dest} has {rows} rows, not {k} equal tables")
            out.extend([(dest, rows // k, self._c.error_bound)] * k if rows else
                       [(dest, 0, self._c.error_bound)])
        return out

    def __repr__(self):
        return repr(self._c)


class SingleAlltoall(Alltoall):
    """One lossy all_to_all_single. After wait(): `output` holds the result, `recv_tables` the
    tables of each received chunk (row_len layout only)."""

    def __init__(self, output, input, output_split_sizes, input_split_sizes, compressor, backend,
                 tables=None, ids=None, recv_ids=None):
        super().__init__(input, input_split_sizes, None, compressor, backend, ids, recv_ids)
        self._input, self.output, self.out_splits = input, output, output_split_sizes
        self.row_len = getattr(compressor, "row_len", None)
        if tables is not None and self.row_len is not None and type(compressor) is LossyCompressor:
            self.compressor = _TablesPlan(compressor, list(tables))
        self.send_tables = self.recv_tables = None

    def pack(self):
        inp, out = self._input, self.output
        if not hasattr(out, "dtype") or not hasattr(out, "is_contiguous"):
            raise _bad(f"output must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != getattr(inp, "dtype", None) or out.device != getattr(inp, "device", None):
            raise _bad(f"output is {out.dtype} on {out.device}, input "
                       f"{getattr(inp, 'dtype', None)} on {getattr(inp, 'device', None)}")
        if not out.is_contiguous():
            raise _bad("output must be contiguous")
        if self.row_len is not None:
            self._view_rows(inp, out)
        elif tuple(out.shape[1:]) != tuple(inp.shape[1:]) or out.dim() != inp.dim():
            raise _bad(f"output shape {tuple(out.shape)} and input shape {tuple(inp.shape)} "
                       "differ past dim 0")
        rows_out = out.shape[0] if self.row_len is None else out.numel() // self.row_len
        self.expect = split_list(self._rows(self.out_splits, "output_split_sizes"), rows_out,
                                 self.size)
        if isinstance(self.recv_ids, torch.Tensor):
            self.recv_ids = self._recv_ids_by_source(self.recv_ids)
        return super().pack()

    def _recv_ids_by_source(self, ids):
        """A reusing call's recv_ids in the output's layout (one key a row; with row_len
        `[rows, tables]`, the same tables from every rank) as the list the exchange takes: a
        tensor a source, its keys in the order its frame holds the rows (table-major)."""
        total = sum(self.expect)
        if self.row_len is None or ids.dim() == 1:
            if tuple(ids.shape) != (total,):
                raise _bad(f"recv_ids must have shape ({total},), one key per row received, got "
                           f"{tuple(ids.shape)}")
            return list(ids.split(self.expect))
        k = ids.shape[1] if ids.dim() == 2 else 0
        if ids.dim() != 2 or k < 1 or ids.shape[0] * k != total or any(e % k for e in self.expect):
            raise _bad(f"recv_ids must have shape (rows, tables) with rows x tables = {total}, "
                       f"the same tables from every rank, got {tuple(ids.shape)}")
        return [block.t().reshape(-1) for block in ids.split([e // k for e in self.expect])]

    def _rows(self, splits, what):
        if splits is None or self.row_len is None:
            return splits
        values = [int(s) for s in splits]
        for d, v in enumerate(values):
            if v % self.row_len:
                raise _bad(f"{what}[{d}] = {v} elements is not a whole number of rows of "
                           f"row_len {self.row_len}")
        return [v // self.row_len for v in values]

    def _view_rows(self, inp, out):
        for what, t in (("input", inp), ("output", out)):
            if t.dim() != 1 or t.numel() % self.row_len:
                raise _bad(f"row_len={self.row_len} needs 1-D tensors of whole rows, {what} has "
                           f"shape {tuple(t.shape)}")
        self.splits = self._rows(self.splits, "input_split_sizes")
        self.tensor = inp.reshape(-1, self.row_len)

    def arrange(self, tensor, plan):
        if self.row_len is None:
            return tensor
        tables = []
        for dest, rows in enumerate(self.rows_to):
            pieces = [p[1] for p in plan if p[0] == dest]
            if rows and any(r != pieces[0] for r in pieces):
                raise _bad(f"row_len layout: the frames for rank {dest} have rows {pieces}; "
                           "interleaved tables need one frame per table, all of equal rows")
            tables.append(len(pieces) if rows else 0)
        self.send_tables = tables
        chunks = self._table_major(tensor)
        if not chunks:
            return tensor
        flat = new_output(tuple(tensor.shape), tensor.dtype, tensor.device)
        at = 0
        for c in chunks:  # the one copy into table-major order
            n = c.shape[0] * c.shape[1]
            flat[at:at + n].view(c.shape).copy_(c)
            at += n
        return flat

    def _table_major(self, t):
        """table_major of the chunks this call sends."""
        return table_major(t, self.rows_to, self.send_tables)

    def keys(self, tensor):
        if self.ids is None or self.row_len is None:
            return super().keys(tensor)
        ids, n = self.ids, tensor.shape[0]
        kinds = {k for n_d, k in zip(self.rows_to, self.send_tables) if n_d}
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and len(kinds) <= 1:
            k = kinds.pop() if kinds else ids.shape[1]
            if tuple(ids.shape) != (n // max(k, 1), k):
                raise _bad(f"ids must have shape ({n // max(k, 1)}, {k}): one key per row and "
                           f"table of the [rows, tables x {self.row_len}] input, got "
                           f"{tuple(ids.shape)}")
            ids = ids.reshape(-1)
        elif isinstance(ids, torch.Tensor) and ids.dim() != 1:
            raise _bad(f"ids must be 1-D, one key per {self.row_len} elements of the input "
                       f"({n}), when the chunks hold different numbers of tables "
                       f"{self.send_tables}; got shape {tuple(ids.shape)}")
        keys = checked_ids(ids, tensor)
        chunks = self._table_major(keys.reshape(-1, 1))
        return torch.cat([c.reshape(-1) for c in chunks]) if chunks else keys

    def output_for(self, shape, dtype):
        if self.row_len is not None:
            return new_output(shape, dtype, self.device)
        if self.output.numel() != _numel(shape):
            raise _LocalError(11, -1, detail=f"received {shape[0]} rows in all, output holds "
                                             f"{self.output.shape[0]}")
        return self.output.view(shape)

    def decode(self, recv, counts, headers):
        for src, (h, want) in enumerate(zip(headers, self.expect)):
            if h[ROWS] != want:
                unit = "rows" if self.row_len is None else f"rows of {self.row_len}"
                raise _LocalError(11, h[GRANK], detail=f"rank {h[GRANK]} sent {h[ROWS]} {unit}, "
                                                       f"output_split_sizes[{src}] expects {want}")
        out = super().decode(recv, counts, headers)
        if self.row_len is None:
            return out
        self.recv_tables = self._received_tables(recv, counts, headers)
        interleave_into(self.output.view(-1, self.row_len), out, [h[ROWS] for h in headers],
                        self.recv_tables)
        return out

    def _received_tables(self, recv, counts, headers):
        """Tables of each received chunk: one segment per table (the own chunk: as sent)."""
        tables, offset = [], 0
        for src, (n, h) in enumerate(zip(counts, headers)):
            if src == self.me:
                tables.append(self.send_tables[src])
            elif not h[ROWS]:
                tables.append(0)
            else:
                k = (self.heads[src].segments if recv.is_cuda  # read from its prefix
                     else len(hvd_lossy.frame_info(recv[offset:offset + n])["segments"]))
                if h[ROWS] % k:
                    raise _LocalError(11, h[GRANK], detail=f"{h[ROWS]} rows in {k} segments: not "
                                                           "one segment per table of equal rows")
                tables.append(k)
            offset += n
        return tables

    def result(self, output):
        return self.output, self.received


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
