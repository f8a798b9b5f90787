"""What CUPTI costs the host between graphmon's windows (issue 13), and where it comes from.

Attached and idle, graphmon cost an HF transformers decode +0.46% (paired blocks, H200), with no
Python of its own running. This splits that cost by CUPTI state, each state against "none"
(unsubscribed) in alternating blocks in one process:

  sub       subscribed, no callback enabled
  resource  + the resource domain's GRAPHEXEC_CREATED / GRAPHEXEC_DESTROY_STARTING
  driver    + driver-API instantiate / upload / exec-destroy callbacks (graphmon's idle state)
  launch    + cuGraphLaunch callbacks (graphmon inside a window; calibration: a known cost)
  graphmon  graphmon's CuptiSource started and idle (its threads, buffer callbacks registered)

Three host operations, each a driver API call under torch: a stream query (cuStreamQuery), an
eager one-element add (cuLaunchKernel) and a one-kernel graph replay (cuGraphLaunch). Per
state and op: the median over pairs of 100*log(time on / time off) with its sign-test 95%
interval, and the same as ns per call. Then, for the HF decode of bench/common/hf.py, the
driver and runtime API calls per decode step (counted by a callback for one request) and paired
blocks of the decode itself with some states. Then one traced window, and the ops again: does
anything stay slower once kernel tracing has been on (the GPU time of a graph replay too)?

    python bench/overhead/cupti_idle_cost.py --out DIR [--hf-s 35] [--hf-states driver,resource,graphmon]

Writes DIR/cupti-idle-cost.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common import hostloop as H  # noqa: E402  (the paired blocks, the sign test)
from bench.common.hf import hf_workload  # noqa: E402
from bench.common.paths import RESULTS  # noqa: E402

DEVICE = "gpu"  # CI imports it and asks --help; it runs on a CUDA machine (bench/README.md)
R: dict = {"micro": {}, "hf": {}, "errors": {}}
RAW_STATES = ("sub", "resource", "driver", "launch")


class RawCupti:
    """cupti-python alone, in the states above (graphmon's adapter names the callback ids)."""

    def __init__(self) -> None:
        from cupti import cupti as c

        from graphmon.sources.cupti import api

        self.c, self.sub, self.calls = c, None, 0
        ids = c.DriverApiTraceCbid
        names = api.INSTANTIATE_APIS + api.UPLOAD_APIS + api.DESTROY_APIS
        self.idle_cbids = [int(getattr(ids, n)) for n in names if getattr(ids, n, None) is not None]
        self.launch_cbids = [int(getattr(ids, n)) for n in api.LAUNCH_APIS if getattr(ids, n, None) is not None]
        res = c.CallbackIdResource
        self.resource_cbids = [int(res.GRAPHEXEC_CREATED), int(res.GRAPHEXEC_DESTROY_STARTING)]

    def _cb(self, userdata, domain, cbid, cbdata) -> None:
        self.calls += 1

    def on(self, state: str) -> None:
        c = self.c
        self.off()
        self.sub = c.subscribe(self._cb, None)
        if state == "resource":
            for cbid in self.resource_cbids:
                c.enable_callback(1, self.sub, c.CallbackDomain.RESOURCE, cbid)
        if state in ("driver", "launch"):
            for cbid in self.idle_cbids:
                c.enable_callback(1, self.sub, c.CallbackDomain.DRIVER_API, cbid)
        if state == "launch":
            for cbid in self.launch_cbids:
                c.enable_callback(1, self.sub, c.CallbackDomain.DRIVER_API, cbid)

    def off(self) -> None:
        if self.sub is not None:
            self.c.unsubscribe(self.sub)
            self.sub = None


class GraphmonIdle:
    """graphmon's CUPTI source, started with no window due (what a light collector holds)."""

    def __init__(self, first_window_s: float = 1e6) -> None:
        self.first_window_s = first_window_s
        self.src = None

    def on(self, state: str = "graphmon"):
        from graphmon.settings import CuptiSettings
        from graphmon.sources.cupti.collector import CuptiSource

        self.off()
        self.src = CuptiSource(settings=CuptiSettings(first_window_s=self.first_window_s, interval_s=1e5,
                                                      max_interval_s=1e5))
        self.src.start(lambda w: None)
        self.src.wait_started(5.0)
        return self.src

    def off(self) -> None:
        if self.src is not None:
            self.src.stop()
            self.src = None


def micro_ops():
    import torch

    s = torch.cuda.current_stream()
    x = torch.zeros(1, device="cuda")
    g_in = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(s)
    with torch.cuda.stream(side):
        g_in.add_(1)  # warm the kernel before capture
    s.wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        g_in.add_(1)
    big_in = torch.zeros(1, device="cuda")
    big = torch.cuda.CUDAGraph()  # 100 kernels: the GPU time of a replay (residual instrumentation?)
    with torch.cuda.graph(big):
        for _ in range(100):
            big_in.add_(1)
    torch.cuda.synchronize()

    def query(n: int) -> None:
        for _ in range(n):
            s.query()

    def launch(n: int) -> None:
        for i in range(n):
            x.add_(1)
            if i % 256 == 255:
                torch.cuda.synchronize()  # a shallow queue: the host never waits on a full one
        torch.cuda.synchronize()

    def replay(n: int) -> None:
        for i in range(n):
            g.replay()
            if i % 256 == 255:
                torch.cuda.synchronize()
        torch.cuda.synchronize()

    def big_gpu_us(reps: int = 20) -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(reps):
            e0.record()
            big.replay()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3)
        return float(np.median(out))

    def big_sync(n: int) -> None:  # host time of a replay the host waits for: GPU time included
        for _ in range(n):
            big.replay()
            torch.cuda.synchronize()

    return {"stream_query": (query, 3000), "eager_launch": (launch, 1000), "graph_replay": (replay, 600),
            "graph100_synced": (big_sync, 40)}, big_gpu_us


def block_ns(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def compare(arm, state: str, ops: dict, pairs: int) -> dict:
    """Alternating (off,on)/(on,off) blocks of each op; per pair log-ratio and ns difference."""
    out = {}
    for op, (fn, n) in ops.items():
        fn(n)  # warm
        ratios, diffs, on_ns, off_ns = [], [], [], []
        for i in range(pairs):
            got = {}
            for a in (("off", "on") if i % 2 == 0 else ("on", "off")):
                if a == "on":
                    arm.on(state)
                got[a] = block_ns(fn, n)
                if a == "on":
                    arm.off()
            ratios.append(100 * np.log(got["on"] / got["off"]))
            diffs.append(got["on"] - got["off"])
            on_ns.append(got["on"])
            off_ns.append(got["off"])
        r, d = np.array(ratios), np.array(diffs)
        out[op] = {"pairs": pairs, "calls_per_block": n, "median_pct": float(np.median(r)),
                   "ci95_pct": H.sign_test_ci(r), "median_ns_per_call": float(np.median(d)),
                   "ci95_ns_per_call": H.sign_test_ci(d), "off_ns_per_call_median": float(np.median(off_ns)),
                   "on_ns_per_call_median": float(np.median(on_ns))}
        print(f"  {state:9s} {op:13s} {out[op]['median_pct']:+7.2f}% {out[op]['ci95_pct']}  "
              f"{out[op]['median_ns_per_call']:+8.1f} ns/call (off {out[op]['off_ns_per_call_median']:.0f} ns)",
              flush=True)
    return out


def level(ops: dict, blocks: int) -> dict:
    """Each op's time per call with nothing subscribed (for before/after a traced window)."""
    return {op: float(np.median([block_ns(fn, n) for _ in range(blocks)])) for op, (fn, n) in ops.items()}


def count_calls(run_once) -> dict:
    """Driver and runtime API calls per decode step: every callback of both domains, one request."""
    from cupti import cupti as c

    counts: dict = {}

    def cb(userdata, domain, cbid, cbdata) -> None:
        if cbdata.callback_site == c.ApiCallbackSite.API_ENTER:
            k = (int(domain), int(cbid))
            counts[k] = counts.get(k, 0) + 1

    sub = c.subscribe(cb, None)
    c.enable_domain(1, sub, c.CallbackDomain.DRIVER_API)
    c.enable_domain(1, sub, c.CallbackDomain.RUNTIME_API)
    try:
        t = run_once()
    finally:
        c.unsubscribe(sub)
    steps = max(1, len(t) - 1)
    drv = int(c.CallbackDomain.DRIVER_API)
    by_name = sorted(((n, c.get_callback_name(d, k), d == drv) for (d, k), n in counts.items()), reverse=True)
    return {"steps": steps,
            "driver_calls_per_step": sum(n for n, _, is_drv in by_name if is_drv) / steps,
            "runtime_calls_per_step": sum(n for n, _, is_drv in by_name if not is_drv) / steps,
            "top": [{"name": str(name), "domain": "driver" if is_drv else "runtime", "per_step": n / steps}
                    for n, name, is_drv in by_name[:25]]}


class Finalizing:
    """CUPTI's state toggled by cuptiFinalize: "on" registers graphmon's buffer callbacks (and,
    with ``activity``, traces a few replays, flushes; with ``sub``, subscribes the idle driver
    callbacks: graphmon's idle state after a window); "off" unsubscribes and finalizes."""

    def __init__(self, raw: RawCupti, ops: dict, activity: bool, sub: bool) -> None:
        from graphmon.sources.cupti.api import CuptiPythonApi

        self.raw, self.activity, self.sub = raw, activity, sub
        self.api = CuptiPythonApi(8 << 20, 8)
        self.replay = ops["graph_replay"][0]
        self.times: dict = {"finalize_ms": [], "register_ms": [], "enable_ms": [], "traced_replay_ms": [],
                            "records": []}

    def drain(self) -> int:
        n = 0
        while True:
            b = self.api.completed_buffer()
            if b is None:
                return n
            n += len(b.data)
            self.api.release_buffer(b.key)

    def on(self, state: str = "") -> None:
        c, t = self.raw.c, self.times
        t0 = time.perf_counter()
        rc = self.api.lib.cuptiActivityRegisterCallbacks(self.api.pool.request_cb, self.api.pool.complete_cb)
        assert rc == 0, rc
        t["register_ms"].append((time.perf_counter() - t0) * 1e3)
        if self.activity:
            t0 = time.perf_counter()
            c.activity_enable(c.ActivityKind.CONCURRENT_KERNEL)
            t1 = time.perf_counter()
            self.replay(50)
            t2 = time.perf_counter()
            c.activity_disable(c.ActivityKind.CONCURRENT_KERNEL)
            self.api.flush(forced=True)
            t["enable_ms"].append((t1 - t0) * 1e3)
            t["traced_replay_ms"].append((t2 - t1) * 1e3)
            t["records"].append(self.drain())
        if self.sub:
            self.raw.on("driver")

    def off(self) -> None:
        self.raw.off()
        self.api.flush(forced=True)
        self.drain()
        t0 = time.perf_counter()
        self.raw.c.finalize()
        self.times["finalize_ms"].append((time.perf_counter() - t0) * 1e3)


def summary_ms(x: list) -> dict:
    return {"n": len(x), "median": float(np.median(x)), "max": float(np.max(x))} if x else {}


def finalize_in_callback(raw: RawCupti, ops: dict) -> dict:
    """cuptiFinalize the way CUPTI's docs recommend: from a driver API exit callback (the host's
    own call, so nothing races it); how long the host's call took, and CUPTI usable after."""
    c = raw.c
    f = Finalizing(raw, ops, activity=True, sub=False)
    f.on()
    f.api.flush(forced=True)
    f.drain()
    got: dict = {}

    def cb(userdata, domain, cbid, cbdata) -> None:
        if "ms" not in got and cbdata.callback_site == c.ApiCallbackSite.API_EXIT:
            got["api"] = str(c.get_callback_name(domain, cbid))
            t0 = time.perf_counter()
            c.finalize()
            got["ms"] = (time.perf_counter() - t0) * 1e3

    sub = c.subscribe(cb, None)
    c.enable_domain(1, sub, c.CallbackDomain.DRIVER_API)
    query = ops["stream_query"][0]
    t0 = time.perf_counter()
    query(1)
    got["host_call_ms"] = (time.perf_counter() - t0) * 1e3
    try:
        c.unsubscribe(sub)  # finalize dropped it already
        got["unsubscribe_after"] = "ok"
    except Exception as e:
        got["unsubscribe_after"] = repr(e)[:200]
    raw.on("driver")  # usable again
    raw.off()
    return got


def stages(ops: dict, raw: RawCupti, pairs: int) -> dict:
    """Before any other CUPTI use in this process: the driver subscription's cost once graphmon's
    buffer callbacks are registered, once kernel tracing has been on, and once CUPTI is
    finalized; then each of those states against a finalized CUPTI (toggled by cuptiFinalize)."""
    out: dict = {}
    print("stages:", flush=True)
    out["0_clean"] = compare(raw, "driver", ops, pairs)
    fz = Finalizing(raw, ops, activity=False, sub=False)
    fz.on()
    out["1_registered"] = compare(raw, "driver", ops, pairs)
    fa = Finalizing(raw, ops, activity=True, sub=False)
    fa.on()
    out["first_enable"] = dict(fa.times)
    out["2_after_tracing"] = compare(raw, "driver", ops, pairs)
    fa.off()
    out["3_finalized"] = compare(raw, "driver", ops, pairs)
    out["finalize_in_callback"] = finalize_in_callback(raw, ops)
    print(f"  finalize in an API exit callback: {out['finalize_in_callback']}", flush=True)
    for name, f in (("4_registered_vs_finalized", Finalizing(raw, ops, False, False)),
                    ("5_traced_vs_finalized", Finalizing(raw, ops, True, False)),
                    ("6_traced_subscribed_vs_finalized", Finalizing(raw, ops, True, True))):
        print(f" {name}:", flush=True)
        out[name] = compare(f, name, ops, max(6, pairs // 3))
        out[name]["times"] = {k: summary_ms(v) for k, v in f.times.items()}
        print(f"  times {out[name]['times']}", flush=True)
    return out


def main(argv=None) -> int:
    ap = cli.parser(__doc__, smoke=False)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--pairs", type=int, default=60, help="pairs of blocks per state and op")
    ap.add_argument("--hf-s", type=float, default=35.0, help="seconds of HF paired blocks per state (0: no HF)")
    ap.add_argument("--hf-states", default="driver,resource,graphmon")
    ap.add_argument("--hf-bs", type=int, default=1)
    ap.add_argument("--stages", action="store_true",
                    help="first: the cost by CUPTI state before and after kernel tracing and cuptiFinalize. "
                         "Its last comparisons trace and finalize in cycles, which faulted the H200 (Xid 31, "
                         "'unspecified launch failure': bench/results/gpu-check-8); run it in a process of its own")
    ap.add_argument("--no-micro", action="store_true", help="skip the per-state micro comparisons")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "cupti-idle-cost.json")

    def save() -> None:
        with open(path, "w") as fh:
            json.dump(R, fh, indent=1, default=str)

    R["versions"] = H.versions()
    R["settings"] = vars(a)
    t_start = time.monotonic()
    ops, big_gpu_us = micro_ops()
    raw, gm = RawCupti(), GraphmonIdle()
    if a.stages:
        try:
            R["stages"] = stages(ops, raw, a.pairs)
        except Exception:
            R["errors"]["stages"] = traceback.format_exc()[-3000:]
        save()
    try:
        if a.no_micro:
            raise StopIteration
        print("micro, before any kernel tracing:", flush=True)
        R["micro"]["level_before"] = level(ops, 20)
        R["micro"]["graph100_gpu_us_before"] = big_gpu_us()
        for state in RAW_STATES:
            R["micro"][state] = compare(raw, state, ops, a.pairs)
            save()
        R["micro"]["graphmon"] = compare(gm, "graphmon", ops, a.pairs // 2)
        save()
    except StopIteration:
        pass
    except Exception:
        R["errors"]["micro"] = traceback.format_exc()[-3000:]
        save()

    if a.hf_s > 0:
        try:
            run_once, meta = hf_workload(a.hf_bs, 128)
            for _ in range(3):
                run_once()
            R["hf"]["meta"] = meta
            R["hf"]["calls"] = count_calls(run_once)
            print(f"HF bs{a.hf_bs}: {R['hf']['calls']['driver_calls_per_step']:.1f} driver, "
                  f"{R['hf']['calls']['runtime_calls_per_step']:.1f} runtime calls per step", flush=True)
            save()
            for state in [x for x in a.hf_states.split(",") if x]:
                arm = gm if state == "graphmon" else raw
                res = H.paired(run_once, a.hf_s, 0.1, 1e9, turn_on=lambda first, st=state, ar=arm: ar.on(st),
                               turn_off=arm.off)
                res.pop("_pairs", None)
                R["hf"][state] = res
                print(f"  HF {state:9s} {res['median_overhead_pct']:+.2f}% [{res['ci95_low_pct']}, "
                      f"{res['ci95_high_pct']}] over {res['n_pairs']} pairs", flush=True)
                save()
        except Exception:
            R["errors"]["hf"] = traceback.format_exc()[-3000:]
            save()

    try:  # one traced window, then the same ops again, unsubscribed
        win = GraphmonIdle(first_window_s=0.05)
        src = win.on()
        fn, n = ops["graph_replay"]
        t_w = time.monotonic()
        while src.stats.get("windows", 0) < 1 and time.monotonic() - t_w < 10:
            fn(n)
        R["micro"]["window"] = {"windows": src.stats.get("windows"), "records": src.stats.get("records"),
                                "errors": dict(src.health().errors) if hasattr(src.health(), "errors") else None}
        # a graph captured now: its instantiation seen (upload mode known) after the finalize cycles
        import torch

        from graphmon.sources.cupti.registry import REGISTRY

        n0 = len(REGISTRY)
        y = torch.zeros(1, device="cuda")
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            y.add_(1)
        g2.replay()
        torch.cuda.synchronize()
        time.sleep(0.2)
        R["micro"]["window"]["registry_new"] = len(REGISTRY) - n0
        R["micro"]["window"]["last_graph"] = repr(REGISTRY.infos()[-1]) if len(REGISTRY) else None
        print(f"  after: {R['micro']['window']}", flush=True)
        win.off()
        print("micro, after one traced window:", flush=True)
        R["micro"]["level_after"] = level(ops, 20)
        R["micro"]["graph100_gpu_us_after"] = big_gpu_us()
        R["micro"]["after_driver"] = compare(raw, "driver", ops, a.pairs // 2)
        R["micro"]["level_after_ratio"] = {k: R["micro"]["level_after"][k] / v
                                           for k, v in R["micro"]["level_before"].items()}
        print(f"  level after/before: {R['micro']['level_after_ratio']}; graph100 GPU us "
              f"{R['micro']['graph100_gpu_us_before']:.1f} -> {R['micro']['graph100_gpu_us_after']:.1f}", flush=True)
    except Exception:
        R["errors"]["after"] = traceback.format_exc()[-3000:]
    R["total_seconds"] = time.monotonic() - t_start
    save()
    return 0 if not R["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
