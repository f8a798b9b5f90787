"""The agent's health logic and HTTP, driven by hand-made clients on its Unix socket."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from graphmon.export.agent import Agent
from graphmon.export.agent_http import render_metrics, serve_background
from graphmon.host.launch import HookDir
from graphmon.settings import Settings

from helpers import AgentClient, wait_until

TESTS = Path(__file__).resolve().parents[1]




def Client(agent, **kw):
    return AgentClient(agent.socket_path, **kw)


@pytest.fixture
def agent():
    a = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60).start()
    yield a
    a.stop()


def _proc(agent):
    assert wait_until(lambda: bool(agent.processes))
    return agent.attached()[0]


def test_window_with_launches_and_no_records_degrades_until_records_flow(agent):
    c = Client(agent)
    a = _proc(agent)
    c.window(0, n_launches=3)
    assert wait_until(lambda: a.health().state == "degraded")
    assert a.health().reason.startswith("no_records")
    assert wait_until(lambda: agent.snapshots()[0].windows_total == 1)  # the snapshot follows the ingest
    text = render_metrics(agent).decode()
    assert 'graphmon_empty_windows_total{rank="0",reason="no_records"} 1.0' in text
    assert 'graphmon_up{rank="0"} 0.0' in text and 'graphmon_processes{state="degraded"} 1.0' in text
    c.window(8)
    assert wait_until(lambda: a.health().state == "running")
    assert wait_until(lambda: 'graphmon_up{rank="0"} 1.0' in render_metrics(agent).decode())


def test_process_without_windows_is_degraded_and_counted_once(agent):
    c = Client(agent, interval_s=0.05)
    a = _proc(agent)
    for _ in range(20):
        c.heartbeat()
        time.sleep(0.02)
    assert a.health().state == "degraded" and a.health().reason.startswith("no_windows")
    assert agent.empty_total["no_windows"]["0"] == 1


def test_silent_process_is_lost():
    ag = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=0.3).start()
    try:
        c = Client(ag)  # noqa: F841  (kept open and silent)
        a = _proc(ag)
        assert wait_until(lambda: a.health().state == "lost")
        assert ag.lost_total == 1 and "heartbeat" in a.health().reason
    finally:
        ag.stop()


def test_two_processes_claiming_one_rank_get_distinct_series(agent):
    clients = [Client(agent, rank="0", pid=11), Client(agent, rank="0", pid=12)]  # noqa: F841  (kept open)
    assert wait_until(lambda: len(agent.processes) == 2)
    ranks = sorted(a.rank for a in agent.attached())
    assert ranks[0] == "0" and ranks[1].startswith("0@")


def test_process_status_gives_each_graph_its_untraced_replay_time(agent):
    """The agent's per-process /status: each graph of the last window with its untraced replay
    time (the rank's aggregator is given the rows: carrying them on the wire is the collector's)."""
    from graphmon.model.window import Window

    c = Client(agent, rank="0", pid=21)  # noqa: F841 (kept open)
    a = _proc(agent)
    c.window(8)
    assert wait_until(lambda: agent.snapshots() and agent.snapshots()[0].records_total == 8)
    graphs = agent.process_status()[0]["graphs"]
    assert graphs and all(g["untraced_replay_seconds"] is None for g in graphs)
    trace = agent.snapshots()[0].last_analysis.trace
    a.aggregator.ingest(Window(trace=trace, started_s=time.time() - 1, ended_s=time.time(),
                               untraced={"graph": np.zeros(3, np.int32),
                                         "duration_ns": np.array([200_000, 300_000, 700_000], np.int64)}))
    wid = f"{a.series.tag}-{a.aggregator.snapshot().windows[-1]}"
    kept, rows = agent.window_lookup(wid)  # the trace store keeps them for ?format=graphmon and /baseline
    assert kept is agent.trace_lookup(wid) is trace and rows["duration_ns"].tolist() == [200_000, 300_000, 700_000]
    (g,) = [g for g in agent.process_status()[0]["graphs"] if g["graph"] == trace.graph_names()[0]]
    assert g["untraced_replay_seconds"] == pytest.approx(
        {"count": 3, "mean": 4e-4, "p10": 2.2e-4, "p50": 3e-4, "p90": 6.2e-4, "p99": 6.92e-4}, rel=1e-9)


def test_four_ranks_on_one_agent_http(agent):
    clients = [Client(agent, rank=str(r), pid=100 + r) for r in range(4)]
    assert wait_until(lambda: len(agent.processes) == 4)
    for c in clients:
        c.window(8)
    assert wait_until(lambda: all(s.records_total == 8 for s in agent.snapshots()))
    server, thread, port = serve_background(agent, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}"
        text = httpx.get(url + "/metrics", timeout=5).text
        for fam in ("graphmon_up", "graphmon_kernel_gap_seconds", "graphmon_process_info", "graphmon_records_total"):
            assert text.count(f"# HELP {fam} ") == 1, fam
        assert [int(r) for r in re.findall(r'graphmon_up\{rank="(\d)"\} 1.0', text)] == [0, 1, 2, 3]
        st = httpx.get(url + "/status", timeout=5).json()
        assert [p["rank"] for p in st["processes"]] == ["0", "1", "2", "3"]
        wid = st["processes"][2]["windows"][0]
        assert re.fullmatch(r"r\d+-w1", wid)  # the rank's series tag, never a pid
        assert agent.trace_lookup(wid) is agent.attached()[2].store.get("w1") is not None
        r = httpx.get(f"{url}/trace/{wid}", params={"format": "graphmon"}, timeout=5)
        assert r.status_code == 200
        for c in clients:
            c.s.close()
        assert wait_until(lambda: agent.lost_total == 4)
        r = httpx.post(url + "/capture", json={"replays": 2}, timeout=5)
        assert r.status_code == 409 and "no process" in r.text
    finally:
        server.should_exit = True
        thread.join(5)


def test_hook_folder_holds_only_the_hook_and_links(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    h = HookDir()
    try:
        assert sorted(os.listdir(h.path)) == ["fallback", "graphmon", "sitecustomize.py"]
        assert os.path.islink(os.path.join(h.path, "sitecustomize.py")) and os.path.islink(os.path.join(h.path, "graphmon"))
        fb = set(os.listdir(h.fallback))
        assert "numpy" in fb and all(os.path.islink(os.path.join(h.fallback, f)) for f in fb)
        assert not fb & {"fastapi", "uvicorn", "prometheus_client", "starlette", "site-packages"}
        env = h.env("/nonexistent.sock", {"interval_s": 1.0, "port": 5})
        code = ("import sys, numpy; print(sys.path.index(sys.argv[1]), sys.path[-1] == sys.argv[2], "
                "numpy.__file__.startswith(sys.argv[2]))")
        out = subprocess.run([sys.executable, "-c", code, h.path, h.fallback], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        # hook folder first; graphmon's fallback last; the environment's own numpy wins
        assert out == ["1", "True", "False"] or out == ["0", "True", "False"]
        assert '"port"' not in env["GRAPHMON_ATTACH_JSON"]
    finally:
        h.cleanup()
    assert not os.path.exists(h.path)
    assert os.path.exists(os.path.dirname(np.__file__))  # cleanup removed links, not their targets


def test_record_through_the_agent_writes_one_file_per_rank(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS), str(TESTS / "fake_site")]), GRAPHMON_CUPTI_API="cupti:cupti",
               FAKE_STOP=str(tmp_path / "never"), TMPDIR=str(tmp_path))
    env.pop("GRAPHMON_AGENT", None)
    out = tmp_path / "rec.graphmon.npz"
    # workers run until FAKE_STOP exists: stop them once both files are written
    p = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "record", "-o", str(out), "--windows", "2",
                          "--interval-s", "0.1", "--max-traced-share", "1", "--window-launches", "4", "--", sys.executable, "-m", "fake_engine",
                          "torchrun", "2"], env={**env, "FAKE_STOP": str(tmp_path / "stop")}, stderr=subprocess.PIPE,
                         text=True)
    try:
        from graphmon.formats.read import read_trace

        files = [tmp_path / f"rec.rank{r}.graphmon.npz" for r in (0, 1)]
        assert wait_until(lambda: all(f.exists() for f in files), timeout=60), p.stderr and os.listdir(tmp_path)
        for f in files:
            t = read_trace(str(f))
            assert t.meta["windows"] == 2 and len(t) > 0
        (tmp_path / "stop").touch()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()


# ---------------------------------------------------------------------- a sender's values (issue 31 item 2)
def _app(agent):
    from fastapi.testclient import TestClient

    from graphmon.export.agent_http import create_agent_app

    return TestClient(create_agent_app(agent, render_interval_s=0.05), client=("127.0.0.1", 50000))


@pytest.mark.parametrize("status", [
    {"state": "running", "errors": ["x"]}, {"state": "running", "errors": "boom"},
    {"state": "running", "errors": {"flush": 10**400}}, {"state": "running", "link": 5},
    {"state": "running", "errors": {"flush": -7}}, {"state": "running", "errors": {"flush": 1.5}},
])
def test_a_malformed_status_breaks_no_scrape_and_is_counted(agent, status):
    """Old code: a heartbeat whose errors is a list made /metrics and /status answer 500 for
    every process (for the 600 s a departed one is kept); 10**400 made /metrics 500; link: 5
    made /status 500; -7 and 1.5 were exported as a negative or fractional counter."""
    good, bad = Client(agent, rank="0", pid=1), Client(agent, rank="1", pid=2)
    assert wait_until(lambda: len(agent.processes) == 2)
    good.window(8)
    bad.heartbeat(**{k: v for k, v in status.items() if k != "state"})
    assert wait_until(lambda: agent.listener.frames_rejected["status"] == 1)
    good.window(8)
    assert wait_until(lambda: agent.snapshots()[0].records_total == 16)
    c = _app(agent)
    r = c.get("/metrics")
    assert r.status_code == 200
    assert 'graphmon_records_total{rank="0"} 16.0' in r.text and 'graphmon_up{rank="1"}' in r.text
    assert 'graphmon_agent_frames_rejected_total{reason="status"} 1.0' in r.text
    for line in r.text.splitlines():
        if line.startswith("graphmon_collector_errors_total"):
            v = float(line.rsplit(" ", 1)[1])
            assert v >= 0 and v == int(v), line
    st = c.get("/status")
    assert st.status_code == 200 and {p["rank"] for p in st.json()["processes"]} == {"0", "1"}
    bad.s.close()  # departed, kept: still no 500
    assert wait_until(lambda: agent.lost_total == 1)
    assert c.get("/metrics").status_code == 200 and c.get("/status").status_code == 200


@pytest.mark.parametrize("header", [{"dropped": 10**400}, {"invalid": {"partial_replay": 10**400}},
                                    {"ended_s": 1e300}, {"traced_s": -1}])
def test_a_window_with_an_out_of_range_field_is_dropped_and_counted(agent, header):
    c = Client(agent, rank="0")
    c.window(8, **header)
    c.window(8)
    a = _proc(agent)
    assert wait_until(lambda: a.series.dropped["invalid"] == 1 and agent.snapshots()[0].records_total == 8)
    assert agent.listener.frames_rejected["window"] == 1
    assert _app(agent).get("/metrics").status_code == 200


def test_invented_invalid_reasons_fold_into_one_series(agent):
    """Old code: 64 invented reasons per window gave 3,214 series after 50 windows."""
    c = Client(agent, rank="0")
    _proc(agent)
    for w in range(50):
        c.window(8, invalid={f"made_up_{w}_{i}": 1 for i in range(63)} | {"duplicate": 2})
        assert wait_until(lambda: agent.snapshots()[0].windows_total == w + 1)
    text = render_metrics(agent).decode()
    reasons = re.findall(r'graphmon_records_invalid_total\{rank="0",reason="([^"]+)"\}', text)
    from graphmon.model.invalid import INVALID_REASONS

    assert set(reasons) == set(INVALID_REASONS) | {"other"}
    assert 'graphmon_records_invalid_total{rank="0",reason="other"} 3150.0' in text
    assert 'graphmon_records_invalid_total{rank="0",reason="duplicate"} 100.0' in text


# ---------------------------------------------------------------------- link counters (item 11)
def test_link_drops_and_reconnects_are_counters_per_rank_that_survive_reconnects(agent):
    c = Client(agent, rank="0", pid=77)
    c.heartbeat(link={"windows_sent": 3, "windows_dropped": 5, "reconnects": 2})
    assert wait_until(lambda: 'graphmon_link_windows_dropped_total{rank="0"} 5.0' in render_metrics(agent).decode())
    text = render_metrics(agent).decode()
    assert 'graphmon_link_reconnects_total{rank="0"} 2.0' in text
    c.close()  # the same process reconnects: its totals continue, nothing counted twice
    assert wait_until(lambda: agent.lost_total == 1)
    c = Client(agent, rank="0", pid=77)
    c.heartbeat(link={"windows_dropped": 6, "reconnects": 3})
    assert wait_until(lambda: 'graphmon_link_reconnects_total{rank="0"} 3.0' in render_metrics(agent).decode())
    assert 'graphmon_link_windows_dropped_total{rank="0"} 6.0' in render_metrics(agent).decode()
    c.bye()
    c.close()  # a new process of the rank starts from 0: added, never a decrease
    assert wait_until(lambda: all(a.gone_s is not None for a in agent.attached()))
    c = Client(agent, rank="0", pid=78)
    c.heartbeat(link={"windows_dropped": 1, "reconnects": 0})
    assert wait_until(lambda: 'graphmon_link_windows_dropped_total{rank="0"} 7.0' in render_metrics(agent).decode())
    c.close()


# ---------------------------------------------------------------------- one series per rank (issue 27 item 1)
def _lines(text, prefix):
    return [x for x in text.splitlines() if x.startswith(prefix)]


def test_a_successor_with_the_same_rank_continues_the_series(agent):
    """Old code: a restarted process got new series (its rank was pid-based, or its counters
    restarted from 0), and the departed process's series stayed beside them for 600 s."""
    v1 = Client(agent, rank="0", pid=1546)
    _proc(agent)
    for _ in range(3):
        v1.window(8)
    assert wait_until(lambda: agent.snapshots()[0].records_total == 24)
    v1.bye()
    v1.close()
    assert wait_until(lambda: agent.snapshots()[0].health.state == "stopped")
    text = render_metrics(agent).decode()
    assert _lines(text, "graphmon_up{") == ['graphmon_up{rank="0"} 0.0']  # kept, down
    v2 = Client(agent, rank="0", pid=1545)
    assert wait_until(lambda: agent.attached()[0].proc.identity.get("pid") == "1545")
    v2.window(8)
    assert wait_until(lambda: agent.snapshots()[0].records_total == 32)  # continued, not reset
    text = render_metrics(agent).decode()
    assert _lines(text, "graphmon_up{") == ['graphmon_up{rank="0"} 1.0']  # one line
    assert _lines(text, "graphmon_records_total{") == ['graphmon_records_total{rank="0"} 32.0']
    assert _lines(text, "graphmon_windows_total{") == ['graphmon_windows_total{rank="0"} 4.0']
    info = _lines(text, "graphmon_process_info{")
    assert len(info) == 1 and 'pid="1545"' in info[0]  # the pid stays on process_info
    assert len(_lines(text, "graphmon_kernel_gap_seconds_count{")) == 1
    (a,) = agent.attached()
    assert a.rank == "0" and a.incarnation != "" and a.proc.identity["pid"] == "1545"
    v2.close()


def test_a_live_duplicate_rank_gets_the_lowest_free_suffix_and_never_a_pid(agent):
    a = Client(agent, rank="0", pid=11)
    assert wait_until(lambda: len(agent.processes) == 1)  # the first to say hello gets the rank
    b = Client(agent, rank="0", pid=12)
    assert wait_until(lambda: len(agent.processes) == 2)
    assert sorted(x.rank for x in agent.attached()) == ["0", "0@2"]
    b.window(8)
    assert wait_until(lambda: [s.records_total for s in agent.snapshots()] == [0, 8])
    b.bye()
    b.close()
    assert wait_until(lambda: any(x.gone_s for x in agent.attached()))
    c = Client(agent, rank="0", pid=13)  # the duplicate restarts: it takes "0@2" over
    assert wait_until(lambda: any(x.proc.identity.get("pid") == "13" for x in agent.attached()))
    assert sorted(x.rank for x in agent.attached()) == ["0", "0@2"]
    c.window(8)
    assert wait_until(lambda: [s.records_total for s in agent.snapshots()] == [0, 16])
    a.close()
    c.close()


def test_a_departed_rank_is_dropped_after_keep_gone_s_and_its_traces_freed():
    ag = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60, keep_gone_s=0.3).start()
    try:
        c = Client(ag, rank="3")
        c.window(8)
        assert wait_until(lambda: ag.snapshots() and ag.snapshots()[0].records_total == 8)
        assert ag.traces.nbytes > 0
        c.bye()
        c.close()
        assert wait_until(lambda: not ag.processes and not ag.ranks)
        assert ag.ranks_dropped["expired"] == 1 and ag.traces.nbytes == 0
        assert 'rank="3"' not in render_metrics(ag).decode()
    finally:
        ag.stop()


def test_ranks_without_a_process_are_capped():
    ag = Agent(Settings(port=0), tick_s=0.02, heartbeat_lost_s=60, max_gone_ranks=3).start()
    try:
        for r in range(8):
            c = Client(ag, rank=f"r{r}")
            c.bye()
            c.close()
            assert wait_until(lambda: f"r{r}" in ag.ranks and ag.ranks[f"r{r}"].gone_s is not None)
        assert wait_until(lambda: len(ag.ranks) == 3)
        assert ag.ranks_dropped["cap"] == 5
        assert sorted(ag.ranks) == ["r5", "r6", "r7"]  # the ones that left last
    finally:
        ag.stop()


def test_window_hooks_see_rank_incarnation_and_identity_and_their_errors_are_counted(agent):
    seen = []
    agent.window_hooks.append(lambda a, w: seen.append((a.rank, a.incarnation, a.proc.identity["pid"], len(w.trace))))
    agent.window_hooks.append(lambda a, w: 1 / 0)
    c = Client(agent, rank="2", pid=99)
    c.window(8)
    assert wait_until(lambda: len(seen) == 1)
    c.bye()
    c.close()
    assert wait_until(lambda: all(a.gone_s for a in agent.attached()))
    c = Client(agent, rank="2", pid=100)
    c.window(6)
    assert wait_until(lambda: len(seen) == 2)
    (r1, i1, p1, n1), (r2, i2, p2, n2) = seen
    assert (r1, p1, n1, r2, p2, n2) == ("2", "99", 8, "2", "100", 6) and i1 != i2
    assert agent.errors["window_hook"] == 2
    assert agent.snapshots()[0].records_total == 14  # a failing hook costs no data
    c.close()


# ---------------------------------------------------------------------- a burst (issue 31 item 5)
def test_a_burst_of_short_lived_processes_does_not_starve_a_live_one():
    """Old code re-rendered /metrics for every process on each connect and close, on the reader
    threads, under one lock: a healthy process's heartbeats went unread, it was declared lost
    4-7 times and its counters reset."""
    import threading

    ag = Agent(Settings(port=0), tick_s=0.05, heartbeat_lost_s=2.0).start()
    from graphmon.export.agent_http import create_agent_app

    metrics = create_agent_app(ag, render_interval_s=0.2).state.agent_metrics
    try:
        live = Client(ag, rank="live", pid=1)
        stop = threading.Event()
        sent = [0]

        def beat():
            while not stop.is_set():
                live.window(8)
                sent[0] += 8
                live.heartbeat()
                time.sleep(0.1)

        t = threading.Thread(target=beat)
        t.start()
        metrics.body("openmetrics")  # a scraper: the render thread renders this format from now on
        t0 = time.monotonic()
        for i in range(300):
            c = AgentClient(ag.socket_path, rank=f"burst{i}", pid=1000 + i)
            if i % 2:
                c.bye()
            c.close()
        time.sleep(1.0)
        stop.set()
        t.join()
        # rendered by the render thread (and the first scrape), at most once per interval
        assert metrics.render_threads <= {"MainThread", "graphmon-agent-render"}
        assert 2 <= metrics.renders <= (time.monotonic() - t0) / 0.2 + 2
        live_a = next(a for a in ag.attached() if a.rank == "live")
        assert wait_until(lambda: live_a.aggregator.snapshot().records_total == sent[0], timeout=20)
        assert ag.lost_total == 150 and live_a.gone_s is None  # only the burst's unannounced closes
    finally:
        ag.stop()


def test_the_agent_limits_malloc_arenas_unless_told(monkeypatch):
    import platform

    from graphmon.export.agent import limit_malloc_arenas

    if platform.libc_ver()[0] == "glibc":
        assert limit_malloc_arenas() is True
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False  # the operator's setting wins


def test_record_of_one_process_without_a_launcher_rank_writes_the_file_named(tmp_path):
    """Its rank comes from the CUDA device (not from a launcher): one process, one file, as named."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS), str(TESTS / "fake_site")]),
               GRAPHMON_CUPTI_API="cupti:cupti", TMPDIR=str(tmp_path), FAKE_STOP=str(tmp_path / "stop"))
    for v in ("GRAPHMON_AGENT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(v, None)
    out = tmp_path / "rec.graphmon.npz"
    p = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "record", "-o", str(out), "--windows", "2",
                          "--interval-s", "0.1", "--max-traced-share", "1", "--window-launches", "4", "--",
                          sys.executable, "-m", "fake_engine", "plain", "1"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(out.exists, timeout=60), os.listdir(tmp_path)
        (tmp_path / "stop").touch()
        assert p.wait(30) == 0
        assert not list(tmp_path.glob("rec.rank*"))
    finally:
        if p.poll() is None:
            p.kill()
