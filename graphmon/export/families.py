"""Which series one rank's snapshot exports at each cardinality level, as plain tuples.

Levels (``--cardinality``; counts per rank in docs/reliability.md, "Series and cardinality"):

- ``standard`` (default): the health families, and per-graph families only for the rank's
  *detail* graphs (``--detail-graphs``: the ones with the most GPU time sampled, chosen by the
  aggregator with hysteresis, graphmon.export.detail): the gap histogram per stream, the replay gpu/idle
  histograms and the untraced replay-time histogram with coarser buckets (buckets.py), the quantiles the dashboards and alerts read (no summary ``_count`` and
  ``_sum``: the histograms have them), counters and info. Other graphs are counted in
  ``graphmon_graphs{detail="false"}``; their figures stay in /status, /graphs and /trace.
- ``full``: every graph (up to --max-graphs), every histogram at full resolution, every quantile.
- ``low``: what ``standard`` exports without histograms (summaries keep ``_count`` and ``_sum``; no
  untraced replay time: it is a histogram only).

One :class:`Fam` per family; :func:`rank_series` gives, per family, the series of one snapshot:
``(label values, value)`` for gauges and counters, ``(label values, le strings, cumulative
counts, sum)`` for histograms, ``(label values, [(quantile, value)], count, sum)`` for
summaries (count and sum None when left out). Label values follow ``Fam.labels``, after the
rank's constant labels (``rank`` and the engine's workload labels: :func:`rank_labels`), so a
constant label is one change there. graphmon.export.textwriter writes them as exposition text, collector.py as
prometheus_client families (tested to be the same bytes).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional

from graphmon.export.buckets import (
    GAP_BUCKETS_NS, GAP_BUCKETS_STANDARD_NS, GAP_QUANTILES, IDLE_BUCKETS_STANDARD_NS, REPLAY_BUCKETS_STANDARD_NS,
    REPLAY_KINDS, REPLAY_QUANTILES, UNTRACED_BUCKETS_NS, UNTRACED_BUCKETS_STANDARD_NS,
)
from graphmon.export.guard import base_names
from graphmon.export.identity import workload_labels
from graphmon.export.snapshot import Snapshot
from graphmon.version import __version__

try:
    from graphmon.model.invalid import INVALID_REASONS
except ImportError:  # before the InvalidReason enum lands: the same values
    INVALID_REASONS = ("missing_field", "non_numeric", "non_integer", "out_of_range", "bad_phase", "bad_name",
                       "zero_start", "end_before_start", "duplicate", "negative_timestamp",
                       "launched_outside_window", "partial_replay", "no_correlation", "overfull_replay")

NS = 1e-9
LEVELS = ("low", "standard", "full")
DEFAULT_LEVEL = "standard"
# Every stage graphmon counts contained errors in: each has a 0 sample from the start so that
# increase() sees the first error and dashboards show 0, not "No data".
KNOWN_STAGES = (
    "analysis", "snapshot", "publish", "health", "source", "sink", "stop", "http", "scrape", "collector",
    "callback", "buffer_completed", "buffers_full", "flush", "setup", "unsubscribe", "activity_disable",
    "launch_cb_enable", "drain_query", "drain_timeout", "dropped_query", "event_elapsed", "events_init",
    "stop_timeout", "stream_id", "tap",
)
STATES = ("starting", "running", "degraded", "blocked", "stopped", "error")
VALUE_KINDS = ("gap", *REPLAY_KINDS, "negative_launch_latency", "untraced")
BUILD_LABELS = ("graphmon_version", "torch_version", "cuda_driver_version", "cuda_runtime_version", "cupti_version",
                "engine", "engine_version")
PATH_KEYS = ("source", "path", "trace", "file")  # backend_info values that name a file


@dataclass(frozen=True)
class Fam:
    name: str  # a counter's without "_total"
    type: str  # counter | gauge | histogram | summary
    help: str
    labels: Optional[tuple[str, ...]]  # after the rank's constant labels; None: (name, value) pairs per series
    per_rank: bool = True  # False: no constant labels (one series per build, whoever exports it)


def _f(name, typ, doc, *labels, per_rank=True):
    return Fam(name, typ, doc, labels, per_rank)


GRAPH = ("device", "graph", "upload_mode")
STREAM = ("device", "graph", "stream", "upload_mode")
UP = _f("graphmon_up", "gauge", "1 while data flows (state running); 0 when blocked, stopped or failing.")
STATE = _f("graphmon_collector_state", "gauge", "1 for the collector's current state. blocked = another CUPTI "
           "subscriber (a profiler) holds CUPTI: a warning, not a failure; error/stopped = failing.", "state")
INFO = Fam("graphmon_collector_info", "gauge", "Collector backend and versions.", None)
COUNTERS = (  # (family, snapshot field)
    (_f("graphmon_windows", "counter", "Sampling windows ingested."), "windows_total"),
    (_f("graphmon_records", "counter", "Valid kernel records ingested."), "records_total"),
    (_f("graphmon_records_dropped", "counter", "Kernel records the source lost (e.g. CUPTI buffer overflow)."),
     "records_dropped_total"),
    (_f("graphmon_series_folded", "counter", "Devices, graphs or streams folded into \"other\" by the series caps."),
     "series_folded_total"),
    (_f("graphmon_label_values_truncated", "counter",
        "Label values cut to --max-label-length (a hash suffix keeps them distinct)."), "label_values_truncated_total"),
    (_f("graphmon_kernel_tracing_seconds", "counter", "Time CUPTI kernel tracing was on (sampling windows). rate() is "
        "the share of time the GPU ran observed, slower by observer_slowdown; max_traced_share bounds it."),
     "kernel_tracing_s_total"),
)
INVALID = _f("graphmon_records_invalid", "counter", "Kernel records excluded as invalid, by reason.", "reason")
ERRORS = _f("graphmon_collector_errors", "counter", "Errors contained inside graphmon, by stage.", "stage")
OUT_OF_RANGE = _f("graphmon_values_out_of_range", "counter",
                  "Values left out of a histogram: negative, or beyond 1,000 s (not a GPU time).", "kind")
BUILD = _f("graphmon_build_info", "gauge", "Versions of graphmon and what it runs with (\"\" = unknown).",
           *BUILD_LABELS, per_rank=False)
DEVICE = _f("graphmon_device_info", "gauge", "One series per device with series; UUID joins with dcgm-exporter "
            "(on(UUID)).", "device", "UUID", "pci_bus_id", "gpu_name", "host")
LAST_WINDOW = _f("graphmon_last_window_timestamp_seconds", "gauge", "Unix time the last window closed.")
SLOWDOWN = _f("graphmon_observer_slowdown_ratio", "gauge",
              "Replay time while a sampling window is open divided by replay time outside windows.")
STARTED = _f("graphmon_process_start_time_seconds", "gauge",
             "Unix time the rank's process started (its hello; the fleet rules take the newest build of a workload by it).")
GRAPHS = _f("graphmon_graphs", "gauge", "Graphs with series of their own (detail=\"true\": the most GPU time, "
            "--detail-graphs) and graphs only in /status and /graphs (detail=\"false\"), not stale.", "detail")
GAP = _f("graphmon_kernel_gap_seconds", "histogram",
         "Gap between consecutive kernels of one graph replay on one stream (next start - previous end). "
         "Overlaps (negative gaps) are not in the histogram: see graphmon_kernel_gap_negative_total.", *STREAM)
NEGATIVE = _f("graphmon_kernel_gap_negative", "counter", "Negative gaps (kernels overlapping on one stream) seen.",
              *STREAM)
GAP_Q = _f("graphmon_kernel_gap_quantile_seconds", "summary", "Exact gap quantiles over the last window in which "
           "this series had replays; count/sum cumulative (non-negative gaps).", *STREAM)
REPLAY = {
    "gpu": _f("graphmon_replay_gpu_seconds", "histogram",
              "GPU time of one graph replay: first kernel start to last kernel end.", *GRAPH),
    "busy": _f("graphmon_replay_busy_seconds", "histogram",
               "Union of kernel execution intervals of one replay across streams.", *GRAPH),
    "idle": _f("graphmon_replay_idle_seconds", "histogram",
               "Replay GPU time minus busy time: time no kernel of the replay ran.", *GRAPH),
    "launch_latency": _f("graphmon_launch_latency_seconds", "histogram",
                         "CPU graph launch call to the replay's first kernel start.", *GRAPH),
    "inter_replay_gap": _f("graphmon_inter_replay_gap_seconds", "histogram", "Previous replay's last kernel end to "
                           "this replay's first kernel start on the launch stream.", *GRAPH),
}
UNTRACED = _f("graphmon_replay_untraced_seconds", "histogram",
              "Graph replay time timed untraced (kernel tracing off): CUDA events recorded by the launch callbacks "
              "around the launch. It keeps the event records and the launch latency from the enter callback's record "
              "to the first kernel; no kernel tracing. Not comparable to graphmon_replay_gpu_seconds (traced span).",
              *GRAPH)
REPLAY_Q = _f("graphmon_replay_quantile_seconds", "summary", "Exact quantiles of replay GPU time (kind=gpu), busy or "
              "idle time, launch latency and the gap between replays over the last window; count/sum cumulative.",
              *GRAPH, "kind")
KPR = _f("graphmon_kernels_per_replay", "gauge", "Median kernels per replay in the last window.", *GRAPH)
REPLAYS = _f("graphmon_replays_sampled", "counter", "Graph replays seen inside sampling windows.", *GRAPH)
LAST_SAMPLED = _f("graphmon_graph_last_sampled_timestamp_seconds", "gauge", "Unix time of the last window that "
                  "sampled this graph (series not sampled for --stale-after-s are dropped).", *GRAPH)
GRAPH_INFO = _f("graphmon_graph_info", "gauge", "One series per monitored graph: its key, label, upload mode, batch "
                "size and structural signature (kernels, streams, other nodes, kernel-name hash: a changed graph "
                "under the same name).", "device", "graph", "graph_key", "label", "upload_mode",
                "upload_stream_is_launch_stream", "batch_size", "signature")
HEALTH = (UP, STATE, INFO, *(f for f, _ in COUNTERS), INVALID, ERRORS, OUT_OF_RANGE, BUILD, DEVICE, LAST_WINDOW,
          SLOWDOWN, STARTED, GRAPHS)


@dataclass(frozen=True)
class Level:
    all_graphs: bool  # False: the aggregator's detail graphs only
    histograms: Mapping[str, tuple]  # "gap" or a replay kind -> bucket bounds (ns); absent: not exported
    gap_quantiles: tuple[float, ...]
    replay_quantiles: Mapping[str, tuple[float, ...]]  # kind -> quantiles
    summary_totals: bool  # summaries' _count and _sum


_ALL_Q = {k: REPLAY_QUANTILES for k in REPLAY_KINDS}
# The quantiles the dashboards and alert rules read (tests/deploy/test_dashboards.py checks each).
_USED_Q = {"gpu": (0.5, 0.99), "busy": (0.5,), "idle": (0.5,), "launch_latency": (0.5, 0.99),
           "inter_replay_gap": (0.5, 0.9)}
LEVEL = {
    "full": Level(True, {"gap": GAP_BUCKETS_NS, **{k: b for k, (_, b) in REPLAY_KINDS.items()},
                         "untraced": UNTRACED_BUCKETS_NS}, GAP_QUANTILES, _ALL_Q, True),
    "standard": Level(False, {"gap": GAP_BUCKETS_STANDARD_NS, "gpu": REPLAY_BUCKETS_STANDARD_NS,
                              "idle": IDLE_BUCKETS_STANDARD_NS, "untraced": UNTRACED_BUCKETS_STANDARD_NS},
                      (0.5, 0.9), _USED_Q, False),
    "low": Level(False, {}, (0.5, 0.9), _USED_Q, True),
}


def families(level: str) -> tuple[Fam, ...]:
    """The families a rank exports at ``level``, in body order (a family with no series still
    has its HELP and TYPE, so a body's families do not come and go)."""
    lv = LEVEL[level]
    hist = [REPLAY[k] for k in REPLAY_KINDS if k in lv.histograms] + ([UNTRACED] if "untraced" in lv.histograms else [])
    return (*HEALTH, *([GAP] if "gap" in lv.histograms else []), NEGATIVE, GAP_Q, *hist, REPLAY_Q, KPR, REPLAYS,
            LAST_SAMPLED, GRAPH_INFO)


def rank_labels(snap: Snapshot) -> tuple[tuple[str, str], ...]:
    """The constant labels of every series of a rank (families with ``per_rank``): ``rank``, and the
    engine's workload identity where its process said it (graphmon.export.identity)."""
    return (("rank", snap.rank), *workload_labels(snap.process).items())


def _fmt_le(ns: float) -> str:
    # ns / 1e9 (not ns * 1e-9) and %g keep bucket bounds readable: 9.6e-08, not 9.600000000000001e-08.
    return f"{ns / 1e9:.12g}" if ns != float("inf") else "+Inf"


class _Bins:
    """A level's bucket bounds as le strings, and where they fall among the full bounds."""

    def __init__(self, full: tuple, bounds: tuple) -> None:
        self.les = tuple(_fmt_le(b) for b in bounds) + ("+Inf",)
        self.at = tuple(full.index(b) for b in bounds) + (len(full),)
        self.identity = bounds == full

    def cumulative(self, counts: tuple) -> list:
        acc = list(itertools.accumulate(counts))
        return acc if self.identity else [acc[i] for i in self.at]


_FULL_BOUNDS = {"gap": GAP_BUCKETS_NS, **{k: b for k, (_, b) in REPLAY_KINDS.items()}, "untraced": UNTRACED_BUCKETS_NS}
_BINS = {(lv, k): _Bins(_FULL_BOUNDS[k], b) for lv, spec in LEVEL.items() for k, b in spec.histograms.items()}


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


def health_series(s: Snapshot, extra_errors: Optional[Mapping[str, int]], level: str) -> list:
    """(family, series) of the health families of one snapshot."""
    b = build_info(s.backend_info)
    cur = s.health.state if s.health.state in STATES else "error"
    # state/reason say why graphmon_up is 0 (e.g. another CUPTI subscriber holds the process).
    info = (*((k, _no_path(k, v)) for k, v in s.backend_info.items()), ("state", s.health.state),
            ("reason", base_names(s.health.reason[:200])))
    reasons = dict.fromkeys(INVALID_REASONS, 0)
    reasons.update(s.records_invalid_total)
    stages = dict.fromkeys(KNOWN_STAGES, 0)
    stages.update(s.errors_total)
    for stage, v in (extra_errors or {}).items():
        stages[stage] = stages.get(stage, 0) + v
    kinds = dict.fromkeys(VALUE_KINDS, 0)
    kinds.update(s.values_out_of_range_total)
    p = s.process
    devices = [((d, *((p.get("uuid", ""), p.get("pci_bus_id", ""), p.get("gpu_name", "")) if p.get("device", "") == d
                      else ("", "", "")), p.get("host", "")), 1) for d in s.devices]
    n_detail = len(s.graphs) if LEVEL[level].all_graphs else len(s.detail_graphs)
    out = [(UP, [((), 1 if s.up else 0)]), (STATE, [((st,), 1 if st == cur else 0) for st in STATES]),
           (INFO, [(info, 1)])]
    out += [(fam, [((), getattr(s, field))]) for fam, field in COUNTERS]
    out += [(INVALID, [((r,), v) for r, v in sorted(reasons.items())]),
            (ERRORS, [((st,), v) for st, v in sorted(stages.items())]),
            (OUT_OF_RANGE, [((k,), v) for k, v in sorted(kinds.items())]),
            (BUILD, [(tuple(b[k] for k in BUILD_LABELS), 1)]), (DEVICE, devices),
            (LAST_WINDOW, [] if s.last_window_s is None else [((), s.last_window_s)]),
            (SLOWDOWN, [] if s.observer_slowdown is None else [((), s.observer_slowdown)]),
            (STARTED, [] if (t0 := _start_s(p)) is None else [((), t0)]),
            (GRAPHS, [(("true",), n_detail), (("false",), len(s.graphs) - n_detail)])]
    return out


def _start_s(process: Mapping[str, str]) -> Optional[float]:
    try:
        t = float(process.get("process_start_s", ""))
    except (TypeError, ValueError):
        return None
    return t if math.isfinite(t) and t > 0 else None


def graph_series(s: Snapshot, level: str) -> list:
    """(family, series) of the per-graph families of one snapshot at ``level``."""
    lv = LEVEL[level]
    keep = None if lv.all_graphs else s.detail_graphs  # (device, graph) pairs

    def kept(keys):
        return sorted(keys) if keep is None else sorted(k for k in keys if (k[0], k[1]) in keep)

    out = []
    gap_keys = kept(s.gap_hist)
    gap_q = [(i, f"{q:g}") for i, q in enumerate(GAP_QUANTILES) if q in lv.gap_quantiles]
    if "gap" in lv.histograms:
        bins = _BINS[(level, "gap")]
        out.append((GAP, [(k, bins.les, bins.cumulative(h.counts), h.sum_ns * NS)
                          for k, h in ((k, s.gap_hist[k]) for k in gap_keys)]))
    out.append((NEGATIVE, [(k, s.gap_negative_total.get(k, 0)) for k in gap_keys]))
    out.append((GAP_Q, [_summary(k, gap_q, s.gap_quantiles.get(k, ()), s.gap_hist[k], lv.summary_totals)
                        for k in gap_keys]))
    rep_keys = kept(s.replays_total)
    for kind in REPLAY_KINDS:
        if kind not in lv.histograms:
            continue
        bins = _BINS[(level, kind)]
        rows = []
        for k in kept(s.replay_hist):
            h = s.replay_hist[k].get(kind)
            if h is not None:
                rows.append((k, bins.les, bins.cumulative(h.counts), h.sum_ns * NS))
        out.append((REPLAY[kind], rows))
    if "untraced" in lv.histograms:
        bins = _BINS[(level, "untraced")]
        out.append((UNTRACED, [(k, bins.les, bins.cumulative(h.counts), h.sum_ns * NS)
                               for k, h in ((k, s.untraced_hist[k]) for k in kept(s.untraced_hist))]))
    rq = []
    for k in rep_keys:
        hists = s.replay_hist.get(k, {})
        for kind, qs in s.replay_quantiles.get(k, {}).items():
            h = hists.get(kind)
            want = lv.replay_quantiles.get(kind, ())
            if h is not None and want:
                picks = [(i, f"{q:g}") for i, q in enumerate(REPLAY_QUANTILES) if q in want]
                rq.append(_summary((*k, kind), picks, qs, h, lv.summary_totals))
    out.append((REPLAY_Q, rq))
    out.append((KPR, [(k, s.kernels_per_replay[k]) for k in rep_keys if k in s.kernels_per_replay]))
    out.append((REPLAYS, [(k, s.replays_total[k]) for k in rep_keys]))
    out.append((LAST_SAMPLED, [(k, s.graph_last_sampled_s[k]) for k in rep_keys if k in s.graph_last_sampled_s]))
    info = []
    for (d, graph), g in sorted(s.graphs.items()):
        if keep is None or (d, graph) in keep:
            info.append(((d, graph, g.graph_key, g.label, g.upload_mode, g.upload_stream_is_launch_stream,
                          g.batch_size, g.signature), 1))
    out.append((GRAPH_INFO, info))
    return out


def _summary(labels: tuple, picks, values, h, totals: bool) -> tuple:
    # NaN: no data; never a negative quantile (OpenMetrics parsers refuse the scrape)
    qs = [(q, values[i] * NS) for i, q in picks if i < len(values) and values[i] >= 0]
    return (labels, qs, h.count if totals else None, h.sum_ns * NS if totals else None)


def rank_series(s: Snapshot, level: str = DEFAULT_LEVEL, extra_errors: Optional[Mapping[str, int]] = None,
                health_only: bool = False) -> list:
    """Every (family, series) of one snapshot at ``level``, in :func:`families` order."""
    out = health_series(s, extra_errors, level)
    if not health_only:
        out += graph_series(s, level)
    return out
