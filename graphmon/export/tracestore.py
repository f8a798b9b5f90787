"""Recent windows kept for GET /trace/{id}, bounded by count and bytes (oldest evicted).

:class:`TraceStore` serves one process (``serve``, in-process). The agent keeps one
:class:`SharedTraceStore` for all its processes: one byte cap for all of them together (a
store per process made the agent's memory grow with the number of processes: 607-711 MB at 64)
and a count cap per process; each process's aggregator gets a :meth:`SharedTraceStore.view`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

from graphmon.model.trace import Trace


def trace_nbytes(trace: Trace) -> int:
    return int(sum(getattr(trace, k).nbytes for k in ("start_ns", "end_ns", "device", "stream", "graph_id",
                                                       "graph_node_id", "correlation_id", "name_id", "graph")))


class TraceStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, tuple[Trace, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    size_of = staticmethod(trace_nbytes)

    def put(self, wid: str, trace: Trace) -> None:
        size = self.size_of(trace)
        with self._lock:
            if self.max_count == 0 or size > self.max_bytes:
                self.evicted += 1
                return
            self._items[wid] = (trace, size)
            self._bytes += size
            while len(self._items) > self.max_count or self._bytes > self.max_bytes:
                _, (_, s) = self._items.popitem(last=False)
                self._bytes -= s
                self.evicted += 1

    def get(self, wid: str) -> Optional[Trace]:
        with self._lock:
            item = self._items.get(wid)
        return item[0] if item else None

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
        self._items: OrderedDict[tuple[str, str], tuple[Trace, int]] = OrderedDict()  # oldest first
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its ids, oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    def view(self, owner: str) -> "TraceStoreView":
        return TraceStoreView(self, owner)

    def _evict_locked(self, key: tuple[str, str]) -> None:
        _, size = self._items.pop(key)
        self._bytes -= size
        ids = self._owned.get(key[0])
        if ids is not None:
            ids.pop(key[1], None)
        self.evicted += 1

    def put(self, owner: str, wid: str, trace: Trace) -> None:
        size = trace_nbytes(trace)
        with self._lock:
            if self.max_count == 0 or size > self.max_bytes:
                self.evicted += 1
                return
            key = (owner, wid)
            if key in self._items:
                self._evict_locked(key)
                self.evicted -= 1  # replaced, not evicted
            ids = self._owned.setdefault(owner, OrderedDict())
            self._items[key] = (trace, size)
            ids[wid] = None
            self._bytes += size
            while len(ids) > self.max_count:
                self._evict_locked((owner, next(iter(ids))))
            while self._bytes > self.max_bytes:
                self._evict_locked(next(iter(self._items)))

    def get(self, owner: str, wid: str) -> Optional[Trace]:
        with self._lock:
            item = self._items.get((owner, wid))
        return item[0] if item else None

    def ids(self, owner: str) -> list[str]:
        with self._lock:
            return list(self._owned.get(owner, ()))

    def drop(self, owner: str) -> None:
        """Forget an owner and its windows (a rank the agent no longer keeps)."""
        with self._lock:
            for wid in list(self._owned.get(owner, ())):
                _, size = self._items.pop((owner, wid))
                self._bytes -= size
            self._owned.pop(owner, None)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def owner_nbytes(self, owner: str) -> int:
        with self._lock:
            return sum(self._items[(owner, w)][1] for w in self._owned.get(owner, ()))


class TraceStoreView:
    """One owner's part of a :class:`SharedTraceStore`, with the TraceStore interface the
    aggregator uses (put, get, ids, nbytes)."""

    def __init__(self, shared: SharedTraceStore, owner: str) -> None:
        self.shared, self.owner = shared, owner

    size_of = staticmethod(trace_nbytes)

    def put(self, wid: str, trace: Trace) -> None:
        self.shared.put(self.owner, wid, trace)

    def get(self, wid: str) -> Optional[Trace]:
        return self.shared.get(self.owner, wid)

    def ids(self) -> list[str]:
        return self.shared.ids(self.owner)

    @property
    def nbytes(self) -> int:
        return self.shared.owner_nbytes(self.owner)
