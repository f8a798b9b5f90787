"""The agent's deploy verdict: did the process that took over a rank regress against the one before?

Per rank the agent pools windows (graphmon.export.deploy_pool). When a new process takes over the rank (the
agent's RankSeries, graphmon.export.ranks: another ``Attached.incarnation`` with another pid; a
reconnect of the same pid keeps its pool), the previous process's pool becomes the **reference**
of the new one; a **pinned** baseline (``POST /baseline``) is a second reference, pooled the same way: the
pinned window and the windows of its process before it. Each reference is compared with the new
process's pool by :func:`graphmon.analysis.deploy.judge` (``graphmon compare``'s statistics:
per-stream shift with its interval, boundaries, uniform / concentrated / mixed) as soon as one
graph has ``min_replays`` replays on both sides: a default window holds 4 replays, so the verdict
comes with the new process's second window, and is computed again with every window after it.

Bounds: a pool keeps the newest windows, dropping the oldest once each graph in it has
``max_replays`` (default 64) replays in the newer ones, and at most ``max_bytes`` (default 32 MiB)
of kernel columns (the newest window stays whatever its size): at most three pools per rank
(current, previous, pinned). A rank's reference outlives its series in the agent (a slow restart
is still compared), so the ranks kept are bounded too: at most ``max_ranks`` (default 256, the
agent's process cap) and ``max_total_bytes`` (default 256 MiB) of pooled columns in all; past
either, the rank whose newest window is oldest is forgotten (counted: ``ranks_forgotten``). A process
whose pool never reached ``min_replays`` for any graph (it crashed at start) does not replace the
reference: its successor is compared with the last process that did.

Same process or a new one: a process is known by its pid, host and start time (the hello's
``process_start_s``): in containers a restarted engine often has the pid of the one before it.
With a :class:`graphmon.export.deploy_state.StateDir` (``--state-dir``) the pools are written to
disk and read back when the agent starts, so an agent restart keeps every rank's reference.

Threads: :meth:`DeployVerdict.on_window` runs on the agent's ingest thread and only appends to a
bounded queue (a full queue drops the oldest window, counted); one daemon thread
(``graphmon-deploy``) pools and computes, at most ``busy_share`` (a quarter) of the time, so that
the agent's ingest keeps up with every process; a scrape or ``/status`` reads the last published
results (one reference swap), never waits for a computation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from graphmon.analysis.boundaries import attribute
from graphmon.analysis.compare import compare
from graphmon.analysis.deploy import Gate, Verdict, judge
from graphmon.analysis.significance import Thresholds
from graphmon.export.deploy_pool import MAX_BYTES, MAX_REPLAYS, Pool, pooled
from graphmon.export.deploy_state import StateDir
from graphmon.model.trace import Trace, TraceError

log = logging.getLogger("graphmon.agent")
REFERENCES = ("previous", "pinned")
QUEUE_MAX = 64
MAX_RANKS = 256
MAX_TOTAL_BYTES = 256 * 2**20
BUSY_SHARE = 0.25  # the verdict thread computes at most this share of the time
TOP_BOUNDARIES = 5


# ---------------------------------------------------------------------- results
@dataclass(frozen=True)
class Result:
    """One (rank, reference) comparison as /status and /metrics show it."""

    rank: str
    reference: str  # previous | pinned
    reference_id: str  # the previous process (incarnation) or the pinned window
    reference_pid: str
    current_incarnation: str
    current_pid: str
    state: str  # pooling | ready | error
    reference_newest_s: Optional[float]
    reference_windows: int
    reference_replays: Mapping[str, int]
    current_window: Optional[str]
    current_windows: int
    current_replays: Mapping[str, int]
    reference_untraced: Mapping[str, int] = field(default_factory=dict)  # graph -> untraced durations pooled
    current_untraced: Mapping[str, int] = field(default_factory=dict)
    untraced_left_out: int = 0  # untraced rows of both pools that name no graph or no positive time
    verdict: Optional[Verdict] = None
    boundaries: list = field(default_factory=list)  # attribute(...).to_json(): the /status "boundaries"
    computed_s: Optional[float] = None  # wall time it finished
    compute_seconds: float = 0.0
    error: str = ""


@dataclass
class _Rank:
    rank: str
    tag: str  # the rank's series (RankSeries.tag): window ids are "<tag>-w<k>"
    incarnation: str
    pid: str
    current: Pool
    previous: Optional[Pool] = None
    previous_incarnation: str = ""
    previous_pid: str = ""
    dirty: set = field(default_factory=set)
    process: str = ""  # process_key(): pid, host and start time of the current pool's process
    previous_process: str = ""
    unsaved: set = field(default_factory=set)  # pools (current, previous) changed since the state dir has them


def process_key(identity: Mapping[str, str]) -> str:
    """One process, told apart from a restarted one that got the same pid (containers)."""
    pid = str(identity.get("pid", ""))
    return f"{pid}@{identity.get('host', '')}#{identity.get('process_start_s', '')}" if pid else ""


class DeployVerdict:
    """Pools per rank, the references, the background computation and its published results."""

    def __init__(self, *, thresholds: Optional[Thresholds] = None, gate: Optional[Gate] = None,
                 max_replays: int = MAX_REPLAYS, max_bytes: int = MAX_BYTES, queue_max: int = QUEUE_MAX,
                 top: int = TOP_BOUNDARIES, lookup: Optional[Callable[[str], Any]] = None,
                 max_ranks: int = MAX_RANKS, max_total_bytes: int = MAX_TOTAL_BYTES,
                 busy_share: float = BUSY_SHARE, state: Optional[StateDir] = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.max_ranks, self.max_total_bytes = int(max_ranks), int(max_total_bytes)
        if not 0 < busy_share <= 1:
            raise ValueError("busy_share must be in (0, 1]")
        self.busy_share = float(busy_share)
        self.ranks_forgotten = 0
        self.gate = gate or Gate()
        self.max_replays, self.max_bytes, self.queue_max, self.top = max_replays, max_bytes, queue_max, top
        self._lookup = lookup  # window id -> (Trace, untraced rows) (the trace store's entry): a pin no pool holds
        self._queue: deque = deque()
        self._cv = threading.Condition()
        self._lock = threading.Lock()  # rank state (pools, pin); never held during a computation
        self._pooling = threading.Lock()  # queue -> pools in order; taken before _cv and _lock, never inside
        self._ranks: dict[str, _Rank] = {}
        self._pin: Optional[tuple[str, str, Pool, float]] = None  # (rank, window id, pool, pinned at wall s)
        self.results: Mapping[tuple[str, str], Result] = {}  # (rank, reference) -> Result; swapped whole
        self.dropped = 0
        self.computations = {"ok": 0, "error": 0}
        # Called (without arguments, on the verdict's or an HTTP thread, no lock held) after the
        # results changed: the agent re-renders /metrics. Exceptions are logged, never raised.
        self.on_publish: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._wakeup = False  # a pin asks the worker for a computation
        self._changed = False  # results published since the last on_publish call
        self._busy = False
        self._thread: Optional[threading.Thread] = None
        self.state = state
        if state is not None:
            self._restore(state)

    def _restore(self, state: StateDir) -> None:
        """The ranks a previous agent wrote (``--state-dir``): their pools wait for the rank's next process."""
        for s in state.load()[: self.max_ranks]:
            cur = s.current or Pool(self.max_replays, self.max_bytes)
            self._ranks[s.rank] = _Rank(
                s.rank, "", "", s.process.partition("@")[0], cur, previous=s.previous,
                previous_incarnation="restored" if s.previous is not None else "",
                previous_pid=s.previous_process.partition("@")[0], process=s.process,
                previous_process=s.previous_process)
        if self._ranks:
            log.info("graphmon deploy verdict: %d rank(s) read back from %s", len(self._ranks), state.path)

    # ------------------------------------------------------------------ ingest side (agent thread)
    def on_window(self, attached: Any, window: Any) -> None:
        """Agent.window_hooks: called on the ingest thread after the aggregator took the window."""
        trace = window.trace
        untraced = window.untraced
        if not (trace.graph >= 0).any() and not len(untraced["duration_ns"]):
            return
        wid = _window_id(attached)
        if wid is None:
            return
        ident = getattr(attached.proc, "identity", {}) or {}
        item = (str(attached.rank), attached.series.tag, attached.incarnation, str(ident.get("pid", "")),
                wid, trace, float(window.ended_s), process_key(ident), untraced)
        with self._cv:
            if len(self._queue) >= self.queue_max:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(item)
            self._cv.notify()
        if self._thread is None:
            self.start()

    def start(self) -> "DeployVerdict":
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="graphmon-deploy", daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.state is not None:
            self._save(final=True)  # what pooled since the last periodic save

    # ------------------------------------------------------------------ pin (HTTP threads)
    def pin(self, window_id: str) -> bool:
        """Pin a window and its process's pooled windows before it; False when no pool or store has it.
        Compared with the rank's newest pooled windows after it."""
        self._pool_pending()  # a window /status already lists may still wait in the queue
        with self._lock:
            found = None
            for st in self._ranks.values():
                for pool in (st.current, st.previous):
                    part = pool.upto(window_id) if pool is not None else None
                    if part is not None:
                        found = (st, part)
                        break
                if found:
                    break
            if found is None:
                found = self._stored(window_id)
            if found is None:
                return False
            st, part = found
            self._pin = (st.rank, window_id, part, time.time())
            st.dirty.add("pinned")
            self._publish({k: v for k, v in self.results.items() if k[1] != "pinned"})
        self._kick()
        return True

    def _stored(self, window_id: str) -> Optional[tuple[_Rank, Pool]]:  # lock held
        """A window no pool holds any more, from the trace store (with its untraced rows): pinned alone."""
        e = self._lookup(window_id) if self._lookup is not None else None
        tag = window_id.partition("-")[0]  # r<n>: the rank's series (graphmon.export.ranks)
        st = next((s for s in self._ranks.values() if s.tag == tag), None)
        if e is None or st is None or not ((e[0].graph >= 0).any() or (e[1] is not None and len(e[1]["duration_ns"]))):
            return None  # as on_window: a window with neither a graph's kernels nor untraced rows pools nothing
        pool = Pool(self.max_replays, self.max_bytes)
        pool.add(pooled(window_id, e[0], time.time(), e[1]))
        return st, pool

    def unpin(self) -> Optional[str]:
        with self._lock:
            old, self._pin = self._pin, None
        if old is not None:
            self._publish({k: v for k, v in self.results.items() if k[1] != "pinned"})
            self._notify()
        return old[1] if old else None

    def describe(self) -> dict:
        p = self._pin
        if p is None:
            return {"pinned": False}
        return {"pinned": True, "trace_id": p[1], "pinned_at_timestamp_s": p[3], "kernels": len(p[2].trace()),
                "rank": p[0], "windows": len(p[2].windows), "replays": p[2].replays()}

    @property
    def pinned(self) -> Optional[tuple[str, str]]:
        """(rank, window id) of the pinned baseline."""
        p = self._pin
        return (p[0], p[1]) if p is not None else None

    # ------------------------------------------------------------------ worker
    def _kick(self) -> None:  # never with self._lock held (lock order: _cv, then _lock)
        with self._cv:
            self._wakeup = True
            self._cv.notify()
        if self._thread is None:
            self.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while not self._queue and not self._wakeup and not self._stop.is_set():
                    self._cv.wait(1.0)
                self._wakeup = False
                self._busy = True
            try:
                self._pool_pending()
                self._compute_dirty()
                if self.state is not None:
                    self._save()
            except Exception as e:  # contained: counted, logged; the agent goes on
                self.computations["error"] += 1
                log.warning("graphmon deploy verdict failed: %r", e)
            self._notify()
            with self._cv:
                self._busy = bool(self._queue) or self._wakeup

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing being pooled or computed (tests, diagnostics)."""
        with self._cv:
            return not self._queue and not self._wakeup and not self._busy

    def _notify(self) -> None:
        if not self._changed:
            return
        self._changed = False
        for fn in list(self.on_publish):
            try:
                fn()
            except Exception as e:
                log.warning("graphmon deploy verdict publish hook failed: %r", e)

    def _pool_pending(self) -> None:
        """Pool the queued windows in order (the worker, or pin() before it looks a window up)."""
        with self._pooling:
            with self._cv:
                items = list(self._queue)
                self._queue.clear()
            for item in items:
                self._pool(*item)

    def _pool(self, rank: str, tag: str, incarnation: str, pid: str, wid: str, trace: Trace, ended_s: float,
              process: str, untraced: Mapping) -> None:
        p = pooled(wid, trace, ended_s, untraced)
        with self._lock:
            st = self._ranks.get(rank)
            if st is not None:
                st.tag = tag  # the agent may have made the rank's series again (expired): the reference stays
            if st is None:
                st = self._ranks[rank] = _Rank(rank, tag, incarnation, pid, Pool(self.max_replays, self.max_bytes),
                                               process=process)
            elif st.incarnation != incarnation and not (process and process == st.process):  # a new process
                if any(n >= self.thresholds.min_replays for n in st.current.replays().values()):
                    st.previous, st.previous_incarnation, st.previous_pid = st.current, st.incarnation, st.pid
                    st.previous_process = st.process
                    st.unsaved.add("previous")
                st.current = Pool(self.max_replays, self.max_bytes)
                st.incarnation, st.pid, st.process = incarnation, pid, process
                self._publish({k: v for k, v in self.results.items() if k[0] != rank})  # old verdicts end here
            elif st.incarnation != incarnation:  # the same process reconnected (or read back): the same pool
                st.incarnation = incarnation
            st.current.add(p)
            st.unsaved.add("current")
            if st.previous is not None:
                st.dirty.add("previous")
            if self._pin is not None and self._pin[0] == rank:
                st.dirty.add("pinned")
            self._bound(rank)

    def _bound(self, keep: str) -> None:  # lock held
        """Forget the ranks whose newest window is oldest until max_ranks and max_total_bytes hold
        (never ``keep``, the rank that just pooled a window); their verdicts end with them."""
        def newest(st: _Rank) -> float:
            return max((p.newest_s or 0.0) for p in (st.current, st.previous) if p is not None)

        def nbytes(st: _Rank) -> int:
            return sum(p.nbytes for p in (st.current, st.previous) if p is not None)

        total = sum(nbytes(st) for st in self._ranks.values())
        gone = []
        for st in sorted((st for st in self._ranks.values() if st.rank != keep), key=newest):
            if len(self._ranks) - len(gone) <= self.max_ranks and total <= self.max_total_bytes:
                break
            gone.append(st.rank)
            total -= nbytes(st)
        for r in gone:
            del self._ranks[r]
            if self.state is not None:
                self.state.forget(r)
        if gone:
            self.ranks_forgotten += len(gone)
            self._publish({k: v for k, v in self.results.items() if k[0] not in gone})

    def _compute_dirty(self) -> None:
        """Compare every dirty (rank, reference) until none is left: windows pooled meanwhile mark
        ranks dirty again and are compared together in the next round."""
        while not self._stop.is_set():
            with self._lock:
                todo = []
                for st in self._ranks.values():
                    for ref in sorted(st.dirty):
                        ref_pool, ref_id, ref_pid = self._reference(st, ref)
                        if ref_pool is not None:
                            todo.append((st.rank, ref, ref_pool.copy(), ref_id, ref_pid, self._current(st, ref),
                                         st.incarnation, st.pid))
                    st.dirty.clear()
            if not todo:
                return
            for job in todo:
                if self._stop.is_set():
                    return
                t0 = time.monotonic()
                self._compute(*job)
                self._notify()  # published before the pause below
                # A comparison holds the GIL for much of its ~0.2 s (two pools of ~60 replays of 960
                # kernels, on a 2-core machine); the agent's ingest thread must keep up with every
                # process's windows, so the verdict takes at most busy_share of the time.
                self._stop.wait((time.monotonic() - t0) * (1.0 / self.busy_share - 1.0))
                self._pool_pending()  # (~1 ms a window: the queue does not fill during the pause)

    def _save(self, final: bool = False) -> None:
        """Write the pools that changed (the current one at most every save_interval_s per rank, or
        all at the agent's stop); the disk I/O runs without the lock."""
        jobs = []
        with self._lock:
            for st in self._ranks.values():
                for role in sorted(st.unsaved):
                    if role == "current" and not (final or self.state.due(st.rank)):
                        continue
                    pool = st.current if role == "current" else st.previous
                    jobs.append((st.rank, role, pool.copy() if pool is not None else None,
                                 st.process if role == "current" else st.previous_process))
                    st.unsaved.discard(role)
        for rank, role, pool, process in jobs:
            if not self.state.save(rank, role, pool, process):
                with self._lock:
                    st = self._ranks.get(rank)
                    if st is not None:
                        st.unsaved.add(role)  # tried again at the next save

    def _reference(self, st: _Rank, ref: str) -> tuple[Optional[Pool], str, str]:  # lock held
        if ref == "previous":
            return st.previous, st.previous_incarnation, st.previous_pid
        p = self._pin
        if p is not None and p[0] == st.rank:
            return p[2], p[1], ""
        return None, "", ""

    def _current(self, st: _Rank, ref: str) -> Pool:  # lock held
        """What a reference is compared with: the rank's pool, after the pinned window when the
        pinned process is still the current one."""
        p = self._pin
        return st.current.after(p[1]) if ref == "pinned" and p is not None else st.current.copy()

    def _compute(self, rank, ref, ref_pool: Pool, ref_id, ref_pid, cur: Pool, inc, pid) -> None:
        ub, uc = ref_pool.untraced(), cur.untraced()  # per graph name of the pools' traces
        base = dict(rank=rank, reference=ref, reference_id=ref_id, reference_pid=ref_pid, current_incarnation=inc,
                    current_pid=pid, reference_newest_s=ref_pool.newest_s, reference_windows=len(ref_pool.windows),
                    reference_replays=ref_pool.replays(), current_window=cur.newest_id,
                    current_windows=len(cur.windows), current_replays=cur.replays(),
                    reference_untraced=_counts(ub), current_untraced=_counts(uc),
                    untraced_left_out=ref_pool.untraced_left_out + cur.untraced_left_out)
        if not cur.windows or not cur.ready(ref_pool, self.thresholds.min_replays):
            self._store(Result(state="pooling", **base))
            return
        t0 = time.monotonic()
        try:
            b, c = ref_pool.trace(), cur.trace()
            th = self.thresholds
            cmp_ = compare(b, c, thresholds=th)
            attr = attribute(b, c, top=self.top, min_shift_ns=th.min_shift_ns, min_rel=th.min_rel,
                             min_replays=th.min_replays)
            verdict = judge(cmp_, attr, self.gate, untraced=(ub, uc))
            res = Result(state="ready", verdict=verdict, boundaries=attr.to_json(),
                         computed_s=time.time(), compute_seconds=time.monotonic() - t0, **base)
            self.computations["ok"] += 1
        except TraceError as e:  # e.g. no graph in common: said in /status, not an agent error
            res = Result(state="error", error=str(e), computed_s=time.time(), compute_seconds=time.monotonic() - t0,
                         **base)
        except Exception as e:  # contained
            self.computations["error"] += 1
            log.warning("graphmon deploy verdict of rank %s failed: %r", rank, e)
            res = Result(state="error", error=f"{type(e).__name__}: {e}", computed_s=time.time(),
                         compute_seconds=time.monotonic() - t0, **base)
        self._store(res)

    def _store(self, res: Result) -> None:
        with self._lock:  # a result of a process that has been replaced meanwhile is not published
            st = self._ranks.get(res.rank)
            if st is None or st.incarnation != res.current_incarnation:
                return
            if res.reference == "pinned" and (self._pin is None or self._pin[0] != res.rank
                                              or self._pin[1] != res.reference_id):
                return
            self._publish({**self.results, (res.rank, res.reference): res})

    def _publish(self, results: Mapping) -> None:
        self.results = dict(results)  # one reference swap: readers never see a half-built mapping
        self._changed = True


def _counts(untraced: Mapping) -> dict[str, int]:
    return {g: len(d) for g, d in untraced.items()}


def _window_id(attached: Any) -> Optional[str]:
    """The window just ingested, as the agent names it in /status and /trace (``r<n>-w<k>``, the
    rank's series tag; capture ids as they are)."""
    try:
        ws = attached.aggregator.snapshot().windows
    except Exception:
        return None
    if not ws:
        return None
    w = ws[-1]
    return w if w.startswith("c") else f"{attached.series.tag}-{w}"
