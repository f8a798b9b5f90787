"""graphmon native format: written by formats.native, read back unchanged; the bundled fixture."""

from __future__ import annotations

import pytest

from graphmon.formats.native import write_trace
from graphmon.formats.read import read_trace

from tracefiles import BUNDLED, NATIVE, RAW, assert_same_trace

@pytest.fixture(scope="module")
def raw_trace():
    return read_trace(RAW, progress=False)


def test_native_fixture_is_the_raw_conversion(raw_trace):
    native = read_trace(NATIVE, progress=False)
    assert_same_trace(raw_trace, native, meta=False)
    assert native.meta["format"] == "cupti-npz"
    assert BUNDLED.read_bytes() == NATIVE.read_bytes()
    assert BUNDLED.stat().st_size < 4_000_000


def test_native_round_trip_all_columns(raw_trace, tmp_path):
    p = tmp_path / "rt.npz"
    write_trace(raw_trace, p)
    assert_same_trace(raw_trace, read_trace(p, progress=False))
