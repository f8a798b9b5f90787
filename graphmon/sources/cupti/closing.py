"""Closing a window: the drain (tracing stays on until the window's launches ran on the GPU),
tracing off, and the delivery of its records to the sink and taps.

A mixin of CuptiSource (collector.py), on the collector thread only. It uses the source's rings
(``_win``, ``_ref``), ``trace`` (tracing.TraceSwitch) and ``_switch_on_launch``, ``settings``,
``api``, ``pacer``, ``ingest``, ``registry``, ``stats``,
``subscription``, ``_timer``/``observer``, ``_stop``, ``graph_kernels``, the untraced rows
(bursts.BurstPhase ``_take_untraced``) and the consumers
(``_sink``, ``taps``, ``records_sink``, ``last_window``, ``last_raw``).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from graphmon.model.edges import assemble
from graphmon.model.window import CaptureRequest
from graphmon.sources.base import wall_time
from graphmon.sources.cupti.assemble import raw_columns, window_records
from graphmon.sources.cupti.observer import slowdown_ratio
from graphmon.sources.cupti.records import KernelColumns


class WindowClose:
    def _close_tracing(self) -> tuple[bool, int]:
        """Tracing off, and the window's launches drained: (True when CUDA events say every
        window launch ran, CUPTI's clock then; 0 when not known). Boundary "launch": the last
        launch's return switched tracing off already; a window that timed out (fewer launches)
        switches it off here, once the launch calls in flight have returned (traced whole).
        Boundary "collector": ``close`` says whether tracing stays on while the launches drain."""
        s = self.settings
        deadline = time.perf_counter() + max(s.drain_ms, s.max_drain_ms) / 1e3
        if not self._switch_on_launch and s.close == "disable_first":
            self._disable_tracing()  # at once, launch calls in flight or not
        self._wait_returned(deadline)
        if self._switch_on_launch:
            self._disable_tracing()  # (done by the last launch's return, unless the window timed out)
        drained = not self._stop.is_set() and self._wait_ran(deadline)
        ran_ns = self._now_ns() if drained else 0  # every window kernel ended before this
        self._disable_tracing()  # drain_first: only now
        return drained, ran_ns

    def _wait_returned(self, deadline: float) -> None:
        """A window launch whose API call has not returned has no end event yet (cuGraphLaunch
        blocks while the GPU's queue is full: the host is far ahead). Wait for it: else the
        drain would stop one launch early and cut that replay (seen once in 8 windows on the
        H200 with the host ~70 ms ahead)."""
        while self._win.pending() and time.perf_counter() < deadline and not self._stop.is_set():
            self.pacer.sleep(0.0002)

    def _wait_ran(self, deadline: float) -> bool:
        """Wait until the window's launches have run on the GPU (then the caller flushes).
        True when CUDA events say every window launch ran (the last one on each of its streams).

        A serving loop can run tens of ms ahead of the GPU; a flush before its kernels ran would
        leave them out (or, forced, return them with zero end times; seen on the H200 with a
        290 ms deep queue). With event timing on, wait for the end event of the window's last
        timed launch on each stream (bounded by ``max_drain_ms``); else the fixed ``drain_ms``.
        """
        s = self.settings
        timer = self._timer if self.observer == "events" else None
        query = getattr(timer.events, "query", None) if timer is not None else None
        if query is None or timer is None:
            if s.drain_ms > 0:
                self.pacer.sleep(s.drain_ms / 1e3)
            return False
        return timer.wait_ran(self._win, query, deadline, self._stop.is_set) and not self._win.pending()

    def _disable_tracing(self) -> None:
        self.trace.close(wait=True)
        self._traced_s = self.trace.traced_s  # the span the GPU ran traced: what the tracing budget counts

    # ------------------------------------------------------------------ delivery
    def _deliver_idle(self, req: Optional[CaptureRequest]) -> None:
        """No graph launch while armed: a window with no launch and no record, not traced (the
        agent sees the process alive; a capture gets its answer)."""
        self._win.reset(0)
        now = wall_time()
        self._traced_s = 0.0
        self.pacer.start_piece()
        self._emit(window_records(KernelColumns.empty(), np.zeros(0, np.int32), [], self._win.columns(),
                                  self.registry, started_s=now, ended_s=now,
                                  capture_id=req.id if req is not None else None,
                                  untraced=self._take_untraced(None)))  # the bursts' rows (bursts.py)

    def _deliver(self, req, started: float, ended: float, window_ms: float, flush_ms: float, timer,
                 ran_ns: int = 0) -> int:
        """The window's records to the sink and taps; returns how many records it held.
        ``ran_ns``: CUPTI's clock when the CUDA events said every window launch had run (0: not known)."""
        dropped = self.ingest.dropped()
        per = timer.collect([self._ref, self._win]) if timer is not None else None
        slowdown = slowdown_ratio(per) if per is not None else None
        # untraced replay times: the reference phase's (tracing off), after the bursts' since the last window
        untraced = self._take_untraced(per)
        self.pacer.pause()
        # columns + name ids, a chunk per GIL hold; a records sink (the light collector's link)
        # encodes them before the next window, so they can live in reused memory
        cols, name_id, discarded = self.ingest.take(reuse=self.records_sink and not self.settings.keep_raw)
        raw_end = cols.end_ns.copy() if self.settings.keep_raw else None  # CUPTI's own, before the rule below
        if ran_ns:
            self.stats["late_stamped_records"] += unknown_late_ends(cols, self._win.columns()["correlation_id"], ran_ns)
        self.pacer.mark("collect")  # event timing collected
        self.pacer.pause()
        names = self.ingest.names
        rec = window_records(cols, name_id, list(names.names), self._win.columns(), self.registry,
                             started_s=started, ended_s=ended, dropped=dropped + discarded, observer_slowdown=slowdown,
                             traced_s=self._traced_s, capture_id=req.id if req is not None else None,
                             untraced=untraced)
        st = self.stats
        st["records"] += len(rec)
        st["dropped"] += dropped
        st["discarded"] += discarded
        g = self.subscription.gate  # launch-callback switching (LaunchGate): offs put off, enters that found them off
        st.update(last_window_ms=window_ms, last_flush_ms=flush_ms, launch_cb_deferred=g.deferred,
                  launch_cb_reenabled=g.reenabled, repeated_correlation=g.repeated_corr)
        self.ingest.report(st)
        st["traced_ms"] = self.pacer.phases["traced_ms"] = self._traced_s * 1e3
        if raw_end is not None:  # diagnostics (keep_raw): what CUPTI gave, and what the close knew
            self._raw_close = dict(cupti_end_ns=raw_end, ran_ns=np.array([ran_ns], np.int64),
                                   forced_flush_records=np.array([self.ingest.forced_records], np.int64))
        self._emit(rec)
        phases, ing = self.pacer.phases, self.ingest
        # the longest piece of this window's work between two yields (the sink's included): the
        # longest the collector can have kept the GIL from the host in one go
        st["hold_cpu_max_ms"] = phases["hold_cpu_max_ms"] = self.pacer.take_hold_max_s() * 1e3
        phases["decode_ms"] += ing.wall_s * 1e3
        phases["decode_cpu_ms"] += ing.cpu_s * 1e3
        phases["decode_parts_cpu_ms"] = [a + b * 1e3 for a, b in zip(phases["decode_parts_cpu_ms"], ing.parts_s)]
        self.phase_log.append(phases)
        return len(rec)

    def _emit(self, rec) -> None:
        """WindowRecords -> the sink and taps (assembled into a Window unless records_sink)."""
        if self.settings.keep_raw:
            self.last_raw = {**raw_columns(rec), **self._raw_close}  # (before the taps: they may read it)
            self._raw_close = {}
        self.stats["windows"] += 1
        self._sync_launch_cb()
        # A light collector's sink (and taps) take the records as they are: the agent filters and
        # validates them (model/edges.assemble), so the serving process's GIL never does.
        out: Any = rec
        self.pacer.pause()
        if not self.records_sink:
            try:
                out = self.last_window = assemble(rec, self.graph_kernels)
            except Exception:
                out = None
                self.count_error("assemble")
        self.pacer.mark("build")
        if out is not None:
            for tap in list(self.taps):
                try:
                    tap(out)
                except Exception:
                    self.count_error("tap")
            if self._sink is not None:
                try:
                    self._sink(out)
                except Exception:
                    self.count_error("sink")
        self.pacer.mark("sink")


def unknown_late_ends(cols: KernelColumns, window_corr: np.ndarray, ran_ns: int) -> int:
    """Kernels of the window's launches stamped after ``ran_ns`` (when their CUDA events said
    they had all run) carry a time CUPTI made up at the flush, not theirs (H200,
    bench/results/gpu-check-10): their end becomes 0, CUPTI's own "unknown", so that their
    replay is excluded and counted as partial rather than assembled with a 1.5-2 ms kernel.
    Returns how many. The time test comes first: it leaves only a few records to look up."""
    late = np.flatnonzero((cols.end_ns > ran_ns) | (cols.start_ns > ran_ns))
    if not len(late):
        return 0
    late = late[np.isin(cols.correlation_id[late], window_corr)]
    cols.end_ns[late] = 0
    return len(late)

