"""graphmon.host.vllm_plugin names the graphs vLLM captures by batch descriptor: a fake module
shaped like vLLM V1 (vllm.forward_context with BatchDescriptor and the runtime mode; capture
through torch.cuda.graph, as CUDAGraphWrapper does)."""

from __future__ import annotations

import enum
import sys
import types
from typing import NamedTuple

import pytest

import graphmon.host.vllm_plugin as plugin
from graphmon.sources.cupti.registry import GraphRegistry


class BatchDescriptor(NamedTuple):  # vllm/forward_context.py (recent V1)
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


class FakeGraph:
    """torch.cuda.CUDAGraph's surface: capture_end instantiates; raw_cuda_graph_exec names the exec."""

    handles = iter(range(0x1000, 0x100000, 0x10))

    def __init__(self, registry):
        self.registry = registry
        self.h = 0

    def capture_begin(self):
        pass

    def capture_end(self):
        self.h = next(FakeGraph.handles)
        self.registry.on_instantiate(self.h, graph_id=self.h)  # what CUPTI's callback does

    def raw_cuda_graph_exec(self):
        return self.h


@pytest.fixture
def vllm(monkeypatch):
    ctx = {"now": None}
    fc = types.ModuleType("vllm.forward_context")
    fc.BatchDescriptor = BatchDescriptor

    def get_forward_context():
        assert ctx["now"] is not None, "Forward context is not set."  # vLLM asserts the same way
        return ctx["now"]

    fc.get_forward_context = get_forward_context
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.forward_context", fc)
    monkeypatch.setattr(plugin, "_counts", {})
    cls = type("CUDAGraph", (FakeGraph,), {})  # a fresh class per test: the wrapper patches it
    return ctx, cls


def _capture(ctx, cls, registry, mode, desc):
    """What CUDAGraphWrapper.__call__ does for an entry without a graph: capture inside the context."""
    ctx["now"] = types.SimpleNamespace(batch_descriptor=desc, cudagraph_runtime_mode=mode)
    g = cls(registry)
    g.capture_begin()
    g.capture_end()
    ctx["now"] = None
    return registry.get(g.h)


def test_vllm_graphs_are_named_by_batch_descriptor(vllm):
    ctx, cls = vllm
    r = GraphRegistry()
    assert plugin.label_vllm_graphs(cls, registry=r) and plugin.label_vllm_graphs(cls, registry=r)  # idempotent
    full = [_capture(ctx, cls, r, CUDAGraphMode.FULL, BatchDescriptor(n, n, uniform=True)) for n in (8, 4, 2, 1)]
    assert [(g.label, g.batch_size) for g in full] == [
        ("full_bs8_uniform", 8), ("full_bs4_uniform", 4), ("full_bs2_uniform", 2), ("full_bs1_uniform", 1)]
    assert [g.key for g in full] == ["cap1", "cap2", "cap3", "cap4"]  # the capture order stays the key
    pieces = [_capture(ctx, cls, r, CUDAGraphMode.PIECEWISE, BatchDescriptor(n)) for n in (8, 8, 8, 4, 4, 4)]
    assert [g.label for g in pieces] == ["piecewise_bs8/p0", "piecewise_bs8/p1", "piecewise_bs8/p2",
                                         "piecewise_bs4/p0", "piecewise_bs4/p1", "piecewise_bs4/p2"]
    lora = _capture(ctx, cls, r, CUDAGraphMode.FULL, BatchDescriptor(8, 8, uniform=True, has_lora=True,
                                                                     num_active_loras=2))
    assert lora.label == "full_bs8_uniform_lora2"
    again = _capture(ctx, cls, r, CUDAGraphMode.FULL, BatchDescriptor(8, 8, uniform=True))
    assert again.label == "full_bs8_uniform/1"  # a second capture of one descriptor stays apart


def test_a_restart_with_another_capture_order_keeps_the_names(vllm):
    ctx, cls = vllm
    first, second = GraphRegistry(), GraphRegistry()
    plugin.label_vllm_graphs(cls, registry=first)
    a = {_capture(ctx, cls, first, CUDAGraphMode.FULL, BatchDescriptor(n, n, uniform=True)).label for n in (1, 2, 4)}
    plugin._counts.clear()  # a new process
    cls.capture_end = cls.capture_end.__wrapped__
    plugin.label_vllm_graphs(cls, registry=second)
    b = {_capture(ctx, cls, second, CUDAGraphMode.FULL, BatchDescriptor(n, n, uniform=True)).label for n in (4, 1, 2)}
    assert a == b == {"full_bs1_uniform", "full_bs2_uniform", "full_bs4_uniform"}


def test_captures_outside_vllm_are_left_alone(vllm, monkeypatch):
    ctx, cls = vllm
    r = GraphRegistry()
    plugin.label_vllm_graphs(cls, registry=r)
    g = cls(r)
    g.capture_end()  # no forward context: vLLM's get_forward_context asserts; nothing is labelled
    assert r.get(g.h).label == "" and r.get(g.h).key == "cap1"
    ctx["now"] = types.SimpleNamespace(batch_descriptor=None, cudagraph_runtime_mode=CUDAGraphMode.NONE)
    g2 = cls(r)
    g2.capture_end()
    assert r.get(g2.h).label == ""
    monkeypatch.delitem(sys.modules, "vllm.forward_context")
    ctx["now"] = types.SimpleNamespace(batch_descriptor=BatchDescriptor(8), cudagraph_runtime_mode=CUDAGraphMode.FULL)
    g3 = cls(r)
    g3.capture_end()
    assert r.get(g3.h).label == ""  # not a vLLM process


def test_a_failing_label_never_breaks_the_capture(vllm):
    ctx, cls = vllm
    r = GraphRegistry()
    plugin.label_vllm_graphs(cls, registry=r)
    cls.raw_cuda_graph_exec = lambda self: (_ for _ in ()).throw(RuntimeError("no exec"))
    g = _capture(ctx, cls, r, CUDAGraphMode.FULL, BatchDescriptor(8, 8, uniform=True))
    assert g is not None and g.label == ""


def test_no_torch_class_no_wrapper(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert plugin.label_vllm_graphs() is False
    assert plugin.descriptor_label(types.SimpleNamespace(batch_descriptor=BatchDescriptor(-1))) is None
