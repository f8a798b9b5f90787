"""Markdown tables of the observer-effect results (docs/observer-effect.md cites them): from the
JSON files of bench/observer/truth.py, replay_signal.py and hf_decode.py in one folder or more.

    python bench/observer/tables.py DIR [DIR ...]   # folders holding truth.json, signal.json, hf.json
                                                   # (any subset; stages of one file name are merged)
    python bench/observer/tables.py --smoke         # the recorded observer-h200-call1 and call2
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402


def _ci(d: dict, key: str = "pct", scale: float = 1.0, fmt: str = "{:+.1f}") -> str:
    lo, hi = d.get(key + "_ci", [float("nan")] * 2)
    return f"{fmt.format(d[key] * scale)} [{fmt.format(lo * scale)}, {fmt.format(hi * scale)}]"


def truth_tables(truth: dict) -> list[str]:
    out = ["| graph | group | kernels | event time untraced -> traced (ns) | change % [95% CI] | idle per kernel untraced -> traced (ns) | CUPTI window - events, same replay (ns) |",
           "|---|---|---|---|---|---|---|"]
    rep = ["| graph | span untraced -> traced (us) | change % [95% CI] | busy (us) | idle untraced -> traced (us) | idle share untraced -> traced | CUPTI gap median traced (ns) |",
           "|---|---|---|---|---|---|---|"]
    for name, st in truth.get("stages", {}).items():
        for label, g in st["groups"].items():
            if label == "replays" or "idle_per_kernel_ns" not in g:
                continue
            e, ipk = g["event_ns"], g["idle_per_kernel_ns"]
            out.append(f"| {name} | {label} | {g['kernels']:.0f} | {e['base']:.0f} -> {e['other']:.0f} | {_ci(e)} | "
                       f"{ipk['untraced']:.0f} -> {ipk['traced_cupti']:.0f} | {g['cupti_minus_event_ns']['median']:+.0f} |")
        r = st["replay"]
        if "implied_untraced" in r:
            iu = r["implied_untraced"]
            rep.append(f"| {name} | {iu['span_ns'] / 1e3:.1f} -> {r['cupti_span_ns'][0] / 1e3:.1f} | {_ci(r['event_span_ns'])} | "
                       f"{iu['busy_ns'] / 1e3:.1f} | {iu['idle_ns'] / 1e3:.1f} -> {r['cupti_idle_ns'][0] / 1e3:.1f} | "
                       f"{r['idle_share_untraced']:.3f} -> {r['idle_share_traced']:.3f} | {r['cupti_gap_ns']['median']:.0f} |")
    return out + [""] + rep


def hf_table(hf: dict) -> list[str]:
    t = hf.get("stages", {}).get("truth")
    if not t:
        return []
    s = t["step_gpu_ns"]
    return ["| HF decode step | untraced -> traced (us) | change % [95% CI] | kernels per step | tracing's cost per kernel (ns) | CUPTI replay span / busy / idle (us) |",
            "|---|---|---|---|---|---|",
            f"| by events (GPU) | {s['base'] / 1e3:.1f} -> {s['other'] / 1e3:.1f} | {_ci(s)} | {t.get('kernels_per_step', float('nan')):.0f} | "
            f"{t.get('inflation_per_kernel_ns', float('nan')):.0f} | {t['cupti_replay_span_ns'][0] / 1e3:.1f} / "
            f"{t['cupti_replay_busy_ns'][0] / 1e3:.1f} / {t['cupti_replay_idle_ns'][0] / 1e3:.1f} |",
            f"| by the host clock | {t['step_host_ns']['base'] / 1e3:.1f} -> {t['step_host_ns']['other'] / 1e3:.1f} | {_ci(t['step_host_ns'])} | | | |"]


def signal_table(signal: dict, hf: dict) -> list[str]:
    out = ["| candidate | graph | launch call, host (us) | GPU per replay (us) | GPU per replay (%) | duration - in-graph events (ns) |",
           "|---|---|---|---|---|---|"]
    ce = signal.get("stages", {}).get("callback_events", {})
    for name, r in ce.items():
        if not isinstance(r, dict) or "cost" not in r:
            continue
        for arm in ("callback", "callback_events"):
            c = r["cost"][arm]
            acc = r["accuracy"].get("minus_inner_span_ns", {}).get("median", float("nan")) if arm == "callback_events" else float("nan")
            out.append(f"| {arm} | {name} | {_ci(c['launch_us'], 'diff', fmt='{:+.2f}')} | {_ci(c['gpu_us'], 'diff', fmt='{:+.2f}')} | "
                       f"{_ci(c['gpu_us'], fmt='{:+.3f}')} | {acc:+.0f} |")
    gt = signal.get("stages", {}).get("graph_trace", {})
    accuracy = gt.get("gt_on", {}).get("accuracy", {})
    for name, c in gt.get("cost", {}).items():
        if "records_cost" in c:  # GRAPH_TRACE on throughout: graphs with records against graphs without
            c = c["records_cost"]
            accs = [v["minus_inner_span_ns"]["median"] for k, v in accuracy.items()
                    if k.startswith(name + "_") and "minus_inner_span_ns" in v]
            out.append(f"| GRAPH_TRACE records (vs none) | {name} | {_ci(c['launch_us'], 'diff', fmt='{:+.2f}')} | "
                       f"{_ci(c['gpu_us'], 'diff', fmt='{:+.2f}')} | {_ci(c['gpu_us'], fmt='{:+.3f}')} | "
                       f"{' / '.join(f'{v:+.0f}' for v in accs)} |")
            continue
        if name == "graph_trace_records" or "gpu_us" not in c:
            continue
        acc = accuracy.get(name, {}).get("minus_inner_span_ns", {}).get("median", float("nan"))
        out.append(f"| GRAPH_TRACE | {name} | {_ci(c['launch_us'], 'diff', fmt='{:+.2f}')} | {_ci(c['gpu_us'], 'diff', fmt='{:+.2f}')} | "
                   f"{_ci(c['gpu_us'], fmt='{:+.3f}')} | {acc:+.0f} |")
    h = hf.get("stages", {})
    for arm in ("callback", "callback_events"):
        c = h.get("callback_events", {}).get(f"{arm}_step_gpu_ns")
        if c:
            hh = h["callback_events"][f"{arm}_step_host_ns"]
            out.append(f"| {arm} | HF step | {_ci(hh, 'diff', 1e-3, '{:+.2f}')} (step) | {_ci(c, 'diff', 1e-3, '{:+.2f}')} | {_ci(c, fmt='{:+.3f}')} | |")
    c = h.get("gt_fresh", {}).get("cost", {}).get("gt_on_step_gpu_ns")
    if c:
        hh = h["gt_fresh"]["cost"]["gt_on_step_host_ns"]
        out.append(f"| GRAPH_TRACE | HF step | {_ci(hh, 'diff', 1e-3, '{:+.2f}')} (step) | {_ci(c, 'diff', 1e-3, '{:+.2f}')} | {_ci(c, fmt='{:+.3f}')} | |")
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("dirs", nargs="*", metavar="DIR", help="folders with truth.json, signal.json, hf.json")
    a = ap.parse_args(argv)
    dirs = a.dirs or ([str(RESULTS / "observer-h200-call1"), str(RESULTS / "observer-h200-call2")] if a.smoke else [])
    if not dirs:
        ap.error("give one folder or more")
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        ap.error(f"not a folder: {missing[0]}")

    def load(name):
        merged: dict = {"stages": {}}
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.exists(p):
                merged["stages"].update(json.load(open(p)).get("stages", {}))
        return merged

    truth, signal, hf = load("truth.json"), load("signal.json"), load("hf.json")
    lines = truth_tables(truth) + [""] + hf_table(hf) + [""] + signal_table(signal, hf)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
