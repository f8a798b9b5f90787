"""The summary of a bench/diag/replays.py recording (its diag-replays.npz), on a CPU: every window
launch's replay from the raw records, the replays flagged (span beyond SPAN_FACTOR x its graph's
median, or a gap below NEG_NS on one stream) with what tells the hypotheses of
bench/diag/replays.py apart, and what graphmon's own assembly and analysis make of the same
windows.

    python bench/diag/replays_summary.py DIR/diag-replays.npz [--json OUT]
    python bench/diag/replays_summary.py --smoke     # the recorded H200 file of gpu-check-10
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402

SPAN_FACTOR = 1.5  # a replay with a span beyond this factor of its graph's median is shown
NEG_NS = -1000  # a gap below this on one stream is shown
RECORDED = RESULTS / "gpu-check-10" / "diag-replays.npz"


def _busy(start: np.ndarray, end: np.ndarray) -> int:
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    if not len(s):
        return 0
    prev = np.r_[s[0], np.maximum.accumulate(e)[:-1]]  # the furthest end before each kernel
    return int(np.maximum(0, e - np.maximum(s, prev)).sum())


def _stream_gaps(start, end, stream):
    """Gaps in start order on each stream: (gap values, index of the earlier kernel, of the later)."""
    o = np.lexsort((end, start, stream))
    same = stream[o][1:] == stream[o][:-1]
    gaps = (start[o][1:] - end[o][:-1])[same]
    return gaps, o[:-1][same], o[1:][same]


def replay_table(d: dict) -> list[dict]:
    """Every window launch's replay, from the raw records (independently of graphmon's analysis)."""
    rows = []
    kw, lw = d["k_window"], d["l_window"]
    names = d["names"]
    node_dur: dict[tuple[int, int, int], list] = {}
    per_window = []
    for w in np.unique(lw).tolist():
        km = np.flatnonzero(kw == w)
        lcorr = d["l_corr"][lw == w]
        per_window.append((w, km, lcorr))
        g = km[(d["k_graph_id"][km] > 0) & (d["k_start"][km] > 0) & (d["k_end"][km] >= d["k_start"][km])]
        for i in g.tolist():
            node_dur.setdefault((int(d["w_variant"][w]), int(d["k_graph_id"][i]), int(d["k_node"][i])), []).append(
                int(d["k_end"][i] - d["k_start"][i]))
    med_dur = {k: float(np.median(v)) for k, v in node_dur.items()}
    act_on = d["act_ts_ns"][d["act_on"] == 1]
    act_off = d["act_ts_ns"][d["act_on"] == 0]
    act_on_seq = d["act_seq"][d["act_on"] == 1]
    act_off_seq = d["act_seq"][d["act_on"] == 0]
    enter = d["cb_kind"] == 0
    for w, km, lcorr in per_window:
        variant = int(d["w_variant"][w])
        on = act_on[act_on_seq == w]
        off = act_off[act_off_seq == w]
        t_on = int(on[-1]) if len(on) else 0
        t_off = int(off[-1]) if len(off) else 0
        forced = d["fl_forced"][d["fl_seq"] == w]
        ev_m = (d["ev_seq"] == w) & (d["ev_phase"] == 1)
        ev = dict(zip(d["ev_corr"][ev_m].tolist(), d["ev_ms"][ev_m].tolist()))
        for li, c in enumerate(lcorr.tolist()):
            m = km[d["k_corr"][km] == c]
            enters = np.flatnonzero(enter & (d["cb_corr"] == c))
            exits = np.flatnonzero(~enter & (d["cb_corr"] == c))
            row = {"window": w, "variant": variant, "capture": bool(d["w_capture"][w]), "launch_index": li,
                   "launches_in_window": len(lcorr), "corr": c, "records": int(len(m)),
                   "enter_callbacks": int(len(enters)),
                   "enter_rel_on_us": (int(d["cb_ts_ns"][enters[0]]) - t_on) / 1e3 if len(enters) and t_on else None,
                   "exit_rel_off_us": (int(d["cb_ts_ns"][exits[-1]]) - t_off) / 1e3 if len(exits) and t_off else None,
                   "forced_flush": bool(forced.any()), "event_ms": ev.get(c)}
            if not len(m):
                rows.append(row)
                continue
            st, en = d["k_start"][m], d["k_end"][m]
            bad = (st <= 0) | (en < st)
            row["bad_timestamps"] = int(bad.sum())
            row["non_graph_records"] = int((d["k_graph_id"][m] <= 0).sum())
            m = m[~bad & (d["k_graph_id"][m] > 0)]
            if not len(m):
                rows.append(row)
                continue
            st, en, sm = d["k_start"][m], d["k_end"][m], d["k_stream"][m]
            gids = sorted(set(d["k_graph_id"][m].tolist()))
            nodes, mult = np.unique(d["k_node"][m], return_counts=True)
            gaps, ia, ib = _stream_gaps(st, en, sm)
            o = np.argsort(st, kind="stable")
            first, last = m[o[0]], m[np.argmax(en)]
            dur = en - st
            med = np.array([med_dur.get((variant, int(d["k_graph_id"][i]), int(d["k_node"][i])), np.nan) for i in m])
            excess = dur - med
            worst = int(np.nanargmax(excess)) if np.isfinite(excess).any() else 0
            row.update(graph_ids=gids, streams=sorted(set(sm.tolist())), span_ns=int(en.max() - st.min()),
                       busy_ns=_busy(st, en), nodes=int(len(nodes)), node_max_mult=int(mult.max()),
                       neg_gaps=int((gaps < 0).sum()), gaps_below_1us=int((gaps < NEG_NS).sum()),
                       min_gap_ns=int(gaps.min()) if len(gaps) else None,
                       first_kernel=f"{names[d['k_name'][first]] if d['k_name'][first] >= 0 else '?'} node {d['k_node'][first]}",
                       last_kernel=f"{names[d['k_name'][last]] if d['k_name'][last] >= 0 else '?'} node {d['k_node'][last]}",
                       first_start_rel_on_us=(int(st.min()) - t_on) / 1e3 if t_on else None,
                       last_end_rel_off_us=(int(en.max()) - t_off) / 1e3 if t_off else None,
                       longest_over_node_median={"node": int(d["k_node"][m[worst]]), "dur_ns": int(dur[worst]),
                                                 "node_median_ns": float(med[worst]),
                                                 "rank_in_replay": int(np.flatnonzero(o == worst)[0]),
                                                 "start_rel_first_ns": int(st[worst] - st.min())},
                       neg_pairs=[{"earlier": _kname(d, m[a]), "later": _kname(d, m[b]), "gap_ns": int(gp),
                                   "earlier_dur_ns": int(dur[a]), "later_dur_ns": int(dur[b]),
                                   "earlier_node_median_ns": float(med[a]), "later_node_median_ns": float(med[b])}
                                  for gp, a, b in zip(gaps.tolist(), ia.tolist(), ib.tolist()) if gp < NEG_NS][:6])
            rows.append(row)
    # each replay against its graph's median span: in the window, and over the variant
    for key in ("window", "variant"):
        groups: dict[tuple, list] = {}
        for r in rows:
            if "span_ns" in r and len(r["graph_ids"]) == 1:
                groups.setdefault((r[key], r["variant"], r["graph_ids"][0]), []).append(r["span_ns"])
        for r in rows:
            if "span_ns" in r and len(r["graph_ids"]) == 1:
                r[f"span_over_{key}_median"] = r["span_ns"] / max(1.0, float(np.median(
                    groups[(r[key], r["variant"], r["graph_ids"][0])])))
    return rows


def _kname(d: dict, i: int) -> str:
    n = d["names"][d["k_name"][i]] if d["k_name"][i] >= 0 else "?"
    return f"{n[:60]} node {int(d['k_node'][i])} stream {int(d['k_stream'][i])}"


def graphmon_view(d: dict) -> dict:
    """What graphmon itself makes of each window (model/edges.assemble, then analyze), and whether
    the fast analysis path and the reference path agree on it."""
    from graphmon.analysis.reference import analyze_reference
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    out = {"windows": 0, "replays": 0, "gaps": 0, "neg_gaps": 0, "gaps_below_1us": 0, "min_gap_ns": None,
           "invalid": {}, "fast_vs_reference_differs": 0, "errors": 0}
    names = [str(s) for s in d["names"]]
    for w in np.unique(d["l_window"]).tolist():
        km, lm = d["k_window"] == w, d["l_window"] == w
        gids = np.unique(np.r_[d["k_graph_id"][km], d["l_graph_id"][lm]])
        gids = gids[gids > 0]
        graphs = [GraphInfo(key=f"g{g}", graph_id=int(g)) for g in gids.tolist()]
        index = {g: i for i, g in enumerate(gids.tolist())}
        name = d["k_name"][km]
        kernels = {"start_ns": d["k_start"][km], "end_ns": d["k_end"][km], "stream": d["k_stream"][km],
                   "device": d["k_device"][km].astype(np.int32), "graph_id": d["k_graph_id"][km],
                   "graph_node_id": d["k_node"][km], "correlation_id": d["k_corr"][km],
                   "name_id": np.where(name >= 0, name, -1).astype(np.int32)}
        m = int(lm.sum())
        launches = {"correlation_id": d["l_corr"][lm], "device": np.zeros(m, np.int32),
                    "graph": np.array([index.get(int(g), -1) for g in d["l_graph_id"][lm].tolist()], np.int32),
                    "launch_ns": d["l_launch_ns"][lm], "stream": d["l_stream"][lm], "label": np.full(m, -1, np.int32)}
        try:
            win = assemble(WindowRecords(kernels=kernels, launches=launches, names=names, graphs=graphs,
                                         started_s=0.0, ended_s=0.0))
            t = win.trace
            a = analyze(t)
            ref = analyze_reference(t)
        except Exception as e:
            out["errors"] += 1
            out["last_error"] = repr(e)
            continue
        out["windows"] += 1
        for k, v in t.invalid.items():
            out["invalid"][k] = out["invalid"].get(k, 0) + int(v)
        out["replays"] += len(a.replays)
        g = a.gaps.values
        out["gaps"] += len(g)
        out["neg_gaps"] += int((g < 0).sum())
        out["gaps_below_1us"] += int((g < NEG_NS).sum())
        if len(g):
            out["min_gap_ns"] = int(g.min()) if out["min_gap_ns"] is None else min(out["min_gap_ns"], int(g.min()))
        if not (np.array_equal(a.replays.span_ns, ref.replays.span_ns)
                and np.array_equal(a.replays.busy_ns, ref.replays.busy_ns)
                and np.array_equal(np.sort(a.gaps.values), np.sort(ref.gaps.values))):
            out["fast_vs_reference_differs"] += 1
    return out


def summarize(path: str) -> tuple[str, dict]:
    z = np.load(path, allow_pickle=False)
    d = {k: z[k] for k in z.files}
    meta = json.loads(str(d["meta"]))
    lines = [f"diag_replays: {path}", f"meta: {json.dumps({k: meta.get(k) for k in ('torch', 'transformers', 'device', 'variants', 'dry_run')})}",
             f"collector errors: {meta.get('errors')}",
             "collector stats: " + json.dumps({k: (meta.get("stats") or {}).get(k) for k in (
                 "windows", "late_stamped_records", "empty_no_launches", "idle_windows", "last_flush_ms")})]
    rows = replay_table(d)
    report: dict = {"meta": meta, "variants": {}}
    for vi, variant in enumerate(meta.get("variants", [])):
        vr = [r for r in rows if r["variant"] == vi]
        wins = sorted({r["window"] for r in vr})
        with_span = [r for r in vr if "span_ns" in r]
        flagged = [r for r in with_span if r.get("span_over_window_median", 0) > SPAN_FACTOR
                   or r.get("span_over_variant_median", 0) > SPAN_FACTOR or r["gaps_below_1us"] > 0]
        gv = graphmon_view(_select_variant(d, vi))
        pos: dict[str, int] = {}
        for r in flagged:
            k = ("first" if r["launch_index"] == 0 else "last" if r["launch_index"] == r["launches_in_window"] - 1
                 else "middle")
            pos[k] = pos.get(k, 0) + 1
        gen = d["gen_variant"] == vi
        gids = d["l_graph_id"][np.isin(d["l_window"], wins)]
        spans = np.array([r["span_ns"] for r in with_span], np.float64)
        ev_ratio = [r["span_ns"] / 1e6 / r["event_ms"] for r in with_span if r.get("event_ms")]
        summ = {
            "windows": len(wins), "capture_windows": int(sum(d["w_capture"][w] for w in wins)),
            "launches": len(vr), "replays_with_records": len(with_span),
            "generate_calls": int(gen.sum()),
            "distinct_graphs_launched": int(len(np.unique(gids[gids > 0]))),
            "launches_per_generate": float(len(vr)) / max(1, int(gen.sum())),
            "median_span_us": float(np.median(spans)) / 1e3 if len(spans) else None,
            "replays_flagged": len(flagged), "flagged_position_in_window": pos,
            "flagged_in_capture_windows": sum(1 for r in flagged if r["capture"]),
            "windows_with_forced_flush": len({r["window"] for r in vr if r["forced_flush"]}),
            "neg_gaps_raw": int(sum(r["neg_gaps"] for r in with_span)),
            "gaps_below_1us_raw": int(sum(r["gaps_below_1us"] for r in with_span)),
            "neg_gap_replays_by_position": {p: sum(1 for r in with_span if r["neg_gaps"] and (
                "first" if r["launch_index"] == 0 else "last" if r["launch_index"] == r["launches_in_window"] - 1
                else "middle") == p) for p in ("first", "middle", "last")},
            "launches_with_two_enters": sum(1 for r in vr if r["enter_callbacks"] > 1),
            "replays_with_repeated_nodes": sum(1 for r in with_span if r["node_max_mult"] > 1),
            "replays_with_several_graph_ids": sum(1 for r in with_span if len(r["graph_ids"]) > 1),
            "launches_without_records": sum(1 for r in vr if not r["records"]),
            "records_with_bad_timestamps": int(sum(r.get("bad_timestamps", 0) for r in vr)),
            "non_graph_records_under_a_launch_corr": int(sum(r.get("non_graph_records", 0) for r in vr)),
            "span_over_event_ms_median": float(np.median(ev_ratio)) if ev_ratio else None,
            "graphmon": gv,
        }
        report["variants"][variant] = {"summary": summ, "flagged": flagged[:40]}
        lines.append(f"\n== variant {variant}")
        for k, v in summ.items():
            lines.append(f"  {k}: {v}")
        lines.append(f"  flagged replays (span > {SPAN_FACTOR}x its graph's median, or a gap < {NEG_NS} ns on a stream), "
                     "first 12:")
        for r in flagged[:12]:
            lines.append("   - " + json.dumps({k: r.get(k) for k in (
                "window", "capture", "launch_index", "launches_in_window", "corr", "graph_ids", "streams", "records",
                "nodes", "node_max_mult", "span_ns", "busy_ns", "span_over_window_median", "event_ms", "neg_gaps",
                "min_gap_ns", "first_kernel", "last_kernel", "enter_rel_on_us", "exit_rel_off_us",
                "first_start_rel_on_us", "last_end_rel_off_us", "forced_flush", "longest_over_node_median")},
                default=str))
            for p in r.get("neg_pairs", [])[:3]:
                lines.append(f"       gap {p['gap_ns']} ns: {p['earlier']} (dur {p['earlier_dur_ns']}, node median "
                             f"{p['earlier_node_median_ns']:.0f}) -> {p['later']} (dur {p['later_dur_ns']}, node median "
                             f"{p['later_node_median_ns']:.0f})")
    return "\n".join(lines) + "\n", report


def _select_variant(d: dict, vi: int) -> dict:
    """The arrays of one variant's windows only (window indices kept)."""
    wins = np.flatnonzero(d["w_variant"] == vi)
    out = dict(d)
    km, lm = np.isin(d["k_window"], wins), np.isin(d["l_window"], wins)
    for k in d:
        if k.startswith("k_"):
            out[k] = d[k][km]
        elif k.startswith("l_"):
            out[k] = d[k][lm]
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("npz", nargs="?", help="a diag-replays.npz (--smoke: gpu-check-10's)")
    ap.add_argument("--json", help="also write the report (JSON) here")
    a = ap.parse_args(argv)
    npz = a.npz or (str(RECORDED) if a.smoke else None)
    if npz is None:
        ap.error("give a diag-replays.npz")
    if not Path(npz).is_file():
        ap.error(f"no such file: {npz}")
    text, report = summarize(npz)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
