"""The Prometheus collector: metric families from the latest snapshots (one per attached process).

A scrape calls ``collect()``, which reads the snapshot references and formats them: no CUPTI, no
analysis, no lock shared with the collecting threads. Each family is yielded once, with samples
from every snapshot. All times are exported in seconds.
"""

from __future__ import annotations

import math
import os
import sys
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Optional, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from graphmon.version import __version__
from graphmon.export.buckets import GAP_BUCKETS_NS, GAP_QUANTILES, REPLAY_KINDS, REPLAY_QUANTILES
from graphmon.export.guard import base_names
from graphmon.export.identity import label_by_rank, workload_labels
from graphmon.export.snapshot import Hist, Snapshot

try:
    from graphmon.model.invalid import INVALID_REASONS
except ImportError:  # before the InvalidReason enum lands: the same values
    INVALID_REASONS = ("missing_field", "non_numeric", "non_integer", "out_of_range", "bad_phase", "bad_name",
                       "zero_start", "end_before_start", "duplicate", "negative_timestamp",
                       "launched_outside_window", "partial_replay", "no_correlation", "overfull_replay",
                       "incomplete_record")

NS = 1e-9
# Every stage graphmon counts contained errors in: each has a 0 sample from the start so that
# increase() sees the first error and dashboards show 0, not "No data".
KNOWN_STAGES = (
    "analysis", "snapshot", "publish", "health", "source", "sink", "stop", "http", "scrape", "collector",
    "callback", "buffer_completed", "buffers_full", "flush", "setup", "unsubscribe", "activity_disable",
    "launch_cb_enable", "drain_query", "drain_timeout", "dropped_query", "event_elapsed", "events_init",
    "stop_timeout", "stream_id", "tap",
)
STATES = ("starting", "running", "degraded", "blocked", "stopped", "error")
VALUE_KINDS = ("gap", *REPLAY_KINDS, "negative_launch_latency")
GRAPH_LABELS = ["rank", "device", "graph", "upload_mode"]
STREAM_LABELS = ["rank", "device", "graph", "stream", "upload_mode"]
CARDINALITIES = ("full", "low")
REPLAY_METRICS = {
    "gpu": ("graphmon_replay_gpu_seconds", "GPU time of one graph replay: first kernel start to last kernel end."),
    "busy": ("graphmon_replay_busy_seconds", "Union of kernel execution intervals of one replay across streams."),
    "idle": ("graphmon_replay_idle_seconds", "Replay GPU time minus busy time: time no kernel of the replay ran."),
    "launch_latency": ("graphmon_launch_latency_seconds", "CPU graph launch call to the replay's first kernel start."),
    "inter_replay_gap": ("graphmon_inter_replay_gap_seconds",
                         "Previous replay's last kernel end to this replay's first kernel start on the launch stream."),
}


def _fmt_le(ns: float) -> str:
    # ns / 1e9 (not ns * 1e-9) and %g keep bucket bounds readable: 9.6e-08, not 9.600000000000001e-08.
    return f"{ns / 1e9:.12g}" if ns != float("inf") else "+Inf"


def _hist_buckets(h: Hist, bounds_ns) -> list[tuple[str, float]]:
    out, acc = [], 0
    for b, c in zip(list(bounds_ns) + [float("inf")], h.counts):
        acc += c
        out.append((_fmt_le(b), acc))
    return out


def _add_summary(fam: Metric, labels: dict, quantiles, h: Hist) -> None:
    name = fam.name
    for q, v in quantiles:
        if v >= 0:  # NaN: no data; never a negative quantile (OpenMetrics parsers refuse the scrape)
            fam.add_sample(name, {**labels, "quantile": f"{q:g}"}, v * NS)
    fam.add_sample(name + "_count", labels, h.count)
    fam.add_sample(name + "_sum", labels, h.sum_ns * NS)


PATH_KEYS = ("source", "path", "trace", "file")  # backend_info values that name a file


def _no_path(key: str, value) -> str:
    """No filesystem path on unauthenticated /metrics: a replayed trace is its base name (relative
    paths too); absolute paths inside other values are shortened the way /status shortens them."""
    text = str(value)
    if key in PATH_KEYS and ("/" in text or "\\" in text):
        return os.path.basename(text.replace("\\", "/").rstrip("/")) or text
    return base_names(text)


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return ""


@lru_cache(maxsize=1)
def _static_build() -> dict[str, str]:
    # Versions from package metadata: importing torch or an engine just to read a version would
    # cost seconds and memory in a process that did not import it.
    engine, engine_version = "", ""
    for name, dist in (("vllm", "vllm"), ("sglang", "sglang"), ("tensorrt_llm", "tensorrt-llm")):
        if name in sys.modules:
            engine, engine_version = name, _dist_version(dist)
            break
    return {"graphmon_version": __version__, "torch_version": _dist_version("torch"),
            "engine": engine, "engine_version": engine_version}


def build_info(backend: Mapping[str, str]) -> dict[str, str]:
    """graphmon_build_info labels; unknown values are ""."""
    out = dict(_static_build())
    out["cuda_driver_version"] = str(backend.get("cuda_driver_version", backend.get("driver_version", "")))
    out["cuda_runtime_version"] = str(backend.get("cuda_runtime_version", ""))
    out["cupti_version"] = str(backend.get("cupti_version", backend.get("libcupti_version", "")))
    return out


class SnapshotCollector:
    """A prometheus_client collector (the one-method ``collect`` protocol).

    ``health_only``: only the health families (up, state, info, counters), for a fallback when a
    full render fails or for a deployment that wants no per-graph series. ``cardinality="low"``:
    no histogram buckets (quantile summaries and counters stay), see docs/reliability.md.
    ``extra_errors``: contained errors counted outside the snapshots (the HTTP layer), added to
    the first snapshot's rank.
    """

    def __init__(self, get_snapshots: Callable[[], Sequence[Snapshot]], *, health_only: bool = False,
                 cardinality: str = "full", extra_errors: Optional[Callable[[], Mapping[str, int]]] = None):
        if cardinality not in CARDINALITIES:
            raise ValueError(f"cardinality must be one of {CARDINALITIES}")
        self._get = get_snapshots
        self.health_only, self.cardinality = health_only, cardinality
        self._extra_errors = extra_errors

    def collect(self) -> Iterable[Metric]:
        snaps = tuple(self._get())
        # the engine's workload identity (namespace, pod, container, workload, build) on every series of its rank
        by_rank = {s.rank: labels for s in snaps if (labels := workload_labels(s.process))}
        yield from label_by_rank(self._health(snaps), by_rank)
        if not self.health_only:
            yield from label_by_rank(self._graphs(snaps), by_rank)

    # ------------------------------------------------------------------ per graph
    def _graphs(self, snaps: Sequence[Snapshot]) -> Iterable[Metric]:
        full = self.cardinality == "full"
        gh = HistogramMetricFamily(
            "graphmon_kernel_gap_seconds",
            "Gap between consecutive kernels of one graph replay on one stream (next start - previous end). "
            "Overlaps (negative gaps) are not in the histogram: see graphmon_kernel_gap_negative_total.",
            labels=STREAM_LABELS)
        neg = CounterMetricFamily("graphmon_kernel_gap_negative",
                                  "Negative gaps (kernels overlapping on one stream) seen.", labels=STREAM_LABELS)
        # A summary: exact quantiles of the last window (the way client_python summaries use a recent
        # window), with the cumulative count and sum. Plain gauges with a "quantile" label fail promtool.
        gq = Metric("graphmon_kernel_gap_quantile_seconds",
                    "Exact gap quantiles over the last window in which this series had replays; count/sum cumulative "
                    "(non-negative gaps).", "summary")
        rh = {kind: HistogramMetricFamily(name, doc, labels=GRAPH_LABELS) for kind, (name, doc) in REPLAY_METRICS.items()}
        rq = Metric("graphmon_replay_quantile_seconds",
                    "Exact quantiles of replay GPU time (kind=gpu), busy or idle time over the last window; "
                    "count/sum cumulative.", "summary")
        kpr = GaugeMetricFamily("graphmon_kernels_per_replay", "Median kernels per replay in the last window.",
                                labels=GRAPH_LABELS)
        rt = CounterMetricFamily("graphmon_replays_sampled", "Graph replays seen inside sampling windows.",
                                 labels=GRAPH_LABELS)
        last = GaugeMetricFamily("graphmon_graph_last_sampled_timestamp_seconds",
                                 "Unix time of the last window that sampled this graph (series not sampled for "
                                 "--stale-after-s are dropped).", labels=GRAPH_LABELS)
        gi = GaugeMetricFamily(
            "graphmon_graph_info", "One series per monitored graph: its key, label, upload mode, batch size and "
            "structural signature (kernels, streams, other nodes, kernel-name hash: a changed graph under the same name).",
            labels=["rank", "device", "graph", "graph_key", "label", "upload_mode", "upload_stream_is_launch_stream",
                    "batch_size", "signature"])
        for s in snaps:
            rank = s.rank
            for key in sorted(s.gap_hist):
                lv = [rank, *key]
                h = s.gap_hist[key]
                if full:
                    gh.add_metric(lv, _hist_buckets(h, GAP_BUCKETS_NS), h.sum_ns * NS)
                neg.add_metric(lv, s.gap_negative_total.get(key, 0))
                _add_summary(gq, dict(zip(STREAM_LABELS, lv)), zip(GAP_QUANTILES, s.gap_quantiles.get(key, ())), h)
            for kind, fam in rh.items():
                if not full:
                    break
                for key in sorted(s.replay_hist):
                    h = s.replay_hist[key].get(kind)
                    if h is not None:
                        fam.add_metric([rank, *key], _hist_buckets(h, REPLAY_KINDS[kind][1]), h.sum_ns * NS)
            for key in sorted(s.replays_total):
                lv = [rank, *key]
                rt.add_metric(lv, s.replays_total[key])
                if key in s.kernels_per_replay:
                    kpr.add_metric(lv, s.kernels_per_replay[key])
                if key in s.graph_last_sampled_s:
                    last.add_metric(lv, s.graph_last_sampled_s[key])
                for kind, qs in s.replay_quantiles.get(key, {}).items():
                    h = s.replay_hist.get(key, {}).get(kind)
                    if h is not None:
                        _add_summary(rq, {**dict(zip(GRAPH_LABELS, lv)), "kind": kind}, zip(REPLAY_QUANTILES, qs), h)
            for (d, graph), g in sorted(s.graphs.items()):
                gi.add_metric([rank, d, graph, g.graph_key, g.label, g.upload_mode, g.upload_stream_is_launch_stream,
                               g.batch_size, g.signature], 1)
        if full:
            yield gh
        yield neg
        yield gq
        if full:
            yield from rh.values()
        yield rq
        yield kpr
        yield rt
        yield last
        yield gi

    # ------------------------------------------------------------------ health
    def _health(self, snaps: Sequence[Snapshot]) -> Iterable[Metric]:
        up = GaugeMetricFamily("graphmon_up", "1 while data flows (state running); 0 when blocked, stopped or failing.",
                               labels=["rank"])
        state = GaugeMetricFamily(
            "graphmon_collector_state",
            "1 for the collector's current state. blocked = another CUPTI subscriber (a profiler) holds CUPTI: "
            "a warning, not a failure; error/stopped = failing.", labels=["rank", "state"])
        info_fams = []
        counters = {
            "windows": ("graphmon_windows", "Sampling windows ingested.", lambda s: s.windows_total),
            "records": ("graphmon_records", "Valid kernel records ingested.", lambda s: s.records_total),
            "dropped": ("graphmon_records_dropped", "Kernel records the source lost (e.g. CUPTI buffer overflow).",
                        lambda s: s.records_dropped_total),
            "folded": ("graphmon_series_folded",
                       "Devices, graphs or streams folded into \"other\" by the series caps.",
                       lambda s: s.series_folded_total),
            "truncated": ("graphmon_label_values_truncated",
                          "Label values cut to --max-label-length (a hash suffix keeps them distinct).",
                          lambda s: s.label_values_truncated_total),
            "traced": ("graphmon_kernel_tracing_seconds",
                       "Time CUPTI kernel tracing was on (sampling windows). rate() is the share of time the GPU "
                       "ran observed, slower by observer_slowdown; max_traced_share bounds it.",
                       lambda s: s.kernel_tracing_s_total),
        }
        cfams = {k: CounterMetricFamily(n, d, labels=["rank"]) for k, (n, d, _) in counters.items()}
        inv = CounterMetricFamily("graphmon_records_invalid", "Kernel records excluded as invalid, by reason.",
                                  labels=["rank", "reason"])
        err = CounterMetricFamily("graphmon_collector_errors", "Errors contained inside graphmon, by stage.",
                                  labels=["rank", "stage"])
        oor = CounterMetricFamily("graphmon_values_out_of_range",
                                  "Values left out of a histogram: negative, or beyond 1,000 s (not a GPU time).",
                                  labels=["rank", "kind"])
        lw = GaugeMetricFamily("graphmon_last_window_timestamp_seconds", "Unix time the last window closed.",
                               labels=["rank"])
        started = GaugeMetricFamily("graphmon_process_start_time_seconds",
                                    "Unix time the rank's process started (its hello; the fleet rules take the newest "
                                    "build of a workload by it).", labels=["rank"])
        slow = GaugeMetricFamily("graphmon_observer_slowdown_ratio",
                                 "Replay time while a sampling window is open divided by replay time outside windows.",
                                 labels=["rank"])
        bi_labels = ["graphmon_version", "torch_version", "cuda_driver_version", "cuda_runtime_version",
                     "cupti_version", "engine", "engine_version"]
        bi = GaugeMetricFamily("graphmon_build_info", "Versions of graphmon and what it runs with (\"\" = unknown).",
                               labels=bi_labels)
        di = GaugeMetricFamily("graphmon_device_info",
                               "One series per device with series; UUID joins with dcgm-exporter (on(UUID)).",
                               labels=["rank", "device", "UUID", "pci_bus_id", "gpu_name", "host"])
        extra = dict(self._extra_errors()) if self._extra_errors is not None else {}
        builds = set()
        for n, s in enumerate(snaps):
            rank = s.rank
            up.add_metric([rank], 1 if s.up else 0)
            cur = s.health.state if s.health.state in STATES else "error"
            for st in STATES:
                state.add_metric([rank, st], 1 if st == cur else 0)
            # state/reason say why graphmon_up is 0 (e.g. another CUPTI subscriber holds the process).
            il = {"rank": rank, **{k: _no_path(k, v) for k, v in s.backend_info.items()},
                  "state": s.health.state, "reason": base_names(s.health.reason[:200])}
            info = GaugeMetricFamily("graphmon_collector_info", "Collector backend and versions.", labels=list(il))
            info.add_metric(list(il.values()), 1)
            info_fams.append(info)
            for k, (_, _, get) in counters.items():
                cfams[k].add_metric([rank], get(s))
            reasons = dict.fromkeys(INVALID_REASONS, 0)
            reasons.update(s.records_invalid_total)
            for reason, v in sorted(reasons.items()):
                inv.add_metric([rank, reason], v)
            stages = dict.fromkeys(KNOWN_STAGES, 0)
            stages.update(s.errors_total)
            if n == 0:
                for stage, v in extra.items():
                    stages[stage] = stages.get(stage, 0) + v
            for stage, v in sorted(stages.items()):
                err.add_metric([rank, stage], v)
            kinds = dict.fromkeys(VALUE_KINDS, 0)
            kinds.update(s.values_out_of_range_total)
            for kind, v in sorted(kinds.items()):
                oor.add_metric([rank, kind], v)
            if s.last_window_s is not None:
                lw.add_metric([rank], s.last_window_s)
            if s.observer_slowdown is not None:
                slow.add_metric([rank], s.observer_slowdown)
            t0 = _float(s.process.get("process_start_s", ""))
            if t0 is not None:
                started.add_metric([rank], t0)
            b = build_info(s.backend_info)
            builds.add(tuple(b[k] for k in bi_labels))
            p = s.process
            for d in s.devices:
                mine = p.get("device", "") == d
                di.add_metric([rank, d, p.get("uuid", "") if mine else "", p.get("pci_bus_id", "") if mine else "",
                               p.get("gpu_name", "") if mine else "", p.get("host", "")], 1)
        for b in sorted(builds):
            bi.add_metric(list(b), 1)
        yield up
        yield state
        if len(info_fams) == 1:
            yield info_fams[0]
        else:  # label sets differ per backend: merge into one family with the union of label names
            yield from _merge_info(info_fams)
        yield from cfams.values()
        yield inv
        yield err
        yield oor
        yield bi
        yield di
        if lw.samples:
            yield lw
        if slow.samples:
            yield slow
        if started.samples:
            yield started


def _float(v: str) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def _merge_info(fams: list[GaugeMetricFamily]) -> Iterable[Metric]:
    if not fams:
        return
    merged = GaugeMetricFamily(fams[0].name, fams[0].documentation)
    names = sorted({k for f in fams for smp in f.samples for k in smp.labels})
    for f in fams:
        for smp in f.samples:
            merged.add_sample(f.name, {k: smp.labels.get(k, "") for k in names}, smp.value)
    yield merged


class HealthCollector:
    """The health families only: up, state, info and the counters (no per-graph series). A public
    option for deployments that want no per-graph series, and the /metrics fallback when a full
    render fails (its own class, so a fault in the full collector cannot take it down too)."""

    def __init__(self, get_snapshots: Callable[[], Sequence[Snapshot]], **kw):
        self._c = SnapshotCollector(get_snapshots, **{**kw, "health_only": True})

    def collect(self) -> Iterable[Metric]:
        return SnapshotCollector._health(self._c, tuple(self._c._get()))


def make_registry(get_snapshots: Callable[[], Sequence[Snapshot]], *, health_only: bool = False,
                  extra: Sequence = (), **kw) -> CollectorRegistry:
    """graphmon's own registry (not the global default): only graphmon's families, plus ``extra``
    collectors (the agent's process-health families)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HealthCollector(get_snapshots, **kw) if health_only else SnapshotCollector(get_snapshots, **kw))
    for c in extra:
        reg.register(c)
    return reg

