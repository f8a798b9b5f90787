"""GPU: `graphmon run` over Hugging Face static-cache generate (torch.compile reduce-overhead ->
cudagraph trees, legacy default stream). The live per-stream gap medians (windows fetched from
the agent) agree with torch.profiler's on the same workload within 32 ns (graphs matched by
kernels per replay), and no window is empty. Small random-weight Llama; ~90 s on an H200."""

from pathlib import Path

import pytest

from helpers import check_gaps_against_profiler, run_under_agent

pytestmark = pytest.mark.gpu


def test_hf_static_cache_generate_live_matches_profiler(tmp_path):
    pytest.importorskip("transformers")
    traces, prof, metrics, status = run_under_agent(tmp_path, Path(__file__).with_name("hf_workload.py"))
    assert len(status["processes"]) == 1
    check_gaps_against_profiler(traces, prof, metrics)
