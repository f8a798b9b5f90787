"""Recent windows kept for GET /trace/{id}, bounded by count and bytes (oldest evicted).

:class:`TraceStore` serves one process (``serve``, in-process). The agent keeps one
:class:`SharedTraceStore` for all its processes: one byte cap for all of them together (a
store per process made the agent's memory grow with the number of processes: 607-711 MB at 64)
and a count cap per process; each process's aggregator gets a :meth:`SharedTraceStore.view`.

Each window is kept with its untraced replay durations (graphmon.model.window.UNTRACED_COLUMNS,
``graph`` indexing the window's graphs), counted in the bytes: ``?format=graphmon`` writes them
into the download, and a baseline pinned from the store gets them (:meth:`TraceStore.entry`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Mapping, Optional

import numpy as np

from graphmon.model.trace import Trace
from graphmon.model.window import UNTRACED_COLUMNS, no_untraced

Untraced = Mapping[str, np.ndarray]
Entry = tuple[Trace, Untraced]  # a kept window: its trace and its untraced rows


def trace_nbytes(trace: Trace, untraced: Optional[Untraced] = None) -> int:
    n = sum(getattr(trace, k).nbytes for k in ("start_ns", "end_ns", "device", "stream", "graph_id",
                                                "graph_node_id", "correlation_id", "name_id", "graph"))
    return int(n + (sum(a.nbytes for a in untraced.values()) if untraced is not None else 0))


def _kept_untraced(untraced: Optional[Untraced]) -> dict[str, np.ndarray]:
    """The rows as the native format stores them (UNTRACED_COLUMNS' dtypes: int32 graph)."""
    if untraced is None or not len(untraced["duration_ns"]):
        return no_untraced()
    return {k: np.asarray(untraced[k], t) for k, t in UNTRACED_COLUMNS.items()}


class TraceStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, tuple[Trace, Untraced, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    size_of = staticmethod(trace_nbytes)

    def put(self, wid: str, trace: Trace, untraced: Optional[Untraced] = None) -> None:
        rows = _kept_untraced(untraced)
        size = self.size_of(trace, rows)
        with self._lock:
            if self.max_count == 0 or size > self.max_bytes:
                self.evicted += 1
                return
            self._items[wid] = (trace, rows, size)
            self._bytes += size
            while len(self._items) > self.max_count or self._bytes > self.max_bytes:
                _, (_, _, s) = self._items.popitem(last=False)
                self._bytes -= s
                self.evicted += 1

    def get(self, wid: str) -> Optional[Trace]:
        e = self.entry(wid)
        return e[0] if e else None

    def entry(self, wid: str) -> Optional[Entry]:
        """(trace, untraced rows) of a kept window, read together (never one without the other)."""
        with self._lock:
            item = self._items.get(wid)
        return item[:2] if item else None

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes


class SharedTraceStore:
    """Windows of many owners (the agent's ranks) under one byte cap, oldest evicted first
    whoever owns it; at most ``max_count`` windows per owner."""

    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[tuple[str, str], tuple[Trace, Untraced, int]] = OrderedDict()  # oldest first
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its ids, oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    def view(self, owner: str) -> "TraceStoreView":
        return TraceStoreView(self, owner)

    def _evict_locked(self, key: tuple[str, str]) -> None:
        size = self._items.pop(key)[-1]
        self._bytes -= size
        ids = self._owned.get(key[0])
        if ids is not None:
            ids.pop(key[1], None)
        self.evicted += 1

    def put(self, owner: str, wid: str, trace: Trace, untraced: Optional[Untraced] = None) -> None:
        rows = _kept_untraced(untraced)
        size = trace_nbytes(trace, rows)
        with self._lock:
            if self.max_count == 0 or size > self.max_bytes:
                self.evicted += 1
                return
            key = (owner, wid)
            if key in self._items:
                self._evict_locked(key)
                self.evicted -= 1  # replaced, not evicted
            ids = self._owned.setdefault(owner, OrderedDict())
            self._items[key] = (trace, rows, size)
            ids[wid] = None
            self._bytes += size
            while len(ids) > self.max_count:
                self._evict_locked((owner, next(iter(ids))))
            while self._bytes > self.max_bytes:
                self._evict_locked(next(iter(self._items)))

    def get(self, owner: str, wid: str) -> Optional[Trace]:
        e = self.entry(owner, wid)
        return e[0] if e else None

    def entry(self, owner: str, wid: str) -> Optional[Entry]:
        with self._lock:
            item = self._items.get((owner, wid))
        return item[:2] if item else None

    def ids(self, owner: str) -> list[str]:
        with self._lock:
            return list(self._owned.get(owner, ()))

    def drop(self, owner: str) -> None:
        """Forget an owner and its windows (a rank the agent no longer keeps)."""
        with self._lock:
            for wid in list(self._owned.get(owner, ())):
                self._bytes -= self._items.pop((owner, wid))[-1]
            self._owned.pop(owner, None)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def owner_nbytes(self, owner: str) -> int:
        with self._lock:
            return sum(self._items[(owner, w)][-1] for w in self._owned.get(owner, ()))


class TraceStoreView:
    """One owner's part of a :class:`SharedTraceStore`, with the TraceStore interface the
    aggregator uses (put, get, entry, ids, nbytes)."""

    def __init__(self, shared: SharedTraceStore, owner: str) -> None:
        self.shared, self.owner = shared, owner

    size_of = staticmethod(trace_nbytes)

    def put(self, wid: str, trace: Trace, untraced: Optional[Untraced] = None) -> None:
        self.shared.put(self.owner, wid, trace, untraced)

    def get(self, wid: str) -> Optional[Trace]:
        return self.shared.get(self.owner, wid)

    def entry(self, wid: str) -> Optional[Entry]:
        return self.shared.entry(self.owner, wid)

    def ids(self) -> list[str]:
        return self.shared.ids(self.owner)

    @property
    def nbytes(self) -> int:
        return self.shared.owner_nbytes(self.owner)
