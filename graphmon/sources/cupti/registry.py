"""Registry of CUDA graph execs seen in this process: identity, upload mode, labels.

Pure Python (no CUDA): the CUPTI source feeds it from driver-API callbacks, the application
names graphs through :func:`label_graph`. Upload modes (see graphmon.model.trace.UPLOAD_MODES):

- ``instantiate_upload``: instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
- ``uploaded``: cuGraphUpload seen before the exec's first launch;
- ``lazy``: first launch seen with no upload before it (the driver uploads at that launch);
- ``unknown``: the exec existed before graphmon attached, so its history is not known.

Callbacks call into this from the host's threads, so every method is short and holds one lock
for a dict update only.

Graph keys survive a restart: an exec instantiated after attach is ``cap<n>``, the n-th exec this
process instantiated (1-based), which is the same graph in the next process of the same build as
long as it captures in the same order (docs/analysis.md, "Graph identity"). CUPTI's graph ids are
process-local counters; an exec that existed before attach (its instantiation not seen) keeps
``g<graph id>``. The batch size or label the application or engine plugin gives goes beside it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from graphmon.model.trace import GraphInfo

# CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD from cuda.h (stable ABI value).
INSTANTIATE_FLAG_UPLOAD = 2

# Destroyed execs kept so that windows built after a destroy still name their graphs.
MAX_RETIRED = 1024


@dataclass
class _Exec:
    handle: int
    graph_id: int = -1
    known_since_created: bool = False  # instantiation seen after attach
    mode: str = "unknown"
    upload_stream: int = -1
    launched: bool = False
    first_launch_stream: int = -1
    created_s: float = 0.0  # monotonic time of the instantiation (bounds the wait for its first launch)
    first_launch_missed: bool = False  # waited too long: a later first launch is not called lazy
    label: str = ""
    batch_size: int = -1
    order: int = 0  # 1-based instantiation order in this process; 0 = instantiated before attach

    def info(self) -> GraphInfo:
        same = None
        if self.upload_stream != -1 and self.first_launch_stream != -1:
            same = self.upload_stream == self.first_launch_stream
        return GraphInfo(
            key=(f"cap{self.order}" if self.order > 0 else f"g{self.graph_id}" if self.graph_id > 0
                 else f"exec:{self.handle:#x}"),
            graph_id=self.graph_id,
            exec_handle=self.handle,
            upload_mode=self.mode,
            upload_stream=self.upload_stream,
            label=self.label,
            batch_size=self.batch_size,
            upload_stream_is_launch_stream=same,
        )


class GraphRegistry:
    """exec handle -> what is known about that exec. Thread-safe, cheap per call."""

    def __init__(self, graph_exec_id: Optional[Callable[[int], int]] = None) -> None:
        self._lock = threading.Lock()
        self._execs: dict[int, _Exec] = {}
        self._retired: list[_Exec] = []
        self._pending_first_launch = 0  # execs created after attach and not launched yet
        self._labels: dict[int, tuple[str, int]] = {}  # labels given before the exec was seen
        self._instantiated = 0  # execs instantiated since attach: the next one's order - 1
        self.graph_exec_id = graph_exec_id  # resolves exec handle -> CUPTI graph id (source sets it)

    # ------------------------------------------------------------------ callback side
    def _get(self, handle: int) -> _Exec:
        e = self._execs.get(handle)
        if e is None:
            e = self._execs[handle] = _Exec(handle=handle)
            lab = self._labels.get(handle)
            if lab:
                e.label, e.batch_size = lab
        return e

    def on_instantiate(self, handle: int, flags: int = 0, upload_stream: int = -1, graph_id: int = -1) -> None:
        """A new exec (API exit of cuGraphInstantiate*). Replaces a stale entry of a reused handle."""
        if not handle:
            return
        with self._lock:
            old = self._execs.pop(handle, None)
            if old is not None:
                self._retire(old)
            e = self._get(handle)
            e.known_since_created = True
            self._instantiated += 1
            e.order = self._instantiated
            e.created_s = time.monotonic()
            e.graph_id = graph_id
            if flags & INSTANTIATE_FLAG_UPLOAD:
                e.mode = "instantiate_upload"
                e.upload_stream = upload_stream
            else:
                self._pending_first_launch += 1

    def on_upload(self, handle: int, stream: int) -> None:
        if not handle:
            return
        with self._lock:
            e = self._get(handle)
            if e.known_since_created and not e.launched and e.mode == "unknown":
                e.mode = "uploaded"  # upload callbacks are always on: still decidable after the wait
                e.upload_stream = stream
                if not e.first_launch_missed:
                    self._pending_first_launch -= 1
            elif e.upload_stream == -1:
                e.upload_stream = stream  # later upload: remembered, mode unchanged

    def on_launch(self, handle: int, stream: int) -> bool:
        """Returns True on the exec's first launch seen (the moment a lazy upload happens)."""
        if not handle:
            return False
        with self._lock:
            e = self._execs.get(handle) or self._get(handle)
            if e.launched:
                return False
            e.launched = True
            e.first_launch_stream = stream
            if e.known_since_created and e.mode == "unknown" and not e.first_launch_missed:
                e.mode = "lazy"
                self._pending_first_launch -= 1
            return True

    def on_destroy(self, handle: int) -> None:
        with self._lock:
            e = self._execs.pop(handle, None)
            if e is not None:
                if e.known_since_created and not e.launched and e.mode == "unknown" and not e.first_launch_missed:
                    self._pending_first_launch -= 1
                self._retire(e)

    def _retire(self, e: _Exec) -> None:
        self._retired.append(e)
        if len(self._retired) > MAX_RETIRED:
            del self._retired[: len(self._retired) - MAX_RETIRED]

    def expire_first_launches(self, wait_s: float) -> int:
        """Stop waiting for the first launch of execs instantiated more than ``wait_s`` ago.

        The launch callbacks stay on while a first launch is pending (it decides ``lazy``): a
        Python callback on every graph launch of the process. An exec that is instantiated and
        never launched (a warm-up graph, a batch size never served) would keep them on forever
        (measured on the H200: +150 us per decode step outside windows). Such an exec's upload
        mode stays ``unknown``. Returns how many were given up."""
        if self._pending_first_launch <= 0:
            return 0
        cutoff = time.monotonic() - wait_s
        n = 0
        with self._lock:
            for e in self._execs.values():
                if (e.known_since_created and not e.launched and e.mode == "unknown" and not e.first_launch_missed
                        and e.created_s <= cutoff):
                    e.first_launch_missed = True
                    self._pending_first_launch -= 1
                    n += 1
        return n

    @property
    def pending_first_launch(self) -> int:
        """Execs created after attach whose first launch (and so upload mode) is still to come."""
        return self._pending_first_launch

    # ------------------------------------------------------------------ application side
    def label(self, handle: int, name: str = "", batch_size: int = -1) -> None:
        with self._lock:
            self._labels[handle] = (name, batch_size)
            e = self._execs.get(handle)
            if e is not None:
                e.label, e.batch_size = name, batch_size

    # ------------------------------------------------------------------ reader side
    def resolve_ids(self) -> None:
        """Fill in CUPTI graph ids (called from the collector thread, never from callbacks)."""
        if self.graph_exec_id is None:
            return
        with self._lock:
            todo = [e for e in self._execs.values() if e.graph_id <= 0]
        for e in todo:
            try:
                gid = int(self.graph_exec_id(e.handle))
            except Exception:
                continue  # destroyed meanwhile, or CUPTI refused: the exec stays keyed by handle
            with self._lock:
                e.graph_id = gid

    def infos(self) -> list[GraphInfo]:
        """GraphInfo of every exec with a graph id (live first, then retired), one per graph id."""
        with self._lock:
            execs = list(self._execs.values()) + self._retired[::-1]
            out: dict[int, GraphInfo] = {}
            for e in execs:
                if e.graph_id > 0 and e.graph_id not in out:
                    out[e.graph_id] = e.info()
        return list(out.values())

    def get(self, handle: int) -> Optional[GraphInfo]:
        with self._lock:
            e = self._execs.get(handle)
            return None if e is None else e.info()

    def __len__(self) -> int:
        return len(self._execs)


# The process-wide registry: label_graph() works before attach(); the CUPTI source uses it.
REGISTRY = GraphRegistry()


def exec_handle_of(obj) -> int:
    """CUgraphExec handle of a torch.cuda.CUDAGraph, a cuda-bindings CUgraphExec, or an int."""
    if isinstance(obj, int):
        return obj
    raw = getattr(obj, "raw_cuda_graph_exec", None)
    if callable(raw):
        return int(raw())
    getptr = getattr(obj, "getPtr", None)  # cuda-bindings handle objects
    if callable(getptr):
        return int(getptr())
    try:
        return int(obj)
    except (TypeError, ValueError):
        raise TypeError(f"cannot get a CUgraphExec handle from {type(obj).__name__}") from None


def label_graph(graph, name: str = "", batch_size: int = -1, registry: GraphRegistry | None = None) -> int:
    """Name a graph for the metrics (label ``graph``) and give its batch size.

    ``graph``: torch.cuda.CUDAGraph (after capture), a CUgraphExec handle or int. Returns the
    exec handle. Works before or after attach().
    """
    handle = exec_handle_of(graph)
    if not handle:
        raise ValueError("graph has no exec yet (label it after capture)")
    (registry if registry is not None else REGISTRY).label(handle, name=name, batch_size=int(batch_size))
    return handle
