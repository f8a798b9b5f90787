"""Kineto (PyTorch profiler Chrome JSON) reader: the real H200 trace (figures derived here with
plain json/collections, no float arithmetic) and synthetic event lists."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.formats.read import ReadLimits, read_trace, write_trace
from graphmon.model.trace import TraceError

from tracefiles import KINETO, annotation, assert_same_trace, kernel, launch, us_str_to_ns, without, write_json

@pytest.fixture(scope="module")
def kineto_json():
    with gzip.open(KINETO, "rt") as fh:
        return json.load(fh, parse_float=str)


@pytest.fixture(scope="module")
def kineto_trace():
    return read_trace(KINETO, progress=False)


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


# ---------------------------------------------------------------------------- issue 18: limits, old categories, memops
def test_record_function_ranges_have_a_limit(tmp_path):
    ev = [annotation(10 * i, 5, f"r{i % 3}") for i in range(50)] + [launch(1, 3), kernel(10, corr=3)]
    p = write_json(tmp_path / "ranges.json", ev)
    with pytest.raises(TraceError, match=r"more than 20 record_function ranges \(limit\)"):
        read_trace(p, progress=False, limits=ReadLimits(max_ranges=20))
    assert len(read_trace(p, progress=False, limits=ReadLimits(max_ranges=50))) == 1


def test_torch_1_9_categories_are_read(tmp_path):
    """torch <= 1.9 wrote cat "Kernel" / "Runtime" / "Memcpy"; the same trace as today's names."""
    new = [annotation(0, 1000, "step"), launch(100, 7), kernel(200, corr=7, name="a"), kernel(203, corr=7, stream=8, name="b"),
           {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "pid": 0, "tid": 7, "ts": 206, "dur": 0.5, "args": {"correlation": 7}}]
    old = json.loads(json.dumps(new).replace('"kernel"', '"Kernel"').replace('"cuda_runtime"', '"Runtime"').replace('"gpu_memcpy"', '"Memcpy"'))
    a = read_trace(write_json(tmp_path / "new.json", new), progress=False)
    b = read_trace(write_json(tmp_path / "old.json", old), progress=False)
    assert len(b) == 2 and b.n_launches == 1 and b.labels == ("step",)
    assert_same_trace(a, b, meta=False)
    assert a.meta["graph_memops"] == b.meta["graph_memops"] == {"memcpy": 1, "memcpy_ns": 500, "memset": 0, "memset_ns": 0}


def test_no_kernels_names_the_categories_seen(tmp_path):
    ev = [{"ph": "X", "cat": "GpuKernelThing", "name": "k", "ts": i, "dur": 1} for i in range(3)] + [launch(1, 2)]
    with pytest.raises(TraceError, match=r"categories seen: 'GpuKernelThing' \(3\)"):
        read_trace(write_json(tmp_path / "cats.json", ev), progress=False)


def test_graph_memops_are_counted_apart_from_kernels(tmp_path):
    memset = {"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 0, "tid": 7, "ts": 5, "dur": 2, "args": {"correlation": 3}}
    eager = dict(memset, args={"correlation": 99})  # not a graph launch's: not counted
    t = read_trace(write_json(tmp_path / "m.json", [launch(1, 3), kernel(10, corr=3), memset, eager]), progress=False)
    assert len(t) == 1
    assert t.meta["graph_memops"] == {"memcpy": 0, "memcpy_ns": 0, "memset": 1, "memset_ns": 2000}


# ---------------------------------------------------------------------------- floats without Decimal, flows skipped
@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.integers(0, 10**19), st.text("0123456789", min_size=1, max_size=7),
       st.one_of(st.none(), st.integers(-4, 4)))
def test_float_text_to_ns_equals_the_decimal_conversion(neg, whole, frac, exp):
    """Microseconds from a float's text by string arithmetic: exactly what the Decimal path
    gives, for every fraction length, exponent, sign and magnitude (range limits included)."""
    from decimal import Decimal

    from graphmon.formats.jsonstream import FloatText
    from graphmon.formats.kineto import _us_to_ns

    text = ("-" if neg else "") + f"{whole}.{frac}" + ("" if exp is None else f"e{exp}")
    assert _us_to_ns(FloatText(text)) == _us_to_ns(Decimal(text)), text


def test_flow_events_are_skipped_yet_counted_and_the_trace_is_unchanged(tmp_path, kineto_trace):
    """The shared trace's 57,722 ac2g flow events are passed over undecoded: the same kernels,
    launches and labels as a read that decodes every event (the skip pattern switched off)."""
    import graphmon.formats.kineto as kineto

    class Never:
        @staticmethod
        def match(buf, pos):
            return None

    decoded = []
    real_add = kineto._KinetoBuilder.add

    def spy(self, e):
        decoded.append(e.get("cat") if type(e) is dict else None)
        return real_add(self, e)

    saved = kineto.FLOW_EVENT
    try:
        kineto._KinetoBuilder.add = spy
        t = read_trace(KINETO, progress=False)
        first, flows_decoded = len(decoded), decoded.count("ac2g")
        assert flows_decoded < 100  # only flows at a read-buffer edge take the decoding path
        decoded.clear()
        kineto.FLOW_EVENT = Never()
        slow = read_trace(KINETO, progress=False)
        assert decoded.count("ac2g") == 57_722 and len(decoded) - first == 57_722 - flows_decoded
    finally:
        kineto._KinetoBuilder.add = real_add
        kineto.FLOW_EVENT = saved
    assert_same_trace(t, slow)
    assert_same_trace(t, kineto_trace)


def test_no_kernels_error_still_names_skipped_flow_events(tmp_path):
    flow = {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 5.5, "cat": "ac2g", "name": "ac2g", "bp": "e"}
    text = '{"traceEvents": [' + ",\n".join(json.dumps(flow) for _ in range(3)) + "]}\n"
    with pytest.raises(TraceError, match=r"'ac2g' \(3\)"):
        read_trace(write_json(tmp_path / "flows.json", None, raw=text), progress=False)
