"""Ground truth for the observer effect (issue 30): what CUPTI's kernel tracing does to the gaps,
span, busy and idle time that graphmon exports, measured without tracing by events inside the graph.

Each graph carries event-record nodes (torch.cuda.Event(external=True) recorded during capture)
before each group of kernels and after the last, then one marker kernel. Replays alternate in
blocks, untraced and traced (CONCURRENT_KERNEL on, as in a graphmon window; the order flips every
pair), one synchronize per replay (a decode step waiting for its token). Per group of kernels:

- the event time untraced vs traced: what tracing adds to that stretch of the GPU's timeline;
- in the traced replays, CUPTI's window for the same stretch (first kernel of the group to the
  first of the next) against the event time of the same replay: do CUPTI's timestamps show the
  time the events see;
- busy (CUPTI's union of kernel intervals) and idle = time - busy, untraced (busy taken from the
  traced records: kernels assumed as long untraced) and traced; idle per kernel (on one stream:
  the mean gap, untraced and traced) and CUPTI's mean gap.

Graphs: ``chain`` (one stream; groups of 2, 8 and 32 tiny add_ kernels or fixed-length
torch.cuda._sleep kernels: a fit over group sizes splits tracing's cost per kernel from the
boundary's), ``decode`` (decode_server's 4-stream, 48-layer graph with an event before each layer
on the main stream). A replay's records are cut into groups in graph-node-id order (capture
order). The HF torch.compile graph is bench/observer/hf_decode.py (events cannot go inside torch's
own graphs).

    python bench/observer/truth.py --out DIR [--stages chain,decode] [--pairs 8] [--block 12]

Writes DIR/truth.json (rewritten after each stage) and DIR/truth-<stage>.npz (the raw timings and
records: ``--reanalyze DIR`` recomputes the JSON from them without a GPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import observer_stats as C  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)


# ---------------------------------------------------------------------- analysis (pure)
def infer_counts(n_kernels: int, n_groups: int) -> list[int]:
    """Kernels per group of a graph whose groups are all alike (decode's layers), and the marker:
    from one replay's kernel count."""
    if n_groups <= 0 or (int(n_kernels) - 1) % n_groups:
        raise C.LayoutError(f"{n_kernels} kernels do not split into {n_groups} equal groups and a marker")
    return [(int(n_kernels) - 1) // n_groups] * n_groups + [1]


def traced_metrics(kernels, kblock, n_blocks: int, block: int, counts) -> tuple[list, dict]:
    """replay_metrics of every traced replay (block-major order), None where a block's records
    do not hold ``block`` launches or a replay does not fit the layout; and counts of both."""
    k = np.asarray(kernels, np.int64).reshape(-1, 8)
    kblock = np.asarray(kblock, np.int64)
    out: list = []
    bad = {"blocks_wrong_launch_count": 0, "replays_off_layout": 0}
    for b in range(n_blocks):
        kb = k[kblock == b]
        idx, uniq = C.replay_of(kb[:, 5])
        if len(uniq) != block:
            bad["blocks_wrong_launch_count"] += 1
            out += [None] * block
            continue
        for r in range(block):
            m = idx == r
            try:
                out.append(C.replay_metrics(kb[m, 0], kb[m, 1], kb[m, 2], kb[m, 4], counts))
            except C.LayoutError:
                bad["replays_off_layout"] += 1
                out.append(None)
    return out, bad


def analyze_truth(raw: dict, n_boot: int = C.BOOT) -> dict:
    """The stage's figures from its raw arrays (see run_graph for the names)."""
    block, n_blocks = int(raw["block"]), int(raw["blocks_traced"])
    types = [str(t) for t in raw["types"]]
    G = len(types)
    k = np.asarray(raw["kernels"], np.int64).reshape(-1, 8)
    counts = [int(v) for v in raw["counts"]] if len(raw["counts"]) else None
    if counts is None:  # alike groups: from the kernel count of the first traced replay
        counts = infer_counts(int((k[:, 5] == k[:, 5].min()).sum()) if len(k) else 0, G)
    metrics, bad = traced_metrics(k, raw["kblock"], n_blocks, block, counts)
    pos_u, pos_t = np.asarray(raw["pos_untraced"]), np.asarray(raw["pos_traced"])
    keep_u, keep_t = pos_u > 0, pos_t > 0  # the first replay of each block apart (the enable's one-time cost)
    iu, it = np.asarray(raw["inner_untraced"], float), np.asarray(raw["inner_traced"], float)
    eu, et = C.group_times_ns(iu), C.group_times_ns(it)
    m_keep = [m for m, kk in zip(metrics, keep_t) if kk]
    out: dict = {"layout": {"groups": G, "kernels_per_group": counts[:G], "marker": True,
                            "streams": sorted({m["streams"] for m in metrics if m is not None}), "kernels_per_replay": float(np.median([m["kernels"].sum() for m in metrics if m is not None]))
                            if any(m is not None for m in metrics) else None},
                 "records": bad, "groups": C.compare_groups(eu[keep_u], et[keep_t], m_keep, types, n_boot),
                 "replay": C.compare_replays(iu[keep_u, -1] * 1e6, it[keep_t, -1] * 1e6, m_keep, n_boot)}
    for key in ("outer_us", "launch_us", "step_us"):
        u, t = np.asarray(raw[key + "_untraced"], float), np.asarray(raw[key + "_traced"], float)
        out[key] = C.boot_diff(u[keep_u], t[keep_t], n_boot=n_boot)
        out[key]["first_traced_median"] = float(np.median(t[~keep_t])) if (~keep_t).any() else None
        out[key]["first_untraced_median"] = float(np.median(u[~keep_u])) if (~keep_u).any() else None
    first_span = it[~keep_t, -1] * 1e6
    out["first_traced_event_span_ns"] = float(np.median(first_span)) if len(first_span) else None
    if "sizes" in raw and len(raw["sizes"]):
        out["fit"] = C.regression_by_size(eu[keep_u], et[keep_t], raw["sizes"], raw["kinds"], n_boot=min(n_boot, 500))
        # kernel durations per kind: the sleep kernel's is fixed by its cycle count
        kinds = np.asarray([str(x) for x in raw["kinds"]])
        durs: dict = {}
        for m in m_keep:
            if m is None:
                continue
            for kind in np.unique(kinds):
                sel = np.isin(m["kernel_group"], np.flatnonzero(kinds == kind))
                durs.setdefault(kind, []).append(m["kernel_ns"][sel])
        out["kernel_ns"] = {kind: {"median": float(np.median(np.concatenate(v))), "p10": float(np.quantile(np.concatenate(v), 0.1)),
                                   "p90": float(np.quantile(np.concatenate(v), 0.9))} for kind, v in durs.items()}
        if "sleep_cycles" in raw and float(raw.get("sm_clock_khz", 0)):
            out["kernel_ns"]["sleep_expected_at_max_clock"] = float(raw["sleep_cycles"]) / float(raw["sm_clock_khz"]) * 1e6
    return out


# ---------------------------------------------------------------------- on the GPU
def run_graph(cu, graph, pairs: int, block: int, out_dir: str, name: str, extra: dict | None = None) -> dict:
    import torch

    from bench.common.observer_gpu import synced_replays

    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    cu.take_kernels()
    arms: dict = {a: {"inner": [], "outer": [], "launch": [], "step": [], "pos": []} for a in ("untraced", "traced")}
    kernels, kblock = [], []
    for p in range(pairs):
        for arm in (("untraced", "traced") if p % 2 == 0 else ("traced", "untraced")):
            if arm == "traced":
                cu.enable("CONCURRENT_KERNEL")
            r = synced_replays(graph, block)
            if arm == "traced":
                cu.enable("CONCURRENT_KERNEL", False)
                cu.flush()
                k = cu.take_kernels()
                kernels.append(k)
                kblock.append(np.full(len(k), len(kernels) - 1))
            a = arms[arm]
            a["inner"].append(r["inner_ms"])
            for key in ("outer", "launch", "step"):
                a[key].append(r[key + "_us"])
            a["pos"].append(np.arange(block))
    raw = {"block": block, "blocks_traced": pairs, "types": np.array(graph.types), "counts": np.array(graph.counts, np.int64),
           "kernels": np.concatenate(kernels) if kernels else np.empty((0, 8), np.int64),
           "kblock": np.concatenate(kblock) if kblock else np.empty(0, np.int64)}
    for arm, a in arms.items():
        raw[f"inner_{arm}"] = np.concatenate(a["inner"])
        raw[f"pos_{arm}"] = np.concatenate(a["pos"])
        for key in ("outer", "launch", "step"):
            raw[f"{key}_us_{arm}"] = np.concatenate(a[key])
    if graph.sizes is not None:
        raw["sizes"], raw["kinds"] = np.array(graph.sizes), np.array(graph.kinds)
    raw.update(extra or {})
    path = C.save_raw(out_dir, f"truth-{name}", **raw)
    print(f"{name}: raw -> {path}; dropped records {cu.dropped()}", flush=True)
    res = analyze_truth(raw)
    res["dropped_records"] = cu.dropped()
    _print_summary(name, res)
    return res


def _print_summary(name: str, res: dict) -> None:
    r = res["replay"]["event_span_ns"]
    print(f"{name}: in-graph span {r['base'] / 1e3:.1f} -> {r['other'] / 1e3:.1f} us traced "
          f"({r['pct']:+.1f}% [{r['pct_ci'][0]:+.1f}, {r['pct_ci'][1]:+.1f}])", flush=True)
    for label, g in res["groups"].items():
        if label == "replays" or "cupti_minus_event_ns" not in g:
            continue
        e = g["event_ns"]
        print(f"  {label}: event {e['base']:.0f} -> {e['other']:.0f} ns ({e['pct']:+.1f}%); CUPTI - event "
              f"{g['cupti_minus_event_ns']['median']:+.0f} ns; idle per kernel untraced {g['idle_per_kernel_ns']['untraced']:.0f}, "
              f"traced (CUPTI) {g['idle_per_kernel_ns']['traced_cupti']:.0f} ns; CUPTI mean gap {g['cupti_gap_mean_ns'][0]:.0f} ns",
              flush=True)


def stage_chain(cu, a) -> dict:
    from bench.common.observer_gpu import SLEEP_CYCLES, chain_graph, chain_layout, device_info

    g = chain_graph(chain_layout())
    return run_graph(cu, g, a.pairs, a.block, a.out, "chain",
                     {"sleep_cycles": SLEEP_CYCLES, "sm_clock_khz": device_info()["sm_clock_khz"]})


def stage_decode(cu, a) -> dict:
    import torch

    from bench.common.observer_gpu import decode_graph, plain_decode_graph

    g = decode_graph(a.layers)
    res = run_graph(cu, g, a.pairs, a.block, a.out, "decode")
    # the evented copy of DecodeModel.step must launch the same kernels (+ the marker)
    pg, _h, _x = plain_decode_graph(g.model)
    for _ in range(3):
        pg.replay()
    torch.cuda.synchronize()
    cu.take_kernels()
    cu.enable("CONCURRENT_KERNEL")
    for _ in range(2):
        pg.replay()
    torch.cuda.synchronize()
    cu.enable("CONCURRENT_KERNEL", False)
    cu.flush()
    k = cu.take_kernels()
    res["plain_decode_kernels_per_replay"] = len(k) / 2
    return res


STAGES = {"chain": stage_chain, "decode": stage_decode}


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", default="chain,decode")
    ap.add_argument("--pairs", type=int, default=8, help="pairs of untraced/traced blocks per graph")
    ap.add_argument("--block", type=int, default=12, help="replays per block (the first of each is reported apart)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reanalyze", action="store_true", help="recompute truth.json from DIR/truth-*.npz (no GPU)")
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.block < 3:
        ap.error("--pairs >= 1 and --block >= 3")
    os.makedirs(a.out, exist_ok=True)
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        ap.error(f"unknown stage(s) {unknown}: choose from {list(STAGES)}")
    if a.reanalyze:
        st = C.Stages(os.path.join(a.out, "truth-reanalyzed.json"), {"reanalyzed": True})
        for s in stages:
            path = os.path.join(a.out, f"truth-{s}.npz")
            st.run(s, lambda p=path: analyze_truth(dict(np.load(p, allow_pickle=False))))
        return 0
    from bench.common.observer_gpu import run_stages

    return run_stages(os.path.join(a.out, "truth.json"), stages, STAGES, a, pairs=a.pairs, block=a.block)


if __name__ == "__main__":
    sys.exit(main())
