"""Live CUPTI source: sampled CONCURRENT_KERNEL windows + driver-API graph callbacks.

The window state machine. CUPTI sits behind api.CuptiActivityApi; subscription.py holds the
subscription's lifecycle, ingest.py the buffers and flushes, pacing.py the collector's GIL
manners, assemble.py builds a window's records, observer.py measures the observer effect.

- Kernel tracing (CONCURRENT_KERNEL only: KERNEL serializes kernels) perturbs what it measures
  (+12-33% per replay on an H200), so it is on only in short *windows* of ``window_launches``
  graph launches (``window_duration_ms`` at most), every ``interval_s`` at least
  (graphmon.settings.CuptiSettings). ``request_capture`` asks for one soon.
- A window opens on graph launches, never on a timer alone: when one is due the collector
  *arms* (the launch callback on, nothing traced) and waits for the next graph launch; that
  launch and the next ones form the reference phase (timed with CUDA events, tracing off), then
  tracing goes on for the window's launches: switched in the launch callbacks (tracing.py), on
  in the window's first launch and off when its last one returns, so that a window traces its
  own launches, each whole, and nothing else. A process that launches no graph is never traced:
  every ``interval_s`` of that it delivers an *idle* window (no launch, no record, not traced),
  so that the agent sees it alive. Why: a timer-opened window that landed in a warm-up or a
  recompile traced nothing and still spent the tracing budget (H200, issue 29: the next window
  60 s later, no gap series for 30 s of steady decode).
- The tracing budget (``max_traced_share``) counts a window's traced time only when it traced
  a graph launch and got records; a window that traced no launch is counted as empty
  (``stats["empty_no_launches"]``) and the next one is due after ``interval_s``.
- Graph identity/upload mode come from driver-API callbacks. The launch callback (~0.4% of a
  replay) is on only while armed, inside windows and their reference phase, during untraced
  bursts between windows (bursts.py: replays timed with tracing off, shipped in a window's
  ``untraced`` with its reference phase's), and while an exec created after attach has not
  launched yet (its first launch decides ``lazy``), ``first_launch_wait_s`` at most.
- Nothing on the host's path waits for graphmon (issue 13): the launch callback writes into
  preallocated slots (launches.py) and, once per window, sets an Event (the launch that opens
  it); buffers are queued by CUPTI's completion callback and decoded here, one buffer per GIL
  hold, under no lock a callback takes; a window closes by waiting for its launches' CUDA
  events, then flushing (ingest.py).
- Callbacks never raise into the host (errors counted by stage).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Optional

from graphmon.model.edges import GraphKernels
from graphmon.model.window import CaptureRequest, Window
from graphmon.settings import CuptiSettings
from graphmon.sources.base import Sink, Source, wall_time
from graphmon.sources.cupti import native as _native
from graphmon.sources.cupti.bursts import BurstPhase
from graphmon.sources.cupti.closing import WindowClose
from graphmon.sources.cupti.ingest import Ingest
from graphmon.sources.cupti.launches import LaunchRing
from graphmon.sources.cupti.libinfo import cupti_python_version
from graphmon.sources.cupti.observer import CudaEvents, EventTimer
from graphmon.sources.cupti.pacing import Pacer
from graphmon.sources.cupti.registry import REGISTRY, GraphRegistry
from graphmon.sources.cupti.subscription import Subscription
from graphmon.sources.cupti.tracing import TraceSwitch

log = logging.getLogger("graphmon.cupti")

# After subscribing again for a window: CUPTI state changes made the next replays of a graph pay
# one-time work on the H200 (bench/overhead/cupti_idle_cost.py --stages); the reference phase starts after
_RESUME_SETTLE_S = 0.05
_ARMED_POLL_S = 1.0  # armed, the collector wakes on the opening launch (an Event); this bounds its sleep


class CuptiSource(WindowClose, BurstPhase, Source):
    backend = "cupti"

    def __init__(self, cupti: Any = None, *, settings: Optional[CuptiSettings] = None, events: Any = None,
                 registry: Optional[GraphRegistry] = None) -> None:
        super().__init__()
        self.settings = s = settings if settings is not None else CuptiSettings()
        self._events_arg = events
        self.registry = registry if registry is not None else REGISTRY
        self.observer = s.observer
        self.last_raw: Optional[dict[str, Any]] = None  # settings.keep_raw: the last window's unfiltered records
        self._raw_close: dict[str, Any] = {}  # keep_raw: CUPTI's own ends, ran_ns, forced flush (closing.py)
        # True: the sink gets WindowRecords, unfiltered (a light collector ships them to the agent,
        # which assembles the Window); False: the sink gets the assembled Window
        self.records_sink = False

        self._sink: Optional[Sink] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._captures: deque[CaptureRequest] = deque(maxlen=16)
        self._collector_logged_s = -1e9
        self._timer: Optional[EventTimer] = None
        self.pacer = Pacer(s)
        self.ingest = Ingest(s, self.pacer, self.count_error)  # records: only the collector thread decodes
        self.subscription = Subscription(self, cupti, self.ingest)

        # window state: callbacks (host threads) write the current ring, the collector the rest.
        # Sized for a sampling window; a capture that needs more slots grows the window's ring
        # on the collector thread before its phase starts. Why not max_window_launches up front:
        # 9 lists of 65,536 slots per ring took ~3 ms of GIL each in attach(), which on an HF
        # decode loop showed up as the attach's stall (bench/overhead/attach_stall.py).
        self._max_launches = min(s.max_window_launches, 1 << 20)
        cap = min(self._max_launches, max(s.window_launches, 64))
        self._ref = LaunchRing("ref", cap)
        self._ref.wake_on = 0  # armed: the launch that opens the window wakes the collector
        self._win = LaunchRing("win", cap)
        self._ring: Optional[LaunchRing] = None  # the ring launches go to now; None: not sampling
        self._closing = False  # window full: launches no longer join it, tracing drains
        self._stream_ids: dict[int, tuple[int, int]] = {}  # stream handle -> (ctx, CUPTI stream id)
        self._traced_s = 0.0  # the last window's span with kernel tracing on (enable to disable)
        # kernel tracing on/off (tracing.py): at the window's first launch and its last launch's
        # return (boundary "launch"), or by the collector (boundary "collector")
        self.trace = TraceSwitch(lambda on: self.api.set_kernel_activity(on), self.count_error)
        self._switch_on_launch = s.boundary == "launch"

        self.stats: dict[str, float] = dict.fromkeys((
            "windows", "records", "dropped", "discarded", "ingest_records_per_s", "ingest_records_per_s_wall",
            "decode_cpu_max_ms", "hold_cpu_max_ms", "buffers", "traced_ms", "interval_s", "last_window_ms", "last_flush_ms",
            "decode_fallback_buffers", "other_kind_records", "record_bytes", "launch_cb_deferred",
            "launch_cb_reenabled", "repeated_correlation", "idle_unsubscribes", "resubscribes",
            "empty_no_launches", "idle_windows", "last_armed_ms", "late_stamped_records"), 0)
        self._init_bursts()  # untraced bursts between windows (bursts.py)
        self.last_window: Optional[Window] = None
        self.graph_kernels = GraphKernels()  # what this process's graphs hold (assembled windows; the agent keeps its own)
        # extra consumers of what the sink gets (benchmarks, record mode); errors counted. With
        # records_sink, the records' columns are reused by the next window: copy what you keep
        self.taps: list[Sink] = []
        # per window: perf_counter at each phase's end (t0 ref window drain flush collect build sink),
        # decode_ms / decode_cpu_ms (wall / this thread's CPU), decode_parts_cpu_ms (of it: the buffers
        # gathered, then the window's columns + name ids), traced_ms, hold_cpu_max_ms, armed_ms (from
        # arming to the opening launch), and "cpu": thread_time() at the same marks
        self.phase_log: deque[dict[str, Any]] = deque(maxlen=256)

    # ================================================================== protocol
    def info(self) -> dict[str, str]:
        out = {"backend": self.backend, "observer": self.observer,
               # which decode pass runs (records.py): the C one, or numpy where it was not built
               "decode": "native" if _native.load() is not None else "numpy"}
        version = cupti_python_version()  # read once per process (package metadata)
        if version:
            out["cupti_python"] = version
        if self.api is not None:
            try:
                out.update(self.api.info())  # which libcupti won the load (collector_info)
            except Exception:
                pass
        return out

    def start(self, sink: Sink) -> None:
        if self._thread is not None:
            return
        self._sink = sink
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="graphmon-cupti", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None:
            t.join(timeout_s)
            if t.is_alive():
                self.count_error("stop_timeout")
        self._thread = None
        if self.subscription.subscribed or self.subscription.hook:  # the thread did not get to it in time
            self._teardown(flush=t is None or not t.is_alive())  # (if alive, it may still decode: no flush)
        self.set_state("stopped")

    def request_capture(self, request: CaptureRequest) -> None:
        # Refuse (HTTP 429) rather than let the bounded deque silently drop the oldest request.
        if len(self._captures) >= (self._captures.maxlen or 1 << 30):
            raise RuntimeError("too many pending captures")
        self._captures.append(request)
        self._wake.set()

    @property
    def api(self) -> Any:
        """The CuptiActivityApi in use (None before the first subscribe)."""
        return self.subscription.api

    @property
    def subscribed(self) -> bool:
        """True while CUPTI calls graphmon back (False between windows once idle: idle_unsubscribe_s)."""
        return self.subscription.subscribed

    @property
    def in_window(self) -> bool:
        """True while kernel tracing is on and launches join the window (benchmarks use it to
        split their own timings; a launch made once it is True is one of the window's)."""
        return self.trace.on and self._ring is self._win

    @property
    def armed(self) -> bool:
        """True while a window waits for the graph launch that opens it."""
        return self._ring is self._ref and self._ref.n == 0

    # ================================================================== collector thread
    def _run(self) -> None:
        s, sub = self.settings, self.subscription
        next_window = time.monotonic() + s.first_window_s
        self._burst_at(time.monotonic(), restart=True)
        while not self._stop.is_set():
            try:
                due = bool(self._captures) or time.monotonic() >= next_window
                if not sub.subscribed and (due or not sub.idle):
                    resuming = sub.idle  # idle: subscribe again for the window that is due
                    if not sub.setup(self._prepare):
                        self._stop.wait(s.blocked_retry_s)
                        continue
                    if resuming:
                        self.stats["resubscribes"] += 1
                        self._stop.wait(_RESUME_SETTLE_S)
                    else:
                        next_window = max(next_window, time.monotonic() + s.first_window_s)
                if sub.subscribed:
                    self._sync_launch_cb()
                now = time.monotonic()
                if sub.subscribed and (self._captures or now >= next_window):
                    spent_s = self._window()
                    if spent_s is None:  # idle: stays armed (idle_unsubscribe_s: the loop may let go first)
                        next_window = time.monotonic() + (s.interval_s if s.idle_unsubscribe_s > 0 else 0.0)
                    else:
                        next_window = time.monotonic() + self.next_interval_s(spent_s)
                    continue
                next_burst = self._burst_at(now)  # inf: bursts off, or not subscribed
                if now >= next_burst:  # no window is due (it would wait for the burst: one at a time)
                    self._run_burst()
                    continue
                wake_at = min(next_window, next_burst)
                if sub.subscribed and s.idle_unsubscribe_s > 0:
                    if sub.go_idle(now, busy=self._ring is not None or bool(self._captures)):
                        continue
                    idle_at = sub.active_s + s.idle_unsubscribe_s
                    if idle_at > now:  # (past it, something keeps it subscribed: polled below, or the next window)
                        wake_at = min(wake_at, idle_at)
                # Between windows the thread sleeps until the next one, unless the launch
                # callbacks are on (an exec not launched yet, registry): then it polls to switch
                # them off soon. An instantiate callback that turns them on wakes it (_wake).
                polling = sub.subscribed and (sub.gate.on or self.registry.pending_first_launch > 0)
                self._wake.wait(max(0.0, min(s.poll_s, wake_at - now) if polling else wake_at - now))
                self._wake.clear()
            except Exception:
                self.count_error("collector")
                now = time.monotonic()
                if now - self._collector_logged_s > 60.0:  # a persistent fault: one traceback a minute, not a second
                    self._collector_logged_s = now
                    log.exception("graphmon collector error")
                self._stop.wait(1.0)
        self._teardown()

    def next_interval_s(self, traced_s: float) -> float:
        """Seconds to the next window after one that traced kernels for ``traced_s`` (0: it traced
        no launch or got no record): the tracing budget (``max_traced_share``) within
        [interval_s, max_interval_s]. Traced steps run slower on the GPU (observer_slowdown
        1.27-1.65 on the H200's benchmark loops); kept under 0.1% of the steps they stay out of
        the host's p99.9 step time (bench/overhead/host_impact.py)."""
        s = self.settings
        wait = max(s.interval_s, min(s.max_interval_s, traced_s / s.max_traced_share))
        self.stats["interval_s"] = wait
        return wait

    def _prepare(self, api: Any) -> None:
        """Once the api exists (subscription.setup): the CUDA-event timer of the observer effect."""
        if self._timer is None and self.observer == "events":
            try:
                events = self._events_arg if self._events_arg is not None else CudaEvents()
                self._timer = EventTimer(events, self.settings.max_timed_launches, self.count_error)
            except Exception:
                self.count_error("events_init")
                self.observer = "off"

    def _teardown(self, flush: bool = True) -> None:
        if self.subscription.subscribed and self.trace.on:
            self._disable_tracing()
        self._ring = None
        self.subscription.release(flush)
        if self._timer is not None:
            self._timer.release()

    def _set_launch_cb(self, on: bool) -> None:
        self.subscription.set_launch_cb(on)

    def _sync_launch_cb(self) -> None:
        # pending_first_launch is raised before the instantiate callback enables launches, so
        # this never switches them off under an exec whose first launch is still to come; an exec
        # never launched keeps them on for first_launch_wait_s at most (registry).
        self.registry.expire_first_launches(self.settings.first_launch_wait_s)
        self._set_launch_cb(self._ring is not None or self.registry.pending_first_launch > 0)

    # ------------------------------------------------------------------ one window
    def _targets(self, req: Optional[CaptureRequest], count: bool = False) -> tuple[int, float]:
        """(launches, longest ms) of the window: a sampling window's, or a capture's (``count``:
        a capture beyond max_window_launches is counted, once per window)."""
        s = self.settings
        if req is None:
            return s.window_launches, s.window_duration_ms
        # bounded by its replays, else by its duration (and the ring: not an error)
        n_target = min(req.replays, self._max_launches) if req.replays else self._max_launches
        if count and req.replays and req.replays > self._max_launches:
            self.count_error("window_launches_capped")  # more than max_window_launches: the ring decides
        return n_target, min(req.duration_ms or s.capture_max_duration_ms, s.capture_max_duration_ms)

    def _arm(self, req: Optional[CaptureRequest]) -> tuple[bool, Optional[CaptureRequest]]:
        """Wait, tracing nothing, for the graph launch that opens the window: the reference ring
        takes launches from now on, and its first one wakes the collector. (True, the window's
        capture request) once it came; False when stopped, or after ``interval_s`` (a capture:
        its duration) without one. A capture asked meanwhile takes the window, and its duration
        bounds the wait from then on."""
        s = self.settings
        timed = self._timer is not None and self.observer == "events"
        n_target, dur_ms = self._targets(req)
        # a sampling window's size, never a capture's (it would take the capture's launches and
        # events, leaving the window none); without event timing, one launch: the opening one
        self._ref.reset(min(n_target, s.window_launches) if timed else 1)
        self._wake.clear()
        self._ring = self._ref
        self._set_launch_cb(True)
        t0 = time.monotonic()
        deadline = t0 + (dur_ms / 1e3 if req is not None else s.interval_s)
        while self._ref.n == 0:
            now = time.monotonic()
            if req is None and self._captures:
                req = self._captures.popleft()
                deadline = now + self._targets(req)[1] / 1e3
            if self._stop.is_set() or now >= deadline:
                self._ring = None
                if self._ref.n == 0 or self._stop.is_set():
                    return False, req
                self._ring = self._ref  # a launch came as the wait ended: it opens the window
                break
            self._wake.wait(min(_ARMED_POLL_S, deadline - now))
            self._wake.clear()
        self.stats["last_armed_ms"] = (time.monotonic() - t0) * 1e3
        return True, req

    def _window(self) -> Optional[float]:
        """One window: armed until a graph launch, its reference phase, then traced. Returns the
        traced seconds the tracing budget counts (0 when it traced no graph launch or got no
        record), or None when no launch came (an idle window)."""
        s = self.settings
        req = self._captures.popleft() if self._captures else None
        armed_t0 = time.perf_counter()
        opened, req = self._arm(req)
        self.pacer.new_window(self.ingest.wall_s, self.ingest.cpu_s, self.ingest.parts_s)
        if not opened:
            if self._stop.is_set():
                return 0.0
            self.stats["idle_windows"] += 1  # no graph launch: an idle window, nothing traced
            self._deliver_idle(req)
            return None
        if req is None and self._captures:
            req = self._captures.popleft()  # asked while armed: it takes the window this launch opens
        self.pacer.phases["armed_ms"] = (time.perf_counter() - armed_t0) * 1e3
        n_target, dur_ms = self._targets(req, count=True)
        if n_target > self._win.capacity:  # no phase is on: no callback holds this ring
            self._win = LaunchRing("win", n_target)
        timer = self._timer if self.observer == "events" else None
        # the reference phase: launches timed with events, tracing off (it began with the opening launch)
        if timer is not None:
            self._wait_phase(self._ref, min(dur_ms, s.window_duration_ms))
            if self._stop.is_set():
                self._ring = None
                return 0.0
        self.pacer.mark("ref")

        self._ring = None  # while switching phases a launch is neither timed nor kept
        self.ingest.new_window()
        self._win.reset(n_target)
        self._set_launch_cb(True)
        started = wall_time()
        t0 = time.perf_counter()
        self._traced_s = 0.0
        self.pacer.phases["window_t0"] = t0
        self.trace.arm()
        if not self._switch_on_launch:
            self.trace.open()  # boundary "collector": tracing on now, between two launches at best
        self._ring = self._win  # boundary "launch": the next launch's enter callback switches tracing on
        self._wait_phase(self._win, dur_ms)
        self.pacer.mark("window")
        self._closing = True  # launches from now on are left out of the window
        drained, ran_ns = self._close_tracing()
        self.pacer.mark("drain")
        self.pacer.start_piece()
        flush_ms = self.ingest.flush(self._win.columns()["correlation_id"], drained, self._stop.is_set)
        self.pacer.mark("flush")
        self._closing = False
        self._ring = None
        ended = wall_time()
        window_ms = (time.perf_counter() - t0) * 1e3
        n_records = self._deliver(req, started, ended, window_ms, flush_ms, timer, ran_ns)
        if self._win.n == 0:
            self.stats["empty_no_launches"] += 1  # traced, and no graph launch came: counted, no budget spent
            return 0.0
        return self._traced_s if n_records > 0 else 0.0

    def _now_ns(self) -> int:
        """CUPTI's clock now (the kernels' timestamps are on it); 0 when it cannot say."""
        try:
            return int(self.api.timestamp_ns())
        except Exception:
            self.count_error("timestamp")
            return 0

    def _wait_phase(self, ring: LaunchRing, dur_ms: float) -> None:
        deadline = time.perf_counter() + dur_ms / 1e3
        step = min(0.002, dur_ms / 1e3 / 4)
        tracing = ring is self._win
        while not self._stop.is_set():
            if ring.full or time.perf_counter() >= deadline:
                return
            if tracing:
                self.ingest.drain_queue()  # buffers CUPTI completed on its own (full ones): decode as they come
                if self.api.free_buffers() < 1:
                    self.count_error("buffers_full")  # close early: bounded memory
                    return
            self.pacer.sleep(step)

    # ================================================================== CallbackHandler (host threads)
    def _stream_id(self, ctx: int, stream: int) -> int:
        known = self._stream_ids.get(stream)
        if known is not None and known[0] == ctx:
            return known[1]
        try:
            sid = int(self.api.stream_id(ctx, stream))
        except Exception:
            self.count_error("stream_id")
            sid = -1
        self._stream_ids[stream] = (ctx, sid)
        return sid

    def on_launch_enter(self, corr: int, exec_handle: int, ctx: int, stream: int) -> None:
        self.subscription.gate.enter(corr, self.api.set_launch_callbacks)
        sid = self._stream_id(ctx, stream)
        self.registry.on_launch(exec_handle, sid)
        ring = self._ring
        if ring is None or self._closing:
            if self._closing and self._switch_on_launch and self.trace.on:
                self.trace.close(wait=False)  # a window that timed out: off before this launch runs
            return
        i = ring.claim()  # -1 once the phase has its launches: the collector polls, the cap does not
        if i < 0:
            return
        ring.corr[i] = corr
        ring.exec_handle[i] = exec_handle
        ring.ctx[i] = ctx
        ring.stream[i] = stream
        ring.stream_id[i] = sid
        if ring is self._win:
            if i == 0 and self._switch_on_launch:
                self.trace.open()  # before this launch runs: the window's first replay is traced whole
            ring.launch_ns[i] = self.api.timestamp_ns()
        timer = self._timer
        if timer is not None and self.observer == "events":
            timer.start(ring, i)
        if i == ring.wake_on:
            self._wake.set()  # armed: this launch opens the window; a burst: its last launch (no wait)

    def on_launch_exit(self, corr: int) -> None:
        self.subscription.gate.exit()
        for ring in (self._win, self._ref, self._burst):
            i = ring.find(corr)
            if i >= 0:
                if self._timer is not None:
                    self._timer.end(ring, i)
                # after its end event (the drain waits on it); the window's last launch is traced
                # whole, and no launch after it is: tracing off (boundary "launch")
                if ring.mark_returned(i) and ring is self._win and self._switch_on_launch:
                    self.trace.close(wait=False)
                return

    def on_upload(self, exec_handle: int, ctx: int, stream: int) -> None:
        self.registry.on_upload(exec_handle, self._stream_id(ctx, stream))

    def on_instantiate(self, exec_handle: int, ctx: int, flags: int, upload_stream: Optional[int]) -> None:
        try:
            gid = int(self.api.graph_exec_id(exec_handle))
        except Exception:
            gid = -1
        us = self._stream_id(ctx, upload_stream) if upload_stream is not None else -1
        self.registry.on_instantiate(exec_handle, flags=flags, upload_stream=us, graph_id=gid)
        self.subscription.active_s = time.monotonic()  # graphs are being made: stay subscribed (idle_unsubscribe_s)
        if not self.subscription.gate.on:
            try:  # catch this exec's first launch even if it comes before the collector wakes
                self._set_launch_cb(True)
            except Exception:
                self.count_error("launch_cb_enable")
            self._wake.set()  # the collector, asleep until its next window, polls until it launched

    def on_destroy(self, exec_handle: int) -> None:
        self.registry.on_destroy(exec_handle)
