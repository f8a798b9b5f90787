"""A window's activity buffers -> its records: flushing CUPTI, decoding buffers, the columns.

Only the collector thread runs this: CUPTI's completion callback only queues a buffer (api.py),
and each queued buffer is gathered into the window's RecordStore here and given back to the
pool at once, one piece of work per GIL hold (pacing.py). The flush decides when a window's
records are all in (``flush``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import numpy as np

from graphmon.sources.cupti import native as _native
from graphmon.sources.cupti.pacing import Pacer
from graphmon.sources.cupti.records import BufferDecoder, ColumnArena, KernelColumns, NameTable, RecordStore, \
    shared_name_table

log = logging.getLogger("graphmon.cupti")

BATCH_PIECE_S = 2e-4  # buffers gathered in one GIL hold until their CPU reaches this (then a yield)


class Ingest:
    def __init__(self, settings: Any, pacer: Pacer, count_error: Callable[[str], None]) -> None:
        self.settings = settings
        self.pacer = pacer
        self.count_error = count_error
        self.api: Any = None
        self.decoder: Optional[BufferDecoder] = None
        self.store = RecordStore(settings.max_window_records)  # reused from window to window
        self.arena = ColumnArena()  # a records sink's columns, reused (the link copies them at once)
        self.names: Optional[NameTable] = None
        self.wall_s = 0.0  # wall time decoding (includes waits for the host's GIL)
        self.cpu_s = 0.0  # this thread's CPU time decoding: graphmon's own cost
        self.parts_s = [0.0, 0.0]  # of it: per buffer (gather into the store), at the window's end (columns + name ids)
        self.records = 0
        self.piece_cpu_max_s = 0.0  # the window's longest one-buffer decode, CPU
        self.forced_records = -1  # records the last window's forced flush brought (-1: not forced; keep_raw)

    def bind(self, api: Any) -> None:
        """The api whose buffers this decodes (made once; a later setup keeps them)."""
        self.api = api
        if self.decoder is None:
            self.decoder = BufferDecoder(walk=api.walk_records)
            if self.decoder.native is None:
                log.info("graphmon: decoding CUPTI buffers with numpy (native decode %s)", _native.status())
            self.names = shared_name_table(getattr(api, "names_key", None), api.kernel_name)

    def new_window(self) -> None:
        """Leftovers of an earlier window are not this window's: decoded, then dropped."""
        self.drain_queue()
        self.store.clear()
        self.names.new_window()

    def drain_queue(self) -> None:
        """Gather the queued buffers into the window's store and give each back to the pool,
        yielding the GIL once a piece of work reaches ``BATCH_PIECE_S`` (a default window's
        buffers take ~0.05-0.1 ms each: a sleep after every one would only stretch the flush)."""
        api = self.api
        while True:
            buf = api.completed_buffer()
            if buf is None:
                return
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                self.records += self.decoder.gather(buf.data, self.store)
            except Exception:
                self.count_error("buffer_completed")
            finally:
                api.release_buffer(buf.key)
            self.wall_s += time.perf_counter() - t0
            c = time.thread_time() - c0
            self.cpu_s += c
            self.parts_s[0] += c
            self.piece_cpu_max_s = max(self.piece_cpu_max_s, c)
            self.pacer.pause(BATCH_PIECE_S)  # the host's threads take the GIL between pieces

    def flush(self, window_corr: np.ndarray, drained: bool, stopped: Callable[[], bool]) -> float:
        """Ask CUPTI for the window's buffers and decode them; returns the ms it took.

        CUPTI's non-forced flush returns only buffers whose records are all complete (full or
        not): one incomplete record (a launch traced while the window drained, still queued)
        holds back the window's records in its buffer too (H200: cut replays). A forced flush
        returns every buffer, but not only with zero end times for what is still queued: on the
        H200 it returned records of kernels that had run 1.3-2 ms before (their CUDA events said
        so) with the flush's own time as end, CUPTI not having taken them in yet
        (bench/results/gpu-check-10: the last replay of 12 windows in 60, span = busy = 1.5-2.1
        ms against 0.14 ms, gaps to -2.0 ms). So it flushes without forcing, in which CUPTI
        takes in every record whose kernel ran, until every window launch (``window_corr``) has
        records, within ``max_drain_ms`` (then forced: ``flush_forced``). Once the events say
        every window launch ran (``drained``), a forced flush then returns what is still held
        back (the tail of the last replay; with ``boundary = "collector"``, buffers shared with
        later launches, outside the window, still queued); the ends it still makes up, the
        collector drops (closing.unknown_late_ends)."""
        t0 = time.perf_counter()
        deadline = t0 + self.settings.max_drain_ms / 1e3
        forced = False
        self.forced_records = -1
        while True:
            before = self.store.n_records
            try:
                self.api.flush(forced=forced)
            except Exception:
                self.count_error("flush")
                break
            self.drain_queue()
            if forced:
                self.forced_records = self.store.n_records - before
            if forced or stopped():
                break
            if self.store.has_all(window_corr):
                if not drained:
                    break
                forced = True  # by design, not counted
                continue
            if time.perf_counter() >= deadline:
                forced = True
                self.count_error("flush_forced")
                continue
            self.pacer.sleep(0.002)
        return (time.perf_counter() - t0) * 1e3

    def take(self, reuse: bool) -> tuple[KernelColumns, np.ndarray, int]:
        """The window's columns, name ids and discarded count; the store empties for the next.
        ``reuse``: columns in the arena (valid until the next window: a consumer copies them)."""
        discarded = self.store.discarded
        c0, t0 = time.thread_time(), time.perf_counter()
        cols, name_id = self.store.take(self.pacer.pause, self.names, self.arena if reuse else None)
        c = time.thread_time() - c0  # ingest's second part (its sleeps are not CPU)
        self.parts_s[1] += c
        self.cpu_s += c
        self.wall_s += time.perf_counter() - t0
        return cols, name_id[: len(cols)], discarded

    def return_buffers(self, stage: str) -> None:
        """Every buffer CUPTI holds back to the pool (a forced flush, then decoded), before
        graphmon lets go of CUPTI: another tool (torch.profiler/Kineto) may then register its own
        buffer callbacks, and CUPTI must never complete one of ours through them."""
        for step in (lambda: self.api.flush(forced=True), self.drain_queue):
            try:
                step()
            except Exception:
                self.count_error(stage)

    def dropped(self) -> int:
        try:
            return int(self.api.dropped_records())
        except Exception:
            self.count_error("dropped_query")
            return 0

    def report(self, st: dict) -> None:
        """This window's decode figures into the source's stats."""
        ds = self.decoder.stats
        st.update(decode_fallback_buffers=ds.fallback_buffers, other_kind_records=ds.other_kind_records,
                  record_bytes=self.decoder.record_bytes, buffers=ds.buffers)
        if self.cpu_s > 0:  # records per second of the collector's CPU (its wall time: _wall)
            st["ingest_records_per_s"] = self.records / self.cpu_s
        if self.wall_s > 0:
            st["ingest_records_per_s_wall"] = self.records / self.wall_s
        st["decode_cpu_max_ms"] = self.piece_cpu_max_s * 1e3
        self.piece_cpu_max_s = 0.0
