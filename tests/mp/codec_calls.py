"""What the codec is given inside a multi-process worker (any launcher): CodecCalls records
the calls of hvd_lossy.compress_grouped, the one codec call of every lossy all-to-all."""
import torch

import hvd_lossy


class CodecCalls:
    """Records what hvd_lossy.compress_grouped (the codec call of every lossy alltoall) is
    given while the block runs: (rows tensor, rows of each piece, ids) per call."""

    def __enter__(self):
        self.calls, self._real = [], hvd_lossy.compress_grouped

        def recording(tensor, rows, *args, **kwargs):
            self.calls.append((tensor.clone(), list(rows), kwargs.get("ids")))
            return self._real(tensor, rows, *args, **kwargs)
        hvd_lossy.compress_grouped = recording
        return self

    def __exit__(self, *exc):
        hvd_lossy.compress_grouped = self._real

    def assert_ids_match_rows(self):
        """Every coded piece's ids tell the truth: rows under one id are equal in bits (the
        callers' ids are truthful, so misaligned ids would pair rows that differ)."""
        assert self.calls, "no codec call"
        for tensor, rows, ids in self.calls:
            assert ids is not None and ids.shape == (tensor.shape[0],), "ids did not reach the codec"
            at = 0
            for n in rows:
                piece, keys = tensor[at:at + n], ids[at:at + n]
                for key in keys.unique():
                    same = piece[keys == key]
                    assert torch.equal(same, same[:1].expand_as(same)), f"id {int(key)} misaligned"
                at += n

