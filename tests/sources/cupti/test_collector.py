"""CuptiSource driven by a fake cupti (tests/fake_cupti.py) on the CPU."""

import ctypes
import os
import threading
import time

import numpy as np
import pytest

from graphmon.sources.cupti.registry import INSTANTIATE_FLAG_UPLOAD, GraphRegistry
from graphmon.model.window import CaptureRequest
from graphmon.sources.cupti.collector import CuptiSource, slowdown_ratio

from helpers import DATA
from fake_cupti import DriverApiTraceCbid, FakeCupti, FakeEvents, Kernel, decode_like

MAIN, SIDE = 7, 8


class Workload:
    """Replays graphs in a loop from a host thread, like a serving loop."""

    def __init__(self, fake, execs, stream=MAIN, period_s=0.0005):
        self.fake, self.execs, self.stream, self.period_s = fake, execs, stream, period_s
        self.stop = threading.Event()
        self.errors = []
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            while not self.stop.is_set():
                for h in self.execs:
                    self.fake.launch(h, self.stream)
                time.sleep(self.period_s)
        except BaseException as e:  # the host must never see an exception from graphmon
            self.errors.append(e)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.t.join(5)


def make(fake=None, **kw):
    fake = fake or FakeCupti()
    windows = []
    # the fake GPU runs a launch at once (no queue to drain)
    opts = dict(window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005, drain_ms=0)
    opts.update(kw)
    src = CuptiSource(cupti=fake, events=FakeEvents(fake), registry=GraphRegistry(), **opts)
    return fake, src, windows


def wait_for(pred, timeout=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.005)
    return False


def per_stream_gaps(trace):
    gaps = {}
    order = np.lexsort((trace.start_ns, trace.stream, trace.correlation_id))
    s, c = trace.stream[order], trace.correlation_id[order]
    st, en = trace.start_ns[order], trace.end_ns[order]
    same = (s[1:] == s[:-1]) & (c[1:] == c[:-1])
    for sid in np.unique(s):
        m = same & (s[1:] == sid)
        gaps[int(sid)] = set((st[1:] - en[:-1])[m].tolist())
    return gaps


def test_window_records_are_exact_and_linked_to_graphs():
    fake, src, windows = make()
    src.start(windows.append)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    fake.upload(h, MAIN)
    with Workload(fake, [h]) as w:
        assert wait_for(lambda: len(windows) >= 2)
    src.stop()
    assert not w.errors
    t = windows[1].trace
    n_launch = len(np.unique(t.correlation_id))
    assert len(t) == 12 * n_launch and n_launch == 6  # exactly window_launches
    # every kernel of every launch: exact per-stream gaps as simulated
    assert per_stream_gaps(t) == {MAIN: {400, 416}, SIDE: {600}}
    assert t.n_launches == n_launch
    assert set(t.launches["stream"].tolist()) == {MAIN}
    assert np.all(t.launches["launch_ns"] > 0)
    assert len(t.graphs) == 1 and t.graphs[0].upload_mode == "uploaded" and t.graphs[0].key == f"g{fake.exec_ids[h]}"
    assert np.all(t.graph == 0)
    # launches after the 6th, traced until the collector closed the window, are excluded as such
    assert set(t.invalid) <= {"launched_outside_window"} and windows[1].dropped == 0
    assert src.stats["ingest_records_per_s"] > 0


def test_upload_modes_detected():
    fake, src, windows = make(interval_s=0.2)
    pre = fake.instantiate(decode_like(1))  # existed before graphmon attached
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    up = fake.instantiate(decode_like(1))
    fake.upload(up, SIDE)
    lazy = fake.instantiate(decode_like(1))
    inst = fake.instantiate(decode_like(1), flags=INSTANTIATE_FLAG_UPLOAD, upload_stream=SIDE, api="WithParams")
    failed = fake.instantiate(decode_like(1), fail=True)
    with Workload(fake, [pre, up, lazy, inst]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    modes = {g.graph_id: g for g in windows[-1].trace.graphs}
    ids = fake.exec_ids
    assert modes[ids[pre]].upload_mode == "unknown"
    assert modes[ids[up]].upload_mode == "uploaded"
    assert modes[ids[up]].upload_stream_is_launch_stream is False
    assert modes[ids[lazy]].upload_mode == "lazy"
    assert modes[ids[inst]].upload_mode == "instantiate_upload"
    assert modes[ids[inst]].upload_stream == SIDE
    assert failed not in ids and src.registry.get(failed) is None


def test_launch_callback_only_on_while_needed():
    fake, src, windows = make(interval_s=30.0, first_window_s=30.0)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    launch_cb = (1, DriverApiTraceCbid.cuGraphLaunch)
    assert launch_cb not in fake.enabled
    h = fake.instantiate(decode_like(1))
    assert launch_cb in fake.enabled  # switched on by the instantiate callback itself
    fake.launch(h, MAIN)
    assert src.registry.get(h).upload_mode == "lazy"
    assert wait_for(lambda: launch_cb not in fake.enabled)  # collector turns it off again
    calls = fake.callback_calls
    for _ in range(50):
        fake.launch(h, MAIN)
    assert fake.callback_calls == calls  # steady state: no Python callback per launch
    src.stop()


def test_capture_request_tagged_and_bounded_by_replays():
    fake, src, windows = make(interval_s=30.0, first_window_s=30.0)
    src.start(windows.append)
    h = fake.instantiate(decode_like(2))
    with Workload(fake, [h]):
        assert wait_for(lambda: src.health().state == "running")
        src.request_capture(CaptureRequest(id="cap-1", replays=3, duration_ms=2000))
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    w = windows[0]
    assert w.capture_id == "cap-1"
    n = len(np.unique(w.trace.correlation_id))
    assert 3 <= n <= 5  # closes once 3 launches were seen (a launch or two may race the close)
    assert w.ended_s >= w.started_s


@pytest.mark.parametrize("slowdown", [1.25, 1.0])
def test_observer_slowdown_measured_with_events(slowdown):
    fake, src, windows = make(FakeCupti(trace_slowdown=slowdown))
    src.start(windows.append)
    h = fake.instantiate(decode_like(3))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 2)
    src.stop()
    assert windows[1].observer_slowdown == pytest.approx(slowdown, rel=0.01)


def test_no_events_on_capturing_streams():
    fake = FakeCupti(trace_slowdown=1.2)
    windows = []
    src = CuptiSource(cupti=fake, events=FakeEvents(fake, capturing={MAIN}), registry=GraphRegistry(),
                      window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005,
                      drain_ms=0)
    src.start(windows.append)
    h = fake.instantiate(decode_like(1))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    assert windows[0].observer_slowdown is None and len(windows[0].trace) > 0


def test_blocked_by_another_subscriber_then_recovers():
    fake, src, windows = make(blocked_retry_s=0.05)
    fake.blocked_by_other = True
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "blocked")
    assert src.health().up is False and "subscribe" in src.health().reason
    fake.blocked_by_other = False
    assert wait_for(lambda: src.health().state == "running")
    src.stop()


def test_stop_unsubscribes_disables_and_never_finalizes():
    fake, src, windows = make(window_duration_ms=10_000, window_launches=10**6, observer="off")
    src.start(windows.append)
    h = fake.instantiate(decode_like(1))
    with Workload(fake, [h]):
        assert wait_for(lambda: src.in_window)
        t0 = time.monotonic()
        src.stop(timeout_s=5.0)
        assert time.monotonic() - t0 < 2.0
    assert fake.subscriber is None and not fake.activity and not fake.enabled
    assert fake.finalize_calls == 0
    assert src.health().state == "stopped"
    # CUPTI is free again: another tool (torch.profiler) can subscribe
    assert fake.subscribe(lambda *a: None, None)


def test_callback_errors_are_counted_not_raised():
    fake, src, windows = make(interval_s=30.0, first_window_s=30.0)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")

    def boom(h):
        raise RuntimeError("no such exec")

    h = fake.instantiate(decode_like(1))
    fake.get_graph_exec_id = boom
    src.registry.graph_exec_id = boom
    fake.instantiate(decode_like(1))  # graph id lookup fails inside the callback: tolerated
    src._handlers[int(DriverApiTraceCbid.cuGraphUpload)] = ("cuGraphUpload", lambda n, d: 1 / 0)
    fake.upload(h, MAIN)  # must not raise into the "host"
    src.stop()
    assert src.health().errors.get("callback", 0) >= 1


def test_sink_errors_counted_and_source_keeps_going():
    fake, src, _ = make()
    seen = []

    def sink(w):
        seen.append(w)
        raise ValueError("sink bug")

    src.start(sink)
    h = fake.instantiate(decode_like(1))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(seen) >= 3)
    src.stop()
    assert src.health().errors["sink"] >= 3


def test_dropped_and_discarded_records_counted():
    fake, src, windows = make(max_window_records=20)
    fake.dropped = 5
    src.start(windows.append)
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    w = windows[0]
    assert len(w.trace) <= 20
    assert w.dropped >= 5 + 1
    assert src.stats["discarded"] >= 1


def test_unavailable_cupti_is_an_error_state_not_a_crash():
    class Broken:
        def __getattr__(self, k):
            raise ImportError("libcupti.so not found")

    src = CuptiSource(cupti=Broken(), registry=GraphRegistry(), blocked_retry_s=0.05)
    src.start(lambda w: None)
    assert wait_for(lambda: src.health().state == "error")
    src.stop()
    assert src.health().state == "stopped"


def test_slowdown_ratio_weights_and_minimum():
    per = {1: {"ref": [1.0, 1.0, 1.0], "win": [1.2, 1.2, 1.2]}, 2: {"ref": [2.0] * 3, "win": [2.2] * 9}}
    assert slowdown_ratio(per) == pytest.approx((1.2 * 3 + 1.1 * 9) / 12)
    assert slowdown_ratio({1: {"ref": [1.0], "win": [1.0] * 5}}) is None


def test_complete_replays_trims_window_edges():
    from graphmon.sources.cupti.collector import complete_replays

    # graph 5: launch 10 before the window (2 of its kernels traced), 11 complete (3), 12 cut (1);
    # non-graph kernels (graph_id 0) are always kept
    gid = np.array([5, 5, 5, 5, 5, 5, 0, 0])
    corr = np.array([10, 10, 11, 11, 11, 12, 99, 98])
    keep, inv = complete_replays(gid, corr, np.array([11, 12]))
    assert keep.tolist() == [False, False, True, True, True, False, True, True]
    assert inv == {"launched_outside_window": 2, "partial_replay": 1}
    # zero-timestamp kernels (launched, not run before tracing stopped) make a replay partial
    gid, corr = np.full(6, 5), np.array([10, 10, 10, 11, 11, 11])
    keep, inv = complete_replays(gid, corr, np.array([10, 11]), valid=np.array([1, 1, 1, 1, 0, 1], bool))
    assert keep.tolist() == [True, True, True, False, True, False]  # the invalid one: Trace.build's
    assert inv == {"partial_replay": 2}


def test_window_edge_replays_are_excluded_and_counted():
    fake, src, windows = make(observer="off")
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    fake.launch(h, MAIN)
    assert wait_for(lambda: src.in_window)
    # a replay that started before the window: simulate with kernels traced but no launch row
    with fake.lock:
        fake._run_graph(h, 424242)
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    t = windows[0].trace
    assert 424242 not in set(t.correlation_id.tolist())
    # its 6 kernels, plus whole launches the host made after the window was full but before the
    # collector stopped tracing
    out = t.invalid.get("launched_outside_window", 0)
    assert out >= 6 and out % 6 == 0
    assert len(t) % 6 == 0


def test_launches_while_draining_are_left_out_and_counted():
    fake, src, windows = make(observer="off", drain_ms=50, window_launches=3)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    with Workload(fake, [h], period_s=0.002):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    t = windows[0].trace
    assert t.n_launches >= 3
    assert len(np.unique(t.correlation_id)) == t.n_launches  # only the window's own launches
    assert t.invalid.get("launched_outside_window", 0) >= 3  # ~25 launches in 50 ms of drain


@pytest.mark.parametrize("name,modes", [
    ("h200-graphmon-decode.graphmon.npz", {"uploaded", "lazy", "instantiate_upload"}),
    ("h200-graphmon-chain.graphmon.npz", {"uploaded", "lazy"}),
])
def test_h200_recordings_hold_complete_labelled_replays(name, modes):
    """Recorded on the H200 by graphmon itself (bench/gpu_overhead.py, record mode)."""
    import os

    from graphmon.formats.read import read_trace

    t = read_trace(os.path.join(str(DATA), name))
    assert {g.upload_mode for g in t.graphs} == modes
    assert all(g.label and g.batch_size > 0 for g in t.graphs)
    # every kept replay is complete: one kernel count per graph (window edges were trimmed)
    u, inv, cnt = np.unique(t.correlation_id, return_inverse=True, return_counts=True)
    g_of = np.zeros(len(u), np.int64)
    g_of[inv] = t.graph
    for g in np.unique(g_of):
        assert len(set(cnt[g_of == g].tolist())) == 1
    assert (t.graph >= 0).all()
    assert set(u.tolist()) <= set(t.launches["correlation_id"].tolist())
    assert t.meta["windows"] == 4


class QueuedEvents(FakeEvents):
    """The window's last launch is still queued for `pending` queries (a loop ahead of the GPU)."""

    def __init__(self, gpu, pending):
        super().__init__(gpu)
        self.pending, self.queries = pending, 0

    def query(self, ctx, ev):
        self.queries += 1
        return self.queries > self.pending


@pytest.mark.parametrize("pending,max_drain_ms,timed_out", [(20, 2000, False), (10**9, 60, True)])
def test_drain_waits_for_the_windows_last_launch_bounded(pending, max_drain_ms, timed_out):
    fake = FakeCupti()
    ev = QueuedEvents(fake, pending)
    windows = []
    src = CuptiSource(cupti=fake, events=ev, registry=GraphRegistry(), window_launches=3, window_duration_ms=200,
                      interval_s=0.05, first_window_s=0.0, poll_s=0.005, drain_ms=0, max_drain_ms=max_drain_ms)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    t0 = time.monotonic()
    with Workload(fake, [h], period_s=0.002):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    assert ev.queries >= min(pending, 5)
    if timed_out:
        assert src.health().errors.get("drain_timeout", 0) >= 1
        assert time.monotonic() - t0 < 5  # bounded by max_drain_ms, not by the queue
    else:
        assert ev.queries > pending and "drain_timeout" not in src.health().errors
    assert len(windows[0].trace) > 0


def test_complete_replays_uses_the_usual_count_and_ignores_correlation_zero():
    from graphmon.sources.cupti.collector import complete_replays

    # graph 5: four real replays of 3 kernels (corr 1-4) and one correlation carrying 9 kernels
    # (several launches' kernels under one id, as seen on the H200 with a deep queue): the real
    # replays are kept, the overfull one is excluded and counted.
    corr = np.array([1] * 3 + [2] * 3 + [3] * 3 + [4] * 3 + [9] * 9 + [0] * 2)
    gid = np.full(len(corr), 5)
    keep, inv = complete_replays(gid, corr, np.array([0, 1, 2, 3, 4, 9]))
    assert keep.tolist() == [True] * 12 + [False] * 11
    assert inv == {"overfull_replay": 9, "no_correlation": 2}
    # a tie between a complete and a cut replay keeps the complete one
    corr = np.array([1, 1, 1, 2, 2])
    keep, inv = complete_replays(np.full(5, 5), corr, np.array([1, 2]))
    assert keep.tolist() == [True, True, True, False, False] and inv == {"partial_replay": 2}


class _StubLibcuda:
    """Just the driver calls CudaEvents makes; tracks the context stack depth."""

    def __init__(self, query_rc=0, sync_rc=0):
        self.depth, self.query_rc, self.sync_rc = 0, query_rc, sync_rc

    def cuCtxPushCurrent_v2(self, ctx):
        self.depth += 1
        return 0

    def cuCtxPopCurrent_v2(self, out):
        self.depth -= 1
        return 0

    def cuEventQuery(self, ev):
        return self.query_rc

    def cuEventSynchronize(self, ev):
        return self.sync_rc

    def cuEventElapsedTime_v2(self, out, e0, e1):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_float))[0] = 1.5
        return 0


@pytest.mark.parametrize("rc,want", [(0, True), (600, False), (1, None)])
def test_cuda_events_query_and_context_balance(rc, want):
    from graphmon.sources.cupti.collector import CudaEvents

    lib = _StubLibcuda(query_rc=rc)
    assert CudaEvents(lib).query(1, 2) is want and lib.depth == 0
    lib = _StubLibcuda(sync_rc=rc)
    assert CudaEvents(lib).elapsed_ms(1, 2, 3) == (1.5 if rc == 0 else None) and lib.depth == 0


# ---------------------------------------------------------------------- window edges
def test_a_window_takes_exactly_its_launches():
    # the collector polls; the launch callback itself closes a full window to more launches
    fake, src, windows = make(window_launches=5, poll_s=0.05)
    src.start(windows.append)
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    with Workload(fake, [h], period_s=0.0):
        assert wait_for(lambda: len(windows) >= 3)
    src.stop()
    for w in windows[:3]:
        assert w.trace.n_launches == 5 and len(np.unique(w.trace.correlation_id)) == 5


def test_disable_first_stops_tracing_launches_made_while_draining():
    # a fixed 40 ms drain while the host keeps launching: drain_first traces those launches too
    # (excluded as launched outside the window); disable_first stops tracing when the window is
    # full, so only the launches before the collector noticed are traced
    outside = {}
    for close in ("drain_first", "disable_first"):
        fake, src, windows = make(window_launches=4, drain_ms=40, close=close)
        src.start(windows.append)
        h = fake.instantiate(decode_like(2, MAIN, SIDE))
        with Workload(fake, [h], period_s=0.001):
            assert wait_for(lambda: len(windows) >= 3)
        src.stop()
        for w in windows[1:3]:
            assert w.trace.n_launches == 4 and len(w.trace) == 6 * 4
        outside[close] = sum(w.trace.invalid.get("launched_outside_window", 0) for w in windows[1:3])
    assert outside["disable_first"] * 3 < outside["drain_first"], outside


def test_close_mode_is_checked():
    with pytest.raises(ValueError, match="close"):
        CuptiSource(cupti=FakeCupti(), close="later")


# ---------------------------------------------------------------------- which libcupti
def test_library_info_names_the_loaded_libcupti_and_its_wheel(tmp_path):
    from graphmon.sources.cupti.collector import library_info

    site = tmp_path / "site-packages"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcupti.so.13").write_bytes(b"")
    di = site / "nvidia_cuda_cupti-13.4.92.dist-info"
    di.mkdir()
    (di / "RECORD").write_text("nvidia/cu13/lib/libcupti.so.13,sha256=x,1\n")
    other = site / "nvidia_cuda_cupti-13.0.85.dist-info"  # a stale dist-info that does not list it
    other.mkdir()
    (other / "RECORD").write_text("nvidia/cu13/lib/libnvperf_host.so,sha256=x,1\n")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 123 {lib / 'libcupti.so.13'}\n"
        f"7f10-7f20 r--p 00010000 08:01 123 {lib / 'libcupti.so.13'}\n"
        "7f20-7f30 r-xp 00000000 08:01 456 /usr/lib/libc.so.6\n")
    info = library_info(str(maps))
    assert info["cupti_lib"] == str(lib / "libcupti.so.13")
    assert info["cupti_lib_version"] == "13.4.92"
    assert "cupti_libs_loaded" not in info and "cupti_api_version" not in info  # an empty file: no call
    maps.write_text(maps.read_text() + "7f40-7f50 r-xp 00000000 08:01 789 /opt/other/libcupti.so.13\n")
    assert library_info(str(maps))["cupti_libs_loaded"] == "2"  # two copies: said, not hidden
    assert library_info(str(tmp_path / "missing")) == {}


def test_drain_waits_for_a_launch_call_that_blocks():
    # cuGraphLaunch blocks while the GPU's queue is full. The window's last launch must not be
    # cut because its call had not returned when the window closed (seen on the H200).
    fake, src, windows = make(window_launches=1, window_duration_ms=150, drain_ms=0, max_drain_ms=250)
    src.start(windows.append)
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    stop = threading.Event()

    def host():
        while not stop.is_set():
            fake.launch(h, MAIN, block_s=0.04)

    t = threading.Thread(target=host, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: len(windows) >= 3, 10)
    finally:
        stop.set()
        t.join(5)
        src.stop()
    for w in windows[:3]:
        # the window closed while its launch call was still blocked; tracing stayed on for it
        assert w.trace.n_launches == 1, w.trace.n_launches
        assert len(w.trace) == 6 and "partial_replay" not in w.trace.invalid  # the whole replay


def test_complete_replays_on_real_h200_windows():
    """Raw records of six CuptiSource windows on the H200 (bench/cupti_sessions.py: a 16-layer
    decode graph uploaded + lazy, 320 kernels a replay; the host in step with the GPU or ~100 ms
    ahead of it). Every window launch comes back whole under its own correlation id; the
    launches made while the window drained (some with zero timestamps: flushed before they ran)
    are excluded and counted, never merged into a window replay."""
    from graphmon.sources.cupti.collector import complete_replays

    z = np.load(os.path.join(str(DATA), "h200-cupti-windows.npz"))
    for w in range(6):
        g = {k: z[f"w{w}_{k}"] for k in ("start_ns", "end_ns", "graph_id", "graph_node_id", "correlation_id",
                                           "launch_correlation_id")}
        valid = (g["start_ns"] > 0) & (g["end_ns"] >= g["start_ns"])
        keep, inv = complete_replays(g["graph_id"], g["correlation_id"], g["launch_correlation_id"], valid=valid)
        assert set(inv) <= {"launched_outside_window"}, inv
        assert not (keep & ~valid).any()  # every zero-timestamp record was a drain-phase launch
        kept = g["correlation_id"][keep]
        u, cnt = np.unique(kept, return_counts=True)
        assert set(u.tolist()) == set(g["launch_correlation_id"].tolist())  # each window launch, whole
        assert set(cnt.tolist()) == {320}
        # one replay holds each graph node once: no launches merged under one correlation id
        key = np.stack([kept, g["graph_id"][keep], g["graph_node_id"][keep]], 1)
        assert len(np.unique(key, axis=0)) == len(key)
        assert inv.get("launched_outside_window", 0) == int((~np.isin(g["correlation_id"], u)).sum())


def test_keep_raw_keeps_the_unfiltered_window():
    # diagnostics (bench/cupti_sessions.py): the records before window-edge filtering
    fake, src, windows = make(observer="off", keep_raw=True)
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    fake.launch(h, MAIN)
    assert wait_for(lambda: src.in_window)
    with fake.lock:
        fake._run_graph(h, 424242)  # traced, but no launch row: excluded from the trace
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    raw, t = src.last_raw, windows[0].trace
    assert 424242 in raw["correlation_id"].tolist() and 424242 not in t.correlation_id.tolist()
    assert len(raw["start_ns"]) == len(t) + t.invalid_total
    assert set(raw["launch_correlation_id"].tolist()) == set(t.launches["correlation_id"].tolist())
