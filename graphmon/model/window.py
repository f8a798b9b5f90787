"""What a source delivers and what it reports: a window of kernel records, a capture request, health.

These are plain frozen data shared between threads (and, for windows, between processes): no
methods that touch a source, so the model imports nothing but the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from graphmon.model.trace import GraphInfo, Trace

# Graph replays timed untraced: CUDA events recorded by the launch callbacks around a graph
# launch (enter: start on the launch stream; exit: end), kernel tracing off. One row per timed
# replay. ``graph`` indexes the window's graphs (Window.trace.graphs, WindowRecords.graphs), -1
# when the exec's graph is unknown; ``duration_ns`` is the events' elapsed time (> 0). What it
# keeps of the observer: the events themselves and the launch latency from the enter callback's
# record to the graph's first kernel; it carries no kernel tracing's cost.
UNTRACED_COLUMNS = {"graph": np.int32, "duration_ns": np.int64}


def no_untraced() -> dict[str, np.ndarray]:
    """Empty untraced columns (a window that timed no replay untraced)."""
    return {k: np.zeros(0, t) for k, t in UNTRACED_COLUMNS.items()}


def reindex_untraced(parts: Sequence[tuple[Mapping[str, np.ndarray], Sequence[GraphInfo]]],
                     graphs: Sequence[GraphInfo]) -> tuple[dict[str, np.ndarray], int]:
    """The untraced rows of several windows as one table whose ``graph`` indexes ``graphs``: each
    part is (its rows, the graphs its ``graph`` indexes); a graph is matched by key (its identity
    within a process), -1 stays -1. Returns (rows, left out): a row whose graph index is outside
    its window's graphs, whose graph's key ``graphs`` lacks, or whose duration is not > 0 is no
    replay time of a known graph, and is counted rather than written (a reader refuses it)."""
    index = {g.key: i for i, g in enumerate(graphs)}
    out: dict[str, list] = {k: [] for k in UNTRACED_COLUMNS}
    left_out = 0
    for rows, own in parts:
        g = np.asarray(rows.get("graph", ()), np.int64)
        d = np.asarray(rows.get("duration_ns", ()), np.int64)
        gmap = np.array([index.get(x.key, -2) for x in own] + [-1], np.int64)  # [-1]: graph -1 stays -1
        ok = (g >= -1) & (g < len(own)) & (d > 0)
        new = gmap[np.where(ok, g, -1)]
        ok &= new >= -1  # -2: a key the merged graphs lack
        left_out += int((~ok).sum())
        out["graph"].append(new[ok])
        out["duration_ns"].append(d[ok])
    return {k: np.concatenate([np.zeros(0, t), *out[k]]).astype(t) for k, t in UNTRACED_COLUMNS.items()}, left_out


@dataclass(frozen=True)
class CaptureRequest:
    """An on-demand window (POST /capture): N replays or D milliseconds, whichever ends first."""

    id: str
    replays: Optional[int] = None
    duration_ms: Optional[float] = None


@dataclass(frozen=True)
class Window:
    """One sampling window of kernel records, as delivered by a source."""

    trace: Trace
    started_s: float  # wall clock (time.time()) when the window opened
    ended_s: float  # wall clock when it closed
    dropped: int = 0  # records the source lost (e.g. CUPTI's dropped-record count)
    observer_slowdown: Optional[float] = None  # in-window / out-of-window replay time, if measured
    capture_id: Optional[str] = None  # set when the window answers a CaptureRequest
    traced_s: float = 0.0  # how long kernel tracing was on for it (the GPU ran observed); 0: not traced
    untraced: Mapping[str, np.ndarray] = field(default_factory=no_untraced)  # UNTRACED_COLUMNS


@dataclass(frozen=True)
class WindowRecords:
    """A window's kernel records as a collector decoded them, before window-edge filtering and
    validation (model/edges.assemble makes the Window). A light collector ships this: the
    filtering runs in the agent, not on the serving process's GIL."""

    kernels: Mapping[str, np.ndarray]  # trace.KERNEL_COLUMNS, unfiltered
    launches: Mapping[str, np.ndarray]  # trace.LAUNCH_COLUMNS ("graph" indexes graphs)
    names: list[str]
    graphs: list[GraphInfo]
    started_s: float
    ended_s: float
    dropped: int = 0
    observer_slowdown: Optional[float] = None
    capture_id: Optional[str] = None
    invalid: Mapping[str, int] = field(default_factory=dict)  # excluded before shipping (counted)
    traced_s: float = 0.0  # how long kernel tracing was on for it
    meta: Mapping[str, object] = field(default_factory=dict)
    untraced: Mapping[str, np.ndarray] = field(default_factory=no_untraced)  # UNTRACED_COLUMNS

    def __len__(self) -> int:
        return len(self.kernels["start_ns"])

    @property
    def n_launches(self) -> int:
        return len(self.launches["correlation_id"])


@dataclass(frozen=True)
class SourceHealth:
    up: bool
    state: str  # "starting" | "running" | "stopped" | "blocked" | "error"
    reason: str = ""
    errors: dict[str, int] = field(default_factory=dict)  # stage -> count
    last_errors: dict[str, str] = field(default_factory=dict)  # stage -> repr of the last exception
