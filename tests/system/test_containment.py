"""Containment: a failure at any stage is counted, logged once (rate limited), and collection goes on.

Each test injects failures at one stage (analysis, snapshot build, scrape rendering, HTTP handler,
a source's windows, fake-CUPTI callbacks and buffers, the collector loop) while a simulated host
loop runs, and asserts: the host loop never sees an exception and keeps running, /metrics answers
200 with graphmon_up and graphmon_collector_errors_total{stage}, and later windows are ingested.
"""

import logging
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import graphmon.export.aggregator as snapshot_mod
from graphmon.export.exporter import Exporter
from graphmon.sources.cupti.registry import GraphRegistry
from graphmon.export import families
from graphmon.settings import CuptiSettings, Settings
from graphmon.export.aggregator import Aggregator
from graphmon.model.window import Window
from graphmon.sources.base import Source
from graphmon.sources.cupti.api import RawBuffer
from graphmon.sources.cupti.collector import CuptiSource
from graphmon.sources.replay import ReplaySource

from fake_cupti import FakeCupti, FakeEvents, decode_like  # noqa: E402
LOCAL = ("127.0.0.1", 50000)  # TestClient as a loopback client (/capture and /trace need loopback or a token)
from helpers import synthetic_trace, window  # noqa: E402

TIMEOUT_S = 30.0  # generous: the 2 CI cores are shared with other test processes


def wait_for(pred, timeout_s=TIMEOUT_S, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class HostLoop:
    """The process graphmon lives in: a thread doing its own work (optionally launching graphs).

    Any exception reaching it is recorded; the tests assert there is none and that it kept going.
    """

    def __init__(self, work=None):
        self.work = work or (lambda: float(np.arange(2000).sum()))
        self.iterations = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="host-loop", daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.work()
            except BaseException as e:  # what graphmon must never cause
                self.errors.append(e)
                return
            self.iterations += 1
            time.sleep(0.0005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(5)

    def assert_healthy(self, since: int):
        assert not self.errors, f"an exception reached the host loop: {self.errors[0]!r}"
        assert self.thread.is_alive()
        wait_for(lambda: self.iterations > since + 10, what="host loop progress")


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample in /metrics text (labels must match exactly the given ones)."""
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(2))
    raise AssertionError(f"{name}{labels} not in /metrics")


def assert_metrics_answer(client, stage: str, at_least: int = 1) -> str:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert metric(r.text, "graphmon_up", rank="0") in (0.0, 1.0)
    assert metric(r.text, "graphmon_collector_errors_total", stage=stage) >= at_least
    return r.text


def error_logs(caplog, stage: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"graphmon {stage} error")]


def is_own_thread(ex) -> bool:
    """Class- or module-level fault injection must only hit this exporter's threads: other tests'
    exporters may still be running in the same process."""
    return threading.current_thread() in (ex.source._thread, ex._refresher)


@pytest.fixture
def replay_exporter():
    made = []

    def make(**kw):
        src = ReplaySource(synthetic_trace(n_graphs=2, n_streams=2, replays=40), interval_s=0.02, name="test", **kw)
        ex = Exporter(src, Settings())
        made.append(ex)
        return ex, TestClient(ex.app, client=LOCAL)

    yield make
    for ex in made:
        ex.stop(timeout_s=5)


def test_analysis_failures_are_counted_logged_once_and_later_windows_ingested(replay_exporter, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    real = snapshot_mod.analyze
    fail_left = [5]

    ex, c = replay_exporter()

    def flaky_analyze(trace):
        if fail_left[0] > 0 and is_own_thread(ex):
            fail_left[0] -= 1
            raise ValueError("injected analysis failure")
        return real(trace)

    monkeypatch.setattr(snapshot_mod, "analyze", flaky_analyze)
    with HostLoop() as host:
        ex.start()
        wait_for(lambda: ex.snapshot().errors_total.get("analysis", 0) == 5, what="5 analysis errors")
        seen = host.iterations
        wait_for(lambda: ex.snapshot().windows_total >= 3, what="windows after the failures")
        text = assert_metrics_answer(c, "analysis", 5)
        assert metric(text, "graphmon_up", rank="0") == 1.0
        assert metric(text, "graphmon_windows_total", rank="0") >= 3
        host.assert_healthy(seen)
    logs = error_logs(caplog, "analysis")
    assert len(logs) == 1 and "injected analysis failure" in logs[0]  # five failures, one line


def test_snapshot_build_failures_are_counted_as_snapshot_and_no_window_is_lost(replay_exporter, monkeypatch):
    real = snapshot_mod.Snapshot
    fail_left = [3]

    ex, c = replay_exporter(max_windows=12)

    def flaky_snapshot(**kw):
        if fail_left[0] > 0 and is_own_thread(ex):
            fail_left[0] -= 1
            raise RuntimeError("injected snapshot failure")
        return real(**kw)

    monkeypatch.setattr(snapshot_mod, "Snapshot", flaky_snapshot)
    with HostLoop() as host:
        ex.start()
        wait_for(lambda: ex.source.windows_emitted == 12 and ex.snapshot().windows_total == 12, what="12 windows")
        text = assert_metrics_answer(c, "snapshot", 3)
        host.assert_healthy(0)
    errors = ex.snapshot().errors_total
    assert errors["snapshot"] == 3
    assert "analysis" not in errors  # the stage is named for what failed
    assert metric(text, "graphmon_windows_total", rank="0") == 12  # folded windows show once a build succeeds


def test_scrape_rendering_failure_still_answers_200_with_health_and_error_count(replay_exporter, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    ex, c = replay_exporter()
    ex.start()
    wait_for(lambda: ex.snapshot().windows_total >= 1, what="a window")

    def broken_graphs(snap, level):
        raise KeyError("injected rendering failure")

    monkeypatch.setattr(families, "graph_series", broken_graphs)
    # Drop the body pre-rendered before the fault, after any render in progress stored its body (a
    # render started before the fault and finishing after a bare cache clear made the scrapes answer it).
    ex.app.state.renderer.invalidate()
    for i in range(1, 4):
        r = c.get("/metrics")
        assert r.status_code == 200
        assert metric(r.text, "graphmon_up", rank="0") == 1.0
        assert metric(r.text, "graphmon_collector_errors_total", stage="scrape") == i  # this scrape's own error
        assert "graphmon_kernel_gap_seconds_bucket" not in r.text  # only the health families' samples
    assert len(error_logs(caplog, "scrape")) == 1
    monkeypatch.undo()
    r = c.get("/metrics")
    assert r.status_code == 200 and "graphmon_kernel_gap_seconds_bucket" in r.text


def test_http_handler_exception_is_a_counted_500_and_the_server_thread_survives(monkeypatch, caplog):
    import httpx

    import graphmon.export.server as server_mod

    caplog.set_level(logging.WARNING)
    src = ReplaySource(synthetic_trace(), interval_s=0.05)
    ex = Exporter(src, Settings(port=0))

    def broken(s):
        raise ZeroDivisionError("injected handler failure")

    monkeypatch.setattr(server_mod, "upload_mode_comparison", broken)
    ex.start()
    ex.serve_background()
    try:
        base = f"http://127.0.0.1:{ex.bound_port}"
        with HostLoop() as host:
            for _ in range(5):
                r = httpx.get(base + "/status", timeout=10)
                assert r.status_code == 500 and "counted" in r.json()["detail"]
            # counted now, published with the next snapshot (next window or the 1 s refresh)
            wait_for(lambda: metric(httpx.get(base + "/metrics", timeout=10).text,
                                    "graphmon_collector_errors_total", stage="http") == 5, what="http errors in /metrics")
            assert ex._server_thread.is_alive()
            host.assert_healthy(0)
    finally:
        ex.stop(timeout_s=5)
    # one graphmon line, and uvicorn did not log a traceback per request (the error was not re-raised)
    assert len(error_logs(caplog, "http")) == 1
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]


class MalformedSource(Source):
    """Delivers a scripted sequence of windows, some of them malformed, from its own thread."""

    backend = "malformed"

    def __init__(self, windows):
        super().__init__()
        self.windows = windows
        self.thread = None

    def start(self, sink):
        self.set_state("running")

        def run():
            for w in self.windows:
                sink(w)  # the sink contract: never raises into the source
                time.sleep(0.005)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self, timeout_s=5.0):
        if self.thread is not None:
            self.thread.join(timeout_s)
        self.set_state("stopped")


def test_malformed_windows_from_a_source_are_counted_and_good_ones_ingested():
    good = [window(synthetic_trace(base_ns=10**9 * (i + 1))) for i in range(4)]

    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError(f"broken window attribute {name}")

    t = synthetic_trace()
    bad = [
        None,
        Exploding(),
        Window(trace=None, started_s=0.0, ended_s=1.0),
        Window(trace="not a trace", started_s=0.0, ended_s=1.0),
        # analysed fine, but a field is garbage: refused before any counter moves (nothing half-counted,
        # and no string reaches the graphmon_last_window_timestamp_seconds gauge of every later scrape)
        window(t, dropped="many"),
        Window(trace=t, started_s=0.0, ended_s="yesterday"),
        window(t, observer_slowdown=[1.2]),
    ]
    seq = [good[0], *bad[:3], good[1], *bad[3:], good[2], good[3]]
    src = MalformedSource(seq)
    ex = Exporter(src, Settings())
    c = TestClient(ex.app, client=LOCAL)
    with HostLoop() as host:
        ex.start()
        src.thread.join(TIMEOUT_S)
        assert not src.thread.is_alive(), "the source thread died or hung on a malformed window"
        host.assert_healthy(0)
    s = ex.snapshot()
    assert s.windows_total == 4 and s.errors_total["analysis"] == len(bad)
    assert s.records_total == sum(len(w.trace) for w in good)
    alone = Aggregator()
    for w in good:
        alone.ingest(w)
    assert s.gap_hist == alone.snapshot().gap_hist  # the bad windows left nothing in the histograms
    text = assert_metrics_answer(c, "analysis", len(bad))
    assert metric(text, "graphmon_windows_total", rank="0") == 4
    ex.stop()


def test_source_errors_are_logged_once_per_stage_with_the_exception(replay_exporter, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    ex, c = replay_exporter()
    real = ReplaySource.next_window
    fail_left = [4]

    def flaky(self, *a, **kw):
        if fail_left[0] > 0 and self is ex.source:
            fail_left[0] -= 1
            raise OSError("injected source failure")
        return real(self, *a, **kw)

    monkeypatch.setattr(ReplaySource, "next_window", flaky)
    ex.start()
    wait_for(lambda: ex.snapshot().windows_total >= 2 and ex.snapshot().errors_total.get("source") == 4,
             what="source errors then windows")
    assert_metrics_answer(c, "source", 4)
    logs = error_logs(caplog, "source")
    assert len(logs) == 1 and "injected source failure" in logs[0]


def test_error_log_is_rate_limited_per_stage(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    monkeypatch.setattr(snapshot_mod, "ERROR_LOG_INTERVAL_S", 0.5)
    agg = Aggregator()
    for _ in range(50):
        agg.ingest(None)
    agg.count_error("scrape", ValueError("x"))
    assert len(error_logs(caplog, "analysis")) == 1 and len(error_logs(caplog, "scrape")) == 1
    time.sleep(0.6)
    agg.ingest(None)
    agg.ingest(None)
    assert len(error_logs(caplog, "analysis")) == 2  # one more after the interval, not two
    assert agg.snapshot().errors_total["analysis"] == 52  # every error counted, logged or not


def test_refresh_never_publishes_an_older_snapshot_after_a_newer_one():
    """The refresher thread rebuilt snapshots without the ingest lock: one built before an ingest
    could be published after it, so counters went backwards (Prometheus reads a counter reset)."""
    published = []

    class Recording(Aggregator):
        @property
        def _snapshot(self):
            return self.__dict__["_snap"]

        @_snapshot.setter
        def _snapshot(self, s):
            self.__dict__["_snap"] = s
            published.append(s.windows_total)  # in publication order (assignment holds the GIL)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible to expose the race
    try:
        agg = Recording()
        traces = [synthetic_trace(n_graphs=3, n_streams=4, replays=5, base_ns=10**7 * i) for i in range(8)]
        stop = threading.Event()

        def refresher():
            while not stop.is_set():
                agg.refresh()
                time.sleep(0.0005)

        th = threading.Thread(target=refresher)
        th.start()
        deadline = time.monotonic() + 4.0
        n = 0
        while time.monotonic() < deadline:
            agg.ingest(window(traces[n % len(traces)]))
            n += 1
        stop.set()
        th.join()
    finally:
        sys.setswitchinterval(old_interval)
    back = [(a, b) for a, b in zip(published, published[1:]) if b < a]
    assert n > 20 and not back, f"windows_total went backwards {len(back)} times: {back[:3]}"


# ---------------------------------------------------------------------- fake CUPTI faults

FAST = dict(window_launches=6, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, poll_s=0.005,
            max_traced_share=1.0)


@pytest.fixture
def cupti_exporter():
    made = []

    def make(**kw):
        fake = FakeCupti()
        src = CuptiSource(cupti=fake, settings=CuptiSettings(**{**FAST, **kw}), events=FakeEvents(fake),
                          registry=GraphRegistry())
        ex = Exporter(src, Settings())
        made.append(ex)
        return fake, src, ex, TestClient(ex.app, client=LOCAL)

    yield make
    for ex in made:
        ex.stop(timeout_s=5)


def launching_host(fake, h, stream=7):
    return HostLoop(work=lambda: fake.launch(h, stream))


def test_fake_cupti_api_callback_raising_never_reaches_the_launching_thread(cupti_exporter, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    fake, src, ex, c = cupti_exporter()
    ex.start()
    wait_for(lambda: src.health().state == "running", what="cupti running")
    h = fake.instantiate(decode_like(2))

    def broken(*a):
        raise MemoryError("injected: params struct unreadable")

    with launching_host(fake, h) as host:
        wait_for(lambda: ex.snapshot().windows_total >= 1, what="a first window")
        src.registry.on_launch = broken  # every launch callback now raises inside graphmon
        wait_for(lambda: src.health().errors.get("callback", 0) >= 20, what="callback errors")
        seen = ex.snapshot().windows_total
        del src.registry.on_launch  # the fault goes away: the class's method is back
        wait_for(lambda: ex.snapshot().windows_total >= seen + 2, what="windows after the fault")
        text = assert_metrics_answer(c, "callback", 20)
        assert metric(text, "graphmon_up", rank="0") == 1.0
        host.assert_healthy(0)
    assert len(error_logs(caplog, "callback")) == 1
    assert "injected: params struct unreadable" in error_logs(caplog, "callback")[0]


def test_fake_cupti_malformed_buffer_is_counted_and_next_buffers_proceed(cupti_exporter):
    fake, src, ex, c = cupti_exporter()
    ex.start()
    wait_for(lambda: src.health().state == "running", what="cupti running")
    h = fake.instantiate(decode_like(2))
    real_completed = fake.completed_buffer
    poisoned = [0]

    def poisoned_completed():
        buf = real_completed()
        if buf is not None and poisoned[0] < 3:
            poisoned[0] += 1
            return RawBuffer(data=object(), key=buf.key)  # a buffer the decoder cannot read
        return buf

    fake.completed_buffer = poisoned_completed
    with launching_host(fake, h) as host:
        wait_for(lambda: src.health().errors.get("buffer_completed", 0) >= 3, what="buffer errors")
        seen = ex.snapshot().records_total
        wait_for(lambda: ex.snapshot().records_total > seen, what="records after the bad buffers")
        assert_metrics_answer(c, "buffer_completed", 3)
        host.assert_healthy(0)


def test_fake_cupti_flush_and_collector_failures_do_not_stop_collection(cupti_exporter):
    fake, src, ex, c = cupti_exporter()
    real_flush = fake.flush
    flush_fail = [2]

    def flaky_flush(forced=False):
        if flush_fail[0] > 0:
            flush_fail[0] -= 1
            raise RuntimeError("injected flush failure")
        return real_flush(forced)

    fake.flush = flaky_flush
    real_resolve = src.registry.resolve_ids
    collector_fail = [1]

    def flaky_resolve():
        if collector_fail[0] > 0:
            collector_fail[0] -= 1
            raise RuntimeError("injected collector failure")
        return real_resolve()

    src.registry.resolve_ids = flaky_resolve  # raises out of the window into the collector loop
    ex.start()
    h = fake.instantiate(decode_like(2))
    with launching_host(fake, h) as host:
        wait_for(lambda: src.health().errors.get("collector", 0) == 1, what="a collector error")
        wait_for(lambda: ex.snapshot().windows_total >= 3, what="windows after the collector error")
        text = assert_metrics_answer(c, "flush", 2)
        assert metric(text, "graphmon_collector_errors_total", stage="collector") == 1
        assert metric(text, "graphmon_up", rank="0") == 1.0
        host.assert_healthy(0)


def test_capture_waiters_do_not_outlive_their_request():
    """A /capture whose window never came left its Event in the aggregator forever (one per request)."""
    agg = Aggregator()
    for i in range(100):
        assert agg.wait_for(f"never{i}", 0.001) is False
    assert agg._waiters == {}
    timer = threading.Timer(0.05, lambda: agg.ingest(window(synthetic_trace(), capture_id="c1")))
    timer.start()
    assert agg.wait_for("c1", TIMEOUT_S) is True  # a window that lands while waiting wakes the waiter
    timer.join()
    assert agg._waiters == {}


def test_cupti_capture_queue_refuses_instead_of_dropping_silently(cupti_exporter):
    """The capture deque (maxlen 16) silently dropped the oldest pending request on the 17th."""
    fake, src, ex, c = cupti_exporter()  # not started: no request is served, they pile up
    answers = [c.post("/capture", json={"replays": 1}) for _ in range(20)]
    assert [r.status_code for r in answers] == [200] * 16 + [429] * 4
    accepted = [r.json()["id"] for r in answers[:16]]
    assert [r.id for r in src._captures] == accepted  # every accepted request is still pending


def test_persistent_collector_fault_logs_one_traceback_not_one_per_second(cupti_exporter, caplog):
    caplog.set_level(logging.WARNING, logger="graphmon")
    fake, src, ex, c = cupti_exporter()

    def broken():
        raise RuntimeError("injected persistent collector failure")

    src.registry.resolve_ids = broken  # every window fails in the collector loop (retried each second)
    ex.start()
    h = fake.instantiate(decode_like(2))
    with launching_host(fake, h) as host:
        wait_for(lambda: src.health().errors.get("collector", 0) >= 3, what="3 collector errors")
        host.assert_healthy(0)
    tracebacks = [r for r in caplog.records if r.getMessage() == "graphmon collector error"]
    assert len(tracebacks) == 1 and tracebacks[0].exc_info is not None
    # counted at once, published with the next snapshot (no window succeeds: the 1 s refresher)
    wait_for(lambda: metric(c.get("/metrics").text, "graphmon_collector_errors_total", stage="collector") >= 3,
             what="collector errors in /metrics")
