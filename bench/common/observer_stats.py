"""Pure helpers of the observer-effect benches (bench/observer/: truth, replay_signal, hf_decode,
trace_residue, shared_probe, followup): intervals, a replay's timeline cut at event boundaries, and
a stage runner that writes its JSON after every stage. No torch, no CUPTI:
tests/bench/common/test_observer_stats.py.

Timeline definitions are graphmon's (docs/analysis.md): span = last end - first start; busy = the
length of the union of the kernels' intervals over all streams; idle = span - busy; gap = on one
stream, next start - previous end.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import Callable, Sequence

import numpy as np

BOOT = 2000  # bootstrap resamples: a 95% interval's ends move by ~1% of its width between seeds


# ---------------------------------------------------------------------- intervals
def boot_ci(x, stat: Callable = np.median, n_boot: int = BOOT, seed: int = 0, level: float = 0.95):
    """(point, lo, hi): ``stat`` of x and its percentile-bootstrap interval (resampling x)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    boots = stat(x[rng.integers(0, len(x), (n_boot, len(x)))], axis=1)
    a = (1 - level) / 2
    return float(stat(x)), float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))


def boot_diff(base, other, stat: Callable = np.median, n_boot: int = BOOT, seed: int = 0, level: float = 0.95) -> dict:
    """``stat(other) - stat(base)`` for two independent samples, in the samples' unit and in % of
    ``stat(base)``, each with a bootstrap interval (both samples resampled)."""
    a, b = np.asarray(base, float), np.asarray(other, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) == 0 or len(b) == 0:
        nan = float("nan")
        return {"base": nan, "other": nan, "diff": nan, "diff_ci": [nan, nan], "pct": nan, "pct_ci": [nan, nan],
                "n": [len(a), len(b)]}
    rng = np.random.default_rng(seed)
    sa = stat(a[rng.integers(0, len(a), (n_boot, len(a)))], axis=1)
    sb = stat(b[rng.integers(0, len(b), (n_boot, len(b)))], axis=1)
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    pa, pb = float(stat(a)), float(stat(b))
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100 * (sb - sa) / sa
    return {"base": pa, "other": pb, "diff": pb - pa, "diff_ci": [float(v) for v in np.quantile(sb - sa, q)],
            "pct": 100 * (pb - pa) / pa if pa else float("nan"),
            "pct_ci": [float(v) for v in np.nanquantile(pct, q)] if np.isfinite(pct).any() else [float("nan")] * 2,
            "n": [len(a), len(b)]}


def paired(x, y, n_boot: int = BOOT, seed: int = 0) -> dict:
    """Paired differences y - x (same replays): median and mean with intervals, median |y - x|."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    d = y - x
    d = d[np.isfinite(d)]
    med, lo, hi = boot_ci(d, np.median, n_boot, seed)
    mean, mlo, mhi = boot_ci(d, np.mean, n_boot, seed)
    return {"median": med, "median_ci": [lo, hi], "mean": mean, "mean_ci": [mlo, mhi],
            "median_abs": float(np.median(np.abs(d))) if len(d) else float("nan"),
            "p90_abs": float(np.quantile(np.abs(d), 0.9)) if len(d) else float("nan"), "n": int(len(d))}


def fit_line(k, t) -> tuple[float, float]:
    """Least-squares t = a + b k: (a, b)."""
    k, t = np.asarray(k, float), np.asarray(t, float)
    b, a = np.polyfit(k, t, 1)
    return float(a), float(b)


# ---------------------------------------------------------------------- one replay's timeline
class LayoutError(ValueError):
    """A replay's kernels do not match the graph's known layout (its kernels per group)."""


def union_busy(start, end, group, n_groups: int) -> np.ndarray:
    """Per group, the length of the union of its kernels' intervals (all streams together)."""
    start, end, group = (np.asarray(v, np.int64) for v in (start, end, group))
    out = np.zeros(n_groups)
    if len(start) == 0:
        return out
    order = np.lexsort((start, group))
    s, e, g = start[order], end[order], group[order]
    base = int(s.min())
    width = int(max(int(e.max()), int(s.max())) - base + 1)
    s2, e2 = s - base + g * 2 * width, e - base + g * 2 * width  # groups far apart: one running max serves all
    run = np.maximum.accumulate(e2)
    prev = np.concatenate(([s2[0]], run[:-1]))
    np.add.at(out, g, np.clip(e2 - np.maximum(s2, prev), 0, None))
    return out


def stream_gaps(start, end, stream) -> tuple[np.ndarray, np.ndarray]:
    """Gaps between consecutive kernels on each stream: (gap_ns, index of the kernel before it)."""
    start, end, stream = (np.asarray(v, np.int64) for v in (start, end, stream))
    order = np.lexsort((start, stream))
    same = stream[order][1:] == stream[order][:-1]
    gaps = (start[order][1:] - end[order][:-1])[same]
    return gaps, order[:-1][same]


def replay_metrics(start, end, stream, node_id, counts: Sequence[int]) -> dict:
    """One replay's kernels cut into the groups between its in-graph events.

    Kernels are put in capture order by their graph node id (CUPTI numbers a graph's nodes as
    they were captured; on the H200 a 4-stream graph's kernels did not stay on their capture
    stream's id, so stream ids cannot tell the groups apart) and cut into ``counts`` kernels per
    group; the last entry is the marker kernel captured after the last event (it only closes the
    last group's window). Group g's window runs from its earliest kernel start to group g+1's: the
    interval between the two events captured before the groups, seen by CUPTI. Per group:
    window_ns, busy_ns (union over streams), kernels, gap_sum_ns and gaps (the gap after each of
    its kernels on that kernel's stream, the one into the next group included: on one stream,
    window = busy + gap_sum). Per replay (marker excluded): span_ns, busy_total_ns, idle_ns and the
    gaps of every stream (gaps_ns)."""
    start, end, stream, node_id = (np.asarray(v, np.int64) for v in (start, end, stream, node_id))
    counts = np.asarray(counts, np.int64)
    if len(start) != counts.sum():
        raise LayoutError(f"{len(start)} kernels, the layout has {int(counts.sum())}")
    order = np.argsort(node_id, kind="stable")
    s, e, st = start[order], end[order], stream[order]
    n_groups = len(counts) - 1
    grp = np.repeat(np.arange(n_groups + 1), counts)
    bounds = np.full(n_groups + 1, np.iinfo(np.int64).max)
    np.minimum.at(bounds, grp, s)
    ends = np.zeros(n_groups + 1, np.int64)
    np.maximum.at(ends, grp, e)
    if (ends[:-1] > bounds[1:]).any():  # the events order the groups: each ends before the next starts
        raise LayoutError("groups cut in node order overlap in time")
    body = grp < n_groups
    busy = union_busy(s[body], e[body], grp[body], n_groups)
    kernels = counts[:n_groups]
    gaps_all, before = stream_gaps(s, e, st)  # the marker included: it closes the last group's gap
    gb = grp[before]
    keep = gb < n_groups
    gap_sum = np.bincount(gb[keep], weights=gaps_all[keep], minlength=n_groups)
    gap_n = np.bincount(gb[keep], minlength=n_groups)
    gaps, _ = stream_gaps(s[body], e[body], st[body])
    first, last = int(s[body].min()), int(e[body].max())
    busy_all = float(union_busy(s[body], e[body], np.zeros(int(body.sum()), np.int64), 1)[0])
    return {"window_ns": np.diff(bounds).astype(float), "busy_ns": busy, "kernels": kernels,
            "gap_sum_ns": gap_sum, "gaps": gap_n, "span_ns": float(last - first), "busy_total_ns": busy_all,
            "idle_ns": float(last - first) - busy_all, "gaps_ns": gaps, "streams": int(len(np.unique(st[body]))),
            "kernel_ns": (e - s)[body], "kernel_group": grp[body], "first_start_ns": first}


def replay_summary(start, end, stream) -> dict:
    """One replay without a known layout: span, busy, idle (ns), kernels and every stream's gaps."""
    start, end, stream = (np.asarray(v, np.int64) for v in (start, end, stream))
    busy = float(union_busy(start, end, np.zeros(len(start), np.int64), 1)[0])
    span = float(end.max() - start.min()) if len(start) else 0.0
    return {"span_ns": span, "busy_ns": busy, "idle_ns": span - busy, "kernels": int(len(start)),
            "gaps_ns": stream_gaps(start, end, stream)[0], "first_start_ns": int(start.min()) if len(start) else 0}


def group_times_ns(inner_ms) -> np.ndarray:
    """Per replay, the time between consecutive in-graph events (ns): (R, G+1) elapsed times of
    each event from the first, in ms, as torch's Event.elapsed_time gives them -> (R, G)."""
    a = np.asarray(inner_ms, float)
    return np.diff(a, axis=1) * 1e6


def replay_of(corr) -> tuple[np.ndarray, np.ndarray]:
    """Replay number per kernel: graph launches in correlation-id order (= launch order)."""
    uniq, idx = np.unique(np.asarray(corr, np.int64), return_inverse=True)
    return idx, uniq


# ---------------------------------------------------------------------- the ground-truth comparison
def compare_groups(e_untraced, e_traced, traced_metrics: list[dict], types: Sequence, n_boot: int = BOOT) -> dict:
    """Untraced vs traced time of event-bounded groups, and CUPTI's view of the traced replays.

    ``e_untraced`` (Ru, G) and ``e_traced`` (Rt, G): event group times (ns) of untraced and traced
    replays; ``traced_metrics``: replay_metrics of each traced replay (the same Rt replays, in
    order; None where the replay's records did not fit the layout); ``types``: a label per group
    (groups of one label are averaged within a replay). Per label: event times and tracing's
    inflation (ns, %, intervals over replays); CUPTI's window - the event time of the same replay
    (paired); busy; idle untraced (event time - busy: busy taken from CUPTI, i.e. kernels assumed
    to run as long untraced) and traced (by events, by CUPTI); idle per kernel; CUPTI's mean gap.
    On one stream every kernel is followed by one gap and idle = the gaps' sum, so idle per
    kernel is the mean gap, untraced and traced."""
    eu, et = np.asarray(e_untraced, float), np.asarray(e_traced, float)
    types = np.asarray([str(t) for t in types])
    ok = np.array([m is not None for m in traced_metrics], bool)
    out: dict = {"replays": {"untraced": int(len(eu)), "traced": int(len(et)), "traced_with_records": int(ok.sum())}}
    for label in dict.fromkeys(types.tolist()):
        cols = types == label
        u, t = eu[:, cols].mean(1), et[:, cols].mean(1)
        r: dict = {"groups": int(cols.sum()), "event_ns": boot_diff(u, t, n_boot=n_boot)}
        if ok.any():
            mm = [m for m, k in zip(traced_metrics, ok) if k]
            w = np.array([m["window_ns"][cols].mean() for m in mm])
            b = np.array([m["busy_ns"][cols].mean() for m in mm])
            gs = np.array([m["gap_sum_ns"][cols].sum() / max(m["gaps"][cols].sum(), 1) for m in mm])
            kern = float(np.mean([m["kernels"][cols].mean() for m in mm]))
            busy = float(np.median(b))
            idle_u, idle_te, idle_tc = u - busy, t[ok] - b, w - b
            r.update({
                "kernels": kern, "busy_ns": boot_ci(b, n_boot=n_boot),
                "cupti_window_ns": boot_ci(w, n_boot=n_boot),
                "cupti_minus_event_ns": paired(t[ok], w, n_boot=n_boot),
                "idle_untraced_ns": boot_ci(idle_u, n_boot=n_boot),
                "idle_traced_event_ns": boot_ci(idle_te, n_boot=n_boot),
                "idle_traced_cupti_ns": boot_ci(idle_tc, n_boot=n_boot),
                "idle_inflation": boot_diff(idle_u, idle_tc, n_boot=n_boot),
                "idle_per_kernel_ns": {"untraced": float(np.median(idle_u)) / kern,
                                       "traced_event": float(np.median(idle_te)) / kern,
                                       "traced_cupti": float(np.median(idle_tc)) / kern},
                "cupti_gap_mean_ns": boot_ci(gs, n_boot=n_boot),
            })
        out[label] = r
    return out


def compare_replays(span_untraced, span_traced, traced_metrics: list[dict], n_boot: int = BOOT) -> dict:
    """Whole replay: event span (first to last in-graph event) untraced vs traced; CUPTI's traced
    span, busy and idle; and the untraced span and idle they imply (traced CUPTI figure minus
    tracing's inflation by events, busy assumed unchanged)."""
    su, st = np.asarray(span_untraced, float), np.asarray(span_traced, float)
    out = {"event_span_ns": boot_diff(su, st, n_boot=n_boot)}
    ok = [m for m in traced_metrics if m is not None]
    if ok:
        span = np.array([m["span_ns"] for m in ok])
        busy = np.array([m["busy_total_ns"] for m in ok])
        idle = np.array([m["idle_ns"] for m in ok])
        infl = out["event_span_ns"]["diff"]
        gaps = np.concatenate([m["gaps_ns"] for m in ok])
        out.update({
            "cupti_span_ns": boot_ci(span, n_boot=n_boot), "cupti_busy_ns": boot_ci(busy, n_boot=n_boot),
            "cupti_idle_ns": boot_ci(idle, n_boot=n_boot),
            "implied_untraced": {"span_ns": float(np.median(span)) - infl, "busy_ns": float(np.median(busy)),
                                 "idle_ns": float(np.median(idle)) - infl},
            "idle_share_traced": float(np.median(idle / span)),
            "idle_share_untraced": (float(np.median(idle)) - infl) / (float(np.median(span)) - infl),
            "cupti_gap_ns": {"median": float(np.median(gaps)), "p10": float(np.quantile(gaps, 0.1)),
                             "p90": float(np.quantile(gaps, 0.9)), "n": int(len(gaps))},
        })
    return out


def regression_by_size(e_untraced, e_traced, sizes, kinds, n_boot: int = 500, seed: int = 0) -> dict:
    """Group time = a + b x kernels, per kernel kind, fitted per replay on the event times: b is
    what one more kernel (its duration and one gap) costs, a the boundary's own cost (the event
    node and the edges). Medians over replays with bootstrap intervals of the traced - untraced
    difference."""
    eu, et = np.asarray(e_untraced, float), np.asarray(e_traced, float)
    sizes, kinds = np.asarray(sizes, float), np.asarray([str(k) for k in kinds])
    out = {}
    for kind in dict.fromkeys(kinds.tolist()):
        cols = kinds == kind
        if len(np.unique(sizes[cols])) < 2:
            continue
        fu = np.array([fit_line(sizes[cols], row[cols]) for row in eu])
        ft = np.array([fit_line(sizes[cols], row[cols]) for row in et])
        out[kind] = {"per_kernel_ns": boot_diff(fu[:, 1], ft[:, 1], n_boot=n_boot, seed=seed),
                     "per_boundary_ns": boot_diff(fu[:, 0], ft[:, 0], n_boot=n_boot, seed=seed)}
    return out


# ---------------------------------------------------------------------- running stages
def jsonable(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return repr(o)


class Stages:
    """Runs named stages one after the other; a stage that raises is recorded (its traceback)
    and the next one runs. The JSON file is rewritten after every stage, so a run cut short
    still leaves what it measured."""

    def __init__(self, path: str, meta: dict | None = None) -> None:
        self.path = path
        self.doc: dict = {"meta": meta or {}, "stages": {}, "errors": {}, "seconds": {}}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.write()

    def write(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=jsonable)
        os.replace(tmp, self.path)

    def run(self, name: str, fn: Callable, *args, **kw):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            res = fn(*args, **kw)
            self.doc["stages"][name] = res
            return res
        except Exception:
            self.doc["errors"][name] = traceback.format_exc(limit=12)
            print(f"!! {name} failed:\n{self.doc['errors'][name]}", flush=True)
            return None
        finally:
            self.doc["seconds"][name] = round(time.perf_counter() - t0, 2)
            self.write()


def save_raw(out_dir: str, name: str, **arrays) -> str:
    """The stage's raw measurements, so that its analysis can be re-run without the GPU."""
    path = os.path.join(out_dir, f"{name}.npz")
    np.savez_compressed(path, **{k: np.asarray(v) for k, v in arrays.items()})
    return path
