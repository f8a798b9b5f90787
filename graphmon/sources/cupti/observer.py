"""Observer effect: CUDA events around sampled graph launches, tracing off ("ref") and on ("win").

``Window.observer_slowdown`` = in-window / reference replay time (the probe's ground-truth method).
Events come from a bounded per-context pool; the launch callback only pops and records them.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any, Callable, Optional

import numpy as np

from graphmon.sources.cupti.launches import LaunchRing

# The legacy default stream (0 / CU_STREAM_LEGACY) cannot be captured, and a graph launch on it
# already synchronizes with every blocking stream, so an event recorded there cannot break a
# capture; asking cuStreamIsCapturing about it during another stream's capture could.
LEGACY_STREAMS = (0, 1)


class CudaEvents:
    """Minimal driver-API event timing through ctypes (libcuda). Injectable for tests."""

    def __init__(self, lib=None) -> None:
        self.lib = lib if lib is not None else ctypes.CDLL("libcuda.so.1")
        L = self.lib
        self._elapsed = getattr(L, "cuEventElapsedTime_v2", None) or L.cuEventElapsedTime

    def create(self) -> int:
        ev = ctypes.c_void_p()
        if self.lib.cuEventCreate(ctypes.byref(ev), 0):
            raise RuntimeError("cuEventCreate failed")
        return int(ev.value or 0)

    def destroy(self, ev: int) -> None:
        self.lib.cuEventDestroy_v2(ctypes.c_void_p(ev))

    def is_capturing(self, stream: int) -> bool:
        status = ctypes.c_int(0)
        rc = self.lib.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status))
        return rc != 0 or status.value != 0  # an error: treat as capturing, i.e. don't touch it

    def record(self, ev: int, stream: int) -> bool:
        return self.lib.cuEventRecord(ctypes.c_void_p(ev), ctypes.c_void_p(stream)) == 0

    @contextlib.contextmanager
    def _current(self, ctx: int):
        """Make ``ctx`` current on this (graphmon's) thread for the duration, if it can be."""
        L = self.lib
        pushed = L.cuCtxPushCurrent_v2(ctypes.c_void_p(ctx)) == 0
        try:
            yield L
        finally:
            if pushed:
                L.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def query(self, ctx: int, ev: int) -> Optional[bool]:
        """True once the work before ``ev`` has run, False while it is pending, None if unknown."""
        with self._current(ctx) as L:
            rc = L.cuEventQuery(ctypes.c_void_p(ev))
        return True if rc == 0 else False if rc == 600 else None  # 600: CUDA_ERROR_NOT_READY

    def elapsed_ms(self, ctx: int, ev0: int, ev1: int) -> Optional[float]:
        """Waits for ev1, returns ev1 - ev0 in ms, or None if not measurable."""
        with self._current(ctx) as L:
            if L.cuEventSynchronize(ctypes.c_void_p(ev1)):
                return None
            ms = ctypes.c_float(0)
            if self._elapsed(ctypes.byref(ms), ctypes.c_void_p(ev0), ctypes.c_void_p(ev1)):
                return None
            return float(ms.value)


class EventTimer:
    """Times ring slots with a bounded pool of events (at most 2 * max_timed + 8 exist)."""

    def __init__(self, events: Any, max_timed: int, count_error) -> None:
        self.events = events
        self.max_timed = int(max_timed)
        self._count_error = count_error
        self._free: dict[int, list[int]] = {}  # ctx -> free events
        self._n = 0

    def _get(self, ctx: int) -> int:
        free = self._free.get(ctx)
        if free:
            return free.pop()
        if self._n >= 2 * self.max_timed + 8:
            return 0
        e = self.events.create()
        self._n += 1
        return e

    def _put(self, ctx: int, *evs: int) -> None:
        free = self._free.get(ctx)
        if free is None:
            free = self._free[ctx] = []
        free.extend(e for e in evs if e)

    def start(self, ring: LaunchRing, i: int) -> None:
        """Host thread, launch enter: the start event of slot i (if it may be timed)."""
        if i >= self.max_timed:
            return
        ctx, stream = ring.ctx[i], ring.stream[i]
        if stream not in LEGACY_STREAMS and self.events.is_capturing(stream):
            return
        e0 = self._get(ctx)
        if not e0:
            return
        if self.events.record(e0, stream):
            ring.ev0[i] = e0
        else:
            self._put(ctx, e0)

    def end(self, ring: LaunchRing, i: int) -> None:
        """Host thread, launch exit: the end event of slot i (when it has a start event)."""
        e0 = ring.ev0[i]
        if not e0:
            return
        ctx = ring.ctx[i]
        e1 = self._get(ctx)
        if e1 and self.events.record(e1, ring.stream[i]):
            ring.ev1[i] = e1
        else:
            ring.ev0[i] = 0
            self._put(ctx, e0, e1)

    def last_ends(self, ring: LaunchRing) -> tuple[list[tuple[int, int]], bool]:
        """(ctx, end event) of the latest timed launch on each stream of the ring, and whether
        each stream's latest launch is timed (then these events say when all of them ran)."""
        ends: dict[int, tuple[int, int]] = {}
        latest_timed: dict[int, bool] = {}
        for i in range(ring.n - 1, -1, -1):
            stream, e1 = ring.stream[i], ring.ev1[i]
            if stream not in latest_timed:
                latest_timed[stream] = bool(e1)
            if e1 and stream not in ends:
                ends[stream] = (ring.ctx[i], e1)
        return list(ends.values()), bool(ends) and all(latest_timed.values())

    def wait_ran(self, ring: LaunchRing, query, deadline: float, stopped) -> bool:
        """Wait (until perf_counter ``deadline``) for each stream's last timed launch of the ring
        to run; True when they all ran and they are every stream's last launch."""
        ends, every = self.last_ends(ring)
        for ctx, ev in ends:
            while True:
                try:
                    done = query(ctx, ev)
                except Exception:
                    self._count_error("drain_query")
                    done = None
                if done is None or stopped():  # cannot tell: stop waiting, do not claim it ran
                    return False
                if done:
                    break
                if time.perf_counter() >= deadline:
                    self._count_error("drain_timeout")  # what is still queued comes back incomplete
                    return False
                time.sleep(0.001)
        return every

    def collect(self, rings: list[LaunchRing], pause: Optional[Callable[[], None]] = None,
                piece: int = 32) -> dict[int, dict[str, list[float]]]:
        """Replay times per exec and ring phase (exec -> phase -> [ms]); every event goes back to
        the pool. ``pause``: called after every ``piece`` timed slots (the collector's GIL yield)."""
        per: dict[int, dict[str, list[float]]] = {}
        done = 0
        for ring in rings:
            for i in range(ring.n):
                e0, e1, ctx = ring.ev0[i], ring.ev1[i], ring.ctx[i]
                if not e0:
                    continue
                ms = None
                if e1:
                    try:
                        ms = self.events.elapsed_ms(ctx, e0, e1)
                    except Exception:
                        self._count_error("event_elapsed")
                ring.ev0[i] = ring.ev1[i] = 0
                self._put(ctx, e0, e1)
                if ms is not None and ms > 0:
                    per.setdefault(ring.exec_handle[i], {}).setdefault(ring.phase, []).append(ms)
                done += 1
                if pause is not None and done % piece == 0:
                    pause()
        return per

    def release(self) -> None:
        for evs in self._free.values():
            for e in evs:
                try:
                    self.events.destroy(e)
                except Exception:
                    pass
        self._free = {}
        self._n = 0


def slowdown_ratio(per: dict[int, dict[str, list[float]]], min_samples: int = 3) -> Optional[float]:
    """In-window / reference replay time: per graph the ratio of medians, weighted by the
    number of in-window samples. None when no graph has ``min_samples`` in both phases."""
    num = den = 0.0
    for d in per.values():
        r, w = d.get("ref", []), d.get("win", [])
        if len(r) >= min_samples and len(w) >= min_samples:
            ratio = float(np.median(w)) / float(np.median(r))
            num += ratio * len(w)
            den += len(w)
    return num / den if den else None
