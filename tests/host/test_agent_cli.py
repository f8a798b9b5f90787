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
    sock.parent.mkdir(parents=True)  # the shared volume: the agent never creates it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site")]), GRAPHMON_CUPTI_API="cupti:cupti",
               FAKE_STOP=str(tmp_path / "stop"))
    env.pop("GRAPHMON_AGENT", None)
    state = tmp_path / "state"  # --state-dir: the agent's stop writes the deploy verdict's pools there
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket", str(sock),
                              "--state-dir", str(state)], env=env, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        line = agent.stderr.readline()
        url = "http://127.0.0.1:" + re.search(r":(\d+)/metrics", line).group(1)
        assert f"GRAPHMON_AGENT={sock}" in line
        assert os.stat(sock).st_mode & 0o777 == 0o600
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
        assert [f.name.split(".", 1)[1] for f in state.iterdir()] == ["current.npz"]
    finally:
        for p in (child, agent):
            if p is not None and p.poll() is None:
                p.kill()


def test_agent_bad_flag_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "graphmon.cli", "agent", "--port", "70000"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and r.stderr.startswith("graphmon: error: bad setting --port: ")


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


def _agent_env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    for k in ("GRAPHMON_AGENT", "GRAPHMON_AGENT_ALLOW_UIDS", "GRAPHMON_AGENT_ALLOW_GIDS"):
        if k not in extra:
            env.pop(k, None)
    return env


def test_agent_listens_where_graphmon_agent_says_and_allows_the_groups_given(tmp_path):
    """The sidecar image starts `graphmon agent` with GRAPHMON_AGENT set and no --socket."""
    sock = tmp_path / "agent.sock"
    gid = os.getgid()
    tmp_path.chmod(0o750)  # the group may enter (else the agent warns that its members cannot connect)
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0"], stderr=subprocess.PIPE,
                             text=True, env=_agent_env(GRAPHMON_AGENT=str(sock), GRAPHMON_AGENT_ALLOW_GIDS=str(gid)))
    try:
        line = agent.stderr.readline()
        assert f"GRAPHMON_AGENT={sock} (allowed: uid {os.getuid()}, group {gid})" in line, line
        assert os.stat(sock).st_mode & 0o777 == 0o660 and os.stat(sock).st_gid == gid
        assert sorted(os.listdir(tmp_path)) == ["agent.sock"]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0 and not sock.exists()
    finally:
        if agent.poll() is None:
            agent.kill()
    # --socket wins over the variable
    other = tmp_path / "other.sock"
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket", str(other)],
                             stderr=subprocess.PIPE, text=True, env=_agent_env(GRAPHMON_AGENT=str(sock)))
    try:
        assert f"GRAPHMON_AGENT={other} " in agent.stderr.readline()
    finally:
        agent.kill()
        agent.wait(15)


def test_agent_socket_errors_are_one_line_exit_2(tmp_path):
    missing = tmp_path / "not-mounted"
    cases = {
        f"graphmon: error: agent socket {missing}/agent.sock: directory {missing} does not exist":
            (["--socket", str(missing / "agent.sock")], {}),
        "graphmon: error: GRAPHMON_AGENT_ALLOW_UIDS: 'root' is not a numeric id":
            ([], {"GRAPHMON_AGENT_ALLOW_UIDS": "root"}),
        "graphmon: error: --allow-gid: 'x' is not a numeric id": (["--allow-gid", "1,x"], {}),
        f"graphmon: error: --state-dir {missing}/file: ": (["--state-dir", str(missing / "file")],
                                                          {"_MAKE_FILE": str(missing)}),
    }
    for expected, (flags, env) in cases.items():
        if env.pop("_MAKE_FILE", None):  # a state dir under a plain file: cannot be made
            missing.write_text("a file, not a directory")
        r = subprocess.run([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", *flags], capture_output=True,
                           text=True, timeout=60, env=_agent_env(**env))
        assert r.returncode == 2 and r.stderr.startswith(expected) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert missing.is_file()


def test_sighup_keeps_the_agent_and_reloads_its_token_file_and_sigterm_removes_the_socket(tmp_path):
    """SIGHUP (a closed terminal, a supervisor's reload) used to end the agent with its socket left
    behind; it reloads the token file and web config, logs it, and the agent keeps serving."""
    sock, token = tmp_path / "agent.sock", tmp_path / "token"
    token.write_text("first\n")
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket", str(sock),
                              "--token-file", str(token), "--cardinality", "low", "--max-devices", "4",
                              "--no-expect-processes", "--log-format", "logfmt"],
                             stderr=subprocess.PIPE, text=True, env=_agent_env())
    try:
        line = agent.stderr.readline()
        assert line.startswith("time=") and " level=info logger=graphmon " in line, line
        url = "http://127.0.0.1:" + re.search(r":(\d+)/metrics", line).group(1)
        status = httpx.get(url + "/status", timeout=5).json()
        assert (status["config"]["cardinality"], status["config"]["max_devices"], status["expect_processes"]) == \
            ("low", 4, False)
        assert re.search(r"^graphmon_agent_expects_processes 0\.0$", httpx.get(url + "/metrics", timeout=5).text, re.M)

        def trace(tok):  # a protected endpoint: 401 without the right token, 404 (no such window) with it
            return httpx.get(url + "/trace/x", headers={"Authorization": f"Bearer {tok}"}, timeout=5).status_code

        assert (trace("first"), trace("second")) == (404, 401)
        token.write_text("second")
        agent.send_signal(signal.SIGHUP)
        assert "SIGHUP: reloaded the token file and web config (token)" in agent.stderr.readline()
        assert agent.poll() is None and httpx.get(url + "/healthz", timeout=5).status_code == 200
        assert (trace("first"), trace("second")) == (401, 404)
        assert sock.exists()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0 and not sock.exists()
    finally:
        if agent.poll() is None:
            agent.kill()


def test_a_bad_web_config_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "web.yml"
    cfg.write_text("basic_auth_users:\n  alice: hunter2\n")
    r = subprocess.run([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket",
                        str(tmp_path / "a.sock"), "--web.config.file", str(cfg)], capture_output=True, text=True,
                       timeout=60, env=_agent_env())
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"graphmon: error: web config {cfg}: basic_auth_users: ")
    assert "must be a bcrypt hash" in r.stderr and not (tmp_path / "a.sock").exists()
