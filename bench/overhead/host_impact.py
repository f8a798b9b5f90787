"""How graphmon feels to a serving loop (issue 13): per-step host timestamps with graphmon on/off.

Run on a CUDA machine with torch, transformers and cupti-python (graphmon importable):

    python bench/overhead/host_impact.py --out DIR --modes agent --budget-s 420   # ~8 min on an H200
    python bench/overhead/host_impact.py --out DIR --phases fixed --quick          # < 90 s, windows denser

Workloads, each in >= 3 interleaved off/on rounds in ONE process (graphmon attached in code at
its default sampling during "on", detached during "off"). With ``--phases interval`` (default)
each "on" phase lasts the collector's own wait after its first window (the tracing budget,
``max_traced_share``), so it holds one window and the windows are exactly as dense as in steady
state; its "off" phase lasts as long. Two modes side by side: "agent" (a
light collector that ships windows to a `graphmon agent` process: the production path) and
"inprocess" (graphmon.attach() with no agent: analysis, snapshots and HTTP in the process):
  - hf_static_bs1 / hf_static_bs4: Hugging Face transformers decode of a random-weight Llama
    config, exactly as a user calls it: ``generate(ids, max_new_tokens=N,
    cache_implementation="static", do_sample=False)`` per request; transformers itself compiles
    the decode forward (generation_config.compile_config: torch.compile reduce-overhead, CUDA
    graphs through cudagraph trees; the prefill runs eager, so the static cache is created and
    marked static outside the compiled region). One host timestamp per generated token from a
    LogitsProcessor (it only reads the clock; the outputs are transformers' own copies);
  - decode_server: examples/decode_server.py's decode graph, replay + synchronize per step.
Rounds alternate their order (off,on then on,off) so that a drift over the run cancels.
Per workload: max_step_increase_ms (per round: longest step on - longest step off; the worst)
and steps_tracing_share (the share of "on" steps with kernel tracing on for part of them),
and max_step_increase_in_windows_ms (the same with only the "on" steps that overlapped a window),
p999_step_ratio, aa_max_step_diff_ms and aa_p999_step_ratio_max (the same two statistics for
one "off" phase against another: what the machine alone gives them), median_overhead_pct with
its 95% interval (ci95_low_pct/ci95_high_pct, t over rounds), gil_hold_max_ms_per_window (a thread that only ticks: its longest stall inside a
window) next to ticker_stall_max_off_ms (the same thread's longest stall with graphmon off: the
host's own GIL holds), collector_cpu_ms_per_window_max and decode_cpu_max_ms (the collector
thread's own CPU: per window, and its longest one-buffer decode), ingest records/s (of the
collector's CPU; _wall: of its wall time), observer slowdown per window, and a timeline per
window: the collector's phases (ref, window, drain, flush, collect, build, sink;
CuptiSource.phase_log) in wall and CPU ms, with the host steps that were long (> 2x the median)
placed in them and whether a garbage collection overlapped them, so a long step shows which
phase it came from. With ``--paired-s``, the median overhead from 0.1 s alternating blocks
(``paired``: attached-and-idle against detached, the host loop never pausing; the median over
pairs with its sign-test interval), the number the issue's median target is read from, and
``tail`` (``tail_compare``: the p99.9 and longest step of every on block's steps against every
off block's; each on block begins with an attach while the loop runs, and on an HF decode an
attach itself stalls the loop: bench/overhead/attach_stall.py);
``--paired-arms idle,subscribed`` measures graphmon unsubscribed between windows and subscribed
side by side, pair by pair in the same run; ``--attach-json`` sets every attach's settings; with
``--ingest-s``, ingest on real buffers in steady state (``ingest_steady``). Writes
DIR/host-impact.json after each section: one failing section never loses the others.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.hf import hf_workload  # noqa: E402
from bench.common.hostloop import (ATTACH_KW, GC, T95, Ticker, attach_ready, ingest_steady, paired,  # noqa: E402
                                   phase, phases_null, start_agent, sweep, timeline, versions)
from bench.common.decode_loops import decode_server_workload  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
R: dict = {"workloads": {}, "errors": {}, "versions": {}}
STEPS: dict = {}  # per-step times of every phase (host-impact-steps.npz): for looking at the noise


def save(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "host-impact.json"), "w") as fh:
        json.dump(R, fh, indent=1, default=str)


# ---------------------------------------------------------------------- workloads: step(bs) -> step times (s)
def launch_loop_workload(chunk: int = 100, chunks: int = 50):
    """Eager kernel launches and nothing else: a step is the host time of ``chunk`` launches of
    a one-element add (the CUDA runtime and driver API path every eager op takes). In paired
    blocks it shows what graphmon attached and idle costs per driver API call (CUPTI's
    callback layer), apart from any Python the serving loop runs."""
    import torch

    x = torch.zeros(1, device="cuda")

    def run_once() -> np.ndarray:
        t = np.empty(chunks + 1)
        t[0] = time.perf_counter()
        for i in range(chunks):
            for _ in range(chunk):
                x.add_(1)
            t[i + 1] = time.perf_counter()
        torch.cuda.synchronize()
        return t

    return run_once, {"config": {"launches_per_step": chunk, "kernel": "add_ on 1 element"}}


# ---------------------------------------------------------------------- measurement
def off_phase(run_once, seconds: float):
    """A swept, timed "off" phase: its steps, their end times, its wall span (for the ticker)
    and its collections by generation."""
    sweep()
    t0 = time.time()
    off, ends = phase(run_once, seconds)
    return off, ends, t0, time.time(), phase_gc(off, ends)


def phase_gc(steps: np.ndarray, ends: np.ndarray) -> list[int]:
    """Collections by generation that started during a phase's steps."""
    return GC.counts(ends[0] - steps[0], ends[-1]) if len(steps) else [0, 0, 0]


def on_phase(run_once, seconds: float, src, follow_interval: bool,
             max_seconds: float = 30.0) -> tuple[np.ndarray, np.ndarray]:
    """The "on" phase: at least ``seconds``; with ``follow_interval``, as long as the collector's
    own wait after its first window (CuptiSource.next_interval_s: the tracing budget), so that the
    phase holds exactly one window and the windows are as dense as in steady state (attach
    opens the first window after first_window_s: a fixed short phase would hold one window per
    phase, many times denser than the default sampling); ``max_seconds`` at most."""
    def want() -> float:
        if follow_interval and src is not None and src.stats.get("windows", 0) >= 1:
            return min(max_seconds, max(seconds, float(src.stats.get("interval_s") or 0.0)))
        return seconds

    return phase(run_once, want)


def measure(name: str, run_once, rounds: int, seconds: float, ticker: Ticker, follow_interval: bool = True,
            budget_s: float = float("inf"), min_rounds: int = 3, max_phase_s: float = 30.0) -> dict:
    import graphmon

    for _ in range(3):
        run_once()  # warm: compile, capture, caches
    per_round, on_all, off_all, windows, timelines, series = [], [], [], [], [], []
    t_start = time.monotonic()
    for r in range(rounds):
        spent = time.monotonic() - t_start
        if r >= min_rounds and spent + spent / r > budget_s:
            break  # another round would overrun this workload's share of the device call
        # on then off in even rounds, off then on in odd ones: a drift over the run (clocks,
        # other tenants) cancels in the mean instead of showing up as overhead. An "off" phase
        # lasts as long as its round's "on" (off first: the previous round's "on")
        off_first = r % 2 == 1
        if off_first:
            off_s = per_round[-1]["on_seconds"]
            off, off_ends, t_off0, t_off1, gc_off = off_phase(run_once, off_s)
        t_att = time.perf_counter()
        # default sampling, in code: with GRAPHMON_AGENT set (mode "agent", the production path)
        # a light collector that ships windows to the agent process; else the whole exporter here
        ex, src = attach_ready()
        got: list = []
        if src is not None:
            src.taps.append(got.append)
        attach_ms = (time.perf_counter() - t_att) * 1e3
        sweep()
        t_on = time.monotonic()
        on, on_ends = on_phase(run_once, seconds, src, follow_interval, max_phase_s)
        on_s = time.monotonic() - t_on
        stats = dict(src.stats) if src is not None else {}
        health = src.health() if src is not None else None
        plog = [dict(p) for p in getattr(src, "phase_log", [])] if src is not None else []
        # a Python callback on every graph launch outside windows would show here (issue 13)
        gate = src.subscription.gate if src is not None else None  # the launch callbacks' switch
        cb = {"launch_callbacks_on_at_end": gate.on if gate is not None else None,
              "pending_first_launch": src.registry.pending_first_launch if src is not None else None}
        graphmon.detach()
        if not off_first:
            off, off_ends, t_off0, t_off1, gc_off = off_phase(run_once, on_s)  # as long as its "on"
        gc_on = phase_gc(on, on_ends)
        tl = timeline(plog, on, on_ends, float(np.median(off)))
        timelines.append({"round": r, **{k: v for k, v in tl.items() if k != "tracing_mask"}})
        off_gc = GC.overlapping(off_ends - off, off_ends)
        off_long = off > 2 * np.median(off)
        for w, wt in zip(got, tl["windows"] + [{}] * len(got)):
            # records: what the source delivered (a light collector's records are unfiltered)
            n = len(w) if not hasattr(w, "trace") else len(w.trace)
            windows.append({"round": r, "records": n, "dropped": w.dropped,
                            "observer_slowdown": w.observer_slowdown, "seconds": w.ended_s - w.started_s,
                            "gil_hold_max_ms": ticker.max_between(w.started_s, w.ended_s + 0.5) * 1e3,
                            "collector_cpu_ms": wt.get("cpu_ms_total"),
                            "collector_cpu_ms_after_window": wt.get("cpu_ms_after_window")})
        per_round.append({
            "round": r, "steps_off": len(off), "steps_on": len(on), "attached": ex is not None, "attach_ms": attach_ms,
            "max_off_ms": float(off.max() * 1e3), "max_on_ms": float(on.max() * 1e3),
            "median_off_ms": float(np.median(off) * 1e3), "median_on_ms": float(np.median(on) * 1e3),
            "p999_off_ms": float(np.percentile(off, 99.9) * 1e3), "p999_on_ms": float(np.percentile(on, 99.9) * 1e3),
            "median_overhead_pct": float((np.median(on) / np.median(off) - 1) * 100),
            "ticker_stall_max_off_ms": ticker.max_between(t_off0, t_off1) * 1e3,
            "max_step_in_windows_ms": tl["longest_step_in_windows_ms"],
            "max_step_tracing_ms": tl["longest_step_tracing_ms"], "max_step_not_tracing_ms": tl["longest_step_not_tracing_ms"],
            "gc_collections_off": gc_off, "gc_collections_on": gc_on,  # by generation 0, 1, 2
            "long_steps_off": int(off_long.sum()), "long_steps_off_in_gc": int((off_long & (off_gc >= 0)).sum()),
            "order": "off,on" if off_first else "on,off", "on_seconds": on_s, "off_seconds": float(off_ends[-1] - off_ends[0] + off[0]) if len(off) else 0.0,
            "traced_ms": [p.get("traced_ms") for p in plog], "interval_s": stats.get("interval_s"),
            "hold_cpu_max_ms": [p.get("hold_cpu_max_ms") for p in plog],
            "steps_tracing": int(tl["steps_tracing"]),
            "windows": len(got), "state": health.state if health else None,
            "errors": dict(health.errors) if health else {}, "stats": stats, **cb,
        })
        on_all.append(on)
        off_all.append(off)
        series.append({"on_ms": on * 1e3, "off_ms": off * 1e3, "on_tracing": tl["tracing_mask"]})
    on_c, off_c = np.concatenate(on_all), np.concatenate(off_all)
    ov = np.array([p["median_overhead_pct"] for p in per_round])
    half = T95.get(len(ov) - 1, 1.96) * ov.std(ddof=1) / np.sqrt(len(ov)) if len(ov) > 1 else float("nan")
    rates = [p["stats"].get("ingest_records_per_s", 0.0) for p in per_round if p["stats"]]
    rates_wall = [p["stats"].get("ingest_records_per_s_wall", 0.0) for p in per_round if p["stats"]]
    cpu = [w["collector_cpu_ms"] for w in windows if w.get("collector_cpu_ms") is not None]
    rec = [w["records"] for w in windows]
    return {
        "_series": series,  # per-step times (saved apart: host-impact-steps.npz)
        "rounds": per_round, "windows": windows, "timeline": timelines, "seconds_per_phase": seconds,
        "phases_follow_interval": follow_interval,
        "steps_tracing_share": sum(p["steps_tracing"] for p in per_round) / max(1, sum(p["steps_on"] for p in per_round)),
        "max_step_increase_ms": max(p["max_on_ms"] - p["max_off_ms"] for p in per_round),
        "p999_step_ratio": float(np.percentile(on_c, 99.9) / np.percentile(off_c, 99.9)),
        # the same two figures for one "off" phase against another (A/A: graphmon in neither), the
        # largest over every ordered pair of off phases: what the machine alone gives these statistics
        **phases_null([x * 1e3 for x in off_all]),
        "median_overhead_pct": float(ov.mean()), "ci95_low_pct": float(ov.mean() - half),
        "ci95_high_pct": float(ov.mean() + half),
        "gil_hold_max_ms_per_window": max((w["gil_hold_max_ms"] for w in windows), default=None),
        # records per second of the collector thread's CPU (min over rounds); _wall: of its wall
        # time, which includes waiting for the host's GIL (numpy releases it inside decode)
        "ingest_records_per_s": min(rates, default=None), "ingest_records_per_s_wall": min(rates_wall, default=None),
        # the longest step that overlapped a window (ref phase to sink) minus the round's longest step off
        "max_step_increase_in_windows_ms": max(p["max_step_in_windows_ms"] - p["max_off_ms"] for p in per_round),
        "collector_cpu_ms_per_window_max": max(cpu, default=None),
        # the same, split (timeline): steps with kernel tracing on for part of them (the GPU runs
        # slower under CUPTI: observer_slowdown) and every other step of the on phase (host side)
        "max_step_increase_tracing_ms": max(p["max_step_tracing_ms"] - p["max_off_ms"] for p in per_round),
        "max_step_increase_not_tracing_ms": max(p["max_step_not_tracing_ms"] - p["max_off_ms"] for p in per_round),
        "gc_collections_on_total": [sum(p["gc_collections_on"][g] for p in per_round) for g in range(3)],
        "gc_collections_off_total": [sum(p["gc_collections_off"][g] for p in per_round) for g in range(3)],
        "records_per_window_median": float(np.median(rec)) if rec else None,
        "decode_cpu_max_ms": max((p["stats"].get("decode_cpu_max_ms", 0.0) for p in per_round if p["stats"]), default=None),
        "ticker_stall_max_off_ms": max(p["ticker_stall_max_off_ms"] for p in per_round),
        "observer_slowdown": [w["observer_slowdown"] for w in windows],
        "median_step_off_ms": float(np.median(off_c) * 1e3),
        # the longest piece of the collector's work between two yields (its sink's included), CPU
        "hold_cpu_max_ms": max((h for p in per_round for h in p["hold_cpu_max_ms"] if h is not None), default=None),
        "interval_s_median": float(np.median([p["interval_s"] for p in per_round if p["interval_s"]]))
        if any(p["interval_s"] for p in per_round) else None,
        "traced_ms_median": float(np.median([t for p in per_round for t in p["traced_ms"] if t is not None]))
        if any(t is not None for p in per_round for t in p["traced_ms"]) else None,
    }


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--quick", action="store_true", help="shorter phases (< 90 s in all)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per workload and mode, at most (3 at least)")
    ap.add_argument("--seconds", type=float, help="seconds per phase, at least (default 2.5, quick 1.5)")
    ap.add_argument("--phases", choices=("interval", "fixed"), default="interval",
                    help="interval: each 'on' phase lasts the collector's own wait after its window (one window "
                         "per phase, as dense as the default sampling in steady state); fixed: --seconds "
                         "(one window per phase: denser)")
    ap.add_argument("--max-phase-s", type=float, default=30.0,
                    help="an 'on' phase lasts at most this (a longer collector interval: windows denser than default)")
    ap.add_argument("--paired-s", type=float, default=0.0,
                    help="per workload and mode, seconds of short alternating off/on blocks for the median "
                         "overhead (0: none)")
    ap.add_argument("--ingest-s", type=float, default=0.0,
                    help="per workload and mode, seconds of one attach with a window every 0.5 s: ingest on real "
                         "buffers in steady state (0: none)")
    ap.add_argument("--block-s", type=float, default=0.1, help="seconds per block of --paired-s")
    ap.add_argument("--paired-arms", default="idle",
                    help="comma list of what an 'on' block attaches, interleaved pair by pair (--paired-s each): idle "
                         "(idle_unsubscribe_s=0.001: graphmon between windows once no graph is being made, "
                         "unsubscribed from CUPTI), subscribed (idle_unsubscribe_s=0: as in the first "
                         "idle_unsubscribe_s after a graph is made), default (the attach settings as they are)")
    ap.add_argument("--attach-json", default="{}",
                    help="settings for every attach of the rounds and ingest (e.g. '{\"idle_unsubscribe_s\": 1}': "
                         "each round's 'on' phase reaches steady state after its first second)")
    ap.add_argument("--skip-s", type=float, default=0.03,
                    help="seconds left out at the start of each paired block (the attach's or detach's transient)")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="seconds for all the rounds of all workloads and modes: rounds beyond 3 stop when "
                         "the next one would overrun a workload's share")
    ap.add_argument("--only", default="", help="comma list of workloads to run (launch_loop only when named)")
    ap.add_argument("--paired-only", default="",
                    help="comma list of workloads measured by --paired-s blocks alone, no rounds (e.g. launch_loop)")
    ap.add_argument("--modes", default="agent,inprocess",
                    help="agent: light collector + a `graphmon agent` process (production); inprocess: the whole "
                         "exporter in this process (graphmon.attach() without an agent)")
    a = ap.parse_args(argv)
    ATTACH_KW.update(json.loads(a.attach_json))
    arms = {"idle": {"idle_unsubscribe_s": 0.001}, "subscribed": {"idle_unsubscribe_s": 0.0}, "default": {}}
    paired_arms = [x for x in a.paired_arms.split(",") if x]
    unknown = [x for x in paired_arms if x not in arms]
    if unknown:
        ap.error(f"--paired-arms: unknown {unknown} (known: {sorted(arms)})")
    seconds = a.seconds or (1.5 if a.quick else 2.5)
    R["settings"] = {"quick": a.quick, "rounds": a.rounds, "seconds_per_phase": seconds, "phases": a.phases,
                     "budget_s": a.budget_s, "max_phase_s": a.max_phase_s, "paired_s": a.paired_s,
                     "block_s": a.block_s, "skip_s": a.skip_s, "ingest_s": a.ingest_s, "paired_arms": paired_arms,
                     "attach": dict(ATTACH_KW)}
    R["versions"] = versions()
    save(a.out)
    ticker = Ticker()
    ticker.start()
    import gc

    gc.callbacks.append(GC)
    t_start = time.monotonic()
    makers = {
        "hf_static_bs1": lambda: hf_workload(1, 64 if a.quick else 128),
        "hf_static_bs4": lambda: hf_workload(4, 64 if a.quick else 128),
        "decode_server": lambda: decode_server_workload(16 if a.quick else 48, 200),
        "launch_loop": lambda: launch_loop_workload(),
    }
    paired_only = {x for x in a.paired_only.split(",") if x}
    only = {x for x in a.only.split(",") if x}
    modes = [m for m in a.modes.split(",") if m]
    agent = start_agent() if "agent" in modes else None
    for name, make in makers.items():
        if (name not in only) if only else name == "launch_loop":
            continue  # launch_loop: only when named
        t0 = time.monotonic()
        try:
            run_once, meta = make()
            for mode in modes:  # side by side on the same workload object, one after the other
                if mode == "agent":
                    os.environ["GRAPHMON_AGENT"] = agent[1]
                else:
                    os.environ.pop("GRAPHMON_AGENT", None)
                n_sections = len(modes) * max(1, len(only & set(makers)) if only else len(makers))
                if name in paired_only:  # the paired blocks alone (no windows: attached and idle)
                    for _ in range(3):
                        run_once()
                    import graphmon

                    attach_ready()  # the process's first attach (imports, CUPTI's load) outside the blocks
                    graphmon.detach()
                    res, interval_s = {"_series": [], "paired_only": True}, 1e9
                else:
                    res = measure(name, run_once, max(3, a.rounds), seconds, ticker,
                                  follow_interval=a.phases == "interval", budget_s=a.budget_s / n_sections,
                                  max_phase_s=a.max_phase_s)
                    if a.ingest_s > 0:
                        res["ingest_steady"] = ingest_steady(run_once, a.ingest_s)
                    interval_s = res.get("interval_s_median") or 10.0
                if a.paired_s > 0:  # the arms side by side, interleaved pair by pair; the first is "paired"
                    p = paired(run_once, a.paired_s * len(paired_arms), a.block_s, interval_s, skip_s=a.skip_s,
                               arms={arm: {**ATTACH_KW, **arms[arm]} for arm in paired_arms})
                    by_arm = p.pop("_arm_pairs", {paired_arms[0]: p.get("_pairs")})
                    p.pop("_pairs", None)
                    steps_of = p.pop("_arm_steps", {})
                    for arm in paired_arms:
                        STEPS[f"{name}@{mode}/paired_{arm}_pct"] = by_arm[arm]
                        for side, x in steps_of.get(arm, {}).items():
                            STEPS[f"{name}@{mode}/paired_{arm}_{side}_ms"] = x
                    res["paired"] = p
                    res["paired_arms"] = p.pop("arms", {paired_arms[0]: p})
                STEPS.update({f"{name}@{mode}/r{i}/{k}": v for i, ser in enumerate(res.pop("_series"))
                              for k, v in ser.items()})
                np.savez_compressed(os.path.join(a.out, "host-impact-steps.npz"), **STEPS)
                res.update(meta, mode=mode)
                R["workloads"][name if mode == modes[0] else f"{name}@{mode}"] = res
                save(a.out)
            os.environ.pop("GRAPHMON_AGENT", None)
        except Exception as e:
            R["errors"][name] = {"error": repr(e), "traceback": traceback.format_exc()[-4000:]}
            try:
                import graphmon

                graphmon.detach()
            except Exception:
                pass
        R.setdefault("section_seconds", {})[name] = time.monotonic() - t0
        save(a.out)
        print(f"host_impact: {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    ticker.stop.set()
    if agent is not None:
        agent[0].terminate()
    w = R["workloads"]
    R["summary"] = {k: {m: v.get(m) for m in ("max_step_increase_ms", "max_step_increase_in_windows_ms",
                                              "max_step_increase_tracing_ms", "max_step_increase_not_tracing_ms",
                                              "gc_collections_on_total", "gc_collections_off_total",
                                              "p999_step_ratio", "aa_max_step_diff_ms", "aa_p999_step_ratio_max",
                                              "median_overhead_pct", "ci95_low_pct", "ci95_high_pct",
                                              "gil_hold_max_ms_per_window", "ticker_stall_max_off_ms",
                                              "collector_cpu_ms_per_window_max", "decode_cpu_max_ms",
                                              "records_per_window_median", "ingest_records_per_s",
                                              "ingest_records_per_s_wall", "hold_cpu_max_ms", "steps_tracing_share",
                                              "interval_s_median", "traced_ms_median")}
                    | {f"{m}_paired": v.get("paired", {}).get(m) for m in
                       ("median_overhead_pct", "ci95_low_pct", "ci95_high_pct", "p25_overhead_pct", "p25_ci95_pct",
                        "mean_overhead_pct", "mean_ci95_pct", "n_pairs", "windows", "attach_ms_median",
                        "detach_ms_median", "arm", "first_half", "second_half", "tail")}
                    | {f"paired_{arm}": {m: p.get(m) for m in ("median_overhead_pct", "ci95_low_pct", "ci95_high_pct",
                                                               "n_pairs", "first_half", "second_half", "tail")}
                       for arm, p in v.get("paired_arms", {}).items()}
                    for k, v in w.items()}
    R["targets"] = {"max_step_increase_ms": 1.0, "p999_step_ratio": 1.05, "median_overhead_pct": 0.3,
                    "ci95_high_pct": 0.5, "gil_hold_max_ms_per_window": 1.0, "ingest_records_per_s": 10e6}
    R["total_seconds"] = time.monotonic() - t_start
    save(a.out)
    print(json.dumps(R["summary"], indent=1, default=str))
    return 0 if not R["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
