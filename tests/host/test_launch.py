"""graphmon record (host/launch.py) never reports success for nothing: no process attached, no
window, or fewer windows than --windows each give a message and their exit code; the command's
own failure keeps its code. Child processes run the real hook against the fake CUPTI."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from graphmon.host.launch import EXIT_FEWER_WINDOWS, EXIT_NOTHING_RECORDED, describe_reason

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

REPLAY = """
    import sys, time, torch
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    t_end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < t_end:
        g.replay(); time.sleep(0.002)
    time.sleep(float(sys.argv[2]))
"""


def _record(tmp_path, *cmd, windows=2, env=None, flags=()):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "fake_site"), *(env or {}).pop(
        "EXTRA_PATH", [])]), GRAPHMON_CUPTI_API="cupti:cupti")
    e.pop("GRAPHMON_AGENT", None)
    e.setdefault("GRAPHMON_FIRST_WINDOW_S", "0")
    e.update(env or {})
    out = tmp_path / "t.graphmon.npz"
    r = subprocess.run([sys.executable, "-m", "graphmon.cli", "record", "-o", str(out), "--windows", str(windows),
                        *flags, "--", *cmd], capture_output=True, text=True, timeout=120, env=e)
    return r, out


def _lines(r):
    return [ln for ln in r.stderr.splitlines() if ln.startswith("graphmon record:")]


def test_a_command_that_attaches_nothing_exits_3_and_says_so(tmp_path):
    r, out = _record(tmp_path, sys.executable, "-c", "print(1)")
    assert r.returncode == EXIT_NOTHING_RECORDED == 3, r.stderr
    (line,) = _lines(r)
    assert "nothing recorded: no process of" in line and "GRAPHMON_SUBSCRIBE=start" in line
    assert not out.exists()


def test_the_commands_own_failure_keeps_its_exit_code(tmp_path):
    r, out = _record(tmp_path, sys.executable, "-c", "import sys; sys.exit(7)")
    assert r.returncode == 7 and "nothing recorded" in r.stderr and not out.exists()


def test_a_process_that_fails_to_subscribe_names_its_state_never_an_empty_reason(tmp_path):
    """GRAPHMON_SUBSCRIBE=start with a CUPTI that raises an exception without a message (as on
    a host without a GPU): the process attaches, sends no window, and the report says why."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "nocupti.py").write_text("class NoGpu(Exception):\n    pass\n\n\ndef __getattr__(name):\n"
                                                 "    raise NoGpu()\n")
    r, out = _record(tmp_path, sys.executable, "-c", "import time; time.sleep(1.5)",
                     env={"GRAPHMON_SUBSCRIBE": "start", "GRAPHMON_CUPTI_API": "nocupti:api",
                          "EXTRA_PATH": [str(tmp_path / "mod")]})
    assert r.returncode == EXIT_NOTHING_RECORDED, r.stderr
    (line,) = _lines(r)
    assert "1 process attached and sent no window" in line
    assert "error: cupti unavailable (no detail reported; errors: setup=1)" in line, line
    assert not out.exists()


def test_fewer_windows_than_asked_writes_them_and_exits_4(tmp_path):
    r, out = _record(tmp_path, sys.executable, "-c", textwrap.dedent(REPLAY), "1.5", "0.3", windows=1000,
                     flags=("--interval-s", "0.05", "--window-launches", "4", "--max-traced-share", "1"))
    assert r.returncode == EXIT_FEWER_WINDOWS == 4, r.stderr
    (line,) = _lines(r)
    from graphmon.formats.read import read_trace

    n = read_trace(out).meta["windows"]
    assert 1 <= n < 1000 and f"recorded {n} of 1000 windows to {out}" in line and "last state" in line


def test_enough_windows_is_a_success(tmp_path):
    r, out = _record(tmp_path, sys.executable, "-c", textwrap.dedent(REPLAY), "3", "0", windows=1,
                     flags=("--interval-s", "0.05", "--window-launches", "4", "--max-traced-share", "1"))
    assert r.returncode == 0, r.stderr
    assert _lines(r) == [] and "graphmon: recorded 1 window to" in r.stderr and out.exists()
    from graphmon.formats.read import read_trace_untraced

    # the window's reference phase timed launches untraced (the fake GPU's CUDA events): the file has them
    t, u = read_trace_untraced(out, progress=False)
    assert len(u["graph"]) > 0 and (u["graph"] >= 0).all() and (u["duration_ns"] > 0).all()
    assert {t.graphs[g].key for g in u["graph"].tolist()} <= {t.graphs[g].key for g in t.launches["graph"] if g >= 0}


def test_help_names_the_exit_codes():
    r = subprocess.run([sys.executable, "-m", "graphmon.cli", "record", "--help"], capture_output=True, text=True)
    text = " ".join(r.stdout.split())
    assert "exit 3" in text and "exit 4" in text


@pytest.mark.parametrize("reason,errors,want", [
    ("", {}, "error: (no detail reported; errors: none counted)"),
    ("cupti unavailable: ", {"setup": 1, "x": 0}, "error: cupti unavailable (no detail reported; errors: setup=1)"),
    ("blocked by nsys", {}, "error: blocked by nsys"),
])
def test_describe_reason_is_never_empty(reason, errors, want):
    assert describe_reason("error", reason, errors) == want
    assert describe_reason("stopped", "", {"setup": 1}) == "stopped"
