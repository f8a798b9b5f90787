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
import time

import torch

# The model and the capture in the three upload modes live in graphmon (shared with graphmon ab).
from graphmon.gpu.workloads import DecodeModel, Replayable, capture, chain_step  # noqa: F401  (bench/ uses chain_step)


def build(model: DecodeModel, batch_sizes=(1,), modes=("uploaded",), label: bool = True) -> list[Replayable]:
    import graphmon

    graphs = []
    for bs in batch_sizes:
        for mode in modes:
            x = model.input(bs)
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
    ap.add_argument("--memcpy", action="store_true",
                    help="a tiny device-to-device copy node after every kernel (a 'new build': same kernels, wider gaps)")
    ap.add_argument("--port", type=int, default=9479)
    ap.add_argument("--sync-every", type=int, default=8,
                    help="synchronize every N steps (a step replays each graph once); larger = the CPU runs further ahead")
    args = ap.parse_args(argv)

    import graphmon

    if args.attach:
        graphmon.attach(port=args.port)
    model = DecodeModel(layers=args.layers, memcpy=args.memcpy)
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
