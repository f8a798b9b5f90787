"""Recent windows kept for GET /trace/{id}, bounded by count and bytes (oldest evicted)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

from graphmon.model.trace import Trace


class TraceStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, tuple[Trace, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0

    @staticmethod
    def size_of(trace: Trace) -> int:
        return int(sum(getattr(trace, k).nbytes for k in ("start_ns", "end_ns", "device", "stream", "graph_id",
                                                           "graph_node_id", "correlation_id", "name_id", "graph")))

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
