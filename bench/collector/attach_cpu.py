"""What one attach costs the other Python threads of a process, on this machine's CPU.

bench/overhead/attach_stall.py measured on the H200 that an attach (agent mode) stalls a running HF decode
once: 149 ms the first time in a process, 2.5-18 ms later. The later ones are graphmon's own
Python and C work under the GIL, which a CPU shows as well. This runs the light collector against
the fake CUPTI of the tests (no GPU, no cupti-python) and a real `graphmon agent` process, while a
ticker thread wakes every 0.5 ms. Per attach: its wall time, the attaching thread's CPU time, and
the ticker's longest gap during it and the 0.3 s after it (the GIL it could not get). A full
garbage collection runs before each attach (untimed), so that a collection the heap is due for
does not land in one arm by chance.

Two arms, alternating attach by attach in one run:
  current   graphmon as it is (launch slots sized for a sampling window, grown for a capture)
  eager     launch slots for max_window_launches (65,536) made in attach, as before

    python bench/collector/attach_cpu.py [--attaches 12] [--out bench/results]

Writes OUT/attach-cpu.json.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS, TESTS, on_path  # noqa: E402


class Ticker:
    """A thread that sleeps 0.5 ms at a time and records how late each wake came."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.gap: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ticker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            self.t.append(now)
            self.gap.append(now - last)
            last = now

    def longest_ms(self, t0: float, t1: float) -> float:
        t, g = np.asarray(self.t), np.asarray(self.gap)
        sel = (t >= t0) & (t <= t1)
        return float(g[sel].max() * 1e3) if sel.any() else 0.0


def summarize(rows: list) -> dict:
    out = {}
    for arm in sorted({r["arm"] for r in rows}):
        rs = [r for r in rows if r["arm"] == arm]
        out[arm] = {k: float(np.median([r[k] for r in rs])) for k in ("attach_ms", "attach_cpu_ms", "ticker_gap_ms")}
        out[arm]["ticker_gap_ms_max"] = float(max(r["ticker_gap_ms"] for r in rs))
        out[arm]["attaches"] = len(rs)
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--attaches", type=int, default=12, help="attaches per arm (after one untimed first attach)")
    ap.add_argument("--out", help="folder (default: bench/results)")
    a = ap.parse_args(argv)
    if a.attaches < 1:
        ap.error("--attaches >= 1")
    if a.smoke:
        a.attaches = 1
    a.out = str(cli.out_path(a.out, RESULTS, a.smoke))
    # the fake CUPTI (and the fake modules beside it) go on this process's path: run it as a
    # process of its own, never imported into one that may hold the real cupti
    on_path(TESTS, TESTS / "fake_site")
    os.environ.setdefault("GRAPHMON_CUPTI_API", "cupti:cupti")  # the fake of tests/fake_site
    return _run(a)


def _run(a) -> int:
    import graphmon
    from bench.common import hostloop as H
    from graphmon.sources.cupti import collector, launches

    agent = H.start_agent()
    os.environ["GRAPHMON_AGENT"] = agent[1]
    ticker = Ticker()
    time.sleep(0.2)
    first_t0 = time.perf_counter()
    H.attach_ready(first_window_s=1e6)  # the first: imports, the buffer pool
    first = {"attach_ms": (time.perf_counter() - first_t0) * 1e3,
             "ticker_gap_ms": ticker.longest_ms(first_t0, time.perf_counter() + 0.3)}
    time.sleep(0.3)
    graphmon.detach()
    eager = lambda phase, cap: launches.LaunchRing(phase, 65_536)  # noqa: E731  (the old attach)
    rows = []
    try:
        for i in range(2 * a.attaches):
            arm = ("current", "eager")[(i + i // 2) % 2]  # ABBA: neither arm always goes first
            collector.LaunchRing = eager if arm == "eager" else launches.LaunchRing
            gc.collect()  # as host_impact's sweep: a collection the heap is due lands in no arm
            time.sleep(0.2)
            t0, c0 = time.perf_counter(), time.thread_time()
            H.attach_ready(first_window_s=1e6)
            t1, c1 = time.perf_counter(), time.thread_time()
            time.sleep(0.3)
            rows.append({"arm": arm, "attach_ms": (t1 - t0) * 1e3, "attach_cpu_ms": (c1 - c0) * 1e3,
                         "ticker_gap_ms": ticker.longest_ms(t0, t1 + 0.3)})
            graphmon.detach()
    finally:
        collector.LaunchRing = launches.LaunchRing
        ticker.stop.set()
        agent[0].terminate()
    res = {"summary": summarize(rows), "first_attach": first, "rows": rows,
           "cpu_count": os.cpu_count(), "loadavg": list(os.getloadavg()),
           "note": "fake CUPTI (tests/fake_site), agent mode; ticker_gap_ms: the longest wait of a thread that "
                   "sleeps 0.5 ms at a time, during the attach and the 0.3 s after it"}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "attach-cpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"first_attach": first, **res["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
