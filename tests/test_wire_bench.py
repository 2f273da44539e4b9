"""The wire benchmark's byte counts (hvd_lossy.bench.wire, issue #10): what a call costs on the
link, counted back to back as a training loop runs, and with the timing's barriers."""
import pytest

from hvd_lossy.bench import netlink_worker, wire


class _FakeLink:
    """A loopback tx counter that a barrier moves by `barrier` bytes and a call by `call`."""

    def __init__(self, barrier, call):
        self.bytes, self.barrier_bytes, self.call_bytes = 0, barrier, call

    def rank(self):
        return 0

    def barrier(self):
        self.bytes += self.barrier_bytes

    def call(self):
        self.bytes += self.call_bytes

    Max = "max"

    def allreduce(self, tensor, op=None):  # time_calls' slowest-rank median: a tiny collective
        self.bytes += self.barrier_bytes
        return tensor


def test_back_to_back_count_takes_off_the_closing_barrier_and_nothing_else(monkeypatch):
    link = _FakeLink(barrier=1002, call=16331)
    monkeypatch.setattr(netlink_worker, "tx_bytes", lambda: link.bytes)
    assert netlink_worker.counted_round(link, link.call, 5) == pytest.approx(16331)


def test_timed_count_includes_each_calls_barrier(monkeypatch):
    link = _FakeLink(barrier=1002, call=16331)
    monkeypatch.setattr(netlink_worker, "tx_bytes", lambda: link.bytes)
    # time_calls runs a barrier before every call and one allreduce at the end; the closing
    # barrier adds one more
    _seconds, per_call = netlink_worker.timed_round(link, link.call, 5)
    assert per_call == pytest.approx(16331 + 1002 + 2 * 1002 / 5)


def _result(rows, mode, timed, b2b, rep=0):
    return {"mode": mode, "samples_per_rank": rows, "repeat": rep, "status": "ok",
            "link_bytes_per_call": timed, "link_bytes_back_to_back": b2b}


def test_summary_gives_median_bytes_and_ratio_for_both_counts():
    lossy = wire.MODES[1]
    results = [_result(64, "plain", t, t - 1000, rep) for rep, t in enumerate((216000, 217000, 216500))]
    results += [_result(64, lossy, t, t - 1000, rep) for rep, t in enumerate((17300, 17400, 17333))]
    got = wire.row_summary(wire.summarise(results)[64])
    assert got["plain"] == 215500 and got[lossy] == 16333
    assert got["ratio"] == pytest.approx(215500 / 16333)
    assert got["with_barriers"] == {"plain": 216500, lossy: 17333}
    assert got["ratio_with_barriers"] == pytest.approx(216500 / 17333)


def test_summary_refuses_a_failed_mode():
    with pytest.raises(RuntimeError, match="lossy 0.03 l2 failed: boom"):
        wire.summarise([{"mode": wire.MODES[1], "status": "failed", "error": "boom"}])
