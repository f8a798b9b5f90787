"""Builders and constants shared by the trace-format tests (tests/formats/)."""


from __future__ import annotations


import gzip
import io
import json
from pathlib import Path


import numpy as np


from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, Trace


from helpers import DATA


KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"
RAW = DATA / "h200-cupti-decode-v1.npz"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"
BUNDLED = DATA.parent.parent / "graphmon" / "data" / "h200-decode.graphmon.npz"


def us_str_to_ns(s: str) -> int:
    """Kineto µs text -> ns by string arithmetic only (no float, no Decimal)."""
    neg = s.startswith("-")
    s = s.lstrip("-")
    whole, _, frac = s.partition(".")
    assert len(frac) <= 3, s
    ns = int(whole) * 1000 + int((frac + "000")[:3])
    return -ns if neg else ns


def assert_same_trace(a: Trace, b: Trace, meta: bool = True) -> None:
    for k in list(KERNEL_COLUMNS) + ["graph"]:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
        assert getattr(a, k).dtype == getattr(b, k).dtype, k
    for k in LAUNCH_COLUMNS:
        np.testing.assert_array_equal(a.launches[k], b.launches[k], err_msg=f"launches.{k}")
    assert a.names == b.names
    assert a.labels == b.labels
    assert a.graphs == b.graphs
    assert dict(a.invalid) == dict(b.invalid)
    if meta:
        assert dict(a.meta) == dict(b.meta)


# Kineto events
def kernel(ts, dur=1.5, stream=7, corr=1, device=0, name="k", **extra):
    e = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
         "args": {"device": device, "stream": stream, "correlation": corr}}
    e.update(extra)
    return e


def launch(ts, corr, name="cudaGraphLaunch", cat="cuda_runtime", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 5, "args": {"correlation": corr}}


def annotation(ts, dur, name, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def without(e: dict, key: str) -> dict:
    return {k: v for k, v in e.items() if k != key}


def write_json(path: Path, events, gz=False, top=None, raw: str | None = None) -> Path:
    text = raw if raw is not None else json.dumps(dict(top or {}, traceEvents=events))
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


# npz files
def npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def npz_with(path, **changes) -> bytes:
    """An npz fixture with arrays replaced or (value None) removed."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    return npz_bytes(**arrays)


def meta_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), np.uint8)


def native_meta(**over):
    with np.load(NATIVE, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta_json"]).decode())
    meta.update(over)
    return meta
