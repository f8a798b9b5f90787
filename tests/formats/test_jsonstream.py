"""The incremental JSON reader: values split across read chunks, the per-value and total caps."""

from __future__ import annotations

import gzip

import pytest

from graphmon.formats.read import ReadLimits, read_trace
from graphmon.model.trace import TraceError

from tracefiles import kernel, launch, write_json

def test_event_split_across_read_chunks(tmp_path):
    # > 1 MiB of padding events so kernels straddle the reader's chunk boundaries
    pad = [{"ph": "i", "cat": "pad", "name": "x" * 1000, "ts": i} for i in range(3000)]
    ev = [launch(1, 3)] + [e for i in range(500) for e in (pad[i], kernel(10 + i, corr=3, name=f"k{i % 7}"))] + pad[500:]
    t = read_trace(write_json(tmp_path / "big.json.gz", ev, gz=True), progress=False)
    assert len(t) == 500
    assert sorted(t.start_ns.tolist()) == [(10 + i) * 1000 for i in range(500)]


def test_decompression_bomb_is_capped(tmp_path):
    # 64 MiB of whitespace inside the events list compresses to ~64 kB
    raw = b'{"traceEvents": [' + b" " * (64 << 20) + b"]}"
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(raw, compresslevel=9))
    assert p.stat().st_size < 200_000
    with pytest.raises(TraceError, match="limit"):
        read_trace(p, progress=False, limits=ReadLimits(max_decompressed_bytes=8 << 20))


def test_one_huge_event_is_capped(tmp_path):
    p = write_json(tmp_path / "h.json", [kernel(10, name="x" * (3 << 20))])
    with pytest.raises(TraceError, match="larger than"):
        read_trace(p, progress=False, limits=ReadLimits(max_event_bytes=1 << 20))


class _Chunks:
    """A binary stream that returns at most ``size`` bytes per read: every split point is hit."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    def read(self, n: int = -1) -> bytes:
        out = self.data[self.at : self.at + self.size]
        self.at += len(out)
        return out


def _each(text: str, size: int):
    from graphmon.formats.jsonstream import JsonStream

    raw = _Chunks(text.encode(), size)
    js = JsonStream(raw, raw, ReadLimits(), lambda: None)
    js.expect("[")
    got = []
    js.each(got.append)
    js.end()
    return got


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_each_matches_json_loads_at_every_split(size):
    """The fast path and the careful one give the same elements, in order, whatever the read
    sizes: numbers that end a chunk, nested arrays, strings with ] and , in them."""
    import json

    from graphmon.formats.jsonstream import FloatText

    text = '[ 1, 22 ,{"a": [1, 2, "],"], "ts": 12.5} , [], "x]", 123456789,\n -7.25e3 ,{"b":{}} ]  '
    got = _each(text, size)
    assert got == json.loads(text, parse_float=str)  # floats kept as their text, exactly
    assert type(got[2]["ts"]) is FloatText and type(got[6]) is FloatText


@pytest.mark.parametrize("size", [1, 5, 64, 1 << 20])
def test_each_skips_what_the_pattern_matches_and_decodes_the_rest(size):
    """Kineto flow events are passed over undecoded; one with another layout, or invalid
    JSON that merely looks like one, is decoded (or refused) as before."""
    import json

    from graphmon.formats.jsonstream import JsonStream
    from graphmon.formats.kineto import FLOW_EVENT

    def load(t):
        return json.loads(t, parse_float=str)

    flow = '{\n "ph": "f", "id": 367, "pid": 0, "tid": 142, "ts": 5351128125842.938,\n "cat": "ac2g", "name": "ac2g", "bp": "e"\n}'
    other = '{"cat": "ac2g", "ph": "s", "name": "ac2g", "id": 1, "ts": 1.5}'  # a layout Kineto does not write
    text = f"[{flow}, 1, {flow},{other}, {flow}]\n"
    raw = _Chunks(text.encode(), size)
    js = JsonStream(raw, raw, ReadLimits(), lambda: None)
    js.expect("[")
    got = []
    skipped = js.each(got.append, skip=FLOW_EVENT)
    # at a chunk edge a flow event may go through the careful path instead: decoded, never lost
    assert skipped + len(got) == 5
    assert [x for x in got if x != load(flow)] == [1, load(other)]
    if size == 1 << 20:
        assert skipped == 3 and got == [1, load(other)]
    bad = flow.replace('"id": 367', '"id": 0367')  # not JSON: the pattern must not hide it
    raw = _Chunks(f"[{bad}]".encode(), size)
    js = JsonStream(raw, raw, ReadLimits(), lambda: None)
    js.expect("[")
    with pytest.raises(TraceError):
        js.each(got.append, skip=FLOW_EVENT)


@pytest.mark.parametrize("text, msg, want", [("[1 2]", "expected", [1]), ("[1,]", "expecting a value", [1]),
                                             ("[1, 2", "expected", [1, 2])])
def test_each_refuses_bad_arrays_and_calls_back_once_per_element(text, msg, want):
    calls = []
    from graphmon.formats.jsonstream import JsonStream

    for size in (1, 1 << 20):
        raw = _Chunks(text.encode(), size)
        js = JsonStream(raw, raw, ReadLimits(), lambda: None)
        js.expect("[")
        calls.clear()
        with pytest.raises(TraceError, match=msg):
            js.each(calls.append)
        assert calls == want  # each element once: a fast-path miss never calls back twice
