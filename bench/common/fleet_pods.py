"""The engine pods of bench/deploy/fleet.py: each build's graph (a real decode model on the GPU, the
fake GPU of tests/fake_site in a dry run), the pod process (its untraced truth, then graphmon
attached and replaying), and each pod's turn on the one GPU."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
from contextlib import contextmanager

import numpy as np

GRAPH = "decode_bs1"  # the label of every pod's graph, in every process of any build
FAKE_KNOBS = ("EXTRA_GAP_NS", "TRACED_EXTRA_GAP_NS", "EXTRA_KERNEL_NS", "LAYERS")  # tests/fake_site/torch/cuda/graphs.py
# build kind: (the fake GPU's knobs, graphmon.gpu.workloads.DecodeModel's keywords plus extra_ratio)
BUILDS = {
    "original": ({}, {}),
    # a tiny device-to-device copy node after every kernel: every gap wider, traced and untraced
    "memcpy": ({"EXTRA_GAP_NS": 1500}, {"memcpy": True}),
    # the base of the two acceptance workloads; on the fake a longer graph (16 layers, 141 us), so
    # that 1% of it is >= the rules' 1 us
    "long": ({"LAYERS": 16}, {}),
    # an event-record node on the main stream of 3 of the 48 layers: on the H200 (issue 36) faster
    # untraced while tracing serialises each node (15-50 us). The fake: every gap 200 ns shorter,
    # 1500 ns longer only while traced
    "eventrec": ({"LAYERS": 16, "EXTRA_GAP_NS": -200, "TRACED_EXTRA_GAP_NS": 1500}, {"event_layers": (7, 23, 39)}),
    # one more kernel of known length per replay, ~1% of the replay: GPU, a torch.cuda._sleep sized
    # from this pod's own untraced base replay; the fake, 1.5 us (+1.06%)
    "plus1": ({"LAYERS": 16, "EXTRA_KERNEL_NS": 1500}, {"extra_ratio": 0.01}),
}


@contextmanager
def gpu_turn(lock, wanted: str = ""):
    """This pod's turn on the GPU (no other pod's kernels run meanwhile). ``wanted``: a file saying
    so until the turn is taken: serving pods let a starting pod in (flock is not fair)."""
    if wanted:
        open(wanted, "w").close()
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        if wanted:
            os.unlink(wanted)
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


def _fake_engine(kind: str):
    for knob in FAKE_KNOBS:  # read by the fake torch at capture
        os.environ[f"FAKE_{knob}"] = str(BUILDS[kind][0].get(knob, 0))
    import torch
    from cupti import cupti as gpu
    from fake_cupti import FakeEvents

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    ev = FakeEvents(gpu)
    e0, e1 = ev.create(), ev.create()

    def timed() -> float:
        ev.record(e0, 7), g.replay(), ev.record(e1, 7)
        return ev.elapsed_ms(None, e0, e1)

    return g.replay, timed, lambda: None, g.h, 0.01, {}  # pause: a CPU shared by many fake pods


def _event_ms(fn) -> float:
    import torch

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1)


def engine(dry_run: bool, kind: str):
    """(replay, timed_replay_ms, synchronize, exec handle, pause between turns, build info) of this
    build's graph. ``timed_replay_ms``: CUDA events around one replay, a synchronize after it."""
    if dry_run:
        return _fake_engine(kind)
    import torch

    from graphmon.gpu.workloads import DecodeModel, capture

    kw = dict(BUILDS[kind][1])
    ratio, info = kw.pop("extra_ratio", 0.0), {}
    model = DecodeModel(**kw)
    if ratio:  # the extra kernel's length: `ratio` of this model's untraced replay, measured here
        base = capture(GRAPH, model.step, model.input(1), "uploaded")
        base_ms = float(np.median([_event_ms(base.replay) for _ in range(60)][10:]))
        cycles = 20_000_000
        _event_ms(lambda: torch.cuda._sleep(cycles))  # warm
        per_ms = cycles / float(np.median([_event_ms(lambda: torch.cuda._sleep(cycles)) for _ in range(5)]))
        model.extra_sleep_cycles = max(1, int(ratio * base_ms * per_ms))
        extra_ms = float(np.median([_event_ms(lambda: torch.cuda._sleep(model.extra_sleep_cycles)) for _ in range(20)]))
        info = {"base_replay_ms": base_ms, "extra_sleep_cycles": model.extra_sleep_cycles,
                "extra_kernel_ms": extra_ms, "extra_ratio_asked": ratio}
        del base
    r = capture(GRAPH, model.step, model.input(1), "uploaded")
    return r.replay, lambda: _event_ms(r.replay), torch.cuda.synchronize, r.exec_handle, 0.001, info


def pod(a) -> int:
    """One engine pod: its untraced truth before graphmon attaches, then attached, replaying in
    batches of 8 on its GPU turns until the stop file exists (or its parent is gone)."""
    import graphmon

    parent, wanted_dir = os.getppid(), os.path.join(os.path.dirname(a.lock), "gpu.wanted")
    with open(a.lock, "a+") as lock:
        with gpu_turn(lock, os.path.join(wanted_dir, os.environ["GRAPHMON_POD_NAME"])):
            replay, timed, sync, handle, pause_s, info = engine(a.dry_run, a.build)
            graphmon.label_graph(handle, name=GRAPH, batch_size=1)  # one name in every process of any build
            ms = [timed() for _ in range(a.truth_replays + 10)][10:]  # untraced: graphmon not attached yet
        p10, p50, p90 = (float(x) for x in np.percentile(ms, [10, 50, 90]))
        truth = {"pod": os.environ["GRAPHMON_POD_NAME"], "kind": a.build, "replays": len(ms), "median_ms": p50,
                 "p10_ms": p10, "p90_ms": p90, **info, "ms": [round(x, 6) for x in ms]}
        with open(a.truth + ".tmp", "w") as fh:
            json.dump(truth, fh)
        os.replace(a.truth + ".tmp", a.truth)
        # traced windows as the rollout's time compression needs; the untraced bursts at graphmon's defaults
        graphmon.attach(interval_s=a.interval_s, first_window_s=0.0, window_launches=4, max_traced_share=1.0)
        t_end = time.monotonic() + a.seconds
        while not os.path.exists(a.stop) and time.monotonic() < t_end and os.getppid() == parent:
            t_wait = time.monotonic() + 5  # a pod is starting: it goes first (5 s at most: one that died waiting)
            while os.listdir(wanted_dir) and time.monotonic() < t_wait:
                time.sleep(0.005)
            with gpu_turn(lock):
                for _ in range(8):
                    replay()
                sync()
            time.sleep(pause_s)  # lets another pod take its turn
    graphmon.detach()
    return 0


def main_pod(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="fleet.py pod")
    for flag in ("--truth", "--stop", "--lock"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--build", choices=sorted(BUILDS), default="original")
    ap.add_argument("--dry-run", action="store_true")
    for flag, typ, default in (("--interval-s", float, 1.0), ("--truth-replays", int, 300), ("--seconds", float, 600.0)):
        ap.add_argument(flag, type=typ, default=default)
    return pod(ap.parse_args(argv))
