"""The deploy verdict's pools: one process's newest windows, bounded in replays per graph and in
bytes (graphmon.export.deploy compares a reference pool with the current one).

Each window keeps its untraced replay durations (graphmon.model.window.UNTRACED_COLUMNS: ``graph``
indexes that window's graphs). The traced replays alone decide which windows stay (the compare
cost and the pool's size stay what they were); when a window goes, its untraced durations move to
the pool's ``carry`` (per graph key, the newest UNTRACED_SAMPLES), so a process that times many
replays untraced and few traced keeps enough of them. Both count in ``nbytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np

from graphmon.analysis.deploy import UNTRACED_SAMPLES
from graphmon.model.trace import Trace, concat
from graphmon.model.window import no_untraced

MAX_REPLAYS = 64
MAX_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Pooled:
    window_id: str
    trace: Trace
    replays: Mapping[str, int]  # graph ("<device>/<name>") -> replays in this window
    nbytes: int
    ended_s: float
    untraced: Mapping[str, np.ndarray] = field(default_factory=no_untraced)  # UNTRACED_COLUMNS, this window's
    untraced_left_out: int = 0  # rows no graph of the window names (-1, out of range) or not > 0 ns

    def untraced_by_key(self) -> dict[str, np.ndarray]:
        """This window's untraced durations per graph key (the graph's identity within a process)."""
        g, d = self.untraced["graph"], self.untraced["duration_ns"]
        return {self.trace.graphs[k].key: d[g == k] for k in np.unique(g).tolist()}


def window_replays(trace: Trace) -> dict[str, int]:
    """Replays per graph of one window, keyed "<device>/<graph name>"."""
    sel = trace.graph >= 0
    if not sel.any():
        return {}
    # one int64 key per (graph, device, correlation id): a 1-D unique (np.unique with axis=1 took
    # 23 ms for a 20k-record window on the ingest side of a busy agent; this takes about 1 ms)
    g, d = trace.graph[sel].astype(np.int64), trace.device[sel].astype(np.int64)
    corr = trace.correlation_id[sel].astype(np.int64)
    n_dev = int(d.max()) + 1
    gd = g * n_dev + d
    if int(corr.min()) >= 0 and int(corr.max()) < 2**32 and int(gd.max()) < 2**31:
        keys = np.unique((gd << 32) | corr) >> 32
    else:  # (correlation ids are CUPTI's uint32; anything else takes the general path)
        keys = np.unique(np.stack([gd, corr]), axis=1)[0]
    pairs, counts = np.unique(keys, return_counts=True)
    names = [x.name for x in trace.graphs]
    return {f"{int(k) % n_dev}/{names[int(k) // n_dev]}": int(c) for k, c in zip(pairs.tolist(), counts.tolist())}


def pooled(window_id: str, trace: Trace, ended_s: float, untraced: Optional[Mapping[str, np.ndarray]] = None) -> Pooled:
    nbytes = sum(getattr(trace, k).nbytes for k in ("start_ns", "end_ns", "device", "stream", "graph_id",
                                                    "graph_node_id", "correlation_id", "name_id", "graph"))
    kept, left_out = _usable(untraced, len(trace.graphs))
    nbytes += sum(a.nbytes for a in kept.values())
    return Pooled(window_id, trace, window_replays(trace), int(nbytes), float(ended_s), kept, left_out)


def _usable(untraced: Optional[Mapping[str, np.ndarray]], n_graphs: int) -> tuple[dict[str, np.ndarray], int]:
    """The rows the verdict can use, the newest UNTRACED_SAMPLES per graph, and how many were not
    usable (counted: an unknown graph has no verdict to confirm; a duration <= 0 is no replay time)."""
    if untraced is None or not len(untraced["duration_ns"]):
        return no_untraced(), 0
    g = np.asarray(untraced["graph"], np.int32)
    d = np.asarray(untraced["duration_ns"], np.int64)
    ok = (g >= 0) & (g < n_graphs) & (d > 0)
    keep = np.zeros(len(g), bool)
    for k in np.unique(g[ok]).tolist():  # graphs per window: a handful
        keep[np.flatnonzero(ok & (g == k))[-UNTRACED_SAMPLES:]] = True
    return {"graph": g[keep].copy(), "duration_ns": d[keep].copy()}, int((~ok).sum())


class Pool:
    """The newest windows of one process, bounded in replays per graph and in bytes."""

    def __init__(self, max_replays: int = MAX_REPLAYS, max_bytes: int = MAX_BYTES,
                 windows: Optional[list] = None, carry: Optional[Mapping[str, np.ndarray]] = None) -> None:
        self.max_replays, self.max_bytes = int(max_replays), int(max_bytes)
        self.windows: list[Pooled] = list(windows or [])
        # untraced durations of the windows that went, per graph key (oldest first, the newest kept)
        self.carry: dict[str, np.ndarray] = dict(carry or {})
        self._trace: Optional[Trace] = None

    def add(self, p: Pooled) -> None:
        self.windows.append(p)
        self._trace = None
        total = self.replays()
        while len(self.windows) > 1:
            old = self.windows[0]
            over_bytes = self.nbytes > self.max_bytes
            # the oldest window goes when every graph it holds keeps max_replays without it
            surplus = all(total.get(g, 0) - n >= self.max_replays for g, n in old.replays.items())
            if not (over_bytes or surplus):
                break
            self.windows.pop(0)
            for g, n in old.replays.items():
                total[g] -= n
            for k, d in old.untraced_by_key().items():
                self.carry[k] = np.concatenate([self.carry.get(k, d[:0]), d])[-UNTRACED_SAMPLES:]

    def replays(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.windows:
            for g, n in w.replays.items():
                out[g] = out.get(g, 0) + n
        return out

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.windows) + sum(d.nbytes for d in self.carry.values())

    @property
    def untraced_left_out(self) -> int:
        return sum(w.untraced_left_out for w in self.windows)

    def untraced(self) -> dict[str, np.ndarray]:
        """The newest UNTRACED_SAMPLES untraced durations per graph, keyed by the display name of
        :meth:`trace` (what compare matches); graphs the pooled trace has no kernels of are left out."""
        parts: dict[str, list] = {k: [d] for k, d in self.carry.items()}
        for w in self.windows:
            for k, d in w.untraced_by_key().items():
                parts.setdefault(k, []).append(d)
        if not parts:
            return {}
        t = self.trace()
        names = dict(zip((g.key for g in t.graphs), t.graph_names()))
        return {names[k]: np.concatenate(ds)[-UNTRACED_SAMPLES:] for k, ds in parts.items() if k in names}

    @property
    def newest_s(self) -> Optional[float]:
        return self.windows[-1].ended_s if self.windows else None

    @property
    def newest_id(self) -> Optional[str]:
        return self.windows[-1].window_id if self.windows else None

    def trace(self) -> Trace:
        if self._trace is None:
            self._trace = concat([w.trace for w in self.windows])
        return self._trace

    def copy(self) -> "Pool":
        p = Pool(self.max_replays, self.max_bytes, self.windows, self.carry)
        p._trace = self._trace
        return p

    def upto(self, window_id: str) -> Optional["Pool"]:
        ids = [w.window_id for w in self.windows]
        if window_id not in ids:
            return None
        return Pool(self.max_replays, self.max_bytes, self.windows[: ids.index(window_id) + 1], self.carry)

    def after(self, window_id: str) -> "Pool":
        """The windows after ``window_id`` (all of them, and the carry, when it is not in this pool)."""
        ids = [w.window_id for w in self.windows]
        if window_id not in ids:
            return Pool(self.max_replays, self.max_bytes, self.windows, self.carry)
        return Pool(self.max_replays, self.max_bytes, self.windows[ids.index(window_id) + 1:])

    def ready(self, other: "Pool", min_replays: int) -> bool:
        """One graph with ``min_replays`` replays in both pools."""
        mine, theirs = self.replays(), other.replays()
        return any(min(n, theirs.get(g, 0)) >= min_replays for g, n in mine.items())
