"""The pinned baseline and the per-boundary attribution of the last window(s) against it.

:class:`Baseline` (the in-process exporter) pins one window; :class:`PooledBaseline` (the agent)
pins a window pooled with its process's earlier windows and compares it with the rank's newest
pooled windows, through the deploy verdict (graphmon.export.deploy).

``POST /baseline`` pins one window's Trace (a reference is kept, so eviction from the trace store
does not lose it). The attribution of the newest window against it (~0.4 s of CPU for a window
pair) is computed once per (baseline, window) pair on one worker thread, never on a request path:
``/status`` kicks a computation when the newest window changed and answers at once with the last
finished result (its ids and age) or ``"computing"``. At most one computation runs at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from graphmon.analysis.boundaries import live_top_boundaries
from graphmon.report.jsonsafe import json_safe

log = logging.getLogger("graphmon")
TOP_BOUNDARIES = 5  # boundaries per graph carried by /status and /trace


class Baseline:
    def __init__(self, lookup: Callable[[str], Any], compute: Optional[Callable[[Any, Any], list]] = None,
                 k: int = TOP_BOUNDARIES):
        self._lookup = lookup
        self._compute = compute or (lambda b, w: live_top_boundaries(b, w, k=k))
        self._lock = threading.Lock()
        self._pinned: Optional[tuple[str, Any, float]] = None  # (id, Trace, pinned at wall-clock s)
        self._result: Optional[dict] = None  # the last finished computation
        self._running: Optional[tuple[str, str]] = None  # (baseline id, window id) being computed
        self.computations = 0
        self.failures = 0

    # --- pinning -------------------------------------------------------------------------------
    def pin(self, trace_id: str) -> bool:
        """Pin a window by id; False when no such window is kept (never captured, or evicted)."""
        t = self._lookup(trace_id)
        if t is None:
            return False
        with self._lock:
            self._pinned = (trace_id, t, time.time())
        return True

    def unpin(self) -> Optional[str]:
        with self._lock:
            old, self._pinned = self._pinned, None
        return old[0] if old else None

    def describe(self) -> dict:
        p = self._pinned
        if p is None:
            return {"pinned": False}
        return {"pinned": True, "trace_id": p[0], "pinned_at_timestamp_s": p[2], "kernels": len(p[1])}

    # --- attribution ---------------------------------------------------------------------------
    def status(self, window_id: Optional[str]) -> dict:
        """The ``boundaries`` part of /status; starts a computation when the pair is new. Never blocks."""
        p = self._pinned
        if p is None:
            return {"state": "no baseline"}
        if window_id is None:
            return {"state": "no window", "baseline": p[0]}
        with self._lock:
            r = self._result
            if r is not None and (r["baseline"], r["window"]) == (p[0], window_id):
                return self._answer(r, "ready")
            if self._running is None:
                self._start(p, window_id)
            running = self._running
        doc = {"state": "computing", "baseline": p[0], "computing_window": running[1] if running else window_id}
        if r is not None and r["baseline"] == p[0]:  # the last result against this baseline, marked stale
            doc.update({k: v for k, v in self._answer(r, "computing").items() if k != "state"})
        return doc

    def for_window(self, window_id: str) -> Optional[tuple[str, list]]:
        """(baseline id, graphs) when the attribution of ``window_id`` against the pinned baseline is
        computed; None otherwise (the download path never computes)."""
        p, r = self._pinned, self._result
        if p is None or r is None or r.get("error") or (r["baseline"], r["window"]) != (p[0], window_id):
            return None
        return r["baseline"], r["graphs"]

    @staticmethod
    def _answer(r: dict, state: str) -> dict:
        doc = {"state": state, "baseline": r["baseline"], "window": r["window"],
               "computed_age_s": max(0.0, time.monotonic() - r["done_at"]),
               "compute_seconds": r["seconds"], "graphs": r["graphs"]}
        if r.get("error"):
            doc["error"] = r["error"]
        return doc

    def _start(self, pinned: tuple, window_id: str) -> None:  # called with the lock held
        window = self._lookup(window_id)
        if window is None:
            return
        self._running = (pinned[0], window_id)
        # A daemon thread per computation (at most one at a time, see _running): never holds the
        # host's exit, as a ThreadPoolExecutor's worker would.
        threading.Thread(target=self._run, args=(pinned[0], pinned[1], window_id, window),
                         name="graphmon-baseline", daemon=True).start()

    def _run(self, base_id: str, base: Any, window_id: str, window: Any) -> None:
        t0 = time.monotonic()
        error = None
        try:
            graphs = self._compute(base, window)
        except Exception as e:  # contained: reported in /status, counted, the exporter goes on
            graphs, error = [], f"{type(e).__name__}: {e}"
            self.failures += 1
            log.warning("graphmon boundary attribution failed: %r", e)
        done = time.monotonic()
        with self._lock:
            self.computations += 1
            self._result = {"baseline": base_id, "window": window_id, "graphs": graphs, "seconds": done - t0,
                            "done_at": done, "error": error}
            self._running = None


class PooledBaseline:
    """/baseline in the agent: the pinned window pooled with its process's windows before it, compared
    with the newest pooled windows of the same rank by the deploy verdict (graphmon.export.deploy),
    the same pooling as the comparison after a restart. The same interface as :class:`Baseline`."""

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    def pin(self, trace_id: str) -> bool:
        return self.verdict.pin(trace_id)

    def unpin(self) -> Optional[str]:
        return self.verdict.unpin()

    def describe(self) -> dict:
        return self.verdict.describe()

    def _result(self):
        p = self.verdict.pinned
        if p is None:
            return None, None
        r = self.verdict.results.get((p[0], "pinned"))
        return p, r if r is not None and r.reference_id == p[1] else None

    def status(self, window_id: Optional[str] = None) -> dict:
        """The ``boundaries`` part of /status (``window_id`` is not needed: the rank's newest pooled
        window is the one compared). Never blocks: the verdict's thread computes."""
        p, r = self._result()
        if p is None:
            return {"state": "no baseline"}
        doc: dict = {"baseline": p[1], "rank": p[0]}
        if r is None:
            return {"state": "computing", **doc}
        if r.state == "pooling":
            return {"state": "pooling" if r.current_windows else "no window", **doc, "window": r.current_window,
                    "replays_baseline": dict(r.reference_replays), "replays_current": dict(r.current_replays)}
        doc.update(state="ready", window=r.current_window, windows_baseline=r.reference_windows,
                   windows_current=r.current_windows,
                   computed_age_s=None if r.computed_s is None else max(0.0, time.time() - r.computed_s),
                   compute_seconds=r.compute_seconds, graphs=list(r.boundaries))
        if r.error:
            doc["error"] = r.error
        return doc

    def for_window(self, window_id: str) -> Optional[tuple[str, list]]:
        p, r = self._result()
        if r is None or r.state != "ready" or r.error or r.current_window != window_id:
            return None
        return p[1], list(r.boundaries)

    def trace_extra(self, window_id: str) -> Optional[tuple[str, dict]]:
        """``/trace/<window_id>``'s otherData: ``boundaries`` (the pinned baseline's attribution) and
        ``deploy`` (the verdict against the rank's previous process) when one was computed for this
        window; (a version of the pair for the body cache, the entries) or None."""
        out: dict = {}
        version = []
        got = self.for_window(window_id)
        if got is not None:
            out["boundaries"] = {"baseline": got[0], "window": window_id, "graphs": got[1]}
            version.append(f"pinned={got[0]}")
        for (rank, ref), r in sorted(self.verdict.results.items()):
            if ref == "previous" and r.state == "ready" and r.verdict is not None and r.current_window == window_id:
                out["deploy"] = {"rank": rank, "reference": ref, "reference_id": r.reference_id,
                                 "reference_pid": r.reference_pid, "window": window_id,
                                 "regression": bool(r.verdict.regressions()),
                                 "graphs": json_safe(r.verdict.graphs)}
                version.append(f"previous={r.reference_id}@{r.computed_s}")
        return (";".join(version), out) if out else None
