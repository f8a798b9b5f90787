"""graphmon.model.window: untraced rows of several windows under one graph table."""

import numpy as np

from graphmon.model.trace import GraphInfo
from graphmon.model.window import no_untraced, reindex_untraced

from helpers import untraced


def test_reindex_matches_graphs_by_key_keeps_unknown_and_counts_what_names_no_graph():
    a, b, c = GraphInfo("g1"), GraphInfo("g2"), GraphInfo("g3")
    merged = [b, a, c]
    rows, left_out = reindex_untraced([
        (untraced([0, 1, -1, 2], [10, 20, 30, 40]), [a, b]),  # 2: past its window's two graphs
        (untraced([0, 1, 1], [50, 60, 0]), [c, a]),  # 0 ns: no replay time
        (untraced([0], [70]), [GraphInfo("gone")]),  # a key the merged table lacks
        (no_untraced(), [a]),
    ], merged)
    assert rows["graph"].tolist() == [1, 0, -1, 2, 1] and rows["duration_ns"].tolist() == [10, 20, 30, 50, 60]
    assert rows["graph"].dtype == np.int32 and rows["duration_ns"].dtype == np.int64 and left_out == 3
    empty, none = reindex_untraced([], merged)
    assert len(empty["graph"]) == 0 and empty["graph"].dtype == np.int32 and none == 0
