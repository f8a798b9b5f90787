"""Agent soak: one `graphmon agent` for --minutes under every hostile and clumsy peer of issue 31
at once, beside 8 well-behaved collectors (graphmon's own Link, 1 window/s of 20k real H200
records each, all announcing pid 1 as containers in their own pid namespaces do).

Hostile peers on the agent's socket (threads of this process): connections that never say hello,
a hello a byte at a time, 96 MiB frames before hello, a process whose status and windows carry
malformed or out-of-range fields and invented invalid reasons, hello+bye cycles and a burst of
100 short-lived processes every minute, a process claiming a well-behaved rank, a frame trickled
until it stalls, a frame over the size bound. On the HTTP port: 8 scrapers (/metrics, /status,
/capture + /trace), 24 /trace downloads that are never read, 100 idle connections, a /healthz
probe every 0.2 s (bench/common/clients.py's Scrapers and Hostile).

Pass: no well-behaved record lost (every window a well-behaved link sent is ingested, none dropped
anywhere, no well-behaved process lost), RSS and fds flat after warm-up, /healthz p99 < 1 s.

    python bench/agent/soak_agent.py [--minutes 10] [--out bench/results/soak-agent.json]
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import httpx

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.agentload import (AgentProcess, CollectorProcess, load_average, metric_sum, quantile,  # noqa: E402
                                    window_records)
from bench.common.clients import Hostile, Scrapers, Threads  # noqa: E402
from bench.common.paths import RESULTS, MiB  # noqa: E402
from graphmon.model.wire import encode_message, encode_window, frame, split_frame  # noqa: E402

WELL_BEHAVED = 8
RECORDS = 20_000
COLLECTORS_OUTLIVE_S = 10.0
BAD_STATUS = [{"errors": ["x"]}, {"errors": "boom"}, {"errors": {"flush": 10**400}}, {"link": 5},
              {"errors": {"flush": -7}}, {"errors": {"flush": 1.5}}, {"windows": 10**400}, {"reason": ["r"]}]


class Peers(Threads):
    """The hostile and clumsy processes on the agent's socket, one thread each, until stopped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stop = threading.Event()
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.records = window_records(2_000)
        self.threads = [threading.Thread(target=self._loop, args=(f,), daemon=True, name=f.__name__)
                        for f in (self.silent, self.slow_hello, self.big_prehello, self.malformed, self.cycler,
                                  self.burst, self.duplicate_rank, self.trickle, self.oversize)]

    def _count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def _loop(self, fn) -> None:
        while not self.stop.is_set():
            try:
                fn()
            except OSError:
                self._count(fn.__name__ + "_oserror")
                self.stop.wait(0.5)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.path)
        return s

    def _hello(self, rank: str, pid: int = 1) -> socket.socket:
        s = self._connect()
        s.sendall(encode_message("hello", identity={"rank": rank, "pid": str(pid), "host": "hostile",
                                                    "interval_s": 1.0, "first_window_s": 0.0},
                                 status={"state": "running"}))
        return s

    def _window(self, **header) -> bytes:
        now = time.time()
        import dataclasses

        data = encode_window(dataclasses.replace(self.records, started_s=now - 0.01, ended_s=now))
        if header:
            h, payload = split_frame(bytes(data[4:]))
            data = frame({**h, **header}, bytes(payload))
        return bytes(data)

    # -- the peers ----------------------------------------------------------------------------
    def silent(self) -> None:
        """40 connections that never say hello, reopened as the agent closes them."""
        socks = [self._connect() for _ in range(40)]
        self._count("silent", 40)
        self.stop.wait(2.0)
        for s in socks:
            s.close()

    def slow_hello(self) -> None:
        s = self._connect()
        hello = encode_message("hello", identity={"rank": "slow"})
        try:
            for i in range(len(hello)):
                s.sendall(hello[i:i + 1])
                if self.stop.wait(0.2):
                    break
        except OSError:
            pass
        s.close()
        self._count("slow_hello")

    def big_prehello(self) -> None:
        socks = []
        for _ in range(4):
            s = self._connect()
            try:
                s.sendall(struct.pack("<I", 96 * MiB) + b"\0" * MiB)
            except OSError:
                pass
            socks.append(s)
        self._count("big_prehello", 4)
        self.stop.wait(1.0)
        for s in socks:
            s.close()

    def malformed(self) -> None:
        s = self._hello("evil", pid=1)
        for k in itertools.count():
            if self.stop.is_set():
                break
            bad = BAD_STATUS[k % len(BAD_STATUS)]
            s.sendall(encode_message("heartbeat", identity={"rank": "evil"}, status={"state": "running", **bad}))
            header = [{"dropped": 10**400}, {"invalid": {"partial_replay": 10**400}}, {"ended_s": 1e300},
                      {"invalid": {f"made_up_{k}_{i}": 1 for i in range(63)}}, {}][k % 5]
            s.sendall(self._window(**header))
            self._count("malformed")
            if self.stop.wait(0.5):
                break
        s.close()

    def cycler(self) -> None:
        """hello + bye (or a plain close: a crash) over and over, 50 ranks: engines restarting workers."""
        for k in range(200):
            s = self._hello(f"cycle{k % 50}", pid=2)
            if k % 2:
                s.sendall(encode_message("bye", status={"state": "stopped"}))
            s.close()
            self._count("cycler")
            if self.stop.wait(0.05):
                return

    def burst(self) -> None:
        """100 short-lived processes at once, every minute (a failed connect ends the burst early;
        the minute's pause holds either way)."""
        socks = []
        try:
            for i in range(100):
                socks.append(self._hello(f"burst{i}", pid=3))
        finally:
            for s in socks:
                s.close()
            self._count("burst", len(socks))
            self.stop.wait(60.0)

    def duplicate_rank(self) -> None:
        """Claims a well-behaved rank: gets its own "0@2" series, never rank 0's."""
        s = self._hello("0", pid=1)
        for _ in range(3):
            s.sendall(self._window())
            s.sendall(encode_message("heartbeat", status={"state": "running"}))
            if self.stop.wait(1.0):
                break
        s.sendall(encode_message("bye", status={"state": "stopped"}))
        s.close()
        self._count("duplicate_rank")
        self.stop.wait(2.0)

    def trickle(self) -> None:
        """Says hello, then trickles a 16 MiB frame until the agent closes it (stalled)."""
        s = self._hello("trickle", pid=4)
        s.sendall(struct.pack("<I", 16 * MiB))
        try:
            while not self.stop.wait(0.5):
                s.sendall(b"\0" * 1024)
        except OSError:
            self._count("trickle_closed")
        s.close()

    def oversize(self) -> None:
        s = self._hello("oversize", pid=5)
        try:
            s.sendall(struct.pack("<I", 600 * MiB) + b"\0" * 4096)
        except OSError:
            pass
        s.close()
        self._count("oversize")
        self.stop.wait(5.0)


def run(minutes: float, sample_s: float = 10.0, warmup_s: float = 60.0, log=print,
        outlive_s: float = COLLECTORS_OUTLIVE_S) -> dict:
    token = "soak-token"
    agent = AgentProcess(env={"GRAPHMON_TOKEN": token})
    duration_s = minutes * 60
    load0 = load_average()
    try:
        # The well-behaved collectors outlive the hostile peers (stopped at the end of the loop
        # below): a duplicate-rank claimant still running after rank 0's collector said bye takes
        # rank 0 over, as any successor does, and its windows would count as rank 0's.
        good = CollectorProcess(agent.socket, WELL_BEHAVED, 1.0, duration_s + outlive_s, RECORDS)
        deadline = time.monotonic() + 60  # the well-behaved ranks first: the duplicate claimant gets "0@2"
        while len(httpx.get(agent.base + "/status", timeout=30).json()["processes"]) < WELL_BEHAVED:
            if time.monotonic() > deadline:
                raise RuntimeError("the well-behaved collectors did not attach")
            time.sleep(0.2)
        peers = Peers(agent.socket)
        peers.start()
        scrapers = Scrapers(agent.base, n=8, token=token)
        scrapers.start()
        hostile_http = Hostile(agent.port, token, slow=24, idle=100)
        hostile_http.start()
        samples, t0 = [agent.sample()], time.monotonic()
        warm = None
        while time.monotonic() - t0 < duration_s:
            time.sleep(sample_s)
            s = agent.sample()
            try:
                mt = httpx.get(agent.base + "/metrics", timeout=30).text
                s.update(ranks=int(metric_sum(mt, "graphmon_process_info") or 0),
                         buffered_mib=round(metric_sum(mt, "graphmon_agent_buffered_bytes") / MiB, 1),
                         trace_store_mib=round(metric_sum(mt, "graphmon_agent_trace_store_bytes") / MiB, 1))
            except httpx.HTTPError as e:
                s["metrics_error"] = repr(e)
            samples.append(s)
            if warm is None and s["t_s"] >= warmup_s:
                warm = s
            log(f"agent soak t={s['t_s']:6.0f}s rss={s['rss_bytes'] / MiB:6.1f} MiB fds={s['fds']} threads={s['threads']} "
                f"cpu={s['cpu_s']:.0f}s ranks={s.get('ranks')} buffered={s.get('buffered_mib')} MiB")
        peers.join()
        scrapers.join()
        hostile_http.join()
        links = good.result(timeout_s=180)
        time.sleep(3.0)
        mt = httpx.get(agent.base + "/metrics", timeout=30).text
        st = httpx.get(agent.base + "/status", timeout=30).json()
        end = agent.sample()
        samples.append(end)
    finally:
        rc, exit_s = agent.stop()
    warm = warm or samples[1]
    per_rank = []
    for c in links:
        r = c["rank"]
        per_rank.append({"rank": r, "windows_sent": c["windows_sent"], "link_dropped": c["windows_dropped"],
                         "link_reconnects": c["reconnects"],
                         "windows_ingested": metric_sum(mt, "graphmon_windows_total", rank=r),
                         "records_ingested": metric_sum(mt, "graphmon_records_total", rank=r),
                         "agent_dropped": sum(metric_sum(mt, "graphmon_agent_windows_dropped_total", rank=r, reason=x)
                                              for x in ("queue_full", "memory", "invalid"))})
    per_window = len(window_records(RECORDS))
    lost_records = sum(p["windows_sent"] * per_window - p["records_ingested"] for p in per_rank)
    rss = [s["rss_bytes"] for s in samples]
    after = [s for s in samples if s["t_s"] >= warm["t_s"]]
    slope = _slope([(s["t_s"], s["rss_bytes"] / MiB) for s in after])
    hz = hostile_http.healthz_s
    summary = {
        "duration_s": end["t_s"],
        "well_behaved": per_rank,
        "well_behaved_windows_sent": sum(p["windows_sent"] for p in per_rank),
        "well_behaved_records_lost": lost_records,
        "well_behaved_dropped_anywhere": sum(p["link_dropped"] + p["agent_dropped"] for p in per_rank),
        "well_behaved_reconnects": sum(p["link_reconnects"] for p in per_rank),
        "processes_lost_total": metric_sum(mt, "graphmon_processes_lost_total"),
        "rss_start_warm_end_max_mib": [round(samples[0]["rss_bytes"] / MiB, 1), round(warm["rss_bytes"] / MiB, 1),
                                       round(end["rss_bytes"] / MiB, 1), round(max(rss) / MiB, 1)],
        "rss_slope_after_warmup_mib_per_h": round(slope * 3600, 1),
        "fds_start_warm_end_max": [samples[0]["fds"], warm["fds"], end["fds"], max(s["fds"] for s in samples)],
        "threads_start_warm_end_max": [samples[0]["threads"], warm["threads"], end["threads"],
                                       max(s["threads"] for s in samples)],
        "agent_cpu_cores": round(end["cpu_s"] / max(1e-9, end["t_s"]), 3),
        "healthz_probes": len(hz), "healthz_failures": hostile_http.healthz_failures,
        "healthz_p99_ms": None if not hz else round(quantile(hz, 0.99) * 1e3, 1),
        "healthz_max_ms": None if not hz else round(max(hz) * 1e3, 1),
        "scraper_requests": scrapers.requests, "scraper_by_status": scrapers.by_status,
        "scraper_failures": scrapers.failures[:10],
        "idle_http_closed_by_server": hostile_http.idle_closed_by_server,
        "hostile_peers": peers.counts,
        "connections_rejected": {r: metric_sum(mt, "graphmon_agent_connections_rejected_total", reason=r)
                                 for r in ("uid", "too_many_processes", "unidentified_evicted", "hello_timeout", "bad_hello")},
        "frames_rejected": {r: metric_sum(mt, "graphmon_agent_frames_rejected_total", reason=r)
                            for r in ("framing", "too_large", "stalled", "header", "identity", "status", "window", "protocol")},
        "ranks_dropped": {r: metric_sum(mt, "graphmon_agent_ranks_dropped_total", reason=r) for r in ("expired", "cap")},
        "agent_errors_total": st.get("errors_total"),
        "sigterm_exit_code": rc, "sigterm_exit_s": round(exit_s, 2),
        "load_average_start_end": [load0, load_average()],
    }
    return {"what": __doc__.split("\n\n")[0].replace("\n", " "),
            "command": "python bench/agent/soak_agent.py --minutes %g" % minutes,
            "machine": "a shared 2-core machine with other work running (load averages in the summary); the agent, "
                       "the well-behaved collectors' process and this process (hostile peers, scrapers) share it",
            "environment": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
            "config": {"minutes": minutes, "sample_s": sample_s, "warmup_s": warmup_s, "well_behaved": WELL_BEHAVED,
                       "records_per_window": per_window, "window_rate_per_s": 1.0},
            "summary": summary, "samples": samples}


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if not den else sum((p[0] - mx) * (p[1] - my) for p in points) / den


def write_md(doc: dict, path: Path) -> None:
    s = doc["summary"]
    rss = s["rss_start_warm_end_max_mib"]
    lines = [
        "# Agent soak: hostile peers beside 8 well-behaved collectors",
        "",
        f"`{doc['command']}`: {doc['what']}",
        "",
        f"Ran on {doc['machine']}. Python {doc['environment']['python']}. Raw samples: `{path.with_suffix('.json').name}`.",
        "",
        "| | start | after warm-up | end | max |",
        "|---|---|---|---|---|",
        f"| agent RSS (MiB) | {rss[0]} | {rss[1]} | {rss[2]} | {rss[3]} |",
        f"| open fds | {' | '.join(map(str, s['fds_start_warm_end_max']))} |",
        f"| threads | {' | '.join(map(str, s['threads_start_warm_end_max']))} |",
        "",
        f"- well-behaved: {s['well_behaved_windows_sent']} windows sent, records lost {s['well_behaved_records_lost']}, "
        f"windows dropped anywhere {s['well_behaved_dropped_anywhere']}, reconnects {s['well_behaved_reconnects']}",
        f"- RSS slope after warm-up: {s['rss_slope_after_warmup_mib_per_h']} MiB/h; agent CPU {s['agent_cpu_cores']} cores",
        f"- /healthz: {s['healthz_probes']} probes, p99 {s['healthz_p99_ms']} ms, max {s['healthz_max_ms']} ms, "
        f"{s['healthz_failures']} failures",
        f"- scrapers: {s['scraper_requests']} requests {s['scraper_by_status']}",
        f"- refused connections {s['connections_rejected']}; rejected frames {s['frames_rejected']}; ranks dropped "
        f"{s['ranks_dropped']}; processes lost (hostile ones) {s['processes_lost_total']:.0f}",
        f"- hostile peers: {s['hostile_peers']}",
        f"- SIGTERM: exit code {s['sigterm_exit_code']} after {s['sigterm_exit_s']} s; load average start/end "
        f"{s['load_average_start_end']}",
        "",
    ]
    path.with_suffix(".md").write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, help="default: bench/results/soak-agent.json")
    args = ap.parse_args(argv)
    out = cli.out_path(args.out, RESULTS / "soak-agent.json", args.smoke)
    if args.smoke:  # 6 s of every peer; the collectors outlive them by 2 s
        doc = run(0.1, 2.0, 2.0, log=lambda m: print(m, flush=True), outlive_s=2.0)
    else:
        doc = run(args.minutes, args.sample_s, args.warmup_s, log=lambda m: print(m, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    write_md(doc, out)
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
