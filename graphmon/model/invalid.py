"""Why a kernel record was excluded: one enum of every reason (stable strings: metric label values).

A ``str`` enum so that a reason is its label value everywhere (dict keys, JSON, Prometheus).
"""

from __future__ import annotations

from enum import Enum


class InvalidReason(str, Enum):
    # model/trace.py: Trace.build validates every record
    ZERO_START = "zero_start"
    END_BEFORE_START = "end_before_start"
    DUPLICATE = "duplicate"
    NEGATIVE_TIMESTAMP = "negative_timestamp"
    # sources/cupti/assemble.py: window edges cut replays
    LAUNCHED_OUTSIDE_WINDOW = "launched_outside_window"
    PARTIAL_REPLAY = "partial_replay"
    NO_CORRELATION = "no_correlation"
    OVERFULL_REPLAY = "overfull_replay"

    def __str__(self) -> str:  # f-strings and str() give the label value, not "InvalidReason.X"
        return self.value
