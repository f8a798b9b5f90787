"""The CUPTI subscription's lifecycle: subscribe (or wait, blocked, while another tool holds
CUPTI), the launch callbacks switched on and off without splitting a launch (launches.LaunchGate),
the opt-in unsubscribe between windows (``idle_unsubscribe_s``) and the subscribe again when a
torch graph capture begins (capture_hook.py), and the final unsubscribe. CUPTI is never
finalized (cuptiFinalize faulted the GPU on the next replay of a graph traced before it, H200).

Who calls what: the collector thread runs ``setup``, ``go_idle`` and ``release``; a host thread
beginning a graph capture runs ``on_capture_begin``. Both take ``lock``; a CUPTI callback never does.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from graphmon.sources.cupti import capture_hook
from graphmon.sources.cupti.ingest import Ingest
from graphmon.sources.cupti.launches import LaunchGate
from graphmon.sources.cupti.libinfo import cupti_python_version
from graphmon.sources.cupti.records import warm_up


class Subscription:
    def __init__(self, source: Any, api_arg: Any, ingest: Ingest) -> None:
        # source: the CallbackHandler CUPTI calls back (CuptiSource), with its settings, registry,
        # stats, count_error/set_state, and _stop/_thread/_wake (a capture's subscribe wakes it)
        self.source = source
        self.settings = source.settings
        self._api_arg = api_arg  # a CuptiActivityApi (tests: the fake); None: load cupti-python + libcupti
        self.api: Any = None
        self.ingest = ingest
        self.subscribed = False
        self.lock = threading.Lock()
        self.idle = False  # unsubscribed between windows (idle_unsubscribe_s) until the next one
        self.active_s = 0.0  # monotonic time of the last reason to stay subscribed: attach, an instantiation, a capture
        self.hook = False  # capture_hook installed
        self.gate = LaunchGate(enabled=self.settings.launch_gate)  # the launch callbacks, never off inside a launch
        self._warmed = False

    def setup(self, prepare: Callable[[Any], None]) -> bool:
        """Subscribe and register; False (state 'blocked') when another subscriber holds CUPTI.
        ``prepare(api)``: what the source makes once the api exists (its event timer)."""
        src = self.source
        try:
            if self.api is None:
                if self._api_arg is not None:
                    self.api = self._api_arg
                else:
                    from graphmon.sources.cupti.api import load_api

                    self.api = load_api(self.settings.buffer_size_bytes, self.settings.max_buffers)
            api = self.api
            prepare(api)
            self.ingest.bind(api)
            src.registry.graph_exec_id = api.graph_exec_id
            with self.lock:
                if not self.subscribed:  # (a capture may have subscribed it meanwhile)
                    try:
                        api.subscribe(src)
                    except Exception as e:
                        src.set_state("blocked", f"cupti subscribe failed (another profiler?): {e}")
                        return False
                    self.subscribed = True
                if not self.idle:  # attach (or the end of a block) starts the quiet period; a window does not
                    self.active_s = time.monotonic()
                self.idle = False
            if not self._warmed:  # after subscribing: a graph instantiated meanwhile is seen
                self._warmed = True
                try:
                    # numpy's first calls at attach, not in the first window; and before 'running',
                    # which an in-code attach waits for: on the H200 the host's first step after a
                    # process's first attach took 70 ms while this ran after it
                    warm_up()
                    cupti_python_version()  # package metadata (ms): read once per process, here
                except Exception:
                    src.count_error("warm_up")
            src.set_state("running")
            return True
        except Exception as e:
            src.count_error("setup")
            src.set_state("error", f"cupti unavailable: {e}")
            return False

    def go_idle(self, now: float, busy: bool) -> bool:
        """Unsubscribe between windows once nothing needs CUPTI: no graph instantiated for
        ``idle_unsubscribe_s``, no first launch pending, nothing ``busy`` (a window armed or
        open, a capture queued). True if it did."""
        s, src = self.settings, self.source
        if busy or self.gate.on or src.registry.pending_first_launch > 0 or now - self.active_s < s.idle_unsubscribe_s:
            return False
        if not self.hook:  # before unsubscribing: a capture from now on subscribes first
            try:
                self.hook = capture_hook.install(self.on_capture_begin)
            except Exception:
                src.count_error("capture_hook")
        self.ingest.return_buffers("flush")
        with self.lock:
            if not self.subscribed or time.monotonic() - self.active_s < s.idle_unsubscribe_s:
                return False
            try:
                self.api.unsubscribe()
            except Exception:
                src.count_error("unsubscribe")
                return False
            self.subscribed = False
            self.idle = True
            self.gate.forget()
        src.stats["idle_unsubscribes"] += 1
        return True

    def on_capture_begin(self) -> None:
        """A host thread begins a torch graph capture (capture_hook): subscribe now, so that the
        graph's instantiation is seen (its upload mode), and stay subscribed for the quiet period."""
        src = self.source
        if src._stop.is_set() or src._thread is None:
            return
        self.active_s = time.monotonic()
        if self.subscribed:
            return
        with self.lock:
            if self.subscribed or not self.idle:
                return
            try:
                self.api.subscribe(src)
            except Exception:
                src.count_error("capture_subscribe")
                return
            self.subscribed = True
            self.idle = False
            self.active_s = time.monotonic()
        src.stats["resubscribes"] += 1
        src._wake.set()  # the collector's wait was for its next window: now also for the quiet period

    def set_launch_cb(self, on: bool) -> None:
        if self.subscribed:  # an off waits while a launch is between its enter and exit (LaunchGate)
            self.gate.set(on, self.api.set_launch_callbacks)

    def release(self, flush: bool) -> bool:
        """The end: the capture hook out, every buffer back (``flush``), unsubscribed (lets
        torch.profiler subscribe afterwards). False when it was not subscribed."""
        if self.hook:
            capture_hook.uninstall(self.on_capture_begin)
            self.hook = False
        with self.lock:
            self.idle = False  # a capture from now on finds nothing to subscribe
        if not self.subscribed:
            return False
        if flush:
            self.ingest.return_buffers("unsubscribe")
        try:
            self.api.unsubscribe()
        except Exception:
            self.source.count_error("unsubscribe")
        self.subscribed = False
        self.gate.forget()
        return True
