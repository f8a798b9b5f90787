"""The process -> agent wire format: lossless round trip, strict validation of untrusted frames."""

import json
import struct

import numpy as np
import pytest

from graphmon.model.trace import GraphInfo, Trace
from graphmon.model.window import Window
from graphmon.model.wire import (FrameReader, WireError, decode_window, encode_message, encode_window, frame,
                                 split_frame)


def _window(n=6):
    t = Trace.build(
        start_ns=np.arange(1, n + 1) * 1000, end_ns=np.arange(1, n + 1) * 1000 + 500, stream=np.full(n, 7),
        correlation_id=np.repeat([11, 12], n // 2), graph_id=np.full(n, 3), graph_node_id=np.tile(np.arange(1, n // 2 + 1), 2),
        name_id=np.zeros(n, np.int32), names=["k0"], launches={"correlation_id": [11, 12], "graph": [0, 0],
                                                                 "launch_ns": [900, 3900], "stream": [7, 7]},
        graphs=[GraphInfo(key="g3", graph_id=3, upload_mode="uploaded", label="decode", batch_size=4)],
        invalid={"partial_replay": 2}, meta={"source": "cupti", "capture_id": None})
    return Window(trace=t, started_s=100.0, ended_s=101.5, dropped=1, observer_slowdown=1.1, capture_id="c1")


def _decode(data: bytes) -> Window:
    (n,) = struct.unpack_from("<I", data, 0)
    assert n == len(data) - 4
    return decode_window(*split_frame(data[4:]))


def test_window_round_trip_is_lossless():
    w = _window()
    back = _decode(encode_window(w))
    for col in ("start_ns", "end_ns", "stream", "correlation_id", "graph_id", "graph_node_id", "name_id", "graph", "device"):
        np.testing.assert_array_equal(getattr(back.trace, col), getattr(w.trace, col))
        assert getattr(back.trace, col).dtype == getattr(w.trace, col).dtype
    for k in w.trace.launches:
        np.testing.assert_array_equal(back.trace.launches[k], w.trace.launches[k])
    assert back.trace.graphs == w.trace.graphs and back.trace.names == ("k0",)
    assert dict(back.trace.invalid) == {"partial_replay": 2}
    assert (back.started_s, back.ended_s, back.dropped, back.observer_slowdown, back.capture_id) == (100.0, 101.5, 1, 1.1, "c1")


def test_traced_time_travels_and_an_older_sender_means_zero():
    import dataclasses

    back = _decode(encode_window(dataclasses.replace(_window(), traced_s=0.0125)))
    assert back.traced_s == 0.0125
    header, payload = split_frame(encode_window(_window())[4:])
    header.pop("traced_s")  # a light collector from before the tracing budget
    assert _decode(frame(header, bytes(payload))).traced_s == 0.0


def _tamper(fn):
    data = encode_window(_window())
    header, payload = split_frame(data[4:])
    header, payload = fn(dict(header), bytes(payload))
    return frame(header, payload)


@pytest.mark.parametrize("fn, msg", [
    (lambda h, p: (h, p[:-8]), "past the payload"),
    (lambda h, p: (h, p + b"\0" * 8), "trailing"),
    (lambda h, p: ({**h, "columns": h["columns"][::-1]}, p), "column spec"),
    (lambda h, p: ({**h, "columns": [[*c[:2], c[2] + 1] if c[1] == "end_ns" else c for c in h["columns"]]}, p + b"\0" * 8),
     "differ in length"),
    (lambda h, p: ({**h, "columns": [[*c[:2], -1] if c[1] == "end_ns" else c for c in h["columns"]]}, p), "column spec"),
    (lambda h, p: ({**h, "names": []}, p), "name_id out of range"),
    (lambda h, p: ({**h, "graphs": [{**h["graphs"][0], "upload_mode": "bogus"}]}, p), "unknown upload mode"),
    (lambda h, p: ({**h, "graphs": [{**h["graphs"][0], "evil": 1}]}, p), "wrong fields"),
    (lambda h, p: ({**h, "graphs": [{**h["graphs"][0], "graph_id": "3"}]}, p), "wrong type"),
    (lambda h, p: ({**h, "dropped": -1}, p), "dropped"),
    (lambda h, p: ({**h, "started_s": float("nan")}, p), "finite"),
    (lambda h, p: ({**h, "invalid": {"x": "many"}}, p), "invalid counts"),
    (lambda h, p: ({**h, "capture_id": "x" * 100}, p), "capture_id"),
    (lambda h, p: ({**h, "traced_s": -0.5}, p), "traced_s must not be negative"),
    (lambda h, p: ({**h, "traced_s": "long"}, p), "traced_s must be a finite number"),
    (lambda h, p: ({**h, "v": 99}, p), "wire version"),
    (lambda h, p: ({**h, "type": "exec"}, p), "known message"),
])
def test_decode_rejects_tampered_frames(fn, msg):
    with pytest.raises(WireError, match=msg):
        _decode(_tamper(fn))


def test_launch_index_out_of_range_is_rejected():
    def fn(h, p):
        # launches.graph is the 3rd launch column; point it past the graph table
        return h, p.replace(struct.pack("<ii", 0, 0), struct.pack("<ii", 5, 0))
    with pytest.raises(WireError, match="out of range"):
        _decode(_tamper(fn))


def test_header_must_be_json_object():
    body = struct.pack("<I", 5) + b"hello"
    with pytest.raises(WireError, match="not JSON"):
        split_frame(body)
    with pytest.raises(WireError, match="header length"):
        split_frame(struct.pack("<I", 1000) + b"{}")
    with pytest.raises(WireError, match="known message"):
        split_frame(struct.pack("<I", 2) + b"[]")


def test_frame_reader_splits_and_bounds():
    r = FrameReader(max_frame_bytes=1 << 16)
    data = encode_message("heartbeat", status={"state": "running"}) + encode_message("bye")
    out = []
    for i in range(0, len(data), 7):  # arrives in small pieces
        out += r.feed(data[i:i + 7])
    assert [split_frame(b)[0]["type"] for b in out] == ["heartbeat", "bye"]
    with pytest.raises(WireError, match="exceeds"):
        FrameReader(max_frame_bytes=100).feed(struct.pack("<I", 101))


def test_empty_window_round_trips():
    t = Trace.build(start_ns=[], end_ns=[], stream=[], correlation_id=[], launches={"correlation_id": [5], "graph": [-1]})
    back = _decode(encode_window(Window(trace=t, started_s=1.0, ended_s=2.0)))
    assert len(back.trace) == 0 and back.trace.n_launches == 1
    assert json.loads(json.dumps(split_frame(encode_window(Window(trace=t, started_s=1.0, ended_s=2.0))[4:])[0]))


def _records():
    """Unfiltered records of a window: launch 11 complete (3 kernels), launch 12 cut (1 kernel,
    ran out of the window), launch 10 launched before the window opened (not in the launches)."""
    from graphmon.model.window import WindowRecords

    corr = np.array([10, 11, 11, 11, 12])
    n = len(corr)
    kernels = {"start_ns": np.arange(1, n + 1) * 1000, "end_ns": np.arange(1, n + 1) * 1000 + 500,
               "device": np.zeros(n, np.int32), "stream": np.full(n, 7), "graph_id": np.full(n, 3),
               "graph_node_id": np.array([3, 1, 2, 3, 1]), "correlation_id": corr, "name_id": np.zeros(n, np.int32)}
    launches = {"correlation_id": np.array([11, 12]), "device": np.zeros(2, np.int32), "graph": np.zeros(2, np.int32),
                "launch_ns": np.array([900, 3900]), "stream": np.full(2, 7), "label": np.full(2, -1, np.int32)}
    return WindowRecords(kernels=kernels, launches=launches, names=["k0"], graphs=_window().trace.graphs,
                         started_s=100.0, ended_s=101.5, dropped=2, observer_slowdown=1.05, capture_id=None,
                         invalid={"no_correlation": 1})


def test_unfiltered_records_are_filtered_by_the_receiver():
    """A light collector ships records as decoded; the agent's decode runs the window-edge filter:
    the same Window as assembling them in the process, edge replays counted, not kept."""
    from graphmon.model.edges import assemble

    r = _records()
    header, _ = split_frame(encode_window(r)[4:])
    assert header["filtered"] is False
    back, local = _decode(encode_window(r)), assemble(r)
    np.testing.assert_array_equal(back.trace.correlation_id, [11, 11, 11])
    for col in ("start_ns", "end_ns", "stream", "correlation_id", "graph_node_id", "graph"):
        np.testing.assert_array_equal(getattr(back.trace, col), getattr(local.trace, col))
    assert dict(back.trace.invalid) == dict(local.trace.invalid) == {
        "no_correlation": 1, "launched_outside_window": 1, "partial_replay": 1}
    assert (back.dropped, back.observer_slowdown, back.trace.n_launches) == (2, 1.05, 2)


@pytest.mark.parametrize("change, msg", [({"filtered": "no"}, "filtered must be"), ({"labels": ["x"]}, "no labels")])
def test_unfiltered_frames_are_checked(change, msg):
    header, payload = split_frame(encode_window(_records())[4:])
    with pytest.raises(WireError, match=msg):
        _decode(frame({**header, **change}, bytes(payload)))


# ---------------------------------------------------------------------- fields a sender controls
@pytest.mark.parametrize("status", [
    {"state": "running", "errors": ["x"]}, {"state": "running", "errors": "boom"},
    {"state": "running", "errors": {"x": 10**400}}, {"state": "running", "errors": {"x": -7}},
    {"state": "running", "errors": {"x": 1.5}}, {"state": "running", "errors": {"x": True}},
    {"state": "running", "link": 5}, {"state": "running", "link": {"reconnects": -1}},
    {"state": 3}, {"state": "running", "reason": ["r"]}, {"state": "running", "windows": 10**400},
    {"state": "running", "sampling": {"next_interval_s": float("inf")}}, {"state": "running", "sampling": []},
    {"state": "running", "errors": {f"s{i}": 1 for i in range(65)}}, [], "running",
    {"state": "running", "last_errors": ["x"]}, {"state": "running", "last_errors": {"flush": 5}},
])
def test_a_status_with_a_malformed_field_is_refused(status):
    from graphmon.model.wire import decode_status

    with pytest.raises(WireError) as e:
        decode_status(status)
    assert e.value.reason == "status"


def test_status_keeps_known_fields_and_folds_unknown_stages_and_states():
    from graphmon.model.wire import decode_status

    got = decode_status({"state": "hacked", "reason": "r" * 1000, "errors": {"flush": 2, "made_up": 3, "also_made_up": 4},
                         "windows": 5, "link": {"windows_dropped": 7, "reconnects": 2, "evil": "x"},
                         "sampling": {"next_interval_s": 12, "cupti_subscribed": False, "evil": 1}, "extra": {"a": 1}})
    assert got["state"] == "error" and len(got["reason"]) == 200
    assert got["errors"] == {"flush": 2, "other": 7}
    assert got["link"] == {"windows_dropped": 7, "reconnects": 2}
    assert got["sampling"] == {"next_interval_s": 12.0, "cupti_subscribed": False}
    assert "extra" not in got and got["windows"] == 5
    assert decode_status({"state": "lost"})["state"] == "error"  # only the agent says a process is lost
    last = decode_status({"last_errors": {"setup": "e" * 1000, "made_up": "x"}})["last_errors"]
    assert last == {"setup": "e" * 300, "other": "x"}


def test_identity_values_are_bounded_strings():
    from graphmon.model.wire import decode_identity

    got = decode_identity({"rank": "r" * 300, "pid": "1; rm -rf", "host": "h" * 1000, "interval_s": 0.5,
                           "first_window_s": 1, "flag": True, "none": None})
    assert len(got["rank"]) == 64 and got["rank"].startswith("r" * 55 + "~")
    assert "pid" not in got and len(got["host"]) == 256
    assert (got["interval_s"], got["first_window_s"], got["flag"], got["none"]) == ("0.5", "1", "true", "")
    for bad in ({"rank": ["0"]}, {"rank": {"a": 1}}, {i: 1 for i in range(3)}, {f"k{i}": "v" for i in range(65)}, "x"):
        with pytest.raises(WireError):
            decode_identity(bad)


@pytest.mark.parametrize("fn, msg", [
    (lambda h, p: ({**h, "dropped": 10**400}, p), "dropped"),
    (lambda h, p: ({**h, "invalid": {"partial_replay": 10**400}}, p), "invalid counts"),
    (lambda h, p: ({**h, "invalid": {f"r{i}": 1 for i in range(65)}}, p), "invalid counts"),
    (lambda h, p: ({**h, "ended_s": 1e300}, p), "ended_s"),
    (lambda h, p: ({**h, "started_s": -5.0}, p), "started_s"),
    (lambda h, p: ({**h, "observer_slowdown": -1.0}, p), "observer_slowdown"),
    (lambda h, p: ({**h, "traced_s": 1e300}, p), "traced_s"),
    (lambda h, p: ({**h, "graphs": [{**h["graphs"][0], "graph_id": 10**400}]}, p), "out of range"),
])
def test_decode_rejects_out_of_range_fields(fn, msg):
    with pytest.raises(WireError, match=msg):
        _decode(_tamper(fn))


def test_invented_invalid_reasons_fold_into_one_value():
    w = _decode(_tamper(lambda h, p: ({**h, "invalid": {**{f"made_up_{i}": 1 for i in range(60)}, "partial_replay": 2}}, p)))
    assert dict(w.trace.invalid) == {"partial_replay": 2, "other": 60}


def test_frame_reader_skips_frames_its_budget_refuses_and_stays_in_step():
    budget = {"free": 100}

    def reserve(n):
        if n > budget["free"]:
            return False
        budget["free"] -= n
        return True

    r = FrameReader(reserve=reserve)
    big = frame({"type": "heartbeat", "v": 1}, b"\0" * 200)  # over the budget: skipped unbuffered
    small = encode_message("bye")
    out = []
    data = bytes(big + small)
    for i in range(0, len(data), 13):
        out += r.feed(data[i:i + 13])
        assert r.buffered <= 100
    assert r.skipped == 1 and [split_frame(b)[0]["type"] for b in out] == ["bye"]
    assert budget["free"] == 100 - len(out[0])  # the frame handed out keeps its reservation


def test_hello_frame_bound_is_what_a_hello_needs():
    from graphmon.model.wire import MAX_HELLO_FRAME_BYTES

    ident = {f"key_{i:02d}": "v" * 256 for i in range(64)}
    hello = encode_message("hello", identity=ident, status={"state": "running", "errors": {"flush": 1}})
    assert len(hello) < MAX_HELLO_FRAME_BYTES / 2
    with pytest.raises(WireError, match="exceeds") as e:
        FrameReader(max_frame_bytes=MAX_HELLO_FRAME_BYTES).feed(struct.pack("<I", 96 * 2**20))
    assert e.value.reason == "too_large"


def test_a_process_sampling_status_keeps_known_keys_of_known_types():
    from graphmon.model.wire import decode_status

    got = decode_status({"sampling": {"next_interval_s": 12, "last_traced_ms": 8.5, "cupti_subscribed": False,
                                      "idle_unsubscribes": 3, "evil": "x" * 10_000, "next_interval_s_extra": 1.0}})
    assert got["sampling"] == {"next_interval_s": 12.0, "last_traced_ms": 8.5, "cupti_subscribed": False,
                               "idle_unsubscribes": 3}
    for bad in ({"next_interval_s": float("nan")}, {"last_traced_ms": True}, {"cupti_subscribed": "yes"},
                {"idle_unsubscribes": -1}):
        with pytest.raises(WireError, match="sampling"):
            decode_status({"sampling": bad})


def test_a_hello_reader_hands_out_one_frame_and_keeps_the_window_after_it():
    """A light collector sends its hello and its first window back to back: one read often holds
    both. The window must be measured against the bound that holds after the hello (it was
    measured against the hello's 64 KiB: a real collector's first connect failed 1 in 4)."""
    from graphmon.model.wire import MAX_HELLO_FRAME_BYTES

    hello = encode_message("hello", identity={"rank": "0"})
    win = encode_window(_window(3000))
    assert len(win) > MAX_HELLO_FRAME_BYTES
    r = FrameReader(MAX_HELLO_FRAME_BYTES, one_frame=True)
    (first,) = r.feed(bytes(hello + win[:100]))  # the hello and the start of the window, in one read
    assert split_frame(first)[0]["type"] == "hello" and r.in_frame
    r.max_frame_bytes, r.one_frame = 1 << 30, False  # the hello was accepted
    assert r.feed(b"") == [] and r.buffered == len(win) - 4
    (w,) = r.feed(bytes(win[100:]))
    assert len(_decode(bytes(struct.pack("<I", len(w)) + w)).trace) == 3000


# ---------------------------------------------------------------------- untraced replay times
def _untraced(graph=(0, -1, 0), ns=(35_264, 40_000, 35_100)):
    return {"graph": np.array(graph, np.int32), "duration_ns": np.array(ns, np.int64)}


def test_untraced_rows_travel_with_a_window_and_with_unfiltered_records():
    import dataclasses

    for w in (dataclasses.replace(_window(), untraced=_untraced()), dataclasses.replace(_records(), untraced=_untraced())):
        back = _decode(encode_window(w))
        for k, dt in (("graph", np.int32), ("duration_ns", np.int64)):
            np.testing.assert_array_equal(back.untraced[k], _untraced()[k])
            assert back.untraced[k].dtype == dt and back.untraced[k].dtype.isnative
        assert back.trace.graphs[0].graph_id == 3  # graph 0 of the rows is the window's graph 0


def test_untraced_columns_keep_old_frames_and_old_agents_valid():
    import dataclasses

    plain, new = encode_window(_window()), encode_window(dataclasses.replace(_window(), untraced=_untraced()))
    h_plain, p_plain = split_frame(plain[4:])
    h_new, p_new = split_frame(new[4:])
    assert "untraced" not in h_plain  # a window without rows is the frame an older sender makes ...
    back = _decode(plain)  # ... and decodes to empty columns
    assert {k: (len(v), v.dtype) for k, v in back.untraced.items()} == {"graph": (0, np.int32),
                                                                          "duration_ns": (0, np.int64)}
    # an older agent checks the column specs and the payload's length and ignores header keys it
    # does not know: the rows change neither
    assert h_new["columns"] == h_plain["columns"] and bytes(p_new) == bytes(p_plain)
    assert set(h_new) - set(h_plain) == {"untraced"}


def _with_untraced(u):
    h, p = split_frame(encode_window(_window())[4:])
    return frame({**h, "untraced": u}, bytes(p))


def _b64(a):
    import base64

    return base64.b64encode(np.asarray(a).tobytes()).decode()


@pytest.mark.parametrize("u, msg", [
    ({"graph": _b64(np.int32([0, 0])), "duration_ns": _b64(np.int64([5]))}, "differ in length"),
    ({"graph": _b64(np.int32([1])), "duration_ns": _b64(np.int64([5]))}, "out of range"),  # one graph: 0 only
    ({"graph": _b64(np.int32([-2])), "duration_ns": _b64(np.int64([5]))}, "out of range"),
    ({"graph": _b64(np.int32([0])), "duration_ns": _b64(np.int64([0]))}, "out of range"),
    ({"graph": _b64(np.int32([0])), "duration_ns": _b64(np.int64([-7]))}, "out of range"),
    ({"graph": _b64(np.int32([0])), "duration_ns": _b64(np.int64([60 * 10**9 + 1]))}, "out of range"),
    ({"graph": _b64(np.int32([0])), "duration_ns": "not base64!"}, "not base64"),
    ({"graph": _b64(np.int32([0])), "duration_ns": _b64(np.int32([5]))}, "whole 8-byte rows"),
    ({"graph": [0], "duration_ns": [5]}, "base64 of at most"),
    ({"graph": _b64(np.int32([0]))}, "exactly the columns"),
    ({"graph": _b64(np.int32([0])), "duration_ns": _b64(np.int64([5])), "extra": ""}, "exactly the columns"),
    ([1, 2], "exactly the columns"),
    ({"graph": _b64(np.zeros(65537, np.int32)), "duration_ns": _b64(np.ones(65537, np.int64))}, "at most 65536 rows"),
])
def test_bad_untraced_columns_refuse_the_window(u, msg):
    with pytest.raises(WireError, match=msg) as e:
        _decode(_with_untraced(u))
    assert e.value.reason == "window"


def test_untraced_rows_at_their_limits_are_kept():
    u = {"graph": _b64(np.int32([-1, 0])), "duration_ns": _b64(np.int64([1, 60 * 10**9]))}
    back = _decode(_with_untraced(u))
    assert back.untraced["graph"].tolist() == [-1, 0] and back.untraced["duration_ns"].tolist() == [1, 60 * 10**9]
