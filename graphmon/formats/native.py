"""graphmon's native trace format (docs/trace-format.md): the only code that knows it.

A compressed npz: the kernel columns as ``k_<column>``, the launch columns as ``l_<column>`` and
``meta_json`` (UTF-8 JSON: names, labels, graphs, invalid counts, free-form meta).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Mapping

import numpy as np

from graphmon.formats.common import ReadLimits, require_int
from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, GraphInfo, Trace, TraceError

FORMAT_NAME = "graphmon-trace"
FORMAT_VERSION = 1


def write_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` to ``path`` atomically (the inverse of ``formats.read.read_trace``)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as fh:
        write_trace_to(trace, fh)
    os.replace(tmp, path)  # never leave a half-written trace under the real name


def write_trace_to(trace: Trace, fh) -> None:
    """Write the native format (a compressed npz) to a binary file object."""
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "names": list(trace.names),
        "labels": list(trace.labels),
        "graphs": [asdict(g) for g in trace.graphs],
        "invalid": dict(trace.invalid),
        "meta": dict(trace.meta),
    }
    arrays = {f"k_{k}": getattr(trace, k) for k in KERNEL_COLUMNS}
    arrays.update({f"l_{k}": v for k, v in trace.launches.items()})
    arrays["meta_json"] = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    np.savez_compressed(fh, **arrays)


def is_native(arrays: Mapping[str, np.ndarray]) -> bool:
    return "meta_json" in arrays


def read_native(arrays: Mapping[str, np.ndarray], source: str = "", limits: ReadLimits | None = None) -> Trace:
    """A Trace from the arrays of a native npz (``np.load`` of a file written by write_trace)."""
    limits = limits or ReadLimits()
    arrays = dict(arrays)
    for k in KERNEL_COLUMNS:
        require_int(arrays, f"k_{k}")
    for k in LAUNCH_COLUMNS:
        require_int(arrays, f"l_{k}")
    if arrays["meta_json"].dtype != np.uint8:
        raise TraceError("meta_json must be uint8 bytes")
    try:
        return _from_arrays(arrays, source)
    except TraceError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        # _from_arrays trusts meta_json's shape (a dict of lists); a hostile one may be anything.
        raise TraceError(f"bad graphmon trace metadata: {type(e).__name__}: {e}") from None


def _from_arrays(arrays: Mapping[str, np.ndarray], source: str) -> Trace:
    try:
        meta = json.loads(bytes(arrays["meta_json"]).decode())
    except (KeyError, ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"not a graphmon trace (bad meta_json: {e})") from None
    if meta.get("format") != FORMAT_NAME:
        raise TraceError("not a graphmon trace (format tag missing)")
    if meta.get("version") != FORMAT_VERSION:
        raise TraceError(f"unsupported graphmon trace version {meta.get('version')!r}")
    try:
        kcols = {k: arrays[f"k_{k}"] for k in KERNEL_COLUMNS}
        lcols = {k: arrays[f"l_{k}"] for k in LAUNCH_COLUMNS}
        graphs = [GraphInfo(**g) for g in meta["graphs"]]
        names, labels = meta["names"], meta["labels"]
    except KeyError as e:
        raise TraceError(f"graphmon trace is missing {e.args[0]!r}") from None
    except TypeError as e:
        raise TraceError(f"graphmon trace has bad graph metadata: {e}") from None
    m = dict(meta.get("meta") or {})
    if source:
        m.setdefault("source", source)
    return Trace.build(
        **kcols,
        names=names,
        launches=lcols,
        graphs=graphs,
        labels=labels,
        invalid={str(k): int(v) for k, v in (meta.get("invalid") or {}).items()},
        meta=m,
    )
