"""Incremental reader of one JSON document with a bound on each value.

Kineto traces are one JSON object whose ``traceEvents`` list may hold millions of events. The
caller walks the structure with :meth:`JsonStream.peek` / :meth:`JsonStream.expect` and decodes
each element with :meth:`JsonStream.value` (the stdlib's C scanner), so memory holds one element
at a time and no element may exceed ``ReadLimits.max_event_bytes``. Kept (over a library) by
measurement (bench/formats/parse_kineto.py -> bench/results/parse-kineto.json): orjson and msgspec load
the whole document (and orjson gives float64 microseconds, not ns-exact for epoch-based
timestamps); ijson streams with Decimals but is no faster than this reader.
"""

from __future__ import annotations

import codecs
import json
import re
import zlib
from typing import Any, BinaryIO, Callable

from graphmon.formats.common import ReadLimits
from graphmon.model.trace import TraceError

CHUNK_BYTES = 1 << 20


class _NonFinite:
    """parse_constant result for NaN / Infinity (legal for Python's json, not for us)."""


class FloatText(str):
    """A JSON number with a fraction or exponent, kept as its literal text (parse_float). The
    caller converts what it needs exactly (Kineto µs -> integer ns by string arithmetic); a
    Decimal per float cost more than the rest of the parse (bench/results/parse-kineto.json)."""

    __slots__ = ()


_NON_FINITE = _NonFinite()


class JsonStream:
    """Incremental reader of one JSON document: walks the top level and the traceEvents array
    by hand and decodes each event with the stdlib decoder, so memory holds one event at a time.
    """

    def __init__(self, raw: BinaryIO, binary: BinaryIO, limits: ReadLimits, on_read: Callable[[], None], *, exact: bool = True):
        self._raw = raw  # the file (for progress), binary = what yields JSON bytes
        self._bin = binary
        self._limits = limits
        self._on_read = on_read
        self._dec = codecs.getincrementaldecoder("utf-8-sig")("strict")
        # Floats as their text (FloatText): Kineto's µs with 3 decimals stay exact, 5351128125842.938
        # -> ...842938 ns. Integers stay the C parser's int: fast, and it refuses > 4300 digits
        # (a ValueError). exact=False (metadata): plain floats, and NaN/Infinity refused.
        dec = json.JSONDecoder(parse_float=FloatText, parse_constant=lambda s: _NON_FINITE) if exact else json.JSONDecoder(parse_constant=_refuse_constant)
        self._scan = dec.scan_once  # raw_decode minus a Python frame per event
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.bytes_in = 0
        self._dropped_chars = 0

    def _fill(self, want_chars: int = CHUNK_BYTES) -> None:
        if self.pos > (1 << 20) and self.pos > len(self.buf) // 2:
            self._dropped_chars += self.pos
            self.buf, self.pos = self.buf[self.pos :], 0
        got = 0
        while got < want_chars and not self.eof:
            try:
                data = self._bin.read(max(CHUNK_BYTES, want_chars - got))
            except EOFError:
                raise TraceError("truncated gzip stream") from None
            except (OSError, zlib.error) as e:
                raise TraceError(f"corrupt compressed data: {e}") from None
            self.bytes_in += len(data)
            if self.bytes_in > self._limits.max_decompressed_bytes:
                raise TraceError(f"more than {self._limits.max_decompressed_bytes} bytes of JSON (decompressed), over the limit")
            try:
                text = self._dec.decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise TraceError(f"not UTF-8 text near byte {self.bytes_in - len(data) + e.start}") from None
            if not data:
                self.eof = True
            self.buf += text
            got += len(text)
            self._on_read()

    def where(self) -> str:
        return f"character {self._dropped_chars + self.pos}"

    def peek(self) -> str:
        """Next non-whitespace character ('' at end of input), without consuming it."""
        while True:
            m = _WS.match(self.buf, self.pos)
            self.pos = m.end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._fill()

    def members(self):
        """Walk the object whose '{' was just read, through its '}': yield each key with the
        stream at the key's value, which the caller must consume before the next key."""
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            key = self.value()
            if type(key) is not str:
                raise TraceError(f"invalid JSON at {self.where()}: object key is not a string")
            self.expect(":")
            yield key
            if self.expect(",}") == "}":
                return

    def end(self) -> None:
        """Refuse anything but whitespace after the document."""
        if self.peek() != "":
            raise TraceError(f"invalid JSON at {self.where()}: extra data after the document")

    def items(self, cap: int, what: str):
        """Yield the elements of the array that starts here, refusing element ``cap + 1`` (so a
        list of millions of tiny strings is stopped before it is built)."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        n = 0
        while True:
            n += 1
            if n > cap:
                raise TraceError(f"more than {cap} {what} (limit)")
            yield self.value()
            if self.expect(",]") == "]":
                return

    def each(self, fn: Callable[[Any], None], skip: "re.Pattern[str] | None" = None) -> int:
        """Call ``fn`` on each element of the array whose '[' was just read, through its ']'.

        The same checks as ``value`` + ``expect(",]")`` per element, with a fast path for the
        common case (the element and the separator after it already in the buffer): one scan
        and two whitespace matches, no method call per element (a quarter of a Kineto read).
        ``skip``: elements this pattern matches whole (at the element's start, in the buffer)
        are passed over without being decoded; the pattern must match valid JSON only. Returns
        how many were skipped."""
        skipped = 0
        if self.peek() == "]":
            self.pos += 1
            return skipped
        ws, scan = _WS.match, self._scan
        match = skip.match if skip is not None else None
        while True:
            buf = self.buf
            at = ws(buf, self.pos).end()
            m = match(buf, at) if match is not None else None
            if m is not None:
                end, v = m.end(), None
            else:
                try:
                    v, end = scan(buf, at)
                except (json.JSONDecodeError, StopIteration, ValueError):
                    end = -1  # incomplete or invalid: the careful path reads more or says why
            if 0 <= end < len(buf) - 1:  # a number cannot go on: a non-digit follows it
                sep = ws(buf, end).end()
                c = buf[sep] if sep < len(buf) else ""
                if c == "," or c == "]":
                    self.pos = sep + 1
                    if m is None:
                        fn(v)
                    else:
                        skipped += 1
                    if c == "]":
                        return skipped
                    continue
            fn(self.value())
            if self.expect(",]") == "]":
                return skipped

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise TraceError(f"invalid JSON at {self.where()}: expected {' or '.join(map(repr, chars))}, found {c or 'end of file'!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the next JSON value, reading more input until it is complete."""
        self.peek()
        msg = ""
        while True:
            try:
                v, end = self._scan(self.buf, self.pos)
            except (json.JSONDecodeError, StopIteration) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "expecting a value"
                if self.eof:
                    raise TraceError(f"invalid JSON at {self.where()}: {msg}") from None
                v, end = None, -1
            except ValueError as e:  # an integer literal of thousands of digits
                raise TraceError(f"bad JSON number at {self.where()}: {e}") from None
            if end == -1 or (end == len(self.buf) and not self.eof):
                # Incomplete (or a number that may go on): read more, doubling, up to one event's cap.
                pending = len(self.buf) - self.pos
                if pending > self._limits.max_event_bytes:
                    raise TraceError(
                        f"a JSON value at {self.where()} is larger than {self._limits.max_event_bytes} bytes (limit)"
                        + (f" or invalid ({msg})" if msg else "")
                    )
                self._fill(max(CHUNK_BYTES, pending))
                continue
            self.pos = end
            return v


def _refuse_constant(s: str):
    raise ValueError(f"{s} is not JSON")


_WS = re.compile(r"[ \t\n\r]*")
