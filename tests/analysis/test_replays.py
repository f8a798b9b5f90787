"""analysis/replays.py against a plain-Python reference, scenario fixtures and the real H200 capture."""

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphmon.analysis.replays import NO_VALUE, analyze, replay_stream_gaps_with_values
from graphmon.model.trace import GraphInfo, Trace

from helpers import DATA


def build(rows, launches=None, graphs=()):
    """rows: (start, end, stream, corr, graph_id[, device])"""
    rows = list(rows)
    a = np.array([r + (0,) * (6 - len(r)) for r in rows], dtype=np.int64).reshape(-1, 6)
    return Trace.build(
        start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3], graph_id=a[:, 4],
        device=a[:, 5], launches=launches, graphs=graphs,
    )


def reference(rows):
    """Straightforward per-replay loops: the definition, written for reading, not speed."""
    replays = defaultdict(list)
    for s, e, stream, corr, gid, dev in rows:
        if gid > 0 and s > 0 and e >= s:
            replays[(dev, corr)].append((s, e, stream, gid))
    out = {}
    gaps = defaultdict(list)
    for key, ks in replays.items():
        span = max(e for _, e, _, _ in ks) - min(s for s, _, _, _ in ks)
        busy, cur_s, cur_e = 0, None, None
        for s, e, _, _ in sorted(ks):
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        out[key] = (span, busy, len(ks))
        by_stream = defaultdict(list)
        for s, e, stream, gid in ks:
            by_stream[(stream, gid)].append((s, e))
        for (stream, gid), iv in by_stream.items():
            iv.sort()
            for (s0, e0), (s1, e1) in zip(iv, iv[1:]):
                gaps[(key[0], gid, stream)].append(s1 - e0)
    return out, gaps


row = st.tuples(
    st.integers(1, 5_000),  # start
    st.integers(0, 800),  # duration
    st.integers(0, 3),  # stream
    st.integers(1, 6),  # correlation
    st.sampled_from([0, 1, 2]),  # graph id (0 = not a graph kernel)
    st.integers(0, 1),  # device
)


@settings(max_examples=300, deadline=None)
@given(st.lists(row, min_size=0, max_size=60))
def test_matches_reference(raw):
    # One graph id per correlation (a launch runs one graph; correlation 3 and 6 are eager kernels).
    rows = [(s, s + d, stream, corr, 0 if corr % 3 == 0 else (corr % 2) + 1, dev) for s, d, stream, corr, _, dev in raw]
    rows = list(dict.fromkeys(rows))  # exact duplicates are a separate (tested) concern
    t = build(rows)
    a = analyze(t)
    ref, ref_gaps = reference(rows)
    got = {}
    for i in range(len(a.replays)):
        r = a.replays
        got[(int(r.device[i]), int(r.correlation_id[i]))] = (int(r.span_ns[i]), int(r.busy_ns[i]), int(r.kernels[i]))
    assert got == ref
    assert (a.replays.idle_ns == a.replays.span_ns - a.replays.busy_ns).all()
    got_gaps = {}
    for j in range(len(a.gaps)):
        key = (int(a.gaps.device[j]), t.graphs[a.gaps.graph[j]].graph_id, int(a.gaps.stream[j]))
        got_gaps[key] = sorted(a.gaps.values[a.gaps.offsets[j] : a.gaps.offsets[j + 1]].tolist())
    assert got_gaps == {k: sorted(v) for k, v in ref_gaps.items()}


def test_overlap_on_one_stream_is_a_negative_gap():
    t = build([(100, 200, 1, 7, 1), (150, 300, 1, 7, 1), (310, 400, 1, 7, 1)])
    a = analyze(t)
    assert sorted(a.gaps.values.tolist()) == [-50, 10]
    assert a.replays.busy_ns.tolist() == [290]  # union [100, 300) + [310, 400)
    assert a.replays.span_ns.tolist() == [300]


def test_out_of_order_records_give_the_same_result():
    rows = [(100, 200, 1, 7, 1), (250, 300, 1, 7, 1), (120, 260, 2, 7, 1), (400, 500, 1, 8, 1)]
    a1, a2 = analyze(build(rows)), analyze(build(rows[::-1]))
    for f in ("span_ns", "busy_ns", "kernels", "inter_replay_gap_ns"):
        assert getattr(a1.replays, f).tolist() == getattr(a2.replays, f).tolist()
    assert a1.gaps.values.tolist() == a2.gaps.values.tolist()


def test_single_kernel_replay_has_no_gaps_and_zero_idle():
    a = analyze(build([(100, 200, 1, 7, 1)]))
    assert len(a.replays) == 1 and len(a.gaps) == 0
    assert a.replays.idle_ns.tolist() == [0]
    assert a.replays.inter_replay_gap_ns.tolist() == [NO_VALUE]


def test_zero_start_and_end_before_start_are_counted_and_excluded():
    t = build([(0, 10, 1, 7, 1), (100, 50, 1, 7, 1), (100, 200, 1, 7, 1), (100, 200, 1, 7, 1)])
    assert t.invalid == {"zero_start": 1, "end_before_start": 1, "duplicate": 1}
    assert len(t) == 1


def test_multiple_devices_are_separate_replays_and_streams():
    # Same correlation id and stream number on two devices: two replays, two stream groups.
    t = build([(100, 200, 1, 7, 1, 0), (300, 400, 1, 7, 1, 0), (100, 150, 1, 7, 1, 1), (500, 600, 1, 7, 1, 1)])
    a = analyze(t)
    assert sorted(a.replays.device.tolist()) == [0, 1]
    assert sorted(a.gaps.values.tolist()) == [100, 350]


def test_ten_thousand_streams():
    n = 10_000
    s = np.arange(n, dtype=np.int64)
    rows = [(1000 + i, 1100 + i, i, 1, 1) for i in range(n)] + [(2000 + i, 2100 + i, i, 1, 1) for i in range(n)]
    a = analyze(build(rows))
    assert len(a.gaps) == n
    assert (a.gaps.values == 900).all()
    assert a.replays.kernels.tolist() == [2 * n]
    del s


def test_non_graph_kernels_are_left_out_of_replays():
    t = build([(100, 200, 1, 7, 1), (300, 400, 1, 8, 0)])
    a = analyze(t)
    assert len(a.replays) == 1 and int((t.graph < 0).sum()) == 1


def test_launch_latency_and_inter_replay_gap():
    graphs = [GraphInfo(key="g1", graph_id=1, upload_mode="uploaded")]
    launches = {
        "correlation_id": [7, 8],
        "graph": [0, 0],
        "launch_ns": [50, 350],
        "stream": [5, 5],
    }
    t = build([(100, 200, 1, 7, 1), (220, 300, 2, 7, 1), (400, 500, 1, 8, 1)], launches=launches, graphs=graphs)
    a = analyze(t)
    assert a.replays.launch_latency_ns.tolist() == [50, 50]
    assert a.replays.inter_replay_gap_ns.tolist() == [NO_VALUE, 100]
    assert t.graphs[a.replays.graph[0]].upload_mode == "uploaded"


def test_real_h200_capture_figures():
    """The real 467,200-kernel H200 capture: figures derived here independently of analysis.py."""
    z = np.load(DATA / "h200-cupti-decode-v1.npz")
    t = Trace.build(
        start_ns=z["start"] + 10**9, end_ns=z["end"] + 10**9, stream=z["stream_id"],
        correlation_id=z["correlation_id"], graph_id=z["graph_id"],
    )
    a = analyze(t)
    corr = z["correlation_id"]
    assert len(a.replays) == len(np.unique(corr))
    # gaps on a stream = kernels on that (graph, stream) - replays touching that stream
    for j in range(len(a.gaps)):
        gid = t.graphs[a.gaps.graph[j]].graph_id
        m = (z["graph_id"] == gid) & (z["stream_id"] == a.gaps.stream[j])
        assert a.gaps.counts[j] == m.sum() - len(np.unique(corr[m]))
    # A replay's span from the raw columns, for a few replays
    for c in np.unique(corr)[:: 97]:
        m = corr == c
        i = np.flatnonzero(a.replays.correlation_id == c)[0]
        assert a.replays.span_ns[i] == z["end"][m].max() - z["start"][m].min()
        assert a.replays.kernels[i] == m.sum()


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=0, max_size=60))
def test_per_replay_gaps_are_the_gaps_of_analyze(raw):
    """compare's per-(replay, stream) rows use the one gap definition: the same multiset per stream."""
    rows = [(s, s + d, stream, corr, (corr % 2) + 1, dev) for s, d, stream, corr, _, dev in raw]
    t = build(list(dict.fromkeys(rows)))
    a = analyze(t)
    rsg, gap, row = replay_stream_gaps_with_values(t)
    want = {}
    for j in range(len(a.gaps)):
        key = (int(a.gaps.device[j]), int(a.gaps.graph[j]), int(a.gaps.stream[j]))
        want[key] = sorted(a.gaps.values[a.gaps.offsets[j] : a.gaps.offsets[j + 1]].tolist())
    got = {}
    for v, r in zip(gap.tolist(), row.tolist()):
        got.setdefault((int(rsg.device[r]), int(rsg.graph[r]), int(rsg.stream[r])), []).append(v)
    assert {k: sorted(v) for k, v in got.items()} == want
    assert np.array_equal(np.bincount(row, minlength=len(rsg)), rsg.gap_count)


def skewed_launch_trace():
    """Four replays: launch latency 50, -1 and -30 ns (CPU clock ahead of the GPU's) and one unknown."""
    graphs = [GraphInfo(key="g1", graph_id=1, upload_mode="uploaded")]
    launches = {"correlation_id": [7, 8, 9], "graph": [0, 0, 0], "launch_ns": [50, 401, 630], "stream": [5, 5, 5]}
    rows = [(100, 200, 1, 7, 1), (220, 300, 2, 7, 1), (400, 500, 1, 8, 1), (600, 700, 1, 9, 1), (800, 900, 1, 10, 1)]
    return build(rows, launches=launches, graphs=graphs)


def test_negative_launch_latencies_are_kept_apart_from_unknown():
    a = analyze(skewed_launch_trace())
    # old code: -1 meant "unknown", so a real latency of -1 ns was indistinguishable from no launch record
    assert a.replays.launch_latency_ns.tolist() == [50, -1, -30, NO_VALUE]


def test_analyze_json_counts_negative_launch_latencies():
    from graphmon.report.summary import graphs_summary

    (g,) = graphs_summary(analyze(skewed_launch_trace()))
    assert g["negative_launch_latencies"] == 2 and g["launch_latency_ns"]["count"] == 1
