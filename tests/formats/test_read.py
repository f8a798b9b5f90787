"""Trace readers on the real H200 fixtures (figures derived here with plain json/collections)
and on synthetic good and bad files (every bad file: one-line TraceError naming the file)."""

from __future__ import annotations

import gzip
import io
import json
import os
import statistics
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from graphmon.formats.read import RAW_CUPTI_OFFSET_NS, ReadLimits, read_trace, write_trace
from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, Trace, TraceError

from helpers import DATA
KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"
RAW = DATA / "h200-cupti-decode-v1.npz"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"
BUNDLED = DATA.parent.parent / "graphmon" / "data" / "h200-decode.graphmon.npz"


def us_str_to_ns(s: str) -> int:
    """Kineto µs text -> ns by string arithmetic only (no float, no Decimal)."""
    neg = s.startswith("-")
    s = s.lstrip("-")
    whole, _, frac = s.partition(".")
    assert len(frac) <= 3, s
    ns = int(whole) * 1000 + int((frac + "000")[:3])
    return -ns if neg else ns


@pytest.fixture(scope="module")
def kineto_json():
    with gzip.open(KINETO, "rt") as fh:
        return json.load(fh, parse_float=str)


@pytest.fixture(scope="module")
def kineto_trace():
    return read_trace(KINETO, progress=False)


@pytest.fixture(scope="module")
def raw_arrays():
    with np.load(RAW, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def raw_trace():
    return read_trace(RAW, progress=False)


def assert_same_trace(a: Trace, b: Trace, meta: bool = True) -> None:
    for k in list(KERNEL_COLUMNS) + ["graph"]:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
        assert getattr(a, k).dtype == getattr(b, k).dtype, k
    for k in LAUNCH_COLUMNS:
        np.testing.assert_array_equal(a.launches[k], b.launches[k], err_msg=f"launches.{k}")
    assert a.names == b.names
    assert a.labels == b.labels
    assert a.graphs == b.graphs
    assert dict(a.invalid) == dict(b.invalid)
    if meta:
        assert dict(a.meta) == dict(b.meta)


# ---------------------------------------------------------------------------- Kineto fixture
def test_kineto_kernels_and_exact_ns(kineto_json, kineto_trace):
    kernels = [e for e in kineto_json["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kineto_trace) == len(kernels) == 57_600
    assert kineto_trace.invalid_total == 0
    # Every kernel's start/end in ns, computed from the JSON text without floats.
    want = sorted((us_str_to_ns(e["ts"]), us_str_to_ns(e["ts"]) + us_str_to_ns(e["dur"]), e["args"]["stream"]) for e in kernels)
    got = sorted(zip(kineto_trace.start_ns.tolist(), kineto_trace.end_ns.tolist(), kineto_trace.stream.tolist()))
    assert got == want
    # The example from the spec, literally.
    assert "5351128125842.938" in {e["ts"] for e in kernels}
    assert 5351128125842938 in set(kineto_trace.start_ns.tolist())


def test_kineto_launches_labels_and_graphs(kineto_json, kineto_trace):
    ev = kineto_json["traceEvents"]
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"}
    per_corr = Counter(e["args"]["correlation"] for e in ev if e.get("cat") == "kernel")
    streams = defaultdict(set)
    for e in ev:
        if e.get("cat") == "kernel":
            streams[e["args"]["correlation"]].add(e["args"]["stream"])
    assert set(per_corr) == set(launches)  # every kernel belongs to a graph launch
    assert set(per_corr.values()) == {960}
    assert {len(s) for s in streams.values()} == {4}

    # Innermost record_function range on the launch's thread, by brute force.
    ranges = [e for e in ev if e.get("cat") == "user_annotation"]

    def label_of(launch):
        t = us_str_to_ns(launch["ts"])
        inside = [r for r in ranges if (r["pid"], r["tid"]) == (launch["pid"], launch["tid"]) and us_str_to_ns(r["ts"]) <= t <= us_str_to_ns(r["ts"]) + us_str_to_ns(r["dur"])]
        return max(inside, key=lambda r: us_str_to_ns(r["ts"]))["name"] if inside else None

    tl = kineto_trace.launches
    assert kineto_trace.n_launches == len(launches) == 60
    for i, corr in enumerate(tl["correlation_id"].tolist()):
        assert tl["launch_ns"][i] == us_str_to_ns(launches[corr]["ts"])
        assert kineto_trace.labels[tl["label"][i]] == label_of(launches[corr])
        assert tl["device"][i] == 0
        assert kineto_trace.graphs[tl["graph"][i]].label == label_of(launches[corr])  # filled from its kernels
    # Two graphs (uploaded / not), told apart by label; each kernel in the graph of its launch's label.
    assert sorted(g.label for g in kineto_trace.graphs) == ["shapeA/no_upload", "shapeA/upload"]
    assert all(g.upload_mode == "unknown" for g in kineto_trace.graphs)
    label_by_corr = {c: label_of(launches[c]) for c in launches}
    kg = [kineto_trace.graphs[g].label for g in kineto_trace.graph.tolist()]
    assert kg == [label_by_corr[c] for c in kineto_trace.correlation_id.tolist()]
    assert Counter(kg) == Counter({"shapeA/upload": 28_800, "shapeA/no_upload": 28_800})
    assert kineto_trace.meta["format"] == "kineto"
    assert kineto_trace.meta["source"] == str(KINETO)
    assert kineto_trace.meta["device_names"] == {"0": "NVIDIA H200"}
    assert kineto_trace.meta["cuda_driver_version"] == kineto_json["cuda_driver_version"]


def test_kineto_native_round_trip(kineto_trace, tmp_path):
    p = tmp_path / "k.graphmon.npz"
    write_trace(kineto_trace, p)
    back = read_trace(p, progress=False)
    assert_same_trace(kineto_trace, back)


# ---------------------------------------------------------------------------- raw CUPTI fixture
def test_raw_cupti(raw_arrays, raw_trace):
    z = raw_arrays
    assert len(raw_trace) == len(z["start"]) == 467_200
    assert raw_trace.invalid_total == 0
    np.testing.assert_array_equal(raw_trace.start_ns, z["start"] + RAW_CUPTI_OFFSET_NS)
    np.testing.assert_array_equal(raw_trace.end_ns, z["end"] + RAW_CUPTI_OFFSET_NS)
    assert raw_trace.start_ns.min() > 0
    np.testing.assert_array_equal(raw_trace.stream, z["stream_id"])
    np.testing.assert_array_equal(raw_trace.correlation_id, z["correlation_id"])
    np.testing.assert_array_equal(raw_trace.graph_node_id, z["graph_node_id"])
    assert raw_trace.names == tuple(z["names"].tolist())

    keys = z["graph_keys"].tolist()
    key_of_corr = {int(c): keys[k] for c, k in z["launch_correlation"].tolist()}
    kernels_per_launch = Counter(z["correlation_id"].tolist())
    streams = defaultdict(set)
    gids = defaultdict(set)
    for c, s, g in zip(z["correlation_id"].tolist(), z["stream_id"].tolist(), z["graph_id"].tolist()):
        streams[c].add(s)
        gids[key_of_corr[c]].add(g)
    for c, n in kernels_per_launch.items():
        chain = key_of_corr[c].startswith("chain/")
        assert n == (1000 if chain else 960)
        assert len(streams[c]) == (1 if chain else 4)

    by_label = {g.label: g for g in raw_trace.graphs}
    assert sorted(by_label) == sorted(keys)
    for i, k in enumerate(keys):
        g = by_label[k]
        (gid,) = gids[k]
        assert g.key == f"g{gid}" and g.graph_id == gid
        assert g.exec_handle == int(z["exec_handles"][i])
        assert g.upload_mode == ("uploaded" if k.endswith("/upload") else "lazy")
    # every kernel lands in the graph of its launch's key
    labels = [raw_trace.graphs[g].label for g in raw_trace.graph.tolist()]
    assert labels == [key_of_corr[c] for c in z["correlation_id"].tolist()]
    # launch rows: the launches whose kernels were traced, graph index by key, no CPU timestamp
    tl = raw_trace.launches
    assert sorted(tl["correlation_id"].tolist()) == sorted(kernels_per_launch)
    for c, g in zip(tl["correlation_id"].tolist(), tl["graph"].tolist()):
        assert raw_trace.graphs[g].label == key_of_corr[c]
    assert set(tl["launch_ns"].tolist()) == {-1}
    assert raw_trace.meta["launches_outside_kernel_trace"] == len(key_of_corr) - len(kernels_per_launch)
    # event_ms_* summaries: medians per key and phase
    med = raw_trace.meta["event_ms_median"]
    for name, arr in z.items():
        if name.startswith("event_ms_"):
            phase = name[len("event_ms_"):]
            for i, k in enumerate(keys):
                assert med[phase][k] == pytest.approx(statistics.median(arr[i].tolist()), rel=0, abs=1e-12)


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


# ---------------------------------------------------------------------------- synthetic Kineto
def kernel(ts, dur=1.5, stream=7, corr=1, device=0, name="k", **extra):
    e = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
         "args": {"device": device, "stream": stream, "correlation": corr}}
    e.update(extra)
    return e


def launch(ts, corr, name="cudaGraphLaunch", cat="cuda_runtime", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 5, "args": {"correlation": corr}}


def annotation(ts, dur, name, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def without(e: dict, key: str) -> dict:
    return {k: v for k, v in e.items() if k != key}


def write_json(path: Path, events, gz=False, top=None, raw: str | None = None) -> Path:
    text = raw if raw is not None else json.dumps(dict(top or {}, traceEvents=events))
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_synthetic_launch_names_labels_and_eager(tmp_path):
    ev = [
        annotation(100, 1000, "outer"),
        annotation(150, 100, "inner"),
        annotation(150, 100, "other-thread", tid=2),
        launch(200, 10),  # inside inner (and outer): innermost wins
        launch(400, 11, name="cudaGraphLaunch_v10000"),  # only outer
        launch(5000, 12, name="cuGraphLaunch", cat="cuda_driver"),  # outside every range
        kernel(300, corr=10, name="a"), kernel(302, corr=10, stream=8, name="b"),
        kernel(500, corr=11, name="a"), kernel(502, corr=11, stream=8, name="b"),
        kernel(5100, corr=12, name="a"), kernel(5102, corr=12, stream=8, name="b"),
        kernel(6000, corr=99, name="eager"),  # no launch with this correlation: eager
    ]
    t = read_trace(write_json(tmp_path / "s.json", ev), progress=False)
    assert len(t) == 7 and t.invalid_total == 0
    rows = {c: i for i, c in enumerate(t.launches["correlation_id"].tolist())}
    assert sorted(rows) == [10, 11, 12]  # no launch row for the eager kernel
    lab = lambda c: t.labels[t.launches["label"][rows[c]]] if t.launches["label"][rows[c]] >= 0 else None  # noqa: E731
    assert (lab(10), lab(11), lab(12)) == ("inner", "outer", None)
    for c, r in rows.items():  # each launch row names the graph its kernels landed in
        assert {int(g) for g in t.graph[t.correlation_id == c]} == {int(t.launches["graph"][r])}
    assert t.launches["launch_ns"][rows[11]] == 400_000
    eager = t.correlation_id == 99
    assert (t.graph[eager] == -1).all() and (t.graph[~eager] >= 0).all()
    # same kernels, different labels: three graphs by signature
    assert len({int(g) for g in t.graph[~eager]}) == 3


def test_synthetic_bad_records_are_counted(tmp_path):
    good = [kernel(1000 + i, corr=5) for i in range(3)]
    bad = {
        "missing_field": [without(kernel(10, corr=5), "ts"), {"cat": "kernel", "ph": "X", "ts": 5, "dur": 1}],
        "non_numeric": [kernel("12", corr=5), kernel(True, corr=5), kernel(13, dur=[1], corr=5), kernel(14, stream="7", corr=5)],
        "non_integer": [kernel(15, stream=7.5, corr=5)],
        "out_of_range": [kernel(10**16, corr=5), kernel(10**40, corr=5), kernel(16, device=2**20, corr=5), kernel(17, corr=2**60)],
        "bad_phase": [kernel(18, corr=5, ph="B")],
        "bad_name": [kernel(19, corr=5, name=42)],
        "negative_timestamp": [kernel(-20, corr=5)],
        "end_before_start": [kernel(21, dur=-1, corr=5)],
        "zero_start": [kernel(0, corr=5)],
        "duplicate": [kernel(1000, corr=5)],
    }
    events = good + [e for es in bad.values() for e in es]
    # NaN is not JSON but Python's json writes it; counted, not fatal
    text = json.dumps({"traceEvents": events + [kernel(float("nan"), corr=5)]})
    t = read_trace(write_json(tmp_path / "bad.json", None, raw=text), progress=False)
    want = {k: len(v) for k, v in bad.items()}
    want["non_numeric"] += 1
    assert dict(t.invalid) == want
    assert len(t) == len(good)
    assert len(t) + t.invalid_total == len(events) + 1


def test_synthetic_unicode_and_surrogate_names(tmp_path):
    ev = [launch(1, 3), kernel(10, corr=3, name="ядро_核_🚀"), kernel(11, corr=3, name="bad\ud800half", stream=8)]
    text = json.dumps({"traceEvents": ev})  # ensure_ascii: the lone surrogate becomes \ud800
    t = read_trace(write_json(tmp_path / "u.json", None, raw=text), progress=False)
    assert "ядро_核_🚀" in t.names
    assert "bad\ufffdhalf" in t.names
    p = tmp_path / "u.graphmon.npz"
    write_trace(t, p)
    assert read_trace(p, progress=False).names == t.names


def test_dispatch_by_content_not_extension(tmp_path):
    ev = [launch(1, 3), kernel(10, corr=3)]
    a = read_trace(write_json(tmp_path / "looks-like.npz", ev, gz=True), progress=False)
    b = read_trace(write_json(tmp_path / "plain.txt", None, raw="  \n" + json.dumps(ev)), progress=False)  # JSON array format
    assert len(a) == len(b) == 1
    native = tmp_path / "native.json"
    write_trace(a, native)
    os.replace(str(native) + "", native)  # save wrote exactly this name
    assert len(read_trace(native, progress=False)) == 1


def test_event_split_across_read_chunks(tmp_path):
    # > 1 MiB of padding events so kernels straddle the reader's chunk boundaries
    pad = [{"ph": "i", "cat": "pad", "name": "x" * 1000, "ts": i} for i in range(3000)]
    ev = [launch(1, 3)] + [e for i in range(500) for e in (pad[i], kernel(10 + i, corr=3, name=f"k{i % 7}"))] + pad[500:]
    t = read_trace(write_json(tmp_path / "big.json.gz", ev, gz=True), progress=False)
    assert len(t) == 500
    assert sorted(t.start_ns.tolist()) == [(10 + i) * 1000 for i in range(500)]


def test_progress_bar(tmp_path, capsys):
    p = write_json(tmp_path / "p.json", [launch(1, 3), kernel(10, corr=3)])
    read_trace(p, progress=False)
    read_trace(p)  # small file: auto means no bar
    assert capsys.readouterr().err == ""
    read_trace(p, progress=True)
    assert capsys.readouterr().err != ""


# ---------------------------------------------------------------------------- bad files
def npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def truncated_gzip() -> bytes:
    return KINETO.read_bytes()[:50_000]


def corrupt_gzip() -> bytes:
    b = bytearray(gzip.compress(json.dumps({"traceEvents": [kernel(10)]}).encode()))
    b[-6] ^= 0xFF  # CRC
    return bytes(b)


def huge_header_npz() -> bytes:
    # a valid zip whose npy header claims 10^12 int64 but stores 8 bytes
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    member = b"\x93NUMPY\x01\x00" + head.getvalue()[8:] + b"\0" * 8
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("start.npy", member)
    return buf.getvalue()


def npz_with(path, **changes) -> bytes:
    """An npz fixture with arrays replaced or (value None) removed."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    return npz_bytes(**arrays)


def native_with(tmp_path, **changes) -> bytes:
    """The native fixture with arrays replaced or (value None) removed."""
    return npz_with(NATIVE, **changes)


def meta_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), np.uint8)


def native_meta(**over):
    with np.load(NATIVE, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta_json"]).decode())
    meta.update(over)
    return meta


def raw_with(**changes) -> bytes:
    return npz_with(RAW, **changes)


BAD_FILES = {
    "empty": lambda tp: b"",
    "not-json": lambda tp: b"hello, this is not a trace\n",
    "json-garbage": lambda tp: b'{"traceEvents": [ {"ts": 1,, } ]}',
    "json-truncated": lambda tp: json.dumps({"traceEvents": [kernel(10)] * 5}).encode()[:-30],
    "json-extra-data": lambda tp: json.dumps({"traceEvents": [kernel(10)]}).encode() + b" {}",
    "json-scalar": lambda tp: b"[1, 2, 3]",
    "json-no-trace-events": lambda tp: json.dumps({"foo": [kernel(10)]}).encode(),
    "json-trace-events-not-list": lambda tp: json.dumps({"traceEvents": {"a": 1}}).encode(),
    "json-no-kernels": lambda tp: json.dumps({"traceEvents": [launch(1, 2), annotation(0, 5, "x")]}).encode(),
    "json-non-utf8": lambda tp: b'{"traceEvents": [{"name": "\xff\xfe"}]}',
    "json-5000-digit-int": lambda tp: b'{"traceEvents": [{"cat": "kernel", "ts": ' + b"9" * 5000 + b"}]}",
    "json-deep-nesting": lambda tp: b'{"traceEvents": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}",
    "gzip-truncated": lambda tp: truncated_gzip(),
    "gzip-corrupt-crc": lambda tp: corrupt_gzip(),
    "zip-truncated": lambda tp: NATIVE.read_bytes()[: NATIVE.stat().st_size // 2],
    "npz-unknown-keys": lambda tp: npz_bytes(x=np.arange(3)),
    "npz-pickled-object": lambda tp: (lambda b: b)(_pickled_npz()),
    "npz-huge-header": lambda tp: huge_header_npz(),
    "native-float-column": lambda tp: native_with(tp, k_start_ns=np.linspace(1, 2, 467_200)),
    "native-missing-column": lambda tp: native_with(tp, k_end_ns=None),
    "native-meta-not-object": lambda tp: native_with(tp, meta_json=meta_bytes([1, 2])),
    "native-meta-bad-version": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(version=99))),
    "native-meta-bad-graphs": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=[{"nope": 1}]))),
    "native-meta-graphs-int": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=5))),
    "native-meta-bad-upload-mode": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=[{"key": "a", "upload_mode": "x"}]))),
    "native-meta-not-utf8": lambda tp: native_with(tp, meta_json=np.frombuffer(b"\xff\xfe", np.uint8)),
    "raw-missing-start-length": lambda tp: raw_with(end=np.arange(5)),
    "raw-float-start": lambda tp: raw_with(start=np.zeros(467_200)),
    "raw-launch-key-out-of-range": lambda tp: raw_with(launch_correlation=np.array([[1, 99]])),
    "raw-no-kernels": lambda tp: raw_with(**{k: np.zeros(0, np.int64) for k in ("start", "end", "stream_id", "graph_id", "graph_node_id", "correlation_id", "name_id")}),
    "zstd": lambda tp: b"\x28\xb5\x2f\xfd" + b"\0" * 20,
}


def _pickled_npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, meta_json=np.array([{"a": 1}], dtype=object))
    return buf.getvalue()


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_raises_one_line_trace_error(case, tmp_path):
    p = tmp_path / f"{case}.trace"
    p.write_bytes(BAD_FILES[case](tmp_path))
    with pytest.raises(TraceError) as ei:
        read_trace(p, progress=False)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg and len(msg) < 500


def test_missing_file_directory_and_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block until a writer comes
    for p in (tmp_path / "nope.json", tmp_path, fifo):
        with pytest.raises(TraceError, match=str(p)):
            read_trace(p, progress=False)


def test_decompression_bomb_is_capped(tmp_path):
    # 64 MiB of whitespace inside the events list compresses to ~64 kB
    raw = b'{"traceEvents": [' + b" " * (64 << 20) + b"]}"
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(raw, compresslevel=9))
    assert p.stat().st_size < 200_000
    with pytest.raises(TraceError, match="limit"):
        read_trace(p, progress=False, limits=ReadLimits(max_decompressed_bytes=8 << 20))


def test_npz_size_cap(tmp_path):
    with pytest.raises(TraceError, match="limit"):
        read_trace(NATIVE, progress=False, limits=ReadLimits(max_decompressed_bytes=1 << 20))


def test_one_huge_event_is_capped(tmp_path):
    p = write_json(tmp_path / "h.json", [kernel(10, name="x" * (3 << 20))])
    with pytest.raises(TraceError, match="larger than"):
        read_trace(p, progress=False, limits=ReadLimits(max_event_bytes=1 << 20))


def test_stream_and_kernel_caps(tmp_path):
    p = write_json(tmp_path / "s.json", [kernel(10 + i, stream=i, corr=1) for i in range(50)])
    with pytest.raises(TraceError, match="streams"):
        read_trace(p, progress=False, limits=ReadLimits(max_streams=10))
    with pytest.raises(TraceError, match="kernel events"):
        read_trace(p, progress=False, limits=ReadLimits(max_kernels=20))
    assert len(read_trace(p, progress=False, limits=ReadLimits(max_streams=50))) == 50
