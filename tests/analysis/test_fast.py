"""analysis/fast.py against analysis/reference.py (today's implementation): bit-identical results
on every test trace, on shuffled copies, on multi-device traces and on generated traces; the
fallback is taken (and counted) exactly where the data breaks an ordering the fast path needs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.analysis import replays
from graphmon.analysis.fast import Unordered, analyze_grouped, grouped_runs
from graphmon.analysis.results import NO_VALUE
from graphmon.analysis.reference import analyze_reference, reference_runs
from graphmon.formats.read import read_trace
from graphmon.model.trace import GraphInfo, Trace, concat
from helpers import DATA, KINETO, NATIVE

TRACES = [NATIVE, KINETO, DATA / "h200-graphmon-chain.graphmon.npz", DATA / "h200-graphmon-decode.graphmon.npz",
          DATA / "h200-cupti-decode-v1.npz"]


def assert_identical(a, b):
    """Every column of the replay table and the stream gaps: same values, dtype and order."""
    for part in ("replays", "gaps"):
        x, y = getattr(a, part), getattr(b, part)
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            assert u.dtype == v.dtype and u.shape == v.shape, (part, f.name, u.dtype, v.dtype, u.shape, v.shape)
            assert np.array_equal(u, v), (part, f.name)


def analyze_grouped_only(trace):
    out, _ = analyze_grouped(trace)
    return out


def assert_runs_identical(trace):
    """replay_stream_gaps reads the same runs from either path."""
    a, b = grouped_runs(trace), reference_runs(trace)
    # the fast path orders runs by (device-graph, stream, replay), the reference by (replay,
    # stream): compare them as (replay, stream, start, end) rows
    ka = np.lexsort((a.end, a.start, a.srank, a.rid))
    kb = np.lexsort((b.end, b.start, b.srank, b.rid))
    for f in ("rid", "srank", "start", "end", "stream"):
        assert np.array_equal(getattr(a, f)[ka], getattr(b, f)[kb]), f


def shuffled(trace: Trace, seed: int) -> Trace:
    perm = np.random.default_rng(seed).permutation(len(trace))
    return Trace.build(start_ns=trace.start_ns[perm], end_ns=trace.end_ns[perm], stream=trace.stream[perm],
                       correlation_id=trace.correlation_id[perm], device=trace.device[perm],
                       graph_id=trace.graph_id[perm], graph_node_id=trace.graph_node_id[perm],
                       name_id=trace.name_id[perm], names=trace.names, launches=trace.launches,
                       graphs=trace.graphs, labels=trace.labels, meta=trace.meta)


def on_device(trace: Trace, device: int) -> Trace:
    launches = dict(trace.launches)
    launches["device"] = np.full(len(launches["device"]), device, np.int32)
    return Trace.build(start_ns=trace.start_ns, end_ns=trace.end_ns, stream=trace.stream,
                       correlation_id=trace.correlation_id, device=np.full(len(trace), device, np.int32),
                       graph_id=trace.graph_id, graph_node_id=trace.graph_node_id, name_id=trace.name_id,
                       names=trace.names, launches=launches, graphs=trace.graphs, labels=trace.labels)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name)
def trace(request):
    return read_trace(request.param, progress=False)


def test_identical_on_test_traces_and_shuffled_copies(trace):
    assert_identical(replays.analyze(trace), analyze_reference(trace))
    for seed in (1, 2):
        s = shuffled(trace, seed)
        replays.PATHS.clear()
        assert_identical(replays.analyze(s), analyze_reference(s))
        assert replays.PATHS["grouped"] == 0  # a shuffle breaks the replay grouping: counted fallback
        assert sum(replays.PATHS.values()) == 1


def test_real_cupti_capture_takes_the_fast_path():
    t = read_trace(NATIVE, progress=False)
    replays.PATHS.clear()
    a = replays.analyze(t)
    assert dict(replays.PATHS) == {"grouped": 1}
    assert len(a.replays) == 480 and len(a.gaps) > 0
    assert_runs_identical(t)


def test_paths_and_fallback_reasons_are_counted():
    chain = read_trace(DATA / "h200-graphmon-chain.graphmon.npz", progress=False)
    kineto = read_trace(KINETO, progress=False)
    # one stream's records go back in time in this capture: sorted within their group, fast path
    assert analyze_grouped(chain)[1] == "grouped_resorted"
    assert_runs_identical(chain)
    with pytest.raises(Unordered, match="replays_not_grouped"):
        analyze_grouped(kineto)  # profiler windows repeat correlation ids
    replays.PATHS.clear()
    replays.analyze(chain)
    replays.analyze(kineto)
    assert dict(replays.PATHS) == {"grouped_resorted": 1, "replays_not_grouped": 1}


def test_multi_device_traces():
    t = read_trace(NATIVE, progress=False)
    # device 0 then device 1: blocks in replay-key order, the fast path holds
    both = concat([t, on_device(t, 1)])
    replays.PATHS.clear()
    assert_identical(replays.analyze(both), analyze_reference(both))
    assert replays.PATHS["grouped"] == 1
    assert_runs_identical(both)
    # interleaved devices (records in time order across devices): keys out of order, reference
    half = len(t) // 2
    mixed = concat([t.select(np.arange(len(t)) < half), on_device(t, 3), t.select(np.arange(len(t)) >= half)])
    assert_identical(replays.analyze(mixed), analyze_reference(mixed))
    s = shuffled(both, 3)
    assert_identical(replays.analyze(s), analyze_reference(s))


def test_non_graph_kernels_and_launches():
    t = read_trace(DATA / "h200-graphmon-decode.graphmon.npz", progress=False)
    keep = np.ones(len(t), bool)
    keep[::7] = False  # drop some kernels: the rest stays grouped
    sub = t.select(keep)
    assert_identical(analyze_grouped_only(sub), analyze_reference(sub))


# ---------------------------------------------------------------------- generated traces
@st.composite
def traces(draw):
    """Replays of a few graphs on a few streams and devices, in delivery order or not."""
    n_rep = draw(st.integers(1, 12))
    rows = []
    corr = draw(st.integers(1, 5))
    t = draw(st.integers(1, 10_000))
    devices = draw(st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True))
    for _ in range(n_rep):
        dev = draw(st.sampled_from(devices))
        gid = draw(st.integers(1, 3))
        # small ids are their own group slots in the fast path; 1 << 16 makes it rank them densely
        streams = draw(st.lists(st.sampled_from([3, 7, 8, 300, 1 << 16]), min_size=1, max_size=3, unique=True))
        per_stream = []
        for s in streams:
            k = draw(st.integers(1, 5))
            ts = t + np.cumsum(draw(st.lists(st.integers(-40, 400), min_size=k, max_size=k)))
            durs = draw(st.lists(st.integers(0, 300), min_size=k, max_size=k))
            iv = sorted((int(max(1, a)), int(max(1, a)) + d) for a, d in zip(ts, durs))
            per_stream.append([(a, b, s, corr, gid, dev) for a, b in iv])
        # interleave the streams' (sorted) kernels in a random order: delivery order
        order = draw(st.permutations([i for i, ks in enumerate(per_stream) for _ in ks]))
        pos = [0] * len(per_stream)
        for i in order:
            rows.append(per_stream[i][pos[i]])
            pos[i] += 1
        corr += draw(st.integers(1, 3))
        t += draw(st.integers(0, 3000))
    if draw(st.booleans()):
        rows.append((t + 5, t + 50, 3, corr + 100, 0, devices[0]))  # an eager (non-graph) kernel
    mess = draw(st.sampled_from(["none", "swap", "shuffle"]))
    if mess == "swap" and len(rows) > 1:
        i = draw(st.integers(0, len(rows) - 2))
        rows[i], rows[i + 1] = rows[i + 1], rows[i]
    elif mess == "shuffle":
        rows = draw(st.permutations(rows))
    a = np.array(rows, dtype=np.int64).reshape(-1, 6)
    graphs = [GraphInfo(key=f"g{g}", graph_id=g, upload_mode="uploaded") for g in (1, 2, 3)]
    launches = None
    if draw(st.booleans()):
        c = np.unique(a[:, 3])
        launches = {"correlation_id": c, "device": np.full(len(c), devices[0]), "graph": np.zeros(len(c)),
                    "launch_ns": np.maximum(1, np.full(len(c), t // 2)), "stream": np.full(len(c), -1)}
    return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                       graph_id=a[:, 4], device=a[:, 5], graphs=graphs, launches=launches)


@settings(max_examples=400, deadline=None)
@given(traces())
def test_analyze_equals_reference_on_generated_traces(t):
    assert_identical(replays.analyze(t), analyze_reference(t))
    try:
        assert_identical(analyze_grouped_only(t), analyze_reference(t))
    except Unordered:
        return
    assert_runs_identical(t)
    a, b = replays.replay_stream_gaps(t), _rsg_reference(t)
    for f in dataclasses.fields(a):
        assert np.array_equal(getattr(a, f.name), getattr(b, f.name), equal_nan=True), f.name


def _rsg_reference(t):
    """replay_stream_gaps read from the reference's runs."""
    orig = replays._runs
    try:
        replays._runs = reference_runs
        return replays.replay_stream_gaps(t)
    finally:
        replays._runs = orig


def test_equal_starts_on_one_stream_must_come_in_end_order():
    """The reference orders equal starts by end; records that do not are sorted first."""
    def build(rows):
        a = np.array(rows, dtype=np.int64)
        return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                           graph_id=np.ones(len(a), np.int64))

    ok = build([(100, 150, 1, 7), (100, 180, 1, 7), (300, 400, 1, 7)])
    bad = build([(100, 180, 1, 7), (100, 150, 1, 7), (300, 400, 1, 7)])
    assert analyze_grouped(ok)[1] == "grouped"
    assert_identical(analyze_grouped_only(ok), analyze_reference(ok))
    assert analyze_grouped(bad)[1] == "grouped_resorted"
    a = replays.analyze(bad)
    assert_identical(a, analyze_reference(bad))
    assert sorted(a.gaps.values.tolist()) == [-50, 120]  # (100, 150) -> (100, 180) -> (300, 400)


@pytest.mark.parametrize("loop_max", [0, 1024])
def test_first_kernel_by_start_both_ways(monkeypatch, loop_max):
    """The stream of a replay's earliest kernel (first in input order among equal starts) stands
    in for an unknown launch stream: per-replay argmin or the vectorised search give the same."""
    from graphmon.analysis import fast

    monkeypatch.setattr(fast, "ARGMIN_LOOP_MAX", loop_max)
    rows = [(200, 300, 2, 1), (100, 150, 1, 1), (100, 120, 3, 1),  # earliest: stream 1 (first of the tie)
            (500, 600, 1, 2), (450, 700, 4, 2),  # earliest: stream 4, not first in input
            (900, 950, 5, 3)]
    a = np.array(rows, dtype=np.int64)
    t = Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                    graph_id=np.ones(len(a), np.int64))
    assert fast._first_rows(t.start_ns, fast._segments(t.start_ns, t.end_ns, t.device, t.correlation_id,
                                                       t.graph)[0]).tolist() == [1, 4, 5]
    assert_identical(analyze_grouped_only(t), analyze_reference(t))
    assert replays.analyze(t).replays.inter_replay_gap_ns.tolist()[1:] == [NO_VALUE, NO_VALUE]  # own streams
