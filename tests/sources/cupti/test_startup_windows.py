"""Windows that open during a host's start-up (torch.compile, graph capture: no graph launches
yet) must not leave the collector unable to collect once graphs replay (issue 12's lead:
attach-at-start + cold compile -> 14 windows, 0 records for the rest of the process).

The fake here models CUPTI asking for a buffer as soon as tracing is enabled and handing an
unused buffer back at a forced flush with no completion call reaching Python (no records to
deliver). The collector counted buffers in flight as requested - completed over the whole process,
so every such window leaked one; once ``max_buffers`` had leaked, every later window closed at
once as "buffers_full" and kept nothing, forever."""

import time

from graphmon.sources.cupti.collector import CuptiSource
from graphmon.sources.cupti.registry import GraphRegistry

from fake_cupti import ActivityKind, FakeCupti, FakeEvents, decode_like


class EagerBufferCupti(FakeCupti):
    def activity_enable(self, kind):
        super().activity_enable(kind)
        with self.lock:
            if kind == ActivityKind.CONCURRENT_KERNEL and self.buffer_room == 0:
                size, _ = self.req()  # asked for up front, before any record
                self.buffer_room = max(1, size // self.record_bytes)

    def _complete(self):
        if not self.pending:
            self.buffer_room = 0  # the unused buffer goes back without a completion call
            return
        super()._complete()


def test_startup_windows_without_launches_do_not_stop_collection():
    fake = EagerBufferCupti()
    windows = []
    src = CuptiSource(cupti=fake, events=FakeEvents(fake), registry=GraphRegistry(), window_launches=4,
                      window_duration_ms=1, interval_s=0.0, first_window_s=0.0, poll_s=0.001, drain_ms=0,
                      max_buffers=4)
    src.start(windows.append)
    try:
        t0 = time.monotonic()
        while len(windows) < 12 and time.monotonic() - t0 < 10:  # start-up: compile, no graph launched
            time.sleep(0.005)
        assert len(windows) >= 12 and all(len(w.trace) == 0 for w in windows)
        src.window_duration_ms = 200.0
        h = fake.instantiate(decode_like(2))  # the first graph, then the serving loop
        n0 = len(windows)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and not any(len(w.trace) for w in windows[n0:]):
            fake.launch(h, 7)
            time.sleep(0.0005)
        assert any(len(w.trace) for w in windows[n0:]), (
            f"no records after start-up; errors {src.health().errors}")
    finally:
        src.stop()
