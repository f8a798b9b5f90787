"""Call graphmon back on the capturing thread before every torch CUDA graph capture begins.

Two listeners use it. host/trigger.py: a process subscribes to CUPTI at its first capture (then
its listener leaves). CuptiSource with ``idle_unsubscribe_s`` set: unsubscribed from CUPTI
between windows, it would not see a graph instantiated meanwhile (upload mode 'unknown'), so a
capture subscribes it again first. Every torch capture (torch.cuda.graph, which vLLM, SGLang and
torch.compile's CUDA graph trees use) begins in ``torch.cuda.graphs.CUDAGraph.capture_begin``;
wrapping it lets the source subscribe again before the capture's instantiation. Why by hand:
torch has no hook for graph capture, and this is one method on one class.

Never imports torch: installs only where the process already has it.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, Optional

_LOCK = threading.Lock()
_LISTENERS: list[Callable[[], None]] = []
_PATCHED: Optional[tuple[Any, Any]] = None  # (class, its own capture_begin)


def _graph_class() -> Any:
    torch = sys.modules.get("torch")
    graphs = getattr(getattr(torch, "cuda", None), "graphs", None) if torch is not None else None
    cls = getattr(graphs, "CUDAGraph", None)
    return cls if cls is not None and callable(getattr(cls, "capture_begin", None)) else None


def _wrap(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def capture_begin(self, *args, **kwargs):
        for fn in tuple(_LISTENERS):
            try:
                fn()
            except Exception:  # graphmon never raises into the host
                pass
        return orig(self, *args, **kwargs)

    capture_begin.__graphmon_wrapped__ = orig  # type: ignore[attr-defined]
    return capture_begin


def install(listener: Callable[[], None], cls: Any = None) -> bool:
    """Call ``listener()`` on the capturing thread before each torch graph capture begins, on
    ``cls`` (default: torch.cuda.graphs.CUDAGraph of the torch already imported). False where
    there is none yet (call again later), or when another class is wrapped already."""
    global _PATCHED
    with _LOCK:
        cls = cls if cls is not None else _graph_class()
        if cls is None or (_PATCHED is not None and _PATCHED[0] is not cls):
            return False
        if listener not in _LISTENERS:
            _LISTENERS.append(listener)
        if _PATCHED is None:
            orig = cls.__dict__.get("capture_begin", cls.capture_begin)
            cls.capture_begin = _wrap(orig)
            _PATCHED = (cls, orig)
        return True


def uninstall(listener: Callable[[], None]) -> None:
    """Stop calling ``listener``; the last one out puts torch's method back."""
    global _PATCHED
    with _LOCK:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)
        if not _LISTENERS and _PATCHED is not None:
            cls, orig = _PATCHED
            if getattr(cls.__dict__.get("capture_begin"), "__graphmon_wrapped__", None) is orig:
                cls.capture_begin = orig  # only ours is replaced: a later wrapper of someone else's stays
            _PATCHED = None


def installed() -> bool:
    return _PATCHED is not None
