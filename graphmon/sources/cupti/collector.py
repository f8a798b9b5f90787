"""Live CUPTI source: sampled CONCURRENT_KERNEL windows + driver-API graph callbacks.

The only module of graphmon that touches cupti (imported lazily, injectable for tests). What
it does, and why:

- Kernel tracing perturbs what it measures (+12-33% per replay on an H200 while on, see
  shared notes), so it is on only inside short *windows*: every ``interval_s`` a window opens
  for ``window_launches`` graph launches or ``window_duration_ms``, whichever ends first.
  Default: 16 launches or 20 ms every 10 s, then tracing stays on until those launches ran
  (bounded by ``max_drain_ms``). Steady cost on an H200: +0.29% of replay time
  (bench/results/gpu-overhead.md). ``request_capture`` opens a window soon and tags it.
- Only CONCURRENT_KERNEL is enabled (KERNEL serializes kernels).
- Graph identity/upload mode come from driver-API callbacks (runtime calls reach them too):
  cuGraphInstantiate* (exit), cuGraphUpload*, cuGraphExecDestroy, cuGraphLaunch*. The launch
  callback costs ~0.4% of a replay, so it is enabled only while it is needed: inside windows
  and their reference phase, and while some exec created after attach has not launched yet
  (its first launch decides ``lazy``).
- Observer effect: CUDA events recorded on the launch stream around sampled graph launches,
  in a reference phase just before each window and inside the window (the same method as the
  probe's ground truth). ``Window.observer_slowdown`` = in-window / reference replay time.
- Callbacks never raise into the host: every one is wrapped and errors are counted by stage.
  ``cupti.finalize()`` is never called (it broke the CUDA context on the H200).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import operator
import threading
import time
from collections import deque
from typing import Any, Optional

import numpy as np

from graphmon.sources.cupti.registry import REGISTRY, GraphRegistry
from graphmon.model.trace import Trace
from graphmon.model.window import CaptureRequest, Window
from graphmon.sources.base import Sink, Source, wall_time

log = logging.getLogger("graphmon.cupti")

# Byte offsets in CUDA_GRAPH_INSTANTIATE_PARAMS {cuuint64_t flags; CUstream hUploadStream; ...}.
_IP_FLAGS, _IP_UPLOAD_STREAM = 0, 8
# The legacy default stream (0 / CU_STREAM_LEGACY) cannot be captured, and a graph launch on it
# already synchronizes with every blocking stream, so an event recorded there cannot break a
# capture; asking cuStreamIsCapturing about it during another stream's capture could.
_LEGACY_STREAMS = (0, 1)


def _load_cupti():
    from cupti import cupti  # lazy: graphmon imports without CUDA

    return cupti


def library_info(maps_path: str = "/proc/self/maps") -> dict[str, str]:
    """The libcupti loaded in this process: path, the nvidia-cuda-cupti wheel version that
    shipped it (when it came from one) and cuptiGetVersion's API version. Empty when none is
    loaded. Never raises."""
    out: dict[str, str] = {}
    try:
        with open(maps_path) as fh:
            paths = sorted({ln.split(None, 5)[-1].strip() for ln in fh if "libcupti.so" in ln})
    except OSError:
        return out
    paths = [p for p in paths if p.startswith("/")]
    if not paths:
        return out
    out["cupti_lib"] = paths[0]
    if len(paths) > 1:
        out["cupti_libs_loaded"] = str(len(paths))  # two copies in one process: say so
    ver = wheel_version_of(paths[0])
    if ver:
        out["cupti_lib_version"] = ver
    try:
        v = ctypes.c_uint32(0)
        if ctypes.CDLL(paths[0]).cuptiGetVersion(ctypes.byref(v)) == 0:
            out["cupti_api_version"] = str(v.value)
    except Exception:
        pass  # not callable here: the path and wheel version still say which library it is
    return out


def wheel_version_of(lib_path: str) -> str:
    """Version of the nvidia-cuda-cupti wheel whose RECORD lists ``lib_path``, or ''."""
    import glob
    import os

    marker = f"{os.sep}nvidia{os.sep}"
    if marker not in lib_path:
        return ""
    root = lib_path[: lib_path.rindex(marker)]
    rel = os.path.relpath(lib_path, root)
    for d in sorted(glob.glob(os.path.join(root, "nvidia_cuda_cupti*-*.dist-info"))):
        try:
            with open(os.path.join(d, "RECORD")) as fh:
                if any(line.split(",", 1)[0] == rel for line in fh):
                    return os.path.basename(d)[: -len(".dist-info")].split("-", 1)[1]
        except OSError:
            continue
    return ""


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


class CuptiSource(Source):
    backend = "cupti"

    def __init__(
        self,
        cupti: Any = None,
        *,
        events: Any = None,
        registry: Optional[GraphRegistry] = None,
        window_launches: int = 16,
        window_duration_ms: float = 20.0,
        interval_s: float = 10.0,
        first_window_s: float = 1.0,
        capture_max_duration_ms: float = 2000.0,
        buffer_size_bytes: int = 1 << 20,  # small buffers: cupti-python hands each over in one GIL hold
        max_buffers: int = 32,
        max_window_records: int = 2_000_000,
        drain_ms: float = 10.0,
        max_drain_ms: float = 250.0,
        observer: str = "events",  # "events" | "off"
        max_timed_launches: int = 256,
        blocked_retry_s: float = 30.0,
        poll_s: float = 0.05,
        keep_raw: bool = False,
        close: str = "drain_first",  # "drain_first" | "disable_first": see _window
    ) -> None:
        super().__init__()
        self._cupti_arg = cupti
        self.cupti: Any = None
        self._events_arg = events
        self.events: Any = None
        self.registry = registry if registry is not None else REGISTRY
        self.window_launches = int(window_launches)
        self.window_duration_ms = float(window_duration_ms)
        self.interval_s = float(interval_s)
        self.first_window_s = float(first_window_s)
        self.capture_max_duration_ms = float(capture_max_duration_ms)
        self.buffer_size_bytes = int(buffer_size_bytes)
        self.max_buffers = int(max_buffers)
        self.max_window_records = int(max_window_records)
        self.drain_ms = float(drain_ms)
        self.max_drain_ms = float(max_drain_ms)
        self.observer = observer
        self.max_timed_launches = int(max_timed_launches)
        self.blocked_retry_s = float(blocked_retry_s)
        self.poll_s = float(poll_s)
        if close not in ("drain_first", "disable_first"):
            raise ValueError(f"close must be 'drain_first' or 'disable_first', not {close!r}")
        self.close = close
        self.keep_raw = bool(keep_raw)  # diagnostics: keep each window's unfiltered records
        self.last_raw: Optional[dict[str, Any]] = None
        self._lib_info: dict[str, str] = {}
        self._cupti_python: Optional[str] = None

        self._sink: Optional[Sink] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._captures: deque[CaptureRequest] = deque(maxlen=16)
        self._sub = None
        self._handlers: dict[int, Any] = {}
        self._launch_cbids: tuple[int, ...] = ()
        self._launch_cb_on = False
        self._collector_logged_s = -1e9

        # window state, written by callbacks (host threads) and the collector
        self._in_window = False
        self._closing = False  # window full: launches no longer join it, tracing drains
        self._phase: Optional[str] = None  # None | "ref" | "win": which launches are timed
        self._launches: list[tuple[int, int, int, int]] = []  # corr, exec, launch_ns, stream handle
        self._inflight: set[int] = set()  # window launches whose API call has not returned yet
        self._launch_count = 0
        self._launch_cap = 1 << 30  # launches a phase takes; more are left out in the callback itself
        self._timed: list[tuple[str, int, int, int, int]] = []  # phase, exec, ctx, ev0, ev1
        self._open_ev: dict[int, tuple[str, int, int, int, int]] = {}  # corr -> phase, exec, ctx, stream, ev0
        self._free_events: dict[int, list[int]] = {}  # ctx -> free events
        self._n_events = 0
        self._stream_ids: dict[tuple[int, int], int] = {}

        # records, written by the buffer-completed callback
        self._rec_lock = threading.Lock()
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._n_records = 0
        self._discarded = 0
        self._names: dict[str, int] = {}
        self._outstanding = 0
        self._outstanding_at_open = 0
        self._ingest_s = 0.0
        self._ingest_records = 0

        self.stats: dict[str, float] = {
            "windows": 0,
            "records": 0,
            "dropped": 0,
            "discarded": 0,
            "ingest_records_per_s": 0.0,
            "last_window_ms": 0.0,
            "last_flush_ms": 0.0,
        }
        self.last_window: Optional[Window] = None
        self.taps: list[Sink] = []  # extra window consumers (benchmarks, record mode); errors counted

    # ================================================================== protocol
    def info(self) -> dict[str, str]:
        if self._cupti_python is None:
            try:
                from importlib.metadata import version

                self._cupti_python = version("cupti-python")
            except Exception:
                self._cupti_python = ""  # not installed (tests with a fake), or metadata unreadable
        out = {"backend": self.backend, "observer": self.observer}
        if self._cupti_python:
            out["cupti_python"] = self._cupti_python
        out.update(self._lib_info)  # set once CUPTI is loaded
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
        if self._sub is not None:  # the thread did not get to it in time
            self._teardown()
        self.set_state("stopped")

    def request_capture(self, request: CaptureRequest) -> None:
        # Refuse (HTTP 429) rather than let the bounded deque silently drop the oldest request.
        if len(self._captures) >= (self._captures.maxlen or 1 << 30):
            raise RuntimeError("too many pending captures")
        self._captures.append(request)
        self._wake.set()

    @property
    def in_window(self) -> bool:
        """True while kernel tracing is on (benchmarks use it to split their own timings)."""
        return self._in_window

    # ================================================================== collector thread
    def _run(self) -> None:
        next_window = time.monotonic() + self.first_window_s
        while not self._stop.is_set():
            try:
                if self._sub is None:
                    if not self._setup():
                        self._stop.wait(self.blocked_retry_s)
                        continue
                    next_window = max(next_window, time.monotonic() + self.first_window_s)
                self._sync_launch_cb()
                now = time.monotonic()
                if self._captures or now >= next_window:
                    req = self._captures.popleft() if self._captures else None
                    self._window(req)
                    next_window = time.monotonic() + self.interval_s
                    continue
                self._wake.wait(min(self.poll_s, max(0.0, next_window - now)))
                self._wake.clear()
            except Exception:
                self.count_error("collector")
                now = time.monotonic()
                if now - self._collector_logged_s > 60.0:  # a persistent fault: one traceback a minute, not a second
                    self._collector_logged_s = now
                    log.exception("graphmon collector error")
                self._stop.wait(1.0)
        self._teardown()

    def _setup(self) -> bool:
        """Subscribe and register; False (state 'blocked') when another subscriber holds CUPTI."""
        try:
            if self.cupti is None:
                self.cupti = self._cupti_arg if self._cupti_arg is not None else _load_cupti()
            if self.events is None and self.observer == "events":
                try:
                    self.events = self._events_arg if self._events_arg is not None else CudaEvents()
                except Exception:
                    self.count_error("events_init")
                    self.observer = "off"
            c = self.cupti
            self.registry.graph_exec_id = c.get_graph_exec_id
            self._handlers = self._make_handlers()
            try:
                self._sub = c.subscribe(self._api_cb, None)
            except Exception as e:
                self.set_state("blocked", f"cupti subscribe failed (another profiler?): {e}")
                return False
            try:
                D = c.CallbackDomain.DRIVER_API
                for cbid in self._handlers:
                    if cbid not in self._launch_cbids:
                        c.enable_callback(1, self._sub, D, cbid)
                c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            except Exception as e:
                self._teardown()
                self.set_state("blocked", f"cupti setup failed: {e}")
                return False
            if self._cupti_arg is None:
                self._lib_info = library_info()  # which libcupti won the load (collector_info)
            self.set_state("running")
            return True
        except Exception as e:
            self.count_error("setup")
            self.set_state("error", f"cupti unavailable: {e}")
            return False

    def _teardown(self) -> None:
        c, sub = self.cupti, self._sub
        if sub is None:
            return
        if self._in_window:
            self._end_window_tracing()
        self._phase = None
        try:
            c.unsubscribe(sub)  # lets torch.profiler (Kineto) subscribe afterwards
        except Exception:
            self.count_error("unsubscribe")
        self._sub = None
        self._launch_cb_on = False
        self._release_events()

    def _make_handlers(self) -> dict[int, Any]:
        c = self.cupti
        ids = c.DriverApiTraceCbid
        h: dict[int, Any] = {}

        def add(name, fn):
            cbid = getattr(ids, name, None)
            if cbid is not None:
                h[int(cbid)] = (name, fn)

        for name in ("cuGraphLaunch", "cuGraphLaunch_ptsz"):
            add(name, self._on_launch)
        self._launch_cbids = tuple(k for k, (n, _) in h.items() if n.startswith("cuGraphLaunch"))
        for name in ("cuGraphUpload", "cuGraphUpload_ptsz"):
            add(name, self._on_upload)
        for name in (
            "cuGraphInstantiate",
            "cuGraphInstantiate_v2",
            "cuGraphInstantiateWithFlags",
            "cuGraphInstantiateWithParams",
            "cuGraphInstantiateWithParams_ptsz",
        ):
            add(name, self._on_instantiate)
        add("cuGraphExecDestroy", self._on_destroy)
        return h

    def _set_launch_cb(self, on: bool) -> None:
        if on == self._launch_cb_on or self._sub is None:
            return
        c = self.cupti
        for cbid in self._launch_cbids:
            c.enable_callback(1 if on else 0, self._sub, c.CallbackDomain.DRIVER_API, cbid)
        self._launch_cb_on = on

    def _sync_launch_cb(self) -> None:
        # pending_first_launch is raised before the instantiate callback enables launches, so
        # this never switches them off under an exec whose first launch is still to come.
        self._set_launch_cb(self._phase is not None or self.registry.pending_first_launch > 0)

    # ------------------------------------------------------------------ one window
    def _window(self, req: Optional[CaptureRequest]) -> None:
        c = self.cupti
        n_target = self.window_launches
        dur_ms = self.window_duration_ms
        if req is not None:
            n_target = req.replays if req.replays else 1 << 30
            dur_ms = min(req.duration_ms or self.capture_max_duration_ms, self.capture_max_duration_ms)
        timing = self.observer == "events" and self.events is not None
        self._launch_cap = n_target

        # reference phase: the same launches timed with events, tracing off
        if timing:
            self._timed = []
            self._phase = "ref"
            self._set_launch_cb(True)
            self._launch_count = 0
            self._wait_phase(n_target, dur_ms)
            if self._stop.is_set():
                self._phase = None
                return

        self._phase = None  # while switching phases a launch is neither timed nor kept
        with self._rec_lock:
            self._parts, self._n_records, self._discarded, self._names = [], 0, 0, {}
        self._launches = []
        self._inflight = set()
        self._set_launch_cb(True)
        started = wall_time()
        t0 = time.perf_counter()
        # Buffers this window may hold: counted from here. A buffer CUPTI asked for and gave back
        # with no completion call (nothing to deliver) would otherwise count for ever, and once
        # max_buffers of them had leaked every window closed at once with no record (issue 12).
        self._outstanding_at_open = self._outstanding
        c.activity_enable(c.ActivityKind.CONCURRENT_KERNEL)
        self._launch_count = 0
        self._in_window = True  # after enabling: every launch the window takes is traced
        self._phase = "win" if timing else "untimed"
        self._wait_phase(n_target, dur_ms)
        # Kernels of launches already made may still be queued on the GPU: keep tracing a little
        # (launches from now on are left out of the window) so that their replays complete.
        self._closing = True
        if self.close == "disable_first":
            # Stop tracing new launches now; the window's queued kernels were instrumented at
            # launch and finish on their own: wait for them, then flush.
            self._disable_tracing()
            if not self._stop.is_set():
                self._drain()
            flush_ms = self._flush()
        else:
            if not self._stop.is_set():
                self._drain()
            flush_ms = self._end_window_tracing()
        self._closing = False
        ended = wall_time()
        self._phase = None
        window_ms = (time.perf_counter() - t0) * 1e3

        dropped = self._dropped()
        slowdown = self._slowdown() if timing else None
        trace = self._build_trace(req)
        self.stats["windows"] += 1
        self.stats["records"] += len(trace)
        self.stats["dropped"] += dropped
        self.stats["discarded"] += self._discarded
        self.stats["last_window_ms"] = window_ms
        self.stats["last_flush_ms"] = flush_ms
        if self._ingest_s > 0:
            self.stats["ingest_records_per_s"] = self._ingest_records / self._ingest_s
        w = Window(
            trace=trace,
            started_s=started,
            ended_s=ended,
            dropped=dropped + self._discarded,
            observer_slowdown=slowdown,
            capture_id=req.id if req is not None else None,
        )
        self.last_window = w
        self._sync_launch_cb()
        for tap in list(self.taps):
            try:
                tap(w)
            except Exception:
                self.count_error("tap")
        if self._sink is not None:
            try:
                self._sink(w)
            except Exception:
                self.count_error("sink")

    def _wait_phase(self, n_target: int, dur_ms: float) -> None:
        deadline = time.perf_counter() + dur_ms / 1e3
        step = min(0.002, dur_ms / 1e3 / 4)
        while not self._stop.is_set():
            if self._launch_count >= n_target or time.perf_counter() >= deadline:
                return
            if self._phase == "win" or self._phase == "untimed":
                if self._outstanding - self._outstanding_at_open >= self.max_buffers:
                    self.count_error("buffers_full")  # close early: bounded memory
                    return
            time.sleep(step)

    def _drain(self) -> None:
        """Keep tracing until the window's launches have run on the GPU, then flush.

        A serving loop can run tens of ms ahead of the GPU; a forced flush before its kernels ran
        would return them with zero timestamps (seen on the H200 with a 290 ms deep queue). With
        event timing on, wait for the end event of the window's last timed launch (bounded by
        ``max_drain_ms``); otherwise wait the fixed ``drain_ms``.
        """
        query = getattr(self.events, "query", None)
        deadline = time.perf_counter() + max(self.drain_ms, self.max_drain_ms) / 1e3
        # A window launch whose API call has not returned has no end event yet (cuGraphLaunch
        # blocks while the GPU's queue is full: the host is far ahead). Wait for it, within the
        # same bound: else the drain would stop one launch early and cut that replay (seen once
        # in 8 windows on the H200 with the host ~70 ms ahead).
        while self._inflight and time.perf_counter() < deadline and not self._stop.is_set():
            time.sleep(0.0002)
        last = next((t for t in reversed(self._timed) if t[0] == "win"), None)
        if query is None or last is None:
            if self.drain_ms > 0:
                time.sleep(self.drain_ms / 1e3)
            return
        _, _, ctx, _, e1 = last
        while not self._stop.is_set():
            try:
                done = query(ctx, e1)
            except Exception:
                self.count_error("drain_query")
                done = None
            if done is not False:  # ran, or cannot tell: stop waiting
                break
            if time.perf_counter() >= deadline:
                self.count_error("drain_timeout")  # what is still queued comes back incomplete
                break
            time.sleep(0.001)

    def _end_window_tracing(self) -> float:
        t0 = time.perf_counter()
        self._disable_tracing()
        self._flush()
        return (time.perf_counter() - t0) * 1e3

    def _disable_tracing(self) -> None:
        c = self.cupti
        try:
            c.activity_disable(c.ActivityKind.CONCURRENT_KERNEL)
        except Exception:
            self.count_error("activity_disable")
        self._in_window = False

    def _flush(self) -> float:
        """Hand every buffer to _buffer_completed now; returns the ms it took (ingest included)."""
        c = self.cupti
        t0 = time.perf_counter()
        try:
            c.activity_flush_all(1)
        except Exception:
            self.count_error("flush")
        return (time.perf_counter() - t0) * 1e3

    def _dropped(self) -> int:
        n = ctypes.c_size_t(0)
        try:
            self.cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        except Exception:
            self.count_error("dropped_query")
            return 0
        return int(n.value)

    # ------------------------------------------------------------------ trace building
    def _build_trace(self, req: Optional[CaptureRequest]) -> Trace:
        with self._rec_lock:
            parts, names = self._parts, self._names
            self._parts = []
        # part layout: start, end, stream, device, graph_id, graph_node_id, correlation, name
        dtypes = (np.int64, np.int64, np.int64, np.int32, np.int64, np.int64, np.int64, np.int32)
        start, end, stream, device, gid, gnode, corr, name_id = (
            np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, t) for i, t in enumerate(dtypes)
        )

        self.registry.resolve_ids()
        infos = self.registry.infos()
        seen_ids = set(np.unique(gid).tolist())
        launches = self._launches
        self._launches = []
        exec_gid = {}
        for _, h, _, _ in launches:
            if h not in exec_gid:
                g = self.registry.get(h)
                exec_gid[h] = g.graph_id if g is not None else -1
        seen_ids.update(exec_gid.values())
        graphs = [g for g in infos if g.graph_id in seen_ids]
        gindex = {g.graph_id: i for i, g in enumerate(graphs)}
        lc = {
            "correlation_id": np.array([l[0] for l in launches], np.int64),
            "graph": np.array([gindex.get(exec_gid[l[1]], -1) for l in launches], np.int32),
            "launch_ns": np.array([l[2] for l in launches], np.int64),
            "stream": np.array([self._stream_id_of(l[3]) for l in launches], np.int64),
        }
        meta = {"source": "cupti", "capture_id": req.id if req is not None else None}
        if self.keep_raw:
            self.last_raw = {
                "start_ns": start, "end_ns": end, "stream": stream, "device": device, "graph_id": gid,
                "graph_node_id": gnode, "correlation_id": corr, "name_id": name_id,
                "launch_correlation_id": lc["correlation_id"], "launch_graph_id": np.array(
                    [exec_gid[l[1]] for l in launches], np.int64), "launch_ns": lc["launch_ns"],
            }
        keep, invalid = complete_replays(gid, corr, lc["correlation_id"], valid=(start > 0) & (end >= start))
        if not keep.all():
            start, end, stream, device, gid, gnode, corr, name_id = (
                a[keep] for a in (start, end, stream, device, gid, gnode, corr, name_id)
            )
        return Trace.build(
            start_ns=start,
            end_ns=end,
            stream=stream,
            device=device,
            graph_id=gid,
            graph_node_id=gnode,
            correlation_id=corr,
            name_id=name_id,
            names=sorted(names, key=names.get),
            launches=lc,
            graphs=graphs,
            invalid=invalid,
            meta=meta,
        )

    def _stream_id_of(self, key) -> int:
        return self._stream_ids.get(key, -1) if isinstance(key, tuple) else int(key)

    # ------------------------------------------------------------------ observer effect
    def _slowdown(self) -> Optional[float]:
        ev = self.events
        timed, self._timed = self._timed, []
        per: dict[int, dict[str, list[float]]] = {}
        for phase, h, ctx, e0, e1 in timed:
            try:
                ms = ev.elapsed_ms(ctx, e0, e1)
            except Exception:
                ms = None
                self.count_error("event_elapsed")
            self._free_events.setdefault(ctx, []).extend((e0, e1))
            if ms is not None and ms > 0:
                per.setdefault(h, {"ref": [], "win": []})[phase].append(ms)
        return slowdown_ratio(per)

    def _release_events(self) -> None:
        ev = self.events
        for ctx, evs in self._free_events.items():
            for e in evs:
                try:
                    ev.destroy(e)
                except Exception:
                    pass
        self._free_events = {}
        self._n_events = 0

    def _get_event(self, ctx: int) -> int:
        free = self._free_events.get(ctx)
        if free:
            return free.pop()
        if self._n_events >= 2 * self.max_timed_launches + 8:
            return 0
        e = self.events.create()
        self._n_events += 1
        return e

    # ================================================================== callbacks (host threads)
    def _api_cb(self, userdata, domain, cbid, cbdata) -> None:
        try:
            h = self._handlers.get(cbid)
            if h is not None:
                h[1](h[0], cbdata)
        except Exception:
            self.count_error("callback")

    def _on_launch(self, name: str, cbdata) -> None:
        c = self.cupti
        enter = cbdata.callback_site == c.ApiCallbackSite.API_ENTER
        corr = cbdata.correlation_id
        if enter:
            if name == "cuGraphLaunch":
                p = c.CuGraphLaunchParams.from_ptr(cbdata.function_params, readonly=True)
                h = int(p.h_graph)  # named h_graph, holds the exec
            else:
                p = c.CuGraphLaunchPtszParams.from_ptr(cbdata.function_params, readonly=True)
                h = int(p.h_graph_exec)
            stream = int(p.h_stream or 0)
            ctx = int(cbdata.context or 0)
            key = (ctx, stream)
            if key not in self._stream_ids:
                self._stream_ids[key] = self._cupti_stream_id(ctx, stream)
            self.registry.on_launch(h, self._stream_ids[key])
            phase = self._phase
            if self._closing or phase is None or self._launch_count >= self._launch_cap:
                return  # the collector polls: without the cap a launch or two slips into a full window
            if phase != "ref":
                if not self._in_window:
                    return
                self._inflight.add(corr)  # the window takes this launch: counted = kept
                self._launches.append((corr, h, c.get_timestamp(), key))
            self._launch_count += 1
            if phase in ("ref", "win") and len(self._timed) + len(self._open_ev) < self.max_timed_launches:
                self._time_enter(phase, corr, h, ctx, stream)
            return
        try:
            if corr in self._open_ev:
                phase, h, ctx, stream, e0 = self._open_ev.pop(corr)
                e1 = self._get_event(ctx)
                if e1 and self.events.record(e1, stream):
                    self._timed.append((phase, h, ctx, e0, e1))
                else:
                    self._free_events.setdefault(ctx, []).append(e0)
                    if e1:
                        self._free_events[ctx].append(e1)
        finally:
            self._inflight.discard(corr)  # after its end event is in _timed: the drain waits on it

    def _time_enter(self, phase: str, corr: int, h: int, ctx: int, stream: int) -> None:
        if stream not in _LEGACY_STREAMS and self.events.is_capturing(stream):
            return
        e0 = self._get_event(ctx)
        if not e0:
            return
        if self.events.record(e0, stream):
            self._open_ev[corr] = (phase, h, ctx, stream, e0)
        else:
            self._free_events.setdefault(ctx, []).append(e0)

    def _cupti_stream_id(self, ctx: int, stream: int) -> int:
        try:
            return int(self.cupti.get_stream_id_ex(ctx, stream, 0))
        except Exception:
            self.count_error("stream_id")
            return -1

    def _on_upload(self, name: str, cbdata) -> None:
        c = self.cupti
        if cbdata.callback_site != c.ApiCallbackSite.API_ENTER:
            return
        if name == "cuGraphUpload":
            p = c.CuGraphUploadParams.from_ptr(cbdata.function_params, readonly=True)
            h = int(p.h_graph)
        else:
            p = c.CuGraphUploadPtszParams.from_ptr(cbdata.function_params, readonly=True)
            h = int(p.h_graph_exec)
        ctx = int(cbdata.context or 0)
        self.registry.on_upload(h, self._cupti_stream_id(ctx, int(p.h_stream or 0)))

    def _on_instantiate(self, name: str, cbdata) -> None:
        c = self.cupti
        if cbdata.callback_site != c.ApiCallbackSite.API_EXIT:
            return
        rv = int(cbdata.function_return_value or 0)  # a pointer to the CUresult, not the value
        if rv and ctypes.c_int.from_address(rv).value != 0:
            return  # instantiation failed: no exec
        flags, upload_stream = 0, -1
        ctx = int(cbdata.context or 0)
        if name in ("cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"):
            cls = c.CuGraphInstantiateWithParamsParams if name.endswith("Params") else c.CuGraphInstantiateWithParamsPtszParams
            p = cls.from_ptr(cbdata.function_params, readonly=True)
            ip = int(p.instantiate_params or 0)
            if ip:
                flags = ctypes.c_uint64.from_address(ip + _IP_FLAGS).value
                us = ctypes.c_void_p.from_address(ip + _IP_UPLOAD_STREAM).value or 0
                upload_stream = self._cupti_stream_id(ctx, int(us))
        elif name == "cuGraphInstantiateWithFlags":
            p = c.CuGraphInstantiateWithFlagsParams.from_ptr(cbdata.function_params, readonly=True)
            flags = int(p.flags_)
        elif name == "cuGraphInstantiate_v2":
            p = c.CuGraphInstantiateV2Params.from_ptr(cbdata.function_params, readonly=True)
        else:
            p = c.CuGraphInstantiateParams.from_ptr(cbdata.function_params, readonly=True)
        ph = int(p.ph_graph_exec or 0)
        if not ph:
            return
        h = ctypes.c_uint64.from_address(ph).value
        try:
            gid = int(c.get_graph_exec_id(h))
        except Exception:
            gid = -1
        self.registry.on_instantiate(h, flags=flags, upload_stream=upload_stream, graph_id=gid)
        if not self._launch_cb_on:
            try:  # catch this exec's first launch even if it comes before the collector wakes
                self._set_launch_cb(True)
            except Exception:
                self.count_error("launch_cb_enable")

    def _on_destroy(self, name: str, cbdata) -> None:
        c = self.cupti
        if cbdata.callback_site != c.ApiCallbackSite.API_ENTER:
            return
        p = c.CuGraphExecDestroyParams.from_ptr(cbdata.function_params, readonly=True)
        self.registry.on_destroy(int(p.h_graph_exec))

    # ------------------------------------------------------------------ activity buffers
    def _buffer_requested(self):
        self._outstanding += 1
        return self.buffer_size_bytes, 0

    def _buffer_completed(self, activities) -> None:
        try:
            t0 = time.perf_counter()
            self._outstanding = max(0, self._outstanding - 1)
            if not activities:
                return
            self._ingest_objects(activities, t0)
        except Exception:
            self.count_error("buffer_completed")

    def _keep_part(self, part: tuple[np.ndarray, ...]) -> None:
        n = len(part[0])
        room = self.max_window_records - self._n_records
        if n > room:
            self._discarded += n - max(room, 0)
            part = tuple(a[: max(room, 0)] for a in part)
            n = len(part[0])
            if not n:
                return
        with self._rec_lock:
            self._parts.append(part)
            self._n_records += n
        self._ingest_records += n

    def _ingest_objects(self, activities, t0: float) -> None:
        """Record objects -> columns, in chunks that let the host's threads run in between.

        cupti-python 13.4 hands every record over as its own object holding a copy of the record
        (on the H200 their pointers were not back to back), so there is no zero-copy view of
        CUPTI's buffer through it: this reads 8 fields per record (~1.2-1.7 M records/s there).
        Faster would be to register buffer callbacks with libcupti itself and view each buffer
        as an array of cupti-python's ``activity_kernel13_dtype``."""
        kind = self.cupti.ActivityKind.CONCURRENT_KERNEL
        acts = [a for a in activities if a.kind == kind]
        names = self._names
        for i in range(0, len(acts), INGEST_CHUNK):
            if i:
                # Let the host's threads take the GIL between chunks: the serving loop
                # must not wait for our whole buffer to be converted.
                self._ingest_s += time.perf_counter() - t0
                time.sleep(0)
                t0 = time.perf_counter()
            ch = acts[i : i + INGEST_CHUNK]
            # one attrgetter call per record (tuples) beats one generator pass per field (~1.25x)
            rows = np.array(list(map(_INT_FIELDS, ch)), np.int64).reshape(-1, 7)
            ids = np.fromiter((names.setdefault(a.name, len(names)) for a in ch), np.int32, len(ch))
            self._keep_part((rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3].astype(np.int32), rows[:, 4], rows[:, 5],
                             rows[:, 6], ids))
        self._ingest_s += time.perf_counter() - t0


_INT_FIELDS = operator.attrgetter("start", "end", "stream_id", "device_id", "graph_id", "graph_node_id", "correlation_id")

INGEST_CHUNK = 1024  # records converted per GIL hold in the buffer-completed callback

# Window edges cut replays: kernels of a launch made before tracing was enabled, and kernels of
# the launch still running when it was disabled, are missing. Such replays are excluded and counted.
INVALID_BEFORE_WINDOW = "launched_outside_window"
INVALID_PARTIAL_REPLAY = "partial_replay"
INVALID_NO_CORRELATION = "no_correlation"
INVALID_OVERFULL_REPLAY = "overfull_replay"


def complete_replays(graph_id: np.ndarray, corr: np.ndarray, launch_corr: np.ndarray, valid=None):
    """Mask of kernels to keep + counts of excluded ones by reason. Graph kernels are kept when
    their launch was seen inside the window and their replay has the graph's usual kernel count
    in the window (the most common count among its replays). Kernels that are not ``valid``
    (e.g. zero timestamps: launched but not run before tracing stopped) do not count towards a
    replay's kernels; they are left for Trace.build to exclude under their reason.

    Why the most common count and not the largest: on the H200, with a loop running far ahead of
    the GPU, one correlation id once carried ~10 launches' kernels (9,924 on 19 streams); taking
    the largest count as "complete" then dropped every real replay. Correlation id 0 means "not
    correlated" in CUPTI and never identifies a launch."""
    n = len(corr)
    keep = np.ones(n, dtype=bool)
    invalid: dict[str, int] = {}
    g = graph_id > 0
    if not g.any():
        return keep, invalid
    nocorr = g & (corr == 0)
    if nocorr.any():
        invalid[INVALID_NO_CORRELATION] = int(nocorr.sum())
        keep &= ~nocorr
    launch_corr = launch_corr[launch_corr != 0]
    before = keep & g & ~np.isin(corr, launch_corr)  # launched before the window opened or after it closed
    if before.any():
        invalid[INVALID_BEFORE_WINDOW] = int(before.sum())
        keep &= ~before
    sel = np.flatnonzero(keep & g & (True if valid is None else valid))
    if len(sel):
        u, inv, cnt = np.unique(corr[sel], return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        gid_of = np.zeros(len(u), np.int64)
        gid_of[inv] = graph_id[sel]
        usual = {}
        for gi in np.unique(gid_of).tolist():
            c = cnt[gid_of == gi]
            vals, freq = np.unique(c, return_counts=True)
            # most common count; ties go to the larger count (a complete replay beats a cut one)
            usual[gi] = int(vals[np.flatnonzero(freq == freq.max())[-1]])
        want = np.array([usual[gi] for gi in gid_of.tolist()])
        for reason, bad in ((INVALID_PARTIAL_REPLAY, cnt < want), (INVALID_OVERFULL_REPLAY, cnt > want)):
            drop = bad[inv]
            if drop.any():
                invalid[reason] = int(drop.sum())
                keep[sel[drop]] = False
    return keep, invalid


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
