"""A fake of graphmon's small CUPTI protocol (graphmon.sources.cupti.api.CuptiActivityApi) plus a
tiny simulated GPU, so that the collector's logic (callbacks, windows, buffers, graph identity,
observer timing) runs on a CPU with exactly known kernel timestamps.

Kernel records are written into raw activity buffers in the real CUpti_ActivityKernel13 layout
(248 bytes; 216 for Kernel10) with struct.pack_into at the offsets of cupti_activity.h, written
here independently of graphmon's decoder, so the collector's buffer path runs end to end.

The simulated GPU runs a graph as a chain of kernels per stream: each kernel has a duration
and a gap before it; while CONCURRENT_KERNEL tracing is on, durations and gaps are multiplied
by ``trace_slowdown`` (the observer effect). Event timestamps follow the same clock.

A GPU queue (``gpu_replay_s`` > 0 or ``backlog()``): a launch then finishes on the host's
monotonic clock only when the GPU has run everything queued before it. Its records stay
*incomplete* until then, with CUPTI's flush semantics (cuptiActivityFlushAll): a non-forced
flush returns every buffer whose records are all complete, full or not, and holds back a
buffer with one incomplete record; a forced flush returns every buffer, the incomplete records
with zero end times. FakeEvents.query answers from the same queue.
"""

from __future__ import annotations

import itertools
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from graphmon.sources.cupti.api import RawBuffer

KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KERNEL13_BYTES = 248  # CUpti_ActivityKernel13 (CUPTI 13.4)
KERNEL10_BYTES = 216  # CUpti_ActivityKernel10 (CUPTI 13.0)


class CuptiError(RuntimeError):
    pass


def pack_kernel(buf, off: int, *, kind=KIND_CONCURRENT_KERNEL, start=0, end=0, device=0, stream=0, corr=0,
                name_ptr=0, graph_node_id=0, graph_id=0, context=1) -> None:
    """One CUpti_ActivityKernel record at ``off`` (fields at cupti_activity.h's offsets)."""
    struct.pack_into("<I", buf, off + 0, kind)
    struct.pack_into("<QQQ", buf, off + 16, start, end, end)  # start, end, completed
    struct.pack_into("<III", buf, off + 40, device, context, stream)  # deviceId, contextId, streamId
    struct.pack_into("<iiiiii", buf, off + 52, 1, 1, 1, 128, 1, 1)  # grid, block
    struct.pack_into("<Iq", buf, off + 92, corr, 0)  # correlationId, gridId (int64 at 96)
    struct.pack_into("<Q", buf, off + 104, name_ptr)
    struct.pack_into("<Q", buf, off + 144, graph_node_id)
    struct.pack_into("<I", buf, off + 156, graph_id)


@dataclass
class Kernel:
    stream: int  # CUPTI stream id the kernel runs on
    duration_ns: int
    gap_ns: int  # idle time on its stream before it starts
    name: str = "k"
    # idle time added before it only while kernel tracing is on: a cost of the observer alone
    # (an event-record node that tracing serialises), absent from an untraced replay
    traced_gap_ns: int = 0


class FakeCupti:
    """Implements CuptiActivityApi: pass it as ``CuptiSource(cupti=fake)``."""

    def __init__(self, trace_slowdown: float = 1.0, record_bytes: int = KERNEL13_BYTES, buffer_bytes: int = 1 << 16,
                 max_buffers: int = 32) -> None:
        self.lock = threading.RLock()
        self.trace_slowdown = trace_slowdown
        self.record_bytes = record_bytes
        self.sizes = {KIND_CONCURRENT_KERNEL: record_bytes, KIND_KERNEL: record_bytes}  # what the walker knows
        self.handler = None
        self.blocked_by_other = False
        self.launch_callbacks = False
        self.activity = False
        self.buffer_bytes = buffer_bytes
        self._buffers = [np.zeros(buffer_bytes, np.uint8) for _ in range(max_buffers)]
        self.free = list(range(max_buffers))
        self.done: list[tuple[int, int]] = []
        self.cur = -1  # buffer being filled
        self.fill = 0
        self.dropped = 0
        self.flushes: list[bool] = []  # forced flag of every flush
        self.corr = itertools.count(1)
        # A model of what the H200 showed (tests/gpu/test_live_cupti.py), not CUPTI's documented
        # behaviour: once a launch's exit callback is lost (the launch callbacks switched off
        # between its enter and exit), every later launch gets that launch's correlation id.
        self.stick_on_lost_exit = False
        self.stuck_corr: int | None = None
        self.execs: dict[int, list[Kernel]] = {}
        self.exec_ids: dict[int, int] = {}
        self.handles = itertools.count(0x7F0000001000, 0x1000)
        self.graph_ids = itertools.count(1)
        self.name_ptrs: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.clock_ns = 1_000_000_000  # GPU time; all streams advance together (one graph at a time)
        self.ts = itertools.count(5_000_000_000, 1000)
        self.callback_calls = 0
        self.launches = 0
        self.launch_callback_calls = 0  # on_launch_enter calls made (Python work on the host's launch path)
        self.gpu_replay_s = 0.0  # GPU time per launch (0: no queue, a launch runs at once)
        self.busy_until = 0.0  # monotonic time the GPU's queue drains
        self.cur_pending: list[tuple[int, float]] = []  # (offset, ready time) of incomplete records in cur
        self.held: list[tuple[int, int, list]] = []  # closed buffers with incomplete records: (idx, fill, pending)
        # A model of a mis-timed record (issue 29, HF generate on the H200: one replay per window
        # with span = busy = 2.1 ms against a median of 0.88 ms, a gap of -2.09 ms on one stream):
        # the first kernel of the first replay traced after each enable ends this much later.
        self.first_traced_end_extra_ns = 0
        self._stretch_next = False
        # What bench/results/gpu-check-10 showed on the H200 instead: a forced flush returns records
        # of kernels that had long run (their CUDA events said so) with the flush's time as end,
        # not 0, when CUPTI had not taken them in yet. > 0: a forced flush stamps every record it
        # returns whose kernel ran with end = (the GPU clock now) + this; timestamp_ns() then
        # reads the GPU clock, as CUPTI's timestamps share the kernels' clock.
        self.forced_flush_stamps_ns = 0
        self._taken: set[tuple[int, int]] = set()  # (buffer, offset) of records a non-forced flush took in
        # What the H200 showed with tracing switched from the collector thread (close=disable_first,
        # bench/results/gpu-overhead.md): a launch the host was inside when tracing went off came
        # back with 132 of its 320 kernels. > 0: a launch takes this long between its enter and
        # exit callbacks, kernel by kernel, and each kernel is traced or not as tracing is at its
        # own moment (a switch from another thread can land inside the launch).
        self.launch_spread_s = 0.0

    # ---------------------------------------------------------------- CuptiActivityApi
    def subscribe(self, handler):
        with self.lock:
            if self.blocked_by_other or self.handler is not None:
                raise CuptiError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
            self.handler = handler

    def unsubscribe(self):
        with self.lock:
            if self.handler is None:
                raise CuptiError("CUPTI_ERROR_INVALID_PARAMETER")
            self.handler = None
            self.launch_callbacks = False

    def set_launch_callbacks(self, on):
        if self.handler is None:
            raise CuptiError("CUPTI_ERROR_INVALID_PARAMETER")
        self.launch_callbacks = bool(on)

    def set_kernel_activity(self, on):
        with self.lock:  # a launch is wholly inside or outside tracing
            self._stretch_next = bool(on) and not self.activity and self.first_traced_end_extra_ns > 0
            self.activity = bool(on)

    def flush(self, forced=False):
        with self.lock:
            self.flushes.append(bool(forced))
            if self.forced_flush_stamps_ns:
                self._stamp(take_in=not forced)
            self._complete()
            if forced:  # every buffer, incomplete records with zero end times
                for i, _fill, pending in self.held:
                    for off, ready in pending:
                        if ready > time.monotonic():
                            struct.pack_into("<QQ", self._buffers[i], off + 24, 0, 0)
                self.done.extend((i, fill) for i, fill, _ in self.held)
                self.held = []
            self._pump()

    def _stamp(self, take_in: bool):
        """forced_flush_stamps_ns. A non-forced flush (``take_in``) takes in the records not yet
        returned whose kernels ran (their times are then theirs); a forced flush gives those it
        had not taken in the flush's time as end (those still queued are left to the zeroing)."""
        stamp = self.clock_ns + self.forced_flush_stamps_ns
        now = time.monotonic()
        bufs = [(i, fill, pending) for i, fill, pending in self.held]
        if self.cur >= 0 and self.fill:
            bufs.append((self.cur, self.fill, self.cur_pending))
        for i, fill, pending in bufs:
            queued = {off for off, ready in pending if ready > now}
            for off in range(0, fill, self.record_bytes):
                if off in queued or (i, off) in self._taken:
                    continue
                if take_in:
                    self._taken.add((i, off))
                elif int(self._buffers[i][off:off + 4].view("<u4")[0]) == KIND_CONCURRENT_KERNEL:
                    struct.pack_into("<QQ", self._buffers[i], off + 24, stamp, stamp)

    def _pump(self):
        """Buffers whose records have all completed since they were closed are delivered."""
        now = time.monotonic()
        ready = [b for b in self.held if all(r <= now for _, r in b[2])]
        if ready:
            self.held = [b for b in self.held if b not in ready]
            self.done.extend((i, fill) for i, fill, _ in ready)

    def backlog(self, seconds: float) -> None:
        """Queue GPU work of ``seconds`` ahead of the next launches (like torch.cuda._sleep)."""
        with self.lock:
            self.busy_until = max(self.busy_until, time.monotonic()) + seconds

    def completed_buffer(self):
        with self.lock:
            self._pump()
            if not self.done:
                return None
            i, valid = self.done.pop(0)
        return RawBuffer(self._buffers[i][:valid], i)

    def release_buffer(self, key):
        with self.lock:
            assert key not in self.free and key != self.cur, "released a buffer CUPTI still owns"
            self.free.append(key)

    def free_buffers(self):
        return len(self.free)

    def walk_records(self, data):
        """Like cuptiActivityGetNextRecord: record by record, each kind's own size."""
        out, off = [], 0
        while off + 4 <= len(data):
            kind = int(data[off : off + 4].view("<u4")[0])
            size = self.sizes.get(kind)
            if not size:
                break  # CUPTI_ERROR_INVALID_KIND
            out.append(off)
            off += size
        return np.asarray(out, np.int64)

    def kernel_name(self, ptr):
        return self.names[ptr]

    def dropped_records(self):
        return self.dropped

    def timestamp_ns(self):
        if self.forced_flush_stamps_ns:
            return self.clock_ns + 1  # the GPU clock (its kernels have ended by now)
        return next(self.ts)

    def graph_exec_id(self, h):
        return self.exec_ids[h]

    def stream_id(self, ctx, stream):
        return int(stream)  # identity: tests launch on "handles" equal to CUPTI stream ids

    def info(self):
        return {"cupti_lib": "fake"}

    # ---------------------------------------------------------------- buffers
    def write_record(self, size: int, ready: float = 0.0, **fields) -> None:
        """Append a record (a kernel, or another kind of ``size`` bytes) to the current buffer;
        ``ready``: monotonic time it completes (its kernel has run)."""
        if self.cur < 0:
            if not self.free:
                self.dropped += 1
                return
            self.cur, self.fill = self.free.pop(0), 0
            if self._taken:
                self._taken = {x for x in self._taken if x[0] != self.cur}
        pack_kernel(self._buffers[self.cur], self.fill, **fields) if size >= 160 else \
            struct.pack_into("<I", self._buffers[self.cur], self.fill, fields["kind"])
        if ready > time.monotonic():
            self.cur_pending.append((self.fill, ready))
        self.fill += size
        if self.fill + self.record_bytes > self.buffer_bytes:
            self._complete()

    def _complete(self):
        if self.cur >= 0 and self.fill:
            if self.cur_pending:
                self.held.append((self.cur, self.fill, self.cur_pending))
            else:
                self.done.append((self.cur, self.fill))
            self.cur, self.fill, self.cur_pending = -1, 0, []

    def _name_ptr(self, name: str) -> int:
        p = self.name_ptrs.get(name)
        if p is None:
            p = self.name_ptrs[name] = 0x5000_0000 + 0x40 * len(self.name_ptrs)
            self.names[p] = name
        return p

    # ---------------------------------------------------------------- simulated host API calls
    def _call(self, method, *args):
        h = self.handler
        if h is None:
            return
        self.callback_calls += 1
        try:  # the real adapter contains callback errors the same way
            getattr(h, method)(*args)
        except Exception:
            h.count_error("callback")

    def instantiate(self, kernels: list[Kernel], flags: int = 0, upload_stream: int = 0, api: str = "WithFlags",
                    fail: bool = False) -> int:
        h = next(self.handles)
        with self.lock:
            next(self.corr)
            if fail:
                return h
            self.execs[h] = list(kernels)
            self.exec_ids[h] = next(self.graph_ids)
            self._call("on_instantiate", h, 0xC0, flags, upload_stream if api == "WithParams" else None)
        return h

    def upload(self, h: int, stream: int):
        with self.lock:
            next(self.corr)
            self._call("on_upload", h, 0xC0, stream)

    def destroy(self, h: int):
        with self.lock:
            next(self.corr)
            self._call("on_destroy", h)
            self.execs.pop(h, None)

    def launch(self, h: int, stream: int, block_s: float = 0.0) -> int:
        """Launch; returns the correlation id. Kernels run now on the simulated GPU.

        ``block_s``: the API call blocks that long between its enter and exit callbacks, as
        cuGraphLaunch does while the GPU's queue is full; the graph runs at the end of it."""
        corr = self.stuck_corr or next(self.corr)
        with self.lock:
            self.launches += 1
            entered = self.launch_callbacks
            if entered:
                self.launch_callback_calls += 1
                self._call("on_launch_enter", corr, h, 0xC0, stream)
            if block_s <= 0:
                self._run_graph(h, corr)
                self._exit(corr, entered)
                return corr
        time.sleep(block_s)
        with self.lock:
            self._run_graph(h, corr)
            self._exit(corr, entered)
        return corr

    def _exit(self, corr: int, entered: bool) -> None:
        if self.launch_callbacks:
            self._call("on_launch_exit", corr)
        elif entered and self.stick_on_lost_exit:
            self.stuck_corr = corr

    def _run_graph(self, h, corr):
        kernels = self.execs[h]
        tracing = self.activity
        ready = 0.0
        if self.gpu_replay_s > 0 or self.busy_until > time.monotonic():
            ready = self.busy_until = max(self.busy_until, time.monotonic()) + self.gpu_replay_s
        f = self.trace_slowdown if tracing else 1.0
        chunk = max(1, len(kernels) // 4)  # the launch's time in a few sleeps between kernels (one per kernel: far longer)
        spread = self.launch_spread_s / max(1, -(-len(kernels) // chunk) - 1) if len(kernels) > 1 else 0.0
        t_stream: dict[int, int] = {}
        base = self.clock_ns
        end_all = base
        stretch = self.first_traced_end_extra_ns if tracing and self._stretch_next else 0
        self._stretch_next = self._stretch_next and not tracing
        for i, k in enumerate(kernels):
            if spread and i and i % chunk == 0:  # the lock (held once, by launch()) let go: a switch can land here
                self.lock.release()
                time.sleep(spread)
                self.lock.acquire()
                tracing = self.activity
            t = t_stream.get(k.stream, base) + int(k.gap_ns * f) + (k.traced_gap_ns if tracing else 0)
            e = t + int(k.duration_ns * f)
            t_stream[k.stream] = e
            end_all = max(end_all, e)
            if tracing:
                self.write_record(self.record_bytes, ready=ready, start=t, end=e + (stretch if i == 0 else 0),
                                  stream=k.stream, device=0, corr=corr, name_ptr=self._name_ptr(k.name),
                                  graph_node_id=i + 1, graph_id=self.exec_ids[h])
        self.clock_ns = end_all


class FakeEvents:
    """Event timing on the fake GPU clock (stands in for graphmon.sources.cupti.observer.CudaEvents)."""

    def __init__(self, gpu: FakeCupti, capturing: set[int] | None = None) -> None:
        self.gpu = gpu
        self.times: dict[int, int] = {}
        self.ready: dict[int, float] = {}  # monotonic time the work before the event has run
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
        self.ready[ev] = self.gpu.busy_until
        return True

    def query(self, ctx, ev):
        return time.monotonic() >= self.ready.get(ev, 0.0)

    def elapsed_ms(self, ctx, e0, e1):
        return (self.times[e1] - self.times[e0]) / 1e6


class Workload:
    """Replays graphs on the fake in a loop from a host thread, like a serving loop (a context
    manager: started on enter, stopped on exit); ``errors`` holds what reached the loop."""

    def __init__(self, fake: FakeCupti, execs, stream: int = 7, period_s: float = 0.0005):
        self.fake, self.execs, self.stream, self.period_s = fake, execs, stream, period_s
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            while not self.stop.is_set():
                for h in self.execs:
                    self.fake.launch(h, self.stream)
                time.sleep(self.period_s)
        except BaseException as e:  # the host must never see an exception from graphmon
            self.errors.append(e)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.t.join(5)


def decode_like(n_layers: int = 4, main: int = 7, side: int = 8) -> list[Kernel]:
    """A small two-stream graph with distinct, known gaps."""
    ks = []
    for i in range(n_layers):
        ks.append(Kernel(main, 3000, 400, f"norm{i}"))
        ks.append(Kernel(side, 1500, 600, f"side{i}"))
        ks.append(Kernel(main, 5000, 416, f"matmul{i}"))
    return ks
