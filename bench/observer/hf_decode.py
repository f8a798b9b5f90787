"""The observer effect and the always-on candidates on an HF torch.compile graph (issue 30): a
random-weight Llama (bench/common/hf.py, host_impact's "HF" model: 8 layers, hidden 1024),
static-cache ``generate``, whose decode forward transformers compiles (cudagraph trees). Events
cannot go inside torch's own graphs, so each decode step is timed by CUDA events recorded from a
logits processor (once per generated token, outside the graph): a step = one graph replay + the
eager ops around it.

Stages (one process; the compile is paid once, in ``warm``):
- ``truth``: generate calls alternate untraced / traced (CONCURRENT_KERNEL on for the call): step
  time by events and by the host clock, untraced vs traced; CUPTI's replays (span, busy, idle,
  gaps) and kernels per step; CUPTI's step period (graph replay to graph replay) against the
  events' in the traced calls.
- ``callback_events``: calls rotate between subscribed (launch callbacks off), callbacks on doing
  nothing, and callbacks recording events: step time, and the callback events' replay duration.
- ``gt_late``: GRAPH_TRACE enabled after the graphs were captured: records?
- ``gt_only`` (with ``--gt-first``: GRAPH_TRACE on before the first capture): every replay timed
  by GRAPH_TRACE, untraced; then it is switched off, and ``truth`` compares those durations with
  CUPTI's spans of the same graph instances traced.
- ``gt_fresh``: torch.compiler.reset() with GRAPH_TRACE on, so the graphs are captured again
  under it: records per step, duration against the step events, cost (calls alternating
  GRAPH_TRACE on / off), then a kernel window (GRAPH_TRACE off, kernels on) and back.

    python bench/observer/hf_decode.py --out DIR [--stages warm,truth,callback_events,gt_late,gt_fresh] [--pairs 6]

Writes DIR/hf.json (after each stage) and DIR/hf-<stage>.npz.
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

SKIP_STEPS = 2  # the first decode steps of a call: the first after an enable pays its one-time cost


# ---------------------------------------------------------------------- analysis (pure)
def steps_ns(event_ms) -> np.ndarray:
    """Per call, the step times (ns) from the elapsed times of its per-token events (ms from the first)."""
    return np.diff(np.asarray(event_ms, float)) * 1e6


def calls_steady(calls) -> np.ndarray:
    """Every call's step times but the first SKIP_STEPS."""
    return np.concatenate([np.asarray(c, float)[SKIP_STEPS:] for c in calls]) if len(calls) else np.empty(0)


def hf_replays(kernels) -> dict:
    """One traced call's records: its graph replays (graph_id != 0, one correlation id each) in
    launch order, each one's span / busy / idle and gaps; and the eager kernels."""
    k = np.asarray(kernels, np.int64).reshape(-1, 8)
    g = k[k[:, 3] != 0]
    idx, uniq = C.replay_of(g[:, 5])
    reps = [C.replay_summary(g[idx == r, 0], g[idx == r, 1], g[idx == r, 2]) for r in range(len(uniq))]
    reps.sort(key=lambda m: m["first_start_ns"])
    return {"replays": reps, "eager_kernels": int((k[:, 3] == 0).sum()), "graph_kernels": int(len(g))}


def analyze_truth(raw: dict, n_boot: int = C.BOOT) -> dict:
    """raw: ev_untraced / ev_traced (calls x tokens, ms), host_untraced / host_traced (calls x
    tokens, s), kernels (N, 8) with kcall (the traced call of each record)."""
    su = [steps_ns(c) for c in raw["ev_untraced"]]
    st = [steps_ns(c) for c in raw["ev_traced"]]
    hu = [np.diff(np.asarray(c, float)) * 1e9 for c in raw["host_untraced"]]
    ht = [np.diff(np.asarray(c, float)) * 1e9 for c in raw["host_traced"]]
    out = {"calls": [len(su), len(st)], "steps_per_call": int(len(su[0])) if su else 0,
           "step_gpu_ns": C.boot_diff(calls_steady(su), calls_steady(st), n_boot=n_boot),
           "step_host_ns": C.boot_diff(calls_steady(hu), calls_steady(ht), n_boot=n_boot)}
    k = np.asarray(raw["kernels"], np.int64).reshape(-1, 8)
    kcall = np.asarray(raw["kcall"], np.int64)
    per = [hf_replays(k[kcall == c]) for c in range(len(st))]
    reps = [r for p in per for r in p["replays"][SKIP_STEPS:]]
    if reps:
        span = np.array([r["span_ns"] for r in reps])
        busy = np.array([r["busy_ns"] for r in reps])
        gaps = np.concatenate([r["gaps_ns"] for r in reps])
        kern = np.array([r["kernels"] for r in reps])
        period = np.concatenate([np.diff([r["first_start_ns"] for r in p["replays"]])[SKIP_STEPS:] for p in per])
        steps = max(out["steps_per_call"], 1)
        kps = float(np.mean([(p["graph_kernels"] + p["eager_kernels"]) / steps for p in per]))
        infl = out["step_gpu_ns"]["diff"]
        out.update({
            "replays_per_call": [len(p["replays"]) for p in per], "kernels_per_replay": float(np.median(kern)),
            "kernels_per_step": kps, "eager_kernels_per_call": [p["eager_kernels"] for p in per],
            "cupti_replay_span_ns": C.boot_ci(span, n_boot=n_boot), "cupti_replay_busy_ns": C.boot_ci(busy, n_boot=n_boot),
            "cupti_replay_idle_ns": C.boot_ci(span - busy, n_boot=n_boot),
            "cupti_gap_ns": {"median": float(np.median(gaps)), "p10": float(np.quantile(gaps, 0.1)),
                             "p90": float(np.quantile(gaps, 0.9))},
            "cupti_step_period_ns": C.boot_ci(period, n_boot=n_boot),
            "cupti_period_minus_event_step_ns": float(np.median(period)) - out["step_gpu_ns"]["other"],
            "inflation_per_kernel_ns": infl / kps if kps else float("nan"),
            "implied_untraced_idle_ns": float(np.median(span - busy)) - infl,
        })
        gt = np.asarray(raw.get("gt_untraced_ns", []), float)
        if len(gt):  # the same graph instances, untraced, timed by GRAPH_TRACE (--gt-first)
            out["replay_gt_untraced_vs_cupti_traced_ns"] = C.boot_diff(gt, span, n_boot=n_boot)
    return out


def analyze_pairs(raw: dict, arms, n_boot: int = C.BOOT) -> dict:
    """Calls of several arms (ev_<arm>, host_<arm>): step time of each arm against the first's."""
    out = {}
    for b in arms[1:]:
        for unit, key, scale in (("gpu", "ev", 1e6), ("host", "host", 1e9)):
            xa = calls_steady([np.diff(np.asarray(c, float)) * scale for c in raw[f"{key}_{arms[0]}"]])
            xb = calls_steady([np.diff(np.asarray(c, float)) * scale for c in raw[f"{key}_{b}"]])
            out[f"{b}_step_{unit}_ns"] = C.boot_diff(xa, xb, n_boot=n_boot)
    return out


# ---------------------------------------------------------------------- on the GPU
class Model:
    """host_impact's HF workload, with a CUDA event and a host stamp at every generated token."""

    def __init__(self, new_tokens: int) -> None:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        from bench.common.hf import llama

        self.model, cfg = llama()
        self.new_tokens = new_tokens
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(new_tokens + 2)]
        outer = self

        class Stamps(LogitsProcessor):
            def __call__(self, input_ids, scores):
                i = outer._n
                if i < len(outer.events):
                    outer.events[i].record()
                    outer._host.append(time.perf_counter())
                outer._n = i + 1
                return scores

        self._stamps = LogitsProcessorList([Stamps()])
        self.ids = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda")
        self.mask = torch.ones_like(self.ids)

    def call(self) -> tuple[np.ndarray, np.ndarray]:
        """One generate: the per-token events' elapsed ms from the first, and the host stamps (s)."""
        import torch

        self._n, self._host = 0, []
        with torch.inference_mode():
            self.model.generate(self.ids, attention_mask=self.mask, max_new_tokens=self.new_tokens, do_sample=False,
                                cache_implementation="static", logits_processor=self._stamps)
        torch.cuda.synchronize()
        n = min(self._n, len(self.events))
        e0 = self.events[0]
        return np.array([0.0] + [e0.elapsed_time(self.events[i]) for i in range(1, n)]), np.array(self._host)


def _alternate(m: Model, rounds: int, arms, set_arm, after=None) -> dict:
    """Calls of every arm in each round, the order rotated every round."""
    from bench.observer.replay_signal import rotations

    raw: dict = {f"{k}_{arm}": [] for arm in arms for k in ("ev", "host")}
    for order in rotations(arms, rounds):
        for arm in order:
            set_arm(arm)
            ev, host = m.call()
            raw[f"ev_{arm}"].append(ev)
            raw[f"host_{arm}"].append(host)
            if after:
                after(arm)
    return raw


def _stack(raw: dict) -> dict:
    out = {}
    for k, v in raw.items():
        if isinstance(v, list) and v and isinstance(v[0], np.ndarray):
            n = min(len(x) for x in v)
            out[k] = np.array([x[:n] for x in v])
        else:
            out[k] = v
    return out


def stage_warm(ctx, a) -> dict:
    from bench.common.observer_gpu import Cupti

    t0 = time.perf_counter()
    ctx["m"] = Model(a.new_tokens)
    ctx["cu"] = Cupti()  # subscribed before the first capture, as graphmon run attaches
    if a.gt_first:  # the graphs are captured under GRAPH_TRACE: it can time them untraced
        ctx["cu"].enable("GRAPH_TRACE")
    times = []
    for _ in range(3):
        t = time.perf_counter()
        ctx["m"].call()
        times.append(time.perf_counter() - t)
    return {"setup_s": time.perf_counter() - t0, "warm_call_s": times, "launches_seen": ctx["cu"].launches}


def stage_gt_only(ctx, a) -> dict:
    """(--gt-first) GRAPH_TRACE on since before the capture: every replay's duration, untraced;
    then GRAPH_TRACE off (once: switching it on and off again slowed replays in call 1)."""
    m, cu = ctx["m"], ctx["cu"]
    cu.flush()
    cu.take_graph_traces()
    durs, per_call, steps = [], [], []
    for _ in range(a.pairs):
        ev, _h = m.call()
        cu.flush()
        g = cu.take_graph_traces()
        g = g[np.argsort(g[:, 0])]
        per_call.append(len(g))
        durs.append((g[:, 1] - g[:, 0])[SKIP_STEPS:])
        steps.append(steps_ns(ev))
    cu.enable("GRAPH_TRACE", False)
    cu.flush()
    cu.take_graph_traces()
    ctx["gt_untraced_ns"] = np.concatenate(durs) if durs else np.empty(0)
    return {"records_per_call": per_call, "tokens_per_call": a.new_tokens,
            "replay_ns": C.boot_ci(ctx["gt_untraced_ns"]) if len(ctx["gt_untraced_ns"]) else None,
            "step_event_ns": C.boot_ci(calls_steady(steps))}


def stage_truth(ctx, a) -> dict:
    m, cu = ctx["m"], ctx["cu"]
    cu.take_kernels()
    kern, kcall = [], []

    def set_arm(arm):
        if arm == "traced":
            cu.enable("CONCURRENT_KERNEL")

    def after(arm):
        if arm == "traced":
            cu.enable("CONCURRENT_KERNEL", False)
            cu.flush()
            k = cu.take_kernels()
            kern.append(k)
            kcall.append(np.full(len(k), len(kern) - 1))

    raw = _stack(_alternate(m, a.pairs, ("untraced", "traced"), set_arm, after))
    raw["kernels"] = np.concatenate(kern) if kern else np.empty((0, 8), np.int64)
    raw["kcall"] = np.concatenate(kcall) if kcall else np.empty(0, np.int64)
    if "gt_untraced_ns" in ctx:
        raw["gt_untraced_ns"] = ctx["gt_untraced_ns"]
    C.save_raw(a.out, "hf-truth", **raw)
    res = analyze_truth(raw)
    res["dropped_records"] = cu.dropped()
    s = res["step_gpu_ns"]
    print(f"hf truth: step {s['base'] / 1e3:.1f} -> {s['other'] / 1e3:.1f} us traced ({s['pct']:+.1f}%); "
          f"kernels/step {res.get('kernels_per_step', 0):.0f}", flush=True)
    return res


def stage_callback_events(ctx, a) -> dict:
    from bench.common.observer_gpu import LaunchEvents

    m, cu = ctx["m"], ctx["cu"]
    ev = LaunchEvents(4 * (a.new_tokens + 8))
    durs: list = []

    def set_arm(arm):
        ev.reset()
        cu.on_launch = ev.on_launch if arm == "callback_events" else None
        cu.launch_callbacks(arm != "subscribed")

    def after(arm):
        if arm == "callback_events":
            durs.append(ev.durations_ns())

    arms = ("subscribed", "callback", "callback_events")
    raw = _stack(_alternate(m, a.pairs, arms, set_arm, after))
    cu.on_launch = None
    cu.launch_callbacks(False)
    res = analyze_pairs(raw, arms)
    d = np.concatenate([x[SKIP_STEPS:] for x in durs]) if durs else np.empty(0)
    res["launches_per_call"] = [len(x) for x in durs]
    res["callback_replay_ns"] = C.boot_ci(d) if len(d) else None
    raw["cb_durations_ns"] = np.concatenate(durs) if durs else np.empty(0)
    C.save_raw(a.out, "hf-callback_events", **raw)
    return res


def stage_gt_late(ctx, a) -> dict:
    m, cu = ctx["m"], ctx["cu"]
    cu.take_graph_traces()
    cu.enable("GRAPH_TRACE")
    try:
        for _ in range(2):
            m.call()
    finally:
        cu.enable("GRAPH_TRACE", False)
        cu.flush()
    gt = cu.take_graph_traces()
    return {"graph_trace_records": int(len(gt)), "calls": 2, "tokens_per_call": a.new_tokens}


def stage_gt_fresh(ctx, a) -> dict:
    import torch

    m, cu = ctx["m"], ctx["cu"]
    res: dict = {}
    cu.enable("GRAPH_TRACE")
    t0 = time.perf_counter()
    torch.compiler.reset()  # dynamo's caches and cudagraph trees: the next call compiles and captures again
    if hasattr(m.model, "_compiled_call"):
        del m.model._compiled_call
    for _ in range(3):
        m.call()
    res["recompile_s"] = time.perf_counter() - t0
    cu.flush()
    cu.take_graph_traces()
    cu.take_kernels()
    # GRAPH_TRACE on: records per call, and their durations against the step events
    gts, evs = [], []
    for _ in range(3):
        ev, _h = m.call()
        cu.flush()
        gts.append(cu.take_graph_traces())
        evs.append(ev)
    per_call = [len(g) for g in gts]
    d = np.concatenate([(g[np.argsort(g[:, 0]), 1] - g[np.argsort(g[:, 0]), 0])[SKIP_STEPS:] for g in gts if len(g)]) \
        if any(len(g) for g in gts) else np.empty(0)
    st = calls_steady([steps_ns(e) for e in evs])
    res["gt_on"] = {"records_per_call": per_call, "tokens_per_call": a.new_tokens,
                    "graph_trace_duration_ns": C.boot_ci(d) if len(d) else None, "step_event_ns": C.boot_ci(st),
                    "kernel_records": int(len(cu.take_kernels()))}

    # cost: calls alternating GRAPH_TRACE on / off (the same captured graphs)
    state = {"on": True}

    def set_arm(arm):
        want = arm == "gt_on"
        if want != state["on"]:
            cu.enable("GRAPH_TRACE", want)
            state["on"] = want

    raw = _stack(_alternate(m, a.pairs, ("gt_off", "gt_on"), set_arm))
    res["cost"] = analyze_pairs(raw, ("gt_off", "gt_on"))
    # a kernel window on these graphs, and back
    cu.enable("GRAPH_TRACE", False)
    cu.flush()
    cu.take_graph_traces()
    cu.take_kernels()
    cu.enable("CONCURRENT_KERNEL")
    m.call()
    cu.enable("CONCURRENT_KERNEL", False)
    cu.flush()
    k = cu.take_kernels()
    res["kernel_window"] = {"kernel_records": int(len(k)), "graph_kernel_records": int((k[:, 3] != 0).sum()),
                            "graph_trace_records": int(len(cu.take_graph_traces()))}
    cu.enable("GRAPH_TRACE")
    m.call()
    cu.enable("GRAPH_TRACE", False)
    cu.flush()
    res["gt_again"] = {"graph_trace_records": int(len(cu.take_graph_traces())), "kernel_records": int(len(cu.take_kernels()))}
    C.save_raw(a.out, "hf-gt_fresh", **raw)
    print("gt_fresh", {k_: v for k_, v in res.items() if k_ != "cost"}, flush=True)
    return res


STAGES = {"warm": stage_warm, "gt_only": stage_gt_only, "truth": stage_truth, "callback_events": stage_callback_events,
          "gt_late": stage_gt_late, "gt_fresh": stage_gt_fresh}
DEFAULT_STAGES = "warm,truth,callback_events,gt_late,gt_fresh"


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", default=DEFAULT_STAGES)
    ap.add_argument("--gt-first", action="store_true",
                    help="GRAPH_TRACE on before the first capture (then: --stages warm,gt_only,truth)")
    ap.add_argument("--pairs", type=int, default=6, help="pairs of generate calls per comparison")
    ap.add_argument("--new-tokens", type=int, default=40)
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.new_tokens < SKIP_STEPS + 3:
        ap.error(f"--pairs >= 1 and --new-tokens >= {SKIP_STEPS + 3}")
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        ap.error(f"unknown stage(s) {unknown}: choose from {list(STAGES)}")
    if stages and stages[0] != "warm":
        stages.insert(0, "warm")  # every other stage needs the model and the subscription
    if ("gt_only" in stages) != a.gt_first:
        ap.error("gt_only needs --gt-first and --gt-first needs gt_only (GRAPH_TRACE must be switched off before truth)")
    os.makedirs(a.out, exist_ok=True)
    from bench.common.observer_gpu import device_info

    st = C.Stages(os.path.join(a.out, "hf.json"), {"argv": sys.argv[1:], "device": device_info(), "cupti": "raw cupti-python"})
    ctx: dict = {}
    for s in stages:
        if s != "warm" and "cu" not in ctx:
            st.doc["errors"][s] = "skipped: warm failed"
            continue
        st.run(s, STAGES[s], ctx, a)
    try:
        import transformers

        st.doc["meta"]["transformers"] = transformers.__version__
    except Exception:
        pass
    st.write()
    if "cu" in ctx:
        ctx["cu"].close()
    return 0 if not st.doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
