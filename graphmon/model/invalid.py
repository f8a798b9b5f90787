"""Why a record was excluded: one enum for every reader, Trace.build and the CUPTI collector.

The values are stable strings: they are the ``reason`` label of ``graphmon_records_invalid_total``
(a 0 sample exists for each from the start) and the keys of ``Trace.invalid``. ``Trace.invalid``
stores the plain ``.value`` strings so that JSON, metrics and dict lookups see ordinary str.
"""

from __future__ import annotations

from enum import Enum


class InvalidReason(str, Enum):
    # Readers: a field of one record is unusable.
    MISSING_FIELD = "missing_field"  # a kernel record lacks ts, dur, stream, correlation or device
    NON_NUMERIC = "non_numeric"  # a number field holds a string, bool, null, NaN, Infinity...
    NON_INTEGER = "non_integer"  # stream/correlation/device with a fraction
    OUT_OF_RANGE = "out_of_range"  # does not fit int64 ns (or the device/correlation bounds)
    BAD_PHASE = "bad_phase"  # a kernel event that is not a complete event (ph != "X")
    BAD_NAME = "bad_name"  # kernel name present but not a string
    # Trace.build: the record's times or identity.
    ZERO_START = "zero_start"  # start == 0: the source had no timestamp
    END_BEFORE_START = "end_before_start"
    DUPLICATE = "duplicate"  # same device, stream, correlation, start and end as a kept record
    NEGATIVE_TIMESTAMP = "negative_timestamp"
    # CUPTI collector windows (model/edges.py).
    LAUNCHED_OUTSIDE_WINDOW = "launched_outside_window"  # its launch is not one of the window's
    # the rest of a replay that lacks a kernel its graph has, or holds one without usable times
    PARTIAL_REPLAY = "partial_replay"
    NO_CORRELATION = "no_correlation"
    # more than one replay: several launches under one id, or a timing no single replay has (an
    # overlap on one stream, a span far beyond its graph's median: model/edges.mistimed_replays)
    OVERFULL_REPLAY = "overfull_replay"
    # CUPTI returned the record without its kernel's end (0, CUPTI's "unknown"): a forced flush
    # before the times were in, or an end that flush made up (model/edges.assemble)
    INCOMPLETE_RECORD = "incomplete_record"

    def __str__(self) -> str:
        return self.value


INVALID_REASONS: tuple[str, ...] = tuple(r.value for r in InvalidReason)
