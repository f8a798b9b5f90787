"""InvalidReason: one list of reasons (metric label values) for every reader and the collector."""

import json

from graphmon.formats.read import read_trace
from graphmon.model.invalid import INVALID_REASONS, InvalidReason

from tracefiles import kernel, write_json


def test_values_are_stable_strings():
    assert InvalidReason.MISSING_FIELD == "missing_field" and str(InvalidReason.DUPLICATE) == "duplicate"
    assert len(set(INVALID_REASONS)) == len(INVALID_REASONS) == 15
    assert {"launched_outside_window", "partial_replay", "no_correlation", "overfull_replay",
            "incomplete_record"} <= set(INVALID_REASONS)


def test_every_reason_a_reader_counts_is_in_the_enum(tmp_path):
    events = [kernel(10, corr=5), kernel(10, corr=5), kernel("x", corr=5), kernel(0, corr=5), kernel(12, dur=-1, corr=5),
              kernel(13, stream=1.5, corr=5), kernel(14, corr=5, ph="B"), kernel(15, corr=5, name=3), kernel(-4, corr=5),
              kernel(10**40, corr=5), {"cat": "kernel", "ph": "X"}]
    t = read_trace(write_json(tmp_path / "r.json", None, raw=json.dumps({"traceEvents": events})), progress=False)
    assert len(t.invalid) == 10
    for reason in t.invalid:
        assert type(reason) is str and reason in INVALID_REASONS  # plain str keys: JSON and label values
