"""Where the collector thread spends its CPU per window, by phase (issue 13; CPU, no GPU).

The real CuptiSource runs against tests/fake_cupti.py (records in the CUpti_ActivityKernel13
layout, written into activity buffers), a ~1,090-kernel, 4-stream graph replayed by a host
thread, at 16-launch windows (~17k records; the default window is 4 launches). Each window's phases come from
``CuptiSource.phase_log``: wall ms and the collector thread's own CPU ms (``time.thread_time``),
which is the GIL graphmon itself can have held; the wall time also holds its waits for the
host's GIL. Two modes side by side: "agent" (the light collector: unfiltered records, encoded
for the link) and "inprocess" (the window assembled here: edge filtering and Trace.build). Writes bench/results/collector-cpu.json.

    python bench/collector/collector_cpu.py [--windows 20] [--out bench/results]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS, TESTS, on_path  # noqa: E402

on_path(TESTS)
from fake_cupti import FakeCupti, FakeEvents, Kernel  # noqa: E402

from graphmon.settings import CuptiSettings  # noqa: E402
from graphmon.sources.cupti.collector import CuptiSource  # noqa: E402
from graphmon.sources.cupti.registry import GraphRegistry  # noqa: E402

PHASES = ("ref", "window", "drain", "flush", "collect", "build", "sink")


def decode_graph(n_kernels: int = 1090, streams=(7, 8, 9, 10)) -> list[Kernel]:
    rng = np.random.default_rng(0)
    return [Kernel(streams[i % len(streams)], int(rng.integers(2000, 9000)), int(rng.integers(150, 600)),
                   f"kernel_{i % 180}") for i in range(n_kernels)]


def run(sink_kind: str, windows: int) -> dict:
    from graphmon.model.wire import encode_window

    fake = FakeCupti(buffer_bytes=1 << 20)
    s = CuptiSettings(interval_s=0.15, first_window_s=0.0, poll_s=0.01, drain_ms=0, max_traced_share=1.0,
                      window_launches=16)  # the docstring's ~17k-record window (the default is now 4)
    got: list = []

    def sink(w):
        if sink_kind == "agent":
            encode_window(w)  # the light collector's work on a window: WindowRecords -> a frame
            got.append(len(w))
        else:
            got.append(len(w.trace))

    src = CuptiSource(cupti=fake, settings=s, events=FakeEvents(fake), registry=GraphRegistry())
    src.records_sink = sink_kind == "agent"  # as LightCollector sets it
    src.start(sink)
    h = fake.instantiate(decode_graph())
    fake.upload(h, 7)
    stop = threading.Event()

    def host():
        while not stop.is_set():
            fake.launch(h, 7)
            time.sleep(0.001)

    th = threading.Thread(target=host, daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while len(src.phase_log) < windows + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    th.join(5)
    src.stop()
    logs = list(src.phase_log)[1:]  # the first window learns names and sizes: reported apart
    first = src.phase_log[0] if src.phase_log else None

    def per_phase(ph, cpu: bool) -> dict:
        d = ph["cpu"] if cpu else ph
        marks = ["t0"] + [k for k in PHASES if k in d]
        return {k: (d[k] - d[p]) * 1e3 for p, k in zip(marks, marks[1:])}

    cpu = {k: float(np.median([per_phase(p, True).get(k, 0.0) for p in logs])) for k in PHASES}
    wall = {k: float(np.median([per_phase(p, False).get(k, 0.0) for p in logs])) for k in PHASES}
    post = ("drain", "flush", "collect", "build", "sink")
    return {"sink": sink_kind, "windows": len(logs), "records_per_window_median": float(np.median(got[1:])) if len(got) > 1 else 0,
            "cpu_ms_median": cpu, "wall_ms_median": wall,
            "cpu_ms_after_window_median": float(np.median([sum(per_phase(p, True).get(k, 0.0) for k in post) for p in logs])),
            "cpu_ms_total_median": float(np.median([sum(per_phase(p, True).values()) for p in logs])),
            "decode_ms_median": float(np.median([p["decode_ms"] for p in logs])),
            # of the decode CPU: records -> columns, then store + kernel-name ids
            "decode_parts_cpu_ms_median": [float(np.median([p["decode_parts_cpu_ms"][i] for p in logs])) for i in range(2)],
            "first_window_cpu_ms": per_phase(first, True) if first else None}


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--out", help="folder (default: bench/results)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.windows = 2
    a.out = str(cli.out_path(a.out, RESULTS, a.smoke))
    res = {"what": __doc__.splitlines()[0], "loadavg_before": os.getloadavg(),
           "runs": [run(k, a.windows) for k in ("agent", "inprocess")], "loadavg_after": os.getloadavg(),
           "versions": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count()}}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "collector-cpu.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
