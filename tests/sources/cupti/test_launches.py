"""LaunchRing: a window phase's launch slots (launches.py)."""

from graphmon.sources.cupti.launches import LaunchRing


def test_the_ring_says_when_its_last_launch_has_returned():
    r = LaunchRing("win", 8)
    r.reset(3)
    slots = [r.claim() for _ in range(4)]
    assert slots == [0, 1, 2, -1] and r.full and r.pending() == 3
    assert not r.mark_returned(2)  # out of order: the others are still inside their launch calls
    assert not r.mark_returned(0) and not r.mark_returned(0)  # (a repeat counts once)
    assert r.mark_returned(1) and r.pending() == 0  # every launch the phase takes, made and returned
    r.reset(2)
    assert r.pending() == 0 and r.claim() == 0 and not r.mark_returned(0)  # not full yet


def test_a_closed_ring_takes_no_launch_and_keeps_those_it_has():
    r = LaunchRing("burst", 8)
    r.reset(8)
    assert [r.claim() for _ in range(3)] == [0, 1, 2]
    r.close()
    assert r.claim() == -1 and r.n == 3 and r.pending() == 3 and r.full
    r.reset(0)
    assert r.n == 0 and r.claim() == -1
