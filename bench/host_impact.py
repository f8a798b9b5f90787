"""How graphmon feels to a serving loop (issue 13): per-step host timestamps with graphmon on/off.

Run on a CUDA machine with torch, transformers and cupti-python (graphmon importable):

    python bench/host_impact.py --out DIR --modes agent --budget-s 420   # ~8 min on an H200
    python bench/host_impact.py --out DIR --phases fixed --quick          # < 90 s, windows denser

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
attach itself stalls the loop: bench/attach_stall.py);
``--paired-arms idle,subscribed`` measures graphmon unsubscribed between windows and subscribed
side by side, pair by pair in the same run; ``--attach-json`` sets every attach's settings; with
``--ingest-s``, ingest on real buffers in steady state (``ingest_steady``). Writes
DIR/host-impact.json after each section: one failing section never loses the others.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import traceback
from typing import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

R: dict = {"workloads": {}, "errors": {}, "versions": {}}
STEPS: dict = {}  # per-step times of every phase (host-impact-steps.npz): for looking at the noise
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def save(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "host-impact.json"), "w") as fh:
        json.dump(R, fh, indent=1, default=str)


class Ticker(threading.Thread):
    """Only ticks; remembers (wall time, stall) of every stall over 0.2 ms (a GIL hold elsewhere)."""

    def __init__(self, period_s: float = 0.0002) -> None:
        super().__init__(name="host-impact-ticker", daemon=True)
        self.period_s, self.stop, self.stalls = period_s, threading.Event(), []

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(self.period_s)
            now = time.perf_counter()
            gap = now - last - self.period_s
            if gap > 2e-4:
                self.stalls.append((time.time(), gap))
            last = now

    def max_between(self, t0: float, t1: float) -> float:
        return max((g for t, g in self.stalls if t0 <= t <= t1), default=0.0)


class GcLog:
    """Every garbage collection's (perf_counter start, end, generation): a long host step that
    overlaps one is the interpreter's pause, whoever allocated (graphmon allocates little)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []
        self._t0 = 0.0

    def __call__(self, what: str, info: dict) -> None:
        if what == "start":
            self._t0 = time.perf_counter()
        else:
            self.spans.append((self._t0, time.perf_counter(), int(info.get("generation", -1))))

    def counts(self, t0: float, t1: float) -> list[int]:
        """Collections of generation 0, 1, 2 that started in [t0, t1] (perf_counter s)."""
        out = [0, 0, 0]
        for a, _, g in self.spans:
            if t0 <= a <= t1 and 0 <= g <= 2:
                out[g] += 1
        return out

    def overlapping(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per step: the generation of a collection that overlapped it (-1: none)."""
        out = np.full(len(starts), -1)
        for a, b, g in self.spans:
            hit = (starts <= b) & (ends >= a)
            out[hit] = np.maximum(out[hit], g)
        return out


GC = GcLog()


# ---------------------------------------------------------------------- workloads: step(bs) -> step times (s)
def hf_workload(bs: int, new_tokens: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    gc = model.generation_config
    gc.pad_token_id = gc.eos_token_id = None  # random weights: never stop early, always new_tokens steps
    if getattr(gc, "disable_compile", None):
        gc.disable_compile = False  # transformers compiles the decode forward itself (a compileable cache)
    cc = getattr(gc, "compile_config", None)
    compile_info = {"compile_config": repr(cc), "mode": getattr(cc, "mode", None)}

    class Stamps(LogitsProcessor):
        """Called once per generated token on the host: reads the clock, returns the scores as is."""

        def __init__(self) -> None:
            self.t: list[float] = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    ids = torch.randint(0, cfg.vocab_size, (bs, 16), device="cuda")
    mask = torch.ones_like(ids)

    def run_once() -> np.ndarray:
        st = Stamps()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                           cache_implementation="static", logits_processor=LogitsProcessorList([st]))
        return np.asarray(st.t)  # step end times: the first token is the prefill's, then one per decode step

    return run_once, {"compile": compile_info, "config": {"layers": 8, "hidden": 1024, "batch": bs,
                                                          "new_tokens": new_tokens}}


def decode_server_workload(layers: int, steps_per_call: int):
    import torch

    import decode_server as ds

    model = ds.DecodeModel(layers=layers)
    (g,) = ds.build(model, [1], ["uploaded"])

    def run_once() -> np.ndarray:
        t = np.empty(steps_per_call + 1)
        t[0] = time.perf_counter()
        for i in range(steps_per_call):
            g.replay()
            torch.cuda.synchronize()
            t[i + 1] = time.perf_counter()
        return t  # step end times (perf_counter s), the first one the start

    return run_once, {"config": {"layers": layers, "batch": 1, "sync": "every step"}}


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
def sweep() -> None:
    """Before every phase, off and on, an untimed full collection: attach() and detach()
    allocate once per round (threads, settings, the collector), and a collection they trigger
    would otherwise land in whichever phase follows (a 7-28 ms gen-2 pause in an HF process).
    Collections the phase's own steady state triggers still land in it (counted per phase)."""
    import gc

    gc.collect()


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


def phase(run_once, seconds: "float | Callable[[], float]") -> tuple[np.ndarray, np.ndarray]:
    """Step durations (s) and each step's end time (perf_counter s); run_once gives end times.
    ``seconds`` may be a callable, asked again after every call of run_once."""
    want = seconds if callable(seconds) else lambda: seconds
    steps, ends, t0 = [], [], time.monotonic()
    while time.monotonic() - t0 < want():
        t = run_once()
        steps.append(np.diff(t))
        ends.append(t[1:])
    if not steps:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(steps), np.concatenate(ends)


PHASES = ("ref", "window", "drain", "flush", "collect", "build", "sink")


def timeline(phase_log: list, steps: np.ndarray, ends: np.ndarray, median_s: float) -> dict:
    """Per window: each phase's ms, and the long host steps (> 2x median) that overlap it; plus the
    long steps outside every window (not graphmon's windows: the launch callbacks, the exporter...)."""
    long_i = np.flatnonzero(steps > 2 * median_s)
    starts = ends - steps
    gc_gen = GC.overlapping(starts, ends)
    in_window = np.zeros(len(steps), bool)
    tracing = np.zeros(len(steps), bool)  # kernel tracing on during part of the step (CUPTI slows the GPU)
    out = []
    for ph in phase_log:
        t0 = ph.get("t0")
        if t0 is None:
            continue
        marks = [("t0", t0)] + [(k, ph[k]) for k in PHASES if k in ph]
        cpu = ph.get("cpu", {})
        cmarks = [("t0", cpu["t0"])] + [(k, cpu[k]) for k in PHASES if k in cpu] if "t0" in cpu else []
        rows = {"phases_ms": {k: (t - p) * 1e3 for (_, p), (k, t) in zip(marks, marks[1:])},
                # the collector thread's own CPU per phase: what graphmon itself spent (its GIL)
                "cpu_ms": {k: (t - p) * 1e3 for (_, p), (k, t) in zip(cmarks, cmarks[1:])},
                "decode_ms": ph.get("decode_ms"), "decode_cpu_ms": ph.get("decode_cpu_ms"),
                # of decode_cpu_ms: records -> columns, then store + kernel-name ids (new names read once)
                "decode_parts_cpu_ms": ph.get("decode_parts_cpu_ms"), "long_steps": []}
        rows["cpu_ms_total"] = sum(rows["cpu_ms"].values())
        rows["cpu_ms_after_window"] = sum(v for k, v in rows["cpu_ms"].items() if k not in ("ref", "window"))
        t_end = marks[-1][1]
        in_window |= (ends >= t0) & (starts <= t_end)
        if "ref" in ph and "drain" in ph:
            tracing |= (ends >= ph["ref"]) & (starts <= ph["drain"])
        for i in long_i[(ends[long_i] >= t0) & (starts[long_i] <= t_end)].tolist():
            # the phase in which the step ended (a step stalled by a phase ends inside or just after it)
            where = next((k for k, t in marks[1:] if ends[i] <= t), "after_sink")
            rows["long_steps"].append({"start_ms": (starts[i] - t0) * 1e3, "ms": steps[i] * 1e3, "phase": where,
                                       "gc_generation": int(gc_gen[i])})
        rows["n_long_steps"] = len(rows["long_steps"])
        rows["long_steps"] = sorted(rows["long_steps"], key=lambda x: -x["ms"])[:20]  # the longest: bounded JSON
        out.append(rows)
    outside = long_i[~in_window[long_i]]
    return {"windows": out, "long_steps_outside_windows": int(len(outside)),
            "longest_step_outside_windows_ms": float(steps[outside].max() * 1e3) if len(outside) else 0.0,
            "long_steps_outside_windows_in_gc": int((gc_gen[outside] >= 0).sum()),
            "longest_step_in_windows_ms": float(steps[in_window].max() * 1e3) if in_window.any() else 0.0,
            # every step of the on phase, split: kernel tracing on for part of it (GPU observer effect,
            # reported per window as observer_slowdown) or not (graphmon's host-side cost, and noise)
            "longest_step_tracing_ms": float(steps[tracing].max() * 1e3) if tracing.any() else 0.0,
            "longest_step_not_tracing_ms": float(steps[~tracing].max() * 1e3) if (~tracing).any() else 0.0,
            "long_step_threshold_ms": 2 * median_s * 1e3,
            "steps_tracing": int(tracing.sum()), "tracing_mask": tracing}


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


ATTACH_KW: dict = {}  # --attach-json: settings every attach of the rounds and of ingest_steady gets


def attach_ready(**kw):
    """graphmon.attach(port=0, **ATTACH_KW, **kw) and its source once started (CUPTI subscribed; 5 s
    at most), so that attach's one-time start is kept apart from the steady state a phase measures."""
    import graphmon
    from graphmon.host.attach import attached

    ex = graphmon.attach(port=0, **{**ATTACH_KW, **kw})
    src = attached().source if attached() is not None else None
    t_w = time.monotonic()
    while src is not None and src.health().state == "starting" and time.monotonic() - t_w < 5:
        time.sleep(0.01)
    return ex, src


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
        cb = {"launch_callbacks_on_at_end": getattr(src, "_launch_cb_on", None),
              "pending_first_launch": getattr(getattr(src, "registry", None), "pending_first_launch", None)}
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


def phases_null(off_ms: list) -> dict:
    """For whole-phase statistics, "off" against "off": the largest difference of longest steps
    and the largest p99.9 ratio over ordered pairs of off phases (ms arrays; 2 phases at least)."""
    pairs = [(a, b) for i, a in enumerate(off_ms) for j, b in enumerate(off_ms) if i != j and len(a) and len(b)]
    if not pairs:
        return {"aa_max_step_diff_ms": None, "aa_p999_step_ratio_max": None}
    return {"aa_max_step_diff_ms": float(max(a.max() - b.max() for a, b in pairs)),
            "aa_p999_step_ratio_max": float(max(np.percentile(a, 99.9) / np.percentile(b, 99.9) for a, b in pairs))}


def ingest_steady(run_once, seconds: float) -> dict:
    """Ingest on real buffers in steady state: one attach, a window every 0.5 s (no tracing
    budget) for ``seconds``, the records and decode CPU of each window after the first (the
    rounds re-attach, so each of their windows is the first of an attach: names read, decoder
    measured). records/s of the collector thread's CPU in decode (gather + columns + name ids)."""
    import graphmon

    ex, src = attach_ready(interval_s=0.5, max_traced_share=1.0, first_window_s=0.2)
    got: list = []
    if src is None:
        graphmon.detach()
        return {"error": "not attached"}
    src.taps.append(lambda w: got.append(len(w)))
    phase(run_once, seconds)
    plog = [dict(p) for p in src.phase_log]
    path = src.info().get("decode")
    graphmon.detach()
    rows = [{"records": n, "decode_cpu_ms": p["decode_cpu_ms"], "decode_parts_cpu_ms": p["decode_parts_cpu_ms"],
             "hold_cpu_max_ms": p.get("hold_cpu_max_ms")} for n, p in zip(got, plog)][1:]
    rates = [r["records"] / (r["decode_cpu_ms"] / 1e3) for r in rows if r["decode_cpu_ms"] > 0 and r["records"]]
    return {"decode": path, "windows": len(rows), "records_per_window_median": float(np.median([r["records"] for r in rows])) if rows else None,
            "records_per_s_median": float(np.median(rates)) if rates else None,
            "records_per_s_min": float(np.min(rates)) if rates else None,
            "decode_cpu_ms_median": float(np.median([r["decode_cpu_ms"] for r in rows])) if rows else None,
            "per_window": rows}


def sign_test_ci(x: np.ndarray) -> "list[float] | None":
    """Distribution-free 95% interval of the median of ``x`` (order statistics, binomial(n, 1/2))."""
    from math import comb

    n = len(x)
    if n < 6:
        return None
    k, acc = 0, 0.0
    while k < n // 2 and acc + comb(n, k) / 2**n <= 0.025:
        acc += comb(n, k) / 2**n
        k += 1
    srt = np.sort(x)
    return [float(srt[max(k - 1, 0)]), float(srt[n - max(k, 1)])]


def paired(run_once, total_s: float, block_s: float, interval_s: float, skip_s: float = 0.03,
           seed: int = 0, turn_on: "Callable[[float], object] | None" = None,
           turn_off: "Callable[[], None] | None" = None, attach_kw: "dict | None" = None,
           arms: "dict[str, dict] | None" = None) -> dict:
    """The median overhead from short alternating blocks: the host loop runs without a break
    while a control thread attaches graphmon for an "on" block and detaches it for the "off"
    block beside it (off,on then on,off), each block ``block_s`` long once ``skip_s`` has passed
    (the attach's or detach's own transient, kept out: a serving process pays it once). Each
    step belongs to the block it lies wholly inside. An "on" block's window comes with the
    probability block_s/interval_s (at a random time in it): windows as frequent as the default
    sampling, so the blocks measure graphmon between windows (the rounds measure the windows).

    Why: every workload's step time switches between levels that last from 0.1 s to seconds
    (H200: decode_server 1.67 and 1.9 ms, HF 1.3 and 1.6-2.2 ms), in "off" phases too. Long
    phases then compare how long each spent in a slow level; 2 s blocks still gave +-8-10%.
    Per pair: 100 * log(median step on / median step off); the headline is the median over
    pairs (a pair that straddles a level switch is an outlier, not a shift) with its
    sign-test interval; the mean of ratios is biased upward by sigma^2/2 (0.1-0.5% here).
    Simulated on the recorded "off" phases (null data): 0.1 s blocks give +-0.25% in ~15 s
    (decode_server) and ~150-450 s (HF).

    ``turn_on(first_window_s)`` / ``turn_off()`` replace graphmon's attach / detach (the
    CUPTI states of bench/cupti_idle_cost.py); turn_on may return a source with ``stats``.
    ``attach_kw``: settings for the attach. ``arms`` ({name: attach settings}): several kinds of
    "on" side by side in the same run, pairs (0, 1) on the first, (2, 3) on the next and so on
    (each arm gets both orders); the result holds the first arm's figures and ``arms`` (each
    arm's). Each block is also split at its middle (``first_half``/``second_half``): an
    attach's transient would sit in the first half."""
    import graphmon

    arms = arms or {"on": dict(attach_kw or {})}
    names = list(arms)
    arm_of = lambda i: names[(i // 2) % len(names)]  # noqa: E731
    if turn_on is None:
        turn_on = lambda first, kw: attach_ready(first_window_s=first, **kw)[1]  # noqa: E731
    else:
        custom_on = turn_on
        turn_on = lambda first, kw: custom_on(first)  # noqa: E731
    if turn_off is None:
        turn_off = graphmon.detach
    rng = np.random.default_rng(seed)
    blocks: list[dict] = []
    stop = threading.Event()
    errors: list[str] = []

    def control() -> None:
        i = 0
        try:
            while not stop.is_set():
                for arm in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    b = {"pair": i, "arm": arm, "windows": 0, "kind": arm_of(i)}
                    if arm == "on":
                        window = bool(rng.random() < block_s / max(interval_s, block_s))
                        first = skip_s + float(rng.uniform(0.0, block_s)) if window else 1e6
                        t_a = time.perf_counter()
                        src = turn_on(first, arms[arm_of(i)])
                        b["attach_ms"] = (time.perf_counter() - t_a) * 1e3
                    b["t0"] = time.perf_counter() + skip_s
                    time.sleep(skip_s + block_s)
                    b["t1"] = time.perf_counter()
                    if arm == "on":
                        stats = getattr(src, "stats", None) or {}
                        b["windows"] = int(stats.get("windows", 0))
                        b["subscribed_at_end"] = bool(getattr(src, "subscribed", False))  # the arm it measured
                        t_d = time.perf_counter()
                        turn_off()
                        b["detach_ms"] = (time.perf_counter() - t_d) * 1e3
                    blocks.append(b)
                i += 1
        except Exception as e:  # the host loop below stops too
            errors.append(repr(e))
            stop.set()

    sweep()
    ctl = threading.Thread(target=control, name="host-impact-paired", daemon=True)
    steps_l, ends_l = [], []
    t_end = time.monotonic() + total_s
    ctl.start()
    while time.monotonic() < t_end and not stop.is_set():
        t = run_once()
        steps_l.append(np.diff(t))
        ends_l.append(t[1:])
    stop.set()
    ctl.join(10)
    try:
        turn_off()  # an "on" block cut short
    except Exception:
        pass
    steps = np.concatenate(steps_l) if steps_l else np.zeros(0)
    ends = np.concatenate(ends_l) if ends_l else np.zeros(0)
    starts = ends - steps
    by_pair: dict = {}
    for b in blocks:
        sel = (starts >= b["t0"]) & (ends <= b["t1"])
        b["steps"] = int(sel.sum())
        if b["steps"] >= 5:
            x = steps[sel]
            b["_x_ms"] = x * 1e3  # the block's steps: the pooled tail (tail_compare)
            b["median_ms"], b["p25_ms"] = float(np.median(x) * 1e3), float(np.percentile(x, 25) * 1e3)
            mid = (b["t0"] + b["t1"]) / 2
            for half, m in (("h1", sel & (ends <= mid)), ("h2", sel & (starts >= mid))):
                b[f"median_ms_{half}"] = float(np.median(steps[m]) * 1e3) if m.sum() >= 3 else None
            by_pair.setdefault(b["pair"], {})[b["arm"]] = b
    pairs = [p for _, p in sorted(by_pair.items()) if len(p) == 2]
    common = {"block_s": block_s, "skip_s": skip_s, "interval_s": interval_s, "errors": errors,
              "steps_per_block_median": float(np.median([b["steps"] for b in blocks])) if blocks else None}
    per_arm = {name: {**common, "arm": name, "attach_kw": arms[name],
                      **_paired_summary([p for p in pairs if p["on"]["kind"] == name],
                                        [b for b in blocks if b["kind"] == name])} for name in names}
    # each arm's pooled block steps (ms, float32: host-impact-steps.npz)
    steps_of = {name: {side: np.concatenate([p[side]["_x_ms"] for p in pairs if p["on"]["kind"] == name]
                                            or [np.zeros(0)]).astype(np.float32) for side in ("on", "off")}
                for name in names}
    first = dict(per_arm[names[0]])
    first["_arm_steps"] = steps_of
    if len(names) > 1:
        first["arms"] = {k: {m: v for m, v in r.items() if m != "_pairs"} for k, r in per_arm.items()}
        first["_arm_pairs"] = {k: r["_pairs"] for k, r in per_arm.items()}
    return first


def tail_compare(on: list, off: list, boot: int = 400, seed: int = 0) -> dict:
    """The tail of "on" steps against "off" steps, pooled over interleaved block pairs (lists of
    per-block step arrays, ms; on[i] and off[i] are one pair).

    Why pooled blocks, not whole phases: the machine has bursts of slow steps (0.1 s to seconds,
    in "off" phases too), so the longest step or p99.9 of one 12 s phase against another mostly
    says which phase caught a burst; 0.1 s blocks side by side share the bursts. Gives the p99.9
    ratio with a 95% bootstrap interval over pairs, the longest step on minus off, the long steps
    (longer than the off median + 1 ms) per 1000 on and off, and the same figures for "off"
    against "off" (odd pairs' off blocks against even pairs'): what the estimator shows when
    nothing differs."""
    if len(on) != len(off) or len(on) < 4:
        raise ValueError("tail_compare: as many on as off blocks, 4 pairs at least")
    on_c, off_c = np.concatenate(on), np.concatenate(off)
    thr = float(np.median(off_c)) + 1.0
    rng = np.random.default_rng(seed)
    n = len(on)
    ratios = []
    for _ in range(boot):
        idx = rng.integers(0, n, n)
        ratios.append(np.percentile(np.concatenate([on[i] for i in idx]), 99.9)
                      / np.percentile(np.concatenate([off[i] for i in idx]), 99.9))
    odd, even = np.concatenate(off[1::2]), np.concatenate(off[0::2])
    return {
        "steps_on": int(on_c.size), "steps_off": int(off_c.size), "long_step_threshold_ms": thr,
        "p999_step_ratio": float(np.percentile(on_c, 99.9) / np.percentile(off_c, 99.9)),
        "p999_ci95": [float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))],
        "max_step_increase_ms": float(on_c.max() - off_c.max()),
        "long_steps_per_1000_on": float(1000 * (on_c > thr).mean()),
        "long_steps_per_1000_off": float(1000 * (off_c > thr).mean()),
        "aa_p999_step_ratio": float(np.percentile(odd, 99.9) / np.percentile(even, 99.9)),
        "aa_max_step_diff_ms": float(odd.max() - even.max()),
    }


def _paired_summary(pairs: list, blocks: list) -> dict:
    """One arm's figures from its (on, off) block pairs (see paired)."""
    med = np.array([100 * np.log(p["on"]["median_ms"] / p["off"]["median_ms"]) for p in pairs])
    halves = {}
    for half in ("h1", "h2"):
        k = f"median_ms_{half}"
        hx = np.array([100 * np.log(p["on"][k] / p["off"][k]) for p in pairs if p["on"][k] and p["off"][k]])
        halves[half] = {"median_overhead_pct": float(np.median(hx)) if len(hx) else None, "ci95_pct": sign_test_ci(hx),
                        "n_pairs": len(hx)}
    p25 = np.array([100 * np.log(p["on"]["p25_ms"] / p["off"]["p25_ms"]) for p in pairs])
    n = len(med)
    half = T95.get(n - 1, 1.96) * med.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    ci = sign_test_ci(med)
    att = [b["attach_ms"] for b in blocks if "attach_ms" in b]
    det = [b["detach_ms"] for b in blocks if "detach_ms" in b]
    tail = tail_compare([p["on"]["_x_ms"] for p in pairs], [p["off"]["_x_ms"] for p in pairs]) if n >= 4 else {}
    return {
        "n_pairs": n, "windows": int(sum(b["windows"] for b in blocks)),
        # the headline: median over pairs of 100*log(median on / median off), sign-test 95% interval
        "median_overhead_pct": float(np.median(med)) if n else None,
        "ci95_low_pct": ci[0] if ci else None, "ci95_high_pct": ci[1] if ci else None,
        # cross-checks: the 25th percentile of each block instead of its median; the mean over
        # pairs with a t interval (heavy tails: pairs that straddle a level switch)
        "p25_overhead_pct": float(np.median(p25)) if n else None, "p25_ci95_pct": sign_test_ci(p25),
        "mean_overhead_pct": float(med.mean()) if n else None,
        "mean_ci95_pct": [float(med.mean() - half), float(med.mean() + half)] if n > 1 else None,
        # the same from each block's first and second half: a transient after attach shows in the first
        "first_half": halves["h1"], "second_half": halves["h2"],
        # the tail, from the steps of every on block against those of every off block beside it
        "tail": tail,
        "on_blocks_subscribed_at_end": int(sum(b.get("subscribed_at_end", False) for b in blocks)),
        "on_blocks": int(sum(b["arm"] == "on" for b in blocks)),
        "attach_ms_median": float(np.median(att)) if att else None, "attach_ms_max": max(att, default=None),
        "detach_ms_median": float(np.median(det)) if det else None, "detach_ms_max": max(det, default=None),
        "_pairs": med,  # per pair (host-impact-steps.npz)
    }


def versions() -> dict:
    v = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "transformers", "graphmon"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:
            v[mod] = f"unavailable: {e!r}"
    try:
        from importlib.metadata import version

        v["cupti_python"] = version("cupti-python")
    except Exception:
        v["cupti_python"] = ""
    try:
        import torch

        v["cuda_runtime"] = torch.version.cuda
        v["gpu"] = torch.cuda.get_device_name()
        from graphmon.sources.cupti.api import cupti_api_version
        from graphmon.sources.cupti.libinfo import library_info

        v.update(library_info(api_version=cupti_api_version))  # the libcupti this process loaded
    except Exception as e:
        v["gpu"] = f"unavailable: {e!r}"
    return v


def start_agent():
    """A `graphmon agent` process on a private socket (what `graphmon run` or a sidecar runs)."""
    import subprocess
    import tempfile

    sock = os.path.join(tempfile.mkdtemp(prefix="host-impact-"), "agent.sock")  # the agent creates no folder
    p = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "agent", "--port", "0", "--socket", sock],
                         stderr=subprocess.PIPE, text=True)
    p.stderr.readline()  # "serving ... GRAPHMON_AGENT=..." once it listens
    threading.Thread(target=p.stderr.read, daemon=True).start()  # never let its log pipe fill
    return p, sock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
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
    a = ap.parse_args()
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
