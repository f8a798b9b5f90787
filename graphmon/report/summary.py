"""Analysis and snapshots -> plain dicts (the JSON of ``graphmon analyze`` and ``/status``).

Text tables are in report/tables.py. The export layer hands over data (a snapshot holds the last
window's analysis); formatting happens here, outside the ingest lock.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from graphmon.analysis.grouped import grouped_summaries
from graphmon.analysis.replays import NO_VALUE, QUANTILES, Analysis, grouped_minmax, grouped_quantiles, grouped_sums, replay_groups, summarize

SUMMARY_QS = QUANTILES  # p10, p50, p90, p99


def _subgroup_summaries(values: np.ndarray, gid: np.ndarray, keep: np.ndarray, groups: int) -> list[dict]:
    """summarize() of the kept values of each group (``gid``: nondecreasing group of each value)."""
    counts = np.bincount(gid[keep], minlength=groups)
    return grouped_summaries(values[keep], np.r_[0, np.cumsum(counts)].astype(np.int64), SUMMARY_QS)


def graphs_summary(a: Analysis, gap_quantiles: np.ndarray | None = None) -> list[dict]:
    """Per (device, graph): replays, kernels per replay, span/busy/idle, and per-stream gaps."""
    t = a.trace
    names = t.graph_names()
    r = a.replays
    order, offsets, heads = replay_groups(r)
    # gap_quantiles: the SUMMARY_QS quantiles per gap group, when the caller already has them.
    gq = grouped_quantiles(a.gaps.values, a.gaps.offsets, SUMMARY_QS) if gap_quantiles is None else gap_quantiles
    gsum = grouped_sums(a.gaps.values, a.gaps.offsets)
    neg = grouped_sums((a.gaps.values < 0).astype(np.int64), a.gaps.offsets)
    gmin, gmax = grouped_minmax(a.gaps.values, a.gaps.offsets) if len(a.gaps) else ([], [])
    # gap groups of each (device, graph), found once: a scan per graph was quadratic (73 s for
    # 100k graphs, bench/results/analyze-json.json)
    gkey = (a.gaps.device.astype(np.int64) << 32) | a.gaps.graph.astype(np.int64)
    go = np.argsort(gkey, kind="stable")
    sk = gkey[go]
    cuts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1], True]) if len(sk) else np.zeros(1, np.int64)
    gap_groups = {int(sk[c0]): go[c0:c1] for c0, c1 in zip(cuts[:-1].tolist(), cuts[1:].tolist())}
    no_gaps = np.zeros(0, np.int64)
    # per-graph distributions, all graphs at once (a numpy call per graph and statistic was
    # ~0.35 ms a graph: 36 s for 100k graphs)
    dists = {k: grouped_summaries(getattr(r, k)[order], offsets, SUMMARY_QS) for k in ("span_ns", "busy_ns", "idle_ns")}
    kp_all = r.kernels[order]
    kp_med = grouped_quantiles(kp_all, offsets, (0.5,))[:, 0]
    kp_min, kp_max = grouped_minmax(kp_all, offsets) if len(kp_all) else ([], [])
    gid = np.repeat(np.arange(len(heads)), np.diff(offsets))
    lat = r.launch_latency_ns[order]
    known = lat != NO_VALUE
    lat_n = np.bincount(gid[known], minlength=len(heads))
    lat_neg = np.bincount(gid[known & (lat < 0)], minlength=len(heads))
    lat_d = _subgroup_summaries(lat, gid, known & (lat >= 0), len(heads))
    inter = r.inter_replay_gap_ns[order]
    inter_d = _subgroup_summaries(inter, gid, inter != np.iinfo(np.int64).min, len(heads))
    out = []
    for k, h in enumerate(heads.tolist()):
        dev, gi = int(r.device[h]), int(r.graph[h])
        info = t.graphs[gi]
        entry = {
            "graph": names[gi],
            "graph_key": info.key,
            "label": info.label,
            "device": str(dev),
            "upload_mode": info.upload_mode,
            "replays": int(offsets[k + 1] - offsets[k]),
            "kernels_per_replay": float(kp_med[k]),
            "kernels_per_replay_min": int(kp_min[k]),
            "kernels_per_replay_max": int(kp_max[k]),
            "span_ns": dists["span_ns"][k],
            "busy_ns": dists["busy_ns"][k],
            "idle_ns": dists["idle_ns"][k],
        }
        if lat_d[k]["count"]:
            entry["launch_latency_ns"] = lat_d[k]
        if lat_n[k]:  # negative: CPU and GPU clocks disagree; left out of the distribution, counted here
            entry["negative_launch_latencies"] = int(lat_neg[k])
        if inter_d[k]["count"]:
            entry["inter_replay_gap_ns"] = inter_d[k]
        streams = []
        for j in gap_groups.get((dev << 32) | gi, no_gaps).tolist():
            cnt = int(a.gaps.offsets[j + 1] - a.gaps.offsets[j])
            q = gq[j]
            streams.append(
                {
                    "stream": str(int(a.gaps.stream[j])),
                    "gaps": cnt,
                    "gap_ns": {
                        "p10": float(q[0]),
                        "p50": float(q[1]),
                        "p90": float(q[2]),
                        "p99": float(q[3]),
                        "mean": float(gsum[j] / cnt),
                        "sum": int(gsum[j]),
                        "min": int(gmin[j]),
                        "max": int(gmax[j]),
                    },
                    "negative_gaps": int(neg[j]),
                }
            )
        entry["streams"] = streams
        out.append(entry)
    return out


def streams_summary(a: Analysis) -> list[dict]:
    """Per (device, stream) across graphs: gap counts and quantiles (``--by stream``)."""
    g = a.gaps
    if len(g) == 0:
        return []
    key = (g.device.astype(np.int64), g.stream)
    grp = g.group_of_values()
    o = np.lexsort((g.values, key[1][grp], key[0][grp]))
    vals = g.values[o]
    d, s = key[0][grp][o], key[1][grp][o]
    new = np.r_[True, (d[1:] != d[:-1]) | (s[1:] != s[:-1])]
    heads = np.flatnonzero(new)
    offs = np.r_[heads, len(vals)]
    q = grouped_quantiles(vals, offs, SUMMARY_QS)
    sums = grouped_sums(vals, offs)
    neg = grouped_sums((vals < 0).astype(np.int64), offs)
    names = a.trace.graph_names()
    out = []
    for j, h in enumerate(heads.tolist()):
        cnt = int(offs[j + 1] - offs[j])
        gsel = (g.device == d[h]) & (g.stream == s[h])
        out.append(
            {
                "device": str(int(d[h])),
                "stream": str(int(s[h])),
                "graphs": sorted({names[i] for i in g.graph[gsel].tolist()}),
                "gaps": cnt,
                "gap_ns": {"p10": float(q[j, 0]), "p50": float(q[j, 1]), "p90": float(q[j, 2]),
                           "p99": float(q[j, 3]), "mean": float(sums[j] / cnt)},
                "negative_gaps": int(neg[j]),
            }
        )
    return out


def analysis_json(a: Analysis, by: str = "graph", source: str | None = None, top: int = 10) -> dict:
    t = a.trace
    non_graph = int((t.graph < 0).sum())
    doc: dict = {
        "graphs": graphs_summary(a),
        "invalid_records": dict(sorted(t.invalid.items())),
        "kernels": int(len(t)),
        "non_graph_kernels": non_graph,
        "replays": int(len(a.replays)),
    }
    if by == "stream":
        doc["streams"] = streams_summary(a)
    if by == "boundary":
        from graphmon.analysis.boundaries import widest

        doc["boundaries"] = widest(t, top)
    cut = t.meta.get("truncated")
    if isinstance(cut, dict):  # graphmon's own Chrome JSON past its kernel cap (formats.chrome)
        doc["truncated"] = {"kernels": cut.get("kernels"), "kernels_kept": cut.get("kernels_kept"),
                            "complete": "the native format: /trace/<id>?format=graphmon"}
    if source is not None:
        doc["source"] = source
    return doc


# ---------------------------------------------------------------------- snapshots
# The graph "family": a graph label without its upload-mode suffix. The same rule as
# dashboards/generate.py's FAMILY_REGEX (Prometheus anchors label_replace regexes): keep it in sync
# (tests/report checks both agree).
UPLOAD_SUFFIXES = ("upload", "no_upload", "uploaded", "lazy", "instantiate_upload")
_FAMILY = re.compile(r"(.*?)(/(" + "|".join(UPLOAD_SUFFIXES) + r"))?")


def graph_family(graph: str) -> str:
    return _FAMILY.fullmatch(graph).group(1)


def snapshot_graphs(snap: Any) -> list[dict]:
    """/status's per-graph summary of the snapshot's last window ([] before the first)."""
    a = getattr(snap, "last_analysis", None)
    if a is None:
        return []
    return graphs_summary(a, snap.last_gap_quantiles)


def upload_mode_comparison(snap: Any) -> list[dict]:
    """Per device and graph family: median gap by upload mode across graphs (last windows)."""
    by: dict[tuple, dict[str, list[float]]] = {}
    for (d, graph, _stream, mode), qs in snap.gap_quantiles.items():
        if len(qs) > 1 and qs[1] == qs[1]:
            by.setdefault((d, graph_family(graph)), {}).setdefault(mode, []).append(qs[1])
    out = []
    for (d, family), modes in sorted(by.items()):
        if len(modes) < 2:
            continue
        med = {m: sorted(v)[len(v) // 2] for m, v in modes.items()}
        out.append({"device": d, "graph_family": family, "median_gap_ns_by_upload_mode": med})
    return out
