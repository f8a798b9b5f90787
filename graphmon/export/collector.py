"""Prometheus collector over the latest :class:`~graphmon.export.snapshot.Snapshot`.

A scrape calls ``collect()``, which reads one snapshot reference and formats it: no CUPTI, no
analysis, no lock shared with the collecting threads. All times are exported in seconds.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from graphmon.export.snapshot import (
    GAP_BUCKETS_NS,
    GAP_QUANTILES,
    REPLAY_KINDS,
    REPLAY_QUANTILES,
    Hist,
    Snapshot,
)

NS = 1e-9
# The content type a plain scrape (no OpenMetrics Accept) is answered with: the key under which the
# pre-rendered text body is cached. Not CONTENT_TYPE_LATEST, whose version differs in 0.2x.
TEXT_CONTENT_TYPE = choose_encoder("")[1]
GRAPH_LABELS = ["rank", "device", "graph", "upload_mode"]
STREAM_LABELS = ["rank", "device", "graph", "stream", "upload_mode"]
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


def _q(q: float) -> str:
    return f"{q:g}"


def _add_summary(fam: Metric, name: str, labels: dict, quantiles, h: Hist) -> None:
    for q, v in quantiles:
        if v == v:  # NaN: no data
            fam.add_sample(name, {**labels, "quantile": _q(q)}, v * NS)
    fam.add_sample(name + "_count", labels, h.count)
    fam.add_sample(name + "_sum", labels, h.sum_ns * NS)


class SnapshotCollector:
    """A prometheus_client collector: yields metric families from the latest snapshot."""

    def __init__(self, get_snapshot: Callable[[], Snapshot]):
        self._get = get_snapshot

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: families depend on the data

    def collect(self) -> Iterable[Metric]:
        s = self._get()
        rank = s.rank
        yield from self._health(s)

        gh = HistogramMetricFamily(
            "graphmon_kernel_gap_seconds",
            "Gap between consecutive kernels of one graph replay on one stream (next start - previous end). "
            "Negative gaps (overlap) fall in the lowest bucket.",
            labels=STREAM_LABELS,
        )
        neg = CounterMetricFamily(
            "graphmon_kernel_gap_negative", "Negative gaps (kernels overlapping on one stream) seen.", labels=STREAM_LABELS
        )
        # A summary: exact quantiles of the last window (the way client_python summaries use a recent
        # window), with the cumulative count and sum. Plain gauges with a "quantile" label fail promtool.
        gq = Metric("graphmon_kernel_gap_quantile_seconds",
                    "Exact gap quantiles over the last window in which this series had replays; count/sum cumulative.",
                    "summary")
        for key in sorted(s.gap_hist):
            d, graph, stream, mode = key
            lv = [rank, d, graph, stream, mode]
            h = s.gap_hist[key]
            gh.add_metric(lv, _hist_buckets(h, GAP_BUCKETS_NS), h.sum_ns * NS)
            neg.add_metric(lv, s.gap_negative_total.get(key, 0))
            _add_summary(gq, "graphmon_kernel_gap_quantile_seconds", dict(zip(STREAM_LABELS, lv)),
                         zip(GAP_QUANTILES, s.gap_quantiles.get(key, ())), h)
        yield gh
        yield neg
        yield gq

        for kind, (name, doc) in REPLAY_METRICS.items():
            fam = HistogramMetricFamily(name, doc, labels=GRAPH_LABELS)
            for key in sorted(s.replay_hist):
                h = s.replay_hist[key].get(kind)
                if h is not None:
                    fam.add_metric([rank, *key], _hist_buckets(h, REPLAY_KINDS[kind][1]), h.sum_ns * NS)
            yield fam

        rq = Metric("graphmon_replay_quantile_seconds",
                    "Exact quantiles of replay GPU time (kind=gpu), busy or idle time over the last window; "
                    "count/sum cumulative.", "summary")
        kpr = GaugeMetricFamily("graphmon_kernels_per_replay", "Median kernels per replay in the last window.", labels=GRAPH_LABELS)
        rt = CounterMetricFamily("graphmon_replays_sampled", "Graph replays seen inside sampling windows.", labels=GRAPH_LABELS)
        for key in sorted(s.replays_total):
            lv = [rank, *key]
            rt.add_metric(lv, s.replays_total[key])
            if key in s.kernels_per_replay:
                kpr.add_metric(lv, s.kernels_per_replay[key])
            for kind, qs in s.replay_quantiles.get(key, {}).items():
                h = s.replay_hist.get(key, {}).get(kind)
                if h is not None:
                    _add_summary(rq, "graphmon_replay_quantile_seconds", {**dict(zip(GRAPH_LABELS, lv)), "kind": kind},
                                 zip(REPLAY_QUANTILES, qs), h)
        yield rq
        yield kpr
        yield rt

        gi = GaugeMetricFamily(
            "graphmon_graph_info",
            "One series per monitored graph: its key, label and upload mode.",
            labels=["rank", "device", "graph", "graph_key", "label", "upload_mode", "upload_stream_is_launch_stream"],
        )
        for (d, graph), g in sorted(s.graphs.items()):
            gi.add_metric([rank, d, graph, g.graph_key, g.label, g.upload_mode, g.upload_stream_is_launch_stream], 1)
        yield gi

    def _health(self, s: Snapshot) -> Iterable[Metric]:
        rank = s.rank
        up = GaugeMetricFamily("graphmon_up", "1 when the collector is collecting, 0 when it is blocked, stopped or failing.",
                               labels=["rank"])
        up.add_metric([rank], 1 if s.up else 0)
        yield up
        # state/reason say why graphmon_up is 0 (e.g. another CUPTI subscriber holds the process).
        info_labels = {"rank": rank, **{k: str(v) for k, v in s.backend_info.items()},
                       "state": s.health.state, "reason": s.health.reason[:200]}
        info = GaugeMetricFamily("graphmon_collector_info", "Collector backend and versions.", labels=list(info_labels))
        info.add_metric(list(info_labels.values()), 1)
        yield info
        for name, doc, value in (
            ("graphmon_windows", "Sampling windows ingested.", s.windows_total),
            ("graphmon_records", "Valid kernel records ingested.", s.records_total),
            ("graphmon_records_dropped", "Kernel records the source lost (e.g. CUPTI buffer overflow).", s.records_dropped_total),
            ("graphmon_series_folded", "Graphs or streams folded into graph/stream=\"other\" by the series cap.",
             s.series_folded_total),
        ):
            c = CounterMetricFamily(name, doc, labels=["rank"])
            c.add_metric([rank], value)
            yield c
        inv = CounterMetricFamily("graphmon_records_invalid", "Kernel records excluded as invalid, by reason.",
                                  labels=["rank", "reason"])
        for reason, v in sorted(s.records_invalid_total.items()):
            inv.add_metric([rank, reason], v)
        yield inv
        err = CounterMetricFamily("graphmon_collector_errors", "Errors contained inside graphmon, by stage.",
                                  labels=["rank", "stage"])
        for stage, v in sorted(s.errors_total.items()):
            err.add_metric([rank, stage], v)
        yield err
        if s.last_window_s is not None:
            g = GaugeMetricFamily("graphmon_last_window_timestamp_seconds", "Unix time the last window closed.", labels=["rank"])
            g.add_metric([rank], s.last_window_s)
            yield g
        if s.observer_slowdown is not None:
            g = GaugeMetricFamily(
                "graphmon_observer_slowdown_ratio",
                "Replay time while a sampling window is open divided by replay time outside windows.",
                labels=["rank"],
            )
            g.add_metric([rank], s.observer_slowdown)
            yield g


def make_registry(get_snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """graphmon's own registry (not the global default): only graphmon's families."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(get_snapshot))
    return reg


def _escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_text(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of graphmon's families, byte-identical to
    ``prometheus_client.generate_latest`` (tested), about 10x faster: graphmon's metric and label
    names are valid by construction, so only label values need escaping. A scrape renders 1,000
    series in a few ms, which keeps the GIL free for the host and the HTTP loop."""
    out: list[str] = []
    esc: dict[str, str] = {}
    for m in registry.collect():
        name, typ = m.name, m.type
        if typ == "counter":
            name += "_total"
        elif typ == "unknown":
            typ = "untyped"
        doc = m.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {typ}\n")
        for smp in m.samples:
            if smp.labels:
                parts = []
                for k, v in sorted(smp.labels.items()):
                    e = esc.get(v)
                    if e is None:
                        e = esc[v] = _escape_label_value(v)
                    parts.append(f'{k}="{e}"')
                out.append(f"{smp.name}{{{','.join(parts)}}} {floatToGoString(smp.value)}\n")
            else:
                out.append(f"{smp.name} {floatToGoString(smp.value)}\n")
    return "".join(out).encode("utf-8")
