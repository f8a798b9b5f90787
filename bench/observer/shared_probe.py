"""What the shared H200 probe (/work/shared/probes/observer_probe.py, its npz in
tests/data/h200-cupti-decode-v1.npz) already says about the observer effect, on a CPU:

- replay time by CUDA events per phase (no CUPTI, launch callback subscribed, kernel tracing on,
  after disabling, after unsubscribing, GRAPH_TRACE on, after it), each against the first
  untraced phase, with bootstrap intervals. The phases ran one after the other, not interleaved:
  each ratio holds the machine's drift between them too (compare after_disable with plain0);
- in the traced phase, per replay: CUPTI's span, busy and idle against the event time of the
  same replay (replays were queued back to back with an event between each two, so the event
  interval also holds the launch gap between replays);
- the GRAPH_TRACE records (only the graph instantiated after enabling it had any; its 20 replays
  were untimed warm-ups) against the event times of another instance of the same chain graph.

    python bench/observer/shared_probe.py [--npz PATH] [--out bench/results/observer-shared.json]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import observer_stats as C  # noqa: E402
from bench.common.paths import DATA, RESULTS  # noqa: E402

DEFAULT_NPZ = str(DATA / "h200-cupti-decode-v1.npz")
# observer_probe.py's phase(label, rounds, n): every key ran `rounds` blocks of n replays
BLOCK = {"plain0": 150, "callbacks": 150, "traced": 40, "after_disable": 150, "after_unsubscribe": 150,
         "graph_trace": 40, "after_graph_trace": 150}


def steady_phase(ms_row, block: int) -> np.ndarray:
    """One key's replay times (ms -> us) without each block's first (it follows a switch)."""
    us = np.asarray(ms_row, float) * 1e3
    keep = np.arange(len(us)) % block != 0
    return us[keep]


def phase_table(events: dict, keys, base: str = "plain0", n_boot: int = C.BOOT) -> dict:
    """Per key and phase: median replay time (us) and its change against ``base``."""
    out = {}
    for i, key in enumerate(keys):
        b = steady_phase(events[base][i], BLOCK.get(base, len(events[base][i])))
        out[key] = {}
        for phase, arr in events.items():
            x = steady_phase(arr[i], BLOCK.get(phase, len(arr[i])))
            d = C.boot_diff(b, x, n_boot=n_boot)
            out[key][phase] = {"median_us": d["other"], "vs_" + base + "_pct": d["pct"], "pct_ci": d["pct_ci"], "n": len(x)}
    return out


def traced_replays(start, end, stream, corr, launch_correlation, keys, event_ms_traced, n_boot: int = C.BOOT) -> dict:
    """Per key: each traced replay's CUPTI span / busy / idle against its event interval
    (replays in launch order = event order)."""
    corr = np.asarray(corr, np.int64)
    lc = np.asarray(launch_correlation, np.int64).reshape(-1, 2)
    key_of = dict(zip(lc[:, 0].tolist(), lc[:, 1].tolist()))
    uniq, idx = np.unique(corr, return_inverse=True)
    ukey = np.array([key_of.get(int(c), -1) for c in uniq])
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(len(uniq) + 1))
    out = {}
    for ki, key in enumerate(keys):
        reps = np.flatnonzero(ukey == ki)  # ascending correlation = launch order
        ev = np.asarray(event_ms_traced[ki], float) * 1e6
        if len(reps) != len(ev):
            out[key] = {"error": f"{len(reps)} traced launches with records, {len(ev)} event times"}
            continue
        span, busy = np.empty(len(reps)), np.empty(len(reps))
        for j, r in enumerate(reps):
            sel = order[bounds[r]:bounds[r + 1]]
            s = C.replay_summary(np.asarray(start)[sel], np.asarray(end)[sel], np.asarray(stream)[sel])
            span[j], busy[j] = s["span_ns"], s["busy_ns"]
        keep = np.arange(len(ev)) % BLOCK["traced"] != 0
        out[key] = {"replays": int(keep.sum()), "event_ns": C.boot_ci(ev[keep], n_boot=n_boot),
                    "cupti_span_ns": C.boot_ci(span[keep], n_boot=n_boot), "cupti_busy_ns": C.boot_ci(busy[keep], n_boot=n_boot),
                    "cupti_idle_ns": C.boot_ci(span[keep] - busy[keep], n_boot=n_boot),
                    "event_minus_span_ns": C.paired(span[keep], ev[keep], n_boot=n_boot),
                    "idle_share": float(np.median((span[keep] - busy[keep]) / span[keep]))}
    return out


def graph_trace_vs_events(graph_trace, keys, events: dict, key: str = "chain/no_upload", n_boot: int = C.BOOT) -> dict:
    """GRAPH_TRACE durations per graph id, and the one graph's against ``key``'s event times
    (another instance of the same graph: instances differ by up to ~1.5%)."""
    gt = np.asarray(graph_trace, np.int64).reshape(-1, 5)
    out = {"records": int(len(gt)), "graph_ids": {int(g): int((gt[:, 3] == g).sum()) for g in np.unique(gt[:, 3])}}
    if len(gt):
        d = (gt[:, 1] - gt[:, 0]) / 1e3
        out["duration_us"] = C.boot_ci(d, n_boot=n_boot)
        ki = list(keys).index(key)
        for phase in ("graph_trace", "plain0"):
            ev = steady_phase(events[phase][ki], BLOCK[phase])
            out[f"vs_{phase}_{key}"] = C.boot_diff(ev, d, n_boot=n_boot)
    return out


def run(npz_path: str, n_boot: int = C.BOOT) -> dict:
    z = np.load(npz_path)
    keys = [str(k) for k in z["graph_keys"]]
    events = {f[len("event_ms_"):]: z[f] for f in z.files if f.startswith("event_ms_")}
    return {"source": os.path.basename(npz_path), "command": "python bench/observer/shared_probe.py", "keys": keys,
            "phases": phase_table(events, keys, n_boot=n_boot),
            "traced_replays": traced_replays(z["start"], z["end"], z["stream_id"], z["correlation_id"],
                                             z["launch_correlation"], keys, z["event_ms_traced"], n_boot=n_boot),
            "graph_trace": graph_trace_vs_events(z["graph_trace"], keys, events, n_boot=n_boot),
            "notes": ["phases ran in sequence (drift included); the first replay of each block is left out",
                      "traced replays were queued back to back: an event interval = the replay + the gap to the next",
                      "GRAPH_TRACE records: 20 untimed warm-up replays of a chain graph instantiated after enabling it"]}


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--npz", default=DEFAULT_NPZ)
    ap.add_argument("--out", help="default: bench/results/observer-shared.json")
    a = ap.parse_args(argv)
    if not os.path.exists(a.npz):
        ap.error(f"no such file: {a.npz}")
    a.out = str(cli.out_path(a.out, RESULTS / "observer-shared.json", a.smoke))
    res = run(a.npz, n_boot=50 if a.smoke else C.BOOT)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=C.jsonable)
    for key in res["keys"]:
        p, t = res["phases"][key], res["traced_replays"].get(key, {})
        print(f"{key}: plain {p['plain0']['median_us']:.1f} us; traced {p['traced']['vs_plain0_pct']:+.1f}% "
              f"[{p['traced']['pct_ci'][0]:+.1f}, {p['traced']['pct_ci'][1]:+.1f}]; callbacks {p['callbacks']['vs_plain0_pct']:+.2f}%; "
              f"after disable {p['after_disable']['vs_plain0_pct']:+.2f}%; graph_trace {p['graph_trace']['vs_plain0_pct']:+.2f}%; "
              f"traced event - CUPTI span {t.get('event_minus_span_ns', {}).get('median', float('nan')):.0f} ns")
    g = res["graph_trace"]
    if "duration_us" in g:
        print(f"GRAPH_TRACE: {g['records']} records {g['graph_ids']}; {g['duration_us'][0]:.1f} us vs events of chain/no_upload "
              f"{g['vs_graph_trace_chain/no_upload']['pct']:+.2f}% (graph_trace phase), {g['vs_plain0_chain/no_upload']['pct']:+.2f}% (plain0)")
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
