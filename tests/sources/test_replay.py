import time

import numpy as np
import pytest

from graphmon.formats.read import read_trace
from graphmon.sources.replay import ReplaySource
from graphmon.model.window import CaptureRequest
from graphmon.model.trace import TraceError

from helpers import NATIVE, synthetic_trace


@pytest.fixture(scope="module")
def real():
    return read_trace(NATIVE)


def test_windows_follow_the_recorded_pace_and_cover_the_trace(real):
    src = ReplaySource(real, interval_s=0.25, loop=False)
    seen, n = set(), 0
    with pytest.raises(StopIteration):
        while True:
            w = src.next_window()
            span = int(w.trace.start_ns.max() - w.trace.start_ns.min()) if len(w.trace) else 0
            # a window holds replays *starting* within 0.25 s of recording time
            key = (w.trace.device.astype(np.int64) << 48) ^ w.trace.correlation_id
            first_starts = [w.trace.start_ns[key == k].min() for k in np.unique(key)]
            assert max(first_starts) - min(first_starts) < 250_000_000
            assert span >= 0 and len(w.trace) > 0
            seen |= set(np.unique(w.trace.correlation_id).tolist())
            n += 1
    assert seen == set(np.unique(real.correlation_id).tolist())  # every replay delivered once
    assert n >= 6  # the 1.5 s recording in 0.25 s windows, dead time skipped


def test_loops_shift_time_and_correlation_monotonically(real):
    src = ReplaySource(real, interval_s=1.0)
    starts, corrs = [], []
    for _ in range(5):  # 1.5 s recording: windows 3+ come from the second loop
        w = src.next_window()
        starts.append((int(w.trace.start_ns.min()), int(w.trace.start_ns.max())))
        corrs.append(set(np.unique(w.trace.correlation_id).tolist()))
    for (a0, a1), (b0, b1) in zip(starts, starts[1:]):
        assert b0 > a1
    assert not corrs[0] & corrs[2] and not corrs[1] & corrs[3]


def test_capture_request_gets_exact_replay_count():
    src = ReplaySource(synthetic_trace(replays=50), interval_s=10.0)
    got = []
    src.start(got.append)
    src.request_capture(CaptureRequest(id="c1", replays=7))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    src.stop()
    assert got and got[0].capture_id == "c1"
    assert len(np.unique(got[0].trace.correlation_id)) == 7


def test_empty_trace_is_refused():
    t = synthetic_trace()
    with pytest.raises(TraceError):
        ReplaySource(t.select(np.zeros(len(t), dtype=bool)))


def test_thread_stops_quickly():
    src = ReplaySource(synthetic_trace(), interval_s=0.05)
    src.start(lambda w: None)
    time.sleep(0.2)
    t0 = time.monotonic()
    src.stop(timeout_s=2)
    assert time.monotonic() - t0 < 2 and not src._thread.is_alive()
    assert src.health().state == "stopped"


# ---------------------------------------------------------------- issue 18 items 13, 15, 19
def test_invalid_records_of_the_file_count_once_per_pass():
    from dataclasses import replace as _replace

    from graphmon.export.aggregator import Aggregator
    from helpers import synthetic_trace

    t = _replace(synthetic_trace(replays=10), invalid={"duplicate": 3})
    src = ReplaySource(t, interval_s=1.0, speed=1e-6)  # about one replay per window
    agg = Aggregator()
    n = 0
    while src._pass_no < 3:
        agg.ingest(src.next_window())
        n += 1
    assert n > 25  # many windows per pass
    passes = src._pass_no + 1  # the loop ends with the first window of the fourth pass
    assert agg.snapshot().records_invalid_total["duplicate"] == 3 * passes == 12  # old code: 3 per window


def test_timestamps_near_int64_max_do_not_stop_the_replay():
    from graphmon.export.aggregator import Aggregator
    from graphmon.model.trace import Trace
    from helpers import synthetic_trace

    # one replay at the usual times and one at 9e18 ns: the recording spans ~9e18 ns, so the old
    # per-pass shift (pass x span) left int64 on the second pass
    a, b = synthetic_trace(replays=1), synthetic_trace(replays=1, base_ns=9 * 10**18)
    cols = {c: np.concatenate([getattr(a, c), getattr(b, c)]) for c in ("start_ns", "end_ns", "stream", "graph_id")}
    t = Trace.build(**cols, correlation_id=np.r_[a.correlation_id, b.correlation_id + 1], graphs=a.graphs)
    src = ReplaySource(t, interval_s=1.0, speed=1.0)
    agg = Aggregator()
    for _ in range(8):  # four passes
        agg.ingest(src.next_window())
    s = agg.snapshot()
    assert s.windows_total == 8 and "analysis" not in s.errors_total
    assert s.records_total == 8 * len(a)


def test_a_dead_replay_thread_shows_in_health():
    import time as _time

    from graphmon.export.exporter import Exporter
    from graphmon.settings import Settings
    from helpers import synthetic_trace

    src = ReplaySource(synthetic_trace(), interval_s=1e300)  # Queue.get(timeout=1e300) raises OverflowError
    ex = Exporter(src, Settings())
    ex.start()
    try:
        deadline = _time.monotonic() + 5
        while ex.snapshot().health.state != "error" and _time.monotonic() < deadline:
            ex.aggregator.refresh()
            _time.sleep(0.05)
        h = ex.snapshot().health
        assert h.state == "error" and not h.up and "died" in h.reason  # old code: running, up
    finally:
        ex.stop()
