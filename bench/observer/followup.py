"""CPU analysis of what bench/observer/followup.sh wrote (no GPU, no torch, no CUPTI): re-runs each
bench's own analysis on its raw npz and adds what those analyses leave out.

- ``residue``: trace_residue.analyze_residue on residue.npz (the same numbers as residue.json).
- ``hf``: hf_decode.analyze_truth on hf-truth.npz (the same numbers as hf.json's truth).
- ``graph_trace``, from signal-graph_trace.npz (and from call 1's, with ``--call1``):
  - ``records_cost_by_instance``: GRAPH_TRACE's GPU cost per replay, graphs with records against
    graphs without, as a contrast of graph instances. signal.json's interval resamples replays
    only, and two instances of one graph made at the same point differ by as much as the cost:
    here each instance's median is one observation (a t interval over instances);
  - ``levels``: the graphs without records, block by block, before GRAPH_TRACE was enabled and with
    it on (the two states ran one after the other, not interleaved);
  - ``phases``: every graph's in-graph span in the synchronized phases (gt_on, then a kernel window,
    then gt_again and both_on) and each phase's change against gt_on.

    python bench/observer/followup.py DIR [--call1 DIR1]   # DIR: bench/observer/followup.sh's folder
    python bench/observer/followup.py --smoke              # the recorded observer-h200-call2 (and call1)

Writes DIR/followup.json (or --out) and prints one line per finding.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import observer_stats as C  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402

PHASES = ("gt_on", "kernel_window", "gt_again", "both_on")  # replay_signal's graph_trace steps, in order


# ---------------------------------------------------------------------- analysis (pure)
def steady_blocks(blocks) -> np.ndarray:
    """(blocks, replays) -> every replay but each block's first (the one after a switch)."""
    b = np.asarray(blocks, float)
    return b[:, 1:].ravel() if b.ndim == 2 else b[1:]


def instance_contrast(base: dict, other: dict, level: float = 0.95) -> dict:
    """base, other: instance name -> that instance's replay times. Each instance's median is one
    observation; the difference of the two arms' means of medians, with a Student t interval on
    the pooled spread between instances (needs two instances in one arm at least), in the unit
    of the input and in % of the base arm's mean."""
    from scipy import stats

    mb = {k: float(np.median(v)) for k, v in base.items()}
    mo = {k: float(np.median(v)) for k, v in other.items()}
    a, b = np.array(list(mb.values())), np.array(list(mo.values()))
    diff = float(b.mean() - a.mean())
    df = len(a) + len(b) - 2
    res = {"base_instances": mb, "other_instances": mo, "diff": diff, "pct": 100 * diff / float(a.mean()), "df": df}
    if df < 1:
        res.update(diff_ci=[float("nan")] * 2, pct_ci=[float("nan")] * 2)
        return res
    ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    se = np.sqrt(ss / df * (1 / len(a) + 1 / len(b)))
    half = float(stats.t.ppf(0.5 + level / 2, df) * se)
    res["diff_ci"] = [diff - half, diff + half]
    res["pct_ci"] = [100 * (diff - half) / float(a.mean()), 100 * (diff + half) / float(a.mean())]
    return res


def graph_names(raw: dict, prefix: str, suffix: str) -> list[str]:
    """The graph names of the keys ``prefix + name + suffix`` of an npz, sorted."""
    pat = re.compile(re.escape(prefix) + r"(.+)" + re.escape(suffix) + "$")
    return sorted(m.group(1) for k in raw if (m := pat.match(k)))


def phase_table(raw: dict, n_boot: int = C.BOOT) -> dict:
    """Per graph and phase of replay_signal's graph_trace stage: the in-graph span's median (us,
    the phase's first replay left out) and its change against gt_on (bootstrap over replays)."""
    out: dict = {}
    for name in graph_names(raw, "gt_on_", "_inner_span_ns"):
        ref = np.asarray(raw[f"gt_on_{name}_inner_span_ns"], float)[1:]
        row = {}
        for ph in PHASES:
            key = f"{ph}_{name}_inner_span_ns"
            if key not in raw:
                continue
            x = np.asarray(raw[key], float)[1:]
            row[ph] = {"median_us": float(np.median(x)) / 1e3}
            if ph != "gt_on":
                row[ph]["vs_gt_on"] = C.boot_diff(ref, x, n_boot=n_boot)
        out[name] = row
    return out


def graph_trace_costs(raw: dict) -> dict:
    """From call 2's cost blocks (cost_<graph>_gpu_us: GRAPH_TRACE on; cost_before_<graph>_gpu_us:
    before it was enabled): per kind of graph, the records' cost by instance, and every block's
    median before and with GRAPH_TRACE on for the graphs without records."""
    out: dict = {}
    names = [n for n in graph_names(raw, "cost_", "_gpu_us") if not n.startswith("before_")]
    for kind in sorted({n.split("_")[0] for n in names}):
        pre = [n for n in names if n.startswith(f"{kind}_pre")]
        post = [n for n in names if n.startswith(f"{kind}_post")]
        res: dict = {}
        for metric in ("gpu_us", "launch_us"):
            res[f"records_cost_by_instance_{metric}"] = instance_contrast(
                {n: steady_blocks(raw[f"cost_{n}_{metric}"]) for n in pre},
                {n: steady_blocks(raw[f"cost_{n}_{metric}"]) for n in post})
        res["levels"] = {n: {"before_block_medians_us": [float(np.median(b[1:])) for b in raw[f"cost_before_{n}_gpu_us"]],
                             "gt_on_block_medians_us": [float(np.median(b[1:])) for b in raw[f"cost_{n}_gpu_us"]],
                             "before_launch_us": float(np.median(steady_blocks(raw[f"cost_before_{n}_launch_us"]))),
                             "gt_on_launch_us": float(np.median(steady_blocks(raw[f"cost_{n}_launch_us"])))}
                         for n in pre if f"cost_before_{n}_gpu_us" in raw}
        out[kind] = res
    return out


# ---------------------------------------------------------------------- the folder
def _load(path: str) -> dict | None:
    return dict(np.load(path, allow_pickle=False)) if os.path.exists(path) else None


def analyze_folder(d: str, call1: str | None = None, n_boot: int = C.BOOT) -> dict:
    from bench.observer.hf_decode import analyze_truth
    from bench.observer.trace_residue import analyze_residue

    out: dict = {}
    if (raw := _load(os.path.join(d, "residue.npz"))) is not None:
        out["residue"] = analyze_residue({k.replace("__", "/"): v for k, v in raw.items()}, n_boot=n_boot)
    if (raw := _load(os.path.join(d, "hf-truth.npz"))) is not None:
        out["hf"] = analyze_truth(raw, n_boot=n_boot)
    if (raw := _load(os.path.join(d, "signal-graph_trace.npz"))) is not None:
        out["graph_trace"] = {"costs": graph_trace_costs(raw), "phases": phase_table(raw, n_boot=n_boot)}
    if call1 and (raw := _load(os.path.join(call1, "signal-graph_trace.npz"))) is not None:
        out["graph_trace_call1"] = {"phases": phase_table(raw, n_boot=n_boot)}
    return out


def _pct(d: dict) -> str:
    return f"{d['pct']:+.2f}% [{d['pct_ci'][0]:+.2f}, {d['pct_ci'][1]:+.2f}]"


def summary_lines(res: dict) -> list[str]:
    lines = []
    for kind, c in res.get("graph_trace", {}).get("costs", {}).items():
        g, h = c["records_cost_by_instance_gpu_us"], c["records_cost_by_instance_launch_us"]
        lines.append(f"GRAPH_TRACE records, {kind}, by instance: GPU {g['diff']:+.2f} us ({_pct(g)}, df {g['df']}); "
                     f"launch {h['diff']:+.2f} us ({_pct(h)})")
        for n, lv in c["levels"].items():
            b, o = lv["before_block_medians_us"], lv["gt_on_block_medians_us"]
            lines.append(f"  {n} without records: blocks {min(b):.1f}-{max(b):.1f} us before enabling, "
                         f"{min(o):.1f}-{max(o):.1f} us with it on; launch {lv['before_launch_us']:.0f} -> {lv['gt_on_launch_us']:.0f} us")
    for key in ("graph_trace", "graph_trace_call1"):
        for name, row in res.get(key, {}).get("phases", {}).items():
            parts = [f"{ph} {v['median_us']:.1f}" + (f" ({_pct(v['vs_gt_on'])})" if "vs_gt_on" in v else "")
                     for ph, v in row.items()]
            lines.append(f"{key} {name}: " + "; ".join(parts))
    return lines


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("dir", nargs="?", help="followup.sh's folder (residue.npz, hf-truth.npz, signal-graph_trace.npz)")
    ap.add_argument("--call1", help="call 1's folder: its signal-graph_trace.npz phases too")
    ap.add_argument("--out", help="default: DIR/followup.json")
    a = ap.parse_args(argv)
    if a.smoke and a.dir is None:
        a.dir, a.call1 = str(RESULTS / "observer-h200-call2"), str(RESULTS / "observer-h200-call1")
    if a.dir is None or not os.path.isdir(a.dir) or (a.call1 and not os.path.isdir(a.call1)):
        ap.error("give the folder of a followup.sh run")
    res = analyze_folder(a.dir, a.call1, n_boot=50 if a.smoke else C.BOOT)
    if not res:
        ap.error(f"nothing to analyse in {a.dir}")
    path = str(cli.out_path(a.out, os.path.join(a.dir, "followup.json"), a.smoke))
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=C.jsonable)
    print("\n".join(summary_lines(res)))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
