"""graphmon native format: written by formats.native, read back unchanged; the bundled fixture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphmon.cli import main
from graphmon.formats.native import write_trace
from graphmon.formats.read import ReadLimits, read_trace
from graphmon.model.trace import TraceError

from tracefiles import BUNDLED, NATIVE, RAW, assert_same_trace, meta_bytes, native_meta, npz_with

@pytest.fixture(scope="module")
def raw_trace():
    return read_trace(RAW, progress=False)


def test_native_fixture_is_the_raw_conversion(raw_trace):
    native = read_trace(NATIVE, progress=False)
    assert_same_trace(raw_trace, native, meta=False)
    assert native.meta["format"] == "cupti-npz"
    assert BUNDLED.read_bytes() == NATIVE.read_bytes()
    assert BUNDLED.stat().st_size < 4_000_000


def test_native_round_trip_all_columns(raw_trace, tmp_path):
    p = tmp_path / "rt.npz"
    write_trace(raw_trace, p)
    assert_same_trace(raw_trace, read_trace(p, progress=False))


# ---------------------------------------------------------------------------- hostile metadata (issue 18, items 16-17)
def native_file(tmp_path, name="m.npz", **meta_over) -> Path:
    p = tmp_path / name
    p.write_bytes(npz_with(NATIVE, meta_json=meta_bytes(native_meta(**meta_over))))
    return p


def graphs_with(**over):
    g = dict(native_meta()["graphs"][0])
    g.update(over)
    return [g] + native_meta()["graphs"][1:]


BAD_META = {
    "graph-key-list": dict(graphs=graphs_with(key=["a"])),
    "graph-key-float": dict(graphs=graphs_with(key=1.5)),
    "graph-key-int": dict(graphs=graphs_with(key=7)),
    "graph-label-int": dict(graphs=graphs_with(label=3)),
    "graph-id-float": dict(graphs=graphs_with(graph_id=2.0)),
    "graph-batch-bool": dict(graphs=graphs_with(batch_size=True)),
    "graph-key-lone-surrogate": dict(graphs=graphs_with(key="g\ud800")),
    "graph-extra-field": dict(graphs=graphs_with(evil=1)),
    "invalid-negative": dict(invalid={"zero_start": -13000}),
    "invalid-unknown-reason": dict(invalid={"x" * 300: 1}),
    "invalid-float": dict(invalid={"duplicate": 1.5}),
    "names-not-str": dict(names=[1, 2]),
    "label-surrogate": dict(labels=["\udc80"]),
    "meta-surrogate": dict(meta={"source": "\ud800"}),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_bad_metadata_is_one_line_error(case, tmp_path, capsys):
    p = native_file(tmp_path, **BAD_META[case])
    with pytest.raises(TraceError) as ei:
        read_trace(p, progress=False)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg and "metadata" in msg
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphmon: error: ") and err.count("\n") == 1


def test_good_metadata_still_reads(tmp_path):
    t = read_trace(native_file(tmp_path, invalid={"zero_start": 3}, meta={"note": "ok", "x": [1.5, 2]}), progress=False)
    assert t.invalid["zero_start"] == 3 and t.meta["x"] == [1.5, 2]


def names_bomb(tmp_path, n: int) -> Path:
    """A small npz whose meta_json lists ``n`` names (each "a"): compresses ~500:1."""
    meta = native_meta()
    head = json.dumps({k: v for k, v in meta.items() if k != "names"})[:-1].encode()
    text = head + b', "names": [' + b'"a", ' * (n - 1) + b'"a"]}'
    p = tmp_path / "bomb.npz"
    with np.load(NATIVE, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta_json"] = np.frombuffer(text, np.uint8)
    np.savez_compressed(p, **arrays)
    return p


def test_ten_million_names_in_a_small_file_are_refused(tmp_path):
    p = names_bomb(tmp_path, 10_000_000)
    assert p.stat().st_size - NATIVE.stat().st_size < 200_000  # the names add ~100 KB
    with pytest.raises(TraceError, match=r"more than 1000000 kernel names \(limit\)"):
        read_trace(p, progress=False)


def test_every_limit_applies_to_native(tmp_path):
    with pytest.raises(TraceError, match="names"):
        read_trace(names_bomb(tmp_path, 200), progress=False, limits=ReadLimits(max_names=100))
    with pytest.raises(TraceError, match="kernel records"):
        read_trace(NATIVE, progress=False, limits=ReadLimits(max_kernels=1000))
    with pytest.raises(TraceError, match="streams"):
        read_trace(NATIVE, progress=False, limits=ReadLimits(max_streams=3))
    with pytest.raises(TraceError, match="graphs"):
        read_trace(NATIVE, progress=False, limits=ReadLimits(max_graphs=2))


def test_untraced_rows_round_trip_and_old_files_have_none(tmp_path):
    """Optional u_graph/u_duration_ns members (issue 36): written with the trace, read back by
    read_trace_untraced; a file without them (every file written before) reads with none."""
    from graphmon.formats.read import read_trace_untraced

    t = read_trace(NATIVE, progress=False)
    old_t, old_u = read_trace_untraced(NATIVE, progress=False)
    assert len(old_u["duration_ns"]) == 0 and len(old_t) == len(t)
    u = {"graph": np.array([0, 5, -1, 0], np.int32), "duration_ns": np.array([1_500_000, 1_600_000, 9, 1_510_000])}
    path = tmp_path / "u.graphmon.npz"
    write_trace(t, path, untraced=u)
    t2, u2 = read_trace_untraced(path, progress=False)
    assert_same_trace(t, t2)
    assert u2["graph"].dtype == np.int32 and u2["duration_ns"].dtype == np.int64
    assert u2["graph"].tolist() == [0, 5, -1, 0] and u2["duration_ns"].tolist() == u["duration_ns"].tolist()
    assert_same_trace(read_trace(path, progress=False), t)  # read_trace ignores them
    with np.load(path) as z:
        assert {"u_graph", "u_duration_ns"} <= set(z.files)
    write_trace(t, tmp_path / "none.graphmon.npz", untraced={"graph": np.zeros(0), "duration_ns": np.zeros(0)})
    with np.load(tmp_path / "none.graphmon.npz") as z:
        assert "u_graph" not in z.files  # no rows: no members, a file like every old one


@pytest.mark.parametrize("change,msg", [
    ({"u_graph": np.array([0, 99]), "u_duration_ns": np.array([5, 5])}, "must index the trace's 6 graphs"),
    ({"u_graph": np.array([0, -2]), "u_duration_ns": np.array([5, 5])}, "must index"),
    ({"u_graph": np.array([0, 1]), "u_duration_ns": np.array([5, 0])}, "u_duration_ns must be > 0"),
    ({"u_graph": np.array([0]), "u_duration_ns": np.array([5, 6])}, "differ in length"),
    ({"u_graph": np.array([0.5]), "u_duration_ns": np.array([5])}, "must be integer"),
    ({"u_graph": np.array([0])}, "missing array 'u_duration_ns'"),
])
def test_bad_untraced_rows_are_a_one_line_error(tmp_path, change, msg):
    from graphmon.formats.read import read_trace_untraced

    path = tmp_path / "bad.graphmon.npz"
    path.write_bytes(npz_with(NATIVE, **change))
    with pytest.raises(TraceError, match=msg) as e:
        read_trace_untraced(path, progress=False)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
