"""Untraced replay times (sources/cupti/bursts.py): the reference phase's and the bursts' CUDA-event
times in a window's ``untraced`` columns, driven by the fake CUPTI on the CPU.

The fake GPU runs traced replays ``trace_slowdown`` times slower: an untraced row shows the
graph's untraced span (SPAN4, SPAN2), a traced one would show 3x that."""

import time

import numpy as np
import pytest

from graphmon.model.window import CaptureRequest
from graphmon.settings import CuptiSettings
from graphmon.sources.cupti.bursts import UntracedRows, timed_rows
from graphmon.sources.cupti.collector import CuptiSource
from graphmon.sources.cupti.registry import GraphRegistry

from helpers import wait_until
from fake_cupti import FakeCupti, FakeEvents, Workload, decode_like

MAIN = 7
SPAN4, SPAN2 = 35_264, 17_632  # decode_like(4) / (2) on the fake, untraced: main stream 4 (2) x 8816 ns


def make(**kw):
    fake = FakeCupti(trace_slowdown=3.0)
    opts = dict(window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005,
                drain_ms=0, max_traced_share=1.0, untraced_burst_launches=0)
    opts.update(kw)
    src = CuptiSource(cupti=fake, settings=CuptiSettings(**opts), events=FakeEvents(fake), registry=GraphRegistry())
    return fake, src


def logged(src, name, log):
    """Wrap the source's ``name`` method (collector thread) to log its (start, end, name)."""
    inner = getattr(src, name)

    def run(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            log.append((t0, time.perf_counter(), name))

    setattr(src, name, run)


def tracing_switches(fake):
    """Every set_kernel_activity(on) the fake gets, logged with whether a burst held the launches."""
    calls = []
    inner = fake.set_kernel_activity

    def switch(on):
        calls.append(bool(on))
        inner(on)

    fake.set_kernel_activity = switch
    return calls


def graph_rows(w):
    """{(CUPTI graph id, duration_ns)} of a window's untraced rows (graph resolved via its graphs)."""
    u, graphs = w.untraced, w.trace.graphs
    return {(graphs[g].graph_id if g >= 0 else -1, int(ns)) for g, ns in zip(u["graph"].tolist(), u["duration_ns"])}


def test_the_reference_phase_ships_its_times_with_their_graphs():
    fake, src = make()
    windows = []
    src.start(windows.append)
    assert wait_until(lambda: src.health().state == "running")
    h4, h2 = fake.instantiate(decode_like(4)), fake.instantiate(decode_like(2))
    with Workload(fake, [h4, h2]):
        assert wait_until(lambda: len(windows) >= 2)
    src.stop()
    for w in windows[:2]:
        u = w.untraced
        assert len(u["graph"]) == 6 and u["graph"].dtype == np.int32 and u["duration_ns"].dtype == np.int64
        # the reference phase's 6 launches, both graphs, each row with its own graph and its untraced time
        assert graph_rows(w) == {(fake.exec_ids[h4], SPAN4), (fake.exec_ids[h2], SPAN2)}
        assert w.trace.n_launches == 6  # the traced launches are the window's own: never rows
    assert src.stats["untraced_bursts"] == 0  # bursts off (0): only the reference phase


def test_bursts_time_launches_untraced_at_their_interval():
    fake, src = make(first_window_s=60.0, untraced_burst_launches=8, untraced_burst_interval_s=0.1,
                     untraced_burst_duration_ms=200)
    switches = tracing_switches(fake)
    log = []
    logged(src, "_run_burst", log)
    src.start(lambda w: None)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h]):
        t0 = time.perf_counter()
        assert wait_until(lambda: src.stats["untraced_bursts"] >= 5, timeout=10)
        span_s = time.perf_counter() - t0
    src.stop()
    n = src.stats["untraced_bursts"]
    starts = [a for a, _, _ in log]
    # burst_log (benchmarks place host steps in bursts): each burst's start, end and replays timed
    assert [k for _, _, k in src.burst_log] == [8] * n
    assert all(a0 <= b0 < b1 <= a1 for (a0, a1, _), (b0, b1, _) in zip(log, src.burst_log))
    assert all(b - a >= 0.1 - 0.002 for a, b in zip(starts, starts[1:]))  # an interval apart, at least
    assert n <= span_s / 0.1 + 2
    assert True not in switches and fake.fill == 0 and not fake.done  # tracing never on: no kernel record
    assert src.untraced.n >= 8 * 5 and src.untraced.n == 8 * n  # each burst timed its 8 launches ...
    gid, ns = src.untraced.take(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert set(ns.tolist()) == {SPAN4} and set(gid.tolist()) == {fake.exec_ids[h]}  # ... untraced, this graph
    # the launch callback is off between bursts: the loop's other launches ran without it
    assert fake.launch_callback_calls < 8 * n + 4 * n + 2 < fake.launches / 2


def test_bursts_and_windows_take_turns_and_burst_rows_ship_with_the_next_window():
    # a burst is always due (1 ms): windows still come at their interval, and none overlaps a burst
    fake, src = make(interval_s=0.05, untraced_burst_launches=8, untraced_burst_interval_s=0.001,
                     untraced_burst_duration_ms=100)
    log, windows = [], []
    logged(src, "_run_burst", log)
    logged(src, "_window", log)
    src.start(windows.append)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h]):
        assert wait_until(lambda: len(windows) >= 4, timeout=10)
    src.stop()
    spans = sorted(log)
    assert all(a_end <= b_start for (_, a_end, _), (b_start, _, _) in zip(spans, spans[1:]))  # one at a time
    kinds = [k for _, _, k in spans]
    assert kinds.count("_window") >= 4 and kinds.count("_run_burst") >= 4
    # every window after the first burst ships the rows of the bursts before it, then its reference phase's
    bursts_before, shipped = 0, []
    for k in kinds:
        if k == "_run_burst":
            bursts_before += 1
        elif len(shipped) < len(windows):
            shipped.append(bursts_before)
            bursts_before = 0
    for w, nb in zip(windows, shipped):
        assert len(w.untraced["duration_ns"]) == 8 * nb + 6
        assert graph_rows(w) == {(fake.exec_ids[h], SPAN4)}  # untraced times only, never a traced one
        assert w.trace.n_launches == 6 and len(w.trace) == 6 * 12  # the window traced its own launches only


def test_a_due_capture_waits_for_the_burst_to_end():
    fake, src = make(first_window_s=60.0, untraced_burst_launches=256, max_timed_launches=256,
                     untraced_burst_interval_s=0.01, untraced_burst_duration_ms=300)
    log, windows = [], []
    logged(src, "_run_burst", log)
    src.start(windows.append)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h], period_s=0.005):  # 256 launches take > 1 s: the burst lasts its 300 ms
        assert wait_until(lambda: src._ring is src._burst)
        asked = time.perf_counter()
        src.request_capture(CaptureRequest(id="c1", replays=4))
        assert wait_until(lambda: windows, timeout=10)
    src.stop()
    burst_end = min(e for s, e, _ in log if e > asked)
    window_t0 = [p["t0"] for p in src.phase_log if "sink" in p][0]
    assert window_t0 >= burst_end and windows[0].capture_id == "c1"
    assert not src.in_window and len(windows[0].untraced["duration_ns"]) >= 10  # the burst's rows came with it


def test_bursts_stop_with_the_collector():
    fake, src = make(first_window_s=60.0, untraced_burst_launches=256, untraced_burst_interval_s=0.01,
                     untraced_burst_duration_ms=5000)
    src.start(lambda w: None)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h], period_s=0.005):
        assert wait_until(lambda: src._ring is src._burst)  # in a 5 s burst
        t0 = time.perf_counter()
        src.stop()
        assert time.perf_counter() - t0 < 1.0
        calls = fake.launch_callback_calls
        time.sleep(0.1)
    assert fake.launch_callback_calls == calls and not fake.launch_callbacks  # nothing of graphmon runs on
    assert src.stats["untraced_bursts"] == 0  # the cut burst's rows are not read back


@pytest.mark.parametrize("kw", [dict(untraced_burst_launches=0), dict(untraced_burst_launches=8, observer="off")])
def test_bursts_are_off_at_zero_and_without_event_timing(kw):
    fake, src = make(first_window_s=60.0, untraced_burst_interval_s=0.01, **kw)
    src.start(lambda w: None)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(2))
    with Workload(fake, [h]):
        assert wait_until(lambda: fake.launches >= 400)  # bursts would have come every 10 ms
    src.stop()
    assert src.stats["untraced_bursts"] == 0 and src.untraced.n == 0
    # only around the new graph's first launch (its upload mode), until the collector's next poll (5 ms)
    assert fake.launch_callback_calls < 40 < fake.launches / 5


def test_bursts_need_the_subscription_and_let_it_go_idle():
    # idle_unsubscribe_s: a burst does not keep CUPTI subscribed (torch.profiler may run between
    # windows) and never subscribes; the rows held meanwhile ship with the next window
    fake, src = make(interval_s=0.6, first_window_s=60.0, idle_unsubscribe_s=0.15, untraced_burst_launches=8,
                     untraced_burst_interval_s=0.03)
    windows = []
    src.start(windows.append)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h]):
        assert wait_until(lambda: src.stats["untraced_bursts"] >= 2 and src.stats["idle_unsubscribes"] >= 1, timeout=5)
        n = src.stats["untraced_bursts"]
        time.sleep(0.2)  # unsubscribed (no window is due for 60 s): several burst intervals
        assert fake.handler is None and src.stats["untraced_bursts"] == n
        src.request_capture(CaptureRequest(id="c", replays=4))  # subscribes for its window
        assert wait_until(lambda: windows, timeout=5)
    src.stop()
    assert len(windows[0].untraced["duration_ns"]) == 8 * n + 4  # the bursts' rows, then its reference phase's
    assert not src.health().errors


def test_held_rows_are_bounded_and_what_is_dropped_counted():
    fake, src = make(first_window_s=60.0, untraced_burst_launches=8, untraced_burst_interval_s=0.02)
    src.untraced = UntracedRows(max_rows=20)
    windows = []
    src.start(windows.append)
    assert wait_until(lambda: src.health().state == "running")
    h = fake.instantiate(decode_like(4))
    with Workload(fake, [h]):
        assert wait_until(lambda: src.stats["untraced_bursts"] >= 5, timeout=10)
        assert src.untraced.n == 20  # full: 2.5 bursts' worth
        src.request_capture(CaptureRequest(id="c", replays=4))
        assert wait_until(lambda: windows, timeout=10)
    src.stop()
    n, u = src.stats["untraced_bursts"], windows[0].untraced["duration_ns"]
    assert len(u) == 20 + 4  # the 20 held, then the capture's reference phase (4 launches)
    # every burst row was shipped, is still held, or was dropped and counted
    assert 8 * n == 20 + src.untraced.n + src.stats["untraced_dropped"] and src.stats["untraced_dropped"] >= 8 * 5 - 20
    assert src.health().errors["untraced_rows_capped"] >= 3  # once per burst that lost rows (the 3rd onwards)


def test_untraced_rows_resolve_graphs_and_keep_the_cap():
    reg = GraphRegistry()
    reg.on_instantiate(0x10, graph_id=5)
    per = {0x10: {"burst": [0.035264, 0.0351], "ref": [0.5]}, 0x20: {"burst": [0.001]}, 0x30: {"ref": [0.0]}}
    gid, ns = timed_rows(per, "burst", reg)
    assert gid.tolist() == [5, 5, -1] and ns.tolist() == [35264, 35100, 1000]  # an exec not known: -1
    rows = UntracedRows(max_rows=4)
    assert rows.add(gid, ns) == 0 and rows.add(gid, ns) == 2 and rows.dropped == 2
    g, d = rows.take(*timed_rows(per, "ref", reg))  # the held, then a window's reference phase (0 ms: no row)
    assert g.tolist() == [5, 5, -1, 5, 5] and d.tolist() == [35264, 35100, 1000, 35264, 500000]
    assert rows.n == 0 and len(rows.take(np.zeros(9, np.int64), np.ones(9, np.int64))[1]) == 4  # capped on its own
    assert rows.dropped == 2 + 5
