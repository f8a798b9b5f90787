"""bench/collector/decode_buffers.py: one 2M-record-style window per path in a fresh process, as the
bench's fair comparison runs them (200k records here)."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "collector", "decode_buffers.py")


def test_one_capture_window_in_a_fresh_process():
    for path in ("native", "numpy"):
        out = subprocess.run([sys.executable, BENCH, "--_2m", path, "200000"], check=True, capture_output=True,
                             text=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        assert got["records"] == 200_000 and got["pieces"] > 10 and got["records_per_s"] > 0
