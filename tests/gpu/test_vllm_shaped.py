"""GPU: a vLLM-shaped spawn tree (API server -> EngineCore -> workers with the local rank as an
argument) under `graphmon run`, a torch.compile'd decode step in each worker: only the workers
attach, each with its physical GPU; live per-stream gap medians agree with torch.profiler's within
32 ns; no window is empty."""

from pathlib import Path

import pytest

from helpers import check_gaps_against_profiler, run_under_agent

pytestmark = pytest.mark.gpu


def test_vllm_shaped_tree_only_workers_attach_and_match_profiler(tmp_path):
    import torch

    n = min(2, torch.cuda.device_count())
    traces, prof, metrics, status = run_under_agent(tmp_path, Path(__file__).with_name("vllm_shaped_workload.py"))
    procs = status["processes"]
    assert len(procs) == n, procs  # the API server and the EngineCore replay no graph: never attach
    assert sorted(p["device"] for p in procs) == [str(i) for i in range(n)]
    assert all(p["uuid"].startswith("GPU-") and p["pci_bus_id"] for p in procs)
    assert len(prof) == n
    check_gaps_against_profiler(traces, prof, metrics)
