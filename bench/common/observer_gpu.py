"""GPU side of the observer-effect benches: raw cupti-python, graphs with in-graph events, and
replay loops that time them (bench/observer/). Used only on a CUDA machine (torch, cupti-python,
imported when called).

Why raw cupti-python and not graphmon's collector: the quantity is what CUPTI's kernel tracing
does to the GPU's timeline, not what graphmon's Python costs; driving CUPTI directly keeps the
measurement independent of the collector (which other work is changing) and lets one process
switch between kinds (GRAPH_TRACE, CONCURRENT_KERNEL) that graphmon never mixes. The setup is a
graphmon window's: CUPTI subscribed, the activity buffers registered, CONCURRENT_KERNEL enabled for
the traced replays only, a forced flush after. Records come as cupti-python objects (fine for
these volumes, and the decoding runs after each block, never during the replays timed).
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections import Counter

import numpy as np

from bench.common.observer_stats import Stages

SLEEP_CYCLES = 2000  # torch.cuda._sleep: a one-thread kernel that spins this many SM cycles (~1 us)


# ---------------------------------------------------------------------- CUPTI
class Cupti:
    """One CUPTI subscriber, activity buffers, and an optional cuGraphLaunch callback."""

    def __init__(self, buffer_bytes: int = 32 << 20) -> None:
        from cupti import cupti as c

        self.c = c
        self.buffer_bytes = int(buffer_bytes)
        self.K = {n: int(getattr(c.ActivityKind, n)) for n in
                  ("CONCURRENT_KERNEL", "GRAPH_TRACE", "CUDA_EVENT", "HOST_LAUNCH") if hasattr(c.ActivityKind, n)}
        self.kernels: list[tuple] = []
        self.graph_traces: list[tuple] = []
        self.cuda_events: list[tuple] = []
        self.host_launches: list[tuple] = []
        self.other: Counter = Counter()
        self.on_launch = None  # callable(enter: bool, corr, exec_handle, stream) while launch callbacks are on
        self.launches = 0
        self.callback_errors = 0
        self.sub = c.subscribe(self._callback, None)
        c.activity_register_callbacks(self._request, self._complete)
        ids = c.DriverApiTraceCbid
        self._launch_cbids = {int(getattr(ids, n)): n for n in ("cuGraphLaunch", "cuGraphLaunch_ptsz") if hasattr(ids, n)}

    # activity buffers
    def _request(self):
        return self.buffer_bytes, 0

    def _complete(self, acts) -> None:
        K = self.K
        for a in acts:
            k = int(a.kind)
            if k == K["CONCURRENT_KERNEL"]:
                self.kernels.append((a.start, a.end, a.stream_id, a.graph_id, a.graph_node_id, a.correlation_id,
                                     getattr(a, "queued", 0), getattr(a, "submitted", 0)))
            elif k == K.get("GRAPH_TRACE"):
                self.graph_traces.append((a.start, a.end, a.stream_id, a.graph_id, a.correlation_id))
            elif k == K.get("CUDA_EVENT"):
                self.cuda_events.append((a.device_timestamp, a.event_id, a.stream_id, a.correlation_id))
            elif k == K.get("HOST_LAUNCH"):
                self.host_launches.append((a.start, a.end, a.stream_id, a.correlation_id))
            else:
                self.other[k] += 1

    def enable(self, kind: str, on: bool = True) -> None:
        (self.c.activity_enable if on else self.c.activity_disable)(self.K[kind])

    def flush(self) -> None:
        self.c.activity_flush_all(1)

    def take_kernels(self) -> np.ndarray:
        """Kernel records since the last take: (N, 8) int64 start, end, stream, graph_id,
        graph_node_id, correlation_id, queued, submitted."""
        out = np.array(self.kernels, dtype=np.int64).reshape(-1, 8)
        self.kernels = []
        return out

    def take_graph_traces(self) -> np.ndarray:
        out = np.array(self.graph_traces, dtype=np.int64).reshape(-1, 5)
        self.graph_traces = []
        return out

    def dropped(self) -> int:
        n = ctypes.c_size_t(0)
        try:
            self.c.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        except Exception:
            return -1
        return int(n.value)

    def graph_id(self, exec_handle: int) -> int:
        return int(self.c.get_graph_exec_id(exec_handle))

    # launch callbacks
    def launch_callbacks(self, on: bool) -> None:
        c = self.c
        for cbid in self._launch_cbids:
            c.enable_callback(1 if on else 0, self.sub, c.CallbackDomain.DRIVER_API, cbid)

    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        try:
            name = self._launch_cbids.get(cbid)
            if name is None:
                return
            self.launches += 1
            fn = self.on_launch
            if fn is None:
                return
            c = self.c
            if name == "cuGraphLaunch":
                p = c.CuGraphLaunchParams.from_ptr(cbdata.function_params, readonly=True)
                ex = int(p.h_graph)  # named h_graph, holds the exec
            else:
                p = c.CuGraphLaunchPtszParams.from_ptr(cbdata.function_params, readonly=True)
                ex = int(p.h_graph_exec)
            fn(cbdata.callback_site == c.ApiCallbackSite.API_ENTER, cbdata.correlation_id, ex, int(p.h_stream or 0))
        except Exception:
            self.callback_errors += 1

    def close(self) -> None:
        try:
            self.c.activity_flush_all(1)
        finally:
            self.c.unsubscribe(self.sub)  # never finalize(): it breaks the CUDA context


# ---------------------------------------------------------------------- driver events (for the launch callback)
class DriverEvents:
    """A fixed pool of CUDA events recorded through the driver API (ctypes): what a launch
    callback can do without touching torch."""

    def __init__(self, n: int) -> None:
        L = self.lib = ctypes.CDLL("libcuda.so.1")
        L.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._elapsed = getattr(L, "cuEventElapsedTime_v2", None) or L.cuEventElapsedTime
        self.pool = []
        for _ in range(n):
            ev = ctypes.c_void_p()
            if L.cuEventCreate(ctypes.byref(ev), 0):
                raise RuntimeError("cuEventCreate failed")
            self.pool.append(ev.value)
        self.used = 0

    def record(self, stream: int) -> int:
        """Records the next pool event on ``stream``; its index, or -1 when the pool is used up."""
        i = self.used
        if i >= len(self.pool):
            return -1
        self.used = i + 1
        self.lib.cuEventRecord(self.pool[i], stream)
        return i

    def elapsed_ms(self, i: int, j: int) -> float:
        ms = ctypes.c_float(0)
        rc = self._elapsed(ctypes.byref(ms), ctypes.c_void_p(self.pool[i]), ctypes.c_void_p(self.pool[j]))
        return float(ms.value) if rc == 0 else float("nan")

    def reset(self) -> None:
        self.used = 0


class LaunchEvents:
    """The "callback_events" candidate: a CUDA event recorded from the launch callback at each
    graph launch's enter and exit (``on_launch`` is what ``Cupti.on_launch`` calls); one pair per
    launch, the replay's duration between them."""

    def __init__(self, n: int) -> None:
        self.dev = DriverEvents(n)
        self.pairs: list = []  # (enter event index, exit event index); -1 where the pool ran out
        self._open: dict = {}

    def on_launch(self, enter, corr, ex, stream) -> None:
        if enter:
            self._open[corr] = self.dev.record(stream)
        else:
            self.pairs.append((self._open.pop(corr, -1), self.dev.record(stream)))

    def reset(self) -> None:
        self.dev.reset()
        self.pairs.clear()

    def durations_ns(self) -> np.ndarray:
        return np.array([self.dev.elapsed_ms(i, j) * 1e6 if i >= 0 and j >= 0 else np.nan for i, j in self.pairs])


# ---------------------------------------------------------------------- graphs with in-graph events
class EventedGraph:
    """A captured graph with event-record nodes (torch.cuda.Event(external=True) recorded during
    capture) before each group of kernels and after the last, then one marker kernel. ``types``:
    a label per group; ``counts``: kernels per group, the marker's 1 last (empty: all groups alike,
    counted from the records)."""

    def __init__(self, name, graph, exec_handle, inner, types, counts, keep, sizes=None, kinds=None):
        self.name, self.g, self.exec_handle, self.inner = name, graph, exec_handle, inner
        self.types, self.counts, self._keep = list(types), list(counts), keep
        self.sizes, self.kinds = sizes, kinds
        self.graph_id = -1

    def replay(self) -> None:
        self.g.replay()

    def inner_ms(self) -> np.ndarray:
        """Elapsed time of each in-graph event from the first (ms); after a synchronize."""
        e0 = self.inner[0]
        return np.array([0.0] + [e0.elapsed_time(e) for e in self.inner[1:]])


def _capture(body, upload: bool = True):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    h = int(g.raw_cuda_graph_exec())
    if upload:  # as decode_server's "uploaded" graphs: cuGraphUpload right after capture
        lib = ctypes.CDLL("libcuda.so.1")
        rc = lib.cuGraphUpload(ctypes.c_void_p(h), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc:
            raise RuntimeError(f"cuGraphUpload: CUresult {rc}")
    torch.cuda.synchronize()
    return g, h


def chain_layout(sizes=(2, 8, 32), kinds=("add", "sleep"), repeats: int = 3) -> list[tuple[str, int]]:
    """Groups of a one-stream chain: every (kind, size) ``repeats`` times, sizes interleaved so
    that no size sits only at the start or the end of the graph."""
    return [(k, n) for _ in range(repeats) for n in sizes for k in kinds]


def chain_graph(layout, name: str = "chain") -> EventedGraph:
    """One stream: groups of tiny ``add_`` kernels (1024 floats) or fixed-length sleep kernels."""
    import torch

    x = torch.zeros(1024, device="cuda")
    inner = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(len(layout) + 1)]

    def body():
        cap = torch.cuda.is_current_stream_capturing()  # events only in the graph, not in the warm-up
        for ev, (kind, n) in zip(inner, layout):
            if cap:
                ev.record()
            for _ in range(n):
                if kind == "add":
                    x.add_(1.0)
                else:
                    torch.cuda._sleep(SLEEP_CYCLES)
        if cap:
            inner[-1].record()
        x.add_(1.0)  # the marker: its start closes the last group's window in CUPTI's records

    g, h = _capture(body)
    types = [f"{k}x{n}" for k, n in layout]
    return EventedGraph(name, g, h, inner, types, [n for _, n in layout] + [1], (x,),
                        sizes=[n for _, n in layout], kinds=[k for k, _ in layout])


def decode_graph(layers: int = 48, name: str = "decode") -> EventedGraph:
    """decode_server's graph (graphmon.gpu.workloads.DecodeModel, side="mixed", 4 streams) with an
    event-record node on the main stream before each layer. The layer body is DecodeModel.step's,
    repeated here because step() has no hook between layers; the GPU run checks that the kernel
    count per replay matches DecodeModel's own graph."""
    import torch

    from graphmon.gpu.workloads import DecodeModel

    m = DecodeModel(layers=layers)
    x0 = m.input(1)
    inner = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(layers + 1)]
    q = m.hidden // 4
    marker = torch.zeros(16, device="cuda")

    def step(x):
        main = torch.cuda.current_stream()
        cap = torch.cuda.is_current_stream_capturing()  # events only in the graph, not in the warm-up
        for i in range(m.layers):
            if cap:
                inner[i].record(main)
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            outs = []
            for j, s in enumerate(m.side[:3] if m.side_kind == "mixed" else m.side):
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    outs.append(m._side_op(i, j, h))
            for s in m.side:
                main.wait_stream(s)
            y = h @ m.W[i]
            for o in outs:
                y[:, :q] += o
            x = x + y * 0.1
        if cap:
            inner[-1].record(main)
        marker.add_(1.0)
        return x

    g, h = _capture(lambda: step(x0))
    eg = EventedGraph(name, g, h, inner, ["layer"] * layers, [], (m, x0, marker))
    eg.model = m
    return eg


def plain_decode_graph(model) -> tuple:
    """DecodeModel's own graph of the same weights (for the kernel-count check)."""
    x = model.input(1)
    g, h = _capture(lambda: model.step(x))
    return g, h, x


# ---------------------------------------------------------------------- replay loops
def synced_replays(graph: EventedGraph, n: int, with_inner: bool = True) -> dict:
    """n replays, each with outer events around the launch and a synchronize after it (a decode
    step that waits for its token): outer GPU time (us), host time of the launch call (us),
    the in-graph events (ms from the first), and the step's wall time (us)."""
    import torch

    st = torch.cuda.current_stream()
    e0 = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    e1 = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    launch, step, inner, outer = np.empty(n), np.empty(n), [], np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        e0[i].record(st)
        graph.replay()
        t1 = time.perf_counter()
        e1[i].record(st)
        torch.cuda.synchronize()
        step[i], launch[i] = (time.perf_counter() - t0) * 1e6, (t1 - t0) * 1e6
        outer[i] = e0[i].elapsed_time(e1[i]) * 1e3
        if with_inner:
            inner.append(graph.inner_ms())
    return {"outer_us": outer, "launch_us": launch, "step_us": step,
            "inner_ms": np.array(inner) if with_inner else np.empty((0, 0))}


def queued_replays(replay, n: int) -> dict:
    """n replays back to back (events between them, one synchronize at the end): the GPU time of
    each replay with the GPU kept busy (us), and the host time of each launch call (us)."""
    import torch

    st = torch.cuda.current_stream()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    launch = np.empty(n)
    torch.cuda.synchronize()
    ev[0].record(st)
    for i in range(n):
        t0 = time.perf_counter()
        replay()
        launch[i] = (time.perf_counter() - t0) * 1e6
        ev[i + 1].record(st)
    torch.cuda.synchronize()
    return {"gpu_us": np.array([ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)]), "launch_us": launch}


def device_info() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    out = {"name": p.name, "torch": torch.__version__, "cuda": torch.version.cuda, "sm_clock_khz": 0}
    try:  # CU_DEVICE_ATTRIBUTE_CLOCK_RATE (13): the peak SM clock, kHz
        v = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDeviceGetAttribute(ctypes.byref(v), 13, 0) == 0:
            out["sm_clock_khz"] = int(v.value)
    except Exception:
        pass
    try:
        import importlib.metadata as md

        out["cupti_python"] = md.version("cupti-python")
    except Exception:
        pass
    return out


def run_stages(path: str, stages: list, table: dict, a, **meta) -> int:
    """A bench's stages in order on one raw CUPTI subscriber (``table[name](cupti, args)``), the
    JSON at ``path`` rewritten after each (Stages); exit status 1 when a stage failed."""
    st = Stages(path, {"argv": sys.argv[1:], "device": device_info(), **meta, "cupti": "raw cupti-python"})
    cu = Cupti()
    for s in stages:
        st.run(s, table[s], cu, a)
    cu.close()
    return 0 if not st.doc["errors"] else 1
