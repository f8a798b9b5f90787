"""TraceSwitch: kernel tracing on and off from the launch callbacks and the collector (tracing.py)."""

import threading
import time

from graphmon.sources.cupti.tracing import TraceSwitch


class Cupti:
    def __init__(self, delay_s=0.0, fail=()):
        self.calls, self.delay_s, self.fail = [], delay_s, set(fail)

    def enable(self, on):
        time.sleep(self.delay_s)
        if on in self.fail:
            raise RuntimeError("CUPTI_ERROR_UNKNOWN")
        self.calls.append(on)


def test_open_once_per_armed_window_and_close_once():
    c, errors = Cupti(), []
    t = TraceSwitch(c.enable, errors.append)
    assert not t.open() and c.calls == []  # not armed: a launch outside a window never switches
    t.arm()
    assert t.open() and t.on and not t.open()  # the window's first launch only
    assert t.close(wait=False) and not t.on and not t.close(wait=True)
    assert c.calls == [True, False] and t.traced_s > 0
    assert not t.open()  # closed: not again until the next arm
    t.arm()
    assert t.traced_s == 0.0  # a new window: nothing traced yet
    assert not t.close(wait=True) and c.calls == [True, False]  # never opened: nothing to switch
    assert not errors


def test_the_collectors_close_waits_for_an_open_in_progress_and_a_callbacks_does_not():
    c = Cupti(delay_s=0.05)
    t = TraceSwitch(c.enable, lambda s: None)
    t.arm()
    th = threading.Thread(target=t.open)
    th.start()
    time.sleep(0.01)  # the host thread is inside the enable
    assert not t.close(wait=False)  # a callback never waits
    assert t.close(wait=True) and not t.on  # the collector does: tracing is never left on
    th.join()
    assert c.calls == [True, False] and not t.on


def test_a_failed_switch_is_counted_and_leaves_tracing_off():
    errors = []
    t = TraceSwitch(Cupti(fail={True}).enable, errors.append)
    t.arm()
    assert not t.open() and not t.on and errors == ["activity_enable"]
    t = TraceSwitch(Cupti(fail={False}).enable, errors.append)
    t.arm()
    assert t.open() and t.close(wait=True) and not t.on and errors[-1] == "activity_disable"
