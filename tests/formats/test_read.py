"""read_trace: dispatch by content, progress, and every bad file ends in one line naming the file."""

from __future__ import annotations

import gzip
import io
import json
import os
import zipfile

import numpy as np
import pytest

from graphmon.formats.read import ReadLimits, read_trace, write_trace
from graphmon.model.trace import TraceError

from tracefiles import KINETO, NATIVE, RAW, annotation, kernel, launch, meta_bytes, native_meta, npz_bytes, npz_with, write_json

def test_dispatch_by_content_not_extension(tmp_path):
    ev = [launch(1, 3), kernel(10, corr=3)]
    a = read_trace(write_json(tmp_path / "looks-like.npz", ev, gz=True), progress=False)
    b = read_trace(write_json(tmp_path / "plain.txt", None, raw="  \n" + json.dumps(ev)), progress=False)  # JSON array format
    assert len(a) == len(b) == 1
    native = tmp_path / "native.json"
    write_trace(a, native)
    os.replace(str(native) + "", native)  # save wrote exactly this name
    assert len(read_trace(native, progress=False)) == 1


def test_progress_bar(tmp_path, capsys):
    p = write_json(tmp_path / "p.json", [launch(1, 3), kernel(10, corr=3)])
    read_trace(p, progress=False)
    read_trace(p)  # small file: auto means no bar
    assert capsys.readouterr().err == ""
    read_trace(p, progress=True)
    assert capsys.readouterr().err != ""


def truncated_gzip() -> bytes:
    return KINETO.read_bytes()[:50_000]


def corrupt_gzip() -> bytes:
    b = bytearray(gzip.compress(json.dumps({"traceEvents": [kernel(10)]}).encode()))
    b[-6] ^= 0xFF  # CRC
    return bytes(b)


def huge_header_npz() -> bytes:
    # a valid zip whose npy header claims 10^12 int64 but stores 8 bytes
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    member = b"\x93NUMPY\x01\x00" + head.getvalue()[8:] + b"\0" * 8
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("start.npy", member)
    return buf.getvalue()


def native_with(tmp_path, **changes) -> bytes:
    """The native fixture with arrays replaced or (value None) removed."""
    return npz_with(NATIVE, **changes)


def raw_with(**changes) -> bytes:
    return npz_with(RAW, **changes)


BAD_FILES = {
    "empty": lambda tp: b"",
    "not-json": lambda tp: b"hello, this is not a trace\n",
    "json-garbage": lambda tp: b'{"traceEvents": [ {"ts": 1,, } ]}',
    "json-truncated": lambda tp: json.dumps({"traceEvents": [kernel(10)] * 5}).encode()[:-30],
    "json-extra-data": lambda tp: json.dumps({"traceEvents": [kernel(10)]}).encode() + b" {}",
    "json-scalar": lambda tp: b"[1, 2, 3]",
    "json-no-trace-events": lambda tp: json.dumps({"foo": [kernel(10)]}).encode(),
    "json-trace-events-not-list": lambda tp: json.dumps({"traceEvents": {"a": 1}}).encode(),
    "json-no-kernels": lambda tp: json.dumps({"traceEvents": [launch(1, 2), annotation(0, 5, "x")]}).encode(),
    "json-non-utf8": lambda tp: b'{"traceEvents": [{"name": "\xff\xfe"}]}',
    "json-5000-digit-int": lambda tp: b'{"traceEvents": [{"cat": "kernel", "ts": ' + b"9" * 5000 + b"}]}",
    "json-deep-nesting": lambda tp: b'{"traceEvents": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}",
    "gzip-truncated": lambda tp: truncated_gzip(),
    "gzip-corrupt-crc": lambda tp: corrupt_gzip(),
    "zip-truncated": lambda tp: NATIVE.read_bytes()[: NATIVE.stat().st_size // 2],
    "npz-unknown-keys": lambda tp: npz_bytes(x=np.arange(3)),
    "npz-pickled-object": lambda tp: (lambda b: b)(_pickled_npz()),
    "npz-huge-header": lambda tp: huge_header_npz(),
    "native-float-column": lambda tp: native_with(tp, k_start_ns=np.linspace(1, 2, 467_200)),
    "native-missing-column": lambda tp: native_with(tp, k_end_ns=None),
    "native-meta-not-object": lambda tp: native_with(tp, meta_json=meta_bytes([1, 2])),
    "native-meta-bad-version": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(version=99))),
    "native-meta-bad-graphs": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=[{"nope": 1}]))),
    "native-meta-graphs-int": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=5))),
    "native-meta-bad-upload-mode": lambda tp: native_with(tp, meta_json=meta_bytes(native_meta(graphs=[{"key": "a", "upload_mode": "x"}]))),
    "native-meta-not-utf8": lambda tp: native_with(tp, meta_json=np.frombuffer(b"\xff\xfe", np.uint8)),
    "raw-missing-start-length": lambda tp: raw_with(end=np.arange(5)),
    "raw-float-start": lambda tp: raw_with(start=np.zeros(467_200)),
    "raw-launch-key-out-of-range": lambda tp: raw_with(launch_correlation=np.array([[1, 99]])),
    "raw-no-kernels": lambda tp: raw_with(**{k: np.zeros(0, np.int64) for k in ("start", "end", "stream_id", "graph_id", "graph_node_id", "correlation_id", "name_id")}),
    "zstd": lambda tp: b"\x28\xb5\x2f\xfd" + b"\0" * 20,
}


def _pickled_npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, meta_json=np.array([{"a": 1}], dtype=object))
    return buf.getvalue()


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_raises_one_line_trace_error(case, tmp_path):
    p = tmp_path / f"{case}.trace"
    p.write_bytes(BAD_FILES[case](tmp_path))
    with pytest.raises(TraceError) as ei:
        read_trace(p, progress=False)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg and len(msg) < 500


def test_missing_file_directory_and_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block until a writer comes
    for p in (tmp_path / "nope.json", tmp_path, fifo):
        with pytest.raises(TraceError, match=str(p)):
            read_trace(p, progress=False)


def test_npz_size_cap(tmp_path):
    with pytest.raises(TraceError, match="limit"):
        read_trace(NATIVE, progress=False, limits=ReadLimits(max_decompressed_bytes=1 << 20))


def test_stream_and_kernel_caps(tmp_path):
    p = write_json(tmp_path / "s.json", [kernel(10 + i, stream=i, corr=1) for i in range(50)])
    with pytest.raises(TraceError, match="streams"):
        read_trace(p, progress=False, limits=ReadLimits(max_streams=10))
    with pytest.raises(TraceError, match="kernel events"):
        read_trace(p, progress=False, limits=ReadLimits(max_kernels=20))
    assert len(read_trace(p, progress=False, limits=ReadLimits(max_streams=50))) == 50
