"""vLLM integration: vLLM loads every ``vllm.general_plugins`` entry point in each process it
creates (API server, EngineCore, workers), so ``vllm serve`` needs no wrapper.

``register()`` installs graphmon's graph trigger when an agent is named (GRAPHMON_AGENT, e.g. a
sidecar's socket on a shared volume): only the processes that capture CUDA graphs (the workers)
then subscribe to CUPTI and send windows to the agent. Without an agent it does nothing: several
vLLM processes must never each open an exporter port. Cheap and never raises.

It also names the graphs vLLM captures (``label_vllm_graphs``): vLLM V1's ``CUDAGraphWrapper``
captures one graph per batch descriptor (``BatchDescriptor.num_tokens``, the padded batch) inside
the forward context it dispatches with (vllm/compilation/cuda_graph.py; the context holds
``batch_descriptor`` and ``cudagraph_runtime_mode``). graphmon wraps torch's
``CUDAGraph.capture_end`` (called once per capture, never per replay) and, when a vLLM forward
context is set, labels the graph just instantiated ``<mode>_bs<num_tokens>[_uniform][_lora<n>]``
with its batch size: ``full_bs8_uniform`` for a FULL decode graph, ``piecewise_bs8/p3`` for the
4th piece of a PIECEWISE forward (pieces are captured in the model's order). The label is the
graph's name in the metrics and survives a restart whatever the capture order. Older vLLM (V0's
``CUDAGraphRunner``, no batch descriptor) and other engines keep the capture-order names
(``cap<n>``, graphmon.sources.cupti.registry).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from typing import Any, Optional

log = logging.getLogger("graphmon")
_lock = threading.Lock()
_counts: dict[str, int] = {}  # label base -> graphs captured under it in this process


def register() -> None:
    try:
        if os.environ.get("GRAPHMON_ATTACH", "1") == "0" or not os.environ.get("GRAPHMON_AGENT"):
            return
        from graphmon.host import trigger
        from graphmon.host.attach import attach_from_env

        if os.environ.get("GRAPHMON_SUBSCRIBE", "graph") == "off":
            return
        def attach_and_label() -> None:  # the first capture: torch is imported by now
            label_vllm_graphs()
            attach_from_env()

        # idempotent: the sitecustomize hook may have installed the trigger already
        trigger.install(attach_and_label if not label_vllm_graphs() else attach_from_env)
    except Exception as e:  # a plugin must never take vLLM down
        log.warning("graphmon: vLLM plugin failed: %r", e)


def _graph_class() -> Any:
    graphs = getattr(getattr(sys.modules.get("torch"), "cuda", None), "graphs", None)
    return getattr(graphs, "CUDAGraph", None)


def label_vllm_graphs(cls: Any = None, registry: Any = None) -> bool:
    """Wrap ``cls.capture_end`` (default: the imported torch's CUDAGraph) so that each graph vLLM
    captures is labelled by its batch descriptor. False when there is no such class (torch not
    imported: vLLM imports it before loading plugins). Idempotent."""
    cls = cls if cls is not None else _graph_class()
    orig = getattr(cls, "capture_end", None) if cls is not None else None
    if orig is None:
        return False
    if getattr(orig, "__graphmon_labels__", False):
        return True

    @functools.wraps(orig)
    def capture_end(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        try:
            _label_captured(self, registry)
        except Exception as e:  # never break the engine's capture
            log.debug("graphmon: could not label a vLLM graph: %r", e)
        return out

    capture_end.__graphmon_labels__ = True  # type: ignore[attr-defined]
    cls.capture_end = capture_end
    return True


def descriptor_label(ctx: Any) -> Optional[tuple[str, int]]:
    """(label base, batch size) from a vLLM forward context, or None outside a vLLM capture."""
    desc = getattr(ctx, "batch_descriptor", None)
    n = getattr(desc, "num_tokens", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return None
    mode = str(getattr(getattr(ctx, "cudagraph_runtime_mode", None), "name", "") or "graph").lower()
    parts = [mode, f"bs{n}"]
    if getattr(desc, "uniform", False) or getattr(desc, "uniform_decode", False):
        parts.append("uniform")
    if getattr(desc, "has_lora", False):
        parts.append(f"lora{int(getattr(desc, 'num_active_loras', 0) or 0) or ''}")
    return "_".join(parts), n


def _label_captured(graph: Any, registry: Any) -> None:
    fc = sys.modules.get("vllm.forward_context")
    if fc is None:
        return
    try:
        ctx = fc.get_forward_context()
    except Exception:  # no forward context: a capture outside vLLM's dispatch
        return
    got = descriptor_label(ctx)
    if got is None:
        return
    base, n = got
    with _lock:
        k = _counts.get(base, 0)
        _counts[base] = k + 1
    # PIECEWISE: one graph per piece of one forward, in the model's order; FULL: one per batch
    # descriptor (a second capture of one descriptor, e.g. after a wake-up, gets its number).
    name = f"{base}/p{k}" if base.startswith("piecewise_") else (base if k == 0 else f"{base}/{k}")
    from graphmon.sources.cupti.registry import label_graph

    label_graph(graph, name=name, batch_size=n, registry=registry)
