"""`graphmon agent` standalone (sidecar): a process that calls graphmon.attach() with
GRAPHMON_AGENT set sends its windows there; SIGTERM stops the agent and removes its socket."""

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from helpers import wait_until

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

CHILD = """
    import os, time, graphmon, torch
    lc = graphmon.attach(interval_s=0.1, first_window_s=0.0, window_launches=4, max_traced_share=1.0)
    assert type(lc).__name__ == "LightCollector", lc
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    t0 = time.monotonic()
    while not os.path.exists(os.environ["FAKE_STOP"]) and time.monotonic() - t0 < 60:
        g.replay(); time.sleep(0.002)
"""


def test_standalone_agent_serves_an_in_code_attach(tmp_path):
    sock = tmp_path / "run" / "graphmon" / "agent.sock"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site")]), GRAPHMON_CUPTI_API="cupti:cupti",
               FAKE_STOP=str(tmp_path / "stop"))
    env.pop("GRAPHMON_AGENT", None)
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket", str(sock)],
                             env=env, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        line = agent.stderr.readline()
        url = "http://127.0.0.1:" + re.search(r":(\d+)/metrics", line).group(1)
        assert f"GRAPHMON_AGENT={sock}" in line
        assert os.stat(sock.parent).st_mode & 0o777 == 0o700
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD)], env={**env, "GRAPHMON_AGENT": str(sock)})
        assert wait_until(lambda: any(p["records_total"] > 0 for p in httpx.get(url + "/status", timeout=5).json()["processes"]),
                          timeout=30)
        (tmp_path / "stop").touch()
        assert child.wait(30) == 0
        st = httpx.get(url + "/status", timeout=5).json()
        assert [p["state"] for p in st["processes"]] == ["stopped"] and st["processes_lost_total"] == 0
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0
        assert not sock.exists()
    finally:
        for p in (child, agent):
            if p is not None and p.poll() is None:
                p.kill()


def test_agent_bad_flag_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "graphmon.cli", "agent", "--port", "70000"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and r.stderr.startswith("graphmon: error: bad setting port")


def test_run_on_a_taken_port_is_one_line_exit_2():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        r = subprocess.run([sys.executable, "-m", "graphmon.cli", "run", "--port", str(s.getsockname()[1]), "--", "true"],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        s.close()
    assert r.returncode == 2 and r.stderr.startswith("graphmon: error: ") and len(r.stderr.strip().splitlines()) == 1
