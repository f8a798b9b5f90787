"""graphmon.export.deploy_pool: what a window adds to a pool (its bounds: tests/export/test_deploy.py,
on windows of the real H200 trace)."""

from types import SimpleNamespace

import numpy as np
import pytest

from graphmon.export.deploy_pool import window_replays


@pytest.mark.parametrize("corr_offset", [0, 2**33])  # CUPTI's uint32 ids (one sort), and the general path
def test_window_replays_counts_distinct_launches_per_graph_and_device(corr_offset):
    rng = np.random.default_rng(7)
    n = 5000
    t = SimpleNamespace(graph=rng.integers(-1, 3, n).astype(np.int32), device=rng.integers(0, 3, n).astype(np.int32),
                        correlation_id=rng.integers(0, 400, n).astype(np.int64) + corr_offset,
                        graphs=[SimpleNamespace(name=f"g{i}") for i in range(3)])
    want: dict = {}
    for g, d, c in {(int(g), int(d), int(c)) for g, d, c in zip(t.graph, t.device, t.correlation_id) if g >= 0}:
        want[f"{d}/g{g}"] = want.get(f"{d}/g{g}", 0) + 1
    assert window_replays(t) == want


def _untraced(graph, durations):
    return {"graph": np.asarray(graph, np.int32), "duration_ns": np.asarray(durations, np.int64)}


def test_a_pool_keeps_the_untraced_durations_of_the_windows_it_drops():
    """The traced replays decide which windows stay; the untraced durations of a window that goes
    move to the pool's carry (the newest UNTRACED_SAMPLES per graph), counted in nbytes."""
    from graphmon.analysis.deploy import UNTRACED_SAMPLES
    from graphmon.export.deploy_pool import Pool, pooled
    from helpers import synthetic_trace

    t = synthetic_trace(n_graphs=2, replays=4)  # graphs g1 (label graph0) and g2 (graph1), 4 replays each
    p = Pool(max_replays=8)
    for i in range(4):
        # graph 0: 300 durations of 1000+i ns a window; graph 1: one; then rows no graph names
        u = _untraced([0] * 300 + [1, -1, 5, 0], [1000 + i] * 300 + [7, 9, 9, 0])
        p.add(pooled(f"w{i}", t, float(i), u))
    assert [w.window_id for w in p.windows] == ["w2", "w3"]  # 8 traced replays per graph: two windows
    assert p.untraced_left_out == 2 * 3  # per window: graph -1, graph 5 of 2, a duration of 0
    u = p.untraced()
    assert set(u) == {"graph0", "graph1"}
    assert len(u["graph0"]) == UNTRACED_SAMPLES and (u["graph0"][-300:] == 1003).all()  # the newest kept
    assert list(u["graph1"]) == [7, 7, 7, 7]  # two from the carry, two from the windows
    assert sum(d.nbytes for d in p.carry.values()) == 8 * (UNTRACED_SAMPLES + 2)
    assert p.nbytes == sum(w.nbytes for w in p.windows) + 8 * (UNTRACED_SAMPLES + 2)
    # a pinned window's pools: up to it keeps the carry (it is older), after it does not
    assert len(p.upto("w2").untraced()["graph1"]) == 3
    assert list(p.after("w2").untraced()["graph1"]) == [7]
    assert len(p.after("nope").untraced()["graph1"]) == 4 and len(p.copy().untraced()["graph1"]) == 4
    # a window with untraced rows and no traced replay is pooled; its rows go to the carry when it goes
    q = Pool(max_replays=4)
    q.add(pooled("u", t.select(t.graph < 0), 0.0, _untraced([0, 0], [5, 6])))
    q.add(pooled("w", t, 1.0))
    assert [w.window_id for w in q.windows] == ["w"] and list(q.untraced()["graph0"]) == [5, 6]
