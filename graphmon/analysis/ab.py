"""A/B of CUDA-graph variants on one workload (uploaded vs not, or two builds): timing + gaps.

Two halves:

- **Statistics and reporting (pure, CPU-tested)**: :class:`ArmData` holds what was measured for
  one arm; :func:`analyze_ab` turns arms into an :class:`ABResult` (table, JSON, PNG).
- **GPU runner** (:func:`run_ab`, torch imported lazily): builds several graph instances per
  arm, replays them interleaved, times every replay with CUDA events *outside* tracing windows,
  and records kernels inside a few short torch.profiler (Kineto) windows, read back with
  graphmon's Kineto reader. :func:`decode_like_arms` is the built-in decode-like workload
  (48 layers, 3 side streams, 960 kernels per replay) used by ``graphmon ab``.

Why several instances per arm: two captures of the same graph differ by up to ±1.5% in step
time on an H200 (shared/notes), as much as the effect being looked for. The unit of evidence for
step time is therefore the *instance* (its median replay time); the ratio's confidence interval
is a bootstrap over instances (scipy.stats.bootstrap, percentile), never over replays, which
would pretend that 250 replays of one instance are 250 independent captures.

Why windows: kernel tracing perturbs replays by 12-33% while on, so step time is measured only
with tracing off and gaps only inside windows; the ratio traced/untraced step time per arm is
reported as the observer slowdown.

Python API (see docs/upload-ab-report.md for a complete torch example)::

    from graphmon.analysis.ab import run_ab, analyze_ab
    arms = run_ab({"uploaded": build_uploaded, "lazy": build_lazy}, instances=8)
    result = analyze_ab(arms)           # the first arm is the baseline
    print(result.format_table()); result.plot("ab.png")

where each ``build_*()`` captures a fresh graph and returns a zero-argument callable that
replays it once (e.g. ``graph.replay``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from graphmon.formats.native import write_trace
from graphmon.model.trace import Trace, TraceError, concat

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
    streams: list[dict]  # graphmon.analysis.compare.shift_test per stream rank + verdict


@dataclass(frozen=True)
class ABResult:
    arms: list[ArmSummary]
    comparisons: list[ArmComparison]
    meta: dict

    def to_json(self) -> dict:
        def clean(v):
            if isinstance(v, float):
                return None if not math.isfinite(v) else v
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        arms = []
        for a in self.arms:
            d = {k: v for k, v in a.__dict__.items() if k != "streams"}
            d["streams"] = [{k: v for k, v in s.__dict__.items() if k != "gaps"} for s in a.streams]
            arms.append(d)
        return clean({"meta": self.meta, "arms": arms, "comparisons": [c.__dict__ for c in self.comparisons]})

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

    def plot(self, path: str | os.PathLike) -> None:
        """PNG: step time per arm (all replays, instance medians marked) and gap ECDFs per stream."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ranks = sorted({s.rank for a in self.arms for s in a.streams})
        npanels = 1 + max(1, len(ranks))
        ncols = min(3, npanels)
        nrows = -(-npanels // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows), squeeze=False)
        axes = axes.ravel()
        for extra in axes[npanels:]:
            extra.set_axis_off()
        ax = axes[0]
        steps = self.meta.get("_step_us", {})
        for i, a in enumerate(self.arms):
            vals = np.asarray(steps.get(a.name, []), dtype=np.float64)
            if vals.size:
                ax.boxplot(vals.ravel(), positions=[i], widths=0.5, showfliers=False)
            ax.scatter(np.full(len(a.instance_medians_us), i) + np.linspace(-0.15, 0.15, len(a.instance_medians_us)),
                       a.instance_medians_us, s=14, zorder=3, label="instance medians" if i == 0 else None)
        ax.set_xticks(range(len(self.arms)), [a.name for a in self.arms])
        ax.set_ylabel("GPU time per replay (µs, CUDA events, no tracing)")
        ax.set_title("step time per arm")
        ax.legend(loc="best", fontsize=8)
        for j, r in enumerate(ranks):
            ax = axes[1 + j]
            for a in self.arms:
                s = next((s for s in a.streams if s.rank == r), None)
                if s is None or not len(s.gaps):
                    continue
                v = np.sort(s.gaps)
                # log x: most gaps are ~0.2-1 µs, the rest are waits on other streams (~10-25 µs)
                ax.step(np.maximum(v, 1), np.arange(1, len(v) + 1) / len(v), where="post",
                        label=f"{a.name} (median {s.median_gap_ns:.0f})")
            ax.set_xscale("log")
            ax.set_xlabel("gap between consecutive kernels (ns, log; <= 0 drawn at 1)")
            ax.set_ylabel("fraction of gaps")
            ax.set_title(f"stream rank {r} (traced windows)")
            ax.legend(loc="lower right", fontsize=8)
        if not ranks:
            axes[1].set_axis_off()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:+.1%}"


# ---------------------------------------------------------------------- statistics
def _stream_stats(trace: Trace) -> tuple[list[StreamStats], dict]:
    """Per stream role: gaps of all instances pooled by rank (rank consensus per instance graph)."""
    from graphmon.analysis.replays import analyze
    from graphmon.analysis.compare import _stream_order, replay_stream_gaps_with_values

    rsg, gap_vals, gap_row = replay_stream_gaps_with_values(trace)
    role = np.full(len(rsg), -1, np.int64)
    for g in np.unique(rsg.graph):
        rows = np.flatnonzero(rsg.graph == g)
        for rank, s in enumerate(_stream_order(rsg, rows)):
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
    from scipy import stats

    b, c = np.asarray(base_inst, np.float64), np.asarray(cur_inst, np.float64)
    ratio = float(c.mean() / b.mean())
    if min(len(b), len(c)) < 2:
        return ratio, math.nan, math.nan  # one instance per arm: no spread to resample

    def stat(x, y, axis=-1):
        return np.mean(x, axis=axis) / np.mean(y, axis=axis)

    res = stats.bootstrap((c, b), stat, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return ratio, float(res.confidence_interval.low), float(res.confidence_interval.high)


def analyze_ab(arms: Sequence[ArmData], *, baseline: int = 0, confidence: float = 0.95, thresholds=None,
               seed: int = 0, meta: Mapping | None = None) -> ABResult:
    """Summaries per arm and each other arm compared with ``arms[baseline]``."""
    from graphmon.analysis.compare import Thresholds, shift_test, verdict

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
        rows = []
        ranks = sorted(set(meds[baseline]) & set(meds[i]))
        tested = []
        for r in ranks:
            vb = meds[baseline][r][np.isfinite(meds[baseline][r])]
            vc = meds[i][r][np.isfinite(meds[i][r])]
            if min(len(vb), len(vc)) < th.min_replays:
                continue
            tested.append((r, shift_test(vb, vc, th)))
        for r, t in tested:
            p_adj = min(1.0, t["p_value"] * len(tested))
            rows.append({"rank": r, **t, "p_adjusted": p_adj,
                         "verdict": verdict(t["shift_ns"], t["rel_shift"], p_adj, th)})
        comps.append(ArmComparison(baseline=base.name, current=a.name, step_ratio=ratio, ci_low=lo, ci_high=hi,
                                   confidence=confidence, streams=rows))
    m = dict(meta or {})
    m["_step_us"] = {a.name: a.step_us for a in arms}  # for the plot; not serialised
    return ABResult(arms=list(sums), comparisons=comps, meta=m)


def result_json(result: ABResult) -> dict:
    d = result.to_json()
    d["meta"] = {k: v for k, v in d["meta"].items() if not k.startswith("_")}
    return d


# ---------------------------------------------------------------------- raw data on disk
def save_raw(arms: Sequence[ArmData], directory: str | os.PathLike, meta: Mapping | None = None) -> None:
    """Step times (npz), one native trace per arm and meta (JSON): enough to redo the report on a CPU."""
    os.makedirs(directory, exist_ok=True)
    arrays = {}
    for a in arms:
        arrays[f"step_us__{a.name}"] = a.step_us
        if a.traced_step_us is not None:
            arrays[f"traced_step_us__{a.name}"] = a.traced_step_us
        if a.trace is not None:
            write_trace(a.trace, os.path.join(directory, f"trace-{a.name}.graphmon.npz"))
    np.savez_compressed(os.path.join(directory, "ab-raw.npz"), **arrays)
    with open(os.path.join(directory, "ab-meta.json"), "w") as fh:
        json.dump({"arms": [a.name for a in arms], **dict(meta or {})}, fh, indent=2, default=str)


def load_raw(directory: str | os.PathLike) -> tuple[list[ArmData], dict]:
    from graphmon.formats.read import read_trace

    try:
        with open(os.path.join(directory, "ab-meta.json")) as fh:
            meta = json.load(fh)
        raw = np.load(os.path.join(directory, "ab-raw.npz"))
    except (OSError, ValueError) as e:
        raise TraceError(f"{directory}: not an A/B raw-data folder ({e})") from None
    arms = []
    for name in meta["arms"]:
        tp = os.path.join(directory, f"trace-{name}.graphmon.npz")
        arms.append(ArmData(
            name=name, step_us=raw[f"step_us__{name}"],
            traced_step_us=raw[f"traced_step_us__{name}"] if f"traced_step_us__{name}" in raw else None,
            trace=read_trace(tp, progress=False) if os.path.exists(tp) else None,
        ))
    return arms, meta


# ---------------------------------------------------------------------- GPU runner
def _offset_correlation(trace: Trace, offset: int) -> Trace:
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


def run_ab(arms: Mapping[str, Callable[[], Callable[[], object]]], *, instances: int = 8, rounds: int = 12,
           replays_per_block: int = 20, windows: int = 3, window_replays: int = 3, warmup: int = 5, seed: int = 0,
           progress: Callable[[str], None] | None = None) -> list[ArmData]:
    """Measure arms on the current CUDA device (torch imported here).

    ``arms`` maps a name to a factory; each call of a factory captures one fresh graph instance
    and returns a callable replaying it once. Per round, every (arm, instance) runs a block of
    ``replays_per_block`` replays in a shuffled order (seeded), each replay timed by CUDA events;
    ``windows`` of those rounds (spread evenly) are followed by a torch.profiler window of
    ``window_replays`` replays per instance, also event-timed (observer slowdown).
    """
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from graphmon.formats.read import read_trace

    say = progress or (lambda s: None)
    names = list(arms)
    if any(INSTANCE_SEP in n for n in names):
        raise TraceError(f"arm names may not contain {INSTANCE_SEP!r}")
    rng = np.random.default_rng(seed)
    reps = {}
    for n in names:
        reps[n] = [arms[n]() for _ in range(instances)]
    torch.cuda.synchronize()
    for n in names:
        for r in reps[n]:
            for _ in range(warmup):
                r()
    torch.cuda.synchronize()
    say(f"built {instances} instances of {len(names)} arms")
    order = [(n, i) for n in names for i in range(instances)]
    step = {n: [[] for _ in range(instances)] for n in names}
    traced = {n: [[] for _ in range(instances)] for n in names}
    window_after = set(np.linspace(0, rounds - 1, windows).round().astype(int).tolist()) if windows else set()
    parts = {n: [] for n in names}
    corr_offset = 0

    def block(replay, count):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        ev[0].record()
        for k in range(count):
            replay()
            ev[k + 1].record()
        return ev

    for rd in range(rounds):
        pending = []
        for j in rng.permutation(len(order)):
            n, i = order[j]
            pending.append((n, i, block(reps[n][i], replays_per_block)))
        torch.cuda.synchronize()
        for n, i, ev in pending:
            step[n][i].extend(ev[k].elapsed_time(ev[k + 1]) * 1e3 for k in range(len(ev) - 1))
        if rd in window_after:
            pending = []
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for j in rng.permutation(len(order)):
                    n, i = order[j]
                    with record_function(f"{n}{INSTANCE_SEP}{i}"):
                        pending.append((n, i, block(reps[n][i], window_replays)))
                torch.cuda.synchronize()
            for n, i, ev in pending:
                traced[n][i].extend(ev[k].elapsed_time(ev[k + 1]) * 1e3 for k in range(len(ev) - 1))
            with tempfile.TemporaryDirectory() as td:
                path = os.path.join(td, "window.json")
                prof.export_chrome_trace(path)
                t = read_trace(path, progress=False)
            # Kineto keys graphs by a signature that includes the label's index in that window, so the
            # same key can name different instances in two windows: key by label instead.
            t = t.with_graphs([replace(g, key=g.label or g.key) for g in t.graphs])
            t = _offset_correlation(t, corr_offset)
            corr_offset = int(t.correlation_id.max()) + 1 if len(t) else corr_offset
            for n, tt in split_arms(t, names).items():
                parts[n].append(tt)
            say(f"round {rd + 1}/{rounds}: window with {len(t)} kernels")
    out = []
    for n in names:
        tr = concat(parts[n]) if parts[n] else None
        out.append(ArmData(name=n, step_us=np.array(step[n]),
                           traced_step_us=np.array(traced[n]) if windows else None, trace=tr))
    return out


def decode_like_arms(*, hidden: int = 1024, layers: int = 48, side_streams: int = 3, batch: int = 1, seed: int = 1):
    """The decode-like workload of shared/probes (960 kernels on 4 streams at the defaults), in two
    arms: "uploaded" (cuGraphUpload right after capture, then synchronize) and "lazy" (not
    uploaded: the driver uploads on first launch). Returns {name: factory}."""
    import ctypes

    import torch

    dev = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    W = [torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16, generator=gen) / 32 for _ in range(layers)]
    E = [[torch.randn(hidden, hidden // 4, device=dev, dtype=torch.bfloat16, generator=gen) / 32
          for _ in range(side_streams)] for _ in range(layers)]
    side = [torch.cuda.Stream() for _ in range(side_streams)]
    libcuda = ctypes.CDLL("libcuda.so.1")

    def step(x):
        main = torch.cuda.current_stream()
        for i in range(layers):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            outs = []
            for j, s in enumerate(side):
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    outs.append(torch.relu(h @ E[i][j]) * (0.5 / (j + 1)))
            for s in side:
                main.wait_stream(s)
            y = h @ W[i]
            for a in outs:
                y[:, : hidden // 4] += a
            x = x + y * 0.1
        return x

    def capture(upload: bool):
        x = torch.randn(batch, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step(x.clone())
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(x)
        if upload:
            rc = libcuda.cuGraphUpload(ctypes.c_void_p(int(g.raw_cuda_graph_exec())),
                                       ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            if rc != 0:
                raise RuntimeError(f"cuGraphUpload failed: CUresult {rc}")
        keep = (g, x)  # the graph reads x: keep it alive with the graph
        return lambda: keep[0].replay()

    return {"uploaded": lambda: capture(True), "lazy": lambda: capture(False)}


def environment() -> dict:
    """Versions of what ran (for the report)."""
    import platform

    env = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            try:
                import subprocess

                env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=20).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                pass
    except ImportError:
        pass
    try:
        import scipy

        env["scipy"] = scipy.__version__
    except ImportError:
        pass
    from graphmon import __version__

    env["graphmon"] = __version__
    return env
