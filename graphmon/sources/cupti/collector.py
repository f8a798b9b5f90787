"""Live CUPTI source: sampled CONCURRENT_KERNEL windows + driver-API graph callbacks.

The window state machine. CUPTI sits behind api.CuptiActivityApi; records.py decodes buffers,
assemble.py builds traces, observer.py measures the observer effect. What it does, and why:

- Kernel tracing (CONCURRENT_KERNEL only: KERNEL serializes kernels) perturbs what it measures
  (+12-33% per replay on an H200), so it is on only in short *windows*: every ``interval_s``,
  for ``window_launches`` graph launches or
  ``window_duration_ms`` (graphmon.settings.CuptiSettings). ``request_capture`` opens one soon.
- Graph identity/upload mode come from driver-API callbacks. The launch callback (~0.4% of a
  replay) is on only inside windows and their reference phase, and while an exec created after
  attach has not launched yet (its first launch decides ``lazy``), ``first_launch_wait_s`` at most.
- Nothing on the host's path waits for graphmon (issue 13): the launch callback writes into
  preallocated slots (launches.py); buffers are queued by CUPTI's completion callback and decoded
  here, one buffer per GIL hold, under no lock a callback takes; a window closes by waiting for
  its launches' CUDA events, then flushing (see ``_flush`` for when it forces).
- Opt-in (``idle_unsubscribe_s`` > 0): between windows, once no graph has been instantiated for
  that long, it unsubscribes from CUPTI until its next window, so torch.profiler can run
  meanwhile. A torch graph capture subscribes it again first (capture_hook.py), so that graph's
  upload mode is still seen. Not the default: staying subscribed cost no measurable time on the
  H200 (a few ns per driver call, bench/cupti_idle_cost.py), while the unsubscribe after a
  window stalled an HF decode step by 7.4 ms.
- Callbacks never raise into the host (errors counted by stage); CUPTI is never finalized
  (cuptiFinalize faulted the GPU on the next replay of a graph traced before it, H200).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Optional

from graphmon.model.edges import assemble
from graphmon.model.window import CaptureRequest, Window
from graphmon.settings import CuptiSettings
from graphmon.sources.base import Sink, Source, wall_time
from graphmon.sources.cupti.assemble import raw_columns, window_records
from graphmon.sources.cupti import capture_hook
from graphmon.sources.cupti import native as _native
from graphmon.sources.cupti.launches import LaunchGate, LaunchRing
from graphmon.sources.cupti.libinfo import cupti_python_version
from graphmon.sources.cupti.observer import CudaEvents, EventTimer, slowdown_ratio
from graphmon.sources.cupti.records import BufferDecoder, ColumnArena, NameTable, RecordStore, shared_name_table, warm_up
from graphmon.sources.cupti.registry import REGISTRY, GraphRegistry

log = logging.getLogger("graphmon.cupti")

_BATCH_PIECE_S = 2e-4  # buffers gathered in one GIL hold until their CPU reaches this (then a yield)
# After subscribing again for a window: CUPTI state changes made the next replays of a graph pay
# one-time work on the H200 (bench/cupti_idle_cost.py --stages); the reference phase starts after
_RESUME_SETTLE_S = 0.05


class CuptiSource(Source):
    backend = "cupti"

    def __init__(self, cupti: Any = None, *, settings: Optional[CuptiSettings] = None, events: Any = None,
                 registry: Optional[GraphRegistry] = None) -> None:
        super().__init__()
        self.settings = s = settings if settings is not None else CuptiSettings()
        self._api_arg = cupti  # a CuptiActivityApi (tests: the fake); None: load cupti-python + libcupti
        self.api: Any = None
        self._events_arg = events
        self.registry = registry if registry is not None else REGISTRY
        self.observer = s.observer
        self.last_raw: Optional[dict[str, Any]] = None  # settings.keep_raw: the last window's unfiltered records
        # True: the sink gets WindowRecords, unfiltered (a light collector ships them to the agent,
        # which assembles the Window); False: the sink gets the assembled Window
        self.records_sink = False

        self._sink: Optional[Sink] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._captures: deque[CaptureRequest] = deque(maxlen=16)
        self._subscribed = False
        # subscribe/unsubscribe: the collector, and a host thread beginning a graph capture
        # (capture_hook); never taken by a CUPTI callback
        self._sub_lock = threading.Lock()
        self._idle = False  # unsubscribed between windows (idle_unsubscribe_s) until the next one
        self._active_s = 0.0  # monotonic time of the last reason to stay subscribed: attach, an instantiation, a capture
        self._hook = False  # capture_hook installed
        self._gate = LaunchGate(enabled=s.launch_gate)  # the launch callbacks, never off inside a launch
        self._collector_logged_s = -1e9
        self._timer: Optional[EventTimer] = None

        # window state: callbacks (host threads) write the current ring, the collector the rest.
        # Sized for a sampling window; a capture that needs more slots grows the window's ring
        # on the collector thread before its phase starts. Why not max_window_launches up front:
        # 9 lists of 65,536 slots per ring took ~3 ms of GIL each in attach(), which on an HF
        # decode loop showed up as the attach's stall (bench/attach_stall.py).
        self._max_launches = min(s.max_window_launches, 1 << 20)
        cap = min(self._max_launches, max(s.window_launches, 64))
        self._ref = LaunchRing("ref", cap)
        self._win = LaunchRing("win", cap)
        self._ring: Optional[LaunchRing] = None  # the ring launches go to now; None: not sampling
        self._in_window = False
        self._closing = False  # window full: launches no longer join it, tracing drains
        self._stream_ids: dict[int, tuple[int, int]] = {}  # stream handle -> (ctx, CUPTI stream id)

        # records: only the collector thread decodes and stores
        self._decoder: Optional[BufferDecoder] = None
        self._store = RecordStore(s.max_window_records)  # reused from window to window
        self._arena = ColumnArena()  # a records sink's columns, reused (the link copies them at once)
        self._names: Optional[NameTable] = None
        self._ingest_s = 0.0  # wall time decoding (includes waits for the host's GIL)
        self._ingest_cpu_s = 0.0  # this thread's CPU time decoding: graphmon's own cost
        self._ingest_parts_s = [0.0, 0.0]  # of it: per buffer (gather into the store), at the window's end (columns + name ids)
        self._ingest_records = 0
        self._piece_cpu_max_s = 0.0  # the window's longest one-buffer decode, CPU
        self._piece_cpu0 = 0.0  # thread_time() when the collector last yielded (_yield)
        self._hold_cpu_max_s = 0.0  # the window's longest piece of work between two yields, CPU
        self._warmed = False
        self._traced_s = 0.0  # the last window's span with kernel tracing on (enable to disable)

        self.stats: dict[str, float] = dict.fromkeys((
            "windows", "records", "dropped", "discarded", "ingest_records_per_s", "ingest_records_per_s_wall",
            "decode_cpu_max_ms", "hold_cpu_max_ms", "buffers", "traced_ms", "interval_s", "last_window_ms", "last_flush_ms",
            "decode_fallback_buffers", "other_kind_records", "record_bytes", "launch_cb_deferred",
            "launch_cb_reenabled", "repeated_correlation", "idle_unsubscribes", "resubscribes"), 0)
        self.last_window: Optional[Window] = None
        # extra consumers of what the sink gets (benchmarks, record mode); errors counted. With
        # records_sink, the records' columns are reused by the next window: copy what you keep
        self.taps: list[Sink] = []
        # per window: perf_counter at each phase's end (t0 ref window drain flush collect build sink),
        # decode_ms / decode_cpu_ms (wall / this thread's CPU), decode_parts_cpu_ms (of it: the buffers
        # gathered, then the window's columns + name ids), traced_ms, hold_cpu_max_ms, and "cpu":
        # thread_time() at the same marks
        self.phase_log: deque[dict[str, Any]] = deque(maxlen=256)
        self._phases: dict[str, Any] = {}

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
        if self._subscribed or self._hook:  # the thread did not get to it in time (if alive, it may still decode: no flush)
            self._teardown(flush=t is None or not t.is_alive())
        self.set_state("stopped")

    def request_capture(self, request: CaptureRequest) -> None:
        # Refuse (HTTP 429) rather than let the bounded deque silently drop the oldest request.
        if len(self._captures) >= (self._captures.maxlen or 1 << 30):
            raise RuntimeError("too many pending captures")
        self._captures.append(request)
        self._wake.set()

    @property
    def subscribed(self) -> bool:
        """True while CUPTI calls graphmon back (False between windows once idle: idle_unsubscribe_s)."""
        return self._subscribed

    @property
    def in_window(self) -> bool:
        """True while kernel tracing is on (benchmarks use it to split their own timings)."""
        return self._in_window

    # ================================================================== collector thread
    def _run(self) -> None:
        s = self.settings
        next_window = time.monotonic() + s.first_window_s
        while not self._stop.is_set():
            try:
                due = bool(self._captures) or time.monotonic() >= next_window
                if not self._subscribed and (due or not self._idle):
                    resuming = self._idle  # idle: subscribe again for the window that is due
                    if not self._setup():
                        self._stop.wait(s.blocked_retry_s)
                        continue
                    if resuming:
                        self.stats["resubscribes"] += 1
                        self._stop.wait(_RESUME_SETTLE_S)
                    else:
                        next_window = max(next_window, time.monotonic() + s.first_window_s)
                if self._subscribed:
                    self._sync_launch_cb()
                now = time.monotonic()
                if self._subscribed and (self._captures or now >= next_window):
                    req = self._captures.popleft() if self._captures else None
                    self._window(req)
                    next_window = time.monotonic() + self.next_interval_s(self._traced_s)
                    continue
                wake_at = next_window
                if self._subscribed and s.idle_unsubscribe_s > 0:
                    if self._go_idle(now):
                        continue
                    idle_at = self._active_s + s.idle_unsubscribe_s
                    if idle_at > now:  # (past it, something keeps it subscribed: polled below, or the next window)
                        wake_at = min(wake_at, idle_at)
                # Between windows the thread sleeps until the next one, unless the launch
                # callbacks are on (an exec not launched yet, registry): then it polls to switch
                # them off soon. An instantiate callback that turns them on wakes it (_wake).
                polling = self._subscribed and (self._gate.on or self.registry.pending_first_launch > 0)
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
        """Seconds to the next window after one that traced kernels for ``traced_s``: the
        tracing budget (``max_traced_share``) within [interval_s, max_interval_s]. Traced steps
        run slower on the GPU (observer_slowdown 1.27-1.65 on the H200's benchmark loops); kept
        under 0.1% of the steps they stay out of the host's p99.9 step time (bench/host_impact.py)."""
        s = self.settings
        wait = max(s.interval_s, min(s.max_interval_s, traced_s / s.max_traced_share))
        self.stats["interval_s"] = wait
        return wait

    def _setup(self) -> bool:
        """Subscribe and register; False (state 'blocked') when another subscriber holds CUPTI."""
        s = self.settings
        try:
            if self.api is None:
                if self._api_arg is not None:
                    self.api = self._api_arg
                else:
                    from graphmon.sources.cupti.api import load_api

                    self.api = load_api(s.buffer_size_bytes, s.max_buffers)
            if self._timer is None and self.observer == "events":
                try:
                    events = self._events_arg if self._events_arg is not None else CudaEvents()
                    self._timer = EventTimer(events, s.max_timed_launches, self.count_error)
                except Exception:
                    self.count_error("events_init")
                    self.observer = "off"
            api = self.api
            if self._decoder is None:
                self._decoder = BufferDecoder(walk=api.walk_records)
                if self._decoder.native is None:
                    log.info("graphmon: decoding CUPTI buffers with numpy (native decode %s)", _native.status())
                self._names = shared_name_table(getattr(api, "names_key", None), api.kernel_name)
            self.registry.graph_exec_id = api.graph_exec_id
            with self._sub_lock:
                if not self._subscribed:  # (a capture may have subscribed it meanwhile)
                    try:
                        api.subscribe(self)
                    except Exception as e:
                        self.set_state("blocked", f"cupti subscribe failed (another profiler?): {e}")
                        return False
                    self._subscribed = True
                if not self._idle:  # attach (or the end of a block) starts the quiet period; a window does not
                    self._active_s = time.monotonic()
                self._idle = False
            if not self._warmed:  # after subscribing: a graph instantiated meanwhile is seen
                self._warmed = True
                try:
                    # numpy's first calls at attach, not in the first window; and before 'running',
                    # which an in-code attach waits for: on the H200 the host's first step after a
                    # process's first attach took 70 ms while this ran after it
                    warm_up()
                    cupti_python_version()  # package metadata (ms): read once per process, here
                except Exception:
                    self.count_error("warm_up")
            self.set_state("running")
            return True
        except Exception as e:
            self.count_error("setup")
            self.set_state("error", f"cupti unavailable: {e}")
            return False

    def _go_idle(self, now: float) -> bool:
        """Unsubscribe between windows once nothing needs CUPTI: no graph instantiated for
        ``idle_unsubscribe_s``, no first launch pending, no capture queued. True if it did."""
        s = self.settings
        if (self._ring is not None or self._captures or self._gate.on or self.registry.pending_first_launch > 0
                or now - self._active_s < s.idle_unsubscribe_s):
            return False
        if not self._hook:  # before unsubscribing: a capture from now on subscribes first
            try:
                self._hook = capture_hook.install(self._on_capture_begin)
            except Exception:
                self.count_error("capture_hook")
        self._return_buffers("flush")
        with self._sub_lock:
            if not self._subscribed or time.monotonic() - self._active_s < s.idle_unsubscribe_s:
                return False
            try:
                self.api.unsubscribe()
            except Exception:
                self.count_error("unsubscribe")
                return False
            self._subscribed = False
            self._idle = True
            self._gate.forget()
        self.stats["idle_unsubscribes"] += 1
        return True

    def _return_buffers(self, stage: str) -> None:
        """Every buffer CUPTI holds back to the pool (a forced flush, then decoded), before
        graphmon lets go of CUPTI: another tool (torch.profiler/Kineto) may then register its own
        buffer callbacks, and CUPTI must never complete one of ours through them."""
        for step in (lambda: self.api.flush(forced=True), self._ingest):
            try:
                step()
            except Exception:
                self.count_error(stage)

    def _on_capture_begin(self) -> None:
        """A host thread begins a torch graph capture (capture_hook): subscribe now, so that the
        graph's instantiation is seen (its upload mode), and stay subscribed for the quiet period."""
        if self._stop.is_set() or self._thread is None:
            return
        self._active_s = time.monotonic()
        if self._subscribed:
            return
        with self._sub_lock:
            if self._subscribed or not self._idle:
                return
            try:
                self.api.subscribe(self)
            except Exception:
                self.count_error("capture_subscribe")
                return
            self._subscribed = True
            self._idle = False
            self._active_s = time.monotonic()
        self.stats["resubscribes"] += 1
        self._wake.set()  # the collector's wait was for its next window: now also for the quiet period

    def _teardown(self, flush: bool = True) -> None:
        if self._hook:
            capture_hook.uninstall(self._on_capture_begin)
            self._hook = False
        with self._sub_lock:
            was_idle, self._idle = self._idle, False  # a capture from now on finds nothing to subscribe
        if not self._subscribed:
            if was_idle and self._timer is not None:
                self._timer.release()
            return
        if self._in_window:
            self._disable_tracing()
        self._ring = None
        if flush:
            self._return_buffers("unsubscribe")
        try:  # lets torch.profiler (Kineto) subscribe afterwards
            self.api.unsubscribe()
        except Exception:
            self.count_error("unsubscribe")
        self._subscribed = False
        self._gate.forget()
        if self._timer is not None:
            self._timer.release()

    def _set_launch_cb(self, on: bool) -> None:
        if self._subscribed:  # an off waits while a launch is between its enter and exit (LaunchGate)
            self._gate.set(on, self.api.set_launch_callbacks)

    def _sync_launch_cb(self) -> None:
        # pending_first_launch is raised before the instantiate callback enables launches, so
        # this never switches them off under an exec whose first launch is still to come; an exec
        # never launched keeps them on for first_launch_wait_s at most (registry).
        self.registry.expire_first_launches(self.settings.first_launch_wait_s)
        self._set_launch_cb(self._ring is not None or self.registry.pending_first_launch > 0)

    # ------------------------------------------------------------------ one window
    def _window(self, req: Optional[CaptureRequest]) -> None:
        s = self.settings
        n_target, dur_ms = s.window_launches, s.window_duration_ms
        if req is not None:  # bounded by its replays, else by its duration (and the ring: not an error)
            n_target = min(req.replays, self._max_launches) if req.replays else self._max_launches
            dur_ms = min(req.duration_ms or s.capture_max_duration_ms, s.capture_max_duration_ms)
            if req.replays and req.replays > self._max_launches:
                self.count_error("window_launches_capped")  # more than max_window_launches: the ring decides
            if n_target > self._win.capacity:  # no phase is on: no callback holds this ring
                self._win = LaunchRing("win", n_target)
        timer = self._timer if self.observer == "events" else None
        self._piece_cpu0 = time.thread_time()
        self._phases = {"t0": time.perf_counter(), "decode_ms": -self._ingest_s * 1e3,  # see phase_log
                             "decode_cpu_ms": -self._ingest_cpu_s * 1e3,
                             "decode_parts_cpu_ms": [-x * 1e3 for x in self._ingest_parts_s],
                             "cpu": {"t0": time.thread_time()}}
        # reference phase: launches timed with events, tracing off; a sampling window's size, never a
        # capture's duration (it would take the capture's launches and events, leaving the window none)
        self._ref.reset(0)
        if timer is not None:
            self._ref.reset(min(n_target, s.window_launches))
            self._ring = self._ref
            self._set_launch_cb(True)
            self._wait_phase(self._ref, min(dur_ms, s.window_duration_ms))
            if self._stop.is_set():
                self._ring = None
                return
        self._mark("ref")

        self._ring = None  # while switching phases a launch is neither timed nor kept
        self._ingest()  # leftovers of an earlier window: not this window's
        self._store.clear()
        self._names.new_window()
        self._win.reset(n_target)
        self._set_launch_cb(True)
        started = wall_time()
        t0 = time.perf_counter()
        self._traced_s = 0.0
        self.api.set_kernel_activity(True)
        self._ring = self._win  # before in_window: a caller that waits for it launches into the ring
        self._phases["window_t0"] = t0
        self._in_window = True  # after enabling: every launch the window takes is traced
        self._wait_phase(self._win, dur_ms)
        self._mark("window")
        # Launches already made may still be queued on the GPU: keep tracing until they ran
        self._closing = True  # (launches from now on are left out of the window)
        if s.close == "disable_first":
            # Stop tracing new launches now; the window's queued kernels were instrumented at
            # launch and finish on their own: wait for them, then flush.
            self._disable_tracing()
            drained = not self._stop.is_set() and self._drain()
        else:
            drained = not self._stop.is_set() and self._drain()
            self._disable_tracing()
        self._mark("drain")
        self._piece_cpu0 = time.thread_time()
        flush_ms = self._flush(drained)
        self._mark("flush")
        self._closing = False
        self._ring = None
        ended = wall_time()
        window_ms = (time.perf_counter() - t0) * 1e3
        self._deliver(req, started, ended, window_ms, flush_ms, timer)

    def _deliver(self, req, started: float, ended: float, window_ms: float, flush_ms: float, timer) -> None:
        dropped = self._dropped()
        slowdown = slowdown_ratio(timer.collect([self._ref, self._win])) if timer is not None else None
        self._yield()
        discarded = self._store.discarded
        c0, t0 = time.thread_time(), time.perf_counter()
        # columns + name ids, a chunk per GIL hold; a records sink (the light collector's link)
        # encodes them before the next window, so they can live in reused memory
        arena = self._arena if self.records_sink and not self.settings.keep_raw else None
        cols, name_id = self._store.take(self._yield, self._names, arena)
        c = time.thread_time() - c0  # ingest's second part (its sleeps are not CPU)
        self._ingest_parts_s[1] += c
        self._ingest_cpu_s += c
        self._ingest_s += time.perf_counter() - t0
        self._mark("collect")  # event timing collected
        self._yield()
        rec = window_records(cols, name_id[: len(cols)], list(self._names.names), self._win.columns(), self.registry,
                             started_s=started, ended_s=ended, dropped=dropped + discarded, observer_slowdown=slowdown,
                             traced_s=self._traced_s,
                             capture_id=req.id if req is not None else None)
        if self.settings.keep_raw:
            self.last_raw = raw_columns(rec)
        st, ds = self.stats, self._decoder.stats
        st["windows"] += 1
        st["records"] += len(rec)
        st["dropped"] += dropped
        st["discarded"] += discarded
        g = self._gate  # launch-callback switching (LaunchGate): offs put off, enters that found them off
        st.update(last_window_ms=window_ms, last_flush_ms=flush_ms, decode_fallback_buffers=ds.fallback_buffers,
                  other_kind_records=ds.other_kind_records, record_bytes=self._decoder.record_bytes,
                  launch_cb_deferred=g.deferred, launch_cb_reenabled=g.reenabled, repeated_correlation=g.repeated_corr)
        if self._ingest_cpu_s > 0:  # records per second of the collector's CPU (its wall time: _wall)
            st["ingest_records_per_s"] = self._ingest_records / self._ingest_cpu_s
        if self._ingest_s > 0:
            st["ingest_records_per_s_wall"] = self._ingest_records / self._ingest_s
        st["decode_cpu_max_ms"] = self._piece_cpu_max_s * 1e3
        self._piece_cpu_max_s = 0.0
        st["buffers"] = self._decoder.stats.buffers
        st["traced_ms"] = self._phases["traced_ms"] = self._traced_s * 1e3
        self._sync_launch_cb()
        # A light collector's sink (and taps) take the records as they are: the agent filters and
        # validates them (model/edges.assemble), so the serving process's GIL never does.
        out: Any = rec
        self._yield()
        if not self.records_sink:
            try:
                out = self.last_window = assemble(rec)
            except Exception:
                out = None
                self.count_error("assemble")
        self._mark("build")
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
        self._mark("sink")
        # the longest piece of this window's work between two yields (the sink's included): the
        # longest the collector can have kept the GIL from the host in one go
        hold_s = max(self._hold_cpu_max_s, time.thread_time() - self._piece_cpu0)
        st["hold_cpu_max_ms"] = self._phases["hold_cpu_max_ms"] = hold_s * 1e3
        self._hold_cpu_max_s = 0.0
        self._phases["decode_ms"] += self._ingest_s * 1e3
        self._phases["decode_cpu_ms"] += self._ingest_cpu_s * 1e3
        self._phases["decode_parts_cpu_ms"] = [a + b * 1e3 for a, b in
                                               zip(self._phases["decode_parts_cpu_ms"], self._ingest_parts_s)]
        self.phase_log.append(self._phases)

    def _yield(self, min_piece_s: float = 0.0) -> None:
        """Between two pieces of the collector's work: sleep, so that a host thread waiting for
        the GIL takes it. time.sleep(0) hands the GIL back only if the waiter wins the race to
        it, which the thread that just released it usually does: the host then waits for
        Python's switch interval (5 ms) instead of one piece (< 0.4 ms). The sleep grows with
        the piece (``gil_share``): an HF decode loop needs the GIL nearly all the time, so on
        the H200 a window's 2-4 ms of work, yielding 0.5 ms between pieces, still stretched the
        one or two host steps it overlapped by 1-2 ms. A piece shorter than ``min_piece_s``
        goes on without a sleep (the next piece joins it)."""
        s = self.settings
        piece_s = max(0.0, time.thread_time() - self._piece_cpu0)
        if piece_s < min_piece_s:
            return
        self._hold_cpu_max_s = max(self._hold_cpu_max_s, piece_s)
        sleep_s = max(s.yield_ms / 1e3, piece_s * (1.0 - s.gil_share) / s.gil_share)
        time.sleep(min(sleep_s, 0.05))
        self._piece_cpu0 = time.thread_time()

    def _sleep(self, seconds: float) -> None:
        """A wait of the window's own (polling, draining): the host had the GIL, a new piece starts."""
        time.sleep(seconds)
        self._piece_cpu0 = time.thread_time()

    def _mark(self, phase: str) -> None:
        """End of a window phase: wall time, and this thread's CPU time (what graphmon itself
        spent: the GIL it can have held; the wall time also holds waits for the host's GIL)."""
        self._phases[phase] = time.perf_counter()
        self._phases["cpu"][phase] = time.thread_time()

    def _wait_phase(self, ring: LaunchRing, dur_ms: float) -> None:
        deadline = time.perf_counter() + dur_ms / 1e3
        step = min(0.002, dur_ms / 1e3 / 4)
        tracing = ring is self._win
        while not self._stop.is_set():
            if ring.full or time.perf_counter() >= deadline:
                return
            if tracing:
                self._ingest()  # buffers CUPTI completed on its own (full ones): decode as they come
                if self.api.free_buffers() < 1:
                    self.count_error("buffers_full")  # close early: bounded memory
                    return
            self._sleep(step)

    def _drain(self) -> bool:
        """Keep tracing until the window's launches have run on the GPU (then the caller flushes).
        True when CUDA events say every window launch ran (the last one on each of its streams).

        A serving loop can run tens of ms ahead of the GPU; a flush before its kernels ran would
        leave them out (or, forced, return them with zero end times; seen on the H200 with a
        290 ms deep queue). With event timing on, wait for the end event of the window's last
        timed launch on each stream (bounded by ``max_drain_ms``); else the fixed ``drain_ms``.
        """
        s = self.settings
        timer = self._timer if self.observer == "events" else None
        query = getattr(timer.events, "query", None) if timer is not None else None
        deadline = time.perf_counter() + max(s.drain_ms, s.max_drain_ms) / 1e3
        # A window launch whose API call has not returned has no end event yet (cuGraphLaunch
        # blocks while the GPU's queue is full: the host is far ahead). Wait for it, within the
        # same bound: else the drain would stop one launch early and cut that replay (seen once
        # in 8 windows on the H200 with the host ~70 ms ahead).
        while self._win.pending() and time.perf_counter() < deadline and not self._stop.is_set():
            self._sleep(0.0002)
        if query is None or timer is None:
            if s.drain_ms > 0:
                self._sleep(s.drain_ms / 1e3)
            return False
        return timer.wait_ran(self._win, query, deadline, self._stop.is_set) and not self._win.pending()

    def _disable_tracing(self) -> None:
        try:
            self.api.set_kernel_activity(False)
        except Exception:
            self.count_error("activity_disable")
        if self._in_window:  # the span the GPU ran traced: what the tracing budget counts
            self._traced_s = time.perf_counter() - self._phases.get("window_t0", time.perf_counter())
        self._in_window = False

    def _flush(self, drained: bool = False) -> float:
        """Ask CUPTI for the window's buffers and decode them; returns the ms it took.

        CUPTI's non-forced flush returns only buffers whose records are all complete (full or
        not): one incomplete record (a launch traced while the window drained, still queued)
        holds back the window's records in its buffer too (H200: cut replays). A forced flush
        returns every buffer, incomplete records with zero end times. So once the events say
        every window launch ran (``drained``) one forced flush returns the window whole (only
        later launches, outside it, come back incomplete). Otherwise flush without forcing until
        every window launch has records, within ``max_drain_ms``, then force (``flush_forced``)."""
        t0 = time.perf_counter()
        deadline = t0 + self.settings.max_drain_ms / 1e3
        forced = drained
        while True:
            try:
                self.api.flush(forced=forced)
            except Exception:
                self.count_error("flush")
                break
            self._ingest()
            if forced or self._stop.is_set() or self._store.has_all(self._win.columns()["correlation_id"]):
                break
            if time.perf_counter() >= deadline:
                forced = True
                self.count_error("flush_forced")
                continue
            self._sleep(0.002)
        return (time.perf_counter() - t0) * 1e3

    def _ingest(self) -> None:
        """Gather the queued buffers into the window's store and give each back to the pool,
        yielding the GIL once a piece of work reaches ``_BATCH_PIECE_S`` (a default window's
        buffers take ~0.05-0.1 ms each: a sleep after every one would only stretch the flush)."""
        api = self.api
        while True:
            buf = api.completed_buffer()
            if buf is None:
                return
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                self._ingest_records += self._decoder.gather(buf.data, self._store)
            except Exception:
                self.count_error("buffer_completed")
            finally:
                api.release_buffer(buf.key)
            self._ingest_s += time.perf_counter() - t0
            c = time.thread_time() - c0
            self._ingest_cpu_s += c
            self._ingest_parts_s[0] += c
            self._piece_cpu_max_s = max(self._piece_cpu_max_s, c)
            self._yield(_BATCH_PIECE_S)  # the host's threads take the GIL between pieces

    def _dropped(self) -> int:
        try:
            return int(self.api.dropped_records())
        except Exception:
            self.count_error("dropped_query")
            return 0

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
        self._gate.enter(corr, self.api.set_launch_callbacks)
        sid = self._stream_id(ctx, stream)
        self.registry.on_launch(exec_handle, sid)
        ring = self._ring
        if ring is None or self._closing:
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
            ring.launch_ns[i] = self.api.timestamp_ns()
        timer = self._timer
        if timer is not None and self.observer == "events":
            timer.start(ring, i)

    def on_launch_exit(self, corr: int) -> None:
        self._gate.exit()
        for ring in (self._win, self._ref):
            i = ring.find(corr)
            if i >= 0:
                if self._timer is not None:
                    self._timer.end(ring, i)
                ring.returned[i] = True  # after its end event: the drain waits on it
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
        self._active_s = time.monotonic()  # graphs are being made: stay subscribed (idle_unsubscribe_s)
        if not self._gate.on:
            try:  # catch this exec's first launch even if it comes before the collector wakes
                self._set_launch_cb(True)
            except Exception:
                self.count_error("launch_cb_enable")
            self._wake.set()  # the collector, asleep until its next window, polls until it launched

    def on_destroy(self, exec_handle: int) -> None:
        self.registry.on_destroy(exec_handle)
