"""In-code attach: the light collector when an agent is named, else the whole exporter in-process.

``attach()`` never raises into the host: a failure is logged and returns None (monitoring
must not take serving down). It is idempotent: a second call warns and returns the first
result. With ``GRAPHMON_AGENT`` set (``graphmon run``, a sidecar agent) it starts only the CUPTI
source and the link to the agent (graphmon.host.link): no port, no analysis in this process.
Without it, it runs the exporter (analysis, snapshots, HTTP) in this process as before.
``graphmon run``/``record`` live in graphmon.host.launch.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import warnings
from typing import Any, Optional

log = logging.getLogger("graphmon")

ATTACH_ENV = "GRAPHMON_ATTACH_JSON"  # CUPTI settings for the sitecustomize hook (JSON)
AGENT_ENV = "GRAPHMON_AGENT"  # the agent's Unix socket path


def source_keys() -> frozenset:
    """attach() keywords that are CUPTI settings (graphmon.settings.CuptiSettings: the one source)."""
    from graphmon.settings import CuptiSettings

    return frozenset(CuptiSettings.model_fields)

_lock = threading.Lock()
_state: Optional["_Attached"] = None


def _forget_after_fork() -> None:
    # fork() copies only the calling thread: the child has no collector, refresher or HTTP thread,
    # and locks those threads held stay held forever. The child starts detached (inert; attach()
    # there starts afresh) so that its atexit detach() neither waits on those locks nor calls
    # into the parent's CUPTI subscription.
    global _state, _lock
    _state = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class _Attached:
    def __init__(self, source, exporter, recorder, light=None) -> None:
        self.source, self.exporter, self.recorder, self.light = source, exporter, recorder, light


class Recorder:
    """Keeps windows for ``graphmon record`` and saves them as one native-format trace, with each
    window's untraced replay durations (their graph indices re-indexed to the merged trace's
    graphs; rows that name no graph of their window are counted in meta ``untraced_left_out``).
    Bounded as the windows are: ``windows`` of them (0: until saved), each window's untraced
    rows already capped by its collector."""

    def __init__(self, path: str, windows: int = 0) -> None:
        self.path, self.max_windows = path, int(windows)
        self.who = ""  # the process it records, for messages ("rank 0 (pid 12)")
        self.traces: list = []
        self.untraced: list = []  # per window: (its untraced rows, the graphs they index)
        self.observer_slowdowns: list = []
        self.lock = threading.Lock()
        self.saved = False
        self.done = threading.Event()

    def __call__(self, window) -> None:
        with self.lock:
            if self.max_windows and len(self.traces) >= self.max_windows:
                return
            self.traces.append(window.trace)
            self.untraced.append((window.untraced, window.trace.graphs))
            self.observer_slowdowns.append(window.observer_slowdown)
            full = self.max_windows and len(self.traces) >= self.max_windows
        if full:
            self.save()
            self.done.set()

    def save(self) -> Optional[str]:
        """Write the windows (once); the path written, or None when there was no window."""
        from graphmon.model.trace import concat

        with self.lock:
            if self.saved:
                return self.path  # saved when its last window came: the same file
            if not self.traces:
                return None
            from dataclasses import replace

            from graphmon.formats.native import write_trace
            from graphmon.model.window import reindex_untraced

            t = concat(self.traces)
            untraced, left_out = reindex_untraced(self.untraced, t.graphs)
            meta = dict(t.meta)
            meta.update(windows=len(self.traces), observer_slowdown=[s for s in self.observer_slowdowns])
            if left_out:
                meta["untraced_left_out"] = left_out
            write_trace(replace(t, meta=meta), self.path, untraced=untraced)
            self.saved = True
            return self.path


def _local_rank() -> int:
    from graphmon.settings import local_rank

    return local_rank()


def attach(*, cupti: Any = None, serve: bool = True, record_path: Optional[str] = None,
           record_windows: int = 0, **settings) -> Optional[Any]:
    """Start CUPTI collection. With ``GRAPHMON_AGENT`` set: the light collector, which sends
    windows to the agent (returns the LightCollector). Otherwise the exporter in-process (+ HTTP
    on port + LOCAL_RANK; returns the Exporter), or the CuptiSource in record mode. None when
    attaching failed (logged, never raised)."""
    global _state
    with _lock:
        if _state is not None:
            warnings.warn("graphmon is already attached in this process; attach() ignored", stacklevel=2)
            return _state.light or _state.exporter or _state.source
        try:
            from graphmon.settings import CuptiSettings

            # CUPTI knobs go to CuptiSettings (which also reads GRAPHMON_<FIELD>), the rest to Settings
            src_kw = {k: settings.pop(k) for k in list(settings) if k in CuptiSettings.model_fields}
            agent = os.environ.get(AGENT_ENV)
            if agent and not record_path:
                from graphmon.host.link import LightCollector

                light = LightCollector(agent, cupti=cupti, settings=CuptiSettings(**src_kw))
                light.start()
                _state = _Attached(light.source, None, None, light)
                atexit.register(detach)
                return light
            from graphmon.sources.cupti.collector import CuptiSource

            source = CuptiSource(cupti=cupti, settings=CuptiSettings(**src_kw))
            recorder = exporter = None
            if record_path:
                recorder = Recorder(_rank_path(record_path), record_windows)
                source.start(recorder)
                source.wait_started()  # as the light collector does: graphs captured next are seen whole
                if record_windows:
                    # enough windows: stop tracing (from another thread: the sink runs on the collector)
                    threading.Thread(target=lambda: recorder.done.wait() and source.stop(),
                                     name="graphmon-record-stop", daemon=True).start()
            else:
                from graphmon.export.exporter import Exporter
                from graphmon.settings import Settings

                base = int(settings["port"]) if "port" in settings else Settings().port  # env too
                settings["port"] = base + _local_rank() if base else 0  # 0: any free port
                exporter = Exporter(source, Settings(**settings))
                exporter.start()
                source.wait_started()  # as the light collector does: graphs captured next are seen whole
                if serve:
                    try:
                        exporter.serve_background()
                    except Exception:
                        exporter.stop(timeout_s=2.0)
                        raise
            _state = _Attached(source, exporter, recorder)
            atexit.register(detach)
            return exporter or source
        except Exception as e:
            log.warning("graphmon: attach failed, serving continues without it: %r", e)
            return None


def _rank_path(path: str) -> str:
    """One file per process when several ranks record to the same path."""
    lr = os.environ.get("LOCAL_RANK")
    rank = os.environ.get("RANK", lr)
    if rank is None:
        return path
    root, ext = path, ""
    for suffix in (".graphmon.npz", ".npz"):
        if path.endswith(suffix):
            root, ext = path[: -len(suffix)], suffix
            break
    return f"{root}.rank{rank}{ext}"


def detach(timeout_s: float = 5.0) -> None:
    """Stop collection and the HTTP thread; saves a recording. Safe to call twice."""
    global _state
    with _lock:
        st, _state = _state, None
    if st is None:
        return
    try:
        if st.light is not None:
            st.light.stop(timeout_s=timeout_s)
        elif st.exporter is not None:
            st.exporter.stop(timeout_s=timeout_s)
        else:
            st.source.stop(timeout_s=timeout_s)
        if st.recorder is not None:
            path = st.recorder.save()
            if path:
                log.warning("graphmon: recorded %d windows to %s", len(st.recorder.traces), path)
    except Exception as e:
        log.warning("graphmon: detach error: %r", e)


def attached() -> Optional[_Attached]:
    return _state


def label_graph(graph, name: str = "", batch_size: int = -1) -> Optional[int]:
    """Name a captured graph (torch.cuda.CUDAGraph or exec handle) for the metrics. Never raises."""
    from graphmon.sources.cupti.registry import label_graph as _label

    try:
        return _label(graph, name=name, batch_size=batch_size)
    except Exception as e:
        log.warning("graphmon: label_graph failed: %r", e)
        return None




def attach_from_env() -> Optional[Any]:
    """What the hook calls when a process captures its first graph: attach with the CUPTI
    source options ``graphmon run`` put in GRAPHMON_ATTACH_JSON."""
    kwargs = json.loads(os.environ.get(ATTACH_ENV) or "{}")
    return attach(**{k: v for k, v in kwargs.items() if k in source_keys()})
