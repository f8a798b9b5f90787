"""Does a graph run slower, untraced, once CUPTI's kernel tracing has been on in its process?

In observer-h200-call1, decode_server's graph captured after a process had switched kernel
tracing on and off ran 1653 us untraced (in-graph events), the same graph captured before any
tracing 1411 us; graphs captured after traced windows ran 10-15% slower untraced in another process
too. graphmon's windows switch kernel tracing on and off all the time, and engines capture graphs
after startup (new batch sizes, torch.compile's cudagraph trees), so this matters.

One fresh process (nothing traced before it starts):
1. capture A1, A2 (decode_server's graph) and CA (the chain), untraced replays of each: "before";
2. a window: kernel tracing on for 2 replays of A1 and CA, off;
3. capture B1, B2 and CB after it; untraced replays of every graph, interleaved: "after";
4. kernel tracing on: traced replays of A2 (captured before any tracing) and B1 (after).
Per graph and phase: the in-graph span (first to last in-graph event), its change, and the
spread between two instances captured at the same point (A1 vs A2, B1 vs B2).

    python bench/observer/trace_residue.py --out DIR [--rounds 6] [--block 10]

Writes DIR/residue.json and DIR/residue.npz.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import observer_stats as C  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
from bench.observer.replay_signal import rotations  # noqa: E402


# ---------------------------------------------------------------------- analysis (pure)
COMPARE = (  # (label, base, other): what each comparison says
    ("instance_spread_before", "before/A1", "before/A2"),
    ("never_traced_graph_after_a_window", "before/A2", "after/A2"),
    ("traced_graph_after_its_window", "before/A1", "after/A1"),
    ("captured_after_vs_before_window", "after/A2", "after/B1"),
    ("captured_after_vs_before_window_2", "after/A2", "after/B2"),
    ("instance_spread_after", "after/B1", "after/B2"),
    ("chain_captured_after_vs_before", "after/CA", "after/CB"),
    ("chain_after_its_window", "before/CA", "after/CA"),
    ("traced_captured_after_vs_before", "traced/A2", "traced/B1"),
)


def analyze_residue(spans: dict, n_boot: int = C.BOOT) -> dict:
    """spans: "phase/graph" -> per-replay in-graph spans (ns), each block's first replay already
    left out. Medians per series and the comparisons of COMPARE that have both series."""
    out = {"median_us": {k: float(np.median(v)) / 1e3 for k, v in spans.items() if len(v)}}
    for label, a, b in COMPARE:
        if a in spans and b in spans and len(spans[a]) and len(spans[b]):
            out[label] = C.boot_diff(spans[a], spans[b], n_boot=n_boot)
    return out


# ---------------------------------------------------------------------- on the GPU
def run(a) -> dict:
    import torch

    from bench.common.observer_gpu import Cupti, chain_graph, chain_layout, decode_graph, device_info, synced_replays

    st = C.Stages(os.path.join(a.out, "residue.json"), {"argv": sys.argv[1:], "device": device_info()})
    cu = Cupti()
    spans: dict = {}
    graphs: dict = {}

    def phase(name: str, names) -> dict:
        for order in rotations(list(names), a.rounds):
            for g in order:
                s = synced_replays(graphs[g], a.block)
                spans.setdefault(f"{name}/{g}", []).append(s["inner_ms"][1:, -1] * 1e6)
        return {k: float(np.median(np.concatenate(v))) / 1e3 for k, v in spans.items() if k.startswith(name + "/")}

    def before():
        graphs.update(A1=decode_graph(a.layers, "A1"), A2=decode_graph(a.layers, "A2"), CA=chain_graph(chain_layout(), "CA"))
        for g in graphs.values():
            for _ in range(5):
                g.replay()
        torch.cuda.synchronize()
        return phase("before", ("A1", "A2", "CA"))

    def window():
        cu.enable("CONCURRENT_KERNEL")
        for g in ("A1", "CA"):
            for _ in range(2):
                graphs[g].replay()
        torch.cuda.synchronize()
        cu.enable("CONCURRENT_KERNEL", False)
        cu.flush()
        return {"records": int(len(cu.take_kernels()))}

    def after():
        graphs.update(B1=decode_graph(a.layers, "B1"), B2=decode_graph(a.layers, "B2"), CB=chain_graph(chain_layout(), "CB"))
        for g in ("B1", "B2", "CB"):
            for _ in range(5):
                graphs[g].replay()
        torch.cuda.synchronize()
        return phase("after", ("A1", "A2", "B1", "B2", "CA", "CB"))

    def traced():
        cu.enable("CONCURRENT_KERNEL")
        try:
            return phase("traced", ("A2", "B1"))
        finally:
            cu.enable("CONCURRENT_KERNEL", False)
            cu.flush()
            cu.take_kernels()

    for name, fn in (("before", before), ("window", window), ("after", after), ("traced", traced)):
        st.run(name, fn)
    flat = {k: np.concatenate(v) for k, v in spans.items()}
    C.save_raw(a.out, "residue", **{k.replace("/", "__"): v for k, v in flat.items()})
    st.run("analysis", analyze_residue, flat)
    res = st.doc["stages"].get("analysis", {})
    for label, _a, _b in COMPARE:
        if label in res:
            d = res[label]
            print(f"{label}: {d['base'] / 1e3:.1f} -> {d['other'] / 1e3:.1f} us ({d['pct']:+.2f}% [{d['pct_ci'][0]:+.2f}, {d['pct_ci'][1]:+.2f}])", flush=True)
    cu.close()
    return st.doc


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=10, help="synchronized replays per block (the first left out)")
    ap.add_argument("--layers", type=int, default=48)
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.block < 3:
        ap.error("--rounds >= 1 and --block >= 3")
    os.makedirs(a.out, exist_ok=True)
    doc = run(a)
    return 0 if not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
