"""README's command lines run as written against `graphmon serve` (issue 28 item 5).

Every line of README's ```bash blocks, every `graphmon ...` / `curl ...` code span in its prose
and every `curl ...` in a bash comment is executed in README order, in a shell, from a folder where
README's example file names exist (copies of tests/data traces), with only these substitutions:

- `graphmon serve` listens where GRAPHMON_PORT says (a free port: the documented variable), and
  `localhost:9479` in a command becomes that port;
- curl gets `--fail-with-body -sS` (an HTTP error then fails the command instead of printing a body);
- a `<...>` placeholder becomes a real trace id: a window from /status when it says so, else the
  last capture's answer.

Commands that cannot run here are listed in SKIP with the reason; a README command that is neither
skipped nor runs with exit 0 fails the test, so README and the code cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from helpers import DATA, KINETO

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NSYS = DATA / "h200-cupti-decode-subset.nsys.sqlite"
FILES = {"trace.json.gz": KINETO, "report.sqlite": NSYS, "before.sqlite": NSYS, "after.sqlite": NSYS}
SKIP = {
    "python3 -m venv .venv && . .venv/bin/activate": "makes a virtual environment (the test runs in one)",
    "./scripts/test.sh": "runs the whole test suite, this test included",
    "graphmon run -- vllm serve meta-llama/Llama-3.1-8B -tp 2": "GPU: vLLM on two GPUs",
    "graphmon record -o t.graphmon.npz -- CMD": "GPU: CMD is a placeholder for a program that captures CUDA graphs",
    "graphmon agent --socket /run/graphmon/agent.sock": "a sidecar that runs until stopped (tests/deploy run it)",
}
SERVE = "pip install . && graphmon serve"  # installs (done: the test runs installed) and starts the demo


def _strip_comment(line: str) -> tuple[str, str]:
    """(command, comment): a '#' outside quotes that starts a word begins the comment."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip(), line[i + 1 :].strip()
    return line.strip(), ""


def readme_commands(text: str) -> list[str]:
    """Command lines in README order. A prose code span of `graphmon` and a subcommand alone
    (`graphmon serve`, `graphmon ab`) names a command and is not one; a span may wrap lines."""
    out: list[str] = []
    in_bash = False
    prose: list[str] = []

    def flush() -> None:
        for m in re.findall(r"`((?:graphmon|curl) [^`]+)`", " ".join(prose)):
            cmd = " ".join(m.split())
            if cmd.startswith("curl ") or len(cmd.split()) > 2:
                out.append(cmd)
        prose.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            in_bash = line.strip() == "```bash"
            continue
        if in_bash:
            cmd, comment = _strip_comment(line)
            if cmd:
                out.append(cmd)
            out.extend(m.strip() for m in re.findall(r"curl [^;`]+", comment))
        elif line.strip():
            prose.append(line)
        else:
            flush()
    flush()
    return out


def test_readme_commands_are_found():
    cmds = readme_commands(README.read_text())
    assert SERVE in cmds and "curl localhost:9479/metrics" in cmds
    assert "curl -X POST localhost:9479/capture" in cmds
    assert any(c.startswith("graphmon compare ") for c in cmds) and "graphmon run --help" in cmds
    assert "graphmon serve" not in cmds and "graphmon ab" not in cmds  # names of commands, in prose
    assert set(SKIP) <= set(cmds)  # a skip that README no longer has is stale


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("curl") is None, reason="README's HTTP commands are curl lines: no curl here")
def test_every_readme_command_runs_as_written(tmp_path):
    for name, src in FILES.items():
        shutil.copy(src, tmp_path / name)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHMON_")}
    env.update(GRAPHMON_PORT=str(port), PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    base = f"http://127.0.0.1:{port}"
    server = None
    last_capture = None
    ran = []
    try:
        for cmd in readme_commands(README.read_text()):
            if cmd in SKIP:
                continue
            if cmd == SERVE:
                # no shell: terminate() must reach graphmon itself (through `sh -c`, it ended the
                # shell and left the server running after the test)
                server = subprocess.Popen(["graphmon", "serve"], cwd=tmp_path, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 60
                while True:  # the demo has its first windows within a few seconds
                    assert server.poll() is None, server.stderr.read()
                    try:
                        if httpx.get(base + "/status", timeout=2).json().get("windows"):
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, "graphmon serve did not start"
                    time.sleep(0.2)
                ran.append(cmd)
                continue
            run = cmd.replace("localhost:9479", f"localhost:{port}")
            run = re.sub(r"(^|;\s*)curl ", r"\1curl --fail-with-body -sS ", run)
            if "<" in run:
                window = httpx.get(base + "/status", timeout=5).json()["windows"][-1]
                run = re.sub(r"<[^>]*>", lambda m: window if "/status" in m.group(0) or not last_capture
                             else last_capture, run)
            assert server is not None or "9479" not in cmd, f"{cmd!r} needs the server README starts first"
            r = subprocess.run(run, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"README command failed: {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            if "/capture" in cmd:
                answer = json.loads(r.stdout)
                assert answer["id"]
                last_capture = answer["id"] if answer["ready"] else last_capture
            ran.append(cmd)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    assert SERVE in ran and any("/capture" in c for c in ran) and any(c.startswith("curl -o w.json") for c in ran)
    assert (tmp_path / "compare.html").stat().st_size > 0 and (tmp_path / "w.json").stat().st_size > 0
