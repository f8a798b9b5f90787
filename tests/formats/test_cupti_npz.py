"""Raw CUPTI probe npz reader on the real H200 records."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import numpy as np
import pytest

from graphmon.formats.cupti_npz import RAW_CUPTI_OFFSET_NS
from graphmon.formats.read import read_trace

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
