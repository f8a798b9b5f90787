"""Time to first data (issue 29 item 1): cold starts of real clients under `graphmon run`.

For each start: a fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (torch.compile compiles
from scratch), `graphmon run` with its default sampling settings over the client, /metrics polled
every 0.25 s. The client writes time.time() when its compiled graphs first replay steadily
(tests/gpu/steady.py: HF after its first generate, whose last ~47 decode steps replayed the graph;
the vLLM-shaped worker after its first 50 compiled steps); the bench notes when the first
``graphmon_kernel_gap_seconds_count`` series appears. Target: within 15 s of the steady replay.

Clients, interleaved start by start:
- ``hf``: tests/gpu/hf_workload.py, HF transformers static-cache generate (torch.compile
  reduce-overhead, cudagraph trees), bs 1;
- ``vllm``: tests/gpu/vllm_shaped_workload.py, API server -> EngineCore -> worker (spawn) with a
  torch.compile'd decode step.

    python bench/deploy/first_data.py --out DIR [--starts 3] [--budget-s 230]   # H200: ~4 min
    python bench/deploy/first_data.py --out DIR --dry-run                       # CPU: fake torch + fake CUPTI

Writes DIR/first-data.json (per start, and median and worst per client).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Optional

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import cli  # noqa: E402
from bench.common.agentload import metric_sum  # noqa: E402
from bench.common.paths import ROOT as _ROOT, TESTS as _TESTS  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help (its --dry-run: tests/bench/deploy/test_first_data.py)
ROOT, TESTS = str(_ROOT), str(_TESTS)
TARGET_S = 15.0
POLL_S = 0.25

CLIENTS = {
    "hf": [os.path.join(TESTS, "gpu", "hf_workload.py")],
    "vllm": [os.path.join(TESTS, "gpu", "vllm_shaped_workload.py")],
}
FAKE_WARMUP_S = 2.0  # dry run: the fake client's "compile" pause between its first replays and steady ones

# Dry run: a client on tests/fake_site's torch (its graphs launch on tests/fake_cupti's GPU).
# "tree" runs the same loop in a spawned child, as an engine's worker.
FAKE_CLIENT = r"""
import multiprocessing as mp, os, sys, time
sys.path.insert(0, os.path.join({tests!r}, "gpu"))

def loop(go):
    import torch
    from steady import mark_steady
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    for _ in range(3):  # warm-up replays, then the "compile" pause
        g.replay()
    time.sleep({warmup!r})
    t_end = time.monotonic() + 60
    n = 0
    while not os.path.exists(go) and time.monotonic() < t_end:
        g.replay()
        n += 1
        if n == 1:  # the first replay after the "compile"
            mark_steady()
        time.sleep(0.002)

if __name__ == "__main__":
    if sys.argv[3] == "tree":
        import torch  # (the API server: no graph)
        p = mp.get_context("spawn").Process(target=loop, args=(sys.argv[2],))
        p.start()
        p.join()
    else:
        loop(sys.argv[2])
"""


def gap_series(text: str) -> int:
    """How many graphmon_kernel_gap_seconds_count series have a count above 0."""
    n = 0
    for line in text.splitlines():
        if line.startswith("graphmon_kernel_gap_seconds_count{"):
            try:
                n += float(line.rsplit(" ", 1)[1]) > 0
            except ValueError:
                pass
    return n


def read_float(path: str) -> Optional[float]:
    try:
        with open(path) as fh:
            return float(fh.read())
    except (OSError, ValueError):
        return None


def one_start(client: str, argv: list[str], env_extra: dict, timeout_s: float, keep_s: float = 0.0,
              tail: tuple = ()) -> dict:
    """One cold start: returns its timings (seconds, time.time() based: client and bench share the clock)."""
    tmp = tempfile.mkdtemp(prefix=f"first-data-{client}-")
    steady_file = os.path.join(tmp, "steady")
    go = os.path.join(tmp, "go")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               TRITON_CACHE_DIR=os.path.join(tmp, "triton"), GRAPHMON_BENCH_STEADY_FILE=steady_file, TMPDIR=tmp,
               NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", **env_extra)
    env.pop("GRAPHMON_AGENT", None)
    t_launch = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "run", "--port", "0", "--",
                             sys.executable, *argv, tmp, go, *tail], env=env, stderr=subprocess.PIPE, text=True,
                            cwd=tmp,  # not a checkout: `-m graphmon.cli` imports graphmon from PYTHONPATH
                            start_new_session=True)  # its own group: the whole tree can be ended at once
    out: dict = {"client": client, "cache_dir": "fresh"}
    try:
        m = re.search(r":(\d+)/metrics", proc.stderr.readline())
        if m is None:
            out["error"] = "graphmon run printed no metrics URL"
            return out
        url = f"http://127.0.0.1:{m.group(1)}"
        t_series = None
        text = ""
        deadline = t_launch + timeout_s
        while time.time() < deadline and proc.poll() is None:
            try:
                text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            except OSError:
                text = ""
            if gap_series(text):
                t_series = time.time()
                break
            time.sleep(POLL_S)
        steady = read_float(steady_file)
        t_wait = time.time() + 10.0  # data can come before the client's mark (a window in its warm-up)
        while steady is None and t_series is not None and time.time() < t_wait and proc.poll() is None:
            time.sleep(0.05)
            steady = read_float(steady_file)
        out.update(steady_after_launch_s=None if steady is None else steady - t_launch,
                   first_series_after_launch_s=None if t_series is None else t_series - t_launch,
                   first_data_after_steady_s=None if (t_series is None or steady is None) else t_series - steady,
                   gap_series=gap_series(text), windows=metric_sum(text, "graphmon_windows_total"),
                   empty_windows=metric_sum(text, "graphmon_empty_windows_total"))
        try:
            st = json.load(urllib.request.urlopen(url + "/status", timeout=5))
            out["processes"] = [{k: p.get(k) for k in ("rank", "state", "windows", "empty_windows",
                                                       "empty_windows_no_launches", "sampling")}
                                for p in st.get("processes", [])]
        except Exception as e:
            out["status_error"] = repr(e)
        if t_series is None:
            out["error"] = f"no gap series within {timeout_s:.0f} s of the launch"
        time.sleep(keep_s)
    finally:
        open(go, "w").close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the group this bench started
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        out["exit_code"] = proc.returncode
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def summarize(starts: list[dict]) -> dict:
    import statistics

    per: dict = {}
    for client in sorted({s["client"] for s in starts}):
        xs = [s for s in starts if s["client"] == client]
        vals = [s["first_data_after_steady_s"] for s in xs if s.get("first_data_after_steady_s") is not None]
        per[client] = {"starts": len(xs), "with_data": len(vals),
                       "median_s": statistics.median(vals) if vals else None,
                       "worst_s": max(vals) if vals else None,
                       "steady_after_launch_median_s": statistics.median(
                           [s["steady_after_launch_s"] for s in xs if s.get("steady_after_launch_s") is not None] or [0]),
                       "target_s": TARGET_S,
                       "met": bool(vals) and len(vals) == len(xs) and max(vals) <= TARGET_S}
    return per


def main(argv: Optional[list] = None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default="first-data-out")
    ap.add_argument("--starts", type=int, default=3, help="cold starts per client")
    ap.add_argument("--clients", default="hf,vllm")
    ap.add_argument("--timeout-s", type=float, default=75.0, help="a start without a gap series by then fails")
    ap.add_argument("--budget-s", type=float, default=230.0, help="no new start past this (the H200 call's bound)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tests/fake_site's torch and tests/fake_cupti")
    ap.add_argument("--compare-root", help="another graphmon checkout (e.g. the code before windows opened on "
                                           "launches): each start runs under it too, interleaved, as arm 'other'")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    clients = args.clients.split(",")
    fake_dir = None
    argvs = {c: CLIENTS.get(c, []) for c in clients}
    if args.dry_run:
        fake_dir = tempfile.mkdtemp(prefix="first-data-fake-")
        script = os.path.join(fake_dir, "fake_client.py")
        with open(script, "w") as fh:
            fh.write(FAKE_CLIENT.format(tests=TESTS, warmup=FAKE_WARMUP_S))
        clients = ["hf", "vllm"] if args.clients == "hf,vllm" else clients
        argvs = {c: [script] for c in clients}
    def env_for(root: str) -> dict:
        if args.dry_run:
            return {"PYTHONPATH": os.pathsep.join([root, TESTS, os.path.join(TESTS, "fake_site")]),
                    "GRAPHMON_CUPTI_API": "cupti:cupti"}
        return {"PYTHONPATH": os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])}

    arms = [("this", env_for(ROOT))] + ([("other", env_for(os.path.abspath(args.compare_root)))]
                                        if args.compare_root else [])
    t0 = time.monotonic()
    starts: list[dict] = []
    skipped = 0
    for i in range(args.starts):
        for c in clients:
            for arm, env_extra in arms:
                if time.monotonic() - t0 > args.budget_s:
                    skipped += 1
                    continue
                # the fake client's third argument names its shape (after OUT and GO)
                tail = ("tree" if c == "vllm" else "single",) if args.dry_run else ()
                r = one_start(c, argvs[c], env_extra, args.timeout_s, tail=tail)
                r.update(start=i, arm=arm)
                if arm != "this":
                    r["client"] = f"{c}@{arm}"
                starts.append(r)
                print(json.dumps({k: r.get(k) for k in ("client", "start", "steady_after_launch_s",
                                                        "first_series_after_launch_s", "first_data_after_steady_s",
                                                        "error")}), flush=True)
    if fake_dir:
        shutil.rmtree(fake_dir, ignore_errors=True)
    result = {"bench": "first_data", "dry_run": args.dry_run, "argv": sys.argv[1:],
              "arms": {a: (ROOT if a == "this" else os.path.abspath(args.compare_root)) for a, _ in arms}, "target_s": TARGET_S, "poll_s": POLL_S,
              "settings": "graphmon run defaults (CuptiSettings)", "starts": starts, "skipped_for_budget": skipped,
              "summary": summarize(starts), "wall_s": round(time.monotonic() - t0, 1), "host": os.uname().nodename}
    try:
        import torch

        result["torch"] = torch.__version__
        result["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:
        pass
    path = os.path.join(args.out, "first-data.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
