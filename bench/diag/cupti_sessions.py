"""Do CUPTI's correlation ids hold across sampling windows? A GPU diagnostic for the live source.

graphmon groups a graph launch's kernels by correlation id. On the H200 a live run once showed
one correlation id carrying ~10 launches' kernels; CUPTI's release notes for 13.1 Update 1 list a
fix for "incorrect correlation IDs for cudaGraphLaunch API calls and their associated kernel
launches in profiling sessions after the first session". This runs several windows of graphmon's
CuptiSource (keep_raw) over uploaded and lazy decode graphs, with the host in step with the GPU
and far ahead of it, and reports per window whether every launch's kernels came back under its
own correlation id, plus which libcupti the process loaded.

    python bench/diag/cupti_sessions.py --out DIR [--boundary launch|collector] [--close drain_first|disable_first] [--windows 6]

Writes DIR/cupti-sessions-<close>.json and the raw records of every window
(DIR/cupti-sessions-<close>.npz). Its runs: bench/results/gpu-check-3 (README.md there).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import EXAMPLES, on_path  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)


def window_stats(raw: dict, trace) -> dict:
    """Per window: do kernel correlation ids match the launches one to one?"""
    g = raw["graph_id"] > 0
    valid = g & (raw["start_ns"] > 0) & (raw["end_ns"] >= raw["start_ns"])
    corr, gid, node = raw["correlation_id"][valid], raw["graph_id"][valid], raw["graph_node_id"][valid]
    lcorr = raw["launch_correlation_id"]
    u, cnt = np.unique(corr, return_counts=True)
    # a node twice under one correlation id: several launches merged into one id
    key = np.stack([corr, gid, node], 1)
    nd = len(key) - len(np.unique(key, axis=0)) if len(key) else 0
    per_graph = {}
    for gi in np.unique(gid).tolist():
        m = gid == gi
        nodes = len(np.unique(node[m]))
        c = np.unique(corr[m], return_counts=True)[1]
        launches = int((raw["launch_graph_id"] == gi).sum())
        per_graph[str(gi)] = {"nodes": nodes, "launches_in_window": launches, "kernel_corr_ids": len(c),
                              "kernels_per_corr": sorted(set(c.tolist()))[:12], "kernels": int(m.sum())}
    return {
        "kernels": int(len(raw["start_ns"])),
        "graph_kernels": int(g.sum()),
        "zero_or_bad_timestamps": int((g & ~valid).sum()),
        "launches": int(len(lcorr)),
        "kernel_corr_ids": int(len(u)),
        "kernel_corr_ids_in_launches": int(np.isin(u, lcorr).sum()),
        "duplicate_node_under_one_corr": int(nd),
        "per_graph": per_graph,
        "trace_replays": int(len(np.unique(trace.correlation_id[trace.graph >= 0]))),
        "trace_invalid": dict(trace.invalid),
    }


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--boundary", default="launch", choices=("launch", "collector"))
    ap.add_argument("--close", default="drain_first", choices=("drain_first", "disable_first"),
                    help="with --boundary collector only")
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    from graphmon.settings import CuptiSettings
    from graphmon.sources.cupti.collector import CuptiSource
    from graphmon.sources.cupti.api import cupti_api_version
    from graphmon.sources.cupti.libinfo import library_info

    mode = a.close if a.boundary == "collector" else "launch"
    R: dict = {"mode": mode, "libs": {}}
    import torch

    torch.cuda.init()
    R["libs"]["after_torch_import"] = library_info(api_version=cupti_api_version)
    on_path(EXAMPLES)
    import decode_server as ds

    from graphmon.model.window import CaptureRequest

    src = CuptiSource(settings=CuptiSettings(interval_s=3600.0, first_window_s=3600.0, keep_raw=True, boundary=a.boundary,
                                             close=a.close))
    windows: list = []
    src.start(windows.append)
    t0 = time.monotonic()
    while src.health().state != "running" and time.monotonic() - t0 < 20:
        time.sleep(0.01)
    R["state"] = src.health().state
    R["libs"]["after_attach"] = library_info(api_version=cupti_api_version)
    R["info"] = src.info()
    model = ds.DecodeModel(layers=a.layers)
    graphs = ds.build(model, [1], ["uploaded", "lazy"], label=False)
    for r in graphs:
        r.replay()
    torch.cuda.synchronize()
    R["windows"] = []
    raws = {}
    for w in range(a.windows):
        sync_every = 1 if w % 2 == 0 else 64  # in step with the GPU / far ahead of it (~100 ms)
        n0 = len(windows)
        src.request_capture(CaptureRequest(id=f"w{w}", replays=24, duration_ms=400))
        steps = 0
        t0 = time.monotonic()
        while len(windows) == n0 and time.monotonic() - t0 < 20:
            for r in graphs:
                r.replay()
            steps += 1
            if steps % sync_every == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        if len(windows) == n0:
            R["windows"].append({"error": "no window"})
            continue
        st = window_stats(src.last_raw, windows[-1].trace)
        st["sync_every"] = sync_every
        st["window_ms"] = src.stats["last_window_ms"]
        st["flush_ms"] = src.stats["last_flush_ms"]
        st["ingest_records_per_s"] = src.stats["ingest_records_per_s"]
        R["windows"].append(st)
        for k, v in src.last_raw.items():
            raws[f"w{w}_{k}"] = v
        print(mode, "window", w, json.dumps({k: st[k] for k in st if k != "per_graph"}), flush=True)
    src.stop()
    R["errors"] = src.health().errors
    with open(os.path.join(a.out, f"cupti-sessions-{mode}.json"), "w") as fh:
        json.dump(R, fh, indent=1, default=str)
    np.savez_compressed(os.path.join(a.out, f"cupti-sessions-{mode}.npz"), **raws)
    print(mode, "libs", json.dumps(R["libs"]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
