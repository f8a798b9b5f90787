"""GPU diagnostic (issue 29 item 2): why a cudagraph-tree replay comes out mis-assembled.

On the H200, HF static-cache generate (one stream) showed 12 of 896 gaps negative down to
-2.09 ms and one replay per window with span = busy = 2.1 ms against a median span of 0.88 ms.
This runs that client (tests/gpu/hf_workload.py's model, bs 1) under graphmon's CuptiSource in
the same process, with dense default-sized sampling windows (4 launches) and some 16-launch
capture windows, and records for every window what tells the hypotheses apart:

- the window's records, unfiltered (start, end, stream, device, graph id, graph node id,
  correlation id, name) and its launches as the collector kept them;
- every launch callback (enter and exit: correlation id, exec handle, stream, CUPTI timestamp,
  thread, in window or not) -> launches that straddle the window's open or close, one
  correlation id given to two launches, several graphs per decode step (cudagraph trees);
- kernel tracing on/off, flushes (forced or not) and launch-callback switches, with CUPTI
  timestamps -> records of the first replay after enabling, kernels still running at a
  forced flush (zero or bogus ends);
- CUDA-event time of every timed launch -> is a long replay really long on the GPU?
- the raw activity buffers (every CUpti_ActivityKernel field, e.g. ``completed`` at byte 32);
- the generate calls' CUPTI timestamps.

Hypotheses, and what in the file tells them apart (the summary prints each figure):
1. The first replay traced after each enable: CUPTI's one-time work (0.3-1.1 ms, bench/overhead/trace_cost.py)
   lands inside its first kernel's interval -> flagged replays are launch 0 of their window (in
   the 16-launch captures too), their longest-over-median kernel is rank 0, ``first_start_rel_on_us``
   small; ``event_ms`` says whether the GPU really took longer or only the stamps are off.
2. A launch straddling the open: entered before tracing was on but kept -> ``enter_rel_on_us`` < 0.
3. The close: a forced flush returns kernels still running with a bogus (non-zero) end ->
   flagged replays are the last launch, ``last_end_rel_off_us`` > 0; raw buffers' ``completed``.
4. Two launches under one correlation id (runtime cudaGraphLaunch vs driver cuGraphLaunch ids,
   or a stuck id) -> ``launches_with_two_enters``, ``replays_with_repeated_nodes``.
5. cudagraph trees replaying several graphs per step, kernels of one under another's id ->
   ``distinct_graphs_launched``, ``launches_per_generate``, ``replays_with_several_graph_ids``;
   and the ``no_trees`` variant.
6. Programmatic dependent launch: a kernel starting in its predecessor's tail -> negative gaps of
   a few us at most, between named kernels (``neg_pairs``), not -2 ms.
7. The analysis grouping records wrongly (fast path vs reference) -> ``fast_vs_reference_differs``.
8. Eager kernels under a graph launch's correlation id joining its replay ->
   ``non_graph_records_under_a_launch_corr``.

Variants, one per process (``--variants``): ``trees`` (the default: what transformers' compile uses,
torch.compile reduce-overhead, cudagraph trees) or ``no_trees``
(torch._inductor.config.triton.cudagraph_trees = False: one cudagraphify per graph, no tree).
Switching to ``no_trees`` after ``trees`` in one process hit a device-side assert in an inductor
kernel on the H200 (gpu-check-10), so a second variant in the same process is refused.

    python bench/diag/replays.py --out DIR [--variants no_trees]   # H200: ~60 s, one .npz + a text summary
    python bench/diag/replays.py --out DIR --dry-run  # CPU: the same recording against tests/fake_cupti
    python bench/diag/replays_summary.py DIR/diag-replays.npz   # the summary again, from the file (CPU)

Writes DIR/diag-replays.npz and DIR/diag-replays.txt (also printed). The summary is
bench/diag/replays_summary.py. Answered (bench/results/gpu-check-10/README.md): hypothesis 3, the
forced flush at the window's close stamped the last launch's kernels with its own time.
"""


import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import TESTS, on_path  # noqa: E402
from bench.diag.replays_summary import summarize  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine, or on a CPU with --dry-run


# ---------------------------------------------------------------------------- recording
class Log:
    """What the wrappers saw, each entry tagged with the number of windows delivered before it
    (``seq``: an entry with seq w happened before window w was delivered, i.e. in or before it)."""

    def __init__(self) -> None:
        self.seq = 0
        self.variant = 0
        self.cb: list[tuple] = []  # (kind 0 enter / 1 exit, corr, exec, stream, ts_ns, thread, seq, in_window, variant)
        self.act: list[tuple] = []  # (on, ts_ns after the call, seq)
        self.flush: list[tuple] = []  # (forced, ts_ns before, ts_ns after, seq)
        self.launch_cb: list[tuple] = []  # (on, ts_ns, seq)
        self.events: list[tuple] = []  # (seq, phase 0 ref / 1 win, corr, exec, ms)
        self.gen: list[tuple] = []  # (variant, t0_ns, t1_ns)
        self.buffers: list[tuple[int, np.ndarray]] = []  # (seq, raw bytes)
        self.buffer_bytes = 0
        self.max_buffer_bytes = 256 << 20
        self.in_window = lambda: False


class LoggingHandler:
    """Stands between CUPTI's callbacks and the collector: logs, then forwards."""

    def __init__(self, real: Any, api: Any, log: Log) -> None:
        self._real, self._api, self._log = real, api, log

    def on_launch_enter(self, corr, exec_handle, ctx, stream):
        lg = self._log
        lg.cb.append((0, corr, exec_handle, stream, self._api.timestamp_ns(), threading.get_ident(), lg.seq,
                      lg.in_window(), lg.variant))
        self._real.on_launch_enter(corr, exec_handle, ctx, stream)

    def on_launch_exit(self, corr):
        self._real.on_launch_exit(corr)
        lg = self._log
        lg.cb.append((1, corr, 0, 0, self._api.timestamp_ns(), threading.get_ident(), lg.seq, lg.in_window(),
                      lg.variant))

    def __getattr__(self, name):
        return getattr(self._real, name)


class ApiProxy:
    """A CuptiActivityApi that logs the calls telling the hypotheses apart and keeps a copy of
    every activity buffer; everything else goes to the real one."""

    def __init__(self, real: Any, log: Log) -> None:
        self._real, self._log = real, log

    def subscribe(self, handler):
        return self._real.subscribe(LoggingHandler(handler, self._real, self._log))

    def set_kernel_activity(self, on):
        self._real.set_kernel_activity(on)
        self._log.act.append((bool(on), self._real.timestamp_ns(), self._log.seq))

    def set_launch_callbacks(self, on):
        self._real.set_launch_callbacks(on)
        self._log.launch_cb.append((bool(on), self._real.timestamp_ns(), self._log.seq))

    def flush(self, forced=False):
        t0 = self._real.timestamp_ns()
        try:
            return self._real.flush(forced=forced)
        finally:
            self._log.flush.append((bool(forced), t0, self._real.timestamp_ns(), self._log.seq))

    def completed_buffer(self):
        buf = self._real.completed_buffer()
        lg = self._log
        if buf is not None and lg.buffer_bytes < lg.max_buffer_bytes:
            lg.buffers.append((lg.seq, np.array(buf.data, np.uint8)))
            lg.buffer_bytes += len(buf.data)
        return buf

    def __getattr__(self, name):
        return getattr(self._real, name)


def patch_event_timer(log: Log) -> None:
    """Every timed launch's CUDA-event time, per window (EventTimer.collect returns them per exec)."""
    from graphmon.sources.cupti.observer import EventTimer

    orig = EventTimer.collect

    def collect(self, rings):
        for ring in rings:
            for i in range(ring.n):
                e0, e1 = ring.ev0[i], ring.ev1[i]
                if e0 and e1:
                    try:
                        ms = self.events.elapsed_ms(ring.ctx[i], e0, e1)
                    except Exception:
                        ms = None
                    if ms is not None:
                        log.events.append((log.seq, 0 if ring.phase == "ref" else 1, ring.corr[i], ring.exec_handle[i],
                                           float(ms)))
        return orig(self, rings)

    EventTimer.collect = collect


def make_source(api: Any, log: Log, events: Any = None):
    from graphmon.settings import CuptiSettings
    from graphmon.sources.cupti.collector import CuptiSource

    # default window size (4 launches, 20 ms), dense: no tracing budget; keep_raw: fresh columns
    settings = CuptiSettings(interval_s=0.25, first_window_s=0.5, max_traced_share=1.0, keep_raw=True)
    src = CuptiSource(cupti=ApiProxy(api, log), settings=settings, events=events)
    src.records_sink = True  # the WindowRecords, unfiltered, as a light collector ships them
    log.in_window = lambda: src.in_window
    windows: list[tuple[int, Any]] = []

    def sink(rec):
        windows.append((log.variant, rec))
        log.seq += 1

    src.start(sink)
    src.wait_started(10)
    return src, windows


def request_captures(src, log: Log, stop: threading.Event, every_s: float = 2.0, replays: int = 16) -> None:
    """Now and then a 16-launch capture window: is the odd replay one per window or one per N launches?"""
    from graphmon.model.window import CaptureRequest

    i = 0
    while not stop.wait(every_s):
        i += 1
        try:
            src.request_capture(CaptureRequest(id=f"diag{i}", replays=replays, duration_ms=500))
        except RuntimeError:
            pass


def run_gpu(args, log: Log, t_start: float) -> tuple[Any, list, dict]:
    import torch

    on_path(TESTS / "gpu")
    from hf_workload import build

    from graphmon.sources.cupti.api import load_api
    from graphmon.settings import CuptiSettings

    s = CuptiSettings()
    api = load_api(s.buffer_size_bytes, s.max_buffers)
    patch_event_timer(log)
    # attach before the model compiles, as `graphmon run` does (at the first capture)
    src, windows = make_source(api, log)
    model, ids, kw = build()
    meta: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except Exception:
        pass
    stop = threading.Event()
    threading.Thread(target=request_captures, args=(src, log, stop), daemon=True).start()
    variants = args.variants.split(",")
    done = []
    with torch.inference_mode():
        for vi, variant in enumerate(variants):
            left = args.budget_s - (time.monotonic() - t_start)
            if vi and left < args.steady_s + 20:  # its recompile takes ~10-20 s
                print(f"variant {variant} skipped: {left:.0f} s of the budget left", flush=True)
                break
            log.variant = vi
            if variant == "no_trees":
                import torch._dynamo
                import torch._inductor.config as ic

                ic.triton.cudagraph_trees = False
                torch._dynamo.reset()
                for attr in ("_compiled_call", "_last_compile_config"):
                    model.__dict__.pop(attr, None)
            t0 = time.monotonic()
            first_s = None
            n_gen = 0
            while True:
                g0 = api.timestamp_ns()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                log.gen.append((vi, g0, api.timestamp_ns()))
                n_gen += 1
                now = time.monotonic()
                if n_gen == 2:  # the first generate compiles; from the second, steady replays
                    first_s = now - t0
                    t_steady = now
                if n_gen >= 2 and now - t_steady >= args.steady_s:
                    break
                if now - t_start > args.budget_s:
                    break
            print(f"variant {variant}: compile+first generates {first_s or 0:.1f} s, {n_gen} generates, "
                  f"{sum(1 for v, _ in windows if v == vi)} windows", flush=True)
            done.append(variant)
    stop.set()
    src.stop()
    meta.update(variants=done, stats=dict(src.stats), errors=dict(src.health().errors))
    return src, windows, meta


def run_dry(args, log: Log, t_start: float) -> tuple[Any, list, dict]:
    """The recording path on a CPU: tests/fake_cupti's simulated GPU, one decode-like graph."""
    on_path(TESTS)
    from fake_cupti import FakeCupti, FakeEvents, decode_like

    fake = FakeCupti()
    fake.first_traced_end_extra_ns = 200_000  # a first traced replay shaped like the H200's: its summary shows it
    patch_event_timer(log)
    src, windows = make_source(fake, log, events=FakeEvents(fake))
    stop = threading.Event()
    threading.Thread(target=request_captures, args=(src, log, stop, 0.5), daemon=True).start()
    h = fake.instantiate(decode_like(), flags=0)
    done = []
    for vi, variant in enumerate(args.variants.split(",")):
        log.variant = vi
        t0 = time.monotonic()
        while time.monotonic() - t0 < min(args.steady_s, 2.0):
            g0 = fake.timestamp_ns()
            for _ in range(8):
                fake.launch(h, 7)
                time.sleep(0.002)
            log.gen.append((vi, g0, fake.timestamp_ns()))
        done.append(variant)
    stop.set()
    src.stop()
    return src, windows, {"dry_run": True, "variants": done, "stats": dict(src.stats),
                          "errors": dict(src.health().errors)}


def save(path: str, log: Log, windows: list, meta: dict) -> None:
    """One .npz: flat columns with a window index (k_window, l_window, ...)."""
    names: list[str] = []
    name_index: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("k_window", "k_start", "k_end", "k_stream", "k_device", "k_graph_id",
                                             "k_node", "k_corr", "k_name", "l_window", "l_corr", "l_graph_id",
                                             "l_launch_ns", "l_stream")}
    w_rows = []
    graphs: dict[int, tuple[int, str]] = {}
    for wi, (variant, r) in enumerate(windows):
        k = r.kernels
        n = len(k["start_ns"])
        remap = np.array([name_index.setdefault(s, len(name_index)) for s in r.names] + [-1], np.int64)
        cols["k_window"].append(np.full(n, wi, np.int32))
        for dst, src in (("k_start", "start_ns"), ("k_end", "end_ns"), ("k_stream", "stream"), ("k_device", "device"),
                         ("k_graph_id", "graph_id"), ("k_node", "graph_node_id"), ("k_corr", "correlation_id")):
            cols[dst].append(np.asarray(k[src], np.int64))
        cols["k_name"].append(remap[np.asarray(k["name_id"], np.int64)])
        la = r.launches
        m = len(la["correlation_id"])
        gids = np.array([g.graph_id for g in r.graphs] + [-1], np.int64)
        for g in r.graphs:
            graphs[g.graph_id] = (g.exec_handle, g.upload_mode)
        cols["l_window"].append(np.full(m, wi, np.int32))
        cols["l_corr"].append(np.asarray(la["correlation_id"], np.int64))
        cols["l_graph_id"].append(gids[np.asarray(la["graph"], np.int64)])
        cols["l_launch_ns"].append(np.asarray(la["launch_ns"], np.int64))
        cols["l_stream"].append(np.asarray(la["stream"], np.int64))
        w_rows.append((wi, variant, r.started_s, r.ended_s, r.traced_s, r.capture_id is not None, n, m, r.dropped))
    out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in cols.items()}
    names = sorted(name_index, key=name_index.get)
    out["names"] = np.array(names, dtype=object).astype(str) if names else np.zeros(0, "U1")
    w = np.array(w_rows, np.float64).reshape(-1, 9)
    for i, k in enumerate(("w_window", "w_variant", "w_started_s", "w_ended_s", "w_traced_s", "w_capture",
                           "w_records", "w_launches", "w_dropped")):
        out[k] = w[:, i]

    def table(rows, keys, dtype=np.int64):
        a = np.array(rows, dtype).reshape(-1, len(keys))
        for i, k in enumerate(keys):
            out[k] = a[:, i]

    table([(a, b, c & 0x7FFFFFFFFFFFFFFF, d, e, f & 0x7FFFFFFFFFFFFFFF, g, int(h), v) for a, b, c, d, e, f, g, h, v in log.cb],
          ("cb_kind", "cb_corr", "cb_exec", "cb_stream", "cb_ts_ns", "cb_thread", "cb_seq", "cb_in_window", "cb_variant"))
    table([(int(a), b, c) for a, b, c in log.act], ("act_on", "act_ts_ns", "act_seq"))
    table([(int(a), b, c, d) for a, b, c, d in log.flush], ("fl_forced", "fl_t0_ns", "fl_t1_ns", "fl_seq"))
    table([(int(a), b, c) for a, b, c in log.launch_cb], ("lcb_on", "lcb_ts_ns", "lcb_seq"))
    table(log.gen, ("gen_variant", "gen_t0_ns", "gen_t1_ns"))
    ev = np.array(log.events, np.float64).reshape(-1, 5)
    for i, k in enumerate(("ev_seq", "ev_phase", "ev_corr", "ev_exec", "ev_ms")):
        out[k] = ev[:, i] if i == 4 else ev[:, i].astype(np.int64)
    out["rb_seq"] = np.array([s for s, _ in log.buffers], np.int64)
    out["rb_offsets"] = np.r_[0, np.cumsum([len(b) for _, b in log.buffers])].astype(np.int64)
    out["rb_data"] = np.concatenate([b for _, b in log.buffers]) if log.buffers else np.zeros(0, np.uint8)
    gid = sorted(graphs)
    out["g_graph_id"] = np.array(gid, np.int64)
    out["g_exec"] = np.array([graphs[g][0] & 0x7FFFFFFFFFFFFFFF for g in gid], np.int64)
    out["g_mode"] = np.array([graphs[g][1] for g in gid], dtype=object).astype(str) if gid else np.zeros(0, "U1")
    out["meta"] = np.array(json.dumps(meta, default=str))
    np.savez_compressed(path, **out)


def main(argv: Optional[list] = None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default="diag-replays-out")
    ap.add_argument("--variants", default="trees", help="trees (transformers' default compile) or no_trees: one "
                                                          "per process (--dry-run: any list)")
    ap.add_argument("--steady-s", type=float, default=12.0, help="seconds of steady generate per variant")
    ap.add_argument("--budget-s", type=float, default=85.0, help="a later variant is skipped past this")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tests/fake_cupti instead of CUPTI and HF")
    ap.add_argument("--summarize", metavar="NPZ", help="only print the summary of an earlier run's file "
                                                       "(as bench/diag/replays_summary.py NPZ)")
    args = ap.parse_args(argv)
    if args.summarize:
        text, _ = summarize(args.summarize)
        print(text)
        return 0
    if not args.dry_run and "," in args.variants:
        ap.error("one variant per process (a second compile mode in the same process crashed on the H200)")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.monotonic()
    log = Log()
    src, windows, meta = (run_dry if args.dry_run else run_gpu)(args, log, t_start)
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    meta["record_bytes"] = src.stats.get("record_bytes")
    npz = os.path.join(args.out, "diag-replays.npz")
    save(npz, log, windows, meta)
    text, report = summarize(npz)
    with open(os.path.join(args.out, "diag-replays.txt"), "w") as fh:
        fh.write(text)
    with open(os.path.join(args.out, "diag-replays.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
