"""Replay a recorded trace in a loop at its recorded pace: the demo and the CPU tests.

Each window holds the replays whose first kernel started within the next ``interval_s`` of trace
time (times ``speed``); stretches of the recording with no replay are skipped, so windows are never
empty. Every loop shifts timestamps by the recording's length and correlation ids by their range,
so the stream of windows looks like one long, monotonic recording.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace
from typing import Optional

import numpy as np

from graphmon.model.trace import Trace, TraceError, replay_key
from graphmon.model.window import CaptureRequest, Window
from graphmon.sources.base import Sink, Source


class ReplaySource(Source):
    backend = "replay"

    def __init__(self, trace: Trace, interval_s: float = 1.0, speed: float = 1.0, loop: bool = True,
                 name: str = "", max_windows: Optional[int] = None):
        super().__init__()
        if len(trace) == 0:
            raise TraceError(f"{name or 'trace'}: nothing to replay (no valid kernel records)")
        if interval_s <= 0 or speed <= 0:
            raise ValueError("interval_s and speed must be positive")
        self.trace, self.interval_s, self.speed, self.loop = trace, interval_s, speed, loop
        self.name = name
        self.max_windows = max_windows
        key = replay_key(trace.device, trace.correlation_id)
        _, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        rstart = np.full(inv.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(rstart, inv, trace.start_ns)
        kstart = rstart[inv]
        self._order = np.argsort(kstart, kind="stable")
        self._kstart = kstart[self._order]  # replay start of each kernel, sorted
        self._replay_starts = np.unique(kstart)
        self._t0 = int(self._kstart[0])
        self._period_ns = int(trace.end_ns.max()) - self._t0 + 1_000_000
        corr = np.r_[trace.correlation_id, trace.launches["correlation_id"]]
        self._corr_period = int(corr.max()) + 1 if len(corr) else 1
        self._cursor = self._t0
        self._loop_no = 0
        self._pass_no = 0
        self._invalid_pass = -1  # the pass whose window carried the file's invalid counts
        self._stop = threading.Event()
        self._captures: "queue.Queue[CaptureRequest]" = queue.Queue(maxsize=16)
        self._thread: Optional[threading.Thread] = None
        self.windows_emitted = 0

    def info(self) -> dict[str, str]:
        return {"backend": self.backend, "version": "1", "source": self.name or str(self.trace.meta.get("source", ""))}

    def request_capture(self, request: CaptureRequest) -> None:
        try:
            self._captures.put_nowait(request)
        except queue.Full:
            raise RuntimeError("too many pending captures") from None

    # ------------------------------------------------------------------ windows
    def next_window(self, duration_ns: Optional[int] = None, max_replays: Optional[int] = None,
                    capture_id: Optional[str] = None) -> Window:
        """Cut the next window from the recording (also usable without the thread, in tests)."""
        started = time.time()
        duration_ns = int(self.interval_s * self.speed * 1e9) if duration_ns is None else duration_ns
        if self._cursor > self._replay_starts[-1]:
            self._wrap()
        # Skip dead time: start at the first replay at or after the cursor.
        i0 = np.searchsorted(self._replay_starts, self._cursor)
        first = int(self._replay_starts[i0])
        end = first + max(1, duration_ns)
        if max_replays is not None:
            i1 = min(len(self._replay_starts), i0 + max(1, max_replays))
            end = min(end, int(self._replay_starts[i1 - 1]) + 1)
        lo, hi = np.searchsorted(self._kstart, [first, end])
        self._cursor = end
        win = self._shifted(self._order[lo:hi])
        return Window(trace=win, started_s=started - self.interval_s, ended_s=time.time(), capture_id=capture_id)

    def _wrap(self) -> None:
        if not self.loop:
            raise StopIteration
        self._loop_no += 1
        self._pass_no += 1
        # Each pass shifts times by one recording length; restart the shift before int64 would
        # overflow (a recording with timestamps near 9e18 ns otherwise stops after two passes).
        if int(self.trace.end_ns.max()) + (self._loop_no + 1) * self._period_ns > 2**62:
            self._loop_no = 0
        self._cursor = self._t0

    def _shifted(self, idx: np.ndarray) -> Trace:
        t = self.trace
        idx = np.sort(idx)
        mask = np.zeros(len(t), dtype=bool)
        mask[idx] = True
        w = t.select(mask)
        # The file's invalid records are counted once per pass (with its first window), not
        # re-added by every window cut from it.
        if self._invalid_pass == self._pass_no:
            w = replace(w, invalid={})
        self._invalid_pass = self._pass_no
        if self._loop_no == 0:
            return w
        dt = self._loop_no * self._period_ns
        dc = self._loop_no * self._corr_period
        L = dict(w.launches)
        L["correlation_id"] = L["correlation_id"] + dc
        L["launch_ns"] = np.where(L["launch_ns"] > 0, L["launch_ns"] + dt, L["launch_ns"])
        return replace(w, start_ns=w.start_ns + dt, end_ns=w.end_ns + dt,
                       correlation_id=w.correlation_id + dc, launches=L)

    # ------------------------------------------------------------------ thread
    def start(self, sink: Sink) -> None:
        if self._thread is not None:
            return
        self.set_state("running")
        self._thread = threading.Thread(target=self._run, args=(sink,), name="graphmon-replay", daemon=True)
        self._thread.start()

    def _run(self, sink: Sink) -> None:
        try:
            self._loop(sink)
        except Exception as e:  # the thread ends: health must say so, not "running"
            self.set_state("error", f"replay thread died: {e!r}"[:300])
            logging.getLogger("graphmon").error("graphmon replay thread died", exc_info=True)

    def _loop(self, sink: Sink) -> None:
        next_t = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            try:
                req = self._captures.get(timeout=max(0.0, next_t - time.monotonic()))
            except queue.Empty:
                req = None
            if self._stop.is_set():
                break
            try:
                if req is not None:
                    dur = None if req.duration_ms is None else int(req.duration_ms * 1e6)
                    if dur is None and req.replays is not None:
                        dur = self._period_ns  # bounded by the replay count instead
                    sink(self.next_window(duration_ns=dur, max_replays=req.replays, capture_id=req.id))
                    continue
                next_t += self.interval_s
                sink(self.next_window())
                self.windows_emitted += 1
            except StopIteration:
                self.set_state("stopped", "recording finished (loop disabled)")
                return
            except Exception:  # contained: count and go on with the next window
                self.count_error("source")
            if self.max_windows is not None and self.windows_emitted >= self.max_windows:
                self.set_state("stopped", "max windows reached")
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.set_state("stopped")
