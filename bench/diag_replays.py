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
1. The first replay traced after each enable: CUPTI's one-time work (0.3-1.1 ms, bench/trace_cost.py)
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

    python bench/diag_replays.py --out DIR [--variants no_trees]   # H200: ~60 s, one .npz + a text summary
    python bench/diag_replays.py --out DIR --dry-run  # CPU: the same recording against tests/fake_cupti
    python bench/diag_replays.py --summarize DIR/diag-replays.npz   # the summary again, from the file

Writes DIR/diag-replays.npz and DIR/diag-replays.txt (also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

SPAN_FACTOR = 1.5  # a replay with a span beyond this factor of its graph's median is shown
NEG_NS = -1000  # a gap below this on one stream is shown


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

    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
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
    sys.path.insert(0, os.path.join(ROOT, "tests"))
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


# ---------------------------------------------------------------------------- summary
def _busy(start: np.ndarray, end: np.ndarray) -> int:
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    if not len(s):
        return 0
    prev = np.r_[s[0], np.maximum.accumulate(e)[:-1]]  # the furthest end before each kernel
    return int(np.maximum(0, e - np.maximum(s, prev)).sum())


def _stream_gaps(start, end, stream):
    """Gaps in start order on each stream: (gap values, index of the earlier kernel, of the later)."""
    o = np.lexsort((end, start, stream))
    same = stream[o][1:] == stream[o][:-1]
    gaps = (start[o][1:] - end[o][:-1])[same]
    return gaps, o[:-1][same], o[1:][same]


def replay_table(d: dict) -> list[dict]:
    """Every window launch's replay, from the raw records (independently of graphmon's analysis)."""
    rows = []
    kw, lw = d["k_window"], d["l_window"]
    names = d["names"]
    node_dur: dict[tuple[int, int, int], list] = {}
    per_window = []
    for w in np.unique(lw).tolist():
        km = np.flatnonzero(kw == w)
        lcorr = d["l_corr"][lw == w]
        per_window.append((w, km, lcorr))
        g = km[(d["k_graph_id"][km] > 0) & (d["k_start"][km] > 0) & (d["k_end"][km] >= d["k_start"][km])]
        for i in g.tolist():
            node_dur.setdefault((int(d["w_variant"][w]), int(d["k_graph_id"][i]), int(d["k_node"][i])), []).append(
                int(d["k_end"][i] - d["k_start"][i]))
    med_dur = {k: float(np.median(v)) for k, v in node_dur.items()}
    act_on = d["act_ts_ns"][d["act_on"] == 1]
    act_off = d["act_ts_ns"][d["act_on"] == 0]
    act_on_seq = d["act_seq"][d["act_on"] == 1]
    act_off_seq = d["act_seq"][d["act_on"] == 0]
    enter = d["cb_kind"] == 0
    for w, km, lcorr in per_window:
        variant = int(d["w_variant"][w])
        on = act_on[act_on_seq == w]
        off = act_off[act_off_seq == w]
        t_on = int(on[-1]) if len(on) else 0
        t_off = int(off[-1]) if len(off) else 0
        forced = d["fl_forced"][d["fl_seq"] == w]
        ev_m = (d["ev_seq"] == w) & (d["ev_phase"] == 1)
        ev = dict(zip(d["ev_corr"][ev_m].tolist(), d["ev_ms"][ev_m].tolist()))
        for li, c in enumerate(lcorr.tolist()):
            m = km[d["k_corr"][km] == c]
            enters = np.flatnonzero(enter & (d["cb_corr"] == c))
            exits = np.flatnonzero(~enter & (d["cb_corr"] == c))
            row = {"window": w, "variant": variant, "capture": bool(d["w_capture"][w]), "launch_index": li,
                   "launches_in_window": len(lcorr), "corr": c, "records": int(len(m)),
                   "enter_callbacks": int(len(enters)),
                   "enter_rel_on_us": (int(d["cb_ts_ns"][enters[0]]) - t_on) / 1e3 if len(enters) and t_on else None,
                   "exit_rel_off_us": (int(d["cb_ts_ns"][exits[-1]]) - t_off) / 1e3 if len(exits) and t_off else None,
                   "forced_flush": bool(forced.any()), "event_ms": ev.get(c)}
            if not len(m):
                rows.append(row)
                continue
            st, en = d["k_start"][m], d["k_end"][m]
            bad = (st <= 0) | (en < st)
            row["bad_timestamps"] = int(bad.sum())
            row["non_graph_records"] = int((d["k_graph_id"][m] <= 0).sum())
            m = m[~bad & (d["k_graph_id"][m] > 0)]
            if not len(m):
                rows.append(row)
                continue
            st, en, sm = d["k_start"][m], d["k_end"][m], d["k_stream"][m]
            gids = sorted(set(d["k_graph_id"][m].tolist()))
            nodes, mult = np.unique(d["k_node"][m], return_counts=True)
            gaps, ia, ib = _stream_gaps(st, en, sm)
            o = np.argsort(st, kind="stable")
            first, last = m[o[0]], m[np.argmax(en)]
            dur = en - st
            med = np.array([med_dur.get((variant, int(d["k_graph_id"][i]), int(d["k_node"][i])), np.nan) for i in m])
            excess = dur - med
            worst = int(np.nanargmax(excess)) if np.isfinite(excess).any() else 0
            row.update(graph_ids=gids, streams=sorted(set(sm.tolist())), span_ns=int(en.max() - st.min()),
                       busy_ns=_busy(st, en), nodes=int(len(nodes)), node_max_mult=int(mult.max()),
                       neg_gaps=int((gaps < 0).sum()), gaps_below_1us=int((gaps < NEG_NS).sum()),
                       min_gap_ns=int(gaps.min()) if len(gaps) else None,
                       first_kernel=f"{names[d['k_name'][first]] if d['k_name'][first] >= 0 else '?'} node {d['k_node'][first]}",
                       last_kernel=f"{names[d['k_name'][last]] if d['k_name'][last] >= 0 else '?'} node {d['k_node'][last]}",
                       first_start_rel_on_us=(int(st.min()) - t_on) / 1e3 if t_on else None,
                       last_end_rel_off_us=(int(en.max()) - t_off) / 1e3 if t_off else None,
                       longest_over_node_median={"node": int(d["k_node"][m[worst]]), "dur_ns": int(dur[worst]),
                                                 "node_median_ns": float(med[worst]),
                                                 "rank_in_replay": int(np.flatnonzero(o == worst)[0]),
                                                 "start_rel_first_ns": int(st[worst] - st.min())},
                       neg_pairs=[{"earlier": _kname(d, m[a]), "later": _kname(d, m[b]), "gap_ns": int(gp),
                                   "earlier_dur_ns": int(dur[a]), "later_dur_ns": int(dur[b]),
                                   "earlier_node_median_ns": float(med[a]), "later_node_median_ns": float(med[b])}
                                  for gp, a, b in zip(gaps.tolist(), ia.tolist(), ib.tolist()) if gp < NEG_NS][:6])
            rows.append(row)
    # each replay against its graph's median span: in the window, and over the variant
    for key in ("window", "variant"):
        groups: dict[tuple, list] = {}
        for r in rows:
            if "span_ns" in r and len(r["graph_ids"]) == 1:
                groups.setdefault((r[key], r["variant"], r["graph_ids"][0]), []).append(r["span_ns"])
        for r in rows:
            if "span_ns" in r and len(r["graph_ids"]) == 1:
                r[f"span_over_{key}_median"] = r["span_ns"] / max(1.0, float(np.median(
                    groups[(r[key], r["variant"], r["graph_ids"][0])])))
    return rows


def _kname(d: dict, i: int) -> str:
    n = d["names"][d["k_name"][i]] if d["k_name"][i] >= 0 else "?"
    return f"{n[:60]} node {int(d['k_node'][i])} stream {int(d['k_stream'][i])}"


def graphmon_view(d: dict) -> dict:
    """What graphmon itself makes of each window (model/edges.assemble, then analyze), and whether
    the fast analysis path and the reference path agree on it."""
    from graphmon.analysis.reference import analyze_reference
    from graphmon.analysis.replays import analyze
    from graphmon.model.edges import assemble
    from graphmon.model.trace import GraphInfo
    from graphmon.model.window import WindowRecords

    out = {"windows": 0, "replays": 0, "gaps": 0, "neg_gaps": 0, "gaps_below_1us": 0, "min_gap_ns": None,
           "invalid": {}, "fast_vs_reference_differs": 0, "errors": 0}
    names = [str(s) for s in d["names"]]
    for w in np.unique(d["l_window"]).tolist():
        km, lm = d["k_window"] == w, d["l_window"] == w
        gids = np.unique(np.r_[d["k_graph_id"][km], d["l_graph_id"][lm]])
        gids = gids[gids > 0]
        graphs = [GraphInfo(key=f"g{g}", graph_id=int(g)) for g in gids.tolist()]
        index = {g: i for i, g in enumerate(gids.tolist())}
        name = d["k_name"][km]
        kernels = {"start_ns": d["k_start"][km], "end_ns": d["k_end"][km], "stream": d["k_stream"][km],
                   "device": d["k_device"][km].astype(np.int32), "graph_id": d["k_graph_id"][km],
                   "graph_node_id": d["k_node"][km], "correlation_id": d["k_corr"][km],
                   "name_id": np.where(name >= 0, name, -1).astype(np.int32)}
        m = int(lm.sum())
        launches = {"correlation_id": d["l_corr"][lm], "device": np.zeros(m, np.int32),
                    "graph": np.array([index.get(int(g), -1) for g in d["l_graph_id"][lm].tolist()], np.int32),
                    "launch_ns": d["l_launch_ns"][lm], "stream": d["l_stream"][lm], "label": np.full(m, -1, np.int32)}
        try:
            win = assemble(WindowRecords(kernels=kernels, launches=launches, names=names, graphs=graphs,
                                         started_s=0.0, ended_s=0.0))
            t = win.trace
            a = analyze(t)
            ref = analyze_reference(t)
        except Exception as e:
            out["errors"] += 1
            out["last_error"] = repr(e)
            continue
        out["windows"] += 1
        for k, v in t.invalid.items():
            out["invalid"][k] = out["invalid"].get(k, 0) + int(v)
        out["replays"] += len(a.replays)
        g = a.gaps.values
        out["gaps"] += len(g)
        out["neg_gaps"] += int((g < 0).sum())
        out["gaps_below_1us"] += int((g < NEG_NS).sum())
        if len(g):
            out["min_gap_ns"] = int(g.min()) if out["min_gap_ns"] is None else min(out["min_gap_ns"], int(g.min()))
        if not (np.array_equal(a.replays.span_ns, ref.replays.span_ns)
                and np.array_equal(a.replays.busy_ns, ref.replays.busy_ns)
                and np.array_equal(np.sort(a.gaps.values), np.sort(ref.gaps.values))):
            out["fast_vs_reference_differs"] += 1
    return out


def summarize(path: str) -> tuple[str, dict]:
    z = np.load(path, allow_pickle=False)
    d = {k: z[k] for k in z.files}
    meta = json.loads(str(d["meta"]))
    lines = [f"diag_replays: {path}", f"meta: {json.dumps({k: meta.get(k) for k in ('torch', 'transformers', 'device', 'variants', 'dry_run')})}",
             f"collector errors: {meta.get('errors')}",
             "collector stats: " + json.dumps({k: (meta.get("stats") or {}).get(k) for k in (
                 "windows", "late_stamped_records", "empty_no_launches", "idle_windows", "last_flush_ms")})]
    rows = replay_table(d)
    report: dict = {"meta": meta, "variants": {}}
    for vi, variant in enumerate(meta.get("variants", [])):
        vr = [r for r in rows if r["variant"] == vi]
        wins = sorted({r["window"] for r in vr})
        with_span = [r for r in vr if "span_ns" in r]
        flagged = [r for r in with_span if r.get("span_over_window_median", 0) > SPAN_FACTOR
                   or r.get("span_over_variant_median", 0) > SPAN_FACTOR or r["gaps_below_1us"] > 0]
        gv = graphmon_view(_select_variant(d, vi))
        pos: dict[str, int] = {}
        for r in flagged:
            k = ("first" if r["launch_index"] == 0 else "last" if r["launch_index"] == r["launches_in_window"] - 1
                 else "middle")
            pos[k] = pos.get(k, 0) + 1
        gen = d["gen_variant"] == vi
        gids = d["l_graph_id"][np.isin(d["l_window"], wins)]
        spans = np.array([r["span_ns"] for r in with_span], np.float64)
        ev_ratio = [r["span_ns"] / 1e6 / r["event_ms"] for r in with_span if r.get("event_ms")]
        summ = {
            "windows": len(wins), "capture_windows": int(sum(d["w_capture"][w] for w in wins)),
            "launches": len(vr), "replays_with_records": len(with_span),
            "generate_calls": int(gen.sum()),
            "distinct_graphs_launched": int(len(np.unique(gids[gids > 0]))),
            "launches_per_generate": float(len(vr)) / max(1, int(gen.sum())),
            "median_span_us": float(np.median(spans)) / 1e3 if len(spans) else None,
            "replays_flagged": len(flagged), "flagged_position_in_window": pos,
            "flagged_in_capture_windows": sum(1 for r in flagged if r["capture"]),
            "windows_with_forced_flush": len({r["window"] for r in vr if r["forced_flush"]}),
            "neg_gaps_raw": int(sum(r["neg_gaps"] for r in with_span)),
            "gaps_below_1us_raw": int(sum(r["gaps_below_1us"] for r in with_span)),
            "neg_gap_replays_by_position": {p: sum(1 for r in with_span if r["neg_gaps"] and (
                "first" if r["launch_index"] == 0 else "last" if r["launch_index"] == r["launches_in_window"] - 1
                else "middle") == p) for p in ("first", "middle", "last")},
            "launches_with_two_enters": sum(1 for r in vr if r["enter_callbacks"] > 1),
            "replays_with_repeated_nodes": sum(1 for r in with_span if r["node_max_mult"] > 1),
            "replays_with_several_graph_ids": sum(1 for r in with_span if len(r["graph_ids"]) > 1),
            "launches_without_records": sum(1 for r in vr if not r["records"]),
            "records_with_bad_timestamps": int(sum(r.get("bad_timestamps", 0) for r in vr)),
            "non_graph_records_under_a_launch_corr": int(sum(r.get("non_graph_records", 0) for r in vr)),
            "span_over_event_ms_median": float(np.median(ev_ratio)) if ev_ratio else None,
            "graphmon": gv,
        }
        report["variants"][variant] = {"summary": summ, "flagged": flagged[:40]}
        lines.append(f"\n== variant {variant}")
        for k, v in summ.items():
            lines.append(f"  {k}: {v}")
        lines.append(f"  flagged replays (span > {SPAN_FACTOR}x its graph's median, or a gap < {NEG_NS} ns on a stream), "
                     "first 12:")
        for r in flagged[:12]:
            lines.append("   - " + json.dumps({k: r.get(k) for k in (
                "window", "capture", "launch_index", "launches_in_window", "corr", "graph_ids", "streams", "records",
                "nodes", "node_max_mult", "span_ns", "busy_ns", "span_over_window_median", "event_ms", "neg_gaps",
                "min_gap_ns", "first_kernel", "last_kernel", "enter_rel_on_us", "exit_rel_off_us",
                "first_start_rel_on_us", "last_end_rel_off_us", "forced_flush", "longest_over_node_median")},
                default=str))
            for p in r.get("neg_pairs", [])[:3]:
                lines.append(f"       gap {p['gap_ns']} ns: {p['earlier']} (dur {p['earlier_dur_ns']}, node median "
                             f"{p['earlier_node_median_ns']:.0f}) -> {p['later']} (dur {p['later_dur_ns']}, node median "
                             f"{p['later_node_median_ns']:.0f})")
    return "\n".join(lines) + "\n", report


def _select_variant(d: dict, vi: int) -> dict:
    """The arrays of one variant's windows only (window indices kept)."""
    wins = np.flatnonzero(d["w_variant"] == vi)
    out = dict(d)
    km, lm = np.isin(d["k_window"], wins), np.isin(d["l_window"], wins)
    for k in d:
        if k.startswith("k_"):
            out[k] = d[k][km]
        elif k.startswith("l_"):
            out[k] = d[k][lm]
    return out


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="diag-replays-out")
    ap.add_argument("--variants", default="trees", help="trees (transformers' default compile) or no_trees: one "
                                                          "per process (--dry-run: any list)")
    ap.add_argument("--steady-s", type=float, default=12.0, help="seconds of steady generate per variant")
    ap.add_argument("--budget-s", type=float, default=85.0, help="a later variant is skipped past this")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tests/fake_cupti instead of CUPTI and HF")
    ap.add_argument("--summarize", metavar="NPZ", help="only print the summary of an earlier run's file")
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
