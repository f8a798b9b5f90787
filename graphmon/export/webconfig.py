"""``--web.config.file``: the web configuration file of Prometheus exporters (exporter-toolkit's
format, docs/web-configuration.md there), so graphmon takes the file node_exporter takes.

Supported: ``tls_server_config`` (cert_file, key_file, client_ca_file, client_auth_type,
min_version, max_version, prefer_server_cipher_suites), ``http_server_config`` (headers; http2 is
accepted and has no effect: uvicorn speaks HTTP/1.1) and ``basic_auth_users`` (bcrypt hashes,
checked with the ``bcrypt`` package). What Python's ssl cannot do as Go's crypto/tls does (Go
cipher-suite and curve names, client certificates accepted without verification, SAN pinning,
inline PEM) and ``rate_limit`` (graphmon has limits of its own) are refused with a line that says
so, never ignored. Unknown keys are refused, as exporter-toolkit does.

TLS is uvicorn's (its ``ssl_*`` options; minimum/maximum versions and the cipher preference set
on the context it makes). The file is read at start and on SIGHUP (``WebAccess.reload``): new
certificates and users apply to new connections and requests; switching TLS on or off, or the
client-auth policy, needs a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import ssl
import threading
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

log = logging.getLogger("graphmon")

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNSUPPORTED_AUTH = ("RequestClientCert", "RequireAnyClientCert")  # accept certificates nobody verified
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
           "Strict-Transport-Security")
BCRYPT_HASH = re.compile(r"\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}")
MAX_FILE_BYTES = 1 << 20
# Compared against when the user is unknown, so that a wrong user costs what a wrong password does.
_DUMMY_HASH = b"$2b$10$" + b"." * 53


class WebConfigError(ValueError):
    """The web config file cannot be used: one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    cert_file: str
    key_file: str
    client_ca_file: Optional[str] = None
    client_auth_type: str = "NoClientCert"
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    prefer_server_cipher_suites: bool = True

    @field_validator("client_auth_type")
    @classmethod
    def _auth_type(cls, v: str) -> str:
        v = v or "NoClientCert"
        if v in UNSUPPORTED_AUTH:
            raise ValueError(f"{v} accepts client certificates without verifying them, which Python's ssl does not "
                             "do: use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file")
        if v not in CLIENT_AUTH:
            raise ValueError(f"unknown client_auth_type {v!r}; one of {', '.join(CLIENT_AUTH)}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.client_ca_file and self.client_auth_type == "NoClientCert":
            raise ValueError("client_ca_file is set but client_auth_type is NoClientCert: set RequireAndVerifyClientCert")
        if not self.client_ca_file and self.client_auth_type != "NoClientCert":
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self

    @property
    def cert_reqs(self) -> int:
        return CLIENT_AUTH[self.client_auth_type]


class HttpServerConfig(_Strict):
    http2: bool = True  # accepted for compatibility; HTTP/1.1 is served either way
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _known_headers(cls, v: dict) -> dict:
        bad = [k for k in v if k not in HEADERS]
        if bad:
            raise ValueError(f"headers {bad} are not among exporter-toolkit's {', '.join(HEADERS)}")
        for k, val in v.items():
            if not val.isprintable() or "\n" in val:
                raise ValueError(f"header {k} holds a control character")
        return {k: val for k, val in v.items() if val}


class WebConfig(_Strict):
    tls_server_config: Optional[TlsServerConfig] = None
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _users(cls, v: dict) -> dict:
        for user, hashed in v.items():
            if not user or ":" in user:
                raise ValueError(f"user name {user!r}: empty or with a ':' (basic auth cannot carry it)")
            if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
                raise ValueError(f"user {user!r}: the password must be a bcrypt hash ($2y$10$... as `htpasswd -nBC 10 "
                                 "\"\" | tr -d ':\\n'` prints), not the password itself")
        return v


# Keys graphmon refuses with a reason (exporter-toolkit has them; Python's ssl or graphmon does not).
_REFUSED = {
    ("tls_server_config", "cipher_suites"): "Go's cipher-suite names; Python's ssl uses OpenSSL's defaults",
    ("tls_server_config", "curve_preferences"): "Go's curve names; Python's ssl uses OpenSSL's defaults",
    ("tls_server_config", "client_allowed_sans"): "SAN pinning is not supported: use a client CA of their own",
    ("tls_server_config", "cert"): "inline PEM is not supported: use cert_file",
    ("tls_server_config", "key"): "inline PEM is not supported: use key_file",
    ("tls_server_config", "client_ca"): "inline PEM is not supported: use client_ca_file",
    ("rate_limit",): "graphmon limits connections and downloads itself (docs/reliability.md)",
}


def parse_web_config(text: str, where: str = "web config") -> WebConfig:
    import yaml  # here: an app without a web config (an in-process exporter) never needs it

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WebConfigError(f"{where}: not YAML: {' '.join(str(e).split())[:300]}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise WebConfigError(f"{where}: expected a mapping of tls_server_config, http_server_config, basic_auth_users")
    for path, why in _REFUSED.items():
        node = doc
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] in node:
            raise WebConfigError(f"{where}: {'.'.join(path)} is not supported by graphmon ({why})")
    try:
        return WebConfig.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "the file"
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown key"
        raise WebConfigError(f"{where}: {loc}: {msg}") from None


def load_web_config(path: str) -> WebConfig:
    """Read, validate and try ``path`` (the TLS files load into a context): WebConfigError if unusable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise WebConfigError(f"web config {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise WebConfigError(f"web config {path}: over {MAX_FILE_BYTES} bytes")
    cfg = parse_web_config(raw.decode("utf-8", "replace"), f"web config {path}")
    if cfg.tls_server_config is not None:
        ssl_context(cfg.tls_server_config, path)
    if cfg.basic_auth_users:
        _bcrypt(path)
    return cfg


def _bcrypt(where: str = "web config"):
    try:
        import bcrypt
    except ImportError:
        from graphmon.buildinfo import install_hint

        raise WebConfigError(f"{where}: basic_auth_users needs the bcrypt package: {install_hint('web')}") from None
    return bcrypt


def ssl_context(tls: TlsServerConfig, where: str = "web config") -> ssl.SSLContext:
    """The context uvicorn makes from the same options (uvicorn.config.create_ssl_context), with the
    versions and cipher preference set: made here first to check the files."""
    from uvicorn.config import create_ssl_context

    try:
        ctx = create_ssl_context(certfile=tls.cert_file, keyfile=tls.key_file, password=None,
                                 ssl_version=ssl.PROTOCOL_TLS_SERVER, cert_reqs=tls.cert_reqs,
                                 ca_certs=tls.client_ca_file, ciphers=None)
    except (OSError, ssl.SSLError) as e:
        raise WebConfigError(f"{where}: tls_server_config: {getattr(e, 'strerror', None) or e}") from None
    tune_ssl(ctx, tls)
    return ctx


def tune_ssl(ctx: ssl.SSLContext, tls: TlsServerConfig) -> None:
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


class BasicAuth:
    """``Authorization: Basic`` against bcrypt hashes. A bcrypt check costs ~70 ms at cost 10, so it
    runs on a worker thread (never the event loop), two at a time at most, and a user's password
    once verified is remembered (its SHA-256, as exporter-toolkit caches) until the next reload."""

    MAX_CHECKS = 2
    MAX_CACHED = 256

    def __init__(self, users: dict[str, str]) -> None:
        self.users = {u: h.encode() for u, h in users.items()}
        self._ok: dict[tuple[str, bytes], bytes] = {}  # (user, sha256(password)) -> the hash it matched
        self._lock = threading.Lock()
        self._limiter = None
        self.refused = 0

    @staticmethod
    def credentials(header: Optional[bytes]) -> Optional[tuple[str, bytes]]:
        scheme, _, cred = (header or b"").strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            raw = base64.b64decode(cred.strip(), validate=True)
        except ValueError:
            return None
        user, sep, password = raw.partition(b":")
        if not sep:
            return None
        try:
            return user.decode("utf-8"), password
        except UnicodeDecodeError:
            return None

    async def check(self, header: Optional[bytes]) -> Optional[str]:
        """The user when ``header`` carries valid credentials, else None."""
        got = self.credentials(header)
        if got is None:
            return None
        user, password = got
        hashed = self.users.get(user)
        key = (user, hashlib.sha256(password).digest())
        with self._lock:
            hit = self._ok.get(key)
        if hit is not None and hashed is not None and hmac.compare_digest(hit, hashed):
            return user
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.MAX_CHECKS)
        bcrypt = _bcrypt()
        try:
            ok = await anyio.to_thread.run_sync(bcrypt.checkpw, password, hashed or _DUMMY_HASH, limiter=self._limiter)
        except ValueError:  # a hash bcrypt cannot read (the dummy one)
            ok = False
        if not ok or hashed is None:
            self.refused += 1
            return None
        with self._lock:
            if len(self._ok) >= self.MAX_CACHED:
                self._ok.clear()
            self._ok[key] = hashed
        return user


class WebAccess:
    """Who may use the HTTP endpoints, per the settings (token, token_file, web_config_file): the
    basic-auth users, the response headers and the TLS options of the server; reloaded on SIGHUP."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.path: Optional[str] = settings.web_config_file
        self.ssl: Optional[ssl.SSLContext] = None  # the server's context, once make_server made it
        self._apply(load_web_config(self.path) if self.path else WebConfig())

    def _apply(self, cfg: WebConfig) -> None:
        self.config = cfg
        self.basic = BasicAuth(cfg.basic_auth_users) if cfg.basic_auth_users else None
        self.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cfg.http_server_config.headers.items()]

    @property
    def tls(self) -> Optional[TlsServerConfig]:
        return self.config.tls_server_config

    def uvicorn_options(self) -> dict:
        tls = self.tls
        if tls is None:
            return {}
        return {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file, "ssl_ca_certs": tls.client_ca_file,
                "ssl_cert_reqs": tls.cert_reqs, "ssl_ciphers": None}

    def attach_ssl(self, ctx: Optional[ssl.SSLContext]) -> None:
        """The context uvicorn made from uvicorn_options(): versions and cipher preference set."""
        if ctx is not None and self.tls is not None:
            tune_ssl(ctx, self.tls)
        self.ssl = ctx

    def reload(self) -> list[str]:
        """Read the token file and the web config again (SIGHUP). What cannot be used is logged and
        the previous setting kept; returns what changed."""
        changed = []
        try:
            if self.settings.reload_token():
                changed.append("token")
        except ValueError as e:
            log.error("reload: %s; the previous token stays", e)
        if self.path is None:
            return changed
        try:
            new = load_web_config(self.path)
        except WebConfigError as e:
            log.error("reload: %s; the previous web config stays", e)
            return changed
        old = self.tls
        if (new.tls_server_config is None) != (old is None) or (
                old is not None and new.tls_server_config.client_auth_type != old.client_auth_type):
            log.warning("reload: switching TLS on or off, or client_auth_type, needs a restart; the rest of %s applies",
                        self.path)
            new = new.model_copy(update={"tls_server_config": old})
        elif old is not None and self.ssl is not None and new.tls_server_config != old:
            tls = new.tls_server_config
            self.ssl.load_cert_chain(tls.cert_file, tls.key_file)  # checked by load_web_config
            if tls.client_ca_file:
                self.ssl.load_verify_locations(tls.client_ca_file)  # adds; CAs already trusted stay until a restart
            tune_ssl(self.ssl, tls)
            changed.append("tls")
        if new.basic_auth_users != self.config.basic_auth_users:
            changed.append("basic_auth_users")
        if new.http_server_config != self.config.http_server_config:
            changed.append("headers")
        self._apply(new)
        return changed

    def reload_and_log(self) -> None:
        if self.path is None and self.settings.token_file is None:
            log.info("SIGHUP: no token file or web config to reload; graphmon keeps running")
            return
        try:
            changed = self.reload()
        except Exception as e:  # noqa: BLE001 - a reload never ends the process
            log.error("reload failed: %r; settings unchanged", e)
            return
        log.info("SIGHUP: reloaded the token file and web config (%s); graphmon keeps running",
                 ", ".join(changed) if changed else "nothing changed")
