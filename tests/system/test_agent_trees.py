"""`graphmon run` as the agent over process trees shaped like real engines (fake torch + fake CUPTI).

Exactly the processes that capture and replay graphs attach; one port; rank/device labels right;
a killed worker shows up in /status and the health metrics within a window interval; the hook
folder and the socket are gone when the run ends."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
INTERVAL_S = 0.3


class Run:
    def __init__(self, tmp_path, *cmd, extra=()):
        self.tmp = tmp_path
        self.stop_file = tmp_path / "stop"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site")]), GRAPHMON_CUPTI_API="cupti:cupti",
                   FAKE_STOP=str(self.stop_file), TMPDIR=str(tmp_path))
        env.pop("GRAPHMON_AGENT", None)
        for v in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
            env.pop(v, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "graphmon.cli", "run", "--port", "0", "--interval-s", str(INTERVAL_S), "--max-traced-share", "1",
             "--window-launches", "4", *extra, "--", sys.executable, "-m", "fake_engine", *cmd],
            env=env, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
        line = self.proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m, line
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def status(self):
        return httpx.get(self.url + "/status", timeout=5).json()

    def metrics(self):
        return httpx.get(self.url + "/metrics", timeout=5).text

    def wait(self, pred, timeout=45.0):
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < timeout:
            last = self.status()
            if pred(last):
                return last
            time.sleep(0.1)
        raise AssertionError(f"condition not met; last /status processes: {last and last['processes']}")

    def finish(self):
        self.stop_file.touch()
        try:
            rc = self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return rc


def _tcp(p):
    try:
        return p.net_connections(kind="tcp") if hasattr(p, "net_connections") else p.connections(kind="tcp")
    except Exception:  # exited meanwhile
        return []


def _running(n):
    return lambda s: sum(p["state"] == "running" and p["records_total"] > 0 for p in s["processes"]) >= n


@pytest.mark.parametrize("shape, n", [("vllm", 2), ("sglang", 2), ("torchrun", 2)])
def test_only_graph_processes_attach_with_ranks_and_devices(tmp_path, shape, n):
    r = Run(tmp_path, shape, str(n))
    try:
        s = r.wait(_running(n))
        time.sleep(3 * INTERVAL_S)  # late attachers (the API server, engine core, detokenizer) would show now
        s = r.status()
        procs = s["processes"]
        assert sorted(p["rank"] for p in procs) == [str(i) for i in range(n)]
        assert sorted(p["device"] for p in procs) == [str(i) for i in range(n)]
        assert len({p["pid"] for p in procs}) == n and str(r.proc.pid) not in {p["pid"] for p in procs}
        for p in procs:
            assert p["uuid"] == f"GPU-00000000-0000-0000-0000-{int(p['device']):012d}"
            assert p["pci_bus_id"] == f"00000000:{0x10 + int(p['device']):02X}:00.0"
            assert p["last_window_age_s"] < 5
            # the tracing budget's choice, as the process reported it (max_traced_share 1 here: interval_s)
            assert p["sampling"]["next_interval_s"] >= INTERVAL_S and p["sampling"]["last_traced_ms"] > 0
            assert p["sampling"]["cupti_subscribed"] is True and p["sampling"]["idle_unsubscribes"] == 0  # the default
        text = r.metrics()
        for i in range(n):
            assert f'graphmon_up{{rank="{i}"}} 1.0' in text
            assert re.search(rf'graphmon_process_info\{{device="{i}",host="[^"]+",pid="\d+",rank="{i}",state="running"\}} 1.0', text)
            assert re.search(rf'graphmon_kernel_gap_seconds_count\{{.*rank="{i}".*\}} [1-9]', text)
        assert text.count("# TYPE graphmon_up gauge") == 1  # each family once, samples of every process
        # one port: the agent's; no process of the tree listens on TCP (the old hook gave each one a port)
        import psutil

        tree = psutil.Process(r.proc.pid).children(recursive=True)
        assert len(tree) > n
        assert not [c for p in tree for c in _tcp(p) if c.status == psutil.CONN_LISTEN]
        assert 'graphmon_processes{state="running"} 2.0' in text
    finally:
        assert r.finish() == 0
    assert not list(tmp_path.glob("graphmon-hook-*")) and not list(tmp_path.glob("graphmon-agent-*"))


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_children_without_local_rank_attach_for_every_start_method(tmp_path, method):
    # The old hook attached only the parent (GRAPHMON_ATTACHED_LOCAL_RANK="") and skipped these.
    r = Run(tmp_path, "plain", "2", method)
    try:
        s = r.wait(_running(2))
        assert len({p["pid"] for p in s["processes"]}) == 2
        # no rank given anywhere: the CUDA device ordinal (never the pid: a restart would start new series)
        assert sorted(p["rank"] for p in s["processes"]) == ["0", "1"]
    finally:
        assert r.finish() == 0


def test_killed_worker_is_lost_within_a_window_interval(tmp_path):
    r = Run(tmp_path, "torchrun", "2")
    try:
        s = r.wait(_running(2))
        victim = next(p for p in s["processes"] if p["rank"] == "1")
        os.kill(int(victim["pid"]), signal.SIGKILL)
        t0 = time.monotonic()
        s = r.wait(lambda s: any(p["rank"] == "1" and p["state"] == "lost" for p in s["processes"]), timeout=10)
        assert time.monotonic() - t0 < INTERVAL_S + 1.0  # detection is the socket closing: not a timeout
        text = r.metrics()
        assert "graphmon_processes_lost_total 1.0" in text
        assert 'graphmon_up{rank="1"} 0.0' in text and 'graphmon_up{rank="0"} 1.0' in text
        assert 'graphmon_processes{state="lost"} 1.0' in text
        assert re.search(r'graphmon_process_info\{[^}]*rank="1",state="lost"\} 1.0', text)
    finally:
        r.finish()
