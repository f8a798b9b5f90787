"""/metrics bodies from family blocks, rendered only where something changed.

A body is built from parts, each a list of (family name, header, sample lines): a skeleton with
every family's header (the body's order), one part per rank (graphmon.export.textwriter, reused
until the rank publishes a new snapshot), the agent's own families. Families several parts have
are joined under one header (the exposition formats want a family's samples together).

Each family's block is kept with its deflate chunk until its lines change, so a render compresses
only the families that changed and a gzip scrape is a concatenation: one gzip member whose
deflate stream is the families' chunks (each compressed on its own and ended by a sync flush at
a byte boundary, the way pigz cuts blocks), then the scrape's own part (process_* families and
OpenMetrics' EOF) with the final block, and the trailer (CRC-32 carried over from the render).
One member, not one per family: httpx and curl read only a body's first member.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from graphmon.export.exposition import FORMATS, OPENMETRICS, Family, header
from graphmon.export.families import DEFAULT_LEVEL, HEALTH, families
from graphmon.export.snapshot import Snapshot
from graphmon.export.textwriter import rank_chunks

GZIP_LEVEL = 6  # the demo's body: 10.7 kB in 2.3 ms (level 9: 9.8 kB in 17 ms; level 1: 13.4 kB in 0.9 ms)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown
EOF_LINE = b"# EOF\n"
DEDUPE = frozenset({"graphmon_build_info"})  # one line per distinct build, whoever exports it


class Body(NamedTuple):
    """A rendered body: ``text`` whole (OpenMetrics: with its EOF); with gzip, ``gz`` is the gzip
    header and the deflate chunks of ``text[:size]`` (no final block), ``crc`` its CRC-32."""

    text: bytes
    size: int  # bytes before the EOF line
    gz: Optional[bytes] = None
    crc: int = 0


def _chunk(data: bytes, level: int) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


def gzip_with(body: Body, extra: bytes, level: int = GZIP_LEVEL) -> bytes:
    """One gzip member: ``body.text[:size]``, then ``extra`` (compressed now, with the final block)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    tail = c.compress(extra) + c.flush()
    return body.gz + tail + struct.pack("<II", zlib.crc32(extra, body.crc), (body.size + len(extra)) & 0xFFFFFFFF)


class Blocks:
    """Per format, each family's block (bytes) kept while its lines are the same, and the deflate
    chunks of runs of consecutive blocks (at least RUN_BYTES: a chunk of its own for each small
    family would cost a block header each) kept while the run's blocks are the same."""

    RUN_BYTES = 32 * 1024

    def __init__(self, level: int = GZIP_LEVEL) -> None:
        self.level = level
        self._blocks: dict[tuple[str, str], tuple] = {}  # (fmt, family) -> (lines, block)
        self._runs: dict[str, list] = {}  # fmt -> [(blocks of the run, chunk)]
        self.compressed_bytes = 0  # bytes compressed (tests, bench)

    def build(self, fmt: str, parts: Sequence[Sequence[Family]], dedupe: frozenset = DEDUPE,
              gzip: bool = False) -> Body:
        """The body of ``parts``; families in ``dedupe`` keep one copy of each sample line (e.g. one
        build_info line for many processes of one build)."""
        order: dict[str, list] = {}
        for part in parts:
            for name, head, samples in part:
                got = order.get(name)
                if got is None:
                    order[name] = [head, [samples]]
                else:
                    got[1].append(samples)
        kept, blocks = {}, []
        for name, (head, samples) in order.items():
            key = (head, *samples)
            hit = self._blocks.get((fmt, name))
            if hit is None or hit[0] != key:
                if name in dedupe:
                    lines = sorted({ln for chunk in samples for ln in chunk.splitlines(keepends=True)})
                else:
                    lines = samples
                hit = (key, (head + "".join(lines)).encode("utf-8"))
            kept[(fmt, name)] = hit
            blocks.append(hit[1])
        self._blocks = {**{k: v for k, v in self._blocks.items() if k[0] != fmt}, **kept}
        text = b"".join(blocks)
        size = len(text)
        if fmt == OPENMETRICS:
            text += EOF_LINE
        if not gzip:
            return Body(text, size)
        crc = 0
        for b in blocks:
            crc = zlib.crc32(b, crc)
        return Body(text, size, GZIP_HEADER + b"".join(self._chunks(fmt, blocks)), crc)

    def _chunks(self, fmt: str, blocks: list) -> list:
        old, runs, run, n = self._runs.get(fmt, []), [], [], 0
        for i, b in enumerate(blocks):
            run.append(b)
            n += len(b)
            if n >= self.RUN_BYTES or i == len(blocks) - 1:
                key = tuple(run)
                j = len(runs)
                if j < len(old) and old[j][0] == key:
                    runs.append(old[j])
                else:
                    data = b"".join(run)
                    self.compressed_bytes += len(data)
                    runs.append((key, _chunk(data, self.level)))
                run, n = [], 0
        self._runs[fmt] = runs
        return [c for _, c in runs]


def skeleton(level: str, fmt: str, health_only: bool = False) -> list[Family]:
    """Every rank family's header, with no samples: the order and HELP/TYPE of a body."""
    return [(f.name, header(f.name, f.type, f.help, fmt), "") for f in (HEALTH if health_only else families(level))]


class RankPieces:
    """Each rank's sample lines, rendered once per snapshot (and per extra-errors value)."""

    def __init__(self, level: str = DEFAULT_LEVEL, health_only: bool = False,
                 on_error: Optional[Callable[[str, BaseException], None]] = None) -> None:
        self.level, self.health_only, self._on_error = level, health_only, on_error
        self._pieces: dict[str, tuple] = {}  # key -> (snapshot, extra errors, part)
        self.renders = 0  # ranks rendered (a rank whose snapshot did not change is reused)
        self.failed = False  # a rank of the last parts() failed to render (exported with health only)

    def parts(self, ranks: Sequence[tuple[str, Snapshot]], extra_errors: Callable[[], Mapping[str, int]],
              stage: str = "scrape") -> list:
        """One part per (key, snapshot); the HTTP layer's ``extra_errors`` go to the first; a rank
        that fails to render is counted under ``stage``."""
        out, live = [], set()
        self.failed = False
        for n, (key, snap) in enumerate(ranks):
            extra = dict(extra_errors()) if n == 0 else {}
            ek = tuple(sorted(extra.items()))
            live.add(key)
            hit = self._pieces.get(key)
            if hit is None or hit[0] is not snap or hit[1] != ek:
                part, ok = self._piece(snap, extra, extra_errors if n == 0 else None, stage)
                hit = (snap, ek, part)
                if ok:
                    self._pieces[key] = hit
                else:  # not kept: tried again (and counted again) at the next render
                    self._pieces.pop(key, None)
                    self.failed = True
            out.append(hit[2])
        for key in [k for k in self._pieces if k not in live]:
            del self._pieces[key]  # a rank that is gone
        return out

    def clear(self) -> None:
        self._pieces.clear()

    def _piece(self, snap: Snapshot, extra: dict, again: Optional[Callable], stage: str) -> tuple[list[Family], bool]:
        self.renders += 1
        ok = True
        try:
            chunks = rank_chunks(snap, self.level, extra, self.health_only)
        except Exception as e:  # contained: this rank's health families only; the others are unaffected
            ok = False
            if self._on_error is not None:
                self._on_error(stage, e)
            try:  # with the error just counted
                chunks = rank_chunks(snap, self.level, dict(again()) if again else extra, health_only=True)
            except Exception:
                chunks = {}
        return [(name, "", lines) for name, lines in chunks.items()], ok


class MetricsRenderer:
    """``serve``'s /metrics: the bodies of the current snapshots, one per format (never keyed by
    what a client sends).

    ``prerender()`` (called by whoever publishes snapshots, off the request path) renders every
    format; ``body(fmt)`` answers from the cache when the snapshots are the same objects, answers
    the previous body while a render is in progress, else renders (one render at a time).
    ``extra``: a registry renderer (``fmt -> families``) of families beside the snapshots'.
    """

    def __init__(self, get_snapshots: Callable[[], Sequence[Snapshot]], *, level: str = DEFAULT_LEVEL,
                 health_only: bool = False, extra: Optional[Callable[[str], list]] = None,
                 extra_errors: Callable[[], Mapping[str, int]] = dict,
                 on_error: Optional[Callable[[str, BaseException], None]] = None) -> None:
        self._provider = None
        self._get = get_snapshots
        self._extra, self._extra_errors = extra, extra_errors
        self.pieces = RankPieces(level, health_only, on_error)
        self._skeleton: dict[str, list[Family]] = {}
        self.blocks = Blocks()
        self._cache: dict[str, tuple[tuple, Body]] = {}  # format -> (snapshots, body)
        self._gzip: set[str] = set()  # formats a client asked for gzipped: pre-rendered compressed too
        self._lock = threading.Lock()  # one render at a time: bounded transient memory and CPU
        self.renders = 0

    @staticmethod
    def _same(a: Sequence, b: Sequence) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    def serve_from(self, provider) -> None:
        """Answer /metrics from ``provider`` (its ``cached(fmt, gzip)`` and ``body(fmt, gzip)``)
        from now on: the agent renders on a thread of its own, at most once per interval."""
        self._provider = provider

    def invalidate(self) -> None:
        """Forget the cached bodies, after any render in progress stored its body (that one is
        forgotten too): the next body is rendered from what is current now."""
        with self._lock:
            self._cache.clear()
            self.pieces.clear()

    def cached(self, fmt: str, gzip: bool = False) -> Optional[Body]:
        """The body if it is current (no rendering): cheap enough for the event loop."""
        if self._provider is not None:
            return self._provider.cached(fmt, gzip)
        if gzip:
            self._gzip.add(fmt)
        hit = self._cache.get(fmt)
        if hit is None or not self._same(hit[0], tuple(self._get())) or (gzip and hit[1].gz is None):
            return None
        return hit[1]

    def body(self, fmt: str, gzip: bool = False, stage: str = "scrape") -> Body:
        if self._provider is not None:
            return self._provider.body(fmt, gzip)
        if gzip:
            self._gzip.add(fmt)
        if not self._lock.acquire(blocking=False):
            # A render is in progress (normally the pre-render of a snapshot published a moment
            # ago): answer with the body before it rather than queue behind it. It is at most one
            # snapshot older, and counters in it are never ahead of what the next scrape shows.
            hit = self._cache.get(fmt)
            if hit is not None and stage == "scrape" and (hit[1].gz is not None or not gzip):
                return hit[1]
            self._lock.acquire()
        try:
            snaps = tuple(self._get())
            hit = self._cache.get(fmt)
            if hit is not None and self._same(hit[0], snaps) and (hit[1].gz is not None or fmt not in self._gzip):
                return hit[1]
            sk = self._skeleton.get(fmt)
            if sk is None:
                sk = self._skeleton[fmt] = skeleton(self.pieces.level, fmt, self.pieces.health_only)
            parts = [sk, *self.pieces.parts([(str(i), s) for i, s in enumerate(snaps)], self._extra_errors, stage)]
            if self._extra is not None:
                parts.append(self._extra(fmt))
            body = self.blocks.build(fmt, parts, gzip=fmt in self._gzip)
            self.renders += 1
            if not self.pieces.failed:  # else the next scrape tries again
                self._cache[fmt] = (snaps, body)
            return body
        finally:
            self._lock.release()

    def prerender(self, *_: object) -> None:
        if self._provider is not None:
            return
        for fmt in FORMATS:
            self.body(fmt, stage="publish")
