"""The first buffer a fresh decoder sees (each attach makes one): its record size is measured by
libcupti's walker. The real walker is one ctypes call per record (cuptiActivityGetNextRecord), so
a whole-buffer walk held the GIL for a 1 MiB buffer's ~4,200 calls (the H200's 10 ms GIL hold and
0.5 M records/s per window). Here the walker makes one foreign call per record too (libc labs via
ctypes) over a synthetic CUpti_ActivityKernel13 buffer; the decoder walks only PROBE_BYTES.

    python bench/collector/first_buffer.py [--out DIR]      # a few seconds, no GPU
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.collector import decode_buffers as db  # noqa: E402  (synthetic Kernel13 buffers)
from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402
from graphmon.sources.cupti.records import BufferDecoder  # noqa: E402

_LIBC = ctypes.CDLL(None)


def ctypes_walk(data: np.ndarray) -> np.ndarray:
    """Offsets of every record, with one foreign call per record like api.walk_records."""
    out, off, n = [], 0, len(data)
    while off + db.RECORD_BYTES <= n:
        _LIBC.labs(off)
        out.append(off)
        off += db.RECORD_BYTES
    return np.asarray(out, np.int64)


def main(argv=None) -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--out", help="folder (default: bench/results)")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    if a.smoke:
        a.repeats = 2
    a.out = str(cli.out_path(a.out, RESULTS, a.smoke))
    buf = db.synth_buffers((1 << 20) // db.RECORD_BYTES, 1 << 20)[0]
    walked = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        ctypes_walk(buf)  # what the decoder did before: walk the whole first buffer
        walked.append(time.perf_counter() - t0)
    fresh = []
    for _ in range(a.repeats):
        dec = BufferDecoder(walk=ctypes_walk)
        t0 = time.perf_counter()
        cols = dec.decode(buf)
        fresh.append(time.perf_counter() - t0)
    res = {"records": len(cols), "buffer_bytes": len(buf), "record_bytes": dec.record_bytes,
           "whole_buffer_walk_ms_median": float(np.median(walked)) * 1e3,
           "fresh_decoder_first_buffer_ms_median": float(np.median(fresh)) * 1e3,
           "fresh_decoder_fallback_buffers": dec.stats.fallback_buffers, "loadavg": os.getloadavg(),
           "note": "CPU, one ctypes call per record stands in for cuptiActivityGetNextRecord"}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "first-buffer.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
