"""Does one `graphmon agent` serve a fleet-sized host: 64 ranks, each sending one window a second of
4 decode-like graphs (4 replays x 240 kernels on 4 streams each), scraped once a second the way
Prometheus scrapes (OpenMetrics Accept header, gzip)?

Targets (issue 38): gzip OpenMetrics scrape p99 < 20 ms, no window lost, <= 300 series per rank at
the default settings. Reports the agent's CPU (cores) and RSS, the machine's load average, the
scrape latencies and sizes, and the series per rank. ``--baseline-tree PATH`` runs the same load
against another checkout's agent first (e.g. ``git archive main | tar -x -C /tmp/main``), in the
same run, for a side-by-side figure. Exit status 1 when this tree misses a target.

    python bench/agent/agent_fleet.py [--ranks 64] [--seconds 60] [--baseline-tree PATH] [--out DIR]
    python bench/agent/agent_fleet.py --smoke      # 4 ranks for 5 s: checks the bench itself

The agent is `python -m graphmon.cli agent` in a process of its own; the ranks are graphmon's
own link (graphmon.host.link.Link: the Unix socket, the wire format, heartbeats) in a second
process; this process only scrapes and samples /proc. Windows are synthetic (gaps 150-700 ns,
kernels 1-6 us, a launch per replay), the same every second with fresh timestamps.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import ROOT  # noqa: E402

ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # what Prometheus 2.x sends
TARGETS = {"scrape_p99_ms": 20.0, "windows_lost": 0, "series_per_rank": 300}
RANK_RE = re.compile(r'[{,]rank="([^"]*)"')


# ---------------------------------------------------------------------- the ranks (their own process)
def held_out_window(graphs: int = 4, streams: int = 4, replays: int = 4, kernels: int = 240, seed: int = 0):
    """A light collector's window: ``graphs`` decode-like graphs (half uploaded, half lazy), each
    replayed ``replays`` times, ``kernels`` kernels per replay spread over ``streams`` streams."""
    import numpy as np

    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    rng = np.random.default_rng(seed)
    per_stream = kernels // streams
    cols = {k: [] for k in ("start_ns", "end_ns", "stream", "graph_id", "graph_node_id", "correlation_id", "name_id")}
    launches = {k: [] for k in ("correlation_id", "graph", "launch_ns", "stream")}
    t, corr = 10**12, 0
    for g in range(graphs):
        for _ in range(replays):
            corr += 1
            launches["correlation_id"].append(corr)
            launches["graph"].append(g)
            launches["launch_ns"].append(t - 20_000)
            launches["stream"].append(7)
            end = t
            for s in range(streams):
                dur = rng.integers(1_000, 6_000, per_stream)
                gap = rng.integers(150, 700, per_stream)
                start = t + np.cumsum(np.r_[0, (dur + gap)[:-1]])
                idx = s * per_stream + np.arange(per_stream)
                cols["start_ns"].append(start)
                cols["end_ns"].append(start + dur)
                cols["stream"].append(np.full(per_stream, 7 + s))
                cols["graph_id"].append(np.full(per_stream, g + 1))
                cols["graph_node_id"].append(((g + 1) << 32) | idx)
                cols["correlation_id"].append(np.full(per_stream, corr))
                cols["name_id"].append(idx % 40)
                end = max(end, int(start[-1] + dur[-1]))
            t = end + 30_000
    k = {name: np.concatenate(v).astype(np.int32 if name == "name_id" else np.int64) for name, v in cols.items()}
    k["device"] = np.zeros(len(k["start_ns"]), np.int32)
    n = len(launches["correlation_id"])
    lc = {"correlation_id": np.array(launches["correlation_id"], np.int64), "device": np.zeros(n, np.int32),
          "graph": np.array(launches["graph"], np.int32), "launch_ns": np.array(launches["launch_ns"], np.int64),
          "stream": np.array(launches["stream"], np.int64), "label": np.full(n, -1, np.int32)}
    infos = [GraphInfo(key=f"g{g + 1}", graph_id=g + 1, upload_mode="uploaded" if g % 2 == 0 else "lazy",
                       label=f"decode_bs{2 ** g}", batch_size=2 ** g) for g in range(graphs)]
    now = time.time()
    return WindowRecords(kernels=k, launches=lc, names=[f"kernel_{i}" for i in range(40)], graphs=infos,
                         started_s=now - 0.02, ended_s=now)


def run_ranks(sock: str, n: int, seconds: float, out: Path) -> None:
    """``n`` ranks, each a Link sending one window a second (phases spread over the second)."""
    import dataclasses

    from graphmon.host.link import Link

    records = held_out_window()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    made = [0] * n

    def hello(i):
        return {"rank": str(i), "rank_source": "RANK", "pid": str(200_000 + i), "host": socket.gethostname(),
                "device": "0", "interval_s": 1.0, "first_window_s": 0.0}

    def status(i):
        return {"state": "running", "reason": "", "errors": {}, "windows": made[i], "empty_windows": 0}

    links = [Link(sock, hello=lambda i=i: hello(i), status=lambda i=i: status(i), on_capture=lambda req: None,
                  reconnect_max_s=1.0) for i in range(n)]
    for ln in links:
        ln.start()

    def loop(i):
        next_t = time.monotonic() + i / n
        end = time.monotonic() + seconds
        while not stop.is_set() and next_t < end:
            if stop.wait(max(0.0, next_t - time.monotonic())):
                break
            now = time.time()
            links[i].send_window(dataclasses.replace(records, started_s=now - 0.02, ended_s=now), status=status(i))
            made[i] += 1
            next_t += 1.0

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    time.sleep(1.0)  # the links send what is queued
    for ln in links:
        ln.stop(timeout_s=3)
    out.write_text(json.dumps([{"windows": made[i], **links[i].stats} for i in range(n)]))


# ---------------------------------------------------------------------- the agent and what we measure
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_sample(pid: int) -> dict:
    """CPU seconds (user + system) and RSS of ``pid`` from /proc (no psutil)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"t_s": time.monotonic(), "cpu_s": cpu_s, "rss_bytes": rss}


def get(port: int, path: str, headers: dict, timeout: float = 30) -> tuple[float, bytes, dict]:
    """(seconds to the last byte, body as sent, headers) of one GET."""
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        return time.perf_counter() - t, body, {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def quantile(xs: list, q: float):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


def metric_sum(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def run_case(ranks: int, seconds: float, tree: Path | None, log=print, name: str = "") -> dict:
    tmp = tempfile.mkdtemp(prefix="graphmon-fleet-")
    sock, port = os.path.join(tmp, "agent.sock"), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    agent = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--socket", sock, "--port", str(port)],
                             cwd=str(tree or ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    out = Path(tmp) / "ranks.json"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(port, "/healthz", {}, timeout=2)[1]:
                    break
            except OSError:
                pass
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the agent did not come up")
            time.sleep(0.2)
        load0, s0 = [round(x, 2) for x in os.getloadavg()], proc_sample(agent.pid)
        # scraped from the agent's start, as Prometheus does: the ranks attach while it scrapes
        lat, sizes, bad, samples = [], [], 0, [s0]
        senders = None
        t0 = next_t = time.monotonic()
        at = []
        while senders is None or senders.poll() is None:
            t, body, h = get(port, "/metrics", {"Accept": ACCEPT, "Accept-Encoding": "gzip"})
            lat.append(t)
            at.append(round(time.monotonic() - t0, 1))
            sizes.append(len(body))
            bad += h.get("content-encoding") != "gzip" or not gzip.decompress(body).endswith(b"# EOF\n")
            if senders is None:
                senders = subprocess.Popen([sys.executable, __file__, "--_ranks", sock, str(ranks), str(seconds),
                                            str(out)], cwd=str(ROOT))
            if len(lat) % 5 == 0:
                samples.append(proc_sample(agent.pid))
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.monotonic()))
        sent = json.loads(out.read_text())
        time.sleep(2.0)  # what is queued is ingested
        s1 = proc_sample(agent.pid)
        body = gzip.decompress(get(port, "/metrics", {"Accept": ACCEPT, "Accept-Encoding": "gzip"})[1]).decode()
        per_rank: dict[str, int] = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                m = RANK_RE.search(line)
                per_rank[m.group(1) if m else ""] = per_rank.get(m.group(1) if m else "", 0) + 1
        made = sum(r["windows"] for r in sent)
        ingested = metric_sum(body, "graphmon_windows_total")
        doc = {
            "code": "this tree" if tree is None else (name or str(tree)), "ranks": ranks, "seconds": seconds,
            "window": "4 graphs x 4 replays x 240 kernels on 4 streams (3,840 records), 1/s per rank",
            "windows_made": made, "windows_ingested": int(ingested), "windows_lost": int(made - ingested),
            "windows_dropped_by_link": sum(r["windows_dropped"] for r in sent),
            "windows_dropped_by_agent": int(metric_sum(body, "graphmon_agent_windows_dropped_total")),
            "processes_lost": int(metric_sum(body, "graphmon_processes_lost_total")),
            "scrapes": len(lat), "scrape_failures": bad,
            "scrape_p50_ms": round(quantile(lat, 0.5) * 1e3, 1), "scrape_p99_ms": round(quantile(lat, 0.99) * 1e3, 1),
            "scrape_max_ms": round(max(lat) * 1e3, 1), "scrape_gzip_bytes_median": quantile(sizes, 0.5),
            "scrape_slowest_at_s_ms": sorted(zip(at, (round(x * 1e3, 1) for x in lat)), key=lambda x: -x[1])[:5],
            "metrics_bytes_plain": len(body.encode()), "series_total": sum(per_rank.values()),
            "series_per_rank_max": max(v for k, v in per_rank.items() if k), "series_agent_level": per_rank.get("", 0),
            "agent_cpu_cores": round((s1["cpu_s"] - s0["cpu_s"]) / (s1["t_s"] - s0["t_s"]), 3),
            "agent_rss_mib_start_end_max": [round(s0["rss_bytes"] / 2**20, 1), round(s1["rss_bytes"] / 2**20, 1),
                                            round(max(s["rss_bytes"] for s in samples + [s1]) / 2**20, 1)],
            "load_average_start_end": [load0, [round(x, 2) for x in os.getloadavg()]],
        }
        log(f"[{doc['code']}] {ranks} ranks: scrape p50 {doc['scrape_p50_ms']} p99 {doc['scrape_p99_ms']} ms "
            f"({doc['scrapes']} scrapes, {doc['scrape_gzip_bytes_median']} B gzip), lost {doc['windows_lost']} of "
            f"{made}, series/rank {doc['series_per_rank_max']}, cpu {doc['agent_cpu_cores']} cores, rss "
            f"{doc['agent_rss_mib_start_end_max']} MiB, load {doc['load_average_start_end']}")
        return doc
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
        for p in (out, Path(sock)):
            p.unlink(missing_ok=True)
        os.rmdir(tmp)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_ranks"]:
        run_ranks(argv[1], int(argv[2]), float(argv[3]), Path(argv[4]))
        return 0
    ap = cli.parser(__doc__)  # --smoke: 4 ranks for 5 s, nothing written
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--baseline-tree", type=Path, help="another checkout's agent under the same load first")
    ap.add_argument("--baseline-name", default="", help="what the baseline is, for the tables (default: its path)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="writes agent-fleet.json and .md")
    a = ap.parse_args(argv)
    if a.smoke:
        a.ranks, a.seconds = 4, 5.0
    cases = [run_case(a.ranks, a.seconds, tree, log=lambda m: print(m, flush=True), name=a.baseline_name)
             for tree in ([a.baseline_tree] if a.baseline_tree else []) + [None]]
    mine = cases[-1]
    met = {"scrape_p99_ms": mine["scrape_p99_ms"] < TARGETS["scrape_p99_ms"],
           "windows_lost": mine["windows_lost"] <= TARGETS["windows_lost"] and mine["scrape_failures"] == 0,
           "series_per_rank": mine["series_per_rank_max"] <= TARGETS["series_per_rank"]}
    doc = {"question": __doc__.split("\n\n")[0].replace("\n", " "), "targets": TARGETS, "met": met,
           "command": "python bench/agent/agent_fleet.py " + " ".join(argv), "commit": git_commit(),
           "machine": f"{os.cpu_count()} CPUs shared with other work (load averages per case)",
           "python": platform.python_version(), "cases": cases}
    if not a.smoke:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "agent-fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
        rows = "\n".join(
            f"| {c['code']} | {c['scrape_p50_ms']} / {c['scrape_p99_ms']} / {c['scrape_max_ms']} | "
            f"{c['scrape_gzip_bytes_median']:,} | {c['windows_lost']} of {c['windows_made']:,} | {c['series_per_rank_max']} "
            f"| {c['agent_cpu_cores']} | {c['agent_rss_mib_start_end_max'][2]} | {c['load_average_start_end'][0][0]}"
            f"-{c['load_average_start_end'][1][0]} |" for c in cases)
        (a.out / "agent-fleet.md").write_text(
            f"# Agent at fleet scale (bench/agent/agent_fleet.py)\n\n{doc['question']}\n\nCommit `{doc['commit'][:12]}`, "
            f"`{doc['command']}`, {doc['machine']}, Python {doc['python']}. Targets {TARGETS}; met: {met}.\n\n"
            "| code | gzip scrape p50 / p99 / max (ms) | gzip bytes | windows lost | series per rank | agent cores "
            "| agent RSS max (MiB) | load (1 min, start-end) |\n|---|---|---|---|---|---|---|---|\n" + rows + "\n")
    print(json.dumps({"met": met}))
    return 0 if all(met.values()) or a.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
