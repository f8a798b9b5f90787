"""The GPU half of ``graphmon ab``: measure arms on the current CUDA device (torch).

Builds several graph instances per arm, replays them interleaved, times every replay with CUDA
events *outside* tracing windows, and records kernels inside a few short torch.profiler (Kineto)
windows, read back with graphmon's Kineto reader. The statistics are graphmon.analysis.ab.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Mapping

import numpy as np

from graphmon.analysis.ab import INSTANCE_SEP, ArmData, offset_correlation, split_arms
from graphmon.model.trace import TraceError, concat


def cuda_problem() -> str:
    """'' when torch with a CUDA GPU is here; else what is missing (for one CLI error line)."""
    try:
        import torch
    except ImportError:
        return "torch with CUDA"
    return "" if torch.cuda.is_available() else "a CUDA GPU"


def run_ab(arms: Mapping[str, Callable[[], Callable[[], object]]], *, instances: int = 8, rounds: int = 12,
           replays_per_block: int = 20, windows: int = 3, window_replays: int = 3, warmup: int = 5, seed: int = 0,
           progress: Callable[[str], None] | None = None) -> list[ArmData]:
    """Measure arms on the current CUDA device (torch imported here).

    ``arms`` maps a name to a factory; each call of a factory captures one fresh graph instance
    and returns a callable replaying it once. Per round, every (arm, instance) runs a block of
    ``replays_per_block`` replays in a shuffled order (seeded), each replay timed by CUDA events;
    ``windows`` of those rounds (spread evenly) are followed by a torch.profiler window of
    ``window_replays`` replays per instance, also event-timed (observer slowdown).
    """
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from graphmon.formats.read import read_trace

    say = progress or (lambda s: None)
    names = list(arms)
    if any(INSTANCE_SEP in n for n in names):
        raise TraceError(f"arm names may not contain {INSTANCE_SEP!r}")
    rng = np.random.default_rng(seed)
    reps = {}
    for n in names:
        reps[n] = [arms[n]() for _ in range(instances)]
    torch.cuda.synchronize()
    for n in names:
        for r in reps[n]:
            for _ in range(warmup):
                r()
    torch.cuda.synchronize()
    say(f"built {instances} instances of {len(names)} arms")
    order = [(n, i) for n in names for i in range(instances)]
    step = {n: [[] for _ in range(instances)] for n in names}
    traced = {n: [[] for _ in range(instances)] for n in names}
    window_after = set(np.linspace(0, rounds - 1, windows).round().astype(int).tolist()) if windows else set()
    parts = {n: [] for n in names}
    corr_offset = 0

    def block(replay, count):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        ev[0].record()
        for k in range(count):
            replay()
            ev[k + 1].record()
        return ev

    for rd in range(rounds):
        pending = []
        for j in rng.permutation(len(order)):
            n, i = order[j]
            pending.append((n, i, block(reps[n][i], replays_per_block)))
        torch.cuda.synchronize()
        for n, i, ev in pending:
            step[n][i].extend(ev[k].elapsed_time(ev[k + 1]) * 1e3 for k in range(len(ev) - 1))
        if rd in window_after:
            pending = []
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for j in rng.permutation(len(order)):
                    n, i = order[j]
                    with record_function(f"{n}{INSTANCE_SEP}{i}"):
                        pending.append((n, i, block(reps[n][i], window_replays)))
                torch.cuda.synchronize()
            for n, i, ev in pending:
                traced[n][i].extend(ev[k].elapsed_time(ev[k + 1]) * 1e3 for k in range(len(ev) - 1))
            with tempfile.TemporaryDirectory() as td:
                path = os.path.join(td, "window.json")
                prof.export_chrome_trace(path)
                t = read_trace(path, progress=False)
            # Kineto keys graphs by a signature that includes the label's index in that window, so the
            # same key can name different instances in two windows: key by label instead.
            t = t.with_graphs([replace(g, key=g.label or g.key) for g in t.graphs])
            t = offset_correlation(t, corr_offset)
            corr_offset = int(t.correlation_id.max()) + 1 if len(t) else corr_offset
            for n, tt in split_arms(t, names).items():
                parts[n].append(tt)
            say(f"round {rd + 1}/{rounds}: window with {len(t)} kernels")
    out = []
    for n in names:
        tr = concat(parts[n]) if parts[n] else None
        out.append(ArmData(name=n, step_us=np.array(step[n]),
                           traced_step_us=np.array(traced[n]) if windows else None, trace=tr))
    return out


def environment() -> dict:
    """Versions of what ran (for the report)."""
    import platform

    env = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            try:
                import subprocess

                env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=20).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                pass
    except ImportError:
        pass
    from graphmon.version import __version__

    env["graphmon"] = __version__
    return env
