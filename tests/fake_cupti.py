"""A fake of the parts of cupti-python that graphmon's CUPTI source uses, plus a tiny simulated
GPU, so that the source's logic (callbacks, windows, buffers, graph identity, observer timing)
runs on a CPU with exactly known kernel timestamps.

The simulated GPU runs a graph as a chain of kernels per stream: each kernel has a duration
and a gap before it; while CONCURRENT_KERNEL tracing is on, durations and gaps are multiplied
by ``trace_slowdown`` (the observer effect). Event timestamps follow the same clock.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace


class ActivityKind:
    KERNEL = 3
    CONCURRENT_KERNEL = 10
    GRAPH_TRACE = 50


class CallbackDomain:
    DRIVER_API = 1
    RUNTIME_API = 2


class ApiCallbackSite:
    API_ENTER = 0
    API_EXIT = 1


class DriverApiTraceCbid:
    cuGraphLaunch = 514
    cuGraphLaunch_ptsz = 515
    cuGraphUpload = 600
    cuGraphUpload_ptsz = 601
    cuGraphInstantiate = 610
    cuGraphInstantiate_v2 = 611
    cuGraphInstantiateWithFlags = 612
    cuGraphInstantiateWithParams = 613
    cuGraphInstantiateWithParams_ptsz = 614
    cuGraphExecDestroy = 620


class CuptiError(RuntimeError):
    pass


_objects: dict[int, object] = {}
_ptrs = itertools.count(0x1000, 0x10)


def _params(**fields) -> int:
    ptr = next(_ptrs)
    _objects[ptr] = SimpleNamespace(**fields)
    return ptr


class _Params:
    @staticmethod
    def from_ptr(ptr, readonly=False, owner=None):
        return _objects[ptr]


CuGraphLaunchParams = CuGraphLaunchPtszParams = CuGraphUploadParams = CuGraphUploadPtszParams = _Params
CuGraphInstantiateParams = CuGraphInstantiateV2Params = CuGraphInstantiateWithFlagsParams = _Params
CuGraphInstantiateWithParamsParams = CuGraphInstantiateWithParamsPtszParams = CuGraphExecDestroyParams = _Params


class InstantiateParams(ctypes.Structure):
    """CUDA_GRAPH_INSTANTIATE_PARAMS layout."""

    _fields_ = [("flags", ctypes.c_uint64), ("hUploadStream", ctypes.c_void_p), ("hErrNode_out", ctypes.c_void_p), ("result_out", ctypes.c_int)]


@dataclass
class Kernel:
    stream: int  # CUPTI stream id the kernel runs on
    duration_ns: int
    gap_ns: int  # idle time on its stream before it starts
    name: str = "k"


class FakeCupti:
    """Module-like object: pass it as ``CuptiSource(cupti=fake)``."""

    ActivityKind = ActivityKind
    CallbackDomain = CallbackDomain
    ApiCallbackSite = ApiCallbackSite
    DriverApiTraceCbid = DriverApiTraceCbid
    CuGraphLaunchParams = CuGraphLaunchParams
    CuGraphLaunchPtszParams = CuGraphLaunchPtszParams
    CuGraphUploadParams = CuGraphUploadParams
    CuGraphUploadPtszParams = CuGraphUploadPtszParams
    CuGraphInstantiateParams = CuGraphInstantiateParams
    CuGraphInstantiateV2Params = CuGraphInstantiateV2Params
    CuGraphInstantiateWithFlagsParams = CuGraphInstantiateWithFlagsParams
    CuGraphInstantiateWithParamsParams = CuGraphInstantiateWithParamsParams
    CuGraphInstantiateWithParamsPtszParams = CuGraphInstantiateWithParamsPtszParams
    CuGraphExecDestroyParams = CuGraphExecDestroyParams

    def __init__(self, trace_slowdown: float = 1.0, records_per_buffer: int = 4096, record_bytes: int = 256) -> None:
        self.lock = threading.RLock()
        self.trace_slowdown = trace_slowdown
        self.records_per_buffer = records_per_buffer
        self.record_bytes = record_bytes
        self.subscriber = None  # (handle, callback)
        self.blocked_by_other = False
        self.enabled: set[tuple[int, int]] = set()  # (domain, cbid)
        self.activity: set[int] = set()
        self.req = self.done = None
        self.pending: list = []
        self.buffer_room = 0
        self.dropped = 0
        self.finalize_calls = 0
        self.corr = itertools.count(1)
        self.execs: dict[int, list[Kernel]] = {}
        self.exec_ids: dict[int, int] = {}
        self.handles = itertools.count(0x7F0000001000, 0x1000)
        self.graph_ids = itertools.count(1)
        self.clock_ns = 1_000_000_000  # GPU time; all streams advance together (one graph at a time)
        self.ts = itertools.count(5_000_000_000, 1000)
        self.callback_calls = 0
        self.launches = 0

    # ---------------------------------------------------------------- CUPTI API
    def subscribe(self, cb, userdata):
        with self.lock:
            if self.blocked_by_other or self.subscriber is not None:
                raise CuptiError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
            self.subscriber = (id(cb), cb)
            return id(cb)

    def unsubscribe(self, sub):
        with self.lock:
            if self.subscriber is None or self.subscriber[0] != sub:
                raise CuptiError("CUPTI_ERROR_INVALID_PARAMETER")
            self.subscriber = None
            self.enabled.clear()

    def enable_callback(self, enable, sub, domain, cbid):
        with self.lock:
            if self.subscriber is None or self.subscriber[0] != sub:
                raise CuptiError("CUPTI_ERROR_INVALID_PARAMETER")
            (self.enabled.add if enable else self.enabled.discard)((domain, int(cbid)))

    def activity_register_callbacks(self, req, done):
        self.req, self.done = req, done

    def activity_enable(self, kind):
        if kind == ActivityKind.KERNEL:
            raise AssertionError("graphmon must never enable KERNEL (it serializes kernels)")
        with self.lock:  # a launch is wholly inside or outside tracing
            self.activity.add(kind)

    def activity_disable(self, kind):
        with self.lock:
            self.activity.discard(kind)

    def activity_flush_all(self, flag):
        with self.lock:
            self._complete()

    def activity_get_num_dropped_records(self, ctx, stream, addr):
        ctypes.c_size_t.from_address(addr).value = self.dropped

    def get_timestamp(self):
        return next(self.ts)

    def get_graph_exec_id(self, h):
        return self.exec_ids[h]

    def get_stream_id_ex(self, ctx, stream, per_thread):
        return int(stream)  # identity: tests launch on "handles" equal to CUPTI stream ids

    def finalize(self):
        self.finalize_calls += 1
        raise AssertionError("graphmon must never call cupti.finalize()")

    # ---------------------------------------------------------------- buffers
    def _record(self, rec):
        if self.buffer_room == 0:
            size, _ = self.req()
            if size <= 0:
                self.dropped += 1
                return
            self.buffer_room = max(1, size // self.record_bytes)
        self.pending.append(rec)
        self.buffer_room -= 1
        if self.buffer_room == 0 or len(self.pending) >= self.records_per_buffer:
            self._complete()

    def _complete(self):
        if self.pending and self.done is not None:
            batch, self.pending = self.pending, []
            self.buffer_room = 0
            self.done(batch)

    # ---------------------------------------------------------------- simulated host API calls
    def _callback(self, cbid, site, corr, params, ret=0):
        sub = self.subscriber
        if sub is None or (CallbackDomain.DRIVER_API, cbid) not in self.enabled:
            return
        self.callback_calls += 1
        rv = ctypes.c_int(ret)  # CUPTI gives a pointer to the return value at API exit
        data = SimpleNamespace(
            callback_site=site, correlation_id=corr, function_params=params,
            function_return_value=ctypes.addressof(rv) if site == ApiCallbackSite.API_EXIT else 0, context=0xC0,
        )
        sub[1](None, CallbackDomain.DRIVER_API, cbid, data)

    def _api(self, cbid, params, body=None, ret=0):
        corr = next(self.corr)
        self._callback(cbid, ApiCallbackSite.API_ENTER, corr, params)
        out = body(corr) if body else None
        self._callback(cbid, ApiCallbackSite.API_EXIT, corr, params, ret)
        return out

    def instantiate(self, kernels: list[Kernel], flags: int = 0, upload_stream: int = 0, api: str = "WithFlags", fail: bool = False) -> int:
        h = next(self.handles)
        slot = ctypes.c_uint64(0)
        with self.lock:
            if api == "WithParams":
                ip = InstantiateParams(flags=flags, hUploadStream=upload_stream or None)
                params = _params(ph_graph_exec=ctypes.addressof(slot), h_graph=1, instantiate_params=ctypes.addressof(ip))
                cbid = DriverApiTraceCbid.cuGraphInstantiateWithParams
            else:
                ip = None
                params = _params(ph_graph_exec=ctypes.addressof(slot), h_graph=1, flags_=flags)
                cbid = DriverApiTraceCbid.cuGraphInstantiateWithFlags

            def body(corr):
                if not fail:
                    slot.value = h
                    self.execs[h] = list(kernels)
                    self.exec_ids[h] = next(self.graph_ids)

            self._api(cbid, params, body, ret=1 if fail else 0)
            del ip
        return h

    def upload(self, h: int, stream: int, ptsz: bool = False):
        with self.lock:
            if ptsz:
                p = _params(h_graph_exec=h, h_stream=stream)
                self._api(DriverApiTraceCbid.cuGraphUpload_ptsz, p)
            else:
                p = _params(h_graph=h, h_stream=stream)
                self._api(DriverApiTraceCbid.cuGraphUpload, p)

    def destroy(self, h: int):
        with self.lock:
            self._api(DriverApiTraceCbid.cuGraphExecDestroy, _params(h_graph_exec=h))
            self.execs.pop(h, None)

    def launch(self, h: int, stream: int, ptsz: bool = False, block_s: float = 0.0) -> int:
        """Launch; returns the correlation id. Kernels run now on the simulated GPU.

        ``block_s``: the API call blocks that long between its enter and exit callbacks, as
        cuGraphLaunch does while the GPU's queue is full; the graph runs at the end of it."""
        p = _params(h_graph_exec=h, h_stream=stream) if ptsz else _params(h_graph=h, h_stream=stream)
        cbid = DriverApiTraceCbid.cuGraphLaunch_ptsz if ptsz else DriverApiTraceCbid.cuGraphLaunch
        if block_s <= 0:
            with self.lock:
                self.launches += 1
                return self._api(cbid, p, lambda corr: (self._run_graph(h, corr), corr)[1])
        corr = next(self.corr)
        with self.lock:
            self.launches += 1
            self._callback(cbid, ApiCallbackSite.API_ENTER, corr, p)
        time.sleep(block_s)
        with self.lock:
            self._run_graph(h, corr)
            self._callback(cbid, ApiCallbackSite.API_EXIT, corr, p)
        return corr

    def _run_graph(self, h, corr):
        kernels = self.execs[h]
        tracing = ActivityKind.CONCURRENT_KERNEL in self.activity
        f = self.trace_slowdown if tracing else 1.0
        t_stream: dict[int, int] = {}
        base = self.clock_ns
        end_all = base
        for i, k in enumerate(kernels):
            t = t_stream.get(k.stream, base) + int(k.gap_ns * f)
            e = t + int(k.duration_ns * f)
            t_stream[k.stream] = e
            end_all = max(end_all, e)
            if tracing:
                self._record(
                    SimpleNamespace(
                        kind=ActivityKind.CONCURRENT_KERNEL, start=t, end=e, stream_id=k.stream, device_id=0,
                        graph_id=self.exec_ids[h], graph_node_id=i + 1, correlation_id=corr, name=k.name,
                    )
                )
        self.clock_ns = end_all


class FakeEvents:
    """Event timing on the fake GPU clock (stands in for graphmon.sources.cupti.collector.CudaEvents)."""

    def __init__(self, gpu: FakeCupti, capturing: set[int] | None = None) -> None:
        self.gpu = gpu
        self.times: dict[int, int] = {}
        self.ids = itertools.count(1)
        self.capturing = capturing or set()
        self.created = 0
        self.destroyed = 0

    def create(self) -> int:
        self.created += 1
        return next(self.ids)

    def destroy(self, ev):
        self.destroyed += 1

    def is_capturing(self, stream):
        return stream in self.capturing

    def record(self, ev, stream):
        self.times[ev] = self.gpu.clock_ns
        return True

    def elapsed_ms(self, ctx, e0, e1):
        return (self.times[e1] - self.times[e0]) / 1e6


def decode_like(n_layers: int = 4, main: int = 7, side: int = 8) -> list[Kernel]:
    """A small two-stream graph with distinct, known gaps."""
    ks = []
    for i in range(n_layers):
        ks.append(Kernel(main, 3000, 400, f"norm{i}"))
        ks.append(Kernel(side, 1500, 600, f"side{i}"))
        ks.append(Kernel(main, 5000, 416, f"matmul{i}"))
    return ks
