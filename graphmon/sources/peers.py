"""What the agent's peers can make it hold or write, bounded: the limits of graphmon.sources.remote
(docs/reliability.md, "The agent and its peers"), the byte budget all connections share for
frames being received or waiting for ingest, and rate-limited log lines."""

from __future__ import annotations

import logging
import threading
import time

LOG_LINES_PER_MINUTE = 5
# Why a connection was refused or closed before it became a process (a closed set: metric labels).
REJECT_REASONS = ("uid", "too_many_processes", "unidentified_evicted", "hello_timeout", "bad_hello")
# Why a window a process sent was not ingested.
DROP_REASONS = ("queue_full", "memory", "invalid")
# Frame errors after which the stream cannot be trusted (or is out of step): the connection is
# closed. After any other (a window or status that fails validation) it is kept.
CLOSING_REASONS = ("framing", "too_large", "stalled", "header", "protocol")
HELLO_TIMEOUT_S = 5.0
MAX_UNIDENTIFIED = 16
MAX_PROCESSES = 256
MAX_BUFFERED_BYTES = 128 * 2**20
MAX_QUEUED_WINDOWS = 8
# A frame must arrive whole within this long of its first byte: a sender that trickles a frame
# would hold its buffer (and its share of the budget) forever. A window of 2M records crosses a
# Unix socket in well under a second.
FRAME_TIMEOUT_S = 30.0


class LimitedLog:
    """At most ``per_minute`` lines per key a minute; the next line after a quiet spell says how
    many were suppressed. For what peers can trigger at will (refusals, bad frames, attach)."""

    def __init__(self, logger: logging.Logger, per_minute: int = LOG_LINES_PER_MINUTE) -> None:
        self.logger, self.per_minute = logger, per_minute
        self._seen: dict[str, list] = {}  # key -> [window start, lines, suppressed]
        self._lock = threading.Lock()
        self.suppressed = 0

    def __call__(self, level: int, key: str, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            st = self._seen.get(key)
            if st is None or now - st[0] > 60.0:
                if len(self._seen) > 256:
                    self._seen.clear()
                st = self._seen[key] = [now, 0, st[2] if st else 0]
            if st[1] >= self.per_minute:
                st[2] += 1
                self.suppressed += 1
                return
            st[1] += 1
            quiet, st[2] = st[2], 0
        if quiet:
            msg += f" ({quiet} similar lines suppressed)"
        self.logger.log(level, msg, *args)


class ByteBudget:
    """Bytes every connection together may hold in frames being received or waiting for ingest.

    Fair share: once half of it is in use, a connection that holds something already gets more
    only up to an eighth, so one fast or hostile sender cannot take the room the others' windows
    need (a connection that holds nothing may always use what is free)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.used = 0
        self.high_water = 0
        self._lock = threading.Lock()

    def reserve(self, n: int, held: int = 0) -> bool:
        with self._lock:
            if self.used + n > self.max_bytes or (
                    held and self.used + n > self.max_bytes // 2 and held + n > self.max_bytes // 8):
                return False
            self.used += n
            self.high_water = max(self.high_water, self.used)
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)
