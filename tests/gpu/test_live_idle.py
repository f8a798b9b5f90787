"""On a real GPU: unsubscribed from CUPTI between windows (idle_unsubscribe_s), windows still
come whole, and a graph captured while idle still has its upload mode (capture_hook)."""

import os
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def _run_until(pred, graphs, timeout=20.0) -> bool:
    import torch

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
    return False


def test_idle_between_windows_and_a_capture_while_idle():
    import numpy as np
    import torch

    import decode_server as ds
    import graphmon
    from graphmon.host.attach import attached

    graphmon.attach(port=0, interval_s=0.4, first_window_s=0.2, idle_unsubscribe_s=0.2, max_traced_share=1.0)
    try:
        src = attached().source
        windows = []
        src.taps.append(windows.append)
        src.wait_started(10)
        # (not 'blocked': run in a process where torch.profiler has not run, see scripts/gpu_check.sh)
        assert src.health().state == "running", src.health()
        model = ds.DecodeModel(layers=4)
        (up,) = ds.build(model, [1], ["uploaded"])
        # windows go on while the collector unsubscribes after each one and subscribes for the next
        assert _run_until(lambda: src.stats["resubscribes"] >= 2 and len(windows) >= 3, [up]), dict(src.stats)
        st = dict(src.stats)
        assert st["idle_unsubscribes"] >= 2, st
        w = windows[-1]
        t = w.trace.select(w.trace.graph >= 0)
        u, cnt = np.unique(t.correlation_id, return_counts=True)
        assert len(u) >= 2 and len(set(cnt.tolist())) == 1, (len(u), set(cnt.tolist()))  # whole replays
        assert {g.label: g.upload_mode for g in w.trace.graphs}.get(up.name) == "uploaded"
        # a capture while unsubscribed: torch's capture_begin subscribes first, so its
        # instantiation is seen and its first launch decides 'lazy'
        assert _run_until(lambda: not src.subscribed, [up], 10), dict(src.stats)
        n_resub = src.stats["resubscribes"]
        (lazy,) = ds.build(model, [1], ["lazy"])
        assert src.stats["resubscribes"] >= n_resub + 1
        n = len(windows)
        assert _run_until(lambda: len(windows) >= n + 2, [up, lazy])
        modes = {g.label: g.upload_mode for g in windows[-1].trace.graphs}
        assert modes.get(lazy.name) == "lazy" and modes.get(up.name) == "uploaded", modes
        bad = {"unsubscribe", "capture_subscribe", "capture_hook", "collector", "setup", "callback", "flush_forced"}
        assert not bad & set(src.health().errors), src.health().errors
        torch.cuda.synchronize()
    finally:
        graphmon.detach()
