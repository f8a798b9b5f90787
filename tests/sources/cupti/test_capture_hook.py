"""capture_hook: a listener called before every torch graph capture, and torch left as it was."""

import sys
import types

from graphmon.sources.cupti import capture_hook


def fake_torch(monkeypatch):
    class CUDAGraph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            self.args = (pool, capture_error_mode)
            return "began"

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(graphs=types.SimpleNamespace(CUDAGraph=CUDAGraph))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return CUDAGraph


def test_without_torch_nothing_is_installed(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert capture_hook.install(lambda: None) is False and not capture_hook.installed()


def test_listeners_run_before_the_capture_and_torch_gets_its_method_back(monkeypatch):
    CUDAGraph = fake_torch(monkeypatch)
    own = CUDAGraph.__dict__["capture_begin"]
    calls = []
    a, b = (lambda: calls.append("a")), (lambda: calls.append("b"))
    assert capture_hook.install(a) and capture_hook.install(b) and capture_hook.install(a)  # once each
    g = CUDAGraph()
    assert g.capture_begin(None, capture_error_mode="thread_local") == "began"  # arguments and result pass through
    assert calls == ["a", "b"] and g.args == (None, "thread_local")
    assert CUDAGraph.capture_begin.__name__ == "capture_begin"
    capture_hook.uninstall(a)
    assert capture_hook.installed()  # b still listens
    capture_hook.uninstall(b)
    assert CUDAGraph.__dict__["capture_begin"] is own and not capture_hook.installed()


def test_a_failing_listener_never_stops_the_capture(monkeypatch):
    CUDAGraph = fake_torch(monkeypatch)

    def boom():
        raise RuntimeError("graphmon bug")

    capture_hook.install(boom)
    try:
        assert CUDAGraph().capture_begin() == "began"
    finally:
        capture_hook.uninstall(boom)


def test_a_wrapper_installed_after_ours_is_left_in_place(monkeypatch):
    CUDAGraph = fake_torch(monkeypatch)
    calls = []
    listener = lambda: calls.append("graphmon")  # noqa: E731
    capture_hook.install(listener)
    ours = CUDAGraph.capture_begin

    def theirs(self, *a, **kw):
        calls.append("theirs")
        return ours(self, *a, **kw)

    CUDAGraph.capture_begin = theirs
    capture_hook.uninstall(listener)
    assert CUDAGraph.__dict__["capture_begin"] is theirs  # not undone under someone else's feet
    CUDAGraph().capture_begin()
    assert calls == ["theirs"]  # ours no longer calls anything
