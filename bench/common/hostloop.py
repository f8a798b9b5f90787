"""A serving loop's steps with graphmon attached and detached, and their statistics: shared by
the overhead benches (overhead/host_impact.py, attach_stall.py, cupti_idle_cost.py) and
collector/attach_cpu.py: a ticker thread and a garbage-collection log, attach and detach, the
rounds' timeline of collector phases against long host steps, steady ingest, and the paired
blocks (``paired``) the median overhead is read from: graphmon attached for 0.1 s blocks against
detached blocks beside them, the host loop never pausing, the median over pairs of the log-ratio
with its sign-test interval. No torch: the workloads come from the benches (common/hf.py)."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from typing import Callable

import numpy as np

# Student t, two-sided 95%, by degrees of freedom (the rounds' t intervals; 1.96 beyond 10)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


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


def sweep() -> None:
    """Before every phase, off and on, an untimed full collection: attach() and detach()
    allocate once per round (threads, settings, the collector), and a collection they trigger
    would otherwise land in whichever phase follows (a 7-28 ms gen-2 pause in an HF process).
    Collections the phase's own steady state triggers still land in it (counted per phase)."""
    import gc

    gc.collect()



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
    CUPTI states of bench/overhead/cupti_idle_cost.py); turn_on may return a source with ``stats``.
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

