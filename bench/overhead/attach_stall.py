"""What one attach and one detach cost a decode loop that keeps running (issue 13).

host_impact's interleaved blocks attach and detach graphmon every ~0.13 s while an HF decode runs;
on the H200 their "on" blocks held ~30x more steps over 10 ms than their "off" blocks, while whole
12 s phases attached once showed none. This times the one-time events alone: while an HF
static-cache decode (bench/common/hf.py, host_impact's, bs 1) runs without a break, a control
thread, every 0.4 s, in turn:

  attach    graphmon.attach() in agent mode (light collector: CUPTI subscribe, threads, the link)
  detach    graphmon.detach()
  subscribe cupti-python alone: subscribe and enable graphmon's idle callbacks (instantiate,
            upload, exec destroy)
  unsubscribe  cupti-python alone: unsubscribe
  none      nothing (the control: what the loop's steps are anyway)

Per event: the longest host step that overlaps it or the ``--after-s`` after it. Per kind: the
median and the largest of those, against "none".

    python bench/overhead/attach_stall.py --out DIR [--events 8] [--after-s 0.25]

Writes DIR/attach-stall.json.
"""

from __future__ import annotations

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

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
KINDS = ("attach", "detach", "subscribe", "unsubscribe", "none")


def longest_after(events: list, starts: np.ndarray, ends: np.ndarray, after_s: float) -> list:
    """For each (kind, t0, t1) event: the longest step (ms) overlapping [t0, t1 + after_s], or
    None when no step does. ``starts``/``ends``: each step's perf_counter s."""
    out = []
    for kind, t0, t1 in events:
        sel = (ends > t0) & (starts < t1 + after_s)
        out.append({"kind": kind, "ms": float((ends[sel] - starts[sel]).max() * 1e3) if sel.any() else None,
                     "action_ms": (t1 - t0) * 1e3})
    return out


def summarize(rows: list) -> dict:
    """Per kind: the events' longest steps (median, max) and the median's excess over "none"."""
    by: dict = {}
    for r in rows:
        if r["ms"] is not None:
            by.setdefault(r["kind"], []).append(r)
    base = float(np.median([r["ms"] for r in by.get("none", [])])) if by.get("none") else None
    out = {}
    for kind, rs in by.items():
        ms = np.array([r["ms"] for r in rs])
        out[kind] = {"events": len(rs), "longest_step_ms_median": float(np.median(ms)),
                     "longest_step_ms_max": float(ms.max()),
                     "excess_over_none_ms_median": float(np.median(ms) - base) if base is not None else None,
                     "action_ms_median": float(np.median([r["action_ms"] for r in rs]))}
    return out


def schedule(n: int) -> list:
    """The control thread's actions: graphmon's attach/detach and CUPTI's subscribe/unsubscribe
    never overlap (CUPTI has one subscriber); each round starts with a different pair."""
    seq = []
    for i in range(n):
        pairs = [("attach", "detach"), ("subscribe", "unsubscribe")]
        if i % 2:
            pairs.reverse()
        for a, b in pairs:
            seq += ["none", a, b]
    return seq


def run(a) -> dict:
    import graphmon
    from bench.common import hostloop as H
    from bench.common.hf import hf_workload
    from bench.overhead import cupti_idle_cost as C

    agent = H.start_agent()
    os.environ["GRAPHMON_AGENT"] = agent[1]
    run_once, meta = hf_workload(1, 128)
    for _ in range(3):
        run_once()  # compile, capture
    raw = C.RawCupti()
    actions = {"attach": lambda: H.attach_ready(first_window_s=1e6), "detach": graphmon.detach,
               "subscribe": lambda: raw.on("driver"), "unsubscribe": raw.off, "none": lambda: None}
    events: list = []
    errors: list = []
    stop = threading.Event()

    def control() -> None:
        try:
            for kind in schedule(a.events):
                time.sleep(a.gap_s)
                t0 = time.perf_counter()
                actions[kind]()
                events.append((kind, t0, time.perf_counter()))
        except Exception as e:
            errors.append(repr(e))
        finally:
            stop.set()

    H.sweep()
    steps_l, ends_l = [], []
    ctl = threading.Thread(target=control, name="attach-stall", daemon=True)
    ctl.start()
    while not stop.is_set():
        t = run_once()
        steps_l.append(np.diff(t))
        ends_l.append(t[1:])
    ctl.join(10)
    agent[0].terminate()
    steps, ends = np.concatenate(steps_l), np.concatenate(ends_l)
    rows = longest_after(events, ends - steps, ends, a.after_s)
    import torch

    return {"summary": summarize(rows), "events": rows, "errors": errors, "after_s": a.after_s,
            "gap_s": a.gap_s, "step_ms_median": float(np.median(steps) * 1e3), "steps": int(steps.size),
            "workload": meta, "versions": {"torch": torch.__version__, "graphmon": graphmon.__version__}}


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--events", type=int, default=8, help="events of each kind")
    ap.add_argument("--after-s", type=float, default=0.25, help="seconds after an event whose steps count as its")
    ap.add_argument("--gap-s", type=float, default=0.4, help="seconds between two events")
    a = ap.parse_args(argv)
    if a.events < 1 or a.after_s < 0 or a.gap_s <= a.after_s:
        ap.error("--events >= 1, --after-s >= 0, and --gap-s longer than --after-s (events apart)")
    os.makedirs(a.out, exist_ok=True)
    res = run(a)
    with open(os.path.join(a.out, "attach-stall.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["summary"], indent=1))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
