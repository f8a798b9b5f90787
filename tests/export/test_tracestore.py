"""The /trace window store: bounded by count and bytes."""

import numpy as np

from graphmon.export.tracestore import TraceStore

from helpers import synthetic_trace


def test_trace_store_bounds_count_and_bytes():
    t = synthetic_trace()
    size = TraceStore.size_of(t)
    st = TraceStore(max_count=3, max_bytes=size * 2)
    for i in range(5):
        st.put(f"w{i}", t)
    assert st.ids() == ["w3", "w4"]
    assert st.nbytes <= size * 2
    assert st.evicted == 3
    st0 = TraceStore(max_count=0, max_bytes=10**9)
    st0.put("a", t)
    assert st0.get("a") is None


def test_untraced_rows_are_kept_with_their_window_and_counted_in_the_bytes():
    from graphmon.export.tracestore import SharedTraceStore

    from helpers import untraced

    t = synthetic_trace()
    rows = untraced([0, -1, 0], [500, 600, 700])  # 3 x (4 + 8) bytes
    size = TraceStore.size_of(t)
    assert TraceStore.size_of(t, rows) == size + 36
    st = TraceStore(max_count=8, max_bytes=size + 36)
    st.put("w1", t, {"graph": np.array([0, -1, 0], np.int64), "duration_ns": rows["duration_ns"]})
    e = st.entry("w1")
    assert e[0] is t and st.get("w1") is t and st.nbytes == size + 36
    assert e[1]["graph"].dtype == np.int32 and e[1]["graph"].tolist() == [0, -1, 0]  # as the native format stores it
    assert e[1]["duration_ns"].tolist() == [500, 600, 700]
    st.put("w2", t)  # no rows: none kept, nothing counted; the rows' bytes evict w1
    assert st.ids() == ["w2"] and st.nbytes == size and len(st.entry("w2")[1]["graph"]) == 0
    st.put("w3", t, untraced([0] * 4, [1] * 4))  # over the byte cap with its rows: not kept
    assert st.entry("w3") is None and st.evicted == 2
    sh = SharedTraceStore(max_count=4, max_bytes=2 * size + 36)
    a, b = sh.view("r0"), sh.view("r1")
    a.put("w1", t, rows)
    b.put("w1", t)
    assert a.entry("w1")[1]["duration_ns"].tolist() == [500, 600, 700] and len(b.entry("w1")[1]["graph"]) == 0
    assert a.nbytes == size + 36 and sh.nbytes == 2 * size + 36
    b.put("w2", t, rows)  # the oldest window goes, whoever owns it, with its rows' bytes
    assert a.entry("w1") is None and sh.nbytes == 2 * size + 36 and b.entry("w2")[1]["graph"].tolist() == [0, -1, 0]
    sh.drop("r1")
    assert sh.nbytes == 0
