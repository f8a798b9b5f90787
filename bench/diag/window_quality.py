"""Where do a sampling window's kernel records go, and which come back without usable times?
(issue 37: window data quality.)

For each arm (``boundary``: ``launch``, tracing switched in the launch callbacks, the default;
``collector``, switched by the collector thread) and workload, the collector runs at default
window settings (4 launches, 20 ms; dense windows: ``interval_s`` 0.25, no tracing budget) with
``keep_raw`` on, and for every window this keeps its unfiltered records, CUPTI's own end times
(before the collector's late-stamp rule), CUPTI's clock when the CUDA events said the window's
launches had run (``ran_ns``) and whether the flush was forced. It prints, per arm and workload:

- records, kept, and the share of records excluded by reason (graphmon_records_invalid_total's
  reasons), edge losses (partial + overfull + launched_outside_window) apart;
- every record with end < start, end 0 or start 0 as CUPTI gave it, or whose end the late-stamp
  rule zeroed: its kernel (name, graph id, node index), its replay's launch (n of the window's, or
  outside), its rank in the replay by start, the raw start/end, end - start, and start/end
  against ``ran_ns``; and the graph nodes bad in every replay of their graph (a kernel CUPTI
  always returns so).

Workloads: ``decode4``, a 48-layer decode-like graph on 4 streams (~430 kernels); ``tree``, a
vLLM-shaped piecewise tree: 12 one-stream graphs of 60 kernels, each launched once per step.
Pace: ``sync`` (synchronize after every step) or ``ahead`` (synchronize every 32 steps).

    python bench/diag/window_quality.py --out DIR                 # H200: torch + cupti-python; each arm
                                                                  # in its own process (--arm-timeout-s)
    python bench/diag/window_quality.py --smoke                   # CPU, seconds: tests/fake_cupti, and the
                                                                  # report on recorded H200 windows
    python bench/diag/window_quality.py --cpu --out bench/results # CPU: the fake's shares by reason
    python bench/diag/window_quality.py --recorded FILE.npz       # the report on recorded windows

The CPU modes run graphmon's CuptiSource against tests/fake_cupti.py (a simulated GPU whose
records are real CUpti_ActivityKernel13 buffers): a host kept at most ``--ahead-ms`` ahead of the
GPU (the driver blocks a launch when its queue is full), each launch call ``--launch-ms`` long
kernel by kernel (a tracing switch can land inside it), and a forced flush that stamps records
CUPTI had not taken in with its own time (what the H200 showed: bench/results/gpu-check-10).
Their numbers describe the fake, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable, Optional

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import cli  # noqa: E402
from bench.common.paths import ROOT as _ROOT  # noqa: E402

ROOT = str(_ROOT)

ARMS = ("launch", "collector")
WORKLOADS = ("decode4", "tree")
EDGE = ("partial_replay", "overfull_replay", "launched_outside_window")
SHOW = 40  # bad records kept per arm and workload in the JSON (the text prints PRINT)
PRINT = 12


# ---------------------------------------------------------------------------- the report
def bad_records(w: dict) -> list[dict]:
    """Records of one window (``w``: raw columns as CuptiSource.last_raw holds them) whose times
    are not usable as CUPTI gave them, or that the late-stamp rule catches (a window launch's
    kernel stamped after ``ran_ns``, when the CUDA events said the launches had run); with their
    place in the window and in their replay."""
    start = w["start_ns"]
    end = w.get("cupti_end_ns", w["end_ns"])
    corr, node = w["correlation_id"], w["graph_node_id"]
    launches = [int(c) for c in w["launch_correlation_id"]]
    ran = int(w.get("ran_ns", [0])[0])
    late = (((end > ran) | (start > ran)) & np.isin(corr, launches)) if ran else np.zeros(len(start), bool)
    bad = np.flatnonzero((end < start) | (end == 0) | (start == 0) | late)
    names = w.get("names", [])
    out = []
    for i in bad.tolist():
        c = int(corr[i])
        mine = np.flatnonzero(corr == c)
        rank = int((start[mine] < start[i]).sum()) if start[i] > 0 else -1
        kind = ("start_0" if start[i] == 0 else "end_0" if end[i] == 0 else "end_before_start" if end[i] < start[i]
                else "late_stamp")
        nid = int(w["name_id"][i]) if "name_id" in w else -1
        out.append({
            "kind": kind, "late_stamp": bool(late[i]), "kernel": names[nid] if 0 <= nid < len(names) else "",
            "graph_id": int(w["graph_id"][i]), "node": int(node[i]) & 0xFFFFFFFF, "corr": c,
            "launch": f"{launches.index(c) + 1} of {len(launches)}" if c in launches else "outside",
            "rank_in_replay": f"{rank} of {len(mine)}", "start_ns": int(start[i]), "end_ns": int(end[i]),
            "dur_ns": int(end[i] - start[i]), "start_after_ran_ns": int(start[i] - ran) if ran else None,
            "end_after_ran_ns": int(end[i] - ran) if ran and end[i] else None,
            "forced_flush_records": int(w.get("forced_flush_records", [-1])[0]),
        })
    return out


def always_bad(windows: list[dict], bad: list[list[dict]]) -> list[dict]:
    """Graph nodes that came back bad in every replay of their graph (over all windows)."""
    replays: Counter = Counter()
    hits: Counter = Counter()
    for w, b in zip(windows, bad):
        g = w["graph_id"] > 0
        for gid, c in set(zip(w["graph_id"][g].tolist(), w["correlation_id"][g].tolist())):
            replays[gid] += 1
        for r in {(x["graph_id"], x["node"], x["corr"]) for x in b}:
            hits[r[:2]] += 1
    return [{"graph_id": g, "node": n, "replays": replays[g]} for (g, n), k in hits.items() if k == replays[g] > 1]


def summarize(windows: list[dict], invalid: list[dict], kept: list[int]) -> dict:
    total = Counter()
    for inv in invalid:
        total.update(inv)
    n = sum(kept) + sum(total.values())
    bad = [bad_records(w) for w in windows]
    flat = [x for b in bad for x in b]
    return {
        "windows": len(windows), "records": n, "kept": sum(kept),
        "invalid": dict(total), "share_pct": {k: round(100 * v / n, 3) for k, v in total.items()} if n else {},
        "edge_loss_pct": round(100 * sum(total.get(k, 0) for k in EDGE) / n, 3) if n else None,
        "forced_flush_records": (sum(max(0, int(w["forced_flush_records"][0])) for w in windows)
                                 if any("forced_flush_records" in w for w in windows) else None),  # None: not recorded
        "bad_by_kind": dict(Counter(x["kind"] for x in flat)),
        "bad_by_launch": dict(Counter("outside" if x["launch"] == "outside" else
                                      "last" if x["launch"].split(" of ")[0] == x["launch"].split(" of ")[1]
                                      else "first" if x["launch"].startswith("1 of") else "middle" for x in flat)),
        "bad_records": flat[:SHOW], "bad_in_every_replay": always_bad(windows, bad),
    }


def text(name: str, s: dict) -> str:
    lines = [f"== {name}: {s['windows']} windows, {s['records']} records, kept {s['kept']}, "
             f"edge losses {s['edge_loss_pct']}%, records a forced flush brought {s['forced_flush_records']}",
             "   excluded (% of records): " + ", ".join(f"{k} {v}" for k, v in sorted(s["share_pct"].items())),
             f"   bad as CUPTI gave them: {s['bad_by_kind']} by launch {s['bad_by_launch']}",
             f"   nodes bad in every replay: {s['bad_in_every_replay']}"]
    for x in s["bad_records"][:PRINT]:
        lines.append("   - " + json.dumps(x))
    if len(s["bad_records"]) > PRINT:
        lines.append(f"   ... {sum(s['bad_by_kind'].values()) - PRINT} more")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- recorded windows
def recorded_windows(path: str) -> list[dict]:
    """Windows of a recorded .npz: this bench's own (w<i>_<column>, as last_raw) or
    tests/data/h200-hf-late-stamps.npz's (w<i>_start/end/node/corr/launch_corr/off_ns)."""
    z = np.load(path)
    n = int(z["windows"]) if "windows" in z else 1 + max(int(k.split("_")[0][1:]) for k in z if k.startswith("w"))
    out = []
    for i in range(n):
        def get(k):
            return z[f"w{i}_{k}"] if f"w{i}_{k}" in z else None
        if get("start_ns") is not None:  # this bench's files
            w = {k.split("_", 1)[1]: z[k] for k in z if k.startswith(f"w{i}_")}
            w["names"] = [str(s) for s in w.get("names", [])]
        else:
            w = {"start_ns": get("start"), "end_ns": get("end"), "graph_id": get("graph_id"),
                 "graph_node_id": get("node"), "correlation_id": get("corr"), "launch_correlation_id": get("launch_corr"),
                 "ran_ns": get("off_ns").reshape(1) if get("off_ns") is not None else np.zeros(1, np.int64)}
        out.append(w)
    return out


def report_recorded(path: str) -> dict:
    """The report on recorded windows, each assembled as the agent does (the late-stamp rule
    with the recorded ``ran_ns``, then model/edges.assemble): shares by reason on real records."""
    from graphmon.model.edges import GraphKernels, assemble
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    ws = recorded_windows(path)
    gk, invalid, kept = GraphKernels(), [], []
    for w in ws:
        n, lc = len(w["start_ns"]), np.asarray(w["launch_correlation_id"], np.int64)
        end = np.array(w.get("cupti_end_ns", w["end_ns"]), np.int64)
        ran = int(w.get("ran_ns", [0])[0])
        if ran:  # the collector's rule (closing.unknown_late_ends): ends made up at the flush -> 0
            end[((end > ran) | (w["start_ns"] > ran)) & np.isin(w["correlation_id"], lc)] = 0
        gids = sorted(set(np.asarray(w["graph_id"]).tolist()) - {0})
        rec = WindowRecords(
            kernels={"start_ns": w["start_ns"], "end_ns": end, "stream": w.get("stream", np.zeros(n, np.int64)),
                     "device": np.zeros(n, np.int32), "graph_id": w["graph_id"], "graph_node_id": w["graph_node_id"],
                     "correlation_id": w["correlation_id"], "name_id": np.full(n, -1, np.int32)},
            launches={"correlation_id": lc, "device": np.zeros(len(lc), np.int32), "graph": np.full(len(lc), -1, np.int32),
                      "launch_ns": np.full(len(lc), -1), "stream": np.full(len(lc), -1), "label": np.full(len(lc), -1, np.int32)},
            names=[], graphs=[GraphInfo(key=f"g{g}", graph_id=g) for g in gids], started_s=0.0, ended_s=1.0)
        t = assemble(rec, gk).trace
        invalid.append(dict(t.invalid))
        kept.append(len(t))
    return summarize(ws, invalid, kept)


# ---------------------------------------------------------------------------- one arm
def collect(src, run_host: Callable[[threading.Event], None], seconds: float, max_windows: int) -> dict:
    """Run ``src`` (a CuptiSource with keep_raw) while ``run_host`` launches; per window its raw
    columns, the assembled window's invalid counts and kept records."""
    windows, invalid, kept = [], [], []

    def tap(win):
        raw = dict(src.last_raw or {})
        raw["names"] = list(win.trace.names)
        windows.append(raw)
        invalid.append(dict(win.trace.invalid))
        kept.append(len(win.trace))

    src.taps.append(tap)
    stop = threading.Event()
    host = threading.Thread(target=run_host, args=(stop,), daemon=True)
    src.start(lambda w: None)
    host.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and len(windows) < max_windows:
        time.sleep(0.05)
    stop.set()
    host.join(10)
    src.stop()
    n = min(len(windows), len(invalid))
    out = summarize(windows[:n], invalid[:n], kept[:n])
    out["collector_errors"] = dict(src.health().errors)
    out["late_stamped_records"] = int(src.stats.get("late_stamped_records", 0))
    out["_windows"] = windows[:n]
    return out


def settings(arm: str):
    from graphmon.settings import CuptiSettings

    # default window size and drain; dense windows for the run's length (no tracing budget)
    return CuptiSettings(boundary=arm, keep_raw=True, interval_s=0.25, first_window_s=0.5, max_traced_share=1.0)


def fake_arm(arm: str, workload: str, a) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from fake_cupti import FakeCupti, FakeEvents, Kernel  # the simulated GPU (tests/fake_cupti.py)

    from graphmon.sources.cupti.collector import CuptiSource
    from graphmon.sources.cupti.registry import GraphRegistry

    fake = FakeCupti(buffer_bytes=1 << 18)
    fake.forced_flush_stamps_ns = 2_000_000
    fake.gpu_replay_s = a.gpu_ms / 1e3
    fake.launch_spread_s = a.launch_ms / 1e3
    if workload == "decode4":
        graphs = [fake.instantiate([Kernel(7 + i % 4, 2000 + 50 * (i % 7), 200 + 20 * (i % 5), f"k{i % 40}")
                                    for i in range(48 * 2)])]
    else:
        graphs = [fake.instantiate([Kernel(7, 1500, 250, f"piece{p}_k{i}") for i in range(20)]) for p in range(12)]
    src = CuptiSource(cupti=fake, settings=settings(arm), events=FakeEvents(fake), registry=GraphRegistry())

    def host(stop):
        while not stop.is_set():
            for h in graphs:
                while fake.busy_until - time.monotonic() > a.ahead_ms / 1e3 and not stop.is_set():
                    time.sleep(0.0002)  # the driver blocks a launch while its queue is full
                fake.launch(h, 7)
            if a.pace == "sync":
                while fake.busy_until > time.monotonic() and not stop.is_set():
                    time.sleep(0.0002)

    return collect(src, host, a.seconds, a.max_windows)


def torch_arm(arm: str, workload: str, a) -> dict:
    import torch

    from graphmon.sources.cupti.collector import CuptiSource

    graphs = torch_graphs(workload)
    src = CuptiSource(settings=settings(arm))

    def host(stop):
        step = 0
        while not stop.is_set():
            for g in graphs:
                g.replay()
            step += 1
            if a.pace == "sync" or step % 32 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()

    return collect(src, host, a.seconds, a.max_windows)


def torch_graphs(workload: str) -> list:
    """CUDA graphs captured with torch: ``decode4`` (48 layers; per layer a norm and a matmul on
    the main stream, three side streams joined back) or ``tree`` (12 one-stream graphs of 60
    small elementwise kernels)."""
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    if workload == "decode4":
        x = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
        w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16) / 32
        w_side = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16) / 32
        side = [torch.cuda.Stream() for _ in range(3)]

        def body():
            h = x
            for _ in range(48):
                h = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
                main = torch.cuda.current_stream()
                outs = []
                for i, s in enumerate(side):
                    s.wait_stream(main)
                    with torch.cuda.stream(s):
                        outs.append((h @ w_side).relu() if i == 0 else h.sigmoid() if i == 1 else h * 0.5)
                for s in side:
                    main.wait_stream(s)
                h = h @ w + outs[0] + outs[1] + outs[2]
            return h
        bodies = [body]
    else:
        xs = [torch.zeros(4096, device=dev) for _ in range(12)]

        def piece(t):
            def body():
                for i in range(60):
                    t.add_(1.0) if i % 2 == 0 else t.mul_(0.999)
                return t
            return body
        bodies = [piece(t) for t in xs]
    out = []
    for body in bodies:
        s = torch.cuda.Stream()  # warm up off the default stream, as torch's graph capture asks
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        out.append(g)
    torch.cuda.synchronize()
    return out


# ---------------------------------------------------------------------------- driver
def save_windows(path: str, windows: list[dict]) -> None:
    arrays = {"windows": np.array(len(windows))}
    for i, w in enumerate(windows):
        for k, v in w.items():
            arrays[f"w{i}_{k}"] = np.asarray(v) if k != "names" else np.array(v, dtype=str)
    np.savez_compressed(path, **arrays)


def run_arms(a, one_arm: Callable[[str, str, Any], dict]) -> dict:
    results: dict = {}
    for workload in a.workloads:
        for arm in a.arms:
            r = one_arm(arm, workload, a)
            ws = r.pop("_windows", [])
            if a.out and ws and a.child:  # GPU: every window's raw records, for --recorded and offline reading
                save_windows(os.path.join(a.out, f"windows-{workload}-{arm}-{a.pace}.npz"), ws)
            results[f"{workload}/{arm}"] = r
            print(text(f"{workload} / boundary {arm}", r), flush=True)
    return results


def gpu(a) -> dict:
    """Each arm and workload in a process of its own (a CUPTI session each; a hang in a CUPTI call
    made inside a launch callback shows as a timeout, not as a stuck bench)."""
    results: dict = {}
    for workload in a.workloads:
        for arm in a.arms:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", arm, "--workloads", workload, "--pace", a.pace,
                   "--seconds", str(a.seconds), "--max-windows", str(a.max_windows)] + (["--out", a.out] if a.out else [])
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.seconds + a.arm_timeout_s)
                print(p.stdout, end="", flush=True)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                results[f"{workload}/{arm}"] = (json.loads(line[-1][7:]) if line else
                                                {"error": f"exit {p.returncode}", "stderr": p.stderr[-2000:]})
            except subprocess.TimeoutExpired:
                results[f"{workload}/{arm}"] = {"error": f"timeout after {a.seconds + a.arm_timeout_s:.0f} s"}
            print(f"-- {workload}/{arm}: {results[f'{workload}/{arm}'].get('error', 'done')}", flush=True)
    return results


def main(argv: Optional[list[str]] = None) -> int:
    ap = cli.parser(__doc__)  # --smoke: CPU, seconds: the fake GPU, and the report on recorded windows
    ap.add_argument("--out", help="folder for the JSON summary and each arm's raw windows (.npz)")
    ap.add_argument("--cpu", action="store_true", help="CPU: the fake GPU (tests/fake_cupti.py)")
    ap.add_argument("--recorded", help="report on a recorded windows .npz and exit")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--pace", default="ahead", choices=("sync", "ahead"))
    ap.add_argument("--seconds", type=float, default=20.0, help="per arm and workload")
    ap.add_argument("--max-windows", type=int, default=60)
    ap.add_argument("--arm-timeout-s", type=float, default=120.0, help="GPU: a child's time beyond --seconds")
    ap.add_argument("--ahead-ms", type=float, default=40.0, help="CPU: the most the host runs ahead of the fake GPU")
    ap.add_argument("--gpu-ms", type=float, default=1.0, help="CPU: the fake GPU's time per launch")
    ap.add_argument("--launch-ms", type=float, default=0.5, help="CPU: a launch call's length, kernel by kernel")
    ap.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    if a.recorded:
        r = report_recorded(a.recorded)
        print(text(os.path.basename(a.recorded), r))
        if a.out:
            with open(os.path.join(a.out, "diag-window-quality-recorded.json"), "w") as f:
                json.dump({"meta": {"bench": "diag_window_quality", "recorded": os.path.relpath(a.recorded, ROOT)},
                           "results": {os.path.basename(a.recorded): r}}, f, indent=1)
        return 0
    if a.child:  # one GPU arm, in its own process
        a.arms = [a.child]
        r = run_arms(a, torch_arm)
        print("RESULT " + json.dumps(next(iter(r.values()))), flush=True)
        return 0
    meta = {"bench": "diag_window_quality", "argv": sys.argv[1:] if argv is None else argv}
    if a.smoke:
        a.seconds, a.max_windows = min(a.seconds, 1.5), min(a.max_windows, 6)
        meta["mode"] = "smoke (fake GPU)"
        results = run_arms(a, fake_arm)
        rec = os.path.join(ROOT, "tests", "data", "h200-hf-late-stamps.npz")
        if os.path.exists(rec):
            results["recorded/h200-hf-late-stamps"] = r = report_recorded(rec)
            print(text("recorded H200 windows (HF generate, gpu-check-10)", r))
    elif a.cpu:
        meta["mode"] = "cpu (fake GPU: tests/fake_cupti.py)"
        results = run_arms(a, fake_arm)
    else:
        meta["mode"] = "gpu"
        results = gpu(a)
    meta.update(pace=a.pace, seconds=a.seconds, ahead_ms=a.ahead_ms, gpu_ms=a.gpu_ms, launch_ms=a.launch_ms)
    if a.out:
        name = "diag-window-quality" + ("-smoke" if a.smoke else "-cpu" if a.cpu else "") + f"-{a.pace}.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
