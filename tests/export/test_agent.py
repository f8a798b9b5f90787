"""The agent's health logic and HTTP, driven by hand-made clients on its Unix socket."""

import os
import re
import socket
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
from graphmon.model.trace import Trace
from graphmon.model.window import Window
from graphmon.model.wire import encode_message, encode_window
from graphmon.settings import Settings

from helpers import wait_until

TESTS = Path(__file__).resolve().parents[1]




class Client:
    def __init__(self, agent, rank="0", interval_s=10.0, pid=None):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(agent.socket_path)
        self.ident = {"rank": rank, "rank_source": "RANK", "pid": str(pid or os.getpid()), "host": "h", "device": "0",
                      "uuid": "GPU-1", "pci_bus_id": "00000000:10:00.0", "interval_s": interval_s, "first_window_s": 0.0}
        self.s.sendall(encode_message("hello", identity=self.ident, status={"state": "running"}))

    def heartbeat(self, state="running"):
        self.s.sendall(encode_message("heartbeat", identity=self.ident, status={"state": state}))

    def window(self, n_kernels, n_launches=2):
        corr = np.repeat(np.arange(1, n_launches + 1), n_kernels // n_launches) if n_kernels else np.zeros(0, np.int64)
        t = Trace.build(start_ns=np.arange(1, n_kernels + 1) * 1000, end_ns=np.arange(1, n_kernels + 1) * 1000 + 400,
                        stream=np.full(n_kernels, 7), correlation_id=corr, graph_id=np.full(n_kernels, 1),
                        launches={"correlation_id": np.arange(1, n_launches + 1)})
        self.s.sendall(encode_window(Window(trace=t, started_s=time.time() - 0.1, ended_s=time.time())))


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
        assert wid == "p102-w1"
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


def test_a_process_sampling_status_keeps_known_keys_of_known_types():
    from graphmon.export.agent import _sampling

    got = _sampling({"next_interval_s": 12, "last_traced_ms": 8.5, "cupti_subscribed": False, "idle_unsubscribes": 3,
                     "evil": "x" * 10_000, "next_interval_s_extra": 1.0})
    assert got == {"next_interval_s": 12.0, "last_traced_ms": 8.5, "cupti_subscribed": False, "idle_unsubscribes": 3}
    bad = _sampling({"next_interval_s": float("nan"), "last_traced_ms": True, "cupti_subscribed": "yes",
                     "idle_unsubscribes": -1})
    assert bad == {}
    assert _sampling(["not", "a", "dict"]) == {}


def test_window_hooks_see_every_window_after_the_aggregator(agent):
    seen = []

    def hook(a, w):
        seen.append((a.rank, a.key, a.aggregator.snapshot().windows_total, len(w.trace)))
        raise RuntimeError("a failing hook is counted, the ingest goes on")

    agent.window_hooks.append(hook)
    c = Client(agent, rank="2")
    _proc(agent)
    c.window(8)
    c.window(4)
    assert wait_until(lambda: len(seen) == 2)
    assert seen == [("2", f"p{os.getpid()}", 1, 8), ("2", f"p{os.getpid()}", 2, 4)]
    assert agent.errors["window_hook"] == 2 and agent.snapshots()[0].windows_total == 2


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
