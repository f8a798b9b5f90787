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
