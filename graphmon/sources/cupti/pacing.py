"""The collector thread's manners with the host's GIL, and its per-window phase log.

Every piece of the collector's work (a buffer's decode, a chunk of columns, the sink) holds the
GIL that the serving loop's Python needs nearly all the time. ``Pacer`` measures each piece in
this thread's CPU time and sleeps between pieces in proportion to it (``gil_share``), and marks
the end of each window phase in wall and CPU time (``CuptiSource.phase_log``).
"""

from __future__ import annotations

import time
from typing import Any


class Pacer:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.piece_cpu0 = 0.0  # thread_time() when the collector last yielded
        self.hold_cpu_max_s = 0.0  # the window's longest piece of work between two yields, CPU
        self.phases: dict[str, Any] = {}  # the current window's marks (see CuptiSource.phase_log)

    def start_piece(self) -> None:
        self.piece_cpu0 = time.thread_time()

    def pause(self, min_piece_s: float = 0.0) -> None:
        """Between two pieces of the collector's work: sleep, so that a host thread waiting for
        the GIL takes it. time.sleep(0) hands the GIL back only if the waiter wins the race to
        it, which the thread that just released it usually does: the host then waits for
        Python's switch interval (5 ms) instead of one piece (< 0.4 ms). The sleep grows with
        the piece (``gil_share``): an HF decode loop needs the GIL nearly all the time, so on
        the H200 a window's 2-4 ms of work, yielding 0.5 ms between pieces, still stretched the
        one or two host steps it overlapped by 1-2 ms. A piece shorter than ``min_piece_s``
        goes on without a sleep (the next piece joins it)."""
        s = self.settings
        piece_s = max(0.0, time.thread_time() - self.piece_cpu0)
        if piece_s < min_piece_s:
            return
        self.hold_cpu_max_s = max(self.hold_cpu_max_s, piece_s)
        sleep_s = max(s.yield_ms / 1e3, piece_s * (1.0 - s.gil_share) / s.gil_share)
        time.sleep(min(sleep_s, 0.05))
        self.piece_cpu0 = time.thread_time()

    def sleep(self, seconds: float) -> None:
        """A wait of the window's own (polling, draining): the host had the GIL, a new piece starts."""
        time.sleep(seconds)
        self.piece_cpu0 = time.thread_time()

    def take_hold_max_s(self) -> float:
        """The window's longest piece between two yields (the current one included); resets."""
        hold_s = max(self.hold_cpu_max_s, time.thread_time() - self.piece_cpu0)
        self.hold_cpu_max_s = 0.0
        return hold_s

    def new_window(self, decode_wall_s: float, decode_cpu_s: float, decode_parts_s: list[float]) -> None:
        """A window starts: its marks, and the decode totals so far (phase_log keeps the window's part)."""
        self.piece_cpu0 = time.thread_time()
        self.phases = {"t0": time.perf_counter(), "decode_ms": -decode_wall_s * 1e3, "decode_cpu_ms": -decode_cpu_s * 1e3,
                       "decode_parts_cpu_ms": [-x * 1e3 for x in decode_parts_s], "cpu": {"t0": time.thread_time()}}

    def mark(self, phase: str) -> None:
        """End of a window phase: wall time, and this thread's CPU time (what graphmon itself
        spent: the GIL it can have held; the wall time also holds waits for the host's GIL)."""
        self.phases[phase] = time.perf_counter()
        self.phases["cpu"][phase] = time.thread_time()
