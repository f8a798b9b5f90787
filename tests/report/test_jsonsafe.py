"""report/jsonsafe.py: one rule for non-finite floats in every JSON graphmon writes."""

import json
import math
from dataclasses import dataclass

import numpy as np

from graphmon.report.jsonsafe import json_safe


@dataclass
class Row:
    x: float
    arr: np.ndarray


def test_non_finite_floats_become_null_everywhere():
    doc = {"a": math.inf, "b": -math.inf, "c": math.nan, "d": [1.5, np.float64("nan"), (np.int64(3), np.float32(2))],
           "e": Row(np.inf, np.array([1, 2])), "s": "inf"}
    out = json_safe(doc)
    assert out == {"a": None, "b": None, "c": None, "d": [1.5, None, [3, 2.0]], "e": {"x": None, "arr": [1, 2]},
                   "s": "inf"}
    json.dumps(out, allow_nan=False)  # strict JSON


def test_compare_and_ab_json_agree_on_infinity():
    """rel_shift is inf over a zero baseline: compare once wrote "inf", ab wrote null."""
    from graphmon.analysis.significance import Thresholds, shift_test

    r = shift_test(np.zeros(6), np.full(6, 500.0), Thresholds(min_replays=2))
    assert r["rel_shift"] == math.inf and json_safe(r)["rel_shift"] is None
