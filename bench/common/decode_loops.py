"""Graph-replay serving loops of the overhead benches (GPU; torch is imported when called). Each
returns (run_once, meta): run_once() runs a few steps and returns their end times (perf_counter s),
the first entry the start."""

from __future__ import annotations

import time

import numpy as np

from bench.common.paths import EXAMPLES, on_path


def decode_server_workload(layers: int, steps_per_call: int):
    """examples/decode_server.py's decode graph (4 streams), replay + synchronize per step."""
    import torch

    on_path(EXAMPLES)
    import decode_server as ds

    model = ds.DecodeModel(layers=layers)
    (g,) = ds.build(model, [1], ["uploaded"])

    def run_once() -> np.ndarray:
        t = np.empty(steps_per_call + 1)
        t[0] = time.perf_counter()
        for i in range(steps_per_call):
            g.replay()
            torch.cuda.synchronize()
            t[i + 1] = time.perf_counter()
        return t  # step end times (perf_counter s), the first one the start

    return run_once, {"config": {"layers": layers, "batch": 1, "sync": "every step"}}


def four_stream_workload(layers: int = 24, sync_every: int = 8, steps_per_call: int = 64):
    """A decode-like client whose host runs ahead: a graph of ``layers`` layers on 4 streams
    (graphmon.gpu.workloads.DecodeModel, side streams doing small matmuls) replayed back to back,
    synchronized every ``sync_every`` replays, so the GPU sets the pace and a step's time is its
    share of the GPU's (the step end times of a group are taken after its synchronize)."""
    import torch

    from graphmon.gpu.workloads import DecodeModel, capture

    model = DecodeModel(layers=layers, side="matmul", side_streams=3)
    r = capture("four_stream/uploaded", model.step, model.input(1), "uploaded")

    def run_once() -> np.ndarray:
        t = np.empty(steps_per_call + 1)
        t[0] = time.perf_counter()
        for i in range(0, steps_per_call, sync_every):
            k = min(sync_every, steps_per_call - i)
            for _ in range(k):
                r.replay()
            torch.cuda.synchronize()
            t0, t1 = t[i], time.perf_counter()
            t[i + 1:i + k + 1] = t0 + (t1 - t0) * np.arange(1, k + 1) / k  # the group's time, evenly
        return t

    return run_once, {"config": {"layers": layers, "streams": 4, "batch": 1, "sync_every": sync_every}}
