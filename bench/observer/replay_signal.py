"""Can graphmon time every replay, cheaply? The always-on candidates of issue 30, on the graphs of
bench/observer/truth.py (a one-stream chain and decode_server's 4-stream graph, both with
in-graph events, so that every candidate's replay duration can be checked against them):

- ``callback_events``: CUDA events recorded from CUPTI's cuGraphLaunch callback (enter and exit),
  as graphmon's observer already does inside windows. Arms, interleaved block by block (the order
  rotates every round): subscribed with the launch callbacks off / callbacks on doing nothing /
  callbacks recording the two events. Host time of each launch call and GPU time per replay
  (events between back-to-back replays). Accuracy: the callback events' duration against the
  in-graph events of the same replay. Alongside windows: traced blocks with and without them.
- ``graph_trace``: CUPTI_ACTIVITY_KIND_GRAPH_TRACE (one record per graph launch). Graphs made
  before and after enabling it; records per graph; the duration against in-graph events; its
  cost (graphs with records against graphs without, GRAPH_TRACE on throughout); then the switch
  a kernel window needs: GRAPH_TRACE off + CONCURRENT_KERNEL on (kernel records of each graph?),
  back to GRAPH_TRACE (records again?), and both on at once.
- ``probes``: what cupti-python 13.4 offers besides: latency timestamps on kernel records
  (queued / submitted), HOST_LAUNCH records, CUDA_EVENT records with device timestamps.

    python bench/observer/replay_signal.py --out DIR [--stages callback_events,probes]
    python bench/observer/replay_signal.py --out DIR2 --stages graph_trace

Writes DIR/signal.json (after each stage) and DIR/signal-<stage>.npz. Run graph_trace in a process
of its own (``--stages graph_trace``): graphs captured after kernel tracing was on may run slower
(bench/observer/trace_residue.py), and it leaves graphs instantiated under GRAPH_TRACE behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import observer_stats as C  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)


# ---------------------------------------------------------------------- analysis (pure)
def rotations(arms, rounds: int) -> list[list]:
    """The arms' order in each round: rotated by one every round, so each arm is first as often."""
    arms = list(arms)
    return [arms[r % len(arms):] + arms[: r % len(arms)] for r in range(rounds)]


def steady(blocks) -> np.ndarray:
    """The replays of every block but each block's first (the switch's one-time cost)."""
    return np.concatenate([np.asarray(b, float)[1:] for b in blocks]) if len(blocks) else np.empty(0)


def cost_table(arms: dict, base: str, n_boot: int = C.BOOT) -> dict:
    """Per arm and metric (lists of per-block arrays): the median against the base arm's, with
    bootstrap intervals, in us and in %."""
    out = {}
    for arm, m in arms.items():
        out[arm] = {}
        for metric, blocks in m.items():
            out[arm][metric] = C.boot_diff(steady(arms[base][metric]), steady(blocks), n_boot=n_boot)
            out[arm][metric]["first_of_block_median"] = float(np.median([b[0] for b in blocks])) if blocks else None
    return out


def per_graph_counts(records, graph_col: int, corr_col: int, graph_ids: dict) -> dict:
    """Records and distinct launches (correlation ids) per named graph, and records of no known graph."""
    r = np.asarray(records, np.int64)
    if r.size == 0:
        r = r.reshape(0, max(graph_col, corr_col) + 1)
    out = {}
    known = np.zeros(len(r), bool)
    for name, gid in graph_ids.items():
        m = r[:, graph_col] == gid
        known |= m
        out[name] = {"records": int(m.sum()), "launches": int(len(np.unique(r[m, corr_col])))}
    out["_other"] = int((~known).sum())
    return out


def duration_accuracy(durations_ns, inner_span_ns, outer_ns) -> dict:
    """A candidate's replay durations against the in-graph events' span and the outer events of
    the same replays (paired, in order; the shorter length is used and both lengths reported)."""
    d, i, o = (np.asarray(v, float) for v in (durations_ns, inner_span_ns, outer_ns))
    n = min(len(d), len(i), len(o))
    res = {"n_candidate": int(len(d)), "n_reference": int(len(i))}
    if n:
        res["minus_inner_span_ns"] = C.paired(i[:n], d[:n])
        res["minus_outer_ns"] = C.paired(o[:n], d[:n])
        res["candidate_median_ns"] = float(np.median(d[:n]))
        res["inner_span_median_ns"] = float(np.median(i[:n]))
    return res


# ---------------------------------------------------------------------- on the GPU
def _graphs(a, suffix=""):
    from bench.common.observer_gpu import chain_graph, chain_layout, decode_graph

    make = {"chain": lambda: chain_graph(chain_layout(), "chain" + suffix), "decode": lambda: decode_graph(a.layers, "decode" + suffix)}
    return {name: make[name]() for name in a.graphs.split(",")}


def _warm(graphs) -> None:
    import torch

    for g in graphs.values():
        for _ in range(5):
            g.replay()
    torch.cuda.synchronize()


def stage_callback_events(cu, a) -> dict:
    import torch

    from bench.common.observer_gpu import LaunchEvents, queued_replays, synced_replays

    graphs = _graphs(a)
    _warm(graphs)
    ev = LaunchEvents(4 * max(a.block, a.sync_n) + 8)

    def set_arm(arm):
        cu.on_launch = ev.on_launch if arm == "callback_events" else None
        cu.launch_callbacks(arm != "subscribed")

    arm_names = ("subscribed", "callback", "callback_events")
    res, raw = {}, {}
    for name, g in graphs.items():
        arms = {arm: {"gpu_us": [], "launch_us": []} for arm in arm_names}
        for order in rotations(arm_names, a.rounds):
            for arm in order:
                set_arm(arm)
                ev.reset()
                q = queued_replays(g.replay, a.block)
                for k in ("gpu_us", "launch_us"):
                    arms[arm][k].append(q[k])
        set_arm("subscribed")
        for arm in arm_names:
            for k in ("gpu_us", "launch_us"):
                raw[f"{name}_{arm}_{k}"] = np.array(arms[arm][k])
        # accuracy: synced replays, the callback's events against the in-graph events
        set_arm("callback_events")
        ev.reset()
        s = synced_replays(g, a.sync_n)
        d = ev.durations_ns()
        set_arm("subscribed")
        span = s["inner_ms"][:, -1] * 1e6
        raw[f"{name}_sync_cb_ns"], raw[f"{name}_sync_inner_span_ns"], raw[f"{name}_sync_outer_ns"] = d, span, s["outer_us"] * 1e3
        res[name] = {"cost": cost_table(arms, "subscribed"), "accuracy": duration_accuracy(d, span, s["outer_us"] * 1e3),
                     "replay_gpu_us_median": float(np.median(steady(arms["subscribed"]["gpu_us"])))}
        # alongside kernel windows: traced blocks with and without the callback's events
        win = {"off": {"span_ns": [], "gap_med_ns": [], "kernels": []}, "on": {"span_ns": [], "gap_med_ns": [], "kernels": []}}
        for p in range(a.window_pairs):
            for side in (("off", "on") if p % 2 == 0 else ("on", "off")):
                set_arm("callback_events" if side == "on" else "callback")  # graphmon's windows have callbacks on
                ev.reset()
                cu.enable("CONCURRENT_KERNEL")
                s = synced_replays(g, a.sync_n)
                cu.enable("CONCURRENT_KERNEL", False)
                cu.flush()
                k = cu.take_kernels()
                idx, uniq = C.replay_of(k[:, 5])
                gm = [float(np.median(C.stream_gaps(k[idx == r, 0], k[idx == r, 1], k[idx == r, 2])[0])) for r in range(len(uniq))]
                win[side]["span_ns"].append(s["inner_ms"][:, -1] * 1e6)
                win[side]["gap_med_ns"].append(np.array(gm))
                win[side]["kernels"].append(np.bincount(idx))
        set_arm("subscribed")
        res[name]["with_windows"] = {
            "traced_inner_span_ns": C.boot_diff(steady(win["off"]["span_ns"]), steady(win["on"]["span_ns"])),
            "traced_cupti_gap_median_ns": C.boot_diff(steady(win["off"]["gap_med_ns"]), steady(win["on"]["gap_med_ns"])),
            "kernels_per_replay": {side: sorted({int(x) for b in w["kernels"] for x in b}) for side, w in win.items()}}
        c = res[name]["cost"]
        print(f"{name}: replay {res[name]['replay_gpu_us_median']:.0f} us; callback events: GPU "
              f"{c['callback_events']['gpu_us']['diff']:+.2f} us ({c['callback_events']['gpu_us']['pct']:+.3f}%), launch "
              f"{c['callback_events']['launch_us']['diff']:+.2f} us; accuracy vs in-graph span "
              f"{res[name]['accuracy'].get('minus_inner_span_ns', {}).get('median', float('nan')):+.0f} ns", flush=True)
    torch.cuda.synchronize()
    C.save_raw(a.out, "signal-callback_events", **raw)
    res["callback_errors"] = cu.callback_errors
    return res


def stage_probes(cu, a) -> dict:
    import torch

    from bench.common.observer_gpu import chain_graph, chain_layout, synced_replays

    c = cu.c
    g = chain_graph(chain_layout(sizes=(2, 8), repeats=1), "probe_chain")
    _warm({"g": g})
    res: dict = {}

    def probe(name, fn):
        try:
            res[name] = fn()
        except Exception as e:  # each probe apart: a kind this CUPTI lacks must not hide the others
            res[name] = {"error": repr(e)}
        print(name, res[name], flush=True)

    def latency():
        c.activity_enable_latency_timestamps(1)
        try:
            cu.enable("CONCURRENT_KERNEL")
            synced_replays(g, 4, with_inner=False)
            cu.enable("CONCURRENT_KERNEL", False)
            cu.flush()
        finally:
            c.activity_enable_latency_timestamps(0)
        k = cu.take_kernels()
        q, sub = k[:, 6], k[:, 7]
        ok = (q > 0) & (sub > 0)
        return {"records": int(len(k)), "with_queued": int((q > 0).sum()), "with_submitted": int((sub > 0).sum()),
                "start_minus_queued_ns_median": float(np.median(k[ok, 0] - q[ok])) if ok.any() else None,
                "start_minus_submitted_ns_median": float(np.median(k[ok, 0] - sub[ok])) if ok.any() else None}

    def host_launch():
        cu.host_launches.clear()
        cu.enable("HOST_LAUNCH")
        synced_replays(g, 4, with_inner=False)
        cu.enable("HOST_LAUNCH", False)
        cu.flush()
        return {"records": len(cu.host_launches), "note": "HOST_LAUNCH traces host functions (cudaLaunchHostFunc), not graph launches"}

    def cuda_event():
        cu.cuda_events.clear()
        c.activity_enable_cuda_event_device_timestamps(1)
        try:
            cu.enable("CUDA_EVENT")
            synced_replays(g, 4)
            torch.cuda.synchronize()
            cu.enable("CUDA_EVENT", False)
            cu.flush()
        finally:
            c.activity_enable_cuda_event_device_timestamps(0)
        ev = np.array(cu.cuda_events, dtype=np.int64).reshape(-1, 4)
        return {"records": int(len(ev)), "with_device_timestamp": int((ev[:, 0] > 0).sum()),
                "in_graph_events_per_replay": len(g.inner), "outer_events_per_replay": 2}

    probe("latency_timestamps", latency)
    probe("host_launch", host_launch)
    probe("cuda_event_device_timestamps", cuda_event)
    res["other_record_kinds"] = dict(cu.other)
    return res


def stage_graph_trace(cu, a) -> dict:
    """GRAPH_TRACE. Its cost is measured without ever switching it off: in observer-h200-call1,
    replays after switching it off again ran slower than before it was ever on (the "off" arm was
    not a baseline). Arms, interleaved with GRAPH_TRACE on: graphs instantiated before enabling
    it (no records) and after (records), two instances each (instances differ by up to ~1.5%:
    the spread between two of one arm is reported too); and the pre graphs before enabling it
    against the same graphs with it on (one after the other). Run it in a process where kernel
    tracing has not been on: graphs captured after a traced window may run slower (trace_residue)."""
    import torch

    from bench.common.observer_gpu import queued_replays, synced_replays

    res: dict = {}
    pre = {f"{k}_pre{i}": g for i in (1, 2) for k, g in _graphs(a, f"_pre{i}").items()}
    _warm(pre)
    raw: dict = {}

    def blocks(graphs: dict, rounds: int) -> dict:
        out = {name: {"gpu_us": [], "launch_us": []} for name in graphs}
        for order in rotations(list(graphs), rounds):
            for name in order:
                q = queued_replays(graphs[name].replay, a.block)
                for k in ("gpu_us", "launch_us"):
                    out[name][k].append(q[k])
        return out

    before = blocks(pre, a.rounds)
    t0 = time.perf_counter()
    cu.enable("GRAPH_TRACE")
    res["enable_us"] = (time.perf_counter() - t0) * 1e6
    post = {f"{k}_post{i}": g for i in (1, 2) for k, g in _graphs(a, f"_post{i}").items()}
    allg = {**pre, **post}
    ids = {name: cu.graph_id(g.exec_handle) for name, g in allg.items()}
    res["graph_ids"] = ids
    _warm(allg)
    cu.flush()
    cu.take_graph_traces()
    cu.take_kernels()

    def phase(label: str, n: int) -> dict:
        spans, outer = {}, {}
        for name, g in allg.items():
            s = synced_replays(g, n)
            spans[name], outer[name] = s["inner_ms"][:, -1] * 1e6, s["outer_us"] * 1e3
        torch.cuda.synchronize()
        cu.flush()
        gt, k = cu.take_graph_traces(), cu.take_kernels()
        raw[f"{label}_graph_trace"], raw[f"{label}_kernels_n"] = gt, np.array([len(k)])
        out = {"graph_trace": per_graph_counts(gt, 3, 4, ids), "kernels": per_graph_counts(k[:, :6], 3, 5, ids),
               "replays_per_graph": n, "accuracy": {}, "inner_span_us": {}}
        for name in allg:
            recs = gt[gt[:, 3] == ids[name]]
            if len(recs):
                recs = recs[np.argsort(recs[:, 0])]
                out["accuracy"][name] = duration_accuracy(recs[:, 1] - recs[:, 0], spans[name], outer[name])
            out["inner_span_us"][name] = float(np.median(spans[name][1:])) / 1e3
            raw[f"{label}_{name}_inner_span_ns"], raw[f"{label}_{name}_outer_ns"] = spans[name], outer[name]
        print(label, {n_: v for n_, v in out["graph_trace"].items()}, "kernels", out["kernels"], flush=True)
        return out

    def step(name, fn):
        try:
            res[name] = fn()
        except Exception as e:
            res[name] = {"error": repr(e)}
            print(name, "failed:", repr(e), flush=True)

    step("gt_on", lambda: phase("gt_on", a.sync_n))

    def cost():
        on = blocks(allg, a.rounds)
        cu.flush()
        out = {"graph_trace_records": per_graph_counts(cu.take_graph_traces(), 3, 4, ids)}
        for name, m in {**{f"before_{k}": v for k, v in before.items()}, **on}.items():
            for k in ("gpu_us", "launch_us"):
                raw[f"cost_{name}_{k}"] = np.array(m[k])
        for kind in a.graphs.split(","):
            pool = lambda d, names: {k: sum((d[n][k] for n in names), []) for k in ("gpu_us", "launch_us")}  # noqa: E731
            pre_n, post_n = [f"{kind}_pre1", f"{kind}_pre2"], [f"{kind}_post1", f"{kind}_post2"]
            arms = {"pre_gt_off": pool(before, pre_n), "pre_gt_on": pool(on, pre_n), "post_gt_on": pool(on, post_n),
                    "pre1": pool(on, pre_n[:1]), "pre2": pool(on, pre_n[1:]), "post1": pool(on, post_n[:1]), "post2": pool(on, post_n[1:])}
            t = cost_table(arms, "pre_gt_on")
            out[kind] = {"records_cost": t["post_gt_on"], "enabled_no_records": cost_table(arms, "pre_gt_off")["pre_gt_on"],
                         "spread_pre": cost_table(arms, "pre1")["pre2"], "spread_post": cost_table(arms, "post1")["post2"]}
            c = out[kind]["records_cost"]["gpu_us"]
            print(f"cost {kind}: GRAPH_TRACE records: GPU {c['diff']:+.2f} us ({c['pct']:+.3f}% [{c['pct_ci'][0]:+.3f}, "
                  f"{c['pct_ci'][1]:+.3f}]); instance spread {out[kind]['spread_pre']['gpu_us']['pct']:+.3f}% / "
                  f"{out[kind]['spread_post']['gpu_us']['pct']:+.3f}%", flush=True)
        return out

    step("cost", cost)

    def switch(label, gt_on: bool, kernel_on: bool):
        def run():
            cu.enable("GRAPH_TRACE", gt_on)
            if kernel_on:
                cu.enable("CONCURRENT_KERNEL")
            try:
                return phase(label, a.switch_n)
            finally:
                if kernel_on:
                    cu.enable("CONCURRENT_KERNEL", False)
        return run

    step("kernel_window", switch("kernel_window", False, True))  # a window: GRAPH_TRACE off, kernels on
    step("gt_again", switch("gt_again", True, False))  # and back
    step("both_on", switch("both_on", True, True))
    cu.enable("GRAPH_TRACE", False)
    cu.flush()
    C.save_raw(a.out, "signal-graph_trace", **raw)
    return res


STAGES = {"callback_events": stage_callback_events, "probes": stage_probes, "graph_trace": stage_graph_trace}


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", default="callback_events,probes",
                    help="callback_events, probes, graph_trace (graph_trace in a process of its own: see its docstring)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of interleaved cost blocks")
    ap.add_argument("--block", type=int, default=20, help="back-to-back replays per cost block")
    ap.add_argument("--sync-n", type=int, default=30, help="synchronized replays for the accuracy checks")
    ap.add_argument("--window-pairs", type=int, default=4, help="traced block pairs with and without the callback's events")
    ap.add_argument("--switch-n", type=int, default=6, help="replays per graph in each switch step")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--graphs", default="chain,decode", help="which graphs: chain, decode or both")
    a = ap.parse_args(argv)
    if min(a.rounds, a.window_pairs, a.switch_n) < 1 or a.block < 3 or a.sync_n < 3:
        ap.error("--rounds, --window-pairs, --switch-n >= 1; --block, --sync-n >= 3")
    if not a.graphs or set(a.graphs.split(",")) - {"chain", "decode"}:
        ap.error("--graphs: chain, decode or chain,decode")
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        ap.error(f"unknown stage(s) {unknown}: choose from {list(STAGES)}")
    os.makedirs(a.out, exist_ok=True)
    from bench.common.observer_gpu import run_stages

    return run_stages(os.path.join(a.out, "signal.json"), stages, STAGES, a)


if __name__ == "__main__":
    sys.exit(main())
