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
