"""CuptiSource (the window state machine) driven by the fake CUPTI (tests/fake_cupti.py) on the CPU."""

import os
import threading
import time

import numpy as np
import pytest

from graphmon.model.window import CaptureRequest
from graphmon.settings import CuptiSettings
from graphmon.sources.cupti.collector import CuptiSource
from graphmon.sources.cupti.registry import INSTANTIATE_FLAG_UPLOAD, GraphRegistry

from helpers import DATA, wait_until
from fake_cupti import KERNEL10_BYTES, FakeCupti, FakeEvents, Kernel, Workload, decode_like

MAIN, SIDE = 7, 8

def make(fake=None, **kw):
    fake = fake or FakeCupti()
    windows = []
    # the fake GPU runs a launch at once (no queue to drain)
    opts = dict(window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005, drain_ms=0,
                max_traced_share=1.0)
    opts.update(kw)
    src = CuptiSource(cupti=fake, settings=CuptiSettings(**opts), events=FakeEvents(fake), registry=GraphRegistry())
    return fake, src, windows


wait_for = wait_until  # tests/helpers.py


def open_window(fake, src, h, stream=MAIN, timeout_s=5.0):
    """Windows open on graph launches: launch until the traced window is open (the launches
    before it are the one that opens it and its reference phase)."""
    t0 = time.monotonic()
    while not src.in_window:
        assert time.monotonic() - t0 < timeout_s, "no window opened"
        fake.launch(h, stream)
        time.sleep(0.001)


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
    # subscribed first: a graph instantiated before it is 'unknown' (seen once in a loaded CI run)
    assert wait_for(lambda: src.health().state == "running")
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
    assert len(t.graphs) == 1 and t.graphs[0].upload_mode == "uploaded" and t.graphs[0].key == "cap1"
    assert np.all(t.graph == 0)
    # launches after the 6th, traced until the collector closed the window, are excluded as such
    assert set(t.invalid) <= {"launched_outside_window"} and windows[1].dropped == 0
    assert src.stats["ingest_records_per_s"] > 0
    # the phase log splits each window's decode CPU: gathered per buffer, then columns + name ids at the end
    ph = [p for p in src.phase_log if "sink" in p]
    assert len(ph) >= 2
    for p in ph:
        gather, columns = p["decode_parts_cpu_ms"]
        assert gather > 0 and columns > 0 and abs(gather + columns - p["decode_cpu_ms"]) < 1e-6
        assert 0 < p["hold_cpu_max_ms"] < p["cpu"]["sink"] * 1e3  # a piece of the window's work, not all of it
        assert p["traced_ms"] > 0
    # each window says how long it traced (graphmon_kernel_tracing_seconds_total sums it)
    assert all(w.traced_s > 0 for w in windows) and {round(w.traced_s * 1e3, 6) for w in windows[1:]} <= \
        {round(p["traced_ms"], 6) for p in ph}


def test_the_tracing_budget_spaces_windows_by_their_traced_time():
    s = CuptiSettings(interval_s=2.0, max_traced_share=0.001, max_interval_s=60.0)
    src = CuptiSource(cupti=FakeCupti(), settings=s, registry=GraphRegistry())
    assert src.next_interval_s(0.0) == 2.0  # nothing traced: interval_s
    assert src.next_interval_s(0.01) == pytest.approx(10.0)  # 10 ms traced, 0.1% share: 10 s later
    assert src.next_interval_s(5.0) == 60.0  # a long capture: max_interval_s at most
    assert src.stats["interval_s"] == 60.0
    # live: windows of ~50 ms traced with a 25% share come ~200 ms apart, not interval_s (10 ms)
    fake, src, windows = make(interval_s=0.01, max_traced_share=0.25, window_launches=10**6, window_duration_ms=50,
                              observer="off")
    src.start(windows.append)
    h = fake.instantiate(decode_like(2))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 3, timeout=10)
    src.stop()
    traced = [p["traced_ms"] / 1e3 for p in src.phase_log if "sink" in p]
    starts = [p["window_t0"] for p in src.phase_log if "sink" in p]
    for t, a, b in zip(traced, starts, starts[1:]):
        assert 0.04 <= t < 0.2  # from the window's first launch to its 50 ms end
        assert b - a >= t / 0.25  # the wait after a window (its processing comes on top)


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
    assert not fake.launch_callbacks
    h = fake.instantiate(decode_like(1))
    assert fake.launch_callbacks  # switched on by the instantiate callback itself
    fake.launch(h, MAIN)
    assert src.registry.get(h).upload_mode == "lazy"
    assert wait_for(lambda: not fake.launch_callbacks)  # collector turns it off again
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


def _one_capture(fake, src, windows, req: CaptureRequest, launches: int):
    """Start ``src``, ask for ``req``, launch a 1-kernel graph ``launches`` times once the window
    is open; returns the capture's window (the source stopped)."""
    src.start(windows.append)
    h = fake.instantiate(decode_like(1))
    assert wait_for(lambda: src.health().state == "running")
    src.request_capture(req)
    open_window(fake, src, h)
    for _ in range(launches):
        fake.launch(h, MAIN)
    assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    return windows[0]


def test_launch_slots_sized_for_sampling_and_grown_for_a_capture():
    # attach() no longer preallocates max_window_launches (65,536) slots per ring: ~3 ms of GIL
    # per ring, the attach's stall on an HF decode. A capture that needs more grows the window's
    # ring on the collector thread and still takes every launch it asked for.
    fake, src, windows = make(window_launches=4, interval_s=30.0, first_window_s=30.0)
    assert src._win.capacity == src._ref.capacity == 64
    w = _one_capture(fake, src, windows, CaptureRequest(id="big", replays=300, duration_ms=2000), 400)
    assert w.capture_id == "big" and w.trace.n_launches == 300
    assert len(np.unique(w.trace.correlation_id)) == 300
    assert src._win.capacity == 300 and src._ref.capacity == 64  # the reference phase stays window-sized
    assert "window_launches_capped" not in src.health().errors


def test_capture_beyond_max_window_launches_is_capped_and_counted():
    fake, src, windows = make(window_launches=4, max_window_launches=100, interval_s=30.0, first_window_s=30.0)
    w = _one_capture(fake, src, windows, CaptureRequest(id="huge", replays=500, duration_ms=2000), 200)
    assert w.trace.n_launches == 100 and src._win.capacity == 100
    assert src.health().errors.get("window_launches_capped") == 1


@pytest.mark.parametrize("slowdown", [1.25, 1.0])
def test_observer_slowdown_measured_with_events(slowdown):
    fake, src, windows = make(FakeCupti(trace_slowdown=slowdown))
    src.start(windows.append)
    h = fake.instantiate(decode_like(3))
    with Workload(fake, [h]):
        assert wait_for(lambda: sum(bool(w.trace.n_launches) for w in windows) >= 2)
    src.stop()
    busy = [w for w in windows if w.trace.n_launches]  # (not an idle window: the host starved on a loaded CPU)
    assert busy[1].observer_slowdown == pytest.approx(slowdown, rel=0.01)


def test_no_events_on_capturing_streams():
    fake = FakeCupti(trace_slowdown=1.2)
    windows = []
    opts = CuptiSettings(window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005,
                         max_traced_share=1.0,
                         drain_ms=0)
    src = CuptiSource(cupti=fake, settings=opts, events=FakeEvents(fake, capturing={MAIN}), registry=GraphRegistry())
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
    assert fake.handler is None and not fake.activity and not fake.launch_callbacks
    assert src.health().state == "stopped"
    # CUPTI is free again: another tool (torch.profiler) can subscribe
    fake.subscribe(object())


def test_callback_errors_are_counted_not_raised():
    fake, src, windows = make(interval_s=30.0, first_window_s=30.0)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")

    def boom(h):
        raise RuntimeError("no such exec")

    h = fake.instantiate(decode_like(1))
    fake.graph_exec_id = boom
    src.registry.graph_exec_id = boom
    fake.instantiate(decode_like(1))  # graph id lookup fails inside the callback: tolerated
    src.registry.on_upload = lambda *a: 1 / 0
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
        assert wait_for(lambda: any(w.trace.n_launches for w in windows))
    src.stop()
    w = next(w for w in windows if w.trace.n_launches)  # (not an idle window: the host starved on a loaded CPU)
    assert len(w.trace) <= 20
    assert w.dropped >= 5 + 1
    assert src.stats["discarded"] >= 1


def test_unavailable_cupti_is_an_error_state_not_a_crash():
    class Broken:
        def __getattr__(self, k):
            raise ImportError("libcupti.so not found")

    src = CuptiSource(cupti=Broken(), settings=CuptiSettings(blocked_retry_s=0.05), registry=GraphRegistry())
    src.start(lambda w: None)
    assert wait_for(lambda: src.health().state == "error")
    src.stop()
    assert src.health().state == "stopped"


def test_window_edge_replays_are_excluded_and_counted():
    fake, src, windows = make(observer="off")
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    open_window(fake, src, h)
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


@pytest.mark.parametrize("boundary", ["launch", "collector"])
def test_launches_while_draining_are_left_out_and_counted(boundary):
    # boundary "collector" (drain_first) traces the launches made while the window drains:
    # excluded and counted; "launch" switches tracing off when the window's last launch returns
    fake, src, windows = make(observer="off", drain_ms=50, window_launches=3, boundary=boundary)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    with Workload(fake, [h], period_s=0.002):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    t = windows[0].trace
    assert t.n_launches == 3
    assert len(np.unique(t.correlation_id)) == t.n_launches  # only the window's own launches
    if boundary == "collector":
        assert t.invalid.get("launched_outside_window", 0) >= 3  # ~25 launches in 50 ms of drain
    else:
        assert not t.invalid and len(t) == 3 * 3


@pytest.mark.parametrize("name,modes", [
    ("h200-graphmon-decode.graphmon.npz", {"uploaded", "lazy", "instantiate_upload"}),
    ("h200-graphmon-chain.graphmon.npz", {"uploaded", "lazy"}),
])
def test_h200_recordings_hold_complete_labelled_replays(name, modes):
    """Recorded on the H200 by graphmon itself (bench/overhead/gpu_overhead.py, record mode)."""
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
    opts = CuptiSettings(window_launches=3, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005,
                         max_traced_share=1.0,
                         drain_ms=0, max_drain_ms=max_drain_ms)
    src = CuptiSource(cupti=fake, settings=opts, events=ev, registry=GraphRegistry())
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
        fake, src, windows = make(window_launches=4, drain_ms=40, close=close, observer="off",  # no events: fixed drain
                                  boundary="collector")
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
        CuptiSettings(close="later")


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


def test_keep_raw_keeps_the_unfiltered_window():
    # diagnostics (bench/diag/cupti_sessions.py): the records before window-edge filtering
    fake, src, windows = make(observer="off", keep_raw=True)
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    open_window(fake, src, h)
    with fake.lock:
        fake._run_graph(h, 424242)  # traced, but no launch row: excluded from the trace
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    raw, t = src.last_raw, windows[0].trace
    assert 424242 in raw["correlation_id"].tolist() and 424242 not in t.correlation_id.tolist()
    assert len(raw["start_ns"]) == len(t) + t.invalid_total
    assert set(raw["launch_correlation_id"].tolist()) == set(t.launches["correlation_id"].tolist())
    # and what the close knew: CUPTI's own ends (before the late-stamp rule), its clock when the
    # launches had run (0: no events), the records a forced flush brought (-1: not forced)
    assert np.array_equal(raw["cupti_end_ns"], raw["end_ns"]) and raw["ran_ns"].tolist() == [0]
    assert raw["forced_flush_records"].tolist() == [-1]


def test_flush_is_not_forced_and_retries_until_the_windows_launches_are_in():
    # a non-forced flush holds back a buffer with an incomplete record: the collector flushes
    # again (not forced) until every window launch has records, and forces only at max_drain_ms
    fake, src, windows = make(observer="off", window_launches=3)
    real_flush, held = fake.flush, [2]

    def withholding_flush(forced=False):
        if not forced and held[0] > 0:
            held[0] -= 1
            fake.flushes.append(False)
            return  # a queued kernel still running: CUPTI keeps the buffer
        return real_flush(forced)

    fake.flush = withholding_flush
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    flushes = list(fake.flushes)  # the window's (stop() then forces one: the teardown's)
    src.stop()
    assert flushes[:3] == [False, False, False] and True not in flushes
    assert windows[0].trace.n_launches == 3 and len(windows[0].trace) == 3 * 3
    assert "flush_forced" not in src.health().errors


def test_flush_forced_only_after_max_drain(monkeypatch):
    fake, src, windows = make(observer="off", window_launches=2, max_drain_ms=30)
    real_flush = fake.flush
    fake.flush = lambda forced=False: real_flush(forced) if forced else fake.flushes.append(False)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    assert True in fake.flushes and src.health().errors["flush_forced"] >= 1
    assert len(windows[0].trace) == 2 * 3  # the forced flush brought the records back


def test_the_fake_drives_kernel10_buffers_through_the_collector():
    fake, src, windows = make(FakeCupti(record_bytes=KERNEL10_BYTES, buffer_bytes=4096))
    src.start(windows.append)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 2)
    src.stop()
    t = windows[1].trace
    assert per_stream_gaps(t) == {MAIN: {400, 416}, SIDE: {600}}
    assert src.stats["record_bytes"] == KERNEL10_BYTES
    assert src.stats["decode_fallback_buffers"] == 0  # the size measured from the first records: no walk
    assert sorted(set(t.names)) == sorted({k.name for k in decode_like(4, MAIN, SIDE)})


def test_launch_callbacks_keep_nothing_per_launch():
    # issue 13: the launch callback writes preallocated slots; the old one appended a tuple per
    # launch (and added to a set). Net memory graphmon's CUPTI code keeps after 2,000 in-window
    # launches must not grow with the launches.
    import tracemalloc

    fake, src, windows = make(observer="off", window_launches=100_000, window_duration_ms=60_000, interval_s=60.0)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    open_window(fake, src, h)
    for _ in range(50):
        fake.launch(h, MAIN)  # warm: stream ids, registry entry
    # the callbacks' code; records.py (decoding buffers, on the collector thread) is left out
    only_ours = [tracemalloc.Filter(True, "*graphmon/sources/cupti/*"), tracemalloc.Filter(False, "*/records.py")]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(only_ours)
        for _ in range(2000):
            fake.launch(h, MAIN)
        after = tracemalloc.take_snapshot().filter_traces(only_ours)
    finally:
        tracemalloc.stop()
        src.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert grown < 2000 * 8, grown  # under one pointer per launch: slots are reused, not appended
    assert windows and windows[0].trace.n_launches == 2051  # and the launch that opened it (open_window's last)


def _burst_after_window_opens(fake, src, h, n, gpu_replay_s, backlog_s=0.0):
    """The GPU test's shape: launch unqueued until the traced window is open, then queue a
    backlog and ``n`` launches back to back (the GPU runs them later)."""
    def host():
        while not src.in_window:
            fake.launch(h, MAIN)
            time.sleep(0.001)
        fake.gpu_replay_s = gpu_replay_s
        if backlog_s:
            fake.backlog(backlog_s)
        for _ in range(n):
            fake.launch(h, MAIN)

    t = threading.Thread(target=host, daemon=True)
    t.start()
    return t


def test_duration_capture_keeps_every_queued_launch_complete():
    # H200 failure (tests/gpu test_records_match_cuda_events): CaptureRequest(duration_ms=600)
    # with 40 replays queued behind a backlog. The window must hold all 40, each complete; a
    # duration-bound capture is not "capped" (not an error); the reference phase stays
    # window-sized (it took the capture's whole duration before).
    fake, src, windows = make(window_launches=16, window_duration_ms=20, interval_s=60.0, first_window_s=60.0)
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    t0 = time.time()  # Window.started_s is wall time
    src.request_capture(CaptureRequest(id="ev", duration_ms=300))
    host = _burst_after_window_opens(fake, src, h, 40, gpu_replay_s=0.002, backlog_s=0.02)
    assert wait_for(lambda: len(windows) >= 1, 10)
    host.join(5)
    src.stop()
    w = windows[0]
    assert w.started_s - t0 < 0.25  # the reference phase did not take the capture's 300 ms
    assert src._ref.n <= 16
    t = w.trace
    u, cnt = np.unique(t.correlation_id, return_counts=True)
    assert len(u) >= 40 and set(cnt.tolist()) == {6}  # every queued replay, complete
    assert t.invalid_total == 0
    errors = src.health().errors
    assert "window_launches_capped" not in errors and "flush_forced" not in errors and "drain_timeout" not in errors


@pytest.mark.parametrize("boundary", ["collector", "launch"])
def test_records_held_back_by_a_later_launch_still_come_back(boundary):
    # CUPTI's non-forced flush holds back a buffer while any record in it is incomplete. With
    # boundary "collector" the window's last replay shares a buffer with a launch traced while
    # the window drained (still queued on the GPU): the non-forced flush returned the window's
    # earlier buffers, so every window launch "had records", and the last replay came back cut.
    # Once the events say every window launch ran, a forced flush returns it whole. With
    # boundary "launch" no later launch is traced: nothing holds the window's records back.
    fake = FakeCupti(buffer_bytes=5 * 248)  # 5 records a buffer: the 4th replay straddles two
    fake, src, windows = make(fake, window_launches=4, interval_s=60.0, first_window_s=0.0, boundary=boundary)
    h = fake.instantiate(decode_like(1))  # 3 kernels a replay
    src.start(windows.append)
    host = _burst_after_window_opens(fake, src, h, 8, gpu_replay_s=0.03)
    assert wait_for(lambda: len(windows) >= 1, 10)
    host.join(5)
    src.stop()
    t = windows[0].trace
    u, cnt = np.unique(t.correlation_id, return_counts=True)
    assert t.n_launches == 4 and len(u) == 4 and set(cnt.tolist()) == {3}, (t.n_launches, cnt, t.invalid)
    assert "partial_replay" not in t.invalid and "flush_forced" not in src.health().errors  # forced by design, not counted
    if boundary == "collector":
        assert t.invalid.get("launched_outside_window", 0) > 0 and fake.flushes[-1] is True
    else:
        assert not t.invalid


def test_the_fakes_non_forced_flush_holds_back_incomplete_buffers():
    fake = FakeCupti()
    h = fake.instantiate(decode_like(1))
    fake.activity = True
    fake.gpu_replay_s = 0.05
    fake.launch(h, MAIN)
    fake.flush(forced=False)
    assert fake.completed_buffer() is None  # its kernels have not run yet
    fake.flush(forced=True)
    buf = fake.completed_buffer()
    assert buf is not None and not buf.data[24:32].any()  # returned, end time zero
    fake.release_buffer(buf.key)
    fake.launch(h, MAIN)
    time.sleep(0.12)
    fake.flush(forced=False)
    assert fake.completed_buffer() is not None  # complete (not full): returned


def test_between_windows_the_collector_sleeps_until_the_next_one():
    # Each wake-up takes the host's GIL (the HF decode loop needs it nearly all the time): with
    # nothing to switch off the thread sleeps to its next window; it polls only while the
    # launch callbacks are on, woken by the instantiate callback that turned them on.
    fake, src, windows = make(interval_s=30.0, first_window_s=30.0)
    wakes = []
    sync = src._sync_launch_cb
    src._sync_launch_cb = lambda: wakes.append(time.monotonic()) or sync()
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    time.sleep(0.3)  # poll_s is 5 ms: a polling thread would have woken ~60 times
    assert len(wakes) <= 2
    h = fake.instantiate(decode_like(1))
    assert wait_for(lambda: len(wakes) >= 5, 2)  # woken at once, and polling while it waits for a first launch
    fake.launch(h, MAIN)
    assert wait_for(lambda: not fake.launch_callbacks)
    time.sleep(0.05)
    n = len(wakes)
    time.sleep(0.3)
    assert len(wakes) - n <= 1 and not windows
    src.stop()


def test_a_graph_never_launched_does_not_keep_launch_callbacks_on():
    # A graph exec instantiated and never launched (a warm-up graph, a batch size not served)
    # kept a Python callback on every graph launch of the process forever (H200 decode_server:
    # +150 us a step outside windows). It waits first_launch_wait_s at most.
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, first_launch_wait_s=0.1)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    unused = fake.instantiate(decode_like(1))
    h = fake.instantiate(decode_like(1))
    fake.launch(h, MAIN)
    assert src.registry.get(h).upload_mode == "lazy"
    assert fake.launch_callbacks  # still waiting for `unused`'s first launch
    assert wait_for(lambda: not fake.launch_callbacks, 3)
    calls = fake.launch_callback_calls
    for _ in range(100):
        fake.launch(h, MAIN)
    fake.launch(unused, MAIN)
    assert fake.launch_callback_calls == calls  # no Python on the launch path outside windows
    src.stop()
    assert src.registry.get(unused).upload_mode == "unknown"  # its first launch was not seen
    assert src.registry.pending_first_launch == 0


def test_records_sink_ships_unfiltered_records_and_never_assembles(monkeypatch):
    """A light collector's source (records_sink) hands its sink WindowRecords as decoded and
    spends nothing on window-edge filtering or Trace.build: the agent does that. Assembling the
    records later gives the window the in-process path gives (same filtering)."""
    import graphmon.sources.cupti.closing as closing
    from graphmon.model.edges import assemble
    from graphmon.model.window import WindowRecords

    def no(*a, **k):
        raise AssertionError("assembled in the serving process")

    monkeypatch.setattr(closing, "assemble", no)
    fake, src, got = make()
    src.records_sink = True
    src.start(got.append)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    fake.upload(h, MAIN)
    with Workload(fake, [h]):
        assert wait_for(lambda: sum(bool(r.n_launches) for r in got) >= 2)
    src.stop()
    assert all(isinstance(r, WindowRecords) for r in got) and src.health().errors.get("assemble", 0) == 0
    r = [r for r in got if r.n_launches][1]  # (not an idle window: the host starved on a loaded CPU)
    assert len(r) == 12 * 6 and r.n_launches == 6  # unfiltered (tracing went off when the 6th launch returned)
    w = assemble(r)
    assert len(w.trace) == 12 * 6 and per_stream_gaps(w.trace) == {MAIN: {400, 416}, SIDE: {600}}
    assert set(w.trace.invalid) <= {"launched_outside_window"}
    assert len(r) - len(w.trace) == sum(w.trace.invalid.values())  # every record kept or counted


def test_taps_get_what_the_sink_gets():
    """A records sink's taps get WindowRecords too: a tap never makes the serving process assemble."""
    from graphmon.model.window import Window, WindowRecords

    for records_sink, kind in ((True, WindowRecords), (False, Window)):
        fake, src, got = make()
        taps = []
        src.records_sink = records_sink
        src.taps.append(taps.append)
        src.start(got.append)
        h = fake.instantiate(decode_like(2, MAIN, SIDE))
        with Workload(fake, [h]):
            assert wait_for(lambda: len(taps) >= 1 and len(got) >= 1)
        src.stop()
        assert isinstance(got[0], kind) and isinstance(taps[0], kind)
        assert (src.last_window is None) == records_sink


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_the_collector_yields_the_gil_in_proportion_to_its_work(share):
    # after a piece of C s of CPU the collector sleeps C*(1-share)/share (at least yield_ms), so a
    # host thread that needs the GIL all the time keeps at least 1-share of it
    src = CuptiSource(FakeCupti(), settings=CuptiSettings(gil_share=share, yield_ms=0.1))
    src.pacer.start_piece()
    c0 = time.thread_time()
    while time.thread_time() - c0 < 0.006:
        pass
    t0 = time.perf_counter()
    src.pacer.pause()
    slept_s = time.perf_counter() - t0
    if share == 1.0:
        assert slept_s < 0.012  # only yield_ms (0.1 ms) and the scheduler (a loaded 2-core CI), not 18 ms
    else:
        assert 0.017 <= slept_s < 0.045  # 3 x 6 ms
    # the next piece is measured from the end of this sleep, not from the piece before
    assert time.thread_time() - src.pacer.piece_cpu0 < 0.002


def test_a_later_attach_keeps_the_kernel_names_read_by_an_earlier_one():
    # one libcupti per process: its name pointers outlive a detach (the real adapter's names_key)
    fake = FakeCupti()
    fake.names_key = ("test", id(fake))
    reads = []
    read = fake.kernel_name
    fake.kernel_name = lambda p: reads.append(p) or read(p)
    h = fake.instantiate(decode_like(3))
    for attach in range(2):
        _, src, windows = make(fake, window_launches=2, interval_s=60.0)
        src.start(windows.append)
        with Workload(fake, [h]):
            assert wait_for(lambda: len(windows) >= 1, timeout=10)
        src.stop()
        names = sorted(set(windows[0].trace.names))
        if attach == 0:
            first_reads = len(reads)
            assert first_reads >= len(names) > 0
        else:
            assert len(reads) == first_reads and sorted(set(windows[0].trace.names)) == names  # nothing read again


# ---------------------------------------------------------------------- idle: unsubscribed between windows
def fake_torch(monkeypatch):
    """A `torch` with torch.cuda.graphs.CUDAGraph whose capture instantiates on the fake GPU at
    capture_end (as cudaStreamEndCapture + instantiate do), for capture_hook to wrap."""
    import sys
    import types

    class CUDAGraph:
        fake = None

        def capture_begin(self, *a, **kw):
            self.began = True

        def capture_end(self):
            self.exec_handle = self.fake.instantiate(decode_like(1))

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(graphs=types.SimpleNamespace(CUDAGraph=CUDAGraph), CUDAGraph=CUDAGraph)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return CUDAGraph


def test_between_windows_it_unsubscribes_once_no_graph_was_made_for_a_while():
    # Attached and subscribed, graphmon cost an HF decode on the H200 +0.46% between windows;
    # unsubscribed the process's CUDA calls are as without it. Windows subscribe again.
    fake, src, windows = make(interval_s=0.3, first_window_s=0.0, idle_unsubscribe_s=0.1)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    with Workload(fake, [h]) as w:
        assert wait_for(lambda: src.stats["idle_unsubscribes"] >= 1, 3)
        assert fake.handler is None and not src.subscribed
        assert src.health().state == "running" and src.health().up  # idle is not down
        # no buffer of graphmon's left with CUPTI: another tool may register its callbacks meanwhile
        assert fake.flushes[-1] is True and len(fake.free) == len(fake._buffers)
        n = len(windows)
        assert wait_for(lambda: len(windows) >= n + 2, 5)  # windows go on: subscribed again for each
        assert wait_for(lambda: fake.handler is None, 2)  # and unsubscribed after it
    src.stop()
    assert not w.errors and not src.health().errors
    assert src.stats["resubscribes"] >= 2 and src.stats["idle_unsubscribes"] >= 3
    last = windows[-1].trace
    assert len(last) == len(fake.execs[h]) * 6 and per_stream_gaps(last) == {MAIN: {400, 416}, SIDE: {600}}  # whole, exact windows
    assert last.graphs[0].upload_mode == "lazy"  # seen at its instantiation, before the first idle


def test_graphs_being_made_keep_it_subscribed():
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, idle_unsubscribe_s=0.25, first_launch_wait_s=0.0)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    t_end = time.monotonic() + 0.6
    try:
        while time.monotonic() < t_end:  # an instantiation every 0.1 s: never quiet for 0.25 s
            fake.launch(fake.instantiate(decode_like(1)), MAIN)
            t_last = time.monotonic()
            assert fake.handler is not None
            time.sleep(0.1)
        assert wait_for(lambda: fake.handler is None, 2)
        assert time.monotonic() - t_last >= 0.25  # the quiet period counts from the last instantiation
    finally:
        src.stop()


def test_idle_unsubscribe_0_stays_subscribed():
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, idle_unsubscribe_s=0.0)
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    time.sleep(0.3)
    assert fake.handler is not None and src.stats["idle_unsubscribes"] == 0
    src.stop()


def test_a_torch_capture_subscribes_again_before_its_graph_is_instantiated(monkeypatch):
    CUDAGraph = fake_torch(monkeypatch)
    own = CUDAGraph.__dict__["capture_begin"]
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, idle_unsubscribe_s=0.05)
    CUDAGraph.fake = fake
    src.start(windows.append)
    assert wait_for(lambda: src.stats["idle_unsubscribes"] >= 1, 3) and fake.handler is None
    assert CUDAGraph.__dict__["capture_begin"] is not own  # wrapped while idle
    g = CUDAGraph()
    g.capture_begin()
    assert g.began and fake.handler is not None  # subscribed on the capturing thread, before capture_end
    g.capture_end()
    info = src.registry.get(g.exec_handle)
    assert info is not None and info.upload_mode == "unknown"  # known since created: its first launch decides
    fake.launch(g.exec_handle, MAIN)
    assert src.registry.get(g.exec_handle).upload_mode == "lazy"
    assert wait_for(lambda: src.stats["idle_unsubscribes"] >= 2, 3) and fake.handler is None  # quiet again: idle
    src.stop()
    assert CUDAGraph.__dict__["capture_begin"] is own  # torch's method back
    assert src.stats["resubscribes"] == 1 and not src.health().errors


def test_a_window_due_while_another_profiler_holds_cupti_waits_blocked_then_resumes():
    fake, src, windows = make(interval_s=0.3, first_window_s=0.0, idle_unsubscribe_s=0.05, blocked_retry_s=0.05)
    src.start(windows.append)
    h = fake.instantiate(decode_like(1))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1 and src.stats["idle_unsubscribes"] >= 1 and fake.handler is None, 3)
        fake.blocked_by_other = True  # torch.profiler took CUPTI while graphmon was idle
        assert wait_for(lambda: src.health().state == "blocked", 3)
        n = len(windows)
        fake.blocked_by_other = False
        assert wait_for(lambda: len(windows) > n, 3) and src.health().state in ("running",)
    src.stop()


def test_stop_while_idle_is_clean(monkeypatch):
    CUDAGraph = fake_torch(monkeypatch)
    own = CUDAGraph.__dict__["capture_begin"]
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, idle_unsubscribe_s=0.05)
    src.start(windows.append)
    assert wait_for(lambda: src.stats["idle_unsubscribes"] >= 1, 3) and fake.handler is None
    src.stop()
    assert src.health().state == "stopped" and not src.health().errors
    assert CUDAGraph.__dict__["capture_begin"] is own
    g = CUDAGraph()
    g.capture_begin()  # after stop: nothing subscribes
    assert fake.handler is None
    fake.subscribe(object())  # CUPTI is free for another tool


def test_a_first_launch_pending_past_the_quiet_period_is_polled_not_spun():
    # The quiet period is over but a graph's first launch is pending (it decides the upload
    # mode): the collector stays subscribed and polls every poll_s; it must not spin on a past
    # deadline (each wake takes the host's GIL).
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0, idle_unsubscribe_s=0.05, first_launch_wait_s=5.0,
                              poll_s=0.05)
    wakes = []
    sync = src._sync_launch_cb
    src._sync_launch_cb = lambda: wakes.append(time.monotonic()) or sync()
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(1))  # not launched yet
    time.sleep(0.4)
    n = len(wakes)
    time.sleep(0.5)
    assert len(wakes) - n <= 15 and fake.handler is not None  # ~10 polls in 0.5 s, still subscribed
    fake.launch(h, MAIN)
    assert wait_for(lambda: fake.handler is None, 3)  # launched: nothing pending, quiet long past: idle
    src.stop()
    assert src.registry.get(h).upload_mode == "lazy"


# ---------------------------------------------------------------------- windows open on graph launches
class Enables:
    """Counts kernel-tracing enables of a fake (set_kernel_activity(True) calls)."""

    def __init__(self, fake):
        self.n = 0
        orig = fake.set_kernel_activity

        def spy(on):
            self.n += bool(on)
            orig(on)

        fake.set_kernel_activity = spy


def test_a_due_window_traces_nothing_until_a_graph_launch_opens_it():
    # armed: the launch callback on, tracing off, for as long as no graph launches
    fake, src, windows = make(interval_s=60.0, first_window_s=0.0)
    enables = Enables(fake)
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    assert wait_for(lambda: src.armed)
    time.sleep(0.3)  # (a timer-opened window would have traced ~200 ms here and closed)
    assert src.armed and enables.n == 0 and not windows
    assert fake.launch_callbacks  # on while armed: the next launch opens the window
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    w = windows[0]
    assert enables.n == 1 and w.trace.n_launches == 6 and len(w.trace) == 6 * 6
    assert src.phase_log[0]["armed_ms"] >= 300


def test_a_warm_up_pause_does_not_push_the_first_data_out():
    # issue 29: a window that opened on its timer in a compile pause traced nothing, and the
    # tracing budget then put the next one max_interval_s away: no data for the steady decode
    # that followed. Now the window waits for launches: the first one after the pause is traced.
    fake, src, windows = make(interval_s=0.2, first_window_s=0.0, window_duration_ms=50, max_traced_share=0.001,
                              max_interval_s=30.0)
    h = fake.instantiate(decode_like(2))
    src.start(windows.append)
    for _ in range(3):  # warm-up replays, then a compile pause longer than a window
        fake.launch(h, MAIN)
    time.sleep(0.5)
    t0 = time.monotonic()
    with Workload(fake, [h]):
        assert wait_for(lambda: any(len(w.trace) for w in windows), 3)
    src.stop()
    assert time.monotonic() - t0 < 2.0
    # a window the warm-up launches opened traced nothing in the pause: counted, no budget spent
    assert src.stats["empty_no_launches"] <= 1


def test_a_window_that_traced_no_launch_spends_no_budget_and_is_counted():
    # the launches stop right after the reference phase: the traced window gets none
    fake, src, windows = make(window_launches=2, window_duration_ms=60, interval_s=0.05, first_window_s=0.0,
                              max_traced_share=1e-6, max_interval_s=3600.0)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    assert wait_for(lambda: src.armed)
    fake.launch(h, MAIN)
    fake.launch(h, MAIN)  # the reference phase's two launches; then nothing
    assert wait_for(lambda: len(windows) >= 1)
    assert windows[0].trace.n_launches == 0 and windows[0].traced_s == 0  # tracing waits for the window's launch
    assert src.stats["empty_no_launches"] == 1
    assert src.stats["interval_s"] == 0.05  # not 60 ms / 1e-6: the next window arms after interval_s
    assert wait_for(lambda: src.armed)  # ... and it does
    src.stop()


def test_a_window_with_launches_and_no_record_spends_no_budget():
    fake, src, windows = make(interval_s=0.05, first_window_s=0.0, max_traced_share=1e-9, max_interval_s=3600.0,
                              window_launches=3)
    empty = fake.instantiate([])  # a graph whose replays trace no kernel record
    full = fake.instantiate(decode_like(1))
    src.start(windows.append)
    with Workload(fake, [empty]):
        assert wait_for(lambda: len(windows) >= 1)
        assert windows[0].trace.n_launches == 3 and len(windows[0].trace) == 0
        assert src.stats["interval_s"] == 0.05 and src.stats["empty_no_launches"] == 0
    with Workload(fake, [full]):
        assert wait_for(lambda: any(len(w.trace) for w in windows))
    src.stop()
    assert src.stats["interval_s"] == 3600.0  # a window with records spends the budget


def test_no_graph_launch_gives_idle_windows_and_never_traces():
    fake, src, windows = make(interval_s=0.1, first_window_s=0.0)
    enables = Enables(fake)
    src.start(windows.append)
    assert wait_for(lambda: len(windows) >= 3, 3)
    assert enables.n == 0 and src.stats["idle_windows"] >= 3
    assert all(w.trace.n_launches == 0 and len(w.trace) == 0 and w.traced_s == 0 for w in windows)
    assert wait_for(lambda: src.armed and fake.launch_callbacks)  # armed again at once: a launch opens a window
    src.stop()


def test_a_capture_opens_on_a_launch_or_answers_empty_after_its_duration():
    fake, src, windows = make(interval_s=60.0, first_window_s=60.0)
    enables = Enables(fake)
    h = fake.instantiate(decode_like(1))
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    src.request_capture(CaptureRequest(id="none", replays=3, duration_ms=150))
    assert wait_for(lambda: len(windows) >= 1)
    assert windows[0].capture_id == "none" and windows[0].trace.n_launches == 0 and enables.n == 0
    src.request_capture(CaptureRequest(id="some", replays=3, duration_ms=2000))
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 2)
    src.stop()
    assert windows[1].capture_id == "some" and windows[1].trace.n_launches == 3 and enables.n == 1


# ---------------------------------------------------------------------- the forced flush's made-up ends
def test_a_drained_window_is_flushed_without_forcing_so_its_ends_are_real():
    # H200 (bench/results/gpu-check-10): with the CUDA events saying every window launch had run,
    # one forced flush returned the last replay's records with the flush's time as end (CUPTI had
    # not taken them in): span = busy = 1.5-2.1 ms against 0.14 ms. The fake does the same.
    fake = FakeCupti()
    fake.forced_flush_stamps_ns = 2_000_000
    fake, src, windows = make(fake)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    src.start(windows.append)
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 2)
    src.stop()
    for w in windows:
        assert per_stream_gaps(w.trace) == {MAIN: {400, 416}, SIDE: {600}}
        assert w.trace.n_launches == 6 and len(w.trace) == 12 * 6
    assert src.stats["late_stamped_records"] == 0 and "flush_forced" not in src.health().errors


def test_ends_stamped_after_the_launches_ran_are_dropped_and_counted():
    # when only a forced flush brings the window back (max_drain_ms), the ends it made up are
    # told apart by time (after the events said the launches ran): their replays are excluded
    # and counted, never assembled
    from graphmon.analysis.replays import analyze

    fake = FakeCupti()
    fake.forced_flush_stamps_ns = 2_000_000
    real_flush = fake.flush
    fake.flush = lambda forced=False: real_flush(forced) if forced else fake.flushes.append(False)
    fake, src, windows = make(fake, max_drain_ms=30)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    src.start(windows.append)
    with Workload(fake, [h]):
        assert wait_for(lambda: len(windows) >= 1)
    src.stop()
    t = windows[0].trace
    assert src.stats["late_stamped_records"] >= 12 * 6 and True in fake.flushes
    assert len(t) == 0 or (analyze(t).gaps.values >= 0).all()
    assert t.invalid_total >= 12 * 6  # every window kernel counted, none served with a made-up end


def test_the_h200_windows_late_stamps_are_caught_and_nothing_else():
    """Real records (tests/data/h200-hf-late-stamps.npz): in 12 windows the last replay's kernels
    carry times 20-200 us after tracing was switched off, which the CUDA events had said ran
    before it. Checked against the switch-off time (the drain's moment is just before it): the
    rule catches every one of them and no other kernel of a window launch; the assembled windows
    then have no overlap on the stream and no outsized replay."""
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords
    from graphmon.sources.cupti.closing import unknown_late_ends
    from graphmon.sources.cupti.records import KernelColumns

    z = np.load(os.path.join(str(DATA), "h200-hf-late-stamps.npz"))
    caught = []
    for w in range(int(z["windows"])):
        k = {c: z[f"w{w}_{c}"].copy() for c in ("start", "end", "stream", "graph_id", "node", "corr")}
        lc, n = z[f"w{w}_launch_corr"], len(z[f"w{w}_start"])
        cols = KernelColumns(k["start"], k["end"], k["stream"], np.zeros(n, np.int32), k["graph_id"], k["node"],
                             k["corr"], np.zeros(n, np.uint64))
        caught.append(unknown_late_ends(cols, lc, int(z[f"w{w}_off_ns"])))
        m = len(lc)
        rec = WindowRecords(
            kernels={"start_ns": cols.start_ns, "end_ns": cols.end_ns, "stream": cols.stream, "device": cols.device,
                     "graph_id": cols.graph_id, "graph_node_id": cols.graph_node_id,
                     "correlation_id": cols.correlation_id, "name_id": np.full(n, -1, np.int32)},
            launches={"correlation_id": lc, "device": np.zeros(m, np.int32), "graph": np.zeros(m, np.int32),
                      "launch_ns": np.full(m, -1), "stream": np.full(m, 7), "label": np.full(m, -1, np.int32)},
            names=[], graphs=[GraphInfo(key="g5", graph_id=5)], started_s=0.0, ended_s=1.0)
        a = analyze(assemble(rec).trace)
        assert (a.gaps.values >= -1000).all()
        assert a.replays.span_ns.max() <= 1.5 * np.median(a.replays.span_ns)
    # 12 to 62 of the 62 kernels of each of the 12 last replays; none anywhere else
    assert sum(c > 0 for c in caught) == 12 and sum(caught) == 503


def test_a_capture_asked_while_armed_is_answered_after_its_own_duration():
    # armed for a sampling window (interval_s 60: it would wait that long) when a capture comes:
    # with no launch, the capture's 150 ms bound the wait, not the sampling window's
    fake, src, windows = make(interval_s=60.0, first_window_s=0.0)
    src.start(windows.append)
    assert wait_for(lambda: src.armed)
    t0 = time.monotonic()
    src.request_capture(CaptureRequest(id="c", replays=3, duration_ms=150))
    assert wait_for(lambda: len(windows) >= 1, 3)
    src.stop()
    assert windows[0].capture_id == "c" and windows[0].trace.n_launches == 0 and time.monotonic() - t0 < 2.0


# ---------------------------------------------------------------------- window edges on launch boundaries (issue 37)
@pytest.mark.parametrize("boundary", ["launch", "collector"])
def test_a_window_cut_mid_replay_is_excluded_and_launch_boundaries_cut_none(boundary):
    # Each launch takes 20 ms kernel by kernel, tracing read at each kernel (the fake's model of
    # a switch landing inside cuGraphLaunch). boundary "collector" (disable_first) switches
    # tracing off from its thread once the window has its launches: inside the last one, which
    # comes back cut; it is excluded and counted, never a gap across its missing kernels.
    # boundary "launch" switches in the callbacks: every window launch whole, nothing else traced.
    fake = FakeCupti()
    fake.launch_spread_s = 0.02
    fake, src, windows = make(fake, window_launches=3, observer="off", drain_ms=0, boundary=boundary,
                              close="disable_first", window_duration_ms=2000)
    h = fake.instantiate(decode_like(4, MAIN, SIDE))
    src.start(windows.append)
    traced = lambda: [w for w in windows if w.trace.n_launches]  # (an idle window: the host starved by a loaded CPU)
    with Workload(fake, [h], period_s=0.0):
        assert wait_for(lambda: len(traced()) >= 3, 10)
    src.stop()
    windows = traced()
    for w in windows[:3]:
        t = w.trace
        assert per_stream_gaps(t) in ({MAIN: {400, 416}, SIDE: {600}}, {})  # never a gap across a missing kernel
        if boundary == "launch":
            assert not t.invalid and t.n_launches == 3 and len(t) == 3 * 12
    cut = sum(w.trace.invalid.get("partial_replay", 0) for w in windows[:3])
    if boundary == "collector":
        assert cut > 0  # the window's last replay, cut where the collector switched tracing off


def test_a_window_traces_exactly_its_launches_with_the_host_far_ahead():
    # Default settings (4 launches a window, events on) with the host up to ~40 ms ahead of the
    # GPU (a backlog, then a launch every ~2 ms, as long as the GPU takes for one): tracing goes
    # on in the window's first launch and off when its last one returns, so no launch outside
    # the window is traced and the drain waits for the window's own launches only.
    fake = FakeCupti()
    traced = []
    run = fake._run_graph
    fake._run_graph = lambda h, corr: (traced.append((corr, fake.activity)), run(h, corr))
    fake, src, windows = make(fake, window_launches=4, interval_s=0.05)
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    fake.gpu_replay_s = 0.002
    fake.backlog(0.04)
    busy = lambda: [w for w in windows if w.trace.n_launches]  # (an idle window: the host starved by a loaded CPU)
    with Workload(fake, [h], period_s=0.002):
        assert wait_for(lambda: len(busy()) >= 3, 10)
    src.stop()
    windows = busy()
    on = {c for c, a in traced if a}
    launched = set()
    for w in windows[:3]:
        t = w.trace
        assert not t.invalid and t.n_launches == 4 and len(t) == 4 * 6, dict(t.invalid)
        launched |= set(t.launches["correlation_id"].tolist())
    assert launched <= on and len(on - launched) <= 4  # the traced launches are the windows' (the 4th window's own)
    assert "flush_forced" not in src.health().errors and src.stats["late_stamped_records"] == 0


def test_an_incomplete_record_from_a_forced_flush_is_counted_and_its_replay_excluded():
    # The window's last launches are still queued on the GPU when max_drain_ms runs out: the
    # forced flush returns their records with end 0 (CUPTI's "unknown"). They are counted as
    # incomplete_record (not end_before_start) and no gap is computed from their replays.
    fake = FakeCupti()
    fake, src, windows = make(fake, window_launches=3, max_drain_ms=30, observer="off", drain_ms=0)
    h = fake.instantiate(decode_like(2, MAIN, SIDE))
    src.start(windows.append)
    assert wait_for(lambda: src.health().state == "running")
    fake.gpu_replay_s = 0.2  # each launch runs 200 ms after the one before: the drain cannot wait for them
    host = _burst_after_window_opens(fake, src, h, 3, gpu_replay_s=0.2)
    assert wait_for(lambda: len(windows) >= 1, 10)
    host.join(5)
    src.stop()
    t = windows[0].trace
    assert src.health().errors.get("flush_forced", 0) >= 1
    assert t.invalid.get("incomplete_record", 0) >= 6 and "end_before_start" not in t.invalid, dict(t.invalid)
    assert t.invalid["incomplete_record"] % 6 == 0 and "partial_replay" not in t.invalid  # whole replays unknown
    assert per_stream_gaps(t) in ({MAIN: {400, 416}, SIDE: {600}}, {})
