"""The waits' back-off (ranks.transport): a poked wait's naps, and an exchange's two phases."""

from nvlink_emu.ranks import transport
from nvlink_emu.ranks.transport import POKED_FIRST_NAP_S, POKED_MAX_NAP_S, Idle, PhasedIdle, poked_idle


def _naps(monkeypatch, idle, calls: int) -> list:
    """The sleeps `calls` calls of `idle` take (no Waker open: time.sleep; a yield is 'yield')."""
    slept = []
    monkeypatch.setattr(transport, "_waker", None)
    monkeypatch.setattr(transport.time, "sleep", slept.append)
    monkeypatch.setattr(transport.os, "sched_yield", lambda: slept.append("yield"))
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


def test_an_exchange_sleeps_through_its_round_and_polls_after(monkeypatch):
    in_round = [True]
    poked, polling = poked_idle(), Idle()
    phased = PhasedIdle(lambda: in_round[0], poked, polling)
    naps = _naps(monkeypatch, phased, 3)
    assert naps == [POKED_FIRST_NAP_S, 2 * POKED_FIRST_NAP_S, 3 * POKED_FIRST_NAP_S]
    in_round[0] = False  # its second step (an Iallgatherv) is posted: nobody pokes for it
    naps = _naps(monkeypatch, phased, 2)
    assert naps == ["yield", "yield"]
    phased.reset()
    assert poked.spins == polling.spins == 0
