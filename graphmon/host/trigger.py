"""Subscribe to CUPTI only in processes that capture CUDA graphs.

The trigger is the first ``torch.cuda.CUDAGraph.capture_begin`` call. Every torch graph path
goes through it: ``torch.cuda.graph(...)`` (manual capture, SGLang, vLLM), ``make_graphed_callables``
and torch.compile's cudagraph trees (``mode="reduce-overhead"``), which capture with
``torch.cuda.graph`` on a ``torch.cuda.CUDAGraph``. Why this trigger: it costs one Python call
per *capture* (never per replay: the wrapper removes itself after firing), it fires before the
first graph is instantiated (so its upload mode is known), and it needs no CUDA call of ours.
API servers, tokenizers and inductor compile workers capture no graph and never subscribe.

The wrapper is installed by a post-import hook: a meta-path finder that reacts to one module
name, ``torch.cuda.graphs`` (imported by ``import torch``), patches the class after the module ran,
and then removes itself. Graphs captured outside torch (e.g. TensorRT-LLM's C++ runtime) need
``GRAPHMON_SUBSCRIBE=start`` instead.

libcupti: nothing CUPTI-related happens before torch is imported and a graph is captured, so the
libcupti.so.13 that torch (Kineto) loaded with ``import torch`` is the one cupti-python gets (same
soname, already loaded): torch's copy wins, deterministically.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable, Optional

from graphmon.sources.cupti import capture_hook

TARGET = "torch.cuda.graphs"
_fired = threading.Event()
_lock = threading.Lock()
_callback: Optional[Callable[[], None]] = None


def fired() -> bool:
    return _fired.is_set()


def _fire() -> None:
    with _lock:
        if _fired.is_set():
            return
        _fired.set()
        cb = _callback
    if cb is not None:
        try:
            cb()
        except Exception as e:  # never break the host's capture
            print(f"graphmon: starting the collector failed: {e!r}", file=sys.stderr)


def _fire_once() -> None:
    # leave first: with no other listener, later captures are exactly torch's again
    capture_hook.uninstall(_fire_once)
    _fire()


def patch_graph_class(cls) -> bool:
    """Wrap ``cls.capture_begin`` (capture_hook) so that the first capture fires the callback."""
    if _fired.is_set():
        return False
    return capture_hook.install(_fire_once, cls)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _uninstall_finder()
        cls = getattr(module, "CUDAGraph", None)
        if cls is not None and not _fired.is_set():
            patch_graph_class(cls)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None  # one string compare per import: the hook's whole cost elsewhere
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def _uninstall_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def install(callback: Callable[[], None]) -> None:
    """Call ``callback`` (once, on the capturing thread) when the process captures its first
    torch CUDA graph. Works whether or not torch is already imported."""
    global _callback
    _callback = callback
    mod = sys.modules.get(TARGET)
    if mod is not None and getattr(mod, "CUDAGraph", None) is not None:
        patch_graph_class(mod.CUDAGraph)
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
