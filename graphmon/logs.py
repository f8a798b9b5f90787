"""graphmon's log lines: one format for everything a long-running command logs (serve, agent,
run, record): graphmon's own loggers, uvicorn's and asyncio's, through the stdlib's logging.

``--log-format text`` (default): ``2025-01-31 12:00:00,123 graphmon.agent INFO process attached``;
``json``: one object per line (``time`` RFC 3339 UTC, ``level``, ``logger``, ``msg``, ``exc``);
``logfmt``: ``time=... level=info logger=graphmon.agent msg="process attached"`` (what Loki and
node_exporter's go-kit logger use). The two structured formatters are a few lines over the stdlib
(json.dumps and one quoting rule): no logging library is needed for them.

Usage errors of the command line (``graphmon: error: ...``, exit 2) are not log lines: they stay
one plain line, like argparse's own.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json", "logfmt")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def _rfc3339(created: float) -> str:
    return datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": _rfc3339(record.created), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def _logfmt_value(v: str) -> str:
    if v and not any(c in v for c in ' ="\\') and v.isprintable():
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        pairs = [("time", _rfc3339(record.created)), ("level", record.levelname.lower()), ("logger", record.name),
                 ("msg", record.getMessage())]
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the record (a test's capture, a
    redirected stream), never to a stream closed since the handler was made."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "logfmt":
        return LogfmtFormatter()
    return logging.Formatter(TEXT_FORMAT)


def resolve(level: str | None, fmt: str | None) -> tuple[str, str]:
    """(level, format) from the flags, else GRAPHMON_LOG_LEVEL / GRAPHMON_LOG_FORMAT, else info/text.
    ValueError names the variable and the choices."""
    level = (level or os.environ.get("GRAPHMON_LOG_LEVEL") or "info").lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"GRAPHMON_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
    fmt = (fmt or os.environ.get("GRAPHMON_LOG_FORMAT") or "text").lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"GRAPHMON_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)} (got {fmt!r})")
    return level, fmt


def setup(level: str, fmt: str) -> None:
    """One stderr handler on the root logger in ``fmt`` (replacing the one an earlier call made),
    at ``level``. uvicorn's loggers propagate to it (graphmon.export.limits makes uvicorn
    configure none of its own)."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "graphmon", False)]:
        root.removeHandler(h)
    handler = _Stderr()
    handler.graphmon = True  # type: ignore[attr-defined]
    handler.setFormatter(formatter(fmt))
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
