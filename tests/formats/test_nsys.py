"""Nsight Systems SQLite reader: a real export (pipit's test data, nsys 2022.2), and the nsys-schema
fixture written from the H200 CUPTI records, checked against the raw CUPTI reader's statistics."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphmon.analysis.replays import analyze
from graphmon.cli import main
from graphmon.formats.read import ReadLimits, read_trace
from graphmon.model.trace import TraceError

from helpers import DATA
from tracefiles import RAW

NSYS = DATA / "h200-cupti-decode-subset.nsys.sqlite"
PIPIT = DATA / "pipit-saxpy-mpi-cuda-nsys-2022.2.sqlite"
ROOT = DATA.parent.parent


@pytest.fixture(scope="module")
def nsys_trace():
    return read_trace(NSYS, progress=False)


@pytest.fixture(scope="module")
def raw_subset(nsys_trace):
    """The raw CUPTI reader's trace restricted to the fixture's replays (the same records)."""
    raw = read_trace(RAW, progress=False)
    return raw.select(np.isin(raw.correlation_id, np.unique(nsys_trace.correlation_id)))


def stream_stats(trace):
    """{(graph_id, stream): gap values} and {graph_id: sorted (span, busy, idle) per replay}."""
    a = analyze(trace)
    gid = [g.graph_id for g in trace.graphs]
    gaps = {}
    for i in range(len(a.gaps)):
        lo, hi = a.gaps.offsets[i], a.gaps.offsets[i + 1]
        gaps[(gid[a.gaps.graph[i]], int(a.gaps.stream[i]))] = a.gaps.values[lo:hi].tolist()
    reps = {}
    r = a.replays
    for j in range(len(r.graph)):
        reps.setdefault(gid[r.graph[j]], []).append((int(r.span_ns[j]), int(r.busy_ns[j]), int(r.idle_ns[j])))
    return gaps, {k: sorted(v) for k, v in reps.items()}


def test_real_nsys_export_from_pipit():
    t = read_trace(PIPIT, progress=False)
    assert len(t) == 5 and t.invalid_total == 0
    assert t.names == ("_Z5saxpyPdS_S_di",)  # mangledName preferred
    assert set(t.stream.tolist()) == {7} and (t.graph == -1).all()  # no graphs in this run
    with sqlite3.connect(PIPIT) as con:
        want = con.execute("SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    assert list(zip(t.start_ns.tolist(), t.end_ns.tolist(), t.correlation_id.tolist())) == want
    assert t.meta["nsys_schema_version"] == "2.9.1" and t.meta["nsys_version"] == "2022.2.1.31"
    assert t.meta["missing_columns"] == ["graphId"]
    assert "launch correlation" in t.meta["graph_identity"]


def test_fixture_matches_raw_cupti_reader(nsys_trace, raw_subset):
    assert len(nsys_trace) == len(raw_subset) == 10 * 2 * 960
    a = np.lexsort((nsys_trace.start_ns, nsys_trace.stream))
    b = np.lexsort((raw_subset.start_ns, raw_subset.stream))
    for col in ("start_ns", "end_ns", "stream", "correlation_id", "graph_id", "graph_node_id"):
        np.testing.assert_array_equal(getattr(nsys_trace, col)[a], getattr(raw_subset, col)[b], err_msg=col)
    assert [nsys_trace.names[i] for i in nsys_trace.name_id[a]] == [raw_subset.names[i] for i in raw_subset.name_id[b]]
    assert nsys_trace.n_launches == 20 and (nsys_trace.launches["graph"] >= 0).all()
    assert nsys_trace.meta["graph_identity"] == "graphId" and "missing_columns" not in nsys_trace.meta


def test_same_per_stream_statistics_as_the_raw_reader(nsys_trace, raw_subset):
    gaps_n, reps_n = stream_stats(nsys_trace)
    gaps_r, reps_r = stream_stats(raw_subset)
    assert len(gaps_n) == 2 * 4  # 2 decode graphs (uploaded, lazy) x 4 streams
    assert gaps_n == gaps_r
    assert reps_n == reps_r


def test_old_schema_falls_back_to_launch_correlation(tmp_path, raw_subset):
    old = tmp_path / "old.sqlite"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_nsys_fixture.py"), "--no-graph-columns", "--out", str(old)],
                   check=True, capture_output=True)
    t = read_trace(old, progress=False)
    assert t.meta["missing_columns"] == ["graphId"]
    assert t.meta["graph_identity"].startswith("launch correlation")
    assert (t.graph_id == 0).all() and (t.graph >= 0).all()
    # Without graphId, graphs are told apart by replay signature (kernel names, stream count, label):
    # the uploaded and lazy captures of one shape are the same signature, so 2 keys become 1 graph.
    assert all(g.key.startswith("sig:") for g in t.graphs) and len(t.graphs) == 1
    # every gap is still there, with the same value
    got = np.sort(analyze(t).gaps.values)
    want_gaps, _ = stream_stats(raw_subset)
    np.testing.assert_array_equal(got, np.sort(np.concatenate([np.array(v) for v in want_gaps.values()])))


def test_graph_memcpy_and_memset_are_counted_apart(tmp_path, nsys_trace):
    p = tmp_path / "memops.sqlite"
    shutil.copy(NSYS, p)
    corr = int(nsys_trace.launches["correlation_id"][0])
    with sqlite3.connect(p) as con:
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 1, 7, ?, 0, 4096, 8, 99)",
                        [(2_000_000_000, 2_000_000_500, corr), (2_000_001_000, 2_000_001_300, corr), (5, 9, 1)])  # last: not a graph's
    t = read_trace(p, progress=False)
    assert t.meta["graph_memops"] == {"memcpy": 2, "memcpy_ns": 800}
    assert len(t) == len(nsys_trace)  # not kernels


def test_missing_columns_and_tables_are_named(tmp_path):
    p = tmp_path / "nocol.sqlite"
    with sqlite3.connect(p) as con:
        con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER)")
    with pytest.raises(TraceError, match=r"lacks column\(s\) streamId, correlationId"):
        read_trace(p, progress=False)
    q = tmp_path / "notables.sqlite"
    with sqlite3.connect(q) as con:
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    with pytest.raises(TraceError, match="no CUPTI_ACTIVITY_KIND_KERNEL table"):
        read_trace(q, progress=False)
    r = tmp_path / "garbage.sqlite"
    r.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(TraceError, match=f"^{r}: "):
        read_trace(r, progress=False)


def test_odd_file_names(tmp_path, nsys_trace):
    p = tmp_path / "a?b#c %20.sqlite"
    shutil.copy(NSYS, p)
    assert len(read_trace(p, progress=False)) == len(nsys_trace)


def test_non_integer_rows_are_counted(tmp_path, nsys_trace):
    p = tmp_path / "bad.sqlite"
    shutil.copy(NSYS, p)
    with sqlite3.connect(p) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'x' WHERE rowid <= 3")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 40000 WHERE rowid = 4")
    t = read_trace(p, progress=False)
    assert dict(t.invalid) == {"non_numeric": 3, "out_of_range": 1}
    assert len(t) + t.invalid_total == len(nsys_trace)


def test_limits_apply(nsys_trace):
    with pytest.raises(TraceError, match="kernel records"):
        read_trace(NSYS, progress=False, limits=ReadLimits(max_kernels=1000))
    with pytest.raises(TraceError, match="streams"):
        read_trace(NSYS, progress=False, limits=ReadLimits(max_streams=3))
    with pytest.raises(TraceError, match="names"):
        read_trace(NSYS, progress=False, limits=ReadLimits(max_names=5))
    with pytest.raises(TraceError, match="limit"):
        read_trace(NSYS, progress=False, limits=ReadLimits(max_decompressed_bytes=1 << 20))


def widened(tmp_path, graph_id: int, step_ns: int):
    """A copy of the fixture where every kernel of one graph starts step_ns later than the one
    before it on its stream did (each gap + step_ns), as the seed's upload regression did."""
    p = tmp_path / "wide.sqlite"
    shutil.copy(NSYS, p)
    with sqlite3.connect(p) as con:
        rows = con.execute("SELECT rowid, correlationId, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphId = ? "
                           "ORDER BY correlationId, streamId, start", (graph_id,)).fetchall()
        upd, prev, k = [], None, 0
        for rowid, c, s in rows:
            k = k + 1 if (c, s) == prev else 0
            prev = (c, s)
            upd.append((step_ns * k, step_ns * k, rowid))
        con.executemany("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + ?, end = end + ? WHERE rowid = ?", upd)
    return p


def test_cli_compare_flags_a_widened_nsys_export(tmp_path, capsys, nsys_trace):
    gid = next(g.graph_id for g in nsys_trace.graphs if g.graph_id > 0 and len(np.unique(nsys_trace.stream[nsys_trace.graph_id == g.graph_id])) == 4)
    assert main(["compare", str(NSYS), str(widened(tmp_path, gid, 320)), "--format", "json"]) == 1  # 1 = regression
    rows = json.loads(capsys.readouterr().out)["streams"]
    verdicts = {(r["graph"], r["stream_baseline"]): r["verdict"] for r in rows}
    assert len(verdicts) == 8
    assert {v for (g, _), v in verdicts.items() if g == f"g{gid}"} == {"regression"}  # every stream of the widened graph
    assert {v for (g, _), v in verdicts.items() if g != f"g{gid}"} == {"unchanged"}


def test_cli_analyze_and_compare(capsys):
    assert main(["analyze", str(NSYS)]) == 0
    assert "20 replays" in capsys.readouterr().out
    assert main(["analyze", str(PIPIT), "--format", "json"]) == 0
    assert main(["compare", str(NSYS), str(NSYS)]) == 0
    out = capsys.readouterr().out
    assert "no regression" in out and "insufficient" not in out


@settings(max_examples=30, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)), min_size=1, max_size=6))
def test_damaged_exports_give_a_trace_or_one_line(ops, tmp_path_factory):
    """Bytes overwritten anywhere in a real export: a Trace, or a TraceError naming the file."""
    data = bytearray(PIPIT.read_bytes())
    for where, payload in ops:
        i = max(100, int(where * len(data)))  # keep the magic header: the SQLite reader's input
        data[i : i + len(payload)] = payload
    p = tmp_path_factory.mktemp("fuzz") / "x.sqlite"
    p.write_bytes(bytes(data))
    try:
        t = read_trace(p, progress=False)
    except TraceError as e:
        assert str(e).startswith(f"{p}: ") and "\n" not in str(e)
    else:
        assert t.meta["format"] == "nsys-sqlite" and len(t) == len(t.end_ns)


def test_text_that_is_not_utf8_is_read_with_replacement_characters(tmp_path):
    # found by the fuzz test above: a damaged export's TEXT value that is not UTF-8 raised
    # UnicodeDecodeError out of the reader instead of giving a trace or a one-line error
    p = tmp_path / "bad-text.sqlite"
    shutil.copy(PIPIT, p)
    con = sqlite3.connect(p)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"EXPORT_META_DATA", "StringIds"} <= tables
    con.execute("UPDATE EXPORT_META_DATA SET value = CAST(X'3280FF' AS TEXT) WHERE name = 'EXPORT_PRODUCT_VERSION'")
    con.execute("UPDATE StringIds SET value = CAST(X'6B80FF' AS TEXT) WHERE id IN (SELECT mangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)")
    con.commit()
    con.close()
    t = read_trace(p, progress=False)
    assert t.meta["format"] == "nsys-sqlite" and len(t) > 0
    assert t.meta.get("nsys_version", "").startswith("2")
    assert any("\ufffd" in n for n in t.names)


def test_sqlite_messages_that_are_not_utf8_become_one_line(monkeypatch, tmp_path):
    # SQLite's own error message about a damaged schema can quote bytes that are not UTF-8: the
    # sqlite3 module then raises UnicodeDecodeError while building the exception (fuzz: CI)
    from graphmon.formats import nsys

    def damaged(con, path, limits):
        raise UnicodeDecodeError("utf-8", b"\x80", 0, 1, "invalid start byte")

    monkeypatch.setattr(nsys, "_read", damaged)
    p = tmp_path / "x.sqlite"
    shutil.copy(PIPIT, p)
    with pytest.raises(TraceError) as e:
        read_trace(p, progress=False)
    assert str(e.value) == f"{p}: bad SQLite file: damaged schema (its text is not UTF-8)"
