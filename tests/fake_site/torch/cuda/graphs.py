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
        extra = int(os.environ.get("FAKE_EXTRA_GAP_NS") or 0)  # another build: every gap wider by this
        last = int(os.environ.get("FAKE_EXTRA_GAP_LAST_NS") or 0)  # ... or only the last kernel's (concentrated)
        ks = decode_like(2)
        self.h = gpu.instantiate([dataclasses.replace(k, gap_ns=k.gap_ns + extra + (last if i == len(ks) - 1 else 0))
                                  for i, k in enumerate(ks)])

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
