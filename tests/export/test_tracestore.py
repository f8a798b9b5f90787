"""The /trace window store: bounded by count and bytes."""

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
