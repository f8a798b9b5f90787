"""graphmon on a real GPU: overhead, observer effect, ingest rate, correctness, recordings.

Run on a CUDA machine with torch + cupti-python:  python bench/overhead/gpu_overhead.py --out DIR
Writes DIR/gpu-overhead.json, DIR/gpu-overhead.md and two recorded traces
(DIR/h200-graphmon-decode.graphmon.npz, DIR/h200-graphmon-chain.graphmon.npz).

Sections (each recorded even if a later one fails):
  1. upload modes: uploaded / lazy / instantiate_upload graphs created after attach, as labelled
  2. correctness: kernel span per replay in a capture window vs this script's own CUDA events
  3. observer effect: graphmon's observer_slowdown vs this script's in/out-of-window event ratio
  4. steady overhead: attached (default sampling) vs not, interleaved arms, several instances
  5. ingest rate (records/s of the cupti-python object path), flush time, records per window
  6. torch.profiler after detach
  7. recordings (record mode) of two shapes
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import graphmon  # noqa: E402
from bench.common import cli  # noqa: E402
from bench.common.paths import EXAMPLES, on_path  # noqa: E402
from graphmon.host.attach import attached  # noqa: E402
from graphmon.model.window import CaptureRequest  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
R: dict = {"sections": {}, "errors": {}}


JSON_NAME = "gpu-overhead.json"


def save(out):
    with open(os.path.join(out, JSON_NAME), "w") as fh:
        json.dump(R, fh, indent=1, default=str)


SELECTED: set = set()


def section(name, out):
    def deco(fn):
        if SELECTED and name not in SELECTED:
            return fn
        t0 = time.perf_counter()
        try:
            R["sections"][name] = fn()
        except Exception as e:
            R["errors"][name] = f"{e!r}\n{traceback.format_exc()[-1500:]}"
            print(f"[{name}] FAILED: {e!r}", flush=True)
            traceback.print_exc()
        R.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] {json.dumps(R['sections'].get(name), default=str)[:1500]}", flush=True)
        save(out)
        return fn

    return deco


def versions():
    import torch

    v = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
         "python": platform.python_version()}
    lib = ctypes.CDLL("libcuda.so.1")
    d = ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(d))
    v["driver_api_version"] = d.value
    try:
        import subprocess

        v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:
        v["driver"] = repr(e)
    try:
        from importlib.metadata import version

        v["cupti_python"] = version("cupti-python")
        v["nvidia_cuda_cupti"] = version("nvidia-cuda-cupti")
    except Exception as e:
        v["cupti_python"] = repr(e)
    from graphmon.sources.cupti.api import cupti_api_version
    from graphmon.sources.cupti.libinfo import library_info

    v.update(library_info(api_version=cupti_api_version))  # the libcupti this process loaded (torch loads it at import)
    return v


def timed_replays(graphs, n, source=None, sync_every=32):
    """Replay graphs round-robin n times; per-replay CUDA-event ms and whether the source's
    window was open before and after the replay was enqueued (tracing state at enqueue)."""
    import torch

    st = torch.cuda.current_stream()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    inw = np.zeros(n, bool)
    ev[0].record(st)
    for i in range(n):
        a = source.in_window if source is not None else False
        graphs[i % len(graphs)].replay()
        ev[i + 1].record(st)
        b = source.in_window if source is not None else False
        inw[i] = a and b
        if i % sync_every == sync_every - 1:
            torch.cuda.synchronize()  # bound the queue: enqueue-time state ~ execution-time state
    torch.cuda.synchronize()
    ms = np.array([ev[i].elapsed_time(ev[i + 1]) for i in range(n)])
    return ms, inw


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--overhead-rounds", type=int, default=6)
    ap.add_argument("--overhead-phase-s", type=float, default=6.0)
    ap.add_argument("--sections", default="", help="comma-separated subset of sections to run")
    ap.add_argument("--overhead-warmup-s", type=float, default=2.5,
                    help="untimed replays after attach (the first window opens 1 s after attach)")
    ap.add_argument("--overhead-arms", default="off,on",
                    help="steady-overhead arms, interleaved: off, on (default settings), or on:KEY=VALUE[:KEY=VALUE]")
    ap.add_argument("--json-name", default="gpu-overhead.json")
    args = ap.parse_args(argv)
    import torch

    on_path(EXAMPLES)
    import decode_server as ds

    SELECTED.update(x for x in args.sections.split(",") if x)
    global JSON_NAME
    JSON_NAME = args.json_name
    out = args.out
    os.makedirs(out, exist_ok=True)
    R["versions"] = versions()
    R["args"] = vars(args)
    save(out)

    model = ds.DecodeModel(layers=args.layers)
    windows = []

    # ---------------------------------------------------------------- 1. upload modes
    graphmon.attach(port=0, interval_s=3600.0, first_window_s=3600.0)  # windows only on demand
    src = attached().source
    src.taps.append(windows.append)
    time.sleep(0.5)
    R["attach_state"] = src.health().state
    modes = ("uploaded", "lazy", "instantiate_upload")
    graphs = {}
    for m in modes:
        try:
            graphs[m] = ds.build(model, [1], [m])[0]
        except Exception as e:
            R["errors"][f"build_{m}"] = repr(e)
    for r in graphs.values():
        r.replay()
    torch.cuda.synchronize()

    @section("upload_modes", out)
    def _():
        res = {}
        n0 = len(windows)
        src.request_capture(CaptureRequest(id="modes", replays=3 * len(graphs), duration_ms=2000))
        t0 = time.monotonic()
        while len(windows) == n0 and time.monotonic() - t0 < 10:
            for r in graphs.values():
                r.replay()
            torch.cuda.synchronize()
        w = windows[-1]
        by_label = {g.label: g for g in w.trace.graphs}
        for m, r in graphs.items():
            g = by_label.get(r.name)
            res[m] = {"detected": g.upload_mode if g else None, "correct": bool(g and g.upload_mode == m),
                      "upload_stream_is_launch_stream": g.upload_stream_is_launch_stream if g else None,
                      "graph_key": g.key if g else None}
        res["capture_id"] = w.capture_id
        res["window_kernels"] = len(w.trace)
        return res

    # ---------------------------------------------------------------- 2+3. correctness, observer effect
    dec = [graphs.get("uploaded") or next(iter(graphs.values()))]

    @section("correctness_and_observer", out)
    def _():
        timed_replays(dec, 20)
        n0 = len(windows)
        N = 400
        src.request_capture(CaptureRequest(id="validate", replays=60, duration_ms=2000))
        ms, inw = timed_replays(dec, N, source=src)
        t0 = time.monotonic()
        while len(windows) == n0 and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        w = windows[-1]
        t = w.trace
        corr = t.correlation_id
        u, inv, cnt = np.unique(corr, return_inverse=True, return_counts=True)
        smin = np.full(len(u), np.iinfo(np.int64).max)
        emax = np.zeros(len(u), np.int64)
        np.minimum.at(smin, inv, t.start_ns)
        np.maximum.at(emax, inv, t.end_ns)
        span_ms = (emax - smin) / 1e6
        ev_in, ev_out = ms[inw], ms[~inw]
        # in the reference phase graphmon times the same replays: use the out-of-window ones
        res = {
            "window_replays": int(len(u)),
            "kernels_per_replay": sorted(set(cnt.tolist()))[:5],
            "kernel_span_ms_median": float(np.median(span_ms)),
            "event_ms_in_window_median": float(np.median(ev_in)) if len(ev_in) else None,
            "event_ms_out_of_window_median": float(np.median(ev_out)),
            "n_event_in_window": int(len(ev_in)),
            "span_over_event_in_window": float(np.median(span_ms) / np.median(ev_in)) if len(ev_in) else None,
            "observer_slowdown_graphmon": w.observer_slowdown,
            "observer_slowdown_events": float(np.median(ev_in) / np.median(ev_out)) if len(ev_in) else None,
            "window_dropped": w.dropped,
            "invalid": dict(t.invalid),
            "streams": int(len(np.unique(t.stream))),
            "launch_rows": int(t.n_launches),
            "launch_rows_linked": int((t.launches["graph"] >= 0).sum()),
        }
        return res

    # ---------------------------------------------------------------- 4. steady overhead
    graphmon.detach()
    inst = [ds.build(model, [1], ["uploaded"], label=False)[0] for _ in range(3)]  # several instances per arm

    @section("steady_overhead", out)
    def _():
        for r in inst:
            r.replay()
        timed_replays(inst, 60)
        arm_names = [a for a in args.overhead_arms.split(",") if a]
        arms = {a: [] for a in arm_names}
        windows_on = {a: 0 for a in arm_names}
        slow = {a: [] for a in arm_names}
        paths = {a: {} for a in arm_names}
        for rnd in range(args.overhead_rounds):
            k = rnd % len(arm_names)
            order = arm_names[k:] + arm_names[:k]  # rotate: every arm in every position
            if rnd % 2:
                order = order[::-1]
            for arm in order:
                ws = []
                if arm != "off":
                    graphmon.attach(port=0, **_arm_settings(arm))
                    s = attached().source
                # Steady state, not start-up: attach (HTTP thread, CUPTI subscribe, imports) and the
                # first window are left out; every arm replays through the same warm-up untimed.
                t0 = time.monotonic()
                while time.monotonic() - t0 < args.overhead_warmup_s:
                    timed_replays(inst, 96, sync_every=4)
                if arm != "off":
                    s.taps.append(ws.append)
                t0 = time.monotonic()
                tot, n = 0.0, 0
                while time.monotonic() - t0 < args.overhead_phase_s:
                    ms, _ = timed_replays(inst, 96, sync_every=4)  # serving-like: a sync per few steps
                    tot += ms.sum()
                    n += len(ms)
                arms[arm].append(tot / n)
                if arm != "off":
                    windows_on[arm] += len(ws)
                    slow[arm] += [x.observer_slowdown for x in ws if x.observer_slowdown]
                    for key in ("last_flush_ms", "last_window_ms", "ingest_records_per_s"):
                        paths[arm][key] = s.stats.get(key)
                    graphmon.detach()
        off = np.array(arms["off"])
        res = {"mean_replay_ms": arms, "phase_s": args.overhead_phase_s, "rounds": args.overhead_rounds,
               "warmup_s": args.overhead_warmup_s,
               "defaults": _defaults(), "arms": {}}
        for arm in arm_names:
            if arm == "off":
                continue
            on = np.array(arms[arm])
            ratio = on / off
            res["arms"][arm] = {
                "overhead_pct": float((on.mean() / off.mean() - 1) * 100),
                "per_round_ratio": ratio.tolist(),
                "per_round_ci95_pct": _ci95_pct(ratio),
                "windows": windows_on[arm], "observer_slowdowns_seen": slow[arm], "ingest": paths[arm],
            }
        return res

    # ---------------------------------------------------------------- 5. ingest rate
    @section("ingest", out)
    def _():
        graphmon.attach(port=0, interval_s=3600.0, first_window_s=3600.0, observer="off")
        s = attached().source
        ws = []
        s.taps.append(ws.append)
        time.sleep(0.3)
        res = {}
        for reps in (32, 256):
            n0 = len(ws)
            s.ingest.records, s.ingest.cpu_s, s.ingest.wall_s = 0, 0.0, 0.0  # this capture's rate only
            s.request_capture(CaptureRequest(id=f"ingest{reps}", replays=reps, duration_ms=2000))
            t0 = time.monotonic()
            while len(ws) == n0 and time.monotonic() - t0 < 15:
                timed_replays(inst, 32)
            w = ws[-1]
            res[f"replays_{reps}"] = {"records": len(w.trace), "dropped": w.dropped,
                                      "ingest_records_per_s": s.stats["ingest_records_per_s"],
                                      "flush_ms": s.stats["last_flush_ms"], "window_ms": s.stats["last_window_ms"]}
        graphmon.detach()
        return res

    # ---------------------------------------------------------------- 7. recordings
    @section("recordings", out)
    def _():
        res = {}
        # shape A: the 4-stream decode graph, bs 1 and 2, uploaded and lazy (created after attach)
        path = os.path.join(out, "h200-graphmon-decode.graphmon.npz")
        graphmon.attach(record_path=path, record_windows=4, window_launches=12, window_duration_ms=200,
                       interval_s=0.5, first_window_s=0.3)
        gs = ds.build(model, [1, 2], ["uploaded", "lazy", "instantiate_upload"])
        t0 = time.monotonic()
        while not os.path.exists(path) and time.monotonic() - t0 < 20:
            timed_replays(gs, 36)
        graphmon.detach()
        res["decode"] = _summ(path)
        # shape B: single-stream chain of 1000 tiny kernels + a 2-stream decode, fewer layers
        path = os.path.join(out, "h200-graphmon-chain.graphmon.npz")
        graphmon.attach(record_path=path, record_windows=4, window_launches=12, window_duration_ms=200,
                       interval_s=0.5, first_window_s=0.3)
        chain = []
        for m in ("uploaded", "lazy"):
            r = ds.capture(f"chain1000/{m}", ds.chain_step, torch.zeros(1024, device="cuda"), m)
            graphmon.label_graph(r.exec_handle, name=r.name, batch_size=1)
            chain.append(r)
        small = ds.DecodeModel(layers=16, side_streams=1, seed=1)
        chain += ds.build(small, [4], ["uploaded"])
        t0 = time.monotonic()
        while not os.path.exists(path) and time.monotonic() - t0 < 20:
            timed_replays(chain, 36)
        graphmon.detach()
        res["chain"] = _summ(path)
        return res

    # ---------------------------------------------------------------- 6. torch.profiler after detach
    @section("profiler_after_detach", out)
    def _():
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                inst[0].replay()
            torch.cuda.synchronize()
        n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        # and graphmon after torch.profiler: does Kineto give CUPTI back?
        graphmon.attach(port=0, blocked_retry_s=1.0)
        s = attached().source
        time.sleep(3.0)
        state = s.health().state, s.health().reason
        graphmon.detach()
        return {"cuda_events": n, "ok": n > 0, "graphmon_state_after_profiler": state}

    # ---------------------------------------------------------------- 8. graphmon run
    @section("graphmon_run", out)
    def _():
        from graphmon.host.launch import run_command

        t0 = time.monotonic()
        rc = run_command([sys.executable, os.path.join(os.path.dirname(ds.__file__), "decode_server.py"),
                          "--seconds", "8", "--layers", "8", "--batch-sizes", "1"],
                         {"port": 0, "interval_s": 1.0, "first_window_s": 0.5})
        return {"rc": rc, "wall_s": round(time.monotonic() - t0, 1)}

    print("DONE", json.dumps(R["errors"])[:2000], flush=True)
    if not SELECTED:
        write_md(out)
    return 0


def _ci95_pct(ratio) -> list:
    """95% t-interval of the mean per-round ratio, as percent overhead."""
    n = len(ratio)
    if n < 2:
        return [None, None]
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 2.2)
    half = t * float(np.std(ratio, ddof=1)) / n**0.5
    m = float(np.mean(ratio))
    return [(m - half - 1) * 100, (m + half - 1) * 100]


def _arm_settings(arm: str) -> dict:
    """'on' -> {}; 'on:close=disable_first:interval_s=5' -> {'close': 'disable_first', 'interval_s': 5.0}."""
    out = {}
    for kv in arm.split(":")[1:]:
        k, v = kv.split("=", 1)
        try:
            out[k] = float(v) if "." in v or v.isdigit() else v
        except ValueError:
            out[k] = v
    return out


def _defaults():
    from graphmon.settings import CuptiSettings

    p = CuptiSettings.model_fields
    return {k: p[k].default for k in ("window_launches", "window_duration_ms", "interval_s", "drain_ms", "max_drain_ms",
                                      "buffer_size_bytes", "close")}


def _summ(path):
    from graphmon.formats.read import read_trace

    t = read_trace(path)
    return {"path": os.path.basename(path), "bytes": os.path.getsize(path), "kernels": len(t),
            "graphs": [(g.label, g.upload_mode, g.key) for g in t.graphs], "windows": t.meta.get("windows"),
            "observer_slowdown": t.meta.get("observer_slowdown")}


def write_md(out):
    S = R["sections"]
    L = ["# graphmon on the GPU (bench/overhead/gpu_overhead.py)", "", "```", json.dumps(R["versions"], indent=1), "```", ""]
    for k, v in S.items():
        L += [f"## {k}", "", "```", json.dumps(v, indent=1, default=str)[:4000], "```", ""]
    if R["errors"]:
        L += ["## errors", "", "```", json.dumps(R["errors"], indent=1)[:4000], "```"]
    with open(os.path.join(out, "gpu-overhead.md"), "w") as fh:
        fh.write("\n".join(L) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
