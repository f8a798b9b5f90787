"""A deploy under one agent, on the GPU: does a restart that widened the gaps page, and one that did
not stay quiet? (issue 27; the CPU twin is tests/system/test_deploy_e2e.py)

    python bench/deploy/deploy_restart.py --out DIR              # H200: real clients, < 5 min
    python bench/deploy/deploy_restart.py --out DIR --dry-run    # CPU: the fake CUPTI and torch of tests/fake_site
    ... --prometheus /usr/bin/prometheus                  # also a real Prometheus with the shipped rules

One `graphmon run` agent; under it this script (the driver) runs, one process after the other:
- rank 0 (the CUDA device ordinal: no RANK given): examples' decode model, one graph (batch 1,
  uploaded), v1 -> v2 with ``--memcpy`` (a tiny device-to-device copy node after every kernel, on
  its stream: the same kernels, wider gaps on every stream) -> v3, the same build as v2 (no change);
- rank 1 (RANK=1), after them (two processes on one GPU would time-slice each other's replays):
  a Hugging Face transformers static-cache ``generate`` of a random-weight small Llama
  (tests/gpu/hf_workload.py: torch.compile cudagraph trees), warmed at the decode length it runs,
  h1 -> h2 (no change).
Each process runs until it sent 3 windows (the first of a rank) or until the agent's deploy verdict
against its predecessor is ready and 2 more windows came. The driver scrapes /metrics and /status
every second.

Sampling: windows hold the default 4 launches; they come every ``--interval-s`` (1 s, with the
tracing budget off) instead of every 10-60 s, so that the run fits in minutes. The verdict's delay
is counted in windows, which the interval does not change.

``DIR/deploy-restart.json``: per process its pid and windows (its own: the rank's series continue
through its processes); per restart the verdict at every window after it, the windows from the
new process's first replay to the verdict and to a regression verdict, the final verdict per graph
(kind, gap added per replay, flagged streams, each stream's shift with its interval), the series
per (rank, graph, stream) before and after the restart (a count above 1 is a duplicate series),
and ``input_series``: the scraped samples of the verdict families during the restart, at 1 s, in
``promtool test rules`` notation (tests/bench/deploy/test_deploy_restart.py replays them through the
shipped alert rules).

With ``--prometheus PATH``, a real Prometheus scrapes the agent every second and evaluates the
shipped alert rules with one change, stated in the JSON: GraphmonDeployRegression's ``for: 5m``
becomes ``--for-s`` (default 10 s; a bench cannot hold each process 5 minutes). A new process then
runs until its verdict has held ``--for-s`` + 8 s, and ``prometheus_alerts`` per restart lists the
GraphmonDeployRegression alerts firing just before it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Optional

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import cli  # noqa: E402
from bench.common.agentload import free_port  # noqa: E402
from bench.common.paths import TESTS, on_path  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help (its --dry-run: tests/bench/deploy/test_deploy_restart.py)
SELF = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(SELF)))
FAMILIES = ("graphmon_deploy_regression", "graphmon_deploy_stream_regression", "graphmon_deploy_gap_added_seconds")
SAMPLE = re.compile(r"^(graphmon_[a-z_]+)\{([^}]*)\} (\S+)$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')
FIRST_WINDOWS = 3  # windows of a rank's first process (its successor's reference)
WINDOWS_AFTER_VERDICT = 2


# ---------------------------------------------------------------------- clients (GPU)
def client_decode(stop_file: str, memcpy: bool, seconds: float) -> int:
    import torch

    from graphmon.gpu.workloads import DecodeModel, capture

    model = DecodeModel(memcpy=memcpy)
    g = capture("decode_bs1/uploaded", model.step, model.input(1), "uploaded")  # graphmon attaches here
    t_end, n = time.monotonic() + seconds, 0
    while not os.path.exists(stop_file) and time.monotonic() < t_end:
        g.replay()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return 0


def client_hf(stop_file: str, seconds: float, new_tokens: int = 48) -> int:
    import torch

    on_path(TESTS / "gpu")
    from hf_workload import build  # the GPU tests' small Llama (static cache, cudagraph trees)

    model, ids, kw = build(1, new_tokens)
    t_end = time.monotonic() + seconds
    with torch.inference_mode():
        model.generate(ids, **kw)  # warm (compile, capture) at the decode length it runs
        while not os.path.exists(stop_file) and time.monotonic() < t_end:
            model.generate(ids, **kw)
    return 0


# ---------------------------------------------------------------------- driver
def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


class Scraper(threading.Thread):
    """/metrics and /status every second; keeps what the report needs (not the whole bodies)."""

    def __init__(self, base: str) -> None:
        super().__init__(name="scraper", daemon=True)
        self.base, self.stop = base, threading.Event()
        self.scrapes: list[dict] = []  # {t, deploy samples, status deploy, processes}
        self.last_status: dict = {}
        self.last_metrics = ""

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                text = _get(self.base + "/metrics").decode()
                st = json.loads(_get(self.base + "/status"))
            except Exception as e:  # a scrape that fails is recorded as missing
                self.scrapes.append({"t": time.time(), "error": repr(e)})
                continue
            self.last_status, self.last_metrics = st, text
            samples = {f"{n}{{{lab}}}": float(v) for n, lab, v in SAMPLE.findall(text) if n in FAMILIES}
            self.scrapes.append({"t": time.time(), "samples": samples, "deploy": st.get("deploy", []),
                                 "processes": [{k: p.get(k) for k in ("rank", "pid", "state", "windows_total")}
                                               for p in st.get("processes", [])]})


def signatures(metrics: str, rank: str) -> dict[str, list[str]]:
    """graph -> the signature labels of graphmon_graph_info for ``rank`` (a changed graph shows here)."""
    out: dict[str, list[str]] = {}
    for name, lab, _ in SAMPLE.findall(metrics):
        d = dict(LABEL.findall(lab))
        if name == "graphmon_graph_info" and d.get("rank") == rank:
            out.setdefault(d["graph"], []).append(d.get("signature", ""))
    return out


def series_per_key(metrics: str) -> dict[str, int]:
    """Sample lines of the median gap per (rank, graph, stream): 1 each when series continue."""
    out: dict[str, int] = {}
    for name, lab, _ in SAMPLE.findall(metrics):
        if name == "graphmon_kernel_gap_quantile_seconds" and 'quantile="0.5"' in lab:
            d = dict(LABEL.findall(lab))
            key = f"{d['rank']}/{d['graph']}/{d['stream']}"
            out[key] = out.get(key, 0) + 1
    return out


class Prometheus:
    """A real Prometheus on loopback scraping the agent with the shipped rules, the deploy rule's
    ``for`` shortened to ``for_s`` (the only change)."""

    RULE = "GraphmonDeployRegression"

    def __init__(self, binary: str, target: str, workdir: str, for_s: float) -> None:
        import yaml

        self.workdir = os.path.join(workdir, "prometheus")
        os.makedirs(self.workdir, exist_ok=True)
        with open(os.path.join(ROOT, "dashboards", "alerts.yml")) as fh:
            doc = yaml.safe_load(fh)
        rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == self.RULE]
        assert len(rules) == 1, f"{self.RULE} not in dashboards/alerts.yml"
        rules[0]["for"] = f"{for_s:g}s"
        self.change = f"{self.RULE} for: {for_s:g}s (shipped: 5m); every other rule as shipped"
        alerts = os.path.join(self.workdir, "alerts.yml")
        with open(alerts, "w") as fh:
            yaml.safe_dump(doc, fh, sort_keys=False)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [alerts],
                  "scrape_configs": [{"job_name": "graphmon", "static_configs": [{"targets": [target]}]}]}
        with open(os.path.join(self.workdir, "prometheus.yml"), "w") as fh:
            yaml.safe_dump(config, fh)
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(self.workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen([binary, f"--config.file={self.workdir}/prometheus.yml",
                                      f"--storage.tsdb.path={self.workdir}/data",
                                      f"--web.listen-address={self.base[7:]}", "--log.level=warn"],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(self.base + "/-/ready", timeout=2)
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus did not start (log: {self.log.name})")
                time.sleep(0.5)

    def firing(self) -> list[dict]:
        """The deploy rule's firing alerts now, their labels."""
        q = urllib.parse.quote(f'ALERTS{{alertname="{self.RULE}",alertstate="firing"}}')
        try:
            doc = json.loads(_get(f"{self.base}/api/v1/query?query={q}"))
        except Exception as e:
            return [{"error": repr(e)}]
        return sorted((r["metric"] for r in doc["data"]["result"]), key=lambda m: sorted(m.items()))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Driver:
    def __init__(self, args) -> None:
        self.args, self.base = args, f"http://127.0.0.1:{args.port}"
        self.scraper = Scraper(self.base)
        self.prom: Optional[Prometheus] = None
        self.phases: list[dict] = []
        self.restarts: list[dict] = []
        self.skipped: list[str] = []
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + args.driver_budget_s

    def command(self, kind: str, stop_file: str, change: bool) -> tuple[list[str], dict]:
        env = dict(os.environ)
        env.pop("RANK", None)
        if self.args.dry_run:  # tests/fake_site: the fake engine's worker; "memcpy" = +1.5 us per gap
            env.update(LOCAL_RANK="0", FAKE_STOP=stop_file, FAKE_EXTRA_GAP_NS="1500" if change else "0")
            if kind == "hf":
                env["RANK"] = "1"
            return [sys.executable, "-m", "fake_engine", "env_worker"], env
        if kind == "hf":
            env["RANK"] = "1"
            return [sys.executable, SELF, "client-hf", "--stop-file", stop_file], env
        return [sys.executable, SELF, "client-decode", "--stop-file", stop_file] + (["--memcpy"] if change else []), env

    def status(self) -> dict:
        return self.scraper.last_status

    def process(self, pid: int) -> dict:
        return next((p for p in self.status().get("processes", []) if p.get("pid") == str(pid)), {})

    def rank_windows(self, rank: str) -> int:
        """The rank's windows so far, asked now (the agent's series of a rank continue through its
        processes: a process's own windows are the growth while it holds the rank)."""
        try:
            procs = json.loads(_get(self.base + "/status")).get("processes", [])
        except Exception:
            procs = self.status().get("processes", [])
        return max((p.get("windows_total", 0) for p in procs if p.get("rank") == rank), default=0)

    def verdict(self, rank: str, pid: int) -> dict:
        return next((d for d in self.status().get("deploy", []) if d["rank"] == rank and d["reference"] == "previous"
                     and d["current_pid"] == str(pid)), {})

    def run_process(self, name: str, rank: str, kind: str, change: bool, first: bool) -> dict:
        stop_file = os.path.join(self.args.out, f"stop-{name}")
        cmd, env = self.command(kind, stop_file, change)
        base = self.rank_windows(rank)
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env)
        ph = {"name": name, "rank": rank, "kind": kind, "change": change, "pid": proc.pid, "started_s": t0}
        deadline = min(time.monotonic() + self.args.process_timeout_s, self.deadline)
        ready_at = None
        while time.monotonic() < deadline and proc.poll() is None:
            own = self.process(proc.pid).get("windows_total", base) - base
            if own > 0 and "first_window_s" not in ph:
                ph["first_window_s"] = time.time() - t0
            if first and own >= FIRST_WINDOWS:
                break
            v = self.verdict(rank, proc.pid)
            if not first and v.get("state") == "ready":
                if ready_at is None:
                    ready_at, ready_t = v["current_windows"], time.monotonic()
                held = self.prom is None or time.monotonic() - ready_t >= self.args.for_s + 8
                if v["current_windows"] >= ready_at + WINDOWS_AFTER_VERDICT and held:
                    break
            time.sleep(0.5)
        if self.prom is not None:
            ph["prometheus_alerts"] = self.prom.firing()
        ph["windows"] = max(0, self.process(proc.pid).get("windows_total", base) - base)
        ph["series"] = series_per_key(self.scraper.last_metrics)
        ph["signatures"] = signatures(self.scraper.last_metrics, rank)
        open(stop_file, "w").close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        ph.update(stopped_s=time.time() - t0, exit_code=proc.returncode)
        with self.lock:
            self.phases.append(ph)
        return ph

    def sequence(self, rank: str, kind: str, changes: list[bool]) -> None:
        prev = None
        for i, change in enumerate(changes):
            if time.monotonic() > self.deadline - 10:
                self.skipped.append(f"{kind}{i + 1}: out of time")
                return
            ph = self.run_process(f"{kind}{i + 1}", rank, kind, change, first=prev is None)
            if prev is not None:
                self.restarts.append(self.restart(rank, prev, ph, change != prev["change"]))
            prev = ph
            self.write()  # what is measured so far survives a run cut short

    def restart(self, rank: str, old: dict, new: dict, changed: bool) -> dict:
        t0, t1 = old["started_s"] + old["stopped_s"], new["started_s"] + new["stopped_s"]
        scrapes = [s for s in self.scraper.scrapes if t0 - 1 <= s["t"] <= t1 and "samples" in s]
        per_window, to_verdict, to_regression = [], None, None
        for s in scrapes:
            d = next((d for d in s["deploy"] if d["rank"] == rank and d["reference"] == "previous"
                      and d["current_pid"] == str(new["pid"])), None)
            if d is None or (per_window and per_window[-1]["window"] == d["current_window"]
                             and per_window[-1]["state"] == d["state"]):
                continue
            row = {"t_s": s["t"] - new["started_s"], "window": d["current_window"], "windows": d["current_windows"],
                   "state": d["state"], "regression": d["regression"],
                   "graphs": {g["graph"]: {"kind": g["kind"], "gap_added_ns": g["gap_added_ns"]} for g in d["graphs"]}}
            per_window.append(row)
            if d["state"] == "ready" and to_verdict is None:
                to_verdict = d["current_windows"]
            if d["regression"] and to_regression is None:
                to_regression = d["current_windows"]
        final = next((d for s in reversed(scrapes) for d in s["deploy"] if d["rank"] == rank
                      and d["reference"] == "previous" and d["current_pid"] == str(new["pid"])), {})
        return {"rank": rank, "from": old["name"], "to": new["name"], "change": "memcpy" if changed else "none",
                "windows_to_verdict": to_verdict, "windows_to_regression": to_regression, "verdicts": per_window,
                "final": {k: final.get(k) for k in ("state", "regression", "graphs", "reference_windows",
                                                    "current_windows", "error")},
                "series_before": old["series"], "series_after": new["series"],
                **({"prometheus_alerts": new["prometheus_alerts"]} if "prometheus_alerts" in new else {}),
                "input_series": input_series(scrapes, rank)}

    def run(self) -> dict:
        if self.args.prometheus:
            self.prom = Prometheus(self.args.prometheus, self.base[7:], self.args.out, self.args.for_s)
        self.scraper.start()
        try:
            self.sequence("0", "decode", [False, True, True])
            if not self.args.skip_hf:
                self.sequence("1", "hf", [False, False])
        finally:
            self.scraper.stop.set()
            if self.prom is not None:
                self.prom.close()
        return self.write()

    def write(self) -> dict:
        doc = {"command": " ".join(["python", "bench/deploy/deploy_restart.py", "--out", self.args.out]
                                   + (["--dry-run"] if self.args.dry_run else [])
                                   + (["--prometheus", "PATH", "--for-s", f"{self.args.for_s:g}"] if self.prom else [])),
               "dry_run": self.args.dry_run, "interval_s": self.args.interval_s, "window_launches": 4,
               "prometheus": self.prom.change if self.prom is not None else None,
               "phases": sorted(self.phases, key=lambda p: (p["rank"], p["started_s"])), "restarts": self.restarts,
               "skipped": self.skipped, "scrapes": len(self.scraper.scrapes),
               "failed_scrapes": sum(1 for s in self.scraper.scrapes if "error" in s)}
        with open(os.path.join(self.args.out, "deploy-restart.json"), "w") as fh:
            json.dump(doc, fh, indent=1)
        return doc


def input_series(scrapes: list[dict], rank: str) -> list[dict]:
    """The verdict families of ``rank`` during a restart, one value per scrape ("_" = absent)."""
    keys = sorted({k for s in scrapes for k in s["samples"] if f'rank="{rank}"' in k})
    out = []
    for k in keys:
        vals = [repr(s["samples"][k]) if k in s["samples"] else "_" for s in scrapes]
        name, _, lab = k.partition("{")
        out.append({"series": f'{name}{{job="graphmon",instance="agent",{lab}', "values": " ".join(vals)})
    return out


# ---------------------------------------------------------------------- outer process
def outer(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    port = free_port()
    env = dict(os.environ)
    paths = [ROOT] + ([os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "fake_site")] if args.dry_run else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if args.dry_run:
        env["GRAPHMON_CUPTI_API"] = "cupti:cupti"
    cmd = [sys.executable, "-m", "graphmon.cli", "run", "--port", str(port), "--interval-s", str(args.interval_s),
           "--max-traced-share", "1", "--window-launches", "4", "--",
           sys.executable, SELF, "--driver", "--port", str(port), "--out", args.out,
           "--interval-s", str(args.interval_s), "--process-timeout-s", str(args.process_timeout_s),
           "--driver-budget-s", str(max(30.0, args.timeout_s - 30))]  # the driver stops in time to write
    cmd += (["--dry-run"] if args.dry_run else []) + (["--skip-hf"] if args.skip_hf else [])
    if args.prometheus:
        cmd += ["--prometheus", os.path.abspath(args.prometheus), "--for-s", str(args.for_s)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)  # its own group: a timeout ends every client
    try:
        rc = proc.wait(args.timeout_s)
    except subprocess.TimeoutExpired:
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"deploy_restart: over {args.timeout_s:.0f} s (what was measured is in the JSON)", file=sys.stderr)
        return 1
    print(f"deploy_restart: {time.monotonic() - t0:.0f} s, exit {rc}; {os.path.join(args.out, 'deploy-restart.json')}")
    return rc


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["client-decode"], ["client-hf"]):
        ap = argparse.ArgumentParser()
        ap.add_argument("--stop-file", required=True)
        ap.add_argument("--memcpy", action="store_true")
        ap.add_argument("--seconds", type=float, default=240.0)
        a = ap.parse_args(argv[1:])
        return client_decode(a.stop_file, a.memcpy, a.seconds) if argv[0] == "client-decode" else \
            client_hf(a.stop_file, a.seconds)
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True, help="folder for deploy-restart.json")
    ap.add_argument("--dry-run", action="store_true", help="CPU: fake CUPTI and torch (tests/fake_site)")
    ap.add_argument("--skip-hf", action="store_true", help="rank 0's decode restarts only")
    ap.add_argument("--interval-s", type=float, default=1.0, help="seconds between windows (default 1)")
    ap.add_argument("--process-timeout-s", type=float, default=120.0, help="longest one client process runs")
    ap.add_argument("--timeout-s", type=float, default=285.0, help="the whole run (default 285: under 5 min)")
    ap.add_argument("--prometheus", metavar="PATH", help="also run this Prometheus binary with the shipped rules")
    ap.add_argument("--for-s", type=float, default=10.0,
                    help="GraphmonDeployRegression's for: in that Prometheus (default 10; shipped: 5m)")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--driver-budget-s", type=float, default=300.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.driver:
        return outer(args)
    doc = Driver(args).run()
    for r in doc["restarts"]:
        print(f"rank {r['rank']} {r['from']} -> {r['to']} ({r['change']}): verdict after {r['windows_to_verdict']} "
              f"window(s), regression after {r['windows_to_regression']}; final {r['final'].get('regression')}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
