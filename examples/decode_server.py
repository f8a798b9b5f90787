"""A decode-like serving loop that replays CUDA graphs (torch), for trying graphmon on a GPU.

    python examples/decode_server.py --seconds 20                 # plain
    graphmon run -- python examples/decode_server.py --seconds 20 # attached, no code change
    python examples/decode_server.py --attach                     # attached from code

Per layer: an RMS norm and a bf16 matmul on the main stream, and three side streams (two small
matmuls + elementwise, one elementwise) joined back with stream waits. Graphs are captured per
batch size and made ready in one of three upload modes: ``uploaded`` (cuGraphUpload after
capture), ``lazy`` (nothing: the first launch uploads), ``instantiate_upload`` (instantiated by
this script with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD through the driver API).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch

H = 1024
FLAG_UPLOAD = 2  # CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD


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
    def __init__(self, layers: int = 48, side_streams: int = 3, seed: int = 0):
        torch.manual_seed(seed)
        dev = torch.device("cuda")
        self.layers = layers
        self.W = [torch.randn(H, H, device=dev, dtype=torch.bfloat16) / 32 for _ in range(layers)]
        self.E1 = [torch.randn(H, H // 4, device=dev, dtype=torch.bfloat16) / 32 for _ in range(layers)]
        self.E2 = [torch.randn(H, H // 4, device=dev, dtype=torch.bfloat16) / 32 for _ in range(layers)]
        self.side = [torch.cuda.Stream() for _ in range(side_streams)]

    def step(self, x):
        main = torch.cuda.current_stream()
        for i in range(self.layers):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            for s in self.side:
                s.wait_stream(main)
            outs = []
            if len(self.side) > 0:
                with torch.cuda.stream(self.side[0]):
                    outs.append(torch.relu(h @ self.E1[i]) * 0.5 + 0.1)
            if len(self.side) > 1:
                with torch.cuda.stream(self.side[1]):
                    outs.append(torch.sigmoid(h @ self.E2[i]) * 0.25)
            if len(self.side) > 2:
                with torch.cuda.stream(self.side[2]):
                    outs.append((h[:, : H // 4] * 2).tanh())
            for s in self.side:
                main.wait_stream(s)
            y = h @ self.W[i]
            for o in outs:
                y[:, : H // 4] += o
            x = x + y * 0.1
        return x


def chain_step(x, n: int = 1000):
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
    """Capture fn(xin) into a graph made ready in ``mode`` (uploaded | lazy | instantiate_upload)."""
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
                raise RuntimeError(f"cuGraphUpload failed: {rc}")
    torch.cuda.synchronize()
    return Replayable(name, g, mode, handle, (xin, out))


def build(model: DecodeModel, batch_sizes=(1,), modes=("uploaded",), label: bool = True) -> list[Replayable]:
    import graphmon

    graphs = []
    for bs in batch_sizes:
        for mode in modes:
            x = torch.randn(bs, H, device="cuda", dtype=torch.bfloat16)
            r = capture(f"decode_bs{bs}/{mode}", model.step, x, mode)
            if label:
                graphmon.label_graph(r.exec_handle, name=r.name, batch_size=bs)
            graphs.append(r)
    return graphs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to serve")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--batch-sizes", default="1,2", help="one graph per batch size and mode")
    ap.add_argument("--modes", default="uploaded,lazy,instantiate_upload")
    ap.add_argument("--attach", action="store_true", help="call graphmon.attach() from code")
    ap.add_argument("--port", type=int, default=9464)
    ap.add_argument("--sync-every", type=int, default=8,
                    help="synchronize every N steps (a step replays each graph once); larger = the CPU runs further ahead")
    args = ap.parse_args(argv)

    import graphmon

    if args.attach:
        graphmon.attach(port=args.port)
    model = DecodeModel(layers=args.layers)
    graphs = build(model, [int(b) for b in args.batch_sizes.split(",")], args.modes.split(","))
    t0 = time.monotonic()
    n = steps = 0
    while time.monotonic() - t0 < args.seconds:
        for r in graphs:  # a decode step per batch-size bucket, like a serving loop
            r.replay()
            n += 1
        steps += 1
        if steps % args.sync_every == 0:
            torch.cuda.synchronize()  # bound the queue as a server's per-step sync does
    torch.cuda.synchronize()
    from graphmon.host.attach import attached

    st = attached()
    info = ""
    if st is not None and st.exporter is not None:
        snap = st.exporter.snapshot()
        info = f" graphmon: port {st.exporter.bound_port}, windows {len(snap.windows)}, state {snap.health.state}"
    print(f"decode_server: {n} replays in {time.monotonic() - t0:.1f} s.{info}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
