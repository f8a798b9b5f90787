"""/trace bodies: one render per (window, format), shared; renders at most a quarter of a core (issue 18: 1, 6)."""

import asyncio
import time

import pytest
from fastapi import HTTPException

import graphmon.export.tracebodies as tb

from helpers import synthetic_trace


def test_concurrent_downloads_of_one_window_share_one_render(monkeypatch):
    calls = []

    def slow_render(t, fmt, *_):
        calls.append(fmt)
        time.sleep(0.05)
        return b"x" * 1000

    monkeypatch.setattr(tb, "render_trace", slow_render)
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), None) if i == "w1" else None, 10**6, 100)

    async def main():
        return await asyncio.gather(*[bodies._body("w1", "chrome") for _ in range(20)])

    out = asyncio.run(main())
    assert len(calls) == 1 and all(o is out[0] for o in out)  # one body object shared by all


def test_renders_keep_to_a_quarter_of_a_core(monkeypatch):
    spans = []

    def render(t, fmt, *_):
        t0 = time.monotonic()
        time.sleep(0.1)
        spans.append((t0, time.monotonic()))
        return b"y" * 10

    monkeypatch.setattr(tb, "render_trace", render)
    monkeypatch.setattr(tb, "RENDER_BURST_S", 0.0)
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), None), 0, 100)  # no cache: every request renders

    async def main():
        for i in range(4):
            await bodies._body(f"w{i}", "chrome")

    asyncio.run(main())
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):  # old code: back to back (duty 1.0)
        assert (a1 - a0) / (b0 - a0) <= tb.RENDER_DUTY * 1.1


def test_over_budget_is_429_not_a_queue(monkeypatch):
    monkeypatch.setattr(tb, "MAX_RENDER_WAIT_S", 0.0)
    monkeypatch.setattr(tb, "RENDER_BURST_S", 0.0)
    monkeypatch.setattr(tb, "render_trace", lambda t, fmt, *_: (time.sleep(0.05), b"z")[1])
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), None), 0, 100)

    async def main():
        await bodies._body("a", "chrome")
        with pytest.raises(HTTPException) as e:
            await bodies._body("b", "chrome")
        return e.value

    err = asyncio.run(main())
    assert err.status_code == 429 and "Retry-After" in err.headers


def test_gzip_downloads_share_one_render_and_one_compression(monkeypatch):
    import gzip

    calls = []
    body = b'{"traceEvents":[' + b'{"ph":"X","name":"k"},' * 5000 + b'{}]}'

    def render(t, fmt, *_):
        calls.append(fmt)
        time.sleep(0.05)
        return body

    monkeypatch.setattr(tb, "render_trace", render)
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), None) if i == "w1" else None, 10**7, 100)

    async def main():
        gz = await asyncio.gather(*[bodies._body("w1", "chrome", gzip=True) for _ in range(10)])
        return gz, await bodies._body("w1", "chrome")

    gz, plain = asyncio.run(main())
    assert calls == ["chrome"] and bodies.renders == 1 and bodies.compressions == 1
    assert all(g is gz[0] for g in gz) and plain is body and gzip.decompress(gz[0]) == body
    assert len(gz[0]) * 20 < len(body)


def test_a_cut_is_read_from_the_gzipped_body_too():
    import gzip

    head = b'{"graphmonTruncated":{"kernels":9,"kernels_kept":4,"why":"x"},"traceEvents":[]}'
    assert tb.truncation(gzip.compress(head + b" " * 100_000), gzipped=True) == tb.truncation(head) == {
        "kernels": 9, "kernels_kept": 4, "why": "x"}
    assert tb.truncation(gzip.compress(b'{"traceEvents":[]}'), gzipped=True) is None


def test_the_native_format_is_never_gzipped(monkeypatch):
    monkeypatch.setattr(tb, "render_trace", lambda t, fmt, *_: b"PK" + b"x" * 100)
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), None), 10**6, 100)

    async def main():
        return await bodies.response("w1", "graphmon", gzip=True)

    r = asyncio.run(main())
    assert "content-encoding" not in r.headers and bodies.compressions == 0
    bodies._release()  # the response was not sent: its download slot by hand


def test_the_bodies_carry_the_untraced_rows_the_lookup_gives(tmp_path):
    from graphmon.formats.read import read_trace_untraced

    from helpers import untraced

    rows = untraced([0, -1], [1_500, 2_500])
    bodies = tb.TraceBodies(lambda i: (synthetic_trace(), rows if i == "w1" else None), 10**6, 100)
    for wid, want in (("w1", [1_500, 2_500]), ("w2", [])):
        (tmp_path / f"{wid}.npz").write_bytes(asyncio.run(bodies._body(wid, "graphmon")))
        t, u = read_trace_untraced(tmp_path / f"{wid}.npz", progress=False)
        assert u["duration_ns"].tolist() == want and len(t) == len(synthetic_trace())
    assert u["graph"].tolist() == [] and read_trace_untraced(tmp_path / "w1.npz", progress=False)[1]["graph"].tolist() == [0, -1]
    import json  # the Chrome JSON carries them in graphmonTrace (formats.chrome)

    doc = json.loads(asyncio.run(bodies._body("w1", "chrome")))
    assert doc["graphmonTrace"]["untraced"] == {"graph": [0, -1], "duration_ns": [1_500, 2_500]}
