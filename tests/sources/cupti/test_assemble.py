"""A window's records from the collector (sources/cupti/assemble.py): graphs resolved from the registry."""

import numpy as np

from graphmon.model.edges import assemble
from graphmon.sources.cupti.assemble import window_records
from graphmon.sources.cupti.records import KernelColumns
from graphmon.sources.cupti.registry import GraphRegistry


def test_graphs_timed_only_untraced_join_the_windows_graphs():
    reg = GraphRegistry()
    for handle, gid in ((0x10, 5), (0x20, 9), (0x30, 2)):
        reg.on_instantiate(handle, graph_id=gid)
    reg.on_destroy(0x20)  # gone since its burst: still named (retired)
    launches = {"correlation_id": np.array([11]), "exec_handle": np.array([0x10], np.uint64),
                "launch_ns": np.array([100]), "stream": np.array([7])}
    # untraced rows: graph 9 (launched only in a burst), 5 (the window's), unknown, an id no exec has
    untraced = (np.array([9, 5, -1, 77, 9]), np.array([400, 500, 600, 700, 800]))
    rec = window_records(KernelColumns.empty(), np.zeros(0, np.int32), [], launches, reg, started_s=1.0, ended_s=2.0,
                         untraced=untraced)
    ids = [g.graph_id for g in rec.graphs]
    assert sorted(ids) == [5, 9]  # graph 2 had no launch and no row: not the window's
    gids = [ids[g] if g >= 0 else -1 for g in rec.untraced["graph"].tolist()]
    assert gids == [9, 5, -1, -1, 9] and rec.untraced["duration_ns"].tolist() == [400, 500, 600, 700, 800]
    assert rec.untraced["graph"].dtype == np.int32 and rec.untraced["duration_ns"].dtype == np.int64
    assert ids[rec.launches["graph"][0]] == 5
    w = assemble(rec)  # the in-process exporter's Window keeps them, against the same graphs
    assert [g.graph_id for g in w.trace.graphs] == ids and w.untraced["graph"].tolist() == rec.untraced["graph"].tolist()
    none = window_records(KernelColumns.empty(), np.zeros(0, np.int32), [], launches, reg, started_s=1.0, ended_s=2.0)
    assert len(none.untraced["graph"]) == 0 and [g.graph_id for g in none.graphs] == [5]
