"""Cost of shipping one window from a serving process to the agent (CPU, no GPU).

Process side: ``encode_window`` (what the light collector's thread does per window, besides CUPTI).
Agent side: ``decode_window`` (strict validation + Trace.build). Windows are cut from the real H200 capture.
Writes bench/results/link-window.json.

    python bench/collector/link_window.py [--records 20000 200000] [--repeat 5]
"""

from __future__ import annotations

import json
import platform
import struct
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402
from graphmon.cli import bundled_trace_path  # noqa: E402
from graphmon.formats.read import read_trace  # noqa: E402
from graphmon.model.trace import Trace  # noqa: E402
from graphmon.model.window import Window  # noqa: E402
from graphmon.model.wire import decode_window, encode_window, split_frame  # noqa: E402


def window_of(base: Trace, n: int) -> Window:
    t = base.select(np.arange(len(base)) < n)  # the capture holds 467,200 records
    return Window(trace=t, started_s=time.time() - 0.05, ended_s=time.time())


def best(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--records", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", help="default: bench/results/link-window.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.records, args.repeat = [2_000], 1
    base = read_trace(bundled_trace_path())
    rows = []
    for n in args.records:
        n = min(n, len(base))
        w = window_of(base, n)
        data = encode_window(w)
        enc_s = best(lambda: encode_window(w), args.repeat)
        dec_s = best(lambda: decode_window(*split_frame(data[4:])), args.repeat)
        assert struct.unpack_from("<I", data)[0] == len(data) - 4
        rows.append({"records": len(w.trace), "frame_bytes": len(data), "bytes_per_record": round(len(data) / len(w.trace), 1),
                     "encode_ms": round(enc_s * 1e3, 3), "decode_ms": round(dec_s * 1e3, 3),
                     "encode_records_per_s": round(len(w.trace) / enc_s), "decode_records_per_s": round(len(w.trace) / dec_s)})
        print(rows[-1], flush=True)
    out = {"what": "graphmon.model.wire encode (serving process) / decode+validate (agent) of one window",
           "source": "graphmon/data/h200-decode.graphmon.npz (real H200 capture), first N records",
           "python": platform.python_version(), "machine": platform.machine(), "numpy": np.__version__,
           "results": rows}
    path = cli.out_path(args.out, RESULTS / "link-window.json", args.smoke)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
