"""In-process attach: CUPTI source + exporter + HTTP thread, and ``graphmon run``/``record``.

``attach()`` never raises into the host: a failure is logged and returns None (monitoring
must not take serving down). It is idempotent: a second call warns and returns the first
exporter. ``run_command`` starts a command with a ``sitecustomize`` that attaches in the new
Python process(es) without code changes.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from typing import Any, Optional, Sequence

log = logging.getLogger("graphmon")

ATTACH_ENV = "GRAPHMON_ATTACH_JSON"  # attach() kwargs for the sitecustomize hook (JSON)
ATTACHED_ENV = "GRAPHMON_ATTACHED_LOCAL_RANK"  # set by an attached process for its children

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
    def __init__(self, source, exporter, recorder) -> None:
        self.source, self.exporter, self.recorder = source, exporter, recorder


class Recorder:
    """Keeps windows for ``graphmon record`` and saves them as one native-format trace."""

    def __init__(self, path: str, windows: int = 0) -> None:
        self.path, self.max_windows = path, int(windows)
        self.traces: list = []
        self.observer_slowdowns: list = []
        self.lock = threading.Lock()
        self.saved = False
        self.done = threading.Event()

    def __call__(self, window) -> None:
        with self.lock:
            if self.max_windows and len(self.traces) >= self.max_windows:
                return
            self.traces.append(window.trace)
            self.observer_slowdowns.append(window.observer_slowdown)
            full = self.max_windows and len(self.traces) >= self.max_windows
        if full:
            self.save()
            self.done.set()

    def save(self) -> Optional[str]:
        from graphmon.model.trace import concat

        with self.lock:
            if self.saved or not self.traces:
                return None
            t = concat(self.traces)
            meta = dict(t.meta)
            meta.update(windows=len(self.traces), observer_slowdown=[s for s in self.observer_slowdowns])
            from dataclasses import replace

            from graphmon.formats.native import write_trace

            write_trace(replace(t, meta=meta), self.path)
            self.saved = True
            return self.path


def _local_rank() -> int:
    from graphmon.settings import local_rank

    return local_rank()


def attach(*, cupti: Any = None, serve: bool = True, record_path: Optional[str] = None,
           record_windows: int = 0, **settings) -> Optional[Any]:
    """Start CUPTI collection + exporter (+ HTTP on port + LOCAL_RANK). Returns the Exporter
    (or the CuptiSource in record mode), None when attaching failed (logged, never raised)."""
    global _state
    with _lock:
        if _state is not None:
            warnings.warn("graphmon is already attached in this process; attach() ignored", stacklevel=2)
            return _state.exporter or _state.source
        try:
            from graphmon.settings import CuptiSettings
            from graphmon.sources.cupti.collector import CuptiSource

            # CUPTI knobs go to CuptiSettings (which also reads GRAPHMON_<FIELD>), the rest to Settings
            src_kw = {k: settings.pop(k) for k in list(settings) if k in CuptiSettings.model_fields}
            source = CuptiSource(cupti=cupti, settings=CuptiSettings(**src_kw))
            recorder = exporter = None
            if record_path:
                recorder = Recorder(_rank_path(record_path), record_windows)
                source.start(recorder)
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
                if serve:
                    try:
                        exporter.serve_background()
                    except Exception:
                        exporter.stop(timeout_s=2.0)
                        raise
            _state = _Attached(source, exporter, recorder)
            os.environ[ATTACHED_ENV] = str(os.environ.get("LOCAL_RANK", ""))
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
        if st.exporter is not None:
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


# ---------------------------------------------------------------------- graphmon run / record
_SITECUSTOMIZE = '''\
# Written by graphmon run: attach graphmon in this Python process, then run any other
# sitecustomize that was on the path (chained).
import os as _os, sys as _sys


def _graphmon_chain():
    import importlib.machinery, importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


def _graphmon_attach():
    if _os.environ.get("GRAPHMON_ATTACH", "1") == "0":
        return
    argv0 = _os.path.basename(_sys.argv[0]) if _sys.argv and _sys.argv[0] else ""
    if argv0 in ("torchrun",) or _sys.argv[:1] and _sys.argv[0].endswith("torch/distributed/run.py"):
        return  # a launcher process: its workers attach, one per LOCAL_RANK
    done = _os.environ.get("GRAPHMON_ATTACHED_LOCAL_RANK")
    if done is not None and done == _os.environ.get("LOCAL_RANK", ""):
        return  # a parent of the same rank already attached (e.g. a helper subprocess)
    try:
        import json
        from graphmon.host.attach import attach
        attach(**json.loads(_os.environ.get("GRAPHMON_ATTACH_JSON", "{}")))
    except Exception as e:  # never break the host program
        print(f"graphmon: attach failed: {e!r}", file=_sys.stderr)


try:
    _graphmon_chain()
except Exception as _e:
    print(f"graphmon: chained sitecustomize failed: {_e!r}", file=_sys.stderr)
_graphmon_attach()
'''


def hook_dir() -> str:
    """A fresh directory holding graphmon's sitecustomize.py."""
    d = tempfile.mkdtemp(prefix="graphmon-hook-")
    with open(os.path.join(d, "sitecustomize.py"), "w") as fh:
        fh.write(_SITECUSTOMIZE)
    return d


def command_env(settings: dict, env: Optional[dict] = None) -> dict:
    """Environment for a command that should attach graphmon: PYTHONPATH + attach kwargs."""
    env = dict(os.environ if env is None else env)
    d = hook_dir()
    # graphmon itself must be importable by the child (editable installs are; make sure).
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [d, pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[ATTACH_ENV] = json.dumps(settings)
    env.pop(ATTACHED_ENV, None)
    return env


def run_command(argv: Sequence[str], settings: Optional[dict] = None) -> int:
    """Run ``argv`` with graphmon attached in its Python process(es); returns its exit code.

    ``settings``: attach() keyword arguments (exporter Settings fields, CUPTI source options,
    ``record_path``/``record_windows`` for record mode). SIGINT/SIGTERM are forwarded.
    """
    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("graphmon run: no command given (usage: graphmon run -- python serve.py ...)", file=sys.stderr)
        return 2
    env = command_env(dict(settings or {}))
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        print(f"graphmon run: command not found: {argv[0]}", file=sys.stderr)
        return 127
    old = {}

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except Exception:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread
            pass
    try:
        return proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def record_command(argv: Sequence[str], output: str, windows: int = 0, settings: Optional[dict] = None) -> int:
    """``graphmon record -o FILE --windows N -- cmd``: attach in record mode, save on exit/N windows."""
    s = dict(settings or {})
    s.update(record_path=os.path.abspath(output), record_windows=int(windows))
    return run_command(argv, s)
