"""Trace model: validation of hostile inputs (found by the reader fuzz tests)."""

import numpy as np
import pytest

from graphmon.model.trace import GraphInfo, Trace, TraceError


def kernels(**over):
    cols = dict(start_ns=[10, 20], end_ns=[11, 21], stream=[1, 1], correlation_id=[5, 5])
    cols.update(over)
    return cols


def test_name_id_must_index_the_name_table_even_when_it_is_empty():
    with pytest.raises(TraceError, match="name_id"):
        Trace.build(**kernels(name_id=[1, 1]), names=[])
    # -1 (no name) stays valid without a table
    assert len(Trace.build(**kernels(name_id=[-1, -1]), names=[])) == 2


@pytest.mark.parametrize("col", ["graph", "label"])
def test_launch_indexes_below_minus_one_are_refused(col):
    with pytest.raises(TraceError, match="out of range"):
        Trace.build(**kernels(), launches={"correlation_id": [5], col: [-2]}, graphs=[GraphInfo(key="a")], labels=["x"])


def test_signature_of_names_with_lone_surrogates():
    # a JSON "\ud800" escape decodes to a str that UTF-8 cannot encode; identity must not crash
    t = Trace.build(**kernels(name_id=[0, 0]), names=["a\ud800"], launches={"correlation_id": [5]})
    assert len(t.graphs) == 1 and t.graphs[0].key.startswith("sig:")
    assert np.array_equal(t.graph, [0, 0])
