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
    """Raw records of six CuptiSource windows on the H200 (bench/cupti_sessions.py: a 16-layer
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
    pair_a, mult = _pair_runs(a, b)
    rows, want = np.unique(np.stack([a, b], 1), axis=0, return_counts=True)
    np.testing.assert_array_equal(pair_a, rows[:, 0])
    np.testing.assert_array_equal(mult, want)
