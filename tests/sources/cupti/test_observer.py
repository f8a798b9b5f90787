"""Observer effect: CUDA-event timing and the slowdown ratio (sources/cupti/observer.py)."""

import ctypes

import pytest

from graphmon.sources.cupti.observer import CudaEvents, slowdown_ratio


def test_slowdown_ratio_weights_and_minimum():
    per = {1: {"ref": [1.0, 1.0, 1.0], "win": [1.2, 1.2, 1.2]}, 2: {"ref": [2.0] * 3, "win": [2.2] * 9}}
    assert slowdown_ratio(per) == pytest.approx((1.2 * 3 + 1.1 * 9) / 12)
    assert slowdown_ratio({1: {"ref": [1.0], "win": [1.0] * 5}}) is None


class _StubLibcuda:
    """Just the driver calls CudaEvents makes; tracks the context stack depth."""

    def __init__(self, query_rc=0, sync_rc=0):
        self.depth, self.query_rc, self.sync_rc = 0, query_rc, sync_rc

    def cuCtxPushCurrent_v2(self, ctx):
        self.depth += 1
        return 0

    def cuCtxPopCurrent_v2(self, out):
        self.depth -= 1
        return 0

    def cuEventQuery(self, ev):
        return self.query_rc

    def cuEventSynchronize(self, ev):
        return self.sync_rc

    def cuEventElapsedTime_v2(self, out, e0, e1):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_float))[0] = 1.5
        return 0


@pytest.mark.parametrize("rc,want", [(0, True), (600, False), (1, None)])
def test_cuda_events_query_and_context_balance(rc, want):
    lib = _StubLibcuda(query_rc=rc)
    assert CudaEvents(lib).query(1, 2) is want and lib.depth == 0
    lib = _StubLibcuda(sync_rc=rc)
    assert CudaEvents(lib).elapsed_ms(1, 2, 3) == (1.5 if rc == 0 else None) and lib.depth == 0
