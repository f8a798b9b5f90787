"""What CUPTI's kernel tracing itself costs a graph replay on the GPU (issue 13).

On examples/decode_server.py's graph (~950 small kernels on 4 streams, 1.7 ms a replay), the
steps graphmon traces ran 1.6-1.9x longer (host_impact's ``observer_slowdown``), and the first
traced step of each window longer still. That is CUPTI's doing, not graphmon's Python: this
bench takes graphmon out of it. It registers graphmon's activity buffers, enables no callback,
and alternates blocks of replays with CONCURRENT_KERNEL activity off and on, one replay and one
synchronize per step (as host_impact's decode_server step). Per graph: the step, the GPU time
(CUDA events) and the launch call's host time, off, on, and for the first replay after enabling;
the records per traced replay (its kernel count); and from those the cost per traced kernel, so
that a user can predict what a traced step of their own graph costs: kernels x that.

    python bench/overhead/trace_cost.py --out DIR [--graphs chain100,chain1000,decode48] [--blocks 30]
                                        [--replays 10] [--pinned]

``--pinned`` sets CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED before CUDA initialises
(CUPTI's device-side record buffers in pinned host memory instead of device memory): run it in
a process of its own and compare. Writes DIR/trace-cost[-pinned].json.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
ATTR_HOST_PINNED = 8  # CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED (uint8)


def alternate(block: Callable[[bool], dict], blocks: int) -> dict:
    """Blocks off and on in turn (the order flips every pair: no side always goes first).
    ``block(traced)`` returns {"step_us", "gpu_us", "launch_us": arrays, "records": int}."""
    out = {side: {"step_us": [], "gpu_us": [], "launch_us": [], "first": [], "records": 0, "replays": 0}
           for side in ("off", "on")}
    for i in range(blocks):
        order = (False, True) if i % 2 == 0 else (True, False)
        for traced in order:
            b = block(traced)
            o = out["on" if traced else "off"]
            for k in ("step_us", "gpu_us", "launch_us"):
                o[k].append(np.asarray(b[k], float))
            o["first"].append([b["step_us"][0], b["gpu_us"][0], b["launch_us"][0]])
            o["records"] += int(b.get("records", 0))
            o["replays"] += len(b["step_us"])
    return out


def summarize(raw: dict) -> dict:
    """Medians off / on (the first replay of each block apart) and the cost per traced kernel."""
    def med(side: str, key: str, first: bool = False) -> float:
        if first:
            col = {"step_us": 0, "gpu_us": 1, "launch_us": 2}[key]
            return float(np.median([f[col] for f in raw[side]["first"]]))
        return float(np.median(np.concatenate([a[1:] for a in raw[side][key]])))

    on_replays = raw["on"]["replays"]
    kernels = raw["on"]["records"] / on_replays if on_replays else 0.0
    s: dict = {"kernels_per_replay": kernels, "blocks": len(raw["on"]["step_us"]), "replays_on": on_replays}
    for key in ("step_us", "gpu_us", "launch_us"):
        off, on, first_on, first_off = med("off", key), med("on", key), med("on", key, True), med("off", key, True)
        s[key] = {"off": off, "on": on, "first_on": first_on, "first_off": first_off,
                  "ratio": on / off if off else float("nan")}
    g = s["gpu_us"]
    s["traced_ns_per_kernel"] = (g["on"] - g["off"]) / kernels * 1e3 if kernels else float("nan")
    s["first_step_extra_us"] = s["step_us"]["first_on"] - s["step_us"]["on"]  # the enable's one-time cost
    return s


# ---------------------------------------------------------------------- on the GPU
class _Quiet:
    """A CallbackHandler that does nothing: no callback is enabled, only the buffers registered."""

    def on_launch_enter(self, *a) -> None: ...
    def on_launch_exit(self, *a) -> None: ...
    def on_upload(self, *a) -> None: ...
    def on_instantiate(self, *a) -> None: ...
    def on_destroy(self, *a) -> None: ...
    def count_error(self, *a) -> None: ...


def _graphs(names: list[str]):
    import torch

    from graphmon.gpu.workloads import DecodeModel, capture, chain_step

    out = {}
    for name in names:
        if name.startswith("chain"):
            n = int(name[5:])
            x = torch.zeros(1024, device="cuda")
            out[name] = capture(name, lambda t, n=n: chain_step(t, n), x, "uploaded")
        elif name.startswith("decode"):
            model = DecodeModel(layers=int(name[6:]))
            out[name] = capture(name, model.step, model.input(1), "uploaded")
        else:
            raise SystemExit(f"unknown graph {name!r}: chainN or decodeN")
    return out


def run(a) -> dict:
    import torch

    from graphmon.sources.cupti.api import load_api

    api = load_api(1 << 20, 32)
    if a.pinned:  # before CUDA initialises: CUPTI reads it when it makes a context's buffers
        v, size = ctypes.c_uint8(1), ctypes.c_size_t(1)
        rc = api.lib.cuptiActivitySetAttribute(ATTR_HOST_PINNED, ctypes.byref(size), ctypes.byref(v))
        if rc:
            raise SystemExit(f"cuptiActivitySetAttribute(HOST_PINNED) returned {rc}")
    torch.cuda.init()
    api.subscribe(_Quiet())
    graphs = _graphs(a.graphs.split(","))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.replays)]

    def drain() -> int:
        n = 0
        while (b := api.completed_buffer()) is not None:
            n += len(api.walk_records(b.data))
            api.release_buffer(b.key)
        return n

    results = {}
    for name, g in graphs.items():
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        enable_us: list[float] = []

        def block(traced: bool) -> dict:
            step, launch = np.empty(a.replays), np.empty(a.replays)
            if traced:
                t = time.perf_counter()
                api.set_kernel_activity(True)
                enable_us.append((time.perf_counter() - t) * 1e6)
            for i, (e0, e1) in enumerate(ev):
                t0 = time.perf_counter()
                e0.record()
                g.replay()
                t1 = time.perf_counter()
                e1.record()
                torch.cuda.synchronize()
                step[i], launch[i] = (time.perf_counter() - t0) * 1e6, (t1 - t0) * 1e6
            records = 0
            if traced:
                api.set_kernel_activity(False)
                api.flush(forced=True)
                records = drain()
            return {"step_us": step, "launch_us": launch, "records": records,
                    "gpu_us": np.array([e0.elapsed_time(e1) * 1e3 for e0, e1 in ev])}

        t = time.perf_counter()
        raw = alternate(block, a.blocks)
        s = summarize(raw)
        s["enable_us_median"] = float(np.median(enable_us))
        s["dropped_records"] = api.dropped_records()
        s["seconds"] = time.perf_counter() - t
        results[name] = s
        print(f"{name}: {s['kernels_per_replay']:.0f} kernels; GPU {s['gpu_us']['off']:.0f} -> "
              f"{s['gpu_us']['on']:.0f} us (first {s['gpu_us']['first_on']:.0f}); "
              f"{s['traced_ns_per_kernel']:.0f} ns per traced kernel; step first-traced extra "
              f"{s['first_step_extra_us']:.0f} us; launch {s['launch_us']['off']:.1f} -> {s['launch_us']['on']:.1f} us",
              flush=True)
    api.unsubscribe()
    return {"graphs": results, "pinned": bool(a.pinned), "blocks": a.blocks, "replays": a.replays,
            "versions": {"torch": torch.__version__, **api.info()}, "device": torch.cuda.get_device_name()}


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--graphs", default="chain100,chain1000,decode48")
    ap.add_argument("--blocks", type=int, default=30, help="pairs of off/on blocks per graph")
    ap.add_argument("--replays", type=int, default=10, help="replays per block (one synchronize each)")
    ap.add_argument("--pinned", action="store_true", help="CUPTI's record buffers in pinned host memory")
    a = ap.parse_args(argv)
    if a.blocks < 1 or a.replays < 2:
        ap.error("--blocks >= 1 and --replays >= 2 (the first replay of a block is reported apart)")
    os.makedirs(a.out, exist_ok=True)
    res = run(a)
    path = os.path.join(a.out, "trace-cost-pinned.json" if a.pinned else "trace-cost.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
