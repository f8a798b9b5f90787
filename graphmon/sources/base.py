"""The source protocol: a source delivers windows of kernel records to a sink callback.

A source owns its threads. The sink (the aggregator) must be cheap and must not raise into the
source: it contains its own errors. Sources report health without blocking.
"""

from __future__ import annotations

import abc
import sys
import threading
import time
from typing import Callable, Optional

from graphmon.model.window import CaptureRequest, SourceHealth, Window


Sink = Callable[[Window], None]


class Source(abc.ABC):
    """Base class of every source. Subclasses implement start/stop/request_capture."""

    backend: str = "abstract"

    def __init__(self) -> None:
        self._errors: dict[str, int] = {}
        self._last_errors: dict[str, str] = {}
        self._errors_lock = threading.Lock()  # serialises increments; health() never takes it
        self._state = "starting"
        self._reason = ""

    def info(self) -> dict[str, str]:
        """Static facts for graphmon_collector_info (backend, versions, ...)."""
        return {"backend": self.backend}

    @abc.abstractmethod
    def start(self, sink: Sink) -> None:
        """Start delivering windows to ``sink`` from the source's own thread(s)."""

    @abc.abstractmethod
    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop threads within ``timeout_s``; flush what is pending to the sink."""

    def request_capture(self, request: CaptureRequest) -> None:
        """Open an on-demand window; the resulting Window carries ``capture_id``."""
        raise NotImplementedError(f"{self.backend} source does not take capture requests")

    def count_error(self, stage: str) -> None:
        # Called from host threads (CUPTI callbacks): no I/O here. The aggregator logs new
        # errors, rate limited, from graphmon's own threads; keep the exception for that line.
        exc = sys.exc_info()[1]
        with self._errors_lock:
            self._errors[stage] = self._errors.get(stage, 0) + 1
            if exc is not None:
                self._last_errors[stage] = _where(exc)

    def wait_started(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until the source has left 'starting' (a CUPTI source: subscribed and
        warmed up, or blocked, or failed). An in-code attach waits for it, so that the graph
        whose capture follows the attach is instantiated under the subscription (its upload
        mode known) and the warm-up is attach's time, not the host's next steps."""
        deadline = time.monotonic() + timeout_s
        while self._state == "starting" and time.monotonic() < deadline:
            time.sleep(0.002)

    def set_state(self, state: str, reason: str = "") -> None:
        self._state, self._reason = state, reason

    def health(self) -> SourceHealth:
        # No lock: scrapes call this and must never wait on a lock CUPTI callbacks take.
        # dict() of a dict is one C call under the GIL, so the copy is consistent.
        errors = dict(self._errors)
        return SourceHealth(up=self._state == "running", state=self._state, reason=self._reason, errors=errors,
                            last_errors=dict(self._last_errors))


def _where(exc: BaseException) -> str:
    """repr(exc) and the innermost frame that raised it: a callback error on a host thread has no
    traceback anywhere else (no I/O there), and its repr alone ("an integer is required") does not
    say which line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    at = "" if tb is None else f" at {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
    r = repr(exc)[: 300 - min(len(at), 120)]
    return (r + at[:120])[:300]


def wall_time() -> float:
    return time.time()
