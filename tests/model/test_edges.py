"""Window-edge filtering of collector windows (model/edges.py)."""

import os

import numpy as np
import pytest

from graphmon.model.edges import _pair_runs, complete_replays

from helpers import DATA


def test_complete_replays_trims_window_edges():
    # graph 5: launch 10 before the window (2 of its kernels traced), 11 complete (3), 12 cut (1);
    # non-graph kernels (graph_id 0) are always kept
    gid = np.array([5, 5, 5, 5, 5, 5, 0, 0])
    corr = np.array([10, 10, 11, 11, 11, 12, 99, 98])
    keep, inv = complete_replays(gid, corr, np.array([11, 12]))
    assert keep.tolist() == [False, False, True, True, True, False, True, True]
    assert inv == {"launched_outside_window": 2, "partial_replay": 1}
    # zero-timestamp kernels (launched, not run before tracing stopped) make a replay partial
    gid, corr = np.full(6, 5), np.array([10, 10, 10, 11, 11, 11])
    keep, inv = complete_replays(gid, corr, np.array([10, 11]), valid=np.array([1, 1, 1, 1, 0, 1], bool))
    assert keep.tolist() == [True, True, True, False, True, False]  # the invalid one: Trace.build's
    assert inv == {"partial_replay": 2}


def test_complete_replays_uses_the_usual_count_and_ignores_correlation_zero():
    # graph 5: four real replays of 3 kernels (corr 1-4) and one correlation carrying 9 kernels
    # (several launches' kernels under one id, as seen on the H200 with a deep queue): the real
    # replays are kept, the overfull one is excluded and counted.
    corr = np.array([1] * 3 + [2] * 3 + [3] * 3 + [4] * 3 + [9] * 9 + [0] * 2)
    gid = np.full(len(corr), 5)
    keep, inv = complete_replays(gid, corr, np.array([0, 1, 2, 3, 4, 9]))
    assert keep.tolist() == [True] * 12 + [False] * 11
    assert inv == {"overfull_replay": 9, "no_correlation": 2}
    # a tie between a complete and a cut replay keeps the complete one
    corr = np.array([1, 1, 1, 2, 2])
    keep, inv = complete_replays(np.full(5, 5), corr, np.array([1, 2]))
    assert keep.tolist() == [True, True, True, False, False] and inv == {"partial_replay": 2}


def test_complete_replays_on_real_h200_windows():
    """Raw records of six CuptiSource windows on the H200 (bench/diag/cupti_sessions.py: a 16-layer
    decode graph uploaded + lazy, 320 kernels a replay; the host in step with the GPU or ~100 ms
    ahead of it). Every window launch comes back whole under its own correlation id; the
    launches made while the window drained (some with zero timestamps: flushed before they ran)
    are excluded and counted, never merged into a window replay."""
    z = np.load(os.path.join(str(DATA), "h200-cupti-windows.npz"))
    for w in range(6):
        g = {k: z[f"w{w}_{k}"] for k in ("start_ns", "end_ns", "graph_id", "graph_node_id", "correlation_id",
                                           "launch_correlation_id")}
        valid = (g["start_ns"] > 0) & (g["end_ns"] >= g["start_ns"])
        keep, inv = complete_replays(g["graph_id"], g["correlation_id"], g["launch_correlation_id"], valid=valid)
        assert set(inv) <= {"launched_outside_window"}, inv
        assert not (keep & ~valid).any()  # every zero-timestamp record was a drain-phase launch
        kept = g["correlation_id"][keep]
        u, cnt = np.unique(kept, return_counts=True)
        assert set(u.tolist()) == set(g["launch_correlation_id"].tolist())  # each window launch, whole
        assert set(cnt.tolist()) == {320}
        # one replay holds each graph node once: no launches merged under one correlation id
        key = np.stack([kept, g["graph_id"][keep], g["graph_node_id"][keep]], 1)
        assert len(np.unique(key, axis=0)) == len(key)
        assert inv.get("launched_outside_window", 0) == int((~np.isin(g["correlation_id"], u)).sum())


def test_launches_merged_under_one_correlation_id_are_excluded():
    # The H200 failure of test_records_match_cuda_events: CUPTI's correlation ids stopped
    # advancing, so 40 launches of a window (3 kernels each here) came back under one id (8),
    # which the window's launch table also held. The most-common-count rule alone keeps them as
    # one 120-kernel "replay"; each graph node appearing 40 times says they are 40 launches.
    node = np.tile([1, 2, 3], 40)
    corr = np.full(len(node), 8)
    gid = np.full(len(node), 5)
    keep, inv = complete_replays(gid, corr, np.array([8]), node=node)
    assert not keep.any() and inv == {"overfull_replay": 120}
    # the same id given to several launches of the window's table: excluded as well
    keep, inv = complete_replays(np.full(6, 5), np.array([8] * 3 + [9] * 3), np.array([8, 8, 9]),
                                 node=np.tile([1, 2, 3], 2))
    assert keep.tolist() == [False] * 3 + [True] * 3 and inv == {"overfull_replay": 3}
    # a graph whose loop body runs twice (a conditional node) is one replay: not every node repeats
    keep, inv = complete_replays(np.full(5, 5), np.full(5, 4), np.array([4]), node=np.array([1, 2, 2, 3, 3]))
    assert keep.all() and inv == {}


@pytest.mark.parametrize("node_span", [50, 2**40, 2**62])  # radix key, and the lexsort fallback (spans too wide)
def test_pair_runs_match_unique_rows(node_span):
    """_pair_runs is np.unique over (correlation, node) rows with counts, in the same order."""
    rng = np.random.default_rng(node_span % 97)
    a = rng.integers(100, 140, 3000)
    b = rng.integers(1, 6, 3000) * (node_span // 8) + rng.integers(0, 4, 3000)
    pair_a, pair_b, mult = _pair_runs(a, b)
    rows, want = np.unique(np.stack([a, b], 1), axis=0, return_counts=True)
    np.testing.assert_array_equal(pair_a, rows[:, 0])
    np.testing.assert_array_equal(pair_b, rows[:, 1])
    np.testing.assert_array_equal(mult, want)


# ---------------------------------------------------------------------- mistimed replays (issue 29)
def _hf_like_window(stretch_ns=1_250_000, replays=4, kernels=10, dur_ns=80_000, gap_ns=8_000, stretched=0):
    """WindowRecords shaped like the H200 failure: one stream (7), one graph, ``replays`` launches
    of ``kernels`` kernels (span ~0.87 ms); in replay ``stretched`` the first kernel ends
    ``stretch_ns`` late, so that replay's span = busy ~2.1 ms and its stream has a gap of about
    -(stretch) ns."""
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    rows = []
    t = 1_000_000_000
    for r in range(replays):
        for k in range(kernels):
            s = t + k * (dur_ns + gap_ns)
            e = s + dur_ns + (stretch_ns if (r == stretched and k == 0) else 0)
            rows.append((s, e, 7, 5, (5 << 32) | (k + 1), 100 + r))
        t += kernels * (dur_ns + gap_ns) + 50_000
    a = np.array(rows, np.int64)
    n = len(a)
    kernels_ = {"start_ns": a[:, 0], "end_ns": a[:, 1], "stream": a[:, 2], "graph_id": a[:, 3],
                "graph_node_id": a[:, 4], "correlation_id": a[:, 5], "device": np.zeros(n, np.int32),
                "name_id": np.full(n, -1, np.int32)}
    lc = np.arange(100, 100 + replays)
    launches = {"correlation_id": lc, "device": np.zeros(replays, np.int32), "graph": np.zeros(replays, np.int32),
                "launch_ns": lc * 0 - 1, "stream": np.full(replays, 7), "label": np.full(replays, -1, np.int32)}
    return WindowRecords(kernels=kernels_, launches=launches, names=[], graphs=[GraphInfo(key="g5", graph_id=5)],
                         started_s=0.0, ended_s=1.0)


def test_a_replay_with_a_kernel_ending_late_is_excluded_and_counted_never_averaged():
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble

    w = assemble(_hf_like_window())
    t = w.trace
    assert sorted(set(t.correlation_id.tolist())) == [101, 102, 103]  # the first launch's replay is out
    assert t.invalid == {"overfull_replay": 10}
    a = analyze(t)
    assert (a.gaps.values >= 0).all()
    assert set(a.replays.span_ns.tolist()) == {10 * 80_000 + 9 * 8_000}
    assert (a.replays.busy_ns == 800_000).all()


def test_a_replay_far_longer_than_its_graphs_median_is_excluded():
    # no overlap (the gaps of replay 2 are 10x as long), but 1.8x the median span: excluded
    from graphmon.model.edges import complete_replays

    r = _hf_like_window(stretch_ns=0)
    k = r.kernels
    start, end = k["start_ns"].copy(), k["end_ns"].copy()
    m = k["correlation_id"] == 102
    idx = np.arange(m.sum())
    start[m] += idx * 72_000  # each of its 9 gaps 8 -> 80 us: span 0.87 -> 1.52 ms
    end[m] += idx * 72_000
    keep, inv = complete_replays(k["graph_id"], k["correlation_id"], r.launches["correlation_id"],
                                 start=start, end=end, stream=k["stream"])
    assert inv == {"overfull_replay": 10} and not keep[m].any() and keep[~m].all()


def test_small_overlaps_and_two_replays_are_kept():
    from graphmon.model.edges import complete_replays, mistimed_replays

    # a 500 ns overlap on one stream (a kernel starting in the tail of the one before it): kept
    r = _hf_like_window(stretch_ns=8_500)
    k = r.kernels
    assert len(mistimed_replays(k["start_ns"], k["end_ns"], k["stream"], k["correlation_id"], k["graph_id"])) == 0
    # two replays, one 2.4x the other: the median cannot say which is odd, the span test is off
    # (the overlap test still applies: a 2 ms overlap is out)
    r = _hf_like_window(replays=2, stretch_ns=1_250_000)
    k = r.kernels
    assert mistimed_replays(k["start_ns"], k["end_ns"], k["stream"], k["correlation_id"], k["graph_id"]).tolist() == [100]
    r = _hf_like_window(replays=2, stretch_ns=0)
    k = r.kernels
    start, end = k["start_ns"].copy(), k["end_ns"].copy()
    m = k["correlation_id"] == 100
    shift = np.arange(m.sum()) * 100_000  # replay 100: gaps 8 -> 108 us, span 0.87 -> 1.77 ms (2x)
    start[m] += shift
    end[m] += shift
    keep, inv = complete_replays(k["graph_id"], k["correlation_id"], r.launches["correlation_id"],
                                 start=start, end=end, stream=k["stream"])
    assert keep.all() and inv == {}


def test_no_real_h200_replay_is_mistimed():
    """The bounds against real records: the shared H200 capture (480 replays, 4 streams) and the
    six CuptiSource windows of tests/data keep every replay."""
    from graphmon.model.edges import complete_replays, mistimed_replays

    z = np.load(os.path.join(str(DATA), "h200-cupti-decode-v1.npz"))
    assert len(mistimed_replays(z["start"], z["end"], z["stream_id"], z["correlation_id"], z["graph_id"])) == 0
    z = np.load(os.path.join(str(DATA), "h200-cupti-windows.npz"))
    for w in range(6):
        g = {k: z[f"w{w}_{k}"] for k in ("start_ns", "end_ns", "stream", "graph_id", "correlation_id",
                                           "launch_correlation_id")}
        valid = (g["start_ns"] > 0) & (g["end_ns"] >= g["start_ns"])
        keep, inv = complete_replays(g["graph_id"], g["correlation_id"], g["launch_correlation_id"], valid=valid,
                                     start=g["start_ns"], end=g["end_ns"], stream=g["stream"])
        assert set(inv) <= {"launched_outside_window"}, inv


# ---------------------------------------------------------------------- whole replays only (issue 37)
def _chain_window(replays=4, kernels=3, bad_node=None, bad_end=None, nodes=True, corr0=100):
    """WindowRecords of one graph (id 5) on one stream: ``replays`` launches of ``kernels``
    kernels, each 1,000 ns with 100 ns between them; node ``bad_node`` gets end ``bad_end``
    (its start - 1, or 0) in every replay."""
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    rows = []
    t = 1_000_000
    for r in range(replays):
        for k in range(kernels):
            s = t + k * 1_100
            e = s + 1_000
            if k + 1 == bad_node:
                e = s - 1 if bad_end is None else bad_end
            rows.append((s, e, (5 << 32) | (k + 1) if nodes else 0, corr0 + r))
        t += 50_000
    a = np.array(rows, np.int64)
    n = len(a)
    lc = np.arange(corr0, corr0 + replays)
    return WindowRecords(
        kernels={"start_ns": a[:, 0], "end_ns": a[:, 1], "stream": np.full(n, 7), "graph_id": np.full(n, 5),
                 "graph_node_id": a[:, 2], "correlation_id": a[:, 3], "device": np.zeros(n, np.int32),
                 "name_id": np.full(n, -1, np.int32)},
        launches={"correlation_id": lc, "device": np.zeros(replays, np.int32), "graph": np.zeros(replays, np.int32),
                  "launch_ns": np.full(replays, -1), "stream": np.full(replays, 7), "label": np.full(replays, -1, np.int32)},
        names=[], graphs=[GraphInfo(key="g5", graph_id=5)], started_s=0.0, ended_s=1.0)


@pytest.mark.parametrize("nodes", [True, False])  # node ids (CUPTI), and the fallback without them
@pytest.mark.parametrize("bad_end, reason", [(None, "end_before_start"), (0, "incomplete_record")])
def test_a_kernel_untimed_in_every_replay_never_makes_a_gap_across_it(nodes, bad_end, reason):
    """The vLLM-shaped tree on the H200: 44 end_before_start records of 734 and no partial replay.
    A kernel that is unusable in every replay made the most common count the cut one, so its
    neighbours were kept and the gap between them spanned it (1,100 + 1,000 ns here, not 100)."""
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble

    w = assemble(_chain_window(bad_node=2, bad_end=bad_end, nodes=nodes))
    assert len(w.trace) == 0 and len(analyze(w.trace).gaps) == 0
    assert dict(w.trace.invalid) == {reason: 4, "partial_replay": 8}
    # the same graph whole: every gap is the 100 ns simulated
    w = assemble(_chain_window(nodes=nodes))
    assert len(w.trace) == 12 and set(analyze(w.trace).gaps.values.tolist()) == {100} and not w.trace.invalid


def test_a_graph_launched_once_per_window_keeps_no_replay_with_a_missing_kernel():
    """Real H200 records (tests/data/h200-hf-late-stamps.npz, HF generate): in 12 of 24 windows
    the last replay came back from a forced flush with made-up times on 12 to 62 of its 62
    kernels, which the collector turns to end 0. Kept as the only launch of its window (the
    shape of each piece of a vLLM piecewise tree), the rest of such a replay was kept by the
    most common count (its own) with gaps of up to 82.8 us across the missing kernels; the
    graph's real gaps are at most 417 ns. Now each is excluded: its made-up records counted as
    incomplete_record, the rest as partial_replay."""
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords
    from graphmon.sources.cupti.closing import unknown_late_ends
    from graphmon.sources.cupti.records import KernelColumns

    z = np.load(os.path.join(str(DATA), "h200-hf-late-stamps.npz"))
    invalid: dict = {}
    max_gap = 0
    for w in range(int(z["windows"])):
        k = {c: z[f"w{w}_{c}"].copy() for c in ("start", "end", "stream", "graph_id", "node", "corr")}
        n = len(k["start"])
        cols = KernelColumns(k["start"], k["end"], k["stream"], np.zeros(n, np.int32), k["graph_id"], k["node"],
                             k["corr"], np.zeros(n, np.uint64))
        unknown_late_ends(cols, z[f"w{w}_launch_corr"], int(z[f"w{w}_off_ns"]))
        lc = z[f"w{w}_launch_corr"][-1:]  # the window's last launch only
        rec = WindowRecords(
            kernels={"start_ns": cols.start_ns, "end_ns": cols.end_ns, "stream": cols.stream, "device": cols.device,
                     "graph_id": cols.graph_id, "graph_node_id": cols.graph_node_id,
                     "correlation_id": cols.correlation_id, "name_id": np.full(n, -1, np.int32)},
            launches={"correlation_id": lc, "device": np.zeros(1, np.int32), "graph": np.zeros(1, np.int32),
                      "launch_ns": np.full(1, -1), "stream": np.full(1, 7), "label": np.full(1, -1, np.int32)},
            names=[], graphs=[GraphInfo(key="g5", graph_id=5)], started_s=0.0, ended_s=1.0)
        t = assemble(rec).trace
        for r, c in t.invalid.items():
            invalid[r] = invalid.get(r, 0) + c
        gaps = analyze(t).gaps.values
        max_gap = max([max_gap] + gaps.tolist())
    assert invalid["incomplete_record"] == 503 and invalid["partial_replay"] == 12 * 62 - 503
    assert "end_before_start" not in invalid and max_gap == 417


def test_what_a_graph_holds_is_learned_from_earlier_windows():
    """A graph launched once per window whose replay came back without a kernel (a record CUPTI
    never returned): nothing in that window says it is cut; the process's GraphKernels, which
    saw the graph whole before, does."""
    from graphmon.model.edges import GraphKernels, assemble

    cut = _chain_window(replays=1, corr0=300)
    cut = type(cut)(**{**cut.__dict__, "kernels": {c: v[[0, 2]] for c, v in cut.kernels.items()}})  # node 2 never came
    assert len(assemble(cut).trace) == 2  # this window alone cannot tell
    gk = GraphKernels()
    assert len(assemble(_chain_window(replays=2), gk).trace) == 6 and gk.get(5) == 3
    w = assemble(cut, gk)
    assert len(w.trace) == 0 and dict(w.trace.invalid) == {"partial_replay": 2}
    # a replay bigger than anything seen (the earlier windows all cut) raises what is expected
    gk = GraphKernels()
    assemble(cut, gk)
    assert gk.get(5) == 2 and len(assemble(_chain_window(replays=1), gk).trace) == 3 and gk.get(5) == 3
    # an untimed kernel's replay teaches nothing
    gk = GraphKernels()
    assemble(_chain_window(replays=1, bad_node=3, bad_end=0), gk)
    assert gk.get(5) == 0
