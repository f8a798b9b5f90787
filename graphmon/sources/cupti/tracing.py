"""Kernel tracing on and off at a window's edges: from the host's launch callbacks, so that a
window traces exactly its own graph launches, each one whole.

Why in the launch callbacks (``CuptiSettings.boundary = "launch"``): CUPTI decides at a launch
whether its kernels are traced. Switched from the collector thread, tracing went on and off
while the host was inside a ``cuGraphLaunch``: on the H200 a launch cut that way came back with
132 of its 320 kernels, and a window kept tracing the launches the host made while it drained
(11,200 records in a window whose own launches made 7,680: ``bench/results/gpu-overhead.md``).
Switched in the enter callback of the window's first launch, that launch is traced whole; in
the exit callback of its last launch, no later launch is traced at all. Enabling the activity
takes 12-38 us on the H200 (``bench/results/gpu-check-9``): once per window, on the host's
thread.

Who calls what: the first window launch's enter callback ``open()``s, the last one's exit
callback ``close(wait=False)``s (host threads); the collector ``arm()``s before the window and
``close(wait=True)``s after it (a window that timed out, or ``boundary = "collector"``, where it
also opens). Each switch is claimed under a lock and made outside it: CUPTI is never called
while holding a lock a callback takes, and a callback never waits for the collector.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

MAX_WAIT_S = 1.0  # the collector's close waits this long at most for an open in progress on a host thread


class TraceSwitch:
    def __init__(self, enable: Callable[[bool], None], count_error: Callable[[str], None]) -> None:
        self._enable = enable  # CuptiActivityApi.set_kernel_activity
        self._count_error = count_error
        self._lock = threading.Lock()  # held for a few assignments, never across a CUPTI call
        self.on = False  # kernel tracing is on (the switch made)
        self._armed = False  # the window may open: the next open() switches tracing on
        self._busy = False  # a switch is being made (outside the lock)
        self.on_s = self.off_s = 0.0  # perf_counter at the last switch on / off

    def arm(self) -> None:
        """The collector, before the window: the next ``open()`` switches tracing on."""
        with self._lock:
            self._armed = True
            self.on_s = self.off_s = 0.0

    def open(self) -> bool:
        """Tracing on, once per armed window; True if this call switched it on."""
        with self._lock:
            if not self._armed or self.on or self._busy:
                return False
            self._armed = False
            self._busy = True
        ok = False
        try:
            self._enable(True)
            ok = True
        except Exception:
            self._count_error("activity_enable")
        finally:
            with self._lock:
                self.on, self._busy = ok, False
                if ok:
                    self.on_s = time.perf_counter()
        return ok

    def close(self, wait: bool) -> bool:
        """Tracing off, and no open until the next ``arm()``; True if this call switched it off.
        ``wait``: the collector waits for an open in progress on a host thread (bounded), so that
        tracing is never left on; a callback (``wait=False``) leaves that to the collector."""
        deadline = time.monotonic() + MAX_WAIT_S
        while True:
            with self._lock:
                self._armed = False
                if not self._busy:
                    if not self.on:
                        return False
                    self._busy = True
                    break
            if not wait or time.monotonic() >= deadline:
                return False
            time.sleep(0.0001)
        try:
            self._enable(False)
        except Exception:
            self._count_error("activity_disable")
        finally:
            with self._lock:
                self.on, self._busy = False, False
                self.off_s = time.perf_counter()
        return True

    @property
    def traced_s(self) -> float:
        """How long the last window traced (0 when tracing never went on)."""
        return max(0.0, self.off_s - self.on_s) if self.on_s and not self.on else 0.0
