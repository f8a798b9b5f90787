"""attach()/detach()/label_graph() in-process (fake cupti) and graphmon run's sitecustomize hook."""

import os
import sys
import textwrap
import time
import warnings

import httpx
import numpy as np
import pytest

import graphmon
import importlib

attach_mod = importlib.import_module("graphmon.host.attach")  # the module (graphmon.attach is the function)
launch = importlib.import_module("graphmon.host.launch")
from graphmon.formats.read import read_trace

from fake_cupti import FakeCupti, decode_like  # noqa: E402

FAST = dict(window_launches=4, window_duration_ms=200, interval_s=0.05, first_window_s=0.0, max_traced_share=1.0)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("GRAPHMON_AGENT", raising=False)  # in-process attach unless a test names an agent
    yield
    graphmon.detach(timeout_s=2.0)


def _launch_until(fake, h, pred, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        fake.launch(h, 7)
        time.sleep(0.001)
        if pred():
            return True
    return False


def test_attach_serves_metrics_is_idempotent_and_detaches(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    fake = FakeCupti()
    ex = graphmon.attach(cupti=fake, port=0, **FAST)
    assert ex is not None and ex.bound_port
    h = fake.instantiate(decode_like(2))
    assert _launch_until(fake, h, lambda: len(ex.snapshot().windows) >= 1)
    r = httpx.get(f"http://127.0.0.1:{ex.bound_port}/metrics", timeout=5)
    assert r.status_code == 200 and "graphmon_up 1" in r.text
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        again = graphmon.attach(cupti=FakeCupti(), port=0)
    assert again is ex and any("already attached" in str(x.message) for x in w)
    port = ex.bound_port
    graphmon.detach()
    assert fake.handler is None
    assert attach_mod.attached() is None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_graphmon_env_variables_reach_the_cupti_source(monkeypatch):
    # GRAPHMON_INTERVAL_S used to be silently ignored: attach() now builds CuptiSettings, which
    # reads GRAPHMON_<FIELD>; explicit keyword arguments still win over the environment.
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("GRAPHMON_INTERVAL_S", "0.05")
    monkeypatch.setenv("GRAPHMON_MAX_BUFFERS", "7")
    monkeypatch.setenv("GRAPHMON_WINDOW_LAUNCHES", "3")
    monkeypatch.setenv("GRAPHMON_MAX_TRACED_SHARE", "1")
    fake = FakeCupti()
    ex = graphmon.attach(cupti=fake, port=0, serve=False, first_window_s=0.0, window_launches=5)
    assert ex is not None
    s = attach_mod.attached().source.settings
    assert (s.interval_s, s.max_buffers, s.window_launches, s.max_traced_share) == (0.05, 7, 5, 1.0)
    h = fake.instantiate(decode_like(1))
    # 0.05 s between windows (the default is 10 s): several windows within a second or two
    assert _launch_until(fake, h, lambda: len(ex.snapshot().windows) >= 1 and ex.source.stats["windows"] >= 3)


def test_port_is_base_plus_local_rank(monkeypatch):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    base = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("LOCAL_RANK", "1")
    ex = graphmon.attach(cupti=FakeCupti(), port=base - 1, **FAST)
    assert ex is not None and ex.bound_port == base


def test_attach_failure_returns_none_instead_of_raising():
    assert graphmon.attach(cupti=FakeCupti(), port=-5) is None  # invalid setting
    assert attach_mod.attached() is None
    assert graphmon.label_graph(object(), name="x") is None  # logged, not raised


def test_record_mode_saves_native_trace(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    fake = FakeCupti()
    out = tmp_path / "rec.graphmon.npz"
    src = graphmon.attach(cupti=fake, record_path=str(out), record_windows=2, **FAST)
    h = fake.instantiate(decode_like(2))
    fake.upload(h, 7)
    graphmon.label_graph(h, name="decode_bs1", batch_size=1)
    assert _launch_until(fake, h, lambda: out.exists())
    graphmon.detach()
    t = read_trace(str(out))
    assert len(t) > 0 and len(t) % 6 == 0  # whole launches of a 6-kernel graph
    assert t.meta["windows"] == 2
    g = t.graphs[0]
    assert (g.label, g.batch_size, g.upload_mode) == ("decode_bs1", 1, "uploaded")
    assert not fake.activity  # tracing stopped once the windows were recorded


class SlowSubscribe(FakeCupti):
    """CUPTI whose subscription takes a while (a loaded machine, a first libcupti load)."""

    def subscribe(self, handler):
        time.sleep(0.3)
        super().subscribe(handler)


@pytest.mark.parametrize("mode", ["record", "inprocess"])
def test_attach_returns_once_cupti_is_subscribed(tmp_path, monkeypatch, mode):
    # a graph captured right after attach() is seen from its instantiation (its upload mode
    # known), whichever way graphmon runs; the light collector already waited (test_link)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    kw = dict(record_path=str(tmp_path / "r.graphmon.npz"), record_windows=1) if mode == "record" else dict(port=0)
    graphmon.attach(cupti=SlowSubscribe(), **kw, **FAST)
    try:
        assert attach_mod.attached().source.health().state == "running"
    finally:
        graphmon.detach()


def test_rank_path():
    env = dict(os.environ)
    try:
        os.environ["RANK"] = "3"
        assert attach_mod._rank_path("/x/t.graphmon.npz") == "/x/t.rank3.graphmon.npz"
        os.environ.pop("RANK")
        os.environ.pop("LOCAL_RANK", None)
        assert attach_mod._rank_path("/x/t.npz") == "/x/t.npz"
    finally:
        os.environ.clear()
        os.environ.update(env)


def test_run_command_chains_sitecustomize_and_returns_exit_code(tmp_path, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    monkeypatch.setenv("PYTHONPATH", str(other))
    out = tmp_path / "out.txt"
    code = textwrap.dedent(f"""
        import os, sys
        with open({str(out)!r}, "w") as fh:
            fh.write(f"{{os.environ.get('OTHER_SITECUSTOMIZE_RAN')}} {{bool(os.environ.get('GRAPHMON_AGENT'))}} "
                     f"{{'sitecustomize' in sys.modules}}")
        sys.exit(3)
    """)
    rc = launch.run_command(["--", sys.executable, "-c", code], {"port": 0}, serve=False)
    assert rc == 3
    assert out.read_text().split() == ["1", "True", "True"]


def test_run_command_missing_command():
    assert launch.run_command(["--"], {}, serve=False) == 2
    assert launch.run_command(["/nonexistent/graphmon-test-cmd"], {}, serve=False) == 127


def test_hook_opt_out(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHMON_ATTACH", "0")
    out = tmp_path / "o.txt"
    code = f"import sys; open({str(out)!r}, 'w').write(str(any(type(f).__name__ == '_Finder' for f in sys.meta_path)))"
    assert launch.run_command([sys.executable, "-c", code], {"port": 0}, serve=False) == 0
    assert out.read_text() == "False"
