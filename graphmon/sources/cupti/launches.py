"""The graph launches a window phase takes, in preallocated slots.

The launch callback runs on the host's thread inside cuGraphLaunch: it claims a slot under a
tiny lock (never held by anything slow: decoding takes no lock at all) and writes integers into
preallocated lists, so it grows no list and builds no tuple. The collector reads the slots
after the phase (`columns()`), when the callbacks no longer write them.
"""

from __future__ import annotations

import threading

import numpy as np

SEARCH_BACK = 64  # an exit callback looks this far back for its own enter (host threads interleave)


class LaunchRing:
    """Fixed-capacity launch slots of one phase ("ref" or "win")."""

    def __init__(self, phase: str, capacity: int) -> None:
        self.phase = phase
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self.n = 0  # slots claimed
        self.cap = self.capacity  # launches this phase takes (the window's target, at most capacity)
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
            self.n = 0
            self.cap = min(int(cap), self.capacity)

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

    @property
    def full(self) -> bool:
        return self.n >= self.cap

    def pending(self) -> int:
        """Launches whose API call has not returned yet."""
        n = self.n
        return n - sum(self.returned[:n])

    def columns(self) -> dict[str, np.ndarray]:
        n = self.n
        return {
            "correlation_id": np.array(self.corr[:n], np.int64),
            "exec_handle": np.array(self.exec_handle[:n], np.uint64),
            "launch_ns": np.array(self.launch_ns[:n], np.int64),
            "stream": np.array(self.stream_id[:n], np.int64),
        }
