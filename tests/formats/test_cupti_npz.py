"""Raw CUPTI probe npz reader on the real H200 records."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import numpy as np
import pytest

from graphmon.formats.cupti_npz import RAW_CUPTI_OFFSET_NS
from graphmon.formats.read import ReadLimits, read_trace
from graphmon.model.trace import TraceError

from tracefiles import RAW

@pytest.fixture(scope="module")
def raw_arrays():
    with np.load(RAW, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def raw_trace():
    return read_trace(RAW, progress=False)


def test_raw_cupti(raw_arrays, raw_trace):
    z = raw_arrays
    assert len(raw_trace) == len(z["start"]) == 467_200
    assert raw_trace.invalid_total == 0
    np.testing.assert_array_equal(raw_trace.start_ns, z["start"] + RAW_CUPTI_OFFSET_NS)
    np.testing.assert_array_equal(raw_trace.end_ns, z["end"] + RAW_CUPTI_OFFSET_NS)
    assert raw_trace.start_ns.min() > 0
    np.testing.assert_array_equal(raw_trace.stream, z["stream_id"])
    np.testing.assert_array_equal(raw_trace.correlation_id, z["correlation_id"])
    np.testing.assert_array_equal(raw_trace.graph_node_id, z["graph_node_id"])
    assert raw_trace.names == tuple(z["names"].tolist())


    keys = z["graph_keys"].tolist()
    key_of_corr = {int(c): keys[k] for c, k in z["launch_correlation"].tolist()}
    kernels_per_launch = Counter(z["correlation_id"].tolist())
    streams = defaultdict(set)
    gids = defaultdict(set)
    for c, s, g in zip(z["correlation_id"].tolist(), z["stream_id"].tolist(), z["graph_id"].tolist()):
        streams[c].add(s)
        gids[key_of_corr[c]].add(g)
    for c, n in kernels_per_launch.items():
        chain = key_of_corr[c].startswith("chain/")
        assert n == (1000 if chain else 960)
        assert len(streams[c]) == (1 if chain else 4)


    by_label = {g.label: g for g in raw_trace.graphs}
    assert sorted(by_label) == sorted(keys)
    for i, k in enumerate(keys):
        g = by_label[k]
        (gid,) = gids[k]
        assert g.key == f"g{gid}" and g.graph_id == gid
        assert g.exec_handle == int(z["exec_handles"][i])
        assert g.upload_mode == ("uploaded" if k.endswith("/upload") else "lazy")
    # every kernel lands in the graph of its launch's key
    labels = [raw_trace.graphs[g].label for g in raw_trace.graph.tolist()]
    assert labels == [key_of_corr[c] for c in z["correlation_id"].tolist()]
    # launch rows: the launches whose kernels were traced, graph index by key, no CPU timestamp
    tl = raw_trace.launches
    assert sorted(tl["correlation_id"].tolist()) == sorted(kernels_per_launch)
    for c, g in zip(tl["correlation_id"].tolist(), tl["graph"].tolist()):
        assert raw_trace.graphs[g].label == key_of_corr[c]
    assert set(tl["launch_ns"].tolist()) == {-1}
    assert raw_trace.meta["launches_outside_kernel_trace"] == len(key_of_corr) - len(kernels_per_launch)
    # event_ms_* summaries: medians per key and phase
    med = raw_trace.meta["event_ms_median"]
    for name, arr in z.items():
        if name.startswith("event_ms_"):
            phase = name[len("event_ms_"):]
            for i, k in enumerate(keys):
                assert med[phase][k] == pytest.approx(statistics.median(arr[i].tolist()), rel=0, abs=1e-12)


def many_keys_npz(path, n_keys: int):
    """One launch of one kernel per graph key, each key its own CUPTI graph id."""
    i = np.arange(n_keys, dtype=np.int64)
    np.savez(path, start=1000 + 10 * i, end=1005 + 10 * i, stream_id=np.full(n_keys, 7, np.int32),
             graph_id=(i + 1).astype(np.int32), graph_node_id=i, correlation_id=i + 1, name_id=np.zeros(n_keys, np.int32),
             names=np.array(["k"]), launch_correlation=np.stack([i + 1, i], axis=1), graph_keys=np.array([f"g/{k}" for k in range(n_keys)]),
             exec_handles=i + 100)
    return path


def test_many_graph_keys_take_one_pass(tmp_path, monkeypatch):
    """100k graph keys took 80 s: a pass over every kernel per key. Now the work per key is O(1):
    np.isin (the per-key pass) is called a fixed number of times, whatever the number of keys."""
    calls = []
    real_isin = np.isin
    monkeypatch.setattr(np, "isin", lambda *a, **k: calls.append(1) or real_isin(*a, **k))
    t = read_trace(many_keys_npz(tmp_path / "many.npz", 3000), progress=False)
    assert len(calls) <= 3
    assert len(t.graphs) == 3000 and len(t) == 3000
    assert [g.graph_id for g in t.graphs] == list(range(1, 3001))
    assert [t.graphs[g].label for g in t.graph.tolist()] == [f"g/{k}" for k in range(3000)]
    assert [g.exec_handle for g in t.graphs[:3]] == [100, 101, 102]


def test_limits_apply_to_raw_cupti(tmp_path):
    p = many_keys_npz(tmp_path / "m.npz", 50)
    with pytest.raises(TraceError, match="graphs"):
        read_trace(p, progress=False, limits=ReadLimits(max_graphs=10))
    with pytest.raises(TraceError, match="kernel records"):
        read_trace(p, progress=False, limits=ReadLimits(max_kernels=10))
    with pytest.raises(TraceError, match="names"):
        read_trace(RAW, progress=False, limits=ReadLimits(max_names=5))
