"""The launch callbacks are never switched off inside a launch (LaunchGate), and a window's
launches reach its ring as soon as ``in_window`` says so (tests/gpu/test_live_cupti.py flakes)."""

import threading
import time

import numpy as np
import pytest

from graphmon.model.window import CaptureRequest
from graphmon.settings import CuptiSettings
from graphmon.sources.cupti.collector import CuptiSource
from graphmon.sources.cupti.launches import LaunchGate
from graphmon.sources.cupti.registry import GraphRegistry

from helpers import wait_until
from fake_cupti import FakeCupti, FakeEvents, decode_like

MAIN = 7


def make(**kw):
    fake, windows = FakeCupti(), []
    opts = dict(window_launches=6, window_duration_ms=200, poll_s=0.005, drain_ms=0)
    opts.update(kw)
    src = CuptiSource(cupti=fake, settings=CuptiSettings(**opts), events=FakeEvents(fake), registry=GraphRegistry())
    return fake, src, windows


wait_for = wait_until  # tests/helpers.py


def _capture(fake, src, windows, h, replays):
    n0 = len(windows)
    src.request_capture(CaptureRequest(id=f"c{n0}", replays=replays))
    t0 = time.monotonic()
    while len(windows) == n0 and time.monotonic() - t0 < 10:
        fake.launch(h, MAIN)
        time.sleep(0.0005)
    assert len(windows) > n0
    return windows[-1]


def test_first_launch_in_flight_keeps_the_callbacks_on_until_its_exit():
    # The fixture of the GPU test: an exec's first launch (which uploads a lazy graph: slow)
    # ends the first-launch wait at its enter callback. The collector, polling, switched the
    # launch callbacks off before that launch's exit callback: the exit was lost. The fake
    # models what the H200 then showed: every later launch carries that launch's correlation
    # id, so a 5-launch window came back as one "replay" of one id.
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, poll_s=0.002)
    fake.stick_on_lost_exit = True
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(2))
    fake.launch(h, MAIN, block_s=0.1)  # ~50 collector polls between its enter and its exit
    assert fake.stuck_corr is None  # the exit was delivered
    assert wait_for(lambda: not fake.launch_callbacks)  # and off after it
    w = _capture(fake, src, windows, h, 5)
    corr = np.unique(w.trace.correlation_id)
    assert len(corr) == 5 and w.trace.n_launches == 5, (corr, dict(w.trace.invalid))
    assert src.stats["launch_cb_deferred"] >= 1 and src.stats["repeated_correlation"] == 0, src.stats
    src.stop()


def test_window_close_never_cuts_a_launch_in_flight():
    # test_upload_modes_detected's loop launches without pause while its window is delivered
    # (when the collector switches the launch callbacks off): launches blocked on a full queue
    # keep their exit callbacks, and the next window still has one id per launch.
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, poll_s=0.002, observer="off")
    fake.stick_on_lost_exit = True
    src.start(windows.append)
    h = fake.instantiate(decode_like(2))
    fake.launch(h, MAIN)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            fake.launch(h, MAIN, block_s=0.003)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        for _ in range(3):
            n0 = len(windows)
            src.request_capture(CaptureRequest(id=f"c{n0}", replays=4))
            assert wait_for(lambda: len(windows) > n0)
        assert fake.stuck_corr is None
    finally:
        stop.set()
        t.join(5)
    w = _capture(fake, src, windows, h, 5)
    assert len(np.unique(w.trace.correlation_id)) == 5, dict(w.trace.invalid)
    src.stop()


@pytest.mark.parametrize("boundary", ["launch", "collector"])
def test_in_window_only_once_the_window_ring_takes_launches(boundary):
    # The GPU test starts launching as soon as in_window is True: a launch made then must be one
    # of the window's (traced, and in its ring), never traced and left out of its own window.
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, boundary=boundary, window_duration_ms=300)
    src.start(windows.append)
    h = fake.instantiate(decode_like(1))
    assert wait_for(lambda: src.health().state == "running")
    src.request_capture(CaptureRequest(id="c", replays=3, duration_ms=300))
    t0 = time.monotonic()
    while not src.in_window and time.monotonic() - t0 < 10:
        fake.launch(h, MAIN)
        time.sleep(0.0005)
    corr = [fake.launch(h, MAIN) for _ in range(2)]
    assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    t = windows[0].trace
    assert set(corr) <= set(t.launches["correlation_id"].tolist())
    assert set(corr) <= set(t.correlation_id.tolist()) and not t.invalid


def test_gate_defers_off_while_a_launch_is_in_flight():
    calls = []
    g = LaunchGate(max_defer_s=0.05)
    assert g.set(True, calls.append) and calls == [True]
    g.enter(11, calls.append)
    assert not g.set(False, calls.append) and calls == [True] and g.deferred == 1
    g.exit()
    assert g.set(False, calls.append) and calls == [True, False]
    # an enter that CUPTI called just before the off: it switches them back on for its exit
    g.enter(12, calls.append)
    assert calls == [True, False, True] and g.on and g.reenabled == 1
    g.exit()
    # a repeated correlation id is counted (CUPTI's ids stopped advancing)
    g.enter(12, calls.append)
    assert g.repeated_corr == 1
    # an exit that never comes cannot pin the callbacks on: max_defer_s
    assert not g.set(False, calls.append)
    time.sleep(0.06)
    assert g.set(False, calls.append) and calls[-1] is False


def test_gate_off_switches_at_once_as_before():
    calls = []
    g = LaunchGate(enabled=False)
    g.set(True, calls.append)
    g.enter(5, calls.append)
    assert g.set(False, calls.append) and calls == [True, False]
    g.enter(6, calls.append)
    assert calls == [True, False] and not g.on


def test_detach_takes_every_buffer_back_before_unsubscribing():
    # torch.profiler (Kineto) registers its own buffer callbacks after graphmon's detach: no
    # buffer of graphmon's may be left with CUPTI then, and no activity kind left on.
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, observer="off")
    order = []
    real_flush, real_unsub = fake.flush, fake.unsubscribe
    fake.flush = lambda forced=False: (order.append(("flush", forced)), real_flush(forced))[1]
    fake.unsubscribe = lambda: (order.append(("unsubscribe", len(fake.free))), real_unsub())[1]
    src.start(windows.append)
    h = fake.instantiate(decode_like(2))
    _capture(fake, src, windows, h, 3)
    order.clear()
    src.stop()
    assert order[0] == ("flush", True) and order[-1] == ("unsubscribe", len(fake._buffers)), order
    assert not fake.activity and not fake.launch_callbacks and fake.handler is None
