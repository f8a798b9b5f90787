"""A window's decoded records + its launches -> a Trace, with window-edge replays excluded.

Window edges cut replays: kernels of a launch made before tracing was enabled, and kernels of
the launch still running when it was disabled, are missing. Such replays are excluded and
counted (InvalidReason), never merged into a window's replays.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from graphmon.model.invalid import InvalidReason
from graphmon.model.trace import Trace
from graphmon.sources.cupti.records import KernelColumns
from graphmon.sources.cupti.registry import GraphRegistry


def merged_correlations(corr: np.ndarray, node: Optional[np.ndarray], launch_corr: np.ndarray) -> np.ndarray:
    """Correlation ids under which several launches came back: one given to two window launches,
    or one whose kernels hold every graph node more than once (one replay runs each node once:
    true of every window of the H200 recordings in tests/data). Seen on the H200 when CUPTI's
    ids stopped advancing: all 40 launches of a window under one id, which a most-common-count
    rule then kept as one 6,400-kernel replay (tests/gpu/test_live_cupti.py)."""
    u, c = np.unique(launch_corr, return_counts=True)
    out = [u[c > 1]]
    m = node > 0 if node is not None else np.zeros(len(corr), bool)
    if m.any():
        pairs, mult = np.unique(np.stack([corr[m], node[m]], 1), axis=0, return_counts=True)
        ids, first = np.unique(pairs[:, 0], return_index=True)  # pairs are sorted by correlation id
        out.append(ids[np.minimum.reduceat(mult, first) >= 2])
    return np.unique(np.concatenate(out))


def complete_replays(graph_id: np.ndarray, corr: np.ndarray, launch_corr: np.ndarray, valid=None, node=None):
    """Mask of kernels to keep + counts of excluded ones by reason. Graph kernels are kept when
    their launch was seen inside the window and their replay has the graph's usual kernel count
    in the window (the most common count among its replays). Kernels that are not ``valid``
    (e.g. zero timestamps: launched but not run before tracing stopped) do not count towards a
    replay's kernels; they are left for Trace.build to exclude under their reason.

    Why the most common count and not the largest: on the H200, with a loop running far ahead of
    the GPU, one correlation id once carried ~10 launches' kernels (9,924 on 19 streams); taking
    the largest count as "complete" then dropped every real replay. Correlation id 0 means "not
    correlated" in CUPTI and never identifies a launch."""
    n = len(corr)
    keep = np.ones(n, dtype=bool)
    invalid: dict[str, int] = {}
    g = graph_id > 0
    if not g.any():
        return keep, invalid
    nocorr = g & (corr == 0)
    if nocorr.any():
        invalid[InvalidReason.NO_CORRELATION.value] = int(nocorr.sum())
        keep &= ~nocorr
    launch_corr = launch_corr[launch_corr != 0]
    before = keep & g & ~np.isin(corr, launch_corr)  # launched before the window opened or after it closed
    if before.any():
        invalid[InvalidReason.LAUNCHED_OUTSIDE_WINDOW.value] = int(before.sum())
        keep &= ~before
    merged = keep & g & np.isin(corr, merged_correlations(corr[g], None if node is None else node[g], launch_corr))
    if merged.any():
        invalid[InvalidReason.OVERFULL_REPLAY.value] = int(merged.sum())
        keep &= ~merged
    sel = np.flatnonzero(keep & g & (True if valid is None else valid))
    if len(sel):
        u, inv, cnt = np.unique(corr[sel], return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        gid_of = np.zeros(len(u), np.int64)
        gid_of[inv] = graph_id[sel]
        usual = {}
        for gi in np.unique(gid_of).tolist():
            c = cnt[gid_of == gi]
            vals, freq = np.unique(c, return_counts=True)
            # most common count; ties go to the larger count (a complete replay beats a cut one)
            usual[gi] = int(vals[np.flatnonzero(freq == freq.max())[-1]])
        want = np.array([usual[gi] for gi in gid_of.tolist()])
        for reason, bad in ((InvalidReason.PARTIAL_REPLAY, cnt < want), (InvalidReason.OVERFULL_REPLAY, cnt > want)):
            drop = bad[inv]
            if drop.any():
                invalid[reason.value] = invalid.get(reason.value, 0) + int(drop.sum())
                keep[sel[drop]] = False
    return keep, invalid


def build_trace(cols: KernelColumns, name_id: np.ndarray, names: list[str], launches: Mapping[str, np.ndarray],
                registry: GraphRegistry, capture_id: Optional[str] = None,
                keep_raw: bool = False) -> tuple[Trace, Optional[dict[str, Any]]]:
    """The window's Trace (+ its unfiltered records when ``keep_raw``). ``launches``: the
    window ring's columns (correlation_id, exec_handle, launch_ns, stream)."""
    registry.resolve_ids()
    infos = registry.infos()
    execs = launches["exec_handle"]
    exec_gid: dict[int, int] = {}
    for h in np.unique(execs).tolist():
        g = registry.get(int(h))
        exec_gid[int(h)] = g.graph_id if g is not None else -1
    seen_ids = set(np.unique(cols.graph_id).tolist()) | set(exec_gid.values())
    graphs = [g for g in infos if g.graph_id in seen_ids]
    gindex = {g.graph_id: i for i, g in enumerate(graphs)}
    launch_gid = np.array([exec_gid[int(h)] for h in execs.tolist()], np.int64)
    lc = {
        "correlation_id": launches["correlation_id"],
        "graph": np.array([gindex.get(int(g), -1) for g in launch_gid.tolist()], np.int32),
        "launch_ns": launches["launch_ns"],
        "stream": launches["stream"],
    }
    raw = None
    if keep_raw:
        raw = {"start_ns": cols.start_ns, "end_ns": cols.end_ns, "stream": cols.stream, "device": cols.device,
               "graph_id": cols.graph_id, "graph_node_id": cols.graph_node_id, "correlation_id": cols.correlation_id,
               "name_id": name_id, "launch_correlation_id": lc["correlation_id"], "launch_graph_id": launch_gid,
               "launch_ns": lc["launch_ns"]}
    valid = (cols.start_ns > 0) & (cols.end_ns >= cols.start_ns)
    keep, invalid = complete_replays(cols.graph_id, cols.correlation_id, lc["correlation_id"], valid=valid,
                                     node=cols.graph_node_id)
    if not keep.all():
        cols, name_id = cols.take(keep), name_id[keep]
    trace = Trace.build(
        start_ns=cols.start_ns, end_ns=cols.end_ns, stream=cols.stream, device=cols.device, graph_id=cols.graph_id,
        graph_node_id=cols.graph_node_id, correlation_id=cols.correlation_id, name_id=name_id, names=names,
        launches=lc, graphs=graphs, invalid=invalid, meta={"source": "cupti", "capture_id": capture_id},
    )
    return trace, raw
