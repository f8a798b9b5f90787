"""The graph launches a window phase takes, in preallocated slots.

The launch callback runs on the host's thread inside cuGraphLaunch: it claims a slot under a
tiny lock (never held by anything slow: decoding takes no lock at all) and writes integers into
preallocated lists, so it grows no list and builds no tuple. The collector reads the slots
after the phase (`columns()`), when the callbacks no longer write them.
"""

from __future__ import annotations

import threading
import time

import numpy as np

SEARCH_BACK = 64  # an exit callback looks this far back for its own enter (host threads interleave)


class LaunchRing:
    """Fixed-capacity launch slots of one phase ("ref", "win" or an untraced "burst")."""

    def __init__(self, phase: str, capacity: int) -> None:
        self.phase = phase
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self.n = 0  # slots claimed
        self.n_returned = 0  # of them, launches whose API call has returned
        self.cap = self.capacity  # launches this phase takes (the window's target, at most capacity)
        # the slot whose launch wakes the collector (-1: none): the reference phase's first (it
        # opens the window), a burst's last (the callback goes off); one Event.set per phase
        self.wake_on = -1
        c = self.capacity
        self.corr = [0] * c
        self.exec_handle = [0] * c
        self.launch_ns = [0] * c
        self.ctx = [0] * c
        self.stream = [0] * c  # the launch stream's handle
        self.stream_id = [-1] * c  # its CUPTI stream id
        self.ev0 = [0] * c  # CUDA events around the launch (0: not timed)
        self.ev1 = [0] * c
        self.returned = [False] * c  # the launch's API call has returned (its end event is recorded)

    def reset(self, cap: int) -> None:
        """Collector thread, while no callback writes this ring (its phase is off)."""
        with self._lock:
            self.n = self.n_returned = 0
            self.cap = min(int(cap), self.capacity)

    def close(self) -> None:
        """Collector thread: no launch claims a slot any more (the phase keeps those it has)."""
        with self._lock:
            self.cap = self.n

    def claim(self) -> int:
        """A slot for a new launch, or -1 when the phase has all its launches."""
        with self._lock:
            i = self.n
            if i >= self.cap:
                return -1
            self.n = i + 1
        self.returned[i] = False
        self.ev0[i] = self.ev1[i] = 0
        return i

    def find(self, corr: int) -> int:
        """The slot of the launch with correlation id ``corr`` among the latest ones, or -1."""
        n = self.n
        i = n - 1
        stop = max(-1, n - 1 - SEARCH_BACK)
        corrs = self.corr
        while i > stop:
            if corrs[i] == corr:
                return i
            i -= 1
        return -1

    def mark_returned(self, i: int) -> bool:
        """Host thread, launch exit: slot i's API call has returned (after its end event).
        True when that makes the phase complete: every launch it takes made and returned."""
        with self._lock:
            if not self.returned[i]:
                self.returned[i] = True
                self.n_returned += 1
            return self.n >= self.cap and self.n_returned >= self.n

    @property
    def full(self) -> bool:
        return self.n >= self.cap

    def pending(self) -> int:
        """Launches whose API call has not returned yet."""
        return self.n - self.n_returned

    def columns(self) -> dict[str, np.ndarray]:
        n = self.n
        return {
            "correlation_id": np.array(self.corr[:n], np.int64),
            "exec_handle": np.array(self.exec_handle[:n], np.uint64),
            "launch_ns": np.array(self.launch_ns[:n], np.int64),
            "stream": np.array(self.stream_id[:n], np.int64),
        }


class LaunchGate:
    """Switches CUPTI's launch callbacks without splitting a launch's enter/exit pair.

    The collector turns the launch callbacks off from its own thread while a host thread may be
    inside cuGraphLaunch (between its enter and exit callbacks: a first launch that uploads, a
    launch blocked on a full queue, a serving loop that never pauses). The exit callback of that
    launch is then never delivered. Seen on the H200 (tests/gpu/test_live_cupti.py; confirmed by
    A/B with ``launch_gate`` off: repeated_corr 112, bench/results/gpu-check-4/README.md): after
    such a split every later launch of the process carried one early correlation id (8 or 9),
    in graphmon's windows and in torch.profiler's own session after detach (duplicate flow ids:
    Kineto's ``inserted.second`` assert). So an ``off`` waits (returns False, the caller retries
    at its next poll) while a launch is in flight, and a launch whose enter callback raced an
    ``off`` switches the callbacks back on, so that its exit is delivered.
    """

    def __init__(self, max_defer_s: float = 1.0, enabled: bool = True) -> None:
        self.enabled = enabled  # False: switch at once, as before (A/B diagnostics)
        self._lock = threading.Lock()  # held for a few integer updates and one CUPTI enable call
        self.max_defer_s = max_defer_s  # an exit that never comes (a host thread killed) cannot pin them on
        self._defer_since = 0.0
        self.on = False  # what graphmon last asked CUPTI for
        self.in_flight = 0  # launches whose enter callback ran and whose exit has not yet
        self.deferred = 0  # offs put off because a launch was in flight
        self.reenabled = 0  # enter callbacks that found the callbacks switched off under them
        self.repeated_corr = 0  # enter callbacks with the previous launch's correlation id
        self._last_corr = 0

    def set(self, on: bool, enable) -> bool:
        """``enable(bool)`` switches CUPTI; True when the callbacks are now ``on``."""
        with self._lock:
            if on == self.on:
                return True
            if not on and self.in_flight > 0 and self.enabled:
                now = time.monotonic()
                if not self._defer_since:
                    self._defer_since = now
                if now - self._defer_since < self.max_defer_s:
                    self.deferred += 1
                    return False
            enable(on)
            self.on = on
            self._defer_since = 0.0
            return True

    def forget(self) -> None:
        """After unsubscribe: nothing is enabled, no exit will come."""
        with self._lock:
            self.on, self.in_flight = False, 0

    def enter(self, corr: int, enable) -> None:
        with self._lock:
            self.in_flight += 1
            if corr and corr == self._last_corr:
                self.repeated_corr += 1  # CUPTI's correlation ids stopped advancing
            self._last_corr = corr
            if not self.on and self.enabled:  # switched off after CUPTI called this enter: its exit would be lost
                self.reenabled += 1
                enable(True)  # raises only when unsubscribed (the caller counts it)
                self.on = True

    def exit(self) -> None:
        with self._lock:
            if self.in_flight > 0:
                self.in_flight -= 1
