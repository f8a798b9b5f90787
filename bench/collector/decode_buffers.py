"""CPU benchmark of the CUPTI record path (issue 13): synthetic CUpti_ActivityKernel13 buffers ->
numpy columns, the way the collector decodes them (one buffer per GIL hold), no GPU needed.

Measures records/s of the collector thread's CPU for 20k-record windows and for 2M records, the
longest piece of work between two yields (CPU), and the longest stall of a Python thread that
only ticks while windows are decoded, next to the same ticker with nothing decoding (the
machine's own scheduling noise, same run). The 2M-record windows (an on-demand capture) run each
in a fresh process, alternating the two paths, --rounds each (median rate, longest piece): in one
process the path that ran second reused the memory the first one had faulted in. Exit status 1
when the C pass is slower than numpy on 2M-record windows or one of its pieces takes more than
2 ms (issue 38).
Writes bench/results/<--name>.json. Targets: >= 10M records/s, < 1 ms GIL hold per 20k-record window.

    python bench/collector/decode_buffers.py [--out bench/results] [--name decode-buffers] [--windows 50] [--rounds 3]
    python bench/collector/decode_buffers.py --smoke
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import cli  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402
from graphmon.settings import CuptiSettings  # noqa: E402
from graphmon.sources.cupti import native  # noqa: E402
from graphmon.sources.cupti.ingest import BATCH_PIECE_S  # noqa: E402
from graphmon.sources.cupti.records import BufferDecoder, ColumnArena, NameTable, RecordStore  # noqa: E402

RECORD_BYTES = 248  # CUpti_ActivityKernel13 (CUPTI 13.4)


def synth_buffers(n_records: int, buffer_bytes: int, seed: int = 0) -> list[np.ndarray]:
    """Kernel13 records at cupti_activity.h's offsets, cut into buffers of ``buffer_bytes``."""
    rng = np.random.default_rng(seed)
    raw = np.zeros((n_records, RECORD_BYTES), np.uint8)

    def put(off, typ, vals):
        raw[:, off:off + np.dtype(typ).itemsize] = np.asarray(vals).astype(typ).view(np.uint8).reshape(n_records, -1)

    start = np.cumsum(rng.integers(500, 5000, n_records)) + 10**12
    put(0, "<u4", np.full(n_records, 10))
    put(16, "<u8", start)
    put(24, "<u8", start + rng.integers(1000, 9000, n_records))
    put(40, "<u4", np.zeros(n_records))
    put(48, "<u4", rng.integers(7, 27, n_records))
    put(92, "<u4", np.arange(n_records) // 320 + 1)
    put(104, "<u8", 0x5000_0000 + 0x40 * rng.integers(0, 60, n_records))
    put(144, "<u8", np.arange(n_records) % 320 + 1)
    put(156, "<u4", np.full(n_records, 3))
    per = buffer_bytes // RECORD_BYTES
    flat = raw.reshape(-1)
    return [flat[i * RECORD_BYTES:(i + per) * RECORD_BYTES] for i in range(0, n_records, per)]


def walk(data: np.ndarray) -> np.ndarray:
    return np.arange(0, len(data) - RECORD_BYTES + 1, RECORD_BYTES, dtype=np.int64)


class Ticker(threading.Thread):
    """A thread that only ticks: its longest gap between ticks is the longest GIL hold it saw."""

    def __init__(self, period_s: float = 0.0001) -> None:
        super().__init__(daemon=True)
        self.period_s, self.stop, self.max_gap_s, self.gaps = period_s, threading.Event(), 0.0, []

    def reset(self) -> None:
        self.max_gap_s = 0.0

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(self.period_s)
            now = time.perf_counter()
            self.max_gap_s = max(self.max_gap_s, now - last - self.period_s)
            last = now


def decode_window(dec: BufferDecoder, names: NameTable, buffers: list[np.ndarray], store: RecordStore,
                  holds: list[float], yield_s: float = CuptiSettings().yield_ms / 1e3,
                  batch_s: float = BATCH_PIECE_S, arena: "ColumnArena | None" = None) -> int:
    """What the collector does per window: each buffer gathered into the window's store (the
    store reused from window to window), pieces of work up to ``batch_s`` of CPU between yields,
    then the window's columns and name ids made chunk by chunk (into ``arena``: the light
    collector's reused columns, which its link copies at once). Appends each piece's CPU time
    (time.thread_time: the work between two yields, without the waits for the GIL a busy
    machine adds) to ``holds``."""
    store.clear()
    names.new_window()
    marks = [time.thread_time()]

    def pause(min_s: float = 0.0):  # CuptiSource._yield
        piece = time.thread_time() - marks[-1]
        if piece < min_s:
            return
        holds.append(piece)
        time.sleep(yield_s)
        marks.append(time.thread_time())

    for b in buffers:
        dec.gather(b, store)
        pause(batch_s)
    pause()
    cols, _ = store.take(pause, names, arena)
    holds.append(time.thread_time() - marks[-1])
    return len(cols)


def measure(native, a, s: CuptiSettings, ticker: Ticker) -> dict:
    """One decode path (``native``: the C pass, None: numpy): 20k-record windows, then 2M records."""
    dec = BufferDecoder(walk=walk, native=native)
    names = NameTable(lambda p: f"kernel_{p:x}")
    store, arena = RecordStore(s.max_window_records, native=native), ColumnArena()
    decode_window(dec, names, synth_buffers(1000, s.buffer_size_bytes), store, [], arena=arena)  # measure + warm
    win = synth_buffers(20_000, s.buffer_size_bytes, seed=1)
    hold_max, tick_max, busy = [], [], []
    for _ in range(a.windows):
        ticker.reset()
        holds: list[float] = []
        n = decode_window(dec, names, win, store, holds, arena=arena)
        time.sleep(0.003)  # let the ticker see the end of the window
        hold_max.append(max(holds))
        busy.append(sum(holds))
        tick_max.append(ticker.max_gap_s)
    out = {"window_20k": {
        "windows": a.windows, "records": n, "buffers": len(win),
        # records per second of the collector thread's CPU (the yields between pieces excluded)
        "records_per_s_median": n / float(np.median(busy)),
        "decode_cpu_ms_per_window_median": float(np.median(busy)) * 1e3,
        # the longest piece of work between two yields, CPU (the C pass runs it without the GIL)
        "gil_hold_max_ms": float(np.max(hold_max)) * 1e3, "gil_hold_p50_ms": float(np.median(hold_max)) * 1e3,
        # a thread that only ticks while windows are decoded: the stall the host can feel
        "ticker_stall_max_ms": float(np.max(tick_max)) * 1e3, "ticker_stall_p50_ms": float(np.median(tick_max)) * 1e3,
    }}
    out["decode_fallback_buffers"] = dec.stats.fallback_buffers
    return out


def one_2m(path: str, n_records: int) -> dict:
    """One 2M-record window (a capture) decoded by ``path`` in this process, as its collector
    would: a decoder, a store and a name table of its own, the ticker watching."""
    from graphmon.sources.cupti.records import warm_up

    lib = native.load() if path == "native" else None
    s = CuptiSettings()
    big = synth_buffers(n_records, s.buffer_size_bytes, seed=2)
    warm_up()  # as the collector does when it subscribes: imports and first calls out of the window
    dec, names = BufferDecoder(walk=walk, native=lib), NameTable(lambda p: f"kernel_{p:x}")
    ticker = Ticker()
    ticker.start()
    time.sleep(0.02)
    ticker.reset()
    holds: list[float] = []
    t0 = time.perf_counter()
    n = decode_window(dec, names, big, RecordStore(n_records, native=lib), holds)
    wall = time.perf_counter() - t0  # includes the yields
    time.sleep(0.003)
    ticker.stop.set()
    return {"records": n, "decode_seconds": sum(holds), "wall_seconds": wall, "records_per_s": n / sum(holds),
            "pieces": len(holds), "piece_max_ms": max(holds) * 1e3, "piece_p99_ms": float(np.percentile(holds, 99)) * 1e3,
            "ticker_stall_max_ms": ticker.max_gap_s * 1e3}


def measure_2m(paths: list, rounds: int, n_records: int = 2_000_000) -> dict:
    """2M-record windows, each in a fresh process (as a process's capture: its first touches of
    the memory included, the same for both paths; in one process, whichever path ran second
    reused the memory the first one faulted in), ``rounds`` per path in alternating order."""
    import subprocess

    runs: dict[str, list] = {name: [] for name in paths}
    for r in range(rounds):
        for name in (paths if r % 2 == 0 else paths[::-1]):
            out = subprocess.run([sys.executable, __file__, "--_2m", name, str(n_records)], check=True,
                                 capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    return {name: {"records": n_records, "rounds": len(rs), "buffers": -(-n_records // (CuptiSettings().buffer_size_bytes // RECORD_BYTES)),
                   "records_per_s": float(np.median([x["records_per_s"] for x in rs])),
                   "piece_max_ms": max(x["piece_max_ms"] for x in rs),
                   "piece_p99_ms": float(np.median([x["piece_p99_ms"] for x in rs])),
                   "ticker_stall_max_ms": max(x["ticker_stall_max_ms"] for x in rs), "each_round": rs}
            for name, rs in runs.items()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_2m"]:
        print(json.dumps(one_2m(argv[1], int(argv[2]))))
        return 0
    ap = cli.parser(__doc__)  # --smoke: 3 windows, 200k records, 1 round; nothing written
    ap.add_argument("--out", default=str(RESULTS), help="folder (default: bench/results)")
    ap.add_argument("--name", default="decode-buffers", help="the result file's name, without .json")
    ap.add_argument("--windows", type=int, default=50, help="20k-record windows to decode")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of 2M-record windows per path")
    a = ap.parse_args(argv)
    if a.smoke:
        a.windows, a.rounds = 3, 1
    s = CuptiSettings()
    nat = native.load()
    res: dict = {"record_bytes": RECORD_BYTES, "buffer_size_bytes": s.buffer_size_bytes,
                 "records_per_buffer": s.buffer_size_bytes // RECORD_BYTES, "loadavg_before": os.getloadavg(),
                 "decode_path": native.status(), "command": "python bench/collector/decode_buffers.py " + " ".join(argv)}
    ticker = Ticker()
    ticker.start()
    time.sleep(0.05)
    idle_max = []
    for _ in range(a.windows):  # the same ticker with nothing decoding: this machine's own scheduling noise
        ticker.reset()
        time.sleep(0.008)
        idle_max.append(ticker.max_gap_s)
    res["ticker_stall_idle_max_ms"] = float(np.max(idle_max)) * 1e3
    res["ticker_stall_idle_p50_ms"] = float(np.median(idle_max)) * 1e3
    # the default path (the C pass when built) and the numpy path side by side, in one run
    paths = {"native": nat, "numpy": None} if nat is not None else {"numpy": None}
    res["paths"] = {name: measure(lib, a, s, ticker) for name, lib in paths.items()}
    for name, got in measure_2m(list(paths), a.rounds, 200_000 if a.smoke else 2_000_000).items():
        res["paths"][name]["records_2m"] = got
    ticker.stop.set()
    main_path = res["paths"]["native" if nat is not None else "numpy"]
    res.update(main_path)  # the figures README cites: the path graphmon runs
    ok = True
    if nat is not None:
        res["native_speedup_20k"] = (res["paths"]["native"]["window_20k"]["records_per_s_median"]
                                     / res["paths"]["numpy"]["window_20k"]["records_per_s_median"])
        res["native_speedup_2m"] = (res["paths"]["native"]["records_2m"]["records_per_s"]
                                    / res["paths"]["numpy"]["records_2m"]["records_per_s"])
        ok = res["native_speedup_2m"] >= 1.0 and res["records_2m"]["piece_max_ms"] <= 2.0
    res["loadavg_after"] = os.getloadavg()
    res["targets"] = {"records_per_s": 10e6, "gil_hold_ms_per_20k_window": 1.0,
                      "native_2m_at_least_numpy_and_pieces_ms": 2.0}
    res["met"] = {"records_per_s": min(res["window_20k"]["records_per_s_median"], res["records_2m"]["records_per_s"]) >= 10e6,
                  "gil_hold_p50_window": res["window_20k"]["gil_hold_p50_ms"] < 1.0,
                  "gil_hold_max_window": res["window_20k"]["gil_hold_max_ms"] < 1.0,
                  "native_2m_at_least_numpy_pieces_2ms": ok}
    res["versions"] = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
                       "cpus": os.cpu_count()}
    if not a.smoke:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"{a.name}.json"), "w") as fh:
            json.dump(res, fh, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "paths"}, indent=2))
    return 0 if ok or a.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
