"""Fake torch.cuda.graphs: capture instantiates a graph on the fake CUPTI GPU, replay launches it.

Like torch, cupti is not touched at import: only capture_end/replay reach the (fake) driver."""


class CUDAGraph:
    def __init__(self):
        self.h = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.capturing = True

    def capture_end(self):
        import dataclasses
        import os

        from cupti import cupti as gpu
        from fake_cupti import decode_like

        self.capturing = False
        env = {k: int(os.environ.get(f"FAKE_{k}") or 0) for k in ("EXTRA_GAP_NS", "EXTRA_GAP_LAST_NS",
                                                                    "TRACED_EXTRA_GAP_NS", "EXTRA_KERNEL_NS", "LAYERS")}
        # another build: every gap wider by EXTRA_GAP_NS (narrower if < 0), or only the last kernel's
        # (EXTRA_GAP_LAST_NS: concentrated); every gap wider only while traced (TRACED_EXTRA_GAP_NS:
        # the observer's cost alone); one more kernel of EXTRA_KERNEL_NS at the end of the main
        # stream, right after the last (no gap). LAYERS: decode_like's layers (default 2).
        ks = decode_like(env["LAYERS"] or 2)
        ks = [dataclasses.replace(k, gap_ns=k.gap_ns + env["EXTRA_GAP_NS"] + (env["EXTRA_GAP_LAST_NS"] if i == len(ks) - 1 else 0),
                                  traced_gap_ns=env["TRACED_EXTRA_GAP_NS"]) for i, k in enumerate(ks)]
        if env["EXTRA_KERNEL_NS"]:
            ks.append(dataclasses.replace(ks[-1], duration_ns=env["EXTRA_KERNEL_NS"], gap_ns=0, traced_gap_ns=0, name="extra"))
        self.h = gpu.instantiate(ks)

    def replay(self):
        from cupti import cupti as gpu

        gpu.launch(self.h, 7)


class graph:
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph

    def __enter__(self):
        self.cuda_graph.capture_begin()

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
