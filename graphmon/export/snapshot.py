"""The frozen data a scrape, /status and /graphs read: no behaviour, no locks.

An :class:`~graphmon.export.aggregator.Aggregator` publishes a new :class:`Snapshot` by one
reference swap; readers never see a half-built one. Everything inside is a tuple, a read-only
mapping, or (``last_analysis``) arrays nobody writes after the window was analysed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from graphmon.model.window import SourceHealth

EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Hist:
    """Cumulative histogram: per-bucket (non-cumulative) counts incl. +Inf, exact ns sum."""

    counts: tuple[int, ...]
    sum_ns: int
    count: int


@dataclass(frozen=True)
class GraphSeries:
    graph: str  # display name (after folding and label-length capping)
    graph_key: str
    label: str
    upload_mode: str
    upload_stream_is_launch_stream: str  # "true" | "false" | "unknown"
    batch_size: str = ""  # label_graph(batch_size=...); "" when unknown
    signature: str = ""  # structural signature (graphmon.analysis.signature); "" when folded


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or /status needs; immutable (tuples and read-only mappings)."""

    created_s: float
    rank: str
    backend_info: Mapping[str, str]
    health: SourceHealth
    windows_total: int
    records_total: int
    records_dropped_total: int
    records_invalid_total: Mapping[str, int]
    series_folded_total: int
    errors_total: Mapping[str, int]  # stage -> count (aggregator + source)
    last_window_s: Optional[float]
    observer_slowdown: Optional[float]
    # key (device, graph, stream, upload_mode)
    gap_hist: Mapping[tuple, Hist]
    gap_negative_total: Mapping[tuple, int]
    gap_quantiles: Mapping[tuple, tuple[float, ...]]  # last window
    # key (device, graph, upload_mode)
    replay_hist: Mapping[tuple, Mapping[str, Hist]]  # kind -> Hist
    replay_quantiles: Mapping[tuple, Mapping[str, tuple[float, ...]]]  # last window, kind -> qs
    kernels_per_replay: Mapping[tuple, float]
    replays_total: Mapping[tuple, int]
    graphs: Mapping[tuple, GraphSeries]  # (device, graph) -> info
    windows: tuple = ()  # recent window ids, newest last
    # The last window's analysis and its gap quantiles: report.summary formats them for /status
    # (outside the ingest lock, once per snapshot). Read-only arrays.
    last_analysis: Any = None
    last_gap_quantiles: Any = None
    # Identity of the process this snapshot describes (rank, pid, host, device, uuid, pci_bus_id,
    # state, reason): one snapshot per attached process in the agent.
    process: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    # (device, graph, upload_mode) -> wall time of the last window that sampled the graph
    graph_last_sampled_s: Mapping[tuple, float] = field(default_factory=lambda: EMPTY)
    values_out_of_range_total: Mapping[str, int] = field(default_factory=lambda: EMPTY) # kind -> values beyond MAX_VALUE_NS, excluded
    label_values_truncated_total: int = 0
    kernel_tracing_s_total: float = 0.0  # kernel tracing on (CUPTI windows), summed
    devices: tuple = ()  # device labels with series (after the device cap)
    # (device, graph) of the rank's detail graphs: the ones with series of their own at the
    # default cardinality level (the aggregator picks the most GPU time, with hysteresis)
    detail_graphs: frozenset = frozenset()
    # key (device, graph, upload_mode): graph replays timed untraced (graphmon.export.untraced), the
    # cumulative histogram and, over the newest ones, count, mean, p10/p50/p90/p99 in seconds
    untraced_hist: Mapping[tuple, Hist] = field(default_factory=lambda: EMPTY)
    untraced_summary: Mapping[tuple, Mapping[str, float]] = field(default_factory=lambda: EMPTY)

    @property
    def up(self) -> bool:
        return self.health.up


def freeze(d: dict) -> Mapping:
    return MappingProxyType(dict(d))
