"""A window's decoded records + its launches -> WindowRecords (unfiltered; model/edges.py makes
the Trace: in the agent for a light collector, here for the in-process exporter)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from graphmon.model.window import WindowRecords
from graphmon.sources.cupti.records import KernelColumns
from graphmon.sources.cupti.registry import GraphRegistry


def window_records(cols: KernelColumns, name_id: np.ndarray, names: list[str], launches: Mapping[str, np.ndarray],
                   registry: GraphRegistry, *, started_s: float, ended_s: float, dropped: int = 0,
                   observer_slowdown: Optional[float] = None, capture_id: Optional[str] = None,
                   traced_s: float = 0.0, untraced: Optional[Sequence[np.ndarray]] = None) -> WindowRecords:
    """The window's records, unfiltered, with its launches' graphs resolved from the registry
    (work per distinct exec, not per record). ``launches``: the window ring's columns
    (correlation_id, exec_handle, launch_ns, stream). ``untraced``: (CUPTI graph id, duration_ns)
    of replays timed untraced (bursts.UntracedRows.take); their graphs join the window's."""
    registry.resolve_ids()
    infos = registry.infos()
    execs = launches["exec_handle"]
    exec_gid: dict[int, int] = {}
    for h in np.unique(execs).tolist():
        g = registry.get(int(h))
        exec_gid[int(h)] = g.graph_id if g is not None else -1
    u_gid, u_ns = untraced if untraced is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    u_ids = np.unique(u_gid).tolist()
    seen_ids = set(np.unique(cols.graph_id).tolist()) | set(exec_gid.values()) | set(u_ids)
    graphs = [g for g in infos if g.graph_id in seen_ids]
    gindex = {g.graph_id: i for i, g in enumerate(graphs)}
    n = len(execs)
    lc = {
        "correlation_id": np.asarray(launches["correlation_id"], np.int64),
        "device": np.zeros(n, np.int32),
        "graph": np.array([gindex.get(exec_gid[int(h)], -1) for h in execs.tolist()], np.int32),
        "launch_ns": np.asarray(launches["launch_ns"], np.int64),
        "stream": np.asarray(launches["stream"], np.int64),
        "label": np.full(n, -1, np.int32),
    }
    u_index = np.array([gindex.get(g, -1) for g in u_ids], np.int32)
    u_cols = {"graph": u_index[np.searchsorted(u_ids, u_gid)] if len(u_gid) else np.zeros(0, np.int32),
              "duration_ns": np.asarray(u_ns, np.int64)}
    kernels = {"start_ns": cols.start_ns, "end_ns": cols.end_ns, "device": cols.device, "stream": cols.stream,
               "graph_id": cols.graph_id, "graph_node_id": cols.graph_node_id, "correlation_id": cols.correlation_id,
               "name_id": np.asarray(name_id, np.int32)}
    return WindowRecords(kernels=kernels, launches=lc, names=names, graphs=graphs, started_s=started_s,
                         ended_s=ended_s, dropped=dropped, observer_slowdown=observer_slowdown, capture_id=capture_id,
                         traced_s=traced_s, untraced=u_cols,
                         meta={"source": "cupti", "capture_id": capture_id})


def raw_columns(r: WindowRecords) -> dict[str, np.ndarray]:
    """Diagnostics (settings.keep_raw): the window's unfiltered records and launches, flat."""
    gids = np.array([g.graph_id for g in r.graphs] + [-1], np.int64)
    out = {k: r.kernels[k] for k in ("start_ns", "end_ns", "stream", "device", "graph_id", "graph_node_id",
                                     "correlation_id", "name_id")}
    out.update(launch_correlation_id=r.launches["correlation_id"], launch_graph_id=gids[r.launches["graph"]],
               launch_ns=r.launches["launch_ns"])
    return out
