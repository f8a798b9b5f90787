"""Plain JSON from analysis results: one rule for floats that JSON cannot hold."""

from __future__ import annotations

import dataclasses
import math

import numpy as np


def json_safe(v):
    """``v`` with every NaN/inf float replaced by None (JSON null, as JavaScript and orjson write
    them), numpy scalars and arrays made plain, dataclasses and tuples turned into dicts and lists.
    Strict parsers reject NaN/Infinity; a string such as "inf" would break a number column."""
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.ndarray):
        return json_safe(v.tolist())
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return json_safe(dataclasses.asdict(v))
    return v
