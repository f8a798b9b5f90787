"""What a source delivers and what it reports: a window of kernel records, a capture request, health.

These are plain frozen data shared between threads (and, for windows, between processes): no
methods that touch a source, so the model imports nothing but the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from graphmon.model.trace import Trace


@dataclass(frozen=True)
class CaptureRequest:
    """An on-demand window (POST /capture): N replays or D milliseconds, whichever ends first."""

    id: str
    replays: Optional[int] = None
    duration_ms: Optional[float] = None


@dataclass(frozen=True)
class Window:
    """One sampling window of kernel records, as delivered by a source."""

    trace: Trace
    started_s: float  # wall clock (time.time()) when the window opened
    ended_s: float  # wall clock when it closed
    dropped: int = 0  # records the source lost (e.g. CUPTI's dropped-record count)
    observer_slowdown: Optional[float] = None  # in-window / out-of-window replay time, if measured
    capture_id: Optional[str] = None  # set when the window answers a CaptureRequest


@dataclass(frozen=True)
class SourceHealth:
    up: bool
    state: str  # "starting" | "running" | "stopped" | "blocked" | "error"
    reason: str = ""
    errors: dict[str, int] = field(default_factory=dict)  # stage -> count
    last_errors: dict[str, str] = field(default_factory=dict)  # stage -> repr of the last exception
