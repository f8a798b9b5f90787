"""GPU diagnostic: one duration-bound and one replay-bound capture window on the example's graphs,
with every count graphmon has (phases, buffers, records per launch, invalid reasons). Writes JSON
to --out. Run on a CUDA machine with cupti-python: python bench/diag/capture.py --out DIR.

Answered (bench/results/gpu-check-4/README.md): outside pytest the capture sequence of
tests/gpu/test_live_cupti.py came out clean twice; the failures inside it were CUPTI correlation
ids stuck by launch callbacks switched off during a launch (fixed: LaunchGate)."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import EXAMPLES, on_path  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch

    on_path(EXAMPLES)
    import decode_server as ds
    import graphmon
    from graphmon.host.attach import attached
    from graphmon.model.window import CaptureRequest

    graphmon.attach(port=0, interval_s=3600.0, first_window_s=3600.0, keep_raw=True)
    src = attached().source
    windows = []
    src.taps.append(windows.append)
    t0 = time.monotonic()
    while src.health().state != "running" and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    model = ds.DecodeModel(layers=8)
    graphs = {m: ds.build(model, [1], [m])[0] for m in ("uploaded", "lazy", "instantiate_upload")}
    for r in graphs.values():
        r.replay()
    torch.cuda.synchronize()
    out = {"windows": []}

    def describe(w, label):
        raw = src.last_raw or {}
        corr = np.asarray(raw.get("correlation_id", []))
        lcorr = np.asarray(raw.get("launch_correlation_id", []))
        per = {int(c): int((corr == c).sum()) for c in lcorr.tolist()}
        ends0 = int((np.asarray(raw.get("end_ns", [1])) == 0).sum())
        d = {"label": label, "kernels_kept": len(w.trace), "invalid": dict(w.trace.invalid),
             "launches": len(lcorr), "records_per_launch": per, "raw_records": int(len(corr)),
             "raw_zero_end": ends0, "raw_corr_not_launched": int((~np.isin(corr, lcorr)).sum()),
             "phases": {k: round(v, 6) for k, v in (src.phase_log[-1] if src.phase_log else {}).items()},
             "stats": {k: v for k, v in src.stats.items()}, "errors": dict(src.health().errors),
             "pool_free": src.api.free_buffers(),
             "kpr": {g.label: None for g in w.trace.graphs}}
        print(json.dumps({k: d[k] for k in ("label", "kernels_kept", "invalid", "launches", "raw_records",
                                            "raw_zero_end", "raw_corr_not_launched", "errors", "pool_free")}))
        print("   phases:", d["phases"])
        print("   per launch:", list(per.values())[:50])
        out["windows"].append(d)

    # 0: what test_upload_modes_detected does first: a 9-replay capture over the three graphs
    n0 = len(windows)
    src.request_capture(CaptureRequest(id="first", replays=9, duration_ms=3000))
    t0 = time.monotonic()
    while len(windows) == n0 and time.monotonic() - t0 < 15:
        for r in graphs.values():
            r.replay()
        torch.cuda.synchronize()
    describe(windows[-1], "first9")
    # 1: duration-bound, backlog then 40 replays (tests/gpu/test_live_cupti.py::test_records_match_cuda_events)
    g = graphs["uploaded"]
    n0 = len(windows)
    src.request_capture(CaptureRequest(id="dur", duration_ms=600))
    t0 = time.monotonic()
    while not src.in_window and time.monotonic() - t0 < 5:
        time.sleep(0.001)
    torch.cuda._sleep(int(20e6))
    for _ in range(40):
        g.replay()
    torch.cuda.synchronize()
    t0 = time.monotonic()
    while len(windows) == n0 and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    describe(windows[-1], "duration")
    # 2: replay-bound over 3 graphs (test_metrics_served)
    for rep in (6, 30):
        n0 = len(windows)
        src.request_capture(CaptureRequest(id=f"rep{rep}", replays=rep, duration_ms=3000))
        t0 = time.monotonic()
        while len(windows) == n0 and time.monotonic() - t0 < 15:
            for r in graphs.values():
                r.replay()
            torch.cuda.synchronize()
        describe(windows[-1], f"replays{rep}")
    # 3: host far ahead: no synchronize per step
    n0 = len(windows)
    src.request_capture(CaptureRequest(id="ahead", replays=16, duration_ms=3000))
    t0 = time.monotonic()
    while len(windows) == n0 and time.monotonic() - t0 < 15:
        for _ in range(20):
            for r in graphs.values():
                r.replay()
        torch.cuda.synchronize()
    describe(windows[-1], "ahead")
    graphmon.detach()
    with open(os.path.join(args.out, "diag-capture.json"), "w") as fh:
        json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
