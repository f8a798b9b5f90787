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


# ---------------------------------------------------------------------- Recorder: untraced rows (issue 36)
def _reordered(trace, order):
    """The same records under a graph table in ``order`` (a window of another process state: its
    own graph indices), so the Recorder must match graphs by key."""
    from dataclasses import replace

    pos = np.full(len(trace.graphs) + 1, -1, np.int32)  # [-1]: kernels and launches of no graph
    pos[np.asarray(order)] = np.arange(len(order), dtype=np.int32)
    launches = dict(trace.launches, graph=pos[trace.launches["graph"]])
    return replace(trace, graphs=tuple(trace.graphs[i] for i in order), graph=pos[trace.graph], launches=launches), pos


def _record(path, trace, rows_of, windows=0):
    """A recording of ``trace`` in two windows (its two halves of each graph's replays, the first
    under the reversed graph table) whose untraced rows are ``rows_of(which)`` (indexing
    ``trace.graphs``, re-indexed here to the window's own table); the path saved."""
    from helpers import half, window

    rec = attach_mod.Recorder(str(path), windows)
    for which in (0, 1):
        w, rows = half(trace, which), dict(rows_of(which))
        if which == 0:
            w, pos = _reordered(w, list(range(len(trace.graphs)))[::-1])
            rows["graph"] = pos[rows["graph"]]
        rec(window(w, untraced=rows))
    return rec.save()


@pytest.fixture(scope="module")
def h200():
    from helpers import NATIVE

    return read_trace(NATIVE, progress=False)


def test_record_keeps_each_windows_untraced_rows_under_the_merged_graphs(h200, tmp_path):
    from graphmon.analysis.compare import untraced_by_graph
    from graphmon.formats.read import read_trace_untraced
    from helpers import untraced_rows

    bad = {"graph": np.array([-1, 99, 0], np.int32), "duration_ns": np.array([5, 7, 0], np.int64)}

    def rows_of(which):  # the real replay spans of that half; the second window adds -1 / bad rows
        r = untraced_rows(h200, 1.0, which=which)
        if which == 1:
            r = {k: np.concatenate([r[k], bad[k]]) for k in r}
        return r

    t, u = read_trace_untraced(_record(tmp_path / "r.graphmon.npz", h200, rows_of), progress=False)
    assert [g.key for g in t.graphs] == [g.key for g in h200.graphs][::-1]  # the first window's table
    got = untraced_by_graph(u, t.graph_names())
    want = {n: np.concatenate([untraced_by_graph(untraced_rows(h200, 1.0, which=i), h200.graph_names())[n]
                               for i in (0, 1)]) for n in h200.graph_names()}
    assert set(got) == set(want) and all(np.array_equal(got[n], want[n]) for n in want)  # by name, in order
    assert len(u["graph"]) == sum(map(len, want.values())) + 1 and (u["graph"] == -1).sum() == 1  # -1 kept as -1
    assert t.meta["untraced_left_out"] == 2 and t.meta["windows"] == 2  # graph 99, 0 ns: counted, not written


def test_record_without_untraced_rows_writes_none_and_counts_nothing(h200, tmp_path):
    from graphmon.formats.read import read_trace_untraced
    from graphmon.model.window import no_untraced

    t, u = read_trace_untraced(_record(tmp_path / "r.graphmon.npz", h200, lambda w: no_untraced()), progress=False)
    assert len(u["graph"]) == 0 and "untraced_left_out" not in t.meta


def test_record_keeps_the_untraced_rows_of_the_windows_it_keeps_only(h200, tmp_path):
    """Bounded as the windows are: past ``windows`` a window (and its rows) is not kept."""
    from graphmon.formats.read import read_trace_untraced
    from helpers import untraced, window

    rec = attach_mod.Recorder(str(tmp_path / "r.graphmon.npz"), windows=1)
    rec(window(h200, untraced=untraced([0, 1], [100, 200])))
    rec(window(h200, untraced=untraced([0], [300])))
    assert rec.done.is_set() and len(rec.traces) == len(rec.untraced) == 1
    _, u = read_trace_untraced(rec.save(), progress=False)
    assert u["duration_ns"].tolist() == [100, 200] and u["graph"].tolist() == [0, 1]


def test_compare_of_two_recordings_applies_the_untraced_rule(h200, tmp_path, capsys):
    """Issue 36 end to end offline: ``graphmon compare`` of two recordings. A traced widening whose
    untraced replay time fell (-20%) is observer_only (exit 0); the same build with its untraced time
    +1.2% and no widening is kind untraced (exit 1)."""
    import json

    from graphmon.cli import main
    from helpers import HELD_OUT_GRAPH, held_out_concentrated, untraced_rows

    _, widened = held_out_concentrated(h200)
    base = _record(tmp_path / "base.graphmon.npz", h200, lambda w: untraced_rows(h200, 1.0, which=w))
    cur = _record(tmp_path / "cur.graphmon.npz", widened, lambda w: untraced_rows(h200, 0.8, which=w))
    assert main(["compare", base, cur]) == 0
    out = capsys.readouterr().out
    assert f"graph {HELD_OUT_GRAPH} (device 0): widened (concentrated, boundaries) and slower traced" in out
    assert "observer_only, not a regression" in out and "untraced: measured)" in out and "PASS: no regression" in out
    same = _record(tmp_path / "same.graphmon.npz", h200, lambda w: untraced_rows(h200, 1.012, which=w))
    assert main(["compare", "--format", "json", base, same]) == 1
    doc = json.loads(capsys.readouterr().out)["verdict"]
    assert doc["untraced"] == "measured" and {g["kind"] for g in doc["graphs"]} == {"untraced"}


def test_record_writes_the_untraced_replay_times_the_collector_took(tmp_path):
    """The collector (fake CUPTI, its CUDA events on the fake GPU clock) -> Recorder -> the file:
    the reference phases' and bursts' untraced rows arrive, indexing the recorded graph."""
    from fake_cupti import FakeEvents

    from graphmon.formats.read import read_trace_untraced
    from graphmon.settings import CuptiSettings
    from graphmon.sources.cupti.collector import CuptiSource

    fake = FakeCupti(trace_slowdown=3.0)
    st = CuptiSettings(**{**FAST, "interval_s": 0.2, "untraced_burst_launches": 8, "untraced_burst_interval_s": 0.05})
    src = CuptiSource(cupti=fake, settings=st, events=FakeEvents(fake))
    rec = attach_mod.Recorder(str(tmp_path / "r.graphmon.npz"), windows=3)
    src.start(rec)
    try:
        src.wait_started()
        h = fake.instantiate(decode_like(4))
        assert _launch_until(fake, h, rec.done.is_set)
    finally:
        src.stop(timeout_s=2.0)
    t, u = read_trace_untraced(rec.save(), progress=False)
    assert len(u["graph"]) == sum(len(x["graph"]) for x, _ in rec.untraced) > 4
    assert {t.graphs[g].graph_id for g in u["graph"].tolist()} == {fake.exec_ids[h]}
    assert set(u["duration_ns"].tolist()) == {35_264}  # decode_like(4)'s untraced span on the fake
