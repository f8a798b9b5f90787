"""bench/overhead/cupti_idle_cost.py's per-call comparison, on a synthetic op whose "on" state costs a
known number of ns per call: no GPU, no CUPTI."""

import time

import pytest

from bench.overhead import cupti_idle_cost as C


class Arm:
    """A state that makes every call of the op ``extra_ns`` slower while it is on."""

    def __init__(self) -> None:
        self.is_on, self.ons, self.offs = False, 0, 0

    def on(self, state: str) -> None:
        self.is_on, self.ons = True, self.ons + 1

    def off(self) -> None:
        self.is_on, self.offs = False, self.offs + 1


@pytest.mark.parametrize("extra_ns", [0, 2000])
def test_compare_recovers_a_known_per_call_cost(extra_ns):
    arm = Arm()

    def op(n: int) -> None:
        for _ in range(n):
            t_end = time.perf_counter_ns() + 3000 + (extra_ns if arm.is_on else 0)
            while time.perf_counter_ns() < t_end:
                pass

    out = C.compare(arm, "synthetic", {"op": (op, 300)}, pairs=16)["op"]
    assert arm.ons == arm.offs == 16 and not arm.is_on  # every "on" block undone after it
    assert out["pairs"] == 16 and out["calls_per_block"] == 300
    lo, hi = out["ci95_ns_per_call"]
    if extra_ns:
        assert 1200 < out["median_ns_per_call"] < 2800 and lo > 0
        assert 25 < out["median_pct"] < 90  # 100*log(5/3) = 51
    else:
        assert abs(out["median_ns_per_call"]) < 700  # (a preempted block moves one pair, not the median)
