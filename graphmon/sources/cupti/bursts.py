"""Untraced replay times: bursts of graph launches timed with CUDA events between windows, kernel
tracing off, and the rows a window ships (``WindowRecords.untraced``).

Why: every figure a window gives is taken with kernel tracing on, and tracing changes what it
measures (docs/observer-effect.md); a window also times only its few launches. A burst times up
to ``untraced_burst_launches`` graph launches (``untraced_burst_duration_ms`` at most) every
``untraced_burst_interval_s`` with the reference phase's machinery (observer.EventTimer on a
LaunchRing: events recorded in the launch callbacks, the launch stream's enter and exit), then
the launch callback goes off again. The reference phase before each window (same method) feeds
the same rows.

Rules (the collector thread runs a burst; ``CuptiSource._run`` asks ``_burst_at``):
- a burst never starts while a window is due or armed, and a window that falls due waits for
  the burst to end (the collector thread does one at a time), so none overlaps a kernel window;
- a burst needs the subscription (the launch callbacks) and event timing (``observer="events"``);
  with ``idle_unsubscribe_s`` it happens only while subscribed;
- its rows (exec resolved to a CUPTI graph id at the burst's end) are held, at most
  ``MAX_HELD_ROWS``, until the next delivered window takes them; beyond that they are dropped
  and counted (``stats["untraced_dropped"]``, error stage ``untraced_rows_capped`` once per
  burst that hit it).

Cost, from the H200's per-launch costs of this method (docs/observer-effect.md, "Timing every
replay"), as arithmetic, not yet measured as bursts (bench/overhead/burst_cost.py is ready for the
H200): a timed launch costs the GPU +2.3-2.6 us, the launch call about +7 us (+6.9 [+6.3, +7.9])
and, on HF's host-bound 1.33 ms step, the step +28.7 us (+2.1% [+1.2, +3.2]: at most ~43 us).
At the defaults (128 launches every 30 s) that is, averaged over time, 128 x 43 us = 5.5 ms per
30 s = 0.018% on the worst step measured, 128 x 2.6 us = 0.33 ms per 30 s = 0.0011% of the GPU,
and 128 x 7.9 us = 1.0 ms per 30 s = 0.0034% of a host thread: far under 0.1% of a 1-2 ms step.
The launches made between the burst's last one and the collector switching the callback off pay
the bare callback (+1.3 us); the collector reads the events back in pieces (``Pacer``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Optional

import numpy as np

from graphmon.sources.cupti.launches import LaunchRing
from graphmon.sources.cupti.registry import GraphRegistry

# Rows held between two delivered windows: windows come every interval_s..max_interval_s (10-60 s)
# and bursts every 30 s with 128 rows at the defaults, so this holds ~16 minutes of bursts (a
# window answers long before: the cap bounds memory when windows stop, e.g. a long capture).
MAX_HELD_ROWS = 4096
_COLLECT_PIECE = 32  # event pairs read back between two GIL yields (each is a few ctypes calls)


def timed_rows(per: dict[int, dict[str, list[float]]], phase: str,
               registry: GraphRegistry) -> tuple[np.ndarray, np.ndarray]:
    """(CUPTI graph id, duration_ns) of the ``phase`` times in observer.EventTimer.collect's
    ``per`` (exec -> phase -> [ms]), each exec's graph resolved from the registry now (it may be
    destroyed by the time the window ships); -1: not known."""
    registry.resolve_ids()
    gids, nss = [], []
    for h, d in per.items():
        ms = d.get(phase)
        if not ms:
            continue
        info = registry.get(int(h))
        ns = np.rint(np.asarray(ms, np.float64) * 1e6).astype(np.int64)
        nss.append(ns[ns > 0])
        gids.append(np.full(len(nss[-1]), info.graph_id if info is not None and info.graph_id > 0 else -1, np.int64))
    if not nss:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(gids), np.concatenate(nss)


class UntracedRows:
    """The bursts' untraced replay times, held until the next delivered window; bounded."""

    def __init__(self, max_rows: int = MAX_HELD_ROWS) -> None:
        self.max_rows = int(max_rows)
        self._graph_id = np.zeros(self.max_rows, np.int64)  # CUPTI graph id, -1: unknown
        self._duration_ns = np.zeros(self.max_rows, np.int64)
        self.n = 0
        self.dropped = 0  # rows that did not fit (cumulative)

    def add(self, graph_id: np.ndarray, duration_ns: np.ndarray) -> int:
        """Hold rows (timed_rows); returns how many did not fit (dropped, counted)."""
        k = min(len(duration_ns), self.max_rows - self.n)
        self._graph_id[self.n:self.n + k] = graph_id[:k]
        self._duration_ns[self.n:self.n + k] = duration_ns[:k]
        self.n += k
        lost = len(duration_ns) - k
        self.dropped += lost
        return lost

    def take(self, graph_id: np.ndarray, duration_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row held, in arrival order, then the given ones (a window's reference phase:
        not held, capped on their own at ``max_rows``: a window ships 2 x max_rows at most,
        under the wire's cap); empties the store."""
        k = min(len(duration_ns), self.max_rows)
        self.dropped += len(duration_ns) - k
        out = (np.concatenate([self._graph_id[:self.n], graph_id[:k]]),
               np.concatenate([self._duration_ns[:self.n], duration_ns[:k]]))
        self.n = 0
        return out


class BurstPhase:
    """A mixin of CuptiSource (collector.py), on the collector thread only, except where noted. It
    uses the source's ``settings``, ``registry``, ``stats``, ``_timer``/``observer``, ``_ring``,
    ``_wake``, ``_stop``, ``pacer``, ``subscription``, ``_set_launch_cb``/``_sync_launch_cb``
    and ``count_error``."""

    def _init_bursts(self) -> None:
        s = self.settings
        # never more than the events the timer may use for one phase
        self._burst_n = min(s.untraced_burst_launches, s.max_timed_launches)
        self._burst = LaunchRing("burst", max(1, self._burst_n))
        self._burst_next_s = math.inf  # monotonic time of the next burst (set when the collector starts)
        self.untraced = UntracedRows()
        # per burst (benchmarks place host steps in them): perf_counter at its start and end (its
        # events read back), and the replays it timed
        self.burst_log: deque[tuple[float, float, int]] = deque(maxlen=256)
        self.stats.update(untraced_bursts=0, untraced_burst_rows=0, untraced_dropped=0, last_burst_ms=0.0)

    def _burst_at(self, now: float, restart: bool = False) -> float:
        """Monotonic time the next burst is due; inf while bursts are off, there is no event
        timing or no subscription (then the next one is an interval after they are back).
        ``restart``: the collector starts, the first burst is an interval away."""
        on = self._burst_n > 0 and self.observer == "events" and self.subscription.subscribed
        if restart or not on:
            self._burst_next_s = math.inf
        if not on:
            return math.inf
        if self._burst_next_s == math.inf:
            self._burst_next_s = now + self.settings.untraced_burst_interval_s
        return self._burst_next_s

    def _run_burst(self) -> None:
        """One burst: the launch callback on, up to ``_burst_n`` launches timed, tracing off; then
        the callback off, the launches' events read back into ``untraced``."""
        s, ring, timer = self.settings, self._burst, self._timer
        if timer is None:
            return
        self._burst_next_s = time.monotonic() + s.untraced_burst_interval_s
        t0 = time.perf_counter()
        ring.reset(self._burst_n)
        ring.wake_on = ring.cap - 1  # the burst's last launch wakes the collector: the callback goes off soon
        self._wake.clear()
        self._ring = ring
        self._set_launch_cb(True)
        deadline = t0 + s.untraced_burst_duration_ms / 1e3
        while not self._stop.is_set() and not ring.full:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            self._wake.wait(min(left, 0.25))
            self._wake.clear()
        self._ring = None  # no launch joins it from now on ...
        ring.close()  # ... not even one whose enter callback read _ring just before
        self._sync_launch_cb()  # off (unless an exec's first launch is pending; a launch in flight defers it)
        if self._stop.is_set():
            return  # stopping: the burst's rows are not read back (events may still be queued)
        end = time.perf_counter() + s.max_drain_ms / 1e3
        while ring.pending() and time.perf_counter() < end and not self._stop.is_set():
            self.pacer.sleep(0.0002)  # an end event is recorded when its launch call returns
        query = getattr(timer.events, "query", None)
        if query is not None and ring.n and not self._stop.is_set():
            timer.wait_ran(ring, query, end, self._stop.is_set)  # read back only events that ran: no blocking sync
        self.pacer.start_piece()
        rows = timed_rows(timer.collect([ring], pause=self.pacer.pause, piece=_COLLECT_PIECE), "burst", self.registry)
        ring.reset(0)  # empty: the exit callbacks of later launches do not search its slots
        lost = self.untraced.add(*rows)
        st = self.stats
        st["untraced_bursts"] += 1
        st["untraced_burst_rows"] = len(rows[1])  # the last burst's
        st["untraced_dropped"] = self.untraced.dropped
        t1 = time.perf_counter()
        st["last_burst_ms"] = (t1 - t0) * 1e3
        self.burst_log.append((t0, t1, len(rows[1])))
        if lost:
            self.count_error("untraced_rows_capped")

    def _take_untraced(self, per: Optional[dict[int, dict[str, list[float]]]]) -> tuple[np.ndarray, np.ndarray]:
        """A delivered window's untraced rows: the bursts' held since the last window, then its
        reference phase's (``per``: the window's EventTimer.collect; None without timing)."""
        out = self.untraced.take(*timed_rows(per or {}, "ref", self.registry))
        self.stats["untraced_dropped"] = self.untraced.dropped
        return out
