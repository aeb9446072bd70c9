"""The waits' back-off (ranks.transport): a poked wait's naps, and an exchange's two phases."""

from nvlink_emu.ranks.transport import job as transport_job
from nvlink_emu.ranks.transport import Idle, poked_idle
from nvlink_emu.ranks.transport.job import POKED_FIRST_NAP_S, POKED_MAX_NAP_S


def _naps(monkeypatch, idle, calls: int) -> list:
    """The sleeps `calls` calls of `idle` take (no Waker open: time.sleep; a yield is 'yield')."""
    slept = []
    monkeypatch.setattr(transport_job, "_waker", None)
    monkeypatch.setattr(transport_job.time, "sleep", slept.append)
    monkeypatch.setattr(transport_job.os, "sched_yield", lambda: slept.append("yield"))
    for _ in range(calls):
        idle()
    return slept


def test_a_poked_wait_naps_at_once_growing_to_its_cap(monkeypatch):
    naps = _naps(monkeypatch, poked_idle(), 12)
    assert "yield" not in naps
    assert naps[0] == POKED_FIRST_NAP_S and naps[1] == 2 * POKED_FIRST_NAP_S
    assert max(naps) == POKED_MAX_NAP_S == naps[-1]


def test_a_polling_wait_yields_first_then_naps_short(monkeypatch):
    naps = _naps(monkeypatch, Idle(), 10)
    assert naps[:8] == ["yield"] * 8 and naps[8] == 1e-5
