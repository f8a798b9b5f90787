"""Decode-like CUDA-graph workloads (torch): the model of examples/decode_server.py and the two
arms of ``graphmon ab``. One of the two torch importers of graphmon (with gpu/ab_runner.py);
imported only by the example, ``graphmon ab`` and the GPU tests."""

from __future__ import annotations

import ctypes

import torch

H = 1024
FLAG_UPLOAD = 2  # CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD
UPLOAD_MODES = ("uploaded", "lazy", "instantiate_upload")


class InstantiateParams(ctypes.Structure):  # CUDA_GRAPH_INSTANTIATE_PARAMS
    _fields_ = [("flags", ctypes.c_uint64), ("hUploadStream", ctypes.c_void_p),
                ("hErrNode_out", ctypes.c_void_p), ("result_out", ctypes.c_int)]


_libcuda = None


def libcuda():
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    return _libcuda


class DecodeModel:
    """Per layer: an RMS norm and a bf16 matmul on the main stream, side streams forked from it and
    joined back with stream waits.

    ``side="mixed"`` (the example's): up to three side streams doing a small matmul + relu, a small
    matmul + sigmoid, and an elementwise tanh. ``side="matmul"`` (``graphmon ab``'s, 960 kernels on 4
    streams at the defaults): every side stream does a small matmul + relu.
    """

    def __init__(self, *, hidden: int = H, layers: int = 48, side_streams: int = 3, seed: int = 0,
                 side: str = "mixed", memcpy: bool = False, event_layers: tuple = (), extra_sleep_cycles: int = 0):
        if side not in ("mixed", "matmul"):
            raise ValueError(f"side must be 'mixed' or 'matmul', not {side!r}")
        dev = torch.device("cuda")
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.hidden, self.layers, self.side_kind = hidden, layers, side
        q = hidden // 4
        self.W = [self._randn(hidden, hidden) for _ in range(layers)]
        n_mat = side_streams if side == "matmul" else min(side_streams, 2)
        self.E = [[self._randn(hidden, q) for _ in range(n_mat)] for _ in range(layers)]
        self.side = [torch.cuda.Stream(device=dev) for _ in range(side_streams)]
        # memcpy: a tiny device-to-device copy (a memcpy node in the captured graph, no kernel) after
        # every kernel, on the kernel's stream (one scratch buffer per stream): bench/deploy/deploy_restart.py's
        # "new build" whose gaps widen on every stream while every kernel stays the same.
        self.memcpy = memcpy
        self._copy_src = torch.zeros(16, device=dev, dtype=torch.bfloat16)
        self._copy_dst = [torch.zeros(16, device=dev, dtype=torch.bfloat16) for _ in range(side_streams + 1)]
        # event_layers: an event-record node (an external event recorded during capture) on the main
        # stream after each of these layers, no kernel added; extra_sleep_cycles: one more kernel
        # (torch.cuda._sleep, one thread spinning that many SM cycles) at the end of each step.
        # bench/deploy/fleet.py's builds that are faster untraced yet wider traced, and ~1% slower.
        self.event_layers, self.extra_sleep_cycles = frozenset(event_layers), int(extra_sleep_cycles)
        self._events: list = []  # kept alive as long as a graph that records them

    def _randn(self, *shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=self.gen) / 32

    def input(self, batch: int):
        return torch.randn(batch, self.hidden, device="cuda", dtype=torch.bfloat16, generator=self.gen)

    def _k(self, t, stream: int = 0):
        """``t``, a kernel's output; with ``memcpy``, a copy node after that kernel on its stream."""
        if self.memcpy:
            self._copy_dst[stream].copy_(self._copy_src)
        return t

    def _side_op(self, i: int, j: int, h):
        def k(t):
            return self._k(t, j + 1)

        # the same kernels with memcpy off as relu(h @ E) * c and friends, one copy node after each
        if self.side_kind == "matmul":
            return k(k(torch.relu(k(h @ self.E[i][j]))) * (0.5 / (j + 1)))
        if j == 0:
            return k(k(k(torch.relu(k(h @ self.E[i][0]))) * 0.5) + 0.1)
        if j == 1:
            return k(k(torch.sigmoid(k(h @ self.E[i][1]))) * 0.25)
        return k(k(h[:, : self.hidden // 4] * 2).tanh())

    def step(self, x):
        main = torch.cuda.current_stream()
        q = self.hidden // 4
        k = self._k
        for i in range(self.layers):
            # x * rsqrt(mean(x^2) + eps): pow, mean, add, rsqrt, mul
            h = k(x * k(torch.rsqrt(k(k(k(x.pow(2)).mean(-1, keepdim=True)) + 1e-6))))
            outs = []
            for j, s in enumerate(self.side[:3] if self.side_kind == "mixed" else self.side):
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    outs.append(self._side_op(i, j, h))
            for s in self.side:
                main.wait_stream(s)
            y = k(h @ self.W[i])
            for o in outs:
                y[:, :q] += o
                k(y)
            x = k(x + k(y * 0.1))
            if i in self.event_layers:
                self._events.append(torch.cuda.Event(external=True))
                self._events[-1].record(main)
        if self.extra_sleep_cycles:
            torch.cuda._sleep(self.extra_sleep_cycles)
        return x


def chain_step(x, n: int = 1000):
    """n dependent elementwise kernels on one stream."""
    for _ in range(n):
        x.add_(1.0)
    return x


class Replayable:
    """One captured graph instance: replay() launches it on the current stream."""

    def __init__(self, name: str, g: torch.cuda.CUDAGraph, mode: str, exec_handle: int, keep):
        self.name, self.g, self.mode, self.exec_handle, self._keep = name, g, mode, exec_handle, keep
        self.own_exec = mode == "instantiate_upload"

    def replay(self):
        if self.own_exec:
            rc = libcuda().cuGraphLaunch(ctypes.c_void_p(self.exec_handle),
                                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if rc:
                raise RuntimeError(f"cuGraphLaunch failed: {rc}")
        else:
            self.g.replay()


def capture(name: str, fn, xin, mode: str) -> Replayable:
    """Capture fn(xin) into a graph made ready in ``mode``: ``uploaded`` (cuGraphUpload after
    capture), ``lazy`` (nothing: the first launch uploads) or ``instantiate_upload`` (instantiated
    here with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD through the driver API)."""
    if mode not in UPLOAD_MODES:
        raise ValueError(f"mode must be one of {UPLOAD_MODES}, not {mode!r}")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(xin.clone())
    torch.cuda.current_stream().wait_stream(s)
    keep = mode == "instantiate_upload"
    g = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(xin)
    stream = torch.cuda.current_stream().cuda_stream
    if mode == "instantiate_upload":
        raw = int(g.raw_cuda_graph())
        ex = ctypes.c_void_p()
        p = InstantiateParams(flags=FLAG_UPLOAD, hUploadStream=stream)
        rc = libcuda().cuGraphInstantiateWithParams(ctypes.byref(ex), ctypes.c_void_p(raw), ctypes.byref(p))
        if rc or p.result_out:
            raise RuntimeError(f"cuGraphInstantiateWithParams failed: rc={rc} result={p.result_out}")
        handle = int(ex.value)
    else:
        handle = int(g.raw_cuda_graph_exec())
        if mode == "uploaded":
            rc = libcuda().cuGraphUpload(ctypes.c_void_p(handle), ctypes.c_void_p(stream))
            if rc:
                raise RuntimeError(f"cuGraphUpload failed: CUresult {rc}")
    torch.cuda.synchronize()
    return Replayable(name, g, mode, handle, (xin, out))  # the graph reads xin: keep it alive


def decode_like_arms(*, hidden: int = H, layers: int = 48, side_streams: int = 3, batch: int = 1, seed: int = 1):
    """``graphmon ab``'s workload in two arms: "uploaded" (cuGraphUpload right after capture) and
    "lazy" (not uploaded: the driver uploads on first launch). Returns {name: factory}; each call
    of a factory captures one fresh instance and returns a callable that replays it once."""
    model = DecodeModel(hidden=hidden, layers=layers, side_streams=side_streams, seed=seed, side="matmul")

    def factory(mode: str):
        return capture(f"decode/{mode}", model.step, model.input(batch), mode).replay

    return {"uploaded": lambda: factory("uploaded"), "lazy": lambda: factory("lazy")}
