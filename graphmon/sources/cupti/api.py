"""The only module of graphmon that touches CUPTI: cupti-python and libcupti through ctypes.

The collector talks to CUPTI through :class:`CuptiActivityApi`, a small protocol (the way
kineto hides CUPTI behind ``CuptiActivityApi&``); tests pass a fake of it. CUPTI calls back into
a :class:`CallbackHandler` (the collector) with plain integers: the adapter decodes cupti-python's
parameter structs, so the collector never sees a cupti-python object.

Activity records (issue 13): cupti-python 13.4 hands every record over as a Python object
(~1M records/s, 8-18 ms of GIL per window on the H200). So the buffer callbacks are registered
with the libcupti already loaded in this process through ctypes (cuptiActivityRegisterCallbacks;
cupti-python's own buffer callbacks are never registered: the last registration wins), from a
pool of buffers that lives as long as the process. The completion callback only queues the
buffer (ctypes callbacks take the GIL: keep them to a deque append); the collector thread views
each buffer as a numpy structured array (records.py) and gives it back to the pool. A buffer is
never freed: one CUPTI still owns (e.g. after another tool re-registered its callbacks) stays
valid memory for the life of the process, as do the ctypes callback objects.
"""

from __future__ import annotations

import ctypes
import os
import logging
from collections import deque
from typing import Any, NamedTuple, Optional, Protocol

import numpy as np

from graphmon.sources.cupti.libinfo import library_info, loaded_libcupti_paths

log = logging.getLogger("graphmon.cupti")

KIND_CONCURRENT_KERNEL = 10  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (KERNEL = 3 serializes kernels: never enabled)
FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: returns kernels still running with zero end times
CUPTI_SUCCESS = 0

# Byte offsets in CUDA_GRAPH_INSTANTIATE_PARAMS {cuuint64_t flags; CUstream hUploadStream; ...}.
_IP_FLAGS, _IP_UPLOAD_STREAM = 0, 8

# The driver API calls graphmon subscribes to, by kind (public: bench/overhead/cupti_idle_cost.py
# subscribes the same ones with cupti-python alone).
LAUNCH_APIS = ("cuGraphLaunch", "cuGraphLaunch_ptsz")
UPLOAD_APIS = ("cuGraphUpload", "cuGraphUpload_ptsz")
INSTANTIATE_APIS = ("cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
                    "cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz")
DESTROY_APIS = ("cuGraphExecDestroy",)


class RawBuffer(NamedTuple):
    """A completed activity buffer: its valid bytes (a view, no copy) and the key to give it back."""

    data: np.ndarray  # uint8, validSize bytes of CUPTI's records
    key: int  # the buffer's address; release_buffer(key) returns it to the pool


class CallbackHandler(Protocol):
    """What CUPTI's API callbacks tell the collector (host threads: must be short, never raise)."""

    def on_launch_enter(self, corr: int, exec_handle: int, ctx: int, stream: int) -> None: ...
    def on_launch_exit(self, corr: int) -> None: ...
    def on_upload(self, exec_handle: int, ctx: int, stream: int) -> None: ...
    def on_instantiate(self, exec_handle: int, ctx: int, flags: int, upload_stream: Optional[int]) -> None: ...
    def on_destroy(self, exec_handle: int) -> None: ...
    def count_error(self, stage: str) -> None: ...


class CuptiActivityApi(Protocol):
    """The CUPTI the collector uses. ``subscribe`` raises when another subscriber holds CUPTI."""

    def subscribe(self, handler: CallbackHandler) -> None: ...
    def unsubscribe(self) -> None: ...
    def set_launch_callbacks(self, on: bool) -> None: ...
    def set_kernel_activity(self, on: bool) -> None: ...
    def flush(self, forced: bool = False) -> None: ...
    def completed_buffer(self) -> Optional[RawBuffer]: ...
    def release_buffer(self, key: int) -> None: ...
    def free_buffers(self) -> int: ...
    def walk_records(self, data: np.ndarray) -> np.ndarray: ...
    def kernel_name(self, name_ptr: int) -> str: ...
    def dropped_records(self) -> int: ...
    def timestamp_ns(self) -> int: ...
    def graph_exec_id(self, exec_handle: int) -> int: ...
    def stream_id(self, ctx: int, stream: int) -> int: ...
    def info(self) -> dict[str, str]: ...


def cupti_api_version(lib_path: str) -> Optional[int]:
    """cuptiGetVersion of the library at ``lib_path`` (already loaded: dlopen returns it), or None."""
    try:
        v = ctypes.c_uint32(0)
        if ctypes.CDLL(lib_path).cuptiGetVersion(ctypes.byref(v)) == CUPTI_SUCCESS:
            return int(v.value)
    except Exception:
        pass  # not callable here: the path and wheel version still say which library it is
    return None


# ---------------------------------------------------------------------- the buffer pool
_REQUEST_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                               ctypes.POINTER(ctypes.c_size_t))
_COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_size_t)


class BufferPool:
    """Fixed activity buffers for CUPTI, and the two ctypes callbacks CUPTI calls.

    One per process (``buffer_pool()``): never freed, so that a buffer CUPTI still owns is
    always valid memory. ``free``/``done`` are deques: append and popleft are atomic under the
    GIL, so the callbacks (CUPTI's threads) and the collector share them without a lock."""

    def __init__(self, size_bytes: int, count: int) -> None:
        self.size_bytes = int(size_bytes) // 8 * 8
        self._arrays = [(ctypes.c_uint8 * self.size_bytes)() for _ in range(int(count))]  # 8-aligned (malloc)
        self._by_addr = {ctypes.addressof(a): a for a in self._arrays}
        self.free: deque[int] = deque(self._by_addr)
        self.done: deque[tuple[int, int]] = deque()
        self.refused = [0]  # requests with no free buffer (CUPTI then drops records and counts them)
        self.request_cb = _REQUEST_FN(self._on_request)  # kept alive with the pool: for the process's life
        self.complete_cb = _COMPLETE_FN(self._on_complete)
        ctypes.memset(self._arrays[0], 0, self.size_bytes)  # warm: the first buffer's pages exist before tracing

    def _on_request(self, pbuf, psize, pmax) -> None:
        try:
            addr = self.free.popleft()
        except IndexError:
            addr = 0
            self.refused[0] += 1
        pbuf[0] = addr or None
        psize[0] = self.size_bytes if addr else 0
        pmax[0] = 0

    def _on_complete(self, ctx, stream_id, buf, size, valid) -> None:
        self.done.append((buf or 0, valid))

    def owns(self, addr: int) -> bool:
        return addr in self._by_addr

    def view(self, addr: int, valid: int) -> np.ndarray:
        return np.frombuffer(self._by_addr[addr], np.uint8, count=min(int(valid), self.size_bytes))


_POOL: Optional[BufferPool] = None


def buffer_pool(size_bytes: int, count: int) -> BufferPool:
    """The process's buffer pool; the first call decides its size (later ones reuse it)."""
    global _POOL
    if _POOL is None:
        _POOL = BufferPool(size_bytes, count)
    elif (_POOL.size_bytes, len(_POOL._arrays)) != (int(size_bytes) // 8 * 8, int(count)):
        log.info("graphmon: CUPTI buffer pool already made (%d x %d bytes); kept", len(_POOL._arrays), _POOL.size_bytes)
    return _POOL


# ---------------------------------------------------------------------- the real adapter
class CuptiPythonApi:
    """cupti-python for subscription, callbacks and enabling; ctypes libcupti for buffers."""

    def __init__(self, buffer_size_bytes: int, max_buffers: int, cupti: Any = None) -> None:
        if cupti is None:
            from cupti import cupti  # lazy: graphmon imports without CUDA
        self.c = cupti
        paths = loaded_libcupti_paths()
        if not paths:
            self.c.get_timestamp()  # cupti-python may load libcupti on first use
            paths = loaded_libcupti_paths()
        if not paths:
            raise RuntimeError("cupti-python imported but no libcupti is mapped in this process")
        self.lib = ctypes.CDLL(paths[0])  # the copy cupti-python loaded: dlopen returns the same handle
        self.names_key = ("libcupti", paths[0])  # kernel-name pointers are this library's: shared by later attaches
        self.lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self._info = library_info(api_version=cupti_api_version)
        self.pool = buffer_pool(buffer_size_bytes, max_buffers)
        self._sub = None
        self._handler: Optional[CallbackHandler] = None
        ids = self.c.DriverApiTraceCbid
        self._dispatch: dict[int, Any] = {}
        for names, fn in ((LAUNCH_APIS, self._launch), (UPLOAD_APIS, self._upload),
                          (INSTANTIATE_APIS, self._instantiate), (DESTROY_APIS, self._destroy)):
            for name in names:
                cbid = getattr(ids, name, None)
                if cbid is not None:
                    self._dispatch[int(cbid)] = (name, fn)
        self._launch_cbids = [k for k, (n, _) in self._dispatch.items() if n in LAUNCH_APIS]

    # ------------------------------------------------------------------ subscription
    def subscribe(self, handler: CallbackHandler) -> None:
        c = self.c
        self._handler = handler
        self._sub = c.subscribe(self._callback, None)
        try:
            for cbid in self._dispatch:
                if cbid not in self._launch_cbids:
                    c.enable_callback(1, self._sub, c.CallbackDomain.DRIVER_API, cbid)
            rc = self.lib.cuptiActivityRegisterCallbacks(self.pool.request_cb, self.pool.complete_cb)
            if rc != CUPTI_SUCCESS:
                raise RuntimeError(f"cuptiActivityRegisterCallbacks returned {rc}")
        except Exception:
            self.unsubscribe()
            raise

    def unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            self.c.unsubscribe(sub)  # lets torch.profiler (Kineto) subscribe afterwards; never finalize()

    def set_launch_callbacks(self, on: bool) -> None:
        c = self.c
        for cbid in self._launch_cbids:
            c.enable_callback(1 if on else 0, self._sub, c.CallbackDomain.DRIVER_API, cbid)

    def set_kernel_activity(self, on: bool) -> None:
        (self.c.activity_enable if on else self.c.activity_disable)(self.c.ActivityKind.CONCURRENT_KERNEL)

    # ------------------------------------------------------------------ buffers
    def flush(self, forced: bool = False) -> None:
        rc = self.lib.cuptiActivityFlushAll(ctypes.c_uint32(FLUSH_FORCED if forced else 0))
        if rc != CUPTI_SUCCESS:
            raise RuntimeError(f"cuptiActivityFlushAll returned {rc}")

    def completed_buffer(self) -> Optional[RawBuffer]:
        while True:
            try:
                addr, valid = self.pool.done.popleft()
            except IndexError:
                return None
            if self.pool.owns(addr):
                return RawBuffer(self.pool.view(addr, valid), addr)
            # not ours (another tool's registration completing late): never touch it

    def release_buffer(self, key: int) -> None:
        if self.pool.owns(key):
            self.pool.free.append(key)

    def free_buffers(self) -> int:
        return len(self.pool.free)

    def walk_records(self, data: np.ndarray) -> np.ndarray:
        """Byte offsets of each record, as libcupti itself walks the buffer (the fallback path)."""
        base = data.ctypes.data
        rec = ctypes.c_void_p(None)
        out = []
        nxt = self.lib.cuptiActivityGetNextRecord
        while nxt(base, len(data), ctypes.byref(rec)) == CUPTI_SUCCESS and rec.value:
            out.append(rec.value - base)
        return np.asarray(out, np.int64)

    def kernel_name(self, name_ptr: int) -> str:
        return ctypes.string_at(name_ptr).decode("utf-8", "replace") if name_ptr else ""

    def dropped_records(self) -> int:
        n = ctypes.c_size_t(0)
        self.c.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        return int(n.value)

    def timestamp_ns(self) -> int:
        return int(self.c.get_timestamp())

    def graph_exec_id(self, exec_handle: int) -> int:
        return int(self.c.get_graph_exec_id(exec_handle))

    def stream_id(self, ctx: int, stream: int) -> int:
        return int(self.c.get_stream_id_ex(ctx, stream, 0))

    def info(self) -> dict[str, str]:
        return dict(self._info)

    # ------------------------------------------------------------------ API callbacks (host threads)
    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        h = self._handler
        try:
            d = self._dispatch.get(cbid)
            if d is not None and h is not None:
                d[1](d[0], cbdata, h)
        except Exception:
            if h is not None:
                h.count_error("callback")

    def _launch(self, name: str, cbdata, h: CallbackHandler) -> None:
        c = self.c
        if cbdata.callback_site != c.ApiCallbackSite.API_ENTER:
            h.on_launch_exit(cbdata.correlation_id)
            return
        if name == "cuGraphLaunch":
            p = c.CuGraphLaunchParams.from_ptr(cbdata.function_params, readonly=True)
            exec_handle = int(p.h_graph)  # named h_graph, holds the exec
        else:
            p = c.CuGraphLaunchPtszParams.from_ptr(cbdata.function_params, readonly=True)
            exec_handle = int(p.h_graph_exec)
        h.on_launch_enter(cbdata.correlation_id, exec_handle, int(cbdata.context or 0), int(p.h_stream or 0))

    def _upload(self, name: str, cbdata, h: CallbackHandler) -> None:
        c = self.c
        if cbdata.callback_site != c.ApiCallbackSite.API_ENTER:
            return
        if name == "cuGraphUpload":
            p = c.CuGraphUploadParams.from_ptr(cbdata.function_params, readonly=True)
            exec_handle = int(p.h_graph)
        else:
            p = c.CuGraphUploadPtszParams.from_ptr(cbdata.function_params, readonly=True)
            exec_handle = int(p.h_graph_exec)
        h.on_upload(exec_handle, int(cbdata.context or 0), int(p.h_stream or 0))

    def _instantiate(self, name: str, cbdata, h: CallbackHandler) -> None:
        c = self.c
        if cbdata.callback_site != c.ApiCallbackSite.API_EXIT:
            return
        rv = int(cbdata.function_return_value or 0)  # a pointer to the CUresult, not the value
        if rv and ctypes.c_int.from_address(rv).value != 0:
            return  # instantiation failed: no exec
        flags, upload_stream = 0, None
        if name in ("cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"):
            cls = c.CuGraphInstantiateWithParamsParams if name.endswith("Params") else c.CuGraphInstantiateWithParamsPtszParams
            p = cls.from_ptr(cbdata.function_params, readonly=True)
            ip = int(p.instantiate_params or 0)
            if ip:
                flags = ctypes.c_uint64.from_address(ip + _IP_FLAGS).value
                upload_stream = int(ctypes.c_void_p.from_address(ip + _IP_UPLOAD_STREAM).value or 0)
        elif name == "cuGraphInstantiateWithFlags":
            p = c.CuGraphInstantiateWithFlagsParams.from_ptr(cbdata.function_params, readonly=True)
            flags = int(p.flags_)
        elif name == "cuGraphInstantiate_v2":
            p = c.CuGraphInstantiateV2Params.from_ptr(cbdata.function_params, readonly=True)
        else:
            p = c.CuGraphInstantiateParams.from_ptr(cbdata.function_params, readonly=True)
        ph = int(p.ph_graph_exec or 0)
        if ph:
            h.on_instantiate(ctypes.c_uint64.from_address(ph).value, int(cbdata.context or 0), int(flags), upload_stream)

    def _destroy(self, name: str, cbdata, h: CallbackHandler) -> None:
        c = self.c
        if cbdata.callback_site == c.ApiCallbackSite.API_ENTER:
            p = c.CuGraphExecDestroyParams.from_ptr(cbdata.function_params, readonly=True)
            h.on_destroy(int(p.h_graph_exec))


API_ENV = "GRAPHMON_CUPTI_API"  # "module:attr" of a CuptiActivityApi to use instead of CUPTI (tests, simulators)


def load_api(buffer_size_bytes: int, max_buffers: int) -> CuptiActivityApi:
    # The seam lets process-tree tests run the real hook, agent and collector in child processes
    # against a simulated GPU: nothing but this one name is read from the variable.
    seam = os.environ.get(API_ENV, "")
    if seam:
        import importlib

        module, _, attr = seam.partition(":")
        return getattr(importlib.import_module(module), attr or "api")
    return CuptiPythonApi(buffer_size_bytes, max_buffers)
