"""bench/overhead/trace_cost.py's alternation and summary, on a synthetic replay whose traced cost per
kernel and first-traced-replay cost are known: no GPU, no CUPTI."""

import numpy as np
import pytest

from bench.overhead import trace_cost as T


def synthetic(kernels: int, base_us: float, per_kernel_ns: float, first_extra_us: float, replays: int = 6):
    calls = []
    rng = np.random.default_rng(0)

    def block(traced: bool) -> dict:
        calls.append(traced)
        gpu = base_us + (kernels * per_kernel_ns / 1e3 if traced else 0.0) + rng.normal(0, 0.5, replays)
        launch = np.full(replays, 5.0)
        step = gpu + launch
        if traced:
            step[0] += first_extra_us
        return {"step_us": step, "gpu_us": gpu, "launch_us": launch, "records": kernels * replays if traced else 0}

    return block, calls


@pytest.mark.parametrize("per_kernel_ns", [0.0, 1800.0])
def test_summary_recovers_known_costs(per_kernel_ns):
    block, calls = synthetic(950, 1650.0, per_kernel_ns, 700.0)
    s = T.summarize(T.alternate(block, 8))
    assert calls.count(True) == calls.count(False) == 8
    assert calls[:2] == [False, True] and calls[2:4] == [True, False]  # the order flips every pair
    assert s["kernels_per_replay"] == 950 and s["blocks"] == 8 and s["replays_on"] == 48
    assert s["traced_ns_per_kernel"] == pytest.approx(per_kernel_ns, abs=5)
    assert s["gpu_us"]["ratio"] == pytest.approx(1 + 950 * per_kernel_ns / 1e3 / 1650.0, rel=0.01)
    assert s["first_step_extra_us"] == pytest.approx(700.0, abs=2)
    assert s["step_us"]["first_off"] == pytest.approx(s["step_us"]["off"], abs=2)


def test_no_records_gives_no_per_kernel_cost():
    block, _ = synthetic(0, 100.0, 0.0, 0.0)
    s = T.summarize(T.alternate(block, 2))
    assert s["kernels_per_replay"] == 0 and np.isnan(s["traced_ns_per_kernel"])


def test_cli_refuses_blocks_too_small(tmp_path):
    with pytest.raises(SystemExit):
        T.main(["--out", str(tmp_path), "--replays", "1"])
