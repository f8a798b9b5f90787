"""graphmon.export.deploy_state: the deploy verdict's references survive an agent restart (--state-dir);
a corrupt state file is logged, counted and ignored, never a crash."""

from __future__ import annotations

import logging
import os

import pytest

from graphmon.export.deploy import DeployVerdict, process_key
from graphmon.export.deploy_pool import Pool, pooled
from graphmon.export.deploy_state import StateDir
from graphmon.formats.read import read_trace
from helpers import NATIVE, VerdictProc, only, wait_until, widen, windows_of
from tracefiles import assert_same_trace

GRAPH = "decode_bs1/upload"


@pytest.fixture(scope="module")
def graph_trace():
    return only(read_trace(NATIVE, progress=False), GRAPH)


def Proc(pid, start="1.0", host="node-a", rank="0", incarnation=None):
    """A process with the pid, host and start time the verdict tells processes apart by."""
    return VerdictProc(rank=rank, pid=pid, incarnation=incarnation, host=host, process_start_s=start)


def _ready(v, windows):
    return wait_until(lambda: (r := v.results.get(("0", "previous"))) is not None and r.state == "ready"
                      and r.current_windows == windows, timeout=30)


def test_a_pool_round_trips_window_by_window(tmp_path, graph_trace):
    pool = Pool()
    for i, w in enumerate(windows_of(graph_trace)[:3]):
        pool.add(pooled(f"r1-w{i}", w, 1_800_000_000.0 + i))
    sd = StateDir(str(tmp_path))
    assert sd.save("0", "current", pool, "7@node-a#1.0")
    (back,) = sd.load()
    assert (back.rank, back.process, back.previous) == ("0", "7@node-a#1.0", None)
    assert [(w.window_id, w.ended_s, dict(w.replays)) for w in back.current.windows] == \
        [(w.window_id, w.ended_s, dict(w.replays)) for w in pool.windows]
    for a, b in zip(pool.windows, back.current.windows):
        assert_same_trace(a.trace, b.trace)
    assert sd.errors == {"load": 0, "save": 0}
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(sd.file("0", "current"))]
    sd.save("0", "current", None, "")  # no pool: the file goes
    assert sd.load() == [] and os.listdir(tmp_path) == []


def _pooled_then_stopped(tmp_path, proc, windows) -> None:
    """An agent (its verdict with --state-dir ``tmp_path``) pools ``windows`` of ``proc`` and
    stops: its stop writes what pooled since the last periodic save."""
    v = DeployVerdict(state=StateDir(str(tmp_path)))
    for w in windows:
        proc.send(v, w)
    assert wait_until(lambda: v.idle and "0" in v._ranks and len(v._ranks["0"].current.windows) == len(windows),
                      timeout=30)
    v.stop()


def test_the_reference_survives_an_agent_restart(tmp_path, graph_trace):
    """Process A pools 4 windows under agent 1, which stops; agent 2 reads the state back and
    compares process B (another build, widened) with A from B's second window."""
    ws = windows_of(graph_trace)
    a = Proc(pid=1, start="100.0")
    _pooled_then_stopped(tmp_path, a, ws[:4])
    v2 = DeployVerdict(state=StateDir(str(tmp_path)))
    try:
        assert v2._ranks["0"].current.replays() == {f"0/{GRAPH}": 16} and not v2.results
        b = Proc(pid=1, start="200.0")  # a new container: the same pid, another start time
        for w in windows_of(widen(graph_trace, 0))[4:6]:
            b.send(v2, w)
        assert _ready(v2, 2)
        r = v2.results[("0", "previous")]
        (g,) = r.verdict.graphs
        assert g.regression and g.kind == "uniform" and g.net == "slower"
        assert r.reference_windows == 4 and r.reference_pid == "1" and r.current_pid == "1"
    finally:
        v2.stop()
    # agent 2 wrote B's pool and A's as the reference: a third agent has both
    (back,) = StateDir(str(tmp_path)).load()
    assert back.process == process_key(b.proc.identity) and back.previous_process == process_key(a.proc.identity)
    assert len(back.current.windows) == 2 and len(back.previous.windows) == 4


def test_the_same_process_reconnecting_to_a_restarted_agent_keeps_its_pool(tmp_path, graph_trace):
    ws = windows_of(graph_trace)
    a = Proc(pid=5, start="100.0")
    _pooled_then_stopped(tmp_path, a, ws[:3])
    v2 = DeployVerdict(state=StateDir(str(tmp_path)))
    try:
        again = Proc(pid=5, start="100.0", incarnation="i-new-connection")
        again.send(v2, ws[3])
        assert wait_until(lambda: v2.idle and len(v2._ranks["0"].current.windows) == 4, timeout=30)
        assert v2._ranks["0"].previous is None and not v2.results
    finally:
        v2.stop()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "renamed", "empty"])
def test_a_damaged_state_file_is_counted_and_ignored(tmp_path, graph_trace, damage, caplog):
    sd = StateDir(str(tmp_path))
    pool = Pool()
    pool.add(pooled("r1-w0", windows_of(graph_trace)[0], 1.0))
    sd.save("0", "current", pool, "1@h#1")
    sd.save("1", "current", pool, "2@h#1")
    path = sd.file("0", "current")
    data = open(path, "rb").read()
    if damage == "truncated":
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "garbage":
        open(path, "wb").write(b"\x00not an npz" * 100)
    elif damage == "renamed":  # rank 1's file under rank 0's name: its content names another rank
        os.replace(sd.file("1", "current"), path)
    else:
        open(path, "wb").close()
    with caplog.at_level(logging.WARNING, logger="graphmon.agent"):
        v = DeployVerdict(state=StateDir(str(tmp_path)))
    try:
        assert v.state.errors["load"] == 1
        assert "0" not in v._ranks or damage == "renamed"
        assert os.path.exists(f"{path}.corrupt") and not os.path.exists(path)
        assert "ignoring" in caplog.text and "starts without a reference" in caplog.text
        if damage != "renamed":
            assert list(v._ranks) == ["1"]  # the other rank is read back
    finally:
        v.stop()


def test_a_failed_write_is_counted_and_retried(tmp_path, graph_trace):
    sd = StateDir(str(tmp_path / "state"), save_interval_s=0)
    v = DeployVerdict(state=sd)
    try:
        os.chmod(sd.path, 0o500)
        if os.access(sd.path, os.W_OK):  # root ignores the mode: a file where the temporary goes
            os.chmod(sd.path, 0o700)
            os.mkdir(sd.file("0", "current") + ".tmp")
        Proc(pid=9).send(v, windows_of(graph_trace)[0])
        assert wait_until(lambda: sd.errors["save"] >= 1, timeout=30)
        assert "current" in v._ranks["0"].unsaved  # tried again at the next save
    finally:
        os.chmod(sd.path, 0o700)
        v.stop()


def test_an_unwritable_state_dir_is_an_error_at_start(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OSError):
        StateDir(str(f))


# ---------------------------------------------------------------------- untraced replay times (issue 36)
def _untraced_pool(graph_trace):
    """A pool of 4 windows with untraced durations (the windows' real replay spans) that keeps two:
    the other two windows' durations are in its carry."""
    from helpers import untraced_rows

    pool = Pool(max_replays=8)
    for i, w in enumerate(windows_of(graph_trace)[:4]):
        pool.add(pooled(f"r1-w{i}", w, 1_800_000_000.0 + i, untraced_rows(w, 1.0 + i / 100)))
    assert len(pool.windows) == 2 and len(pool.carry[graph_trace.graphs[0].key]) == 8
    return pool


def test_untraced_durations_and_the_carry_round_trip(tmp_path, graph_trace):
    pool = _untraced_pool(graph_trace)
    sd = StateDir(str(tmp_path))
    assert sd.save("0", "previous", pool, "7@node-a#1.0")
    (back,) = sd.load()
    p = back.previous
    assert {k: d.tolist() for k, d in p.carry.items()} == {k: d.tolist() for k, d in pool.carry.items()}
    for a, b in zip(pool.windows, p.windows):
        assert {k: v.tolist() for k, v in a.untraced.items()} == {k: v.tolist() for k, v in b.untraced.items()}
    assert {k: d.tolist() for k, d in p.untraced().items()} == {k: d.tolist() for k, d in pool.untraced().items()}
    assert len(p.untraced()[GRAPH]) == 16 and p.nbytes == pool.nbytes
    # a carry that does not match its counts: the file is damaged, counted and ignored
    import json

    import numpy as np

    with np.load(sd.file("0", "previous")) as z:
        arrays = {k: z[k] for k in z.files}
    state = json.loads(bytes(arrays["state_json"]).decode())
    state["untraced_carry"][0][1] += 1
    arrays["state_json"] = np.frombuffer(json.dumps(state).encode(), np.uint8)
    with open(sd.file("0", "previous"), "wb") as fh:
        np.savez(fh, **arrays)
    assert StateDir(str(tmp_path)).load() == [] and os.path.exists(sd.file("0", "previous") + ".corrupt")


def test_a_state_file_of_the_layout_before_untraced_times_reads_back(tmp_path, graph_trace):
    """A file the agent wrote before untraced durations existed (no untraced_carry, no carry_ns, no
    u_ members in its windows): its windows read back with none, and the verdict says absent."""
    import io
    import json

    import numpy as np

    from graphmon.formats.native import write_trace_to

    ws = windows_of(graph_trace)
    sd = StateDir(str(tmp_path))
    old = {"format": "graphmon-deploy-state", "version": 1, "rank": "0", "role": "previous", "process": "1@h#1",
           "max_replays": 64, "max_bytes": 32 * 2**20,
           "windows": [[f"r1-w{i}", 1_800_000_000.0 + i] for i in range(4)]}
    arrays = {"state_json": np.frombuffer(json.dumps(old).encode(), np.uint8)}
    for i, w in enumerate(ws[:4]):
        buf = io.BytesIO()
        write_trace_to(w, buf)
        arrays[f"w{i}"] = np.frombuffer(buf.getbuffer(), np.uint8)
    with open(sd.file("0", "previous"), "wb") as fh:
        np.savez(fh, **arrays)
    v = DeployVerdict(state=StateDir(str(tmp_path)))
    try:
        st = v._ranks["0"]
        assert st.previous.replays() == {f"0/{GRAPH}": 16} and st.previous.untraced() == {} and not st.previous.carry
        assert all(len(w.untraced["duration_ns"]) == 0 for w in st.previous.windows)
        b = Proc(pid=2, start="200.0")
        for w in windows_of(widen(graph_trace, 0))[4:6]:
            b.send(v, w)
        assert _ready(v, 2)
        r = v.results[("0", "previous")]
        (g,) = r.verdict.graphs
        assert g.regression and g.kind == "uniform" and g.untraced == "absent" and r.verdict.untraced == "absent"
    finally:
        v.stop()
