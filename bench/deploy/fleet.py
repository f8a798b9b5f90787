"""A rolling update of engine pods across two nodes, on the GPU: does the fleet deploy verdict
(dashboards/alerts.yml, group graphmon-fleet) page for the build that made decode slower, and only
for it, as the untraced replay time says? (issues 35, 36; the CPU twin is tests/system/test_fleet_e2e.py)

    python bench/deploy/fleet.py --out DIR --prometheus PATH   # H200: real decode graphs, ~2 min a workload
    python bench/deploy/fleet.py --out DIR --dry-run           # CPU: fake torch + CUPTI (tests/fake_site), ~1 min
(on the device: cupti wheels from .whl/, Prometheus from .prom/prometheus.xz, as scripts/gpu_check.sh's deploy;
five workloads do not fit one 10-minute device call: --workloads widened,identical,rollback then eventrec,plus1)

Two `graphmon agent`s (two ports and sockets) are two nodes' DaemonSet agents; a real Prometheus
scrapes both (honor_labels, as the PodMonitor) with the shipped rules. Five workloads of 2 pods
(one per node), rolled from build a to b node by node (b's pod up, then a's pod on that node down),
builds as in bench/common/fleet_pods.py: ``widened`` (a: examples' decode model; b: the same with a
tiny device-to-device copy node after every kernel), ``identical`` (a -> a': a new pod-template-hash
of the same model), ``rollback`` (a: memcpy -> b: original), and issue 36's acceptance:
``eventrec`` (b: an event-record node on the main stream of 3 layers: faster untraced, wider gaps
traced: must not page) and ``plus1`` (b: one more kernel per replay of 1% of the pod's own untraced
replay, timed: must page, within 3 minutes). A pod is one process with the downward-API variables
of the manifests (namespace, pod ``<workload>-<hash>-n<node>``, container, template hash): it
captures its graph (labelled ``decode_bs1`` in every process), measures its UNTRACED truth before
graphmon attaches (CUDA events around each of ``--truth-replays`` g.replay(), a synchronize per
replay as a decode step waits for its token: DIR/pods/<pod>.json), then attaches to its node's
agent (GRAPHMON_AGENT + graphmon.attach, windows of 4 launches every ``--interval-s``, untraced
bursts at graphmon's defaults) and replays.

One GPU: processes time-slice, putting other pods' kernels inside a replay's gaps and event time.
So each pod's GPU work (setup + truth, each batch of 8 replays + synchronize) holds one file lock
(DIR/gpu.lock), and the workloads run one after another (at most 3 engine processes at once;
``--together``: at once, as the dry run does). No HF client: torch.compile's graphs cannot be labelled.

Time compression, in this Prometheus's copy of the rules only (stated in the JSON): the fleet rules'
``[5m]`` are ``--rate-window`` s (the Argo AnalysisTemplate's query too) and the alert's ``for: 5m``
is ``--for-s`` s; every threshold and every other rule as shipped: ``page_deadline_s`` = window + for
(and at most 180 s). The shipped rules (5 + 5 minutes) cannot page within 3 minutes.

DIR/deploy-fleet.json per workload: builds (hash, kind, pods with their untraced medians), the
untraced median replay per build and the ratio b/a, whether and when (s after b's first pod started)
GraphmonFleetDeployRegression fired and its kind/untraced labels, fleet:graphmon_deploy_regression
and fleet:graphmon_deploy_observer_only per build, whether both builds had untraced series
(``untraced_both``: else the traced rule alone decides), the Argo query's result while both builds
served, and ``verdict_agrees_with_untraced``: paged within the deadline iff b's untraced replay is
slower than a's by more than the noise measured in this run (the identical workload's |b/a - 1|,
any build's pod-to-pod spread). DIR/deploy-fleet.md: the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common.agentload import free_port  # noqa: E402
from bench.common.fleet_pods import GRAPH, main_pod  # noqa: E402
from bench.deploy.deploy_restart import _get  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; --dry-run: tests/bench/deploy/test_fleet.py
SELF = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(SELF)))
NAMESPACE, ALERT = "fleet", "GraphmonFleetDeployRegression"
# build kinds of a and b (bench/common/fleet_pods.py BUILDS); the last two are issue 36's acceptance
WORKLOADS = {"widened": ("original", "memcpy"), "identical": ("original", "original"), "rollback": ("memcpy", "original"),
             "eventrec": ("long", "eventrec"), "plus1": ("long", "plus1")}
PLUS1_PAGE_S = 180  # plus1 pages within 3 minutes of b's first pod (issue 36), and within the deadline


# ---------------------------------------------------------------------- the fleet: agents, Prometheus, pods
def _wait_ready(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _get(url, timeout=2)
            return
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start (exit {proc.poll()})")
            time.sleep(0.3)


def rules(rate_window_s: float, for_s: float) -> tuple[dict, str]:
    """dashboards/alerts.yml with the fleet group's windows and the alert's for compressed."""
    import yaml

    with open(os.path.join(ROOT, "dashboards", "alerts.yml")) as fh:
        doc = yaml.safe_load(fh)
    (group,) = [g for g in doc["groups"] if g["name"] == "graphmon-fleet"]
    for rule in group["rules"]:
        rule["expr"] = rule["expr"].replace("[5m]", f"[{rate_window_s:g}s]")
        if rule.get("alert") == ALERT:
            rule["for"] = f"{for_s:g}s"
    return doc, (f"graphmon-fleet rate windows [{rate_window_s:g}s] (shipped: [5m]), {ALERT} for: {for_s:g}s "
                 "(shipped: 5m); every threshold and every other rule as shipped")


def argo_query(rate_window_s: float, canary: str, stable: str) -> str:
    """The AnalysisTemplate's regression query for one canary/stable pair (rate window compressed)."""
    import yaml

    with open(os.path.join(ROOT, "docker", "k8s", "canary-analysis.yaml")) as fh:
        (tmpl,) = [d for d in yaml.safe_load_all(fh) if d and d["kind"] == "AnalysisTemplate"]
    (m,) = [x for x in tmpl["spec"]["metrics"] if x["name"] == "graphmon-regressed-graphs"]
    args = {"namespace": NAMESPACE, "canary-hash": canary, "stable-hash": stable}
    q = re.sub(r"\{\{args\.([\w-]+)\}\}", lambda x: args[x.group(1)], m["provider"]["prometheus"]["query"])
    return q.replace("[5m]", f"[{rate_window_s:g}s]")


class Fleet:
    def __init__(self, args) -> None:
        import yaml

        self.args, self.out, self.t0 = args, args.out, time.time()
        self.logs, self.lock_path, pdir = (os.path.join(args.out, d) for d in ("logs", "gpu.lock", "prometheus"))
        for d in ("logs", "pods", "gpu.wanted", "prometheus"):
            os.makedirs(os.path.join(args.out, d), exist_ok=True)
        # sockets (a Unix socket path is <= 107 bytes) and Prometheus's TSDB (not results) in /tmp
        self.tmp = tempfile.mkdtemp(prefix="graphmon-fleet-")
        env = self.env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHMON_") and "RANK" not in k}
        paths = [ROOT] + ([os.path.join(ROOT, "tests", d) for d in ("", "fake_site")] if args.dry_run else [])
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).strip(os.pathsep))
        self.procs, self.agents, self.prom = {}, [], None  # pods by name; agents: (process, socket, port)
        try:
            for node in ("n0", "n1"):  # a node's DaemonSet agent: its socket, its port
                sock, port = os.path.join(self.tmp, f"{node}.sock"), free_port()
                p = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", str(port), "--socket",
                                      sock], env=env, stdout=self._log(f"agent-{node}"), stderr=subprocess.STDOUT)
                self.agents.append((p, sock, port))
            for p, _, port in self.agents:
                _wait_ready(f"http://127.0.0.1:{port}/healthz", p, "graphmon agent")
            doc, self.rules_change = rules(args.rate_window, args.for_s)
            config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                      "rule_files": [os.path.join(pdir, "alerts.yml")],
                      "scrape_configs": [{"job_name": "graphmon", "honor_labels": True, "static_configs": [
                          {"targets": [f"127.0.0.1:{port}"], "labels": {"node": f"n{i}", "pod": f"graphmon-agent-n{i}"}}
                          for i, (_, _, port) in enumerate(self.agents)]}]}
            for fname, obj in (("alerts.yml", doc), ("prometheus.yml", config)):
                with open(os.path.join(pdir, fname), "w") as fh:
                    yaml.safe_dump(obj, fh, sort_keys=False)
            self.prom_base = f"http://127.0.0.1:{free_port()}"
            self.prom = subprocess.Popen([args.prometheus, f"--config.file={pdir}/prometheus.yml",
                                          f"--storage.tsdb.path={self.tmp}/data", f"--web.listen-address={self.prom_base[7:]}",
                                          "--log.level=warn"], stdout=self._log("prometheus"), stderr=subprocess.STDOUT,
                                         cwd=pdir)
            _wait_ready(self.prom_base + "/-/ready", self.prom, "prometheus")
        except BaseException:
            self.close()
            raise

    def _log(self, name: str):
        return open(os.path.join(self.logs, f"{name}.log"), "w")

    def now(self) -> float:
        return time.time() - self.t0

    # -- pods
    def start_pod(self, workload: str, h: str, node: int, kind: str) -> str:
        name = f"{workload}-{h}-n{node}"
        env = {**self.env, "GRAPHMON_AGENT": self.agents[node][1], "GRAPHMON_POD_NAMESPACE": NAMESPACE,
               "GRAPHMON_POD_NAME": name, "GRAPHMON_POD_TEMPLATE_HASH": h, "GRAPHMON_CONTAINER_NAME": "engine",
               **({"GRAPHMON_CUPTI_API": "cupti:cupti"} if self.args.dry_run else {})}
        cmd = [sys.executable, SELF, "pod", "--truth", self.pod_file(name, "json"), "--stop", self.pod_file(name, "stop"),
               "--lock", self.lock_path, "--interval-s", str(self.args.interval_s),
               "--truth-replays", str(self.args.truth_replays), "--build", kind] \
            + (["--dry-run"] if self.args.dry_run else [])
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=self._log(name), stderr=subprocess.STDOUT)
        return name

    def pod_file(self, name: str, ext: str) -> str:
        return os.path.join(self.out, "pods", f"{name}.{ext}")

    def truth(self, name: str, timeout_s: float = 180) -> dict:
        """The pod's untraced truth, once it wrote it (it attaches right after)."""
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.pod_file(name, "json")):
            p = self.procs[name]
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pod {name} wrote no truth (exit {p.poll()}; logs/{name}.log)")
            time.sleep(0.2)
        with open(self.pod_file(name, "json")) as fh:
            return json.load(fh)

    def stop_pod(self, name: str) -> None:
        open(self.pod_file(name, "stop"), "w").close()
        try:
            self.procs[name].wait(60)
        except subprocess.TimeoutExpired:
            self.procs[name].kill()

    # -- Prometheus
    def query(self, expr: str) -> list[dict]:
        doc = json.loads(_get(f"{self.prom_base}/api/v1/query?query={urllib.parse.quote(expr)}"))
        return doc["data"]["result"]

    def firing(self, workload: str) -> list[dict]:
        doc = json.loads(_get(self.prom_base + "/api/v1/alerts"))
        return [a["labels"] for a in doc["data"]["alerts"] if a["labels"].get("alertname") == ALERT
                and a["state"] == "firing" and a["labels"].get("workload") == workload]

    def wait_serving(self, workload: str, h: str, timeout_s: float = 120) -> float:
        """Until the fleet rules see the build's replays (> 0.1/s summed over its pods)."""
        deadline, q = time.monotonic() + timeout_s, f'fleet:graphmon_replays:rate5m{{workload="{workload}",build="{h}"}} > 0.1'
        while time.monotonic() < deadline:
            if self.query(q):
                return self.now()
            time.sleep(1)
        raise RuntimeError(f"Prometheus saw no replays of {workload} build {h} in {timeout_s:.0f} s")

    def close(self) -> None:
        for name in self.procs:  # every pod's stop file first: they stop together
            open(self.pod_file(name, "stop"), "w").close()
        for name in self.procs:
            self.stop_pod(name)
        for p in [a[0] for a in self.agents] + ([self.prom] if self.prom else []):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def rollout(fleet: Fleet, workload: str) -> dict:
    """A rolling update of one workload from build a to b, node by node, and what paged."""
    args, deadline_s = fleet.args, fleet.args.rate_window + fleet.args.for_s
    # each build's pod-template-hash (one per pod spec, as a ReplicaSet's: a' of identical gets its own)
    kinds, hashes = dict(zip("ab", WORKLOADS[workload])), {b: f"{workload[:4]}{b}5c8" for b in "ab"}
    builds = {b: {"hash": hashes[b], "kind": kinds[b], "pods": {}} for b in "ab"}
    res, pods, fired_at = {"workload": workload, "started_s": fleet.now(), "builds": builds}, [], []
    regression, observer_only, untraced_seen = {}, {}, set()
    stop = threading.Event()

    def up(build: str, nodes: tuple) -> None:  # pods of the build on the nodes, once they measured their truth
        pods.extend(new := [fleet.start_pod(workload, hashes[build], n, kinds[build]) for n in nodes])
        builds[build]["pods"].update((name, fleet.truth(name)) for name in new)

    def watch() -> None:  # the alert, the fleet verdict and its untraced side per build, every second from b's first pod on
        sel = f'{{workload="{workload}"}}'
        while not stop.wait(1):
            for a in fleet.firing(workload)[:1]:
                fired_at[:] = fired_at or [(time.time() - t_b, a)]
            for name, into in (("fleet:graphmon_deploy_regression", regression), ("fleet:graphmon_deploy_observer_only",
                                                                                 observer_only)):
                for r in fleet.query(name + sel):
                    into.setdefault(r["metric"]["build"], []).append(float(r["value"][1]))
            untraced_seen.update(r["metric"]["build"] for r in fleet.query(f"fleet:graphmon_replays_untraced:rate5m{sel} > 0.1"))

    watcher = threading.Thread(target=watch, daemon=True)

    try:
        up("a", (0, 1))
        fleet.wait_serving(workload, hashes["a"])
        time.sleep(args.rate_window)  # a serves alone for a window: nothing to compare with, nothing fires
        res["firing_before_rollout"] = fleet.firing(workload)
        t_b, res["b_first_pod_started_s"] = time.time(), fleet.now()
        watcher.start()
        for n in (0, 1):  # the rolling update: b's pod up and serving, then a's pod on that node down
            up("b", (n,))
            if n == 0:  # both builds serve: what a canary analysis sees (the template passes iff 0)
                fleet.wait_serving(workload, hashes["b"])
                r = fleet.query(argo_query(args.rate_window, hashes["b"], hashes["a"]))
                res["argo_regressed_graphs"] = float(r[0]["value"][1]) if r else None
            fleet.stop_pod(pods[n])
        res["rollout_done_s"] = fleet.now()
        # watched to the page deadline, and >= for: after the rollout (dry-run pods start slower than that)
        end = max(t_b + deadline_s, time.time() + args.for_s) + args.margin_s
        while time.time() < end and not fired_at:
            time.sleep(0.5)
        newest = [r["metric"]["build"] for r in fleet.query(f'fleet:graphmon_build:newest{{workload="{workload}"}}')]
    finally:
        stop.set()
        for name in pods:
            fleet.stop_pod(name)
    watcher.join(30)
    res.update(page_deadline_s=deadline_s, fired=bool(fired_at), fired_after_s=round(fired_at[0][0], 1) if fired_at
               else None, alert=fired_at[0][1] if fired_at else None, newest_build=newest,
               paged_within_deadline=bool(fired_at) and fired_at[0][0] <= min(deadline_s, PLUS1_PAGE_S),
               deploy_regression={h: {"last": v[-1], "max": max(v), "samples": len(v)} for h, v in regression.items()},
               observer_only={h: {"last": v[-1], "max": max(v)} for h, v in observer_only.items()},
               # both builds had untraced replays (graphmon_replay_untraced_seconds): the verdict could ask them
               untraced_series=sorted(untraced_seen), untraced_both=set(hashes.values()) <= untraced_seen)
    for b in builds.values():
        medians = [p["median_ms"] for p in b["pods"].values()]
        b.update(untraced_median_ms=float(np.median(np.concatenate([p.pop("ms") for p in b["pods"].values()]))),
                 pod_spread=float(max(medians) / min(medians) - 1))  # each replay's ms stay in DIR/pods/
    res["untraced_ratio_b_a"] = builds["b"]["untraced_median_ms"] / builds["a"]["untraced_median_ms"]
    return res


def score(results: list[dict]) -> dict:
    """Page iff b is slower untraced by more than the noise measured here between identical builds."""
    spreads = [r["builds"][b]["pod_spread"] for r in results for b in "ab"]
    same = [abs(r["untraced_ratio_b_a"] - 1) for r in results if r["workload"] == "identical"]
    noise = max(spreads + same)
    for r in results:
        r["untraced_slower"] = r["untraced_ratio_b_a"] - 1 > noise
        r["verdict_agrees_with_untraced"] = r["paged_within_deadline"] == r["untraced_slower"]
    return {"noise_ratio": noise, "noise_from": "max of the identical workload's |b/a - 1| and every build's "
            "pod-to-pod spread of untraced medians (max/min - 1)"}


def table(doc: dict) -> str:
    lines = [f"# deploy_fleet: {'dry run (fake GPU)' if doc['dry_run'] else 'GPU'}", "",
             f"`{doc['command']}`; {doc['prometheus']}; page deadline {doc['page_deadline_s']:g} s "
             f"(the shipped 10 minutes); untraced noise {doc['noise_ratio']:.4f}.", "",
             "| workload | a -> b | untraced median ms a / b (b/a) | untraced series both builds | paged (s after b's "
             "first pod), kind | fleet:graphmon_deploy_regression (b) | observer_only (b) | Argo query while both served "
             "| agrees with untraced |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["workloads"]:
        a, b, al = r["builds"]["a"], r["builds"]["b"], r["alert"] or {}
        reg = r["deploy_regression"].get(b["hash"], {}).get("last")
        fired = f"yes, {r['fired_after_s']:g}, {al.get('kind')}/{al.get('untraced')}" if r["fired"] else "no"
        lines.append(f"| {r['workload']} | {a['kind']} -> {b['kind']} | {a['untraced_median_ms']:.4f} / "
                     f"{b['untraced_median_ms']:.4f} ({r['untraced_ratio_b_a']:.3f}) | {r['untraced_both']} | {fired} | "
                     f"{reg} | {r['observer_only'].get(b['hash'], {}).get('max')} | "
                     f"{r.get('argo_regressed_graphs')} | {r['verdict_agrees_with_untraced']} |")
    return "\n".join(lines + [""])


def write(args, doc: dict, results: list[dict], errors: list[str], seconds: float) -> None:
    """DIR/deploy-fleet.json and .md with what is measured so far (a run cut short keeps it)."""
    results = sorted(results, key=lambda r: list(WORKLOADS).index(r["workload"]))
    doc.update(score(results) if results else {"noise_ratio": None}, workloads=results, errors=errors,
               seconds=round(seconds, 1))
    with open(os.path.join(args.out, "deploy-fleet.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    if results:
        with open(os.path.join(args.out, "deploy-fleet.md"), "w") as fh:
            fh.write(table(doc))


def run(args) -> int:
    fleet = Fleet(args)
    results: list[dict] = []
    errors: list[str] = []  # per workload: what stopped it
    doc = {"command": " ".join(["python", "bench/deploy/fleet.py", "--out", "DIR"] + (["--dry-run"] if args.dry_run else [])
                               + ["--rate-window", f"{args.rate_window:g}", "--for-s", f"{args.for_s:g}"]
                               + (["--together"] if args.together else [])),
           "dry_run": args.dry_run, "interval_s": args.interval_s, "window_launches": 4,
           "truth_replays": args.truth_replays, "rate_window_s": args.rate_window, "for_s": args.for_s,
           "page_deadline_s": args.rate_window + args.for_s, "prometheus": fleet.rules_change,
           "together": args.together}

    def one(wl: str) -> None:
        try:
            results.append(rollout(fleet, wl))
        except Exception as e:  # the other workloads' results still count
            errors.append(f"{wl}: {e!r}")
        if not args.together:
            write(args, doc, results, errors, fleet.now())

    try:
        if args.together:
            threads = [threading.Thread(target=one, args=(wl,), daemon=True) for wl in args.workloads]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            took = 0.0
            for wl in args.workloads:
                if fleet.now() + took > args.budget_s:  # the next would not finish: the device call's limit
                    errors.append(f"{wl}: not run, out of time (--budget-s {args.budget_s:g})")
                    continue
                t = fleet.now()
                one(wl)
                took = max(took, fleet.now() - t)
    except SystemExit as e:  # SIGTERM (a timeout): what was measured is written below
        errors.append(f"interrupted (exit {e.code}) after {fleet.now():.0f} s")
        raise
    finally:
        fleet.close()
        write(args, doc, list(results), errors, fleet.now())
    print(table(doc) if results else "", *(f"deploy_fleet: {e}" for e in errors), sep="\n", flush=True)
    return 1 if errors else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pod"]:  # an engine pod (bench/common/fleet_pods.py), started by Fleet.start_pod
        return main_pod(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] + " " + __doc__.splitlines()[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for deploy-fleet.json, deploy-fleet.md, pods/, logs/")
    ap.add_argument("--dry-run", action="store_true", help="CPU: fake CUPTI and torch (tests/fake_site), workloads at once")
    ap.add_argument("--prometheus", metavar="PATH", default=shutil.which("prometheus"),
                    help="the Prometheus binary (default: prometheus on PATH)")
    ap.add_argument("--rate-window", type=float, help="seconds of the fleet rules' [5m] (default 30; dry run 8)")
    ap.add_argument("--for-s", type=float, help=f"{ALERT}'s for: in seconds (default 30; dry run 4)")
    ap.add_argument("--margin-s", type=float, default=10.0, help="watched past the page deadline (default 10)")
    ap.add_argument("--interval-s", type=float, help="seconds between a pod's windows (default 1; dry run 0.2)")
    ap.add_argument("--truth-replays", type=int, default=300, help="untraced replays per pod (default 300)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ",".join(WORKLOADS))
    ap.add_argument("--together", action="store_true", help="roll the workloads out at once (default in the dry run)")
    ap.add_argument("--budget-s", type=float, default=500.0,
                    help="start no workload that would end past this many seconds (default 500: a 10-minute device call)")
    ap.add_argument("--smoke", action="store_true", help="seconds: the dry run of the widened workload alone")
    args = ap.parse_args(argv)
    if args.smoke:
        args.dry_run, args.workloads, args.truth_replays = True, "widened", 20
    args.rate_window = args.rate_window or (8.0 if args.dry_run else 30.0)
    args.for_s = args.for_s if args.for_s is not None else (4.0 if args.dry_run else 30.0)
    args.interval_s, args.together = args.interval_s or (0.2 if args.dry_run else 1.0), args.together or args.dry_run
    args.workloads = [w for w in args.workloads.split(",") if w]
    bad = [w for w in args.workloads if w not in WORKLOADS]
    if bad or not args.workloads:
        ap.error(f"unknown workload(s) {bad}: choose from {', '.join(WORKLOADS)}")
    if not args.prometheus or not os.access(args.prometheus, os.X_OK):
        ap.error(f"no Prometheus binary ({args.prometheus or 'none on PATH'}): give --prometheus PATH")
    args.prometheus, args.out = os.path.abspath(args.prometheus), os.path.abspath(args.out)  # Fleet makes out/
    # a timeout's TERM stops every pod and agent and writes the JSON; timeout(1) sends it twice (to us and our group)
    signal.signal(signal.SIGTERM, lambda *_: (signal.signal(signal.SIGTERM, signal.SIG_IGN), sys.exit(143)))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
