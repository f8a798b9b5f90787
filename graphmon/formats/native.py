"""graphmon's native trace format (docs/trace-format.md): the only code that knows it.

A compressed npz: the kernel columns as ``k_<column>``, the launch columns as ``l_<column>``,
``meta_json`` (UTF-8 JSON: names, labels, graphs, invalid counts, free-form meta) and, optionally,
the untraced replay durations as ``u_<column>`` (graphmon.model.window.UNTRACED_COLUMNS; a file
without them has none: the members were added without a version change, see docs/trace-format.md).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import asdict
from functools import lru_cache
from typing import Annotated, Any, Literal, Mapping, Optional

import numpy as np

from graphmon.formats.common import ReadLimits, check_counts, require_int
from graphmon.formats.jsonstream import JsonStream
from graphmon.model.invalid import INVALID_REASONS
from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS, UPLOAD_MODES, GraphInfo, Trace, TraceError
from graphmon.model.window import UNTRACED_COLUMNS, no_untraced

FORMAT_NAME = "graphmon-trace"
FORMAT_VERSION = 1


def write_trace(trace: Trace, path: str | os.PathLike, untraced: Optional[Mapping[str, np.ndarray]] = None) -> None:
    """Write ``trace`` to ``path`` atomically (the inverse of ``formats.read.read_trace``; with
    ``untraced`` rows, of ``read_trace_untraced``)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as fh:
        write_trace_to(trace, fh, untraced)
    os.replace(tmp, path)  # never leave a half-written trace under the real name


def write_trace_to(trace: Trace, fh, untraced: Optional[Mapping[str, np.ndarray]] = None) -> None:
    """Write the native format (a compressed npz) to a binary file object; ``untraced``:
    UNTRACED_COLUMNS whose ``graph`` indexes ``trace.graphs`` (written only when it has rows)."""
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
    if untraced is not None and len(untraced["duration_ns"]):
        arrays.update({f"u_{k}": np.asarray(untraced[k], t) for k, t in UNTRACED_COLUMNS.items()})
    np.savez_compressed(fh, **arrays)


def is_native(arrays: Mapping[str, np.ndarray]) -> bool:
    return "meta_json" in arrays


# ---------------------------------------------------------------------- meta_json schema
# Strict: a float, bool or list where an int or str belongs is refused, not coerced. Written
# files always pass; anything else came from another tool or was tampered with. Built on first
# use: pydantic is ~100 ms of imports that reading a Kineto or nsys trace never needs.
@lru_cache(maxsize=1)
def _meta_model():
    from pydantic import BaseModel, ConfigDict, Field

    count = Annotated[int, Field(strict=True, ge=0)]

    class _GraphMeta(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        key: str
        graph_id: int = -1
        exec_handle: int = Field(0, ge=0)
        upload_mode: Literal[UPLOAD_MODES] = "unknown"  # type: ignore[valid-type]
        upload_stream: int = -1
        label: str = ""
        batch_size: int = -1
        upload_stream_is_launch_stream: Optional[bool] = None

    class _Meta(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")  # later minor additions are ignored
        format: Literal["graphmon-trace"]
        version: int
        names: list[str]
        labels: list[str]
        graphs: list[_GraphMeta]
        invalid: dict[Literal[INVALID_REASONS], count] = {}  # type: ignore[valid-type]
        meta: dict[str, Any] = {}

    return _Meta


@lru_cache(maxsize=1)
def _chrome_model():
    """The graphmonTrace object of graphmon's Chrome export (formats.chrome): the same graph
    metadata as meta_json's, the window's invalid counts and its untraced replay durations."""
    from pydantic import BaseModel, ConfigDict

    graph = _meta_model().model_fields["graphs"].annotation.__args__[0]
    count = _meta_model().model_fields["invalid"].annotation

    class _Untraced(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        graph: list[int]
        duration_ns: list[int]

    class _Chrome(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")
        graphs: list[graph]  # type: ignore[valid-type]
        invalid_records: count = {}  # type: ignore[valid-type]
        untraced: Optional[_Untraced] = None

    return _Chrome


def graphmon_chrome_metadata(doc: Any, limits: ReadLimits) -> tuple[list[GraphInfo], dict[str, int], dict[str, np.ndarray]]:
    """(graphs, invalid counts, untraced rows) of a Chrome export's graphmonTrace object; TraceError
    if malformed (the rows checked as the native format's)."""
    from pydantic import ValidationError

    if isinstance(doc, dict) and isinstance(doc.get("graphs"), list) and len(doc["graphs"]) > limits.max_graphs:
        raise TraceError(f"graphmonTrace: more than {limits.max_graphs} graphs (limit)")
    try:
        m = _chrome_model().model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise TraceError(f"bad graphmonTrace metadata at {where}: {err['msg']}") from None
    untraced = no_untraced()
    if m.untraced is not None:
        try:
            cols = {f"u_{k}": np.array(getattr(m.untraced, k), np.int64) for k in UNTRACED_COLUMNS}
        except OverflowError:
            raise TraceError("graphmonTrace.untraced: a value beyond 64 bits") from None
        try:
            untraced = read_native_untraced(cols, len(m.graphs), limits)
        except TraceError as e:
            raise TraceError(f"graphmonTrace.untraced: {e}") from None
    return [GraphInfo(**g.model_dump()) for g in m.graphs], dict(m.invalid_records), untraced


def _parse_meta(raw: bytes, limits: ReadLimits) -> dict[str, Any]:
    """meta_json -> dict, element by element for the long lists, so a few compressed kilobytes
    that expand to millions of names are refused at the limit instead of built first."""
    src = io.BytesIO(raw)
    js = JsonStream(src, src, limits, lambda: None, exact=False)
    caps = {"names": (limits.max_names, "kernel names"), "labels": (limits.max_names, "launch labels"), "graphs": (limits.max_graphs, "graphs")}
    out: dict[str, Any] = {}
    js.expect("{")
    for key in js.members():
        out[key] = list(js.items(*caps[key])) if key in caps and js.peek() == "[" else js.value()
    js.end()
    return out


def _validated_meta(raw: bytes, limits: ReadLimits):
    try:
        doc = _parse_meta(raw, limits)
    except TraceError as e:
        raise TraceError(f"bad meta_json: {e}") from None
    if doc.get("format") != FORMAT_NAME:
        raise TraceError("not a graphmon trace (format tag missing)")
    if doc.get("version") != FORMAT_VERSION:
        raise TraceError(f"unsupported graphmon trace version {str(doc.get('version'))[:40]!r}")
    from pydantic import ValidationError

    try:
        meta = _meta_model().model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise TraceError(f"bad graphmon trace metadata at {where}: {err['msg']} ({e.error_count()} error(s))") from None
    try:  # JSON escapes can hold lone surrogates: text no label, file or log can carry
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise TraceError("bad graphmon trace metadata: a string holds a lone surrogate (not valid Unicode text)") from None
    if len(meta.names) + len(meta.labels) > limits.max_names:
        raise TraceError(f"more than {limits.max_names} kernel names and labels (limit)")
    return meta


def read_native_untraced(arrays: Mapping[str, np.ndarray], n_graphs: int,
                         limits: ReadLimits | None = None) -> dict[str, np.ndarray]:
    """The untraced replay durations of a native npz (empty for a file without them); ``n_graphs``:
    the trace's graphs, which ``graph`` indexes. TraceError for malformed rows (one line)."""
    keys = [f"u_{k}" for k in UNTRACED_COLUMNS]
    if not any(k in arrays for k in keys):
        return no_untraced()
    cols = {k: require_int(dict(arrays), f"u_{k}") for k in UNTRACED_COLUMNS}
    g, d = cols["graph"], cols["duration_ns"]
    if len(g) != len(d):
        raise TraceError(f"untraced columns differ in length ({len(g)} graph, {len(d)} duration_ns)")
    check_counts(limits or ReadLimits(), kernels=len(d))  # one row per replay: never more than records
    if len(g) and (g.min() < -1 or g.max() >= n_graphs):
        raise TraceError(f"u_graph must index the trace's {n_graphs} graphs (or be -1)")
    if len(d) and d.min() <= 0:
        raise TraceError("u_duration_ns must be > 0")
    return {k: cols[k].astype(t) for k, t in UNTRACED_COLUMNS.items()}


def read_native(arrays: Mapping[str, np.ndarray], source: str = "", limits: ReadLimits | None = None) -> Trace:
    """A Trace from the arrays of a native npz (``np.load`` of a file written by write_trace).

    Raises TraceError (one line) for anything but a well-formed file within ``limits``."""
    limits = limits or ReadLimits()
    arrays = dict(arrays)
    kcols = {k: require_int(arrays, f"k_{k}") for k in KERNEL_COLUMNS}
    lcols = {k: require_int(arrays, f"l_{k}") for k in LAUNCH_COLUMNS}
    if "meta_json" not in arrays or arrays["meta_json"].dtype != np.uint8 or arrays["meta_json"].ndim != 1:
        raise TraceError("meta_json must be 1-D uint8 bytes")
    check_counts(limits, kernels=max(len(kcols["start_ns"]), len(lcols["correlation_id"])))
    meta = _validated_meta(arrays["meta_json"].tobytes(), limits)
    check_counts(limits, graphs=len(meta.graphs), streams=len(np.unique(kcols["stream"])))
    m = dict(meta.meta)
    if source:
        m.setdefault("source", source)
    try:
        return Trace.build(
            **kcols,
            names=meta.names,
            launches=lcols,
            graphs=[GraphInfo(**g.model_dump()) for g in meta.graphs],
            labels=meta.labels,
            invalid=dict(meta.invalid),
            meta=m,
        )
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceError(f"bad graphmon trace: {type(e).__name__}: {e}") from None
