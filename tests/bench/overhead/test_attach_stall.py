"""bench/overhead/attach_stall.py's per-event longest step and summary, on synthetic steps with a known
stall after one kind of event: no GPU, no CUPTI."""

import numpy as np
import pytest

from bench.overhead import attach_stall as A


def test_schedule_never_overlaps_graphmon_and_raw_cupti():
    seq = A.schedule(4)
    assert all(seq.count(k) == 4 for k in ("attach", "detach", "subscribe", "unsubscribe")) and seq.count("none") == 8
    on = None
    for k in seq:  # one subscriber at a time: each "on" undone before the other kind's
        if k in ("attach", "subscribe"):
            assert on is None
            on = k
        elif k in ("detach", "unsubscribe"):
            assert on == {"detach": "attach", "unsubscribe": "subscribe"}[k]
            on = None
    assert seq[1] == "attach" and seq[7] == "subscribe"  # rounds alternate which pair goes first


def test_longest_step_after_each_event_finds_a_known_stall():
    step = 0.0015
    durations = np.full(4000, step)
    ends = np.cumsum(durations)
    starts = ends - durations
    events = []
    for i, kind in enumerate(["none", "attach", "none", "detach"] * 5):
        t0 = 0.2 + 0.25 * i
        events.append((kind, t0, t0 + 0.01))
        if kind == "attach":  # the step 50 ms after each attach stalls 15 ms
            j = int(np.searchsorted(starts, t0 + 0.05))
            durations[j] += 0.015
    ends = np.cumsum(durations)
    starts = ends - durations
    rows = A.longest_after(events, starts, ends, after_s=0.1)
    s = A.summarize(rows)
    assert s["attach"]["events"] == 5 and s["attach"]["longest_step_ms_median"] == pytest.approx(16.5)
    assert s["attach"]["excess_over_none_ms_median"] == pytest.approx(15.0)
    assert s["detach"]["excess_over_none_ms_median"] == pytest.approx(0.0)
    assert s["none"]["action_ms_median"] == pytest.approx(10.0)
    assert A.longest_after([("none", 99.0, 99.0)], starts, ends, 0.1)[0]["ms"] is None  # after the last step


def test_cli_refuses_events_closer_than_their_window(tmp_path):
    with pytest.raises(SystemExit):
        A.main(["--out", str(tmp_path), "--after-s", "0.5", "--gap-s", "0.4"])
