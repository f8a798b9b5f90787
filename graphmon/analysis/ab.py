"""A/B of CUDA-graph variants on one workload (uploaded vs not, or two builds): timing + gaps.

Pure statistics of A/B arms (no torch, no files): :class:`ArmData` holds what was measured for
one arm; :func:`analyze_ab` turns arms into an :class:`ABResult` (table and JSON-ready dict). The
GPU runner that measures arms is graphmon.gpu.ab_runner (``run_ab``; the built-in decode-like
workload is graphmon.gpu.workloads.decode_like_arms), the plot is
graphmon.report.plots.plot_ab, the raw-data folder graphmon.report.ab_files.

Why several instances per arm: two captures of the same graph differ by up to ±1.5% in step
time on an H200 (shared/notes), as much as the effect being looked for. The unit of evidence for
step time is therefore the *instance* (its median replay time); the ratio's confidence interval
is a percentile bootstrap over instances (analysis.significance.bootstrap_ci), never over replays, which
would pretend that 250 replays of one instance are 250 independent captures.

Why windows: kernel tracing perturbs replays by 12-33% while on, so step time is measured only
with tracing off and gaps only inside windows; the ratio traced/untraced step time per arm is
reported as the observer slowdown.

Python API (see docs/upload-ab-report.md for a complete torch example)::

    from graphmon.analysis.ab import analyze_ab
    from graphmon.gpu.ab_runner import run_ab
    from graphmon.report.plots import plot_ab
    arms = run_ab({"uploaded": build_uploaded, "lazy": build_lazy}, instances=8)
    result = analyze_ab(arms)           # the first arm is the baseline
    print(result.format_table()); plot_ab(result, "ab.png")

where each ``build_*()`` captures a fresh graph and returns a zero-argument callable that
replays it once (e.g. ``graph.replay``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from graphmon.analysis.replays import analyze, replay_stream_gaps_with_values, stream_order
from graphmon.analysis.significance import Thresholds, bootstrap_ci, judge, shift_test
from graphmon.model.trace import Trace, TraceError

INSTANCE_SEP = "#"  # graph label of an instance inside tracing windows: "<arm>#<instance>"


# ---------------------------------------------------------------------- data
@dataclass
class ArmData:
    """Everything measured for one arm.

    step_us: (instances, replays) CUDA-event time of each replay with no profiler active.
    traced_step_us: (instances, replays) the same inside tracing windows (observer slowdown).
    trace: kernels of the traced replays; each graph's label is "<arm>#<instance>".
    """

    name: str
    step_us: np.ndarray
    traced_step_us: np.ndarray | None = None
    trace: Trace | None = None

    def __post_init__(self) -> None:
        self.step_us = np.atleast_2d(np.asarray(self.step_us, dtype=np.float64))
        if self.step_us.size == 0 or not np.all(np.isfinite(self.step_us)) or (self.step_us <= 0).any():
            raise TraceError(f"arm {self.name!r}: step times must be positive and finite")
        if self.traced_step_us is not None:
            self.traced_step_us = np.atleast_2d(np.asarray(self.traced_step_us, dtype=np.float64))

    @property
    def instances(self) -> int:
        return self.step_us.shape[0]


@dataclass(frozen=True)
class StreamStats:
    rank: int  # stream role: rank of its first kernel's start within a replay (0 = first)
    replays: int
    median_gap_ns: float  # median over replays of the per-replay median gap
    p10_gap_ns: float  # of all gaps pooled
    p90_gap_ns: float
    gaps: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros(0, np.int64))


@dataclass(frozen=True)
class ArmSummary:
    name: str
    instances: int
    replays_timed: int
    step_median_us: float  # median of the per-instance medians
    instance_medians_us: list[float]
    instance_spread: float  # (max - min) / median of the per-instance medians
    traced_step_median_us: float  # NaN without windows
    observer_slowdown: float  # traced / untraced median step time - 1; NaN without windows
    traced_replays: int
    kernels_per_replay: float
    busy_median_us: float
    idle_median_us: float
    span_median_us: float
    streams: list[StreamStats]


@dataclass(frozen=True)
class ArmComparison:
    baseline: str
    current: str
    step_ratio: float  # current / baseline, ratio of the means of per-instance medians
    ci_low: float
    ci_high: float
    confidence: float
    streams: list[dict]  # graphmon.analysis.significance.shift_test per stream rank + verdict


@dataclass(frozen=True)
class ABResult:
    arms: list[ArmSummary]
    comparisons: list[ArmComparison]
    meta: dict

    def as_dict(self) -> dict:
        """Everything but the raw gaps and the private ("_") meta keys; floats may be NaN/inf
        (graphmon.report.jsonsafe.json_safe makes it JSON)."""
        arms = []
        for a in self.arms:
            d = {k: v for k, v in a.__dict__.items() if k != "streams"}
            d["streams"] = [{k: v for k, v in s.__dict__.items() if k != "gaps"} for s in a.streams]
            arms.append(d)
        meta = {k: v for k, v in self.meta.items() if not k.startswith("_")}
        return {"meta": meta, "arms": arms, "comparisons": [dict(c.__dict__) for c in self.comparisons]}

    def format_table(self) -> str:
        lines = [f"{'arm':<16} {'inst':>4} {'step us':>9} {'spread':>7} {'kernels':>7} {'busy us':>9} "
                 f"{'idle us':>8} {'observer':>8}  median gap per stream rank (ns)"]
        for a in self.arms:
            gaps = " ".join(f"s{s.rank}:{s.median_gap_ns:.0f}" for s in a.streams) or "-"
            lines.append(f"{a.name:<16} {a.instances:>4} {a.step_median_us:9.2f} {a.instance_spread:7.2%} "
                         f"{a.kernels_per_replay:7.0f} {a.busy_median_us:9.2f} {a.idle_median_us:8.2f} "
                         f"{_pct(a.observer_slowdown):>8}  {gaps}")
        for c in self.comparisons:
            lines.append("")
            lines.append(f"{c.current} / {c.baseline}: step time ratio {c.step_ratio:.4f} "
                         f"({c.confidence:.0%} CI {c.ci_low:.4f} .. {c.ci_high:.4f}, bootstrap over instances)")
            for s in c.streams:
                lines.append(f"  stream rank {s['rank']}: median gap {s['median_baseline_ns']:.0f} -> "
                             f"{s['median_current_ns']:.0f} ns ({s['shift_ns']:+.0f} ns, {s['rel_shift']:+.1%}; "
                             f"p_adj {s['p_adjusted']:.2g}) {s['verdict']}")
        return "\n".join(lines)


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:+.1%}"


# ---------------------------------------------------------------------- statistics
def _stream_stats(trace: Trace) -> tuple[list[StreamStats], dict]:
    """Per stream role: gaps of all instances pooled by rank (rank consensus per instance graph)."""
    rsg, gap_vals, gap_row = replay_stream_gaps_with_values(trace)
    role = np.full(len(rsg), -1, np.int64)
    for g in np.unique(rsg.graph):
        rows = np.flatnonzero(rsg.graph == g)
        for rank, s in enumerate(stream_order(rsg, rows)):
            role[rows[rsg.stream[rows] == s]] = rank
    out = []
    for r in np.unique(role[role >= 0]).tolist():
        meds = rsg.median_gap_ns[role == r]
        meds = meds[np.isfinite(meds)]
        g = gap_vals[role[gap_row] == r]
        out.append(StreamStats(rank=int(r), replays=int(len(meds)),
                               median_gap_ns=float(np.median(meds)) if len(meds) else math.nan,
                               p10_gap_ns=float(np.percentile(g, 10)) if len(g) else math.nan,
                               p90_gap_ns=float(np.percentile(g, 90)) if len(g) else math.nan, gaps=g))
    rep = analyze(trace).replays
    figures = {
        "replays": int(len(rep)),
        "kernels": float(np.median(rep.kernels)) if len(rep) else math.nan,
        "busy_us": float(np.median(rep.busy_ns)) / 1e3 if len(rep) else math.nan,
        "idle_us": float(np.median(rep.idle_ns)) / 1e3 if len(rep) else math.nan,
        "span_us": float(np.median(rep.span_ns)) / 1e3 if len(rep) else math.nan,
        "per_replay_medians": {int(r): rsg.median_gap_ns[role == r] for r in np.unique(role[role >= 0]).tolist()},
    }
    return out, figures


def summarize_arm(arm: ArmData) -> tuple[ArmSummary, dict]:
    inst = np.median(arm.step_us, axis=1)
    med = float(np.median(inst))
    traced = math.nan
    if arm.traced_step_us is not None and arm.traced_step_us.size:
        traced = float(np.median(np.median(arm.traced_step_us, axis=1)))
    if arm.trace is not None and len(arm.trace):
        streams, fig = _stream_stats(arm.trace)
    else:
        streams, fig = [], {"replays": 0, "kernels": math.nan, "busy_us": math.nan, "idle_us": math.nan,
                            "span_us": math.nan, "per_replay_medians": {}}
    s = ArmSummary(
        name=arm.name, instances=arm.instances, replays_timed=int(arm.step_us.size), step_median_us=med,
        instance_medians_us=[float(x) for x in inst], instance_spread=float((inst.max() - inst.min()) / med),
        traced_step_median_us=traced, observer_slowdown=traced / med - 1 if math.isfinite(traced) else math.nan,
        traced_replays=fig["replays"], kernels_per_replay=fig["kernels"], busy_median_us=fig["busy_us"],
        idle_median_us=fig["idle_us"], span_median_us=fig["span_us"], streams=streams,
    )
    return s, fig["per_replay_medians"]


def step_ratio_ci(base_inst: np.ndarray, cur_inst: np.ndarray, *, confidence: float = 0.95,
                  n_resamples: int = 5000, seed: int = 0) -> tuple[float, float, float]:
    """current/baseline ratio of mean per-instance step times, with a bootstrap CI over instances."""
    b, c = np.asarray(base_inst, np.float64), np.asarray(cur_inst, np.float64)
    ratio = float(c.mean() / b.mean())
    if min(len(b), len(c)) < 2:
        return ratio, math.nan, math.nan  # one instance per arm: no spread to resample

    def stat(x, y, axis=-1):
        return np.mean(x, axis=axis) / np.mean(y, axis=axis)

    lo, hi = bootstrap_ci(c, b, stat, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return ratio, lo, hi


def analyze_ab(arms: Sequence[ArmData], *, baseline: int = 0, confidence: float = 0.95, thresholds=None,
               seed: int = 0, meta: Mapping | None = None) -> ABResult:
    """Summaries per arm and each other arm compared with ``arms[baseline]``."""
    if len(arms) < 2:
        raise TraceError("an A/B needs at least two arms")
    if len({a.name for a in arms}) != len(arms):
        raise TraceError("arm names must be unique")
    th = thresholds or Thresholds()
    sums, meds = zip(*(summarize_arm(a) for a in arms))
    base = arms[baseline]
    comps = []
    for i, a in enumerate(arms):
        if i == baseline:
            continue
        ratio, lo, hi = step_ratio_ci(np.median(base.step_us, axis=1), np.median(a.step_us, axis=1),
                                      confidence=confidence, seed=seed)
        ranks = sorted(set(meds[baseline]) & set(meds[i]))
        tested = []
        for r in ranks:
            vb = meds[baseline][r][np.isfinite(meds[baseline][r])]
            vc = meds[i][r][np.isfinite(meds[i][r])]
            if min(len(vb), len(vc)) < th.min_replays:
                continue
            tested.append((r, shift_test(vb, vc, th)))
        rows = [{"rank": r, **t, "p_adjusted": p_adj, "verdict": v}
                for (r, t), (p_adj, v) in zip(tested, judge([t for _, t in tested], th))]
        comps.append(ArmComparison(baseline=base.name, current=a.name, step_ratio=ratio, ci_low=lo, ci_high=hi,
                                   confidence=confidence, streams=rows))
    m = dict(meta or {})
    m["_step_us"] = {a.name: a.step_us for a in arms}  # for the plot; not serialised
    return ABResult(arms=list(sums), comparisons=comps, meta=m)


def offset_correlation(trace: Trace, offset: int) -> Trace:
    """Correlation ids restart per profiler session: shift them so windows can be concatenated."""
    launches = dict(trace.launches)
    launches["correlation_id"] = launches["correlation_id"] + offset
    return Trace.build(start_ns=trace.start_ns, end_ns=trace.end_ns, stream=trace.stream,
                       correlation_id=trace.correlation_id + offset, device=trace.device, graph_id=trace.graph_id,
                       graph_node_id=trace.graph_node_id, name_id=trace.name_id, names=trace.names,
                       launches=launches, graphs=trace.graphs, labels=trace.labels, invalid=trace.invalid,
                       meta=trace.meta)


def split_arms(trace: Trace, names: Sequence[str]) -> dict[str, Trace]:
    """The kernels of each arm (graph labels "<arm>#<instance>") of a traced window."""
    labels = np.array([g.label.split(INSTANCE_SEP)[0] if INSTANCE_SEP in g.label else "" for g in trace.graphs] + [""])
    arm_of_kernel = labels[trace.graph]  # graph -1 -> "" (the appended slot)
    return {n: trace.select(arm_of_kernel == n) for n in names}
