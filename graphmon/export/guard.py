"""Request guard (pure ASGI): body limits, authentication before the body is read, contained errors.

Written as ASGI middleware rather than a FastAPI dependency because FastAPI reads and validates a
body before dependencies run: a 64 MiB chunked body would be read, then answered 422, before any
token check.

Who gets in (docs/deployment.md, "Who may use the endpoints"):
- with basic_auth_users in the web config: every endpoint but /healthz (the probes') needs a
  basic-auth user or the bearer token (401 with ``WWW-Authenticate: Basic``), and a user may do
  everything;
- the protected endpoints (POST /capture, GET /trace, POST/DELETE /baseline; with
  protect_status also /status, /graphs and GET /baseline) need the token, a user, or, with neither
  configured, a loopback client on a loopback bind.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import threading
import time
from typing import Optional

log = logging.getLogger("graphmon")

MAX_BODY_BYTES = 16 * 1024
ERROR_LOG_INTERVAL_S = 60.0
_ABS_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[\\/][^\s'\"():,;]+")


def base_names(text: str) -> str:
    """Absolute paths in ``text`` reduced to their base names (for unauthenticated clients)."""
    return _ABS_PATH.sub(lambda m: os.path.basename(m.group(0).replace("\\", "/")) or m.group(0), text)


class ErrorCounts:
    """Contained errors of the HTTP layer, by stage; logged at most once a minute per stage."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._logged: dict[str, float] = {}
        self._lock = threading.Lock()

    def count(self, stage: str, exc: Optional[BaseException] = None) -> None:
        with self._lock:
            self._counts[stage] = self._counts.get(stage, 0) + 1
            now = time.monotonic()
            quiet = now - self._logged.get(stage, -1e9) <= ERROR_LOG_INTERVAL_S
            if not quiet:
                self._logged[stage] = now
        if exc is not None and not quiet:
            log.warning("graphmon %s error (counted in graphmon_collector_errors_total): %r", stage, exc)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


def is_loopback(host: Optional[str]) -> bool:
    if host is None:
        return True  # a Unix socket: local by construction
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host == "localhost"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _header(scope, name: bytes) -> Optional[bytes]:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v
    return None


AUTH_KEY = "graphmon.auth"  # set in the request's scope by the Guard: "basic:<user>" or "bearer"


def authorized(scope, settings, need_token: bool = False) -> Optional[tuple[int, str]]:
    """None when the request may use a protected endpoint, else (status, reason).

    With a token set: ``Authorization: Bearer <token>`` (scheme case-insensitive, RFC 7235; the
    token compared as UTF-8 bytes, so a non-ASCII token works). Without one: only clients on
    loopback, judged by the request's own client address (right for a mounted app too), and never
    on a public bind. ``need_token``: only a valid token counts (e.g. full paths in /status).
    """
    if scope.get(AUTH_KEY):
        return None  # the Guard checked a basic-auth user or the token already
    token = settings.token
    if token is None:
        if need_token:
            return 401, "no token configured"
        client = scope.get("client")
        if settings.is_public or not is_loopback(client[0] if client else None):
            return 403, "refused without GRAPHMON_TOKEN except from loopback clients on a loopback bind"
        return None
    if not bearer_ok(scope, settings):
        return 401, "missing or wrong bearer token"
    return None


def bearer_ok(scope, settings) -> bool:
    token = settings.token
    if token is None:
        return False
    raw = _header(scope, b"authorization") or b""
    scheme, _, cred = raw.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), token.encode("utf-8"))


def _route_path(scope) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


async def _send_json(send, status: int, detail: str, headers: tuple = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _protected(method: str, path: str, protect_status: bool) -> bool:
    route = path.rstrip("/")
    if (method == "POST" and route == "/capture") or path.startswith("/trace/") or (
            method in ("POST", "DELETE") and route == "/baseline"):
        return True
    return protect_status and route in ("/status", "/graphs", "/baseline")


class Guard:
    def __init__(self, app, settings, errors: ErrorCounts, web=None):
        """``web``: graphmon.export.webconfig.WebAccess (basic-auth users, response headers)."""
        self.app, self.settings, self.errors, self.web = app, settings, errors, web

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method", "GET"), _route_path(scope)
        cl = _header(scope, b"content-length")
        te = _header(scope, b"transfer-encoding")
        if cl is not None and (not cl.strip().isdigit() or int(cl) > MAX_BODY_BYTES):
            return await _send_json(send, 413, f"request body larger than {MAX_BODY_BYTES} bytes")
        if te is not None and b"chunked" in te.lower() and cl is None and method not in ("GET", "HEAD"):
            return await _send_json(send, 411, "chunked request bodies are not accepted: send Content-Length")
        web = self.web
        basic = web.basic if web is not None else None
        extra = web.headers if web is not None else []
        if basic is not None and path.rstrip("/") != "/healthz":
            user = await basic.check(_header(scope, b"authorization"))
            if user is not None:
                scope[AUTH_KEY] = "basic:" + user
            elif bearer_ok(scope, self.settings):
                scope[AUTH_KEY] = "bearer"
            else:
                return await _send_json(send, 401, "basic authentication required",
                                        ((b"www-authenticate", b'Basic realm="graphmon", charset="UTF-8"'), *extra))
        if _protected(method, path, self.settings.protect_status):
            refused = authorized(scope, self.settings)
            if refused is not None:
                hdr = ((b"www-authenticate", b"Bearer"),) if refused[0] == 401 else ()
                return await _send_json(send, refused[0], refused[1], (*hdr, *extra))
        started = False
        received = 0

        async def limited_receive():
            nonlocal received
            msg = await receive()
            received += len(msg.get("body", b""))
            if received > MAX_BODY_BYTES:  # a body longer than its Content-Length claims
                raise _TooLarge()
            return msg

        async def tracked_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                if extra:  # http_server_config.headers of the web config
                    msg = {**msg, "headers": [*msg.get("headers", ()), *extra]}
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, f"request body larger than {MAX_BODY_BYTES} bytes")
        except Exception as e:  # contained: a handler bug is a counted 500, logged rate limited, never re-raised
            self.errors.count("http", e)
            if not started:
                await _send_json(send, 500, "internal error (counted in graphmon_collector_errors_total)")


class _TooLarge(Exception):
    pass
