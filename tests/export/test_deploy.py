"""graphmon.export.deploy and deploy_metrics: the agent's verdict after a restart, on windows cut from
the real H200 trace (4 replays each, as a default window holds), fed the way the agent feeds it."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from prometheus_client.registry import CollectorRegistry

from graphmon.export.baseline import PooledBaseline
from graphmon.export.deploy import DeployVerdict
from graphmon.export.deploy_pool import Pool, pooled, window_replays
from graphmon.export.deploy_metrics import DeployCollector, status
from graphmon.export.exposition import render
from graphmon.formats.read import read_trace
from helpers import NATIVE, VerdictProc as Proc, held_out_concentrated, only, wait_until, widen, widen_at, window, windows_of

GRAPH = "decode_bs1/upload"


@pytest.fixture(scope="module")
def native():
    return read_trace(NATIVE, progress=False)


def metrics(verdict, live=None):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DeployCollector(verdict, (lambda: live) if live is not None else None))
    return render(reg, "text").decode()


@pytest.fixture
def verdict():
    v = DeployVerdict()
    yield v
    v.stop()


def _settled(v, n_windows):
    return wait_until(lambda: v.idle and sum(len(s.current.windows) for s in v._ranks.values()) >= n_windows,
                      timeout=30)


def test_a_restart_with_widened_gaps_is_flagged_within_two_windows(native, verdict):
    t = only(native, GRAPH)
    v1 = Proc(pid=100)
    v2 = Proc(pid=200, after=v1)
    for w in windows_of(t)[:4]:
        v1.send(verdict, w)
    assert _settled(verdict, 4)
    assert not verdict.results  # one process: nothing to compare with yet
    after = windows_of(widen(t, 0))
    v2.send(verdict, after[0])
    assert _settled(verdict, 1)
    r = verdict.results.get(("0", "previous"))
    assert r is not None and r.state == "pooling" and r.current_replays == {f"0/{GRAPH}": 4}
    v2.send(verdict, after[1])  # 8 replays >= min_replays 5: the second window brings the verdict
    assert wait_until(lambda: verdict.results.get(("0", "previous")) is not None
                      and verdict.results[("0", "previous")].state == "ready", timeout=30)
    r = verdict.results[("0", "previous")]
    assert (r.reference_id, r.reference_pid, r.current_incarnation, r.current_pid) == ("i100", "100", "i200", "200")
    assert r.reference_windows == 4 and r.current_windows == 2
    (g,) = r.verdict.graphs
    assert g.regression and g.kind == "uniform" and g.flagged_streams == [7, 142, 143, 144]
    text = metrics(verdict)
    lv = f'device="0",graph="{GRAPH}",rank="0",reference="previous"'
    for kind, v in (("uniform", 1), ("concentrated", 0), ("mixed", 0), ("untraced", 0)):  # every kind initialised
        assert (f'graphmon_deploy_regression{{device="0",graph="{GRAPH}",kind="{kind}",rank="0",'
                f'reference="previous"}} {v}.0') in text
    for s in (7, 142, 143, 144):
        assert (f'graphmon_deploy_stream_regression{{device="0",graph="{GRAPH}",rank="0",reference="previous",'
                f'stream="{s}"}} 1.0') in text
        m = re.search(rf'graphmon_deploy_gap_shift_seconds{{device="0",graph="{GRAPH}",rank="0",'
                      rf'reference="previous",stream="{s}"}} (\S+)', text)
        assert m and 250e-9 < float(m.group(1)) < 400e-9  # +320 ns, other replays on each side
    assert f"graphmon_deploy_gap_added_seconds{{{lv}}}" in text
    assert 'graphmon_deploy_reference_age_seconds{rank="0",reference="previous"}' in text
    assert "pid" not in "".join(line for line in text.splitlines() if not line.startswith("#"))
    st = status(verdict)
    s0 = st[0]["graphs"][0]["streams"][0]
    assert st[0]["regression"] is True and 0 < s0["ci_low_ns"] <= s0["shift_ns"] <= s0["ci_high_ns"]
    assert st[0]["graphs"][0]["top"]  # the boundaries, in /status only
    # windows without untraced rows: the traced rule alone, and /status says so
    assert st[0]["untraced"] == "absent" and st[0]["graphs"][0]["untraced"] == "absent"
    assert st[0]["reference_untraced"] == {} == st[0]["current_untraced"]
    assert "graphmon_deploy_untraced_shift_seconds{" not in text
    # the compared process is gone (or another one of the rank is attached and has sent nothing yet):
    # its verdict leaves /metrics and /status
    for live in (set(), {"i100"}, {"i300"}):
        assert "graphmon_deploy_regression{" not in metrics(verdict, live=live) and status(verdict, live=live) == []
    assert "graphmon_deploy_regression{" in metrics(verdict, live={"i200"}) and status(verdict, live=["i200"])


def test_a_restart_without_change_flags_nothing(native, verdict):
    ws = windows_of(only(native, GRAPH))
    v1 = Proc(pid=100)
    v2 = Proc(pid=200, after=v1)
    for w in ws[:4]:
        v1.send(verdict, w)
    for w in ws[4:8]:  # the same build: the next replays of the same graph
        v2.send(verdict, w)
    assert _settled(verdict, 4)
    assert wait_until(lambda: verdict.results.get(("0", "previous")) is not None
                      and verdict.results[("0", "previous")].current_windows == 4, timeout=30)
    r = verdict.results[("0", "previous")]
    assert r.state == "ready" and not r.verdict.regressions()
    text = metrics(verdict)
    assert ' 1.0' not in "\n".join(line for line in text.splitlines() if line.startswith("graphmon_deploy_regression")
                                   or line.startswith("graphmon_deploy_stream_regression"))
    assert text.count("graphmon_deploy_regression{") == 4  # the graph, every kind at 0


def test_a_rollback_that_widens_one_boundary_is_reported_not_paged(native, verdict):
    """Issue 35: the previous build widened every gap by 150 ns; the new process runs the original
    build with one boundary +10 us. The widening is in /status; the regression gauge stays 0."""
    t = only(native, GRAPH)
    v1 = Proc(pid=100)
    v2 = Proc(pid=200, after=v1)
    for w in windows_of(widen(t, 0, 150))[:4]:
        v1.send(verdict, w)
    assert _settled(verdict, 4)
    for w in windows_of(widen_at(t, 0, 7, [40], 10_000))[4:6]:
        v2.send(verdict, w)
    assert wait_until(lambda: verdict.results.get(("0", "previous")) is not None
                      and verdict.results[("0", "previous")].current_windows == 2, timeout=30)
    (g,) = verdict.results[("0", "previous")].verdict.graphs
    assert g.widening and g.kind == "concentrated" and g.flagged_streams == [7]
    assert g.net == "faster" and not g.regression
    text = metrics(verdict)
    assert text.count("graphmon_deploy_regression{") == 4 and ' 1.0' not in "\n".join(
        line for line in text.splitlines() if line.startswith(("graphmon_deploy_regression",
                                                               "graphmon_deploy_stream_regression")))
    assert "graphmon_deploy_stream_regression{" in text
    (st,) = status(verdict)
    assert st["regression"] is False
    assert st["graphs"][0]["widening"] is True and st["graphs"][0]["net"] == "faster"
    assert st["graphs"][0]["span"]["ci_high_ns"] < 0


def test_the_verdict_computes_at_most_its_busy_share_of_the_time(native):
    """The agent's ingest shares the GIL with the verdict: after a computation of t seconds the
    verdict pauses t * (1/busy_share - 1) before the next; windows of the pause are compared
    together (fewer computations than windows), and the last window is always compared."""
    ws = windows_of(only(native, GRAPH))
    v = DeployVerdict(busy_share=0.25)
    spans = []
    real = v._compute

    def timed(*job):
        t0 = time.monotonic()
        time.sleep(0.05)  # a computation of at least 50 ms
        real(*job)
        spans.append((t0, time.monotonic()))

    v._compute = timed
    try:
        v1 = Proc(pid=100)
        v2 = Proc(pid=200, after=v1)
        for w in ws[:4]:
            v1.send(v, w)
        for w in ws[4:12]:
            v2.send(v, w)
            time.sleep(0.02)
        assert wait_until(lambda: v.idle and v.results.get(("0", "previous")) is not None
                          and v.results[("0", "previous")].current_windows == 8, timeout=30)
        assert 1 <= len(spans) < 8
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            assert b0 - a1 >= 3 * (a1 - a0) * 0.9  # busy_share 0.25: a pause of 3x the computation
    finally:
        v.stop()


def test_a_concentrated_regression_and_a_pinned_baseline(native, verdict):
    """The pinned window pools with its process's windows before it: the held-out concentrated case
    flags through POST /baseline's path as through a restart."""
    t = only(native, "decode_bs2/no_upload")
    _, cur = held_out_concentrated(t)
    v1 = Proc(pid=100)
    v2 = Proc(pid=200, after=v1)
    ids = [v1.send(verdict, w) for w in windows_of(t)[:4]]
    assert _settled(verdict, 4)
    base = PooledBaseline(verdict)
    assert base.status() == {"state": "no baseline"}
    assert base.pin(ids[2]) and not base.pin("r1-w99")
    assert base.describe()["windows"] == 3 and base.describe()["replays"] == {"0/decode_bs2/no_upload": 12}
    # compared with the windows after the pinned one: one window (4 replays) is not enough yet
    assert wait_until(lambda: base.status().get("state") == "pooling", timeout=30)
    assert base.status()["window"] == ids[3] and base.status()["replays_current"] == {"0/decode_bs2/no_upload": 4}
    for w in windows_of(cur)[:2]:
        wid = v2.send(verdict, w)
    assert wait_until(lambda: base.status().get("window") == wid, timeout=30)
    doc = base.status()
    assert doc["baseline"] == ids[2] and doc["window"] == wid and doc["windows_baseline"] == 3
    (g,) = doc["graphs"]
    assert g["verdict"] == "concentrated" and g["flagged"] == 3
    assert base.for_window(wid) == (ids[2], doc["graphs"]) and base.for_window("r1-w5") is None
    assert wait_until(lambda: ("0", "previous") in verdict.results and verdict.results[("0", "previous")].state == "ready")
    for ref in ("previous", "pinned"):
        r = verdict.results[("0", ref)]
        (gv,) = r.verdict.graphs
        assert gv.regression and gv.kind == "concentrated" and gv.gap_added_ns == 15_000
    text = metrics(verdict)
    assert 'kind="concentrated",rank="0",reference="pinned"} 1.0' in text
    assert base.unpin() == ids[2] and base.status() == {"state": "no baseline"}
    assert ("0", "pinned") not in verdict.results


def test_a_reconnect_of_the_same_process_and_a_crash_at_start_keep_the_reference(native, verdict):
    ws = windows_of(only(native, GRAPH))
    v1 = Proc(pid=100)
    for w in ws[:3]:
        v1.send(verdict, w)
    again = Proc(pid=100, incarnation="i101", after=v1)  # the link reconnected: the same pid
    again.send(verdict, ws[3])
    assert _settled(verdict, 4) and not verdict.results
    crashed = Proc(pid=150, after=v1)
    crashed.send(verdict, ws[4])  # one window, 4 replays: never a usable reference
    v2 = Proc(pid=200, after=v1)
    for w in ws[5:7]:
        v2.send(verdict, w)
    assert wait_until(lambda: ("0", "previous") in verdict.results
                      and verdict.results[("0", "previous")].current_windows == 2, timeout=30)
    r = verdict.results[("0", "previous")]
    assert (r.reference_id, r.reference_pid, r.reference_windows) == ("i101", "100", 4) and r.state == "ready"


def test_a_window_no_pool_holds_is_pinned_from_the_store_by_its_rank_tag(native):
    """Window ids are the agent's ``r<n>-w<k>`` (n: the rank's series); a rank the agent dropped and
    made again (a new tag) keeps its reference for the next process."""
    ws = windows_of(only(native, GRAPH))
    store = {}
    v = DeployVerdict(lookup=lambda i: (store[i], None) if i in store else None, max_replays=8)  # a pool keeps 2 windows (8 replays)
    try:
        v1 = Proc(pid=100)
        ids = []
        for w in ws[:4]:
            ids.append(v1.send(v, w))
            store[ids[-1]] = w
        assert _settled(v, 2) and [w.window_id for w in v._ranks["0"].current.windows] == ids[2:]
        assert v.pin(ids[0])  # out of the pool: from the store, alone
        assert v.describe()["rank"] == "0" and v.describe()["windows"] == 1
        assert not v.pin("r9-w1")
        v.unpin()
        v2 = Proc(pid=200)
        v2.series.tag = "r2"  # the agent dropped rank 0's series (keep_gone_s) and made them again
        for w in ws[4:6]:
            v2.send(v, w)
        assert wait_until(lambda: ("0", "previous") in v.results and v.results[("0", "previous")].state == "ready",
                          timeout=30)
        assert v.results[("0", "previous")].reference_pid == "100"
        store["r2-w9"] = ws[6]  # a window of the new series that no pool holds
        assert v.pin("r2-w9") and v.describe()["rank"] == "0" and v.describe()["windows"] == 1
    finally:
        v.stop()


def test_a_window_pinned_from_the_store_brings_its_untraced_rows(native):
    """The trace store keeps each window's untraced rows (graphmon.export.tracestore): a window no pool
    holds any more, pinned from it, is compared with them, not reported absent (issue 36)."""
    from helpers import untraced_rows

    ws = windows_of(only(native, GRAPH))
    p = Proc(pid=100)
    v = DeployVerdict(lookup=lambda i: p.aggregator.store.entry(i.partition("-")[2]), max_replays=8)
    try:
        ids = [p.send(v, w, untraced=untraced_rows(w)) for w in ws[:4]]
        assert _settled(v, 2) and ids[0] not in [w.window_id for w in v._ranks["0"].current.windows]
        assert v.pin(ids[0]) and v.describe()["windows"] == 1  # from the store, alone
        for w in ws[4:6]:
            p.send(v, w, untraced=untraced_rows(w, 1.012))
        assert wait_until(lambda: (r := v.results.get(("0", "pinned"))) is not None and r.current_windows == 2,
                          timeout=30)
        r = v.results[("0", "pinned")]  # pooling: one window of 4 replays is too few for a verdict
        assert r.state == "pooling" and r.reference_windows == 1 and r.untraced_left_out == 0
        assert r.reference_untraced == {GRAPH: 4} and r.current_untraced[GRAPH] >= 8  # the pinned window's own rows
    finally:
        v.stop()


def test_pool_bounds_and_queue_overflow(native):
    t = only(native, GRAPH)
    ws = windows_of(t)
    p = Pool(max_replays=8)
    for i, w in enumerate(ws[:6]):
        p.add(pooled(f"w{i}", w, float(i)))
    assert p.replays() == {f"0/{GRAPH}": 8} and [w.window_id for w in p.windows] == ["w4", "w5"]
    assert p.upto("w4").newest_id == "w4" and p.upto("w0") is None
    assert len(p.trace()) == 2 * 4 * 960
    small = Pool(max_replays=1000, max_bytes=1)
    for i, w in enumerate(ws[:3]):
        small.add(pooled(f"w{i}", w, 0.0))
    assert len(small.windows) == 1  # bytes: only the newest stays
    assert window_replays(native) == {f"0/{n}": 80 for n in native.graph_names()}
    v = DeployVerdict(queue_max=2)
    v._thread = SimpleNamespace()  # no worker: the queue fills
    proc = Proc()
    for w in ws[:5]:
        proc.send(v, w)
    assert v.dropped == 3 and len(v._queue) == 2
    assert "graphmon_deploy_windows_dropped_total 3.0" in metrics(v)
    assert 'graphmon_deploy_computations_total{outcome="ok"} 0.0' in metrics(v)


def test_ranks_are_forgotten_oldest_first_past_the_bounds(native):
    """A reference outlives the rank's series, so the ranks kept are bounded: past max_ranks (or
    max_total_bytes) the rank whose newest window is oldest goes, with its verdicts, counted."""
    ws = windows_of(only(native, GRAPH))
    v = DeployVerdict(max_ranks=2)
    try:
        procs = [Proc(rank=str(r), pid=100 + r) for r in range(3)]
        for i, p in enumerate(procs):
            p.t += i * 100  # rank 0's windows are the oldest
            p.send(v, ws[0])
        assert wait_until(lambda: v.idle and v.ranks_forgotten == 1)
        assert sorted(v._ranks) == ["1", "2"]
        assert "graphmon_deploy_ranks_forgotten_total 1.0" in metrics(v)
        small = DeployVerdict(max_total_bytes=1)  # bytes: only the rank that just pooled stays
        try:
            for p in procs:
                p.send(small, ws[1])
            assert wait_until(lambda: small.idle and small.ranks_forgotten == 2) and list(small._ranks) == ["2"]
        finally:
            small.stop()
    finally:
        v.stop()


def test_the_hook_costs_the_ingest_thread_no_computation(native, verdict):
    ws = windows_of(only(native, GRAPH))
    proc = Proc()
    t0 = time.perf_counter()
    for w in ws[:10]:
        verdict.on_window(proc, window(w))  # the window id comes from the aggregator: none here
    assert time.perf_counter() - t0 < 0.5 and not verdict._queue
    proc.aggregator.ingest(window(ws[0]))
    t0 = time.perf_counter()
    verdict.on_window(proc, window(ws[0]))
    assert time.perf_counter() - t0 < 0.05


def test_the_agent_serves_the_verdict_in_metrics_status_and_trace(native):
    """The wiring: Agent.window_hooks -> the verdict's thread -> /metrics (the agent's render thread,
    the verdict's collector among the agent-level ones), /status "deploy" and /trace/<window>'s
    otherData.deploy; two processes of rank 0 over the real wire, one after the other, the second
    taking the rank's series over (window ids r1-w<k> continue)."""
    import socket

    from fastapi.testclient import TestClient

    from graphmon.export.agent import Agent
    from graphmon.export.agent_http import create_agent_app
    from graphmon.model.wire import encode_message, encode_window
    from graphmon.settings import Settings

    agent = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60).start()
    c = TestClient(create_agent_app(agent, render_interval_s=0.05), client=("127.0.0.1", 5000))
    t = only(native, GRAPH)

    def process(pid, windows):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(agent.socket_path)
        ident = {"rank": "0", "rank_source": "cuda_device", "pid": str(pid), "host": "h", "device": "0",
                 "interval_s": 10.0, "first_window_s": 0.0}
        s.sendall(encode_message("hello", identity=ident, status={"state": "running"}))
        for i, w in enumerate(windows):
            s.sendall(encode_window(window(w, ended_s=time.time() + i)))
        return s

    try:
        v1 = process(100, windows_of(t)[:4])
        assert wait_until(lambda: any(p["pid"] == "100" and p["windows_total"] == 4
                                      for p in c.get("/status").json()["processes"]), timeout=20)
        v1.sendall(encode_message("bye", status={"state": "stopped"}))
        v1.close()
        v2 = process(200, windows_of(widen(t, 0))[:2])
        assert wait_until(lambda: any(d["state"] == "ready" for d in c.get("/status").json()["deploy"]), timeout=30)
        (d,) = c.get("/status").json()["deploy"]
        assert (d["rank"], d["reference_pid"], d["current_pid"], d["regression"]) == ("0", "100", "200", True)
        assert d["current_window"] == "r1-w6" and d["graphs"][0]["kind"] == "uniform"
        c.get("/metrics")  # a scraper: the render thread renders its format every interval from now on
        line = f'graphmon_deploy_regression{{device="0",graph="{GRAPH}",kind="uniform",rank="0",reference="previous"}} 1.0'
        assert wait_until(lambda: line in c.get("/metrics").text)  # the verdict's collector is in the agent's list
        other = c.get("/trace/r1-w6").json()["otherData"]
        assert other["deploy"]["reference_pid"] == "100" and other["deploy"]["graphs"][0]["top"]
        assert "boundaries" not in other  # nothing pinned
        assert "deploy" not in c.get("/trace/r1-w5").json()["otherData"]
        v2.close()
    finally:
        agent.stop()
    assert not c.app.state.deploy._thread.is_alive()  # the agent's stop ends the verdict's thread


# ---------------------------------------------------------------------- untraced replay time (issue 36)
# The wire carrying Window.untraced is the collector's work (issue 36, another layer); these tests
# hand the verdict Windows with untraced rows directly, as the agent's window hook does.
def _untraced_restart(verdict, native, graph, cur_of, f_ref, f_cur, n=6, ref_of=lambda t: t):
    """Two processes of rank 0: the reference runs ``ref_of(trace)`` of ``graph``, the current one
    ``cur_of(trace)``; each window carries untraced durations made from the real replay spans of
    its replays as recorded, x f_ref or x f_cur. n windows each: 4n durations per side."""
    from helpers import untraced_rows

    t = only(native, graph)
    ws, rws, cws = windows_of(t), windows_of(ref_of(t)), windows_of(cur_of(t))
    v1 = Proc(pid=100)
    v2 = Proc(pid=200, after=v1)
    for w, rw in zip(ws[:n], rws[:n]):
        v1.send(verdict, rw, untraced=untraced_rows(w, f_ref))
    assert _settled(verdict, n)
    for w, cw in zip(ws[n:2 * n], cws[n:2 * n]):
        v2.send(verdict, cw, untraced=untraced_rows(w, f_cur))
    assert wait_until(lambda: verdict.results.get(("0", "previous")) is not None
                      and verdict.results[("0", "previous")].current_windows == n, timeout=30)
    r = verdict.results[("0", "previous")]
    assert r.reference_untraced == {graph: 4 * n} == r.current_untraced and r.untraced_left_out == 0
    (g,) = r.verdict.graphs
    return r, g


def _gauges(text, prefix):
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefix + "{")}


def test_a_widening_whose_untraced_time_falls_is_observer_only_and_does_not_page(native, verdict):
    r, g = _untraced_restart(verdict, native, GRAPH, lambda t: widen(t, 0), 1.0, 0.8)
    assert g.widening and g.widening_kind == "uniform" and g.net == "slower"
    assert g.kind == "observer_only" and not g.regression and g.untraced == "faster"
    text = metrics(verdict)
    regs = _gauges(text, "graphmon_deploy_regression")
    assert len(regs) == 4 and set(regs.values()) == {0.0}
    assert set(_gauges(text, "graphmon_deploy_stream_regression").values()) == {0.0}
    (shift,) = _gauges(text, "graphmon_deploy_untraced_shift_seconds").values()
    assert -320e-6 < shift < -280e-6  # 20% of ~1.5 ms
    (st,) = status(verdict)
    assert st["regression"] is False and st["untraced"] == "measured"
    assert st["reference_untraced"] == {GRAPH: 24} and st["untraced_left_out"] == 0
    doc = st["graphs"][0]
    assert doc["kind"] == "observer_only" and doc["untraced"] == "faster" and doc["net"] == "slower"
    assert doc["untraced_replay"]["ci_high_ns"] < 0 and doc["span"]["ci_low_ns"] > 0  # both figures
    assert doc["untraced_rel_shift"] == pytest.approx(-0.2, abs=0.01)


def test_a_widening_whose_untraced_time_rises_too_pages(native, verdict):
    _, g = _untraced_restart(verdict, native, GRAPH, lambda t: widen(t, 0), 1.0, 1.01)
    assert g.regression and g.kind == "uniform" and g.untraced == "slower"
    text = metrics(verdict)
    assert _gauges(text, "graphmon_deploy_regression")[
        f'graphmon_deploy_regression{{device="0",graph="{GRAPH}",kind="uniform",rank="0",reference="previous"}}'] == 1
    assert set(_gauges(text, "graphmon_deploy_stream_regression").values()) == {1.0}


def test_an_untraced_rise_alone_pages_with_its_own_kind(native, verdict):
    _, g = _untraced_restart(verdict, native, GRAPH, lambda t: t, 1.0, 1.012)
    assert not g.widening and g.regression and g.kind == "untraced" and g.untraced == "slower"
    text = metrics(verdict)
    regs = _gauges(text, "graphmon_deploy_regression")
    assert {k.split('kind="')[1].split('"')[0]: v for k, v in regs.items()} == {
        "uniform": 0, "concentrated": 0, "mixed": 0, "untraced": 1}
    assert set(_gauges(text, "graphmon_deploy_stream_regression").values()) == {0.0}  # no stream to point at
    (shift,) = _gauges(text, "graphmon_deploy_untraced_shift_seconds").values()
    assert 15e-6 < shift < 22e-6  # +1.2% of ~1.5 ms
    assert status(verdict)[0]["regression"] is True


def test_the_rollback_with_untraced_durations_still_does_not_page(native, verdict):
    """Issue 35's rollback, the untraced truth beside it: the reference build was 5% slower untraced."""
    r, g = _untraced_restart(verdict, native, GRAPH, lambda t: widen_at(t, 0, 7, [40], 10_000), 1.05, 1.0, n=5,
                             ref_of=lambda t: widen(t, 0, 150))
    assert g.widening and g.net == "faster" and g.untraced == "faster" and not g.regression
    assert not r.verdict.regressions() and set(_gauges(metrics(verdict), "graphmon_deploy_regression").values()) == {0}
