"""--web.config.file (exporter-toolkit's format): TLS with a real handshake, basic auth against
bcrypt hashes (401 without, 200 with), the token from a file, what is refused and why, SIGHUP's
reload."""

from __future__ import annotations

import base64
import ssl

import bcrypt
import httpx
import pytest

from graphmon.export.exporter import Exporter
from graphmon.export.webconfig import WebConfigError, load_web_config, parse_web_config
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import make_pki, synthetic_trace

PASSWORD = "s3cret-horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()  # cost 4: the test stays fast


def _serve(tmp_path, text: str, **settings):
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    ex = Exporter(ReplaySource(synthetic_trace(), interval_s=0.05),
                  Settings(port=0, web_config_file=str(cfg), **settings))
    ex.start()
    ex.serve_background()
    return ex, cfg


def test_tls_handshake_basic_auth_refusal_and_acceptance(tmp_path):
    pki = make_pki(tmp_path)
    ex, _ = _serve(tmp_path, f"tls_server_config:\n  cert_file: {pki['cert']}\n  key_file: {pki['key']}\n"
                             f"basic_auth_users:\n  prometheus: '{HASH}'\n"
                             "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    base = f"https://127.0.0.1:{ex.bound_port}"
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=pki["ca"]), timeout=10) as c:
            r = c.get(base + "/metrics")
            # a real TLS handshake happened (the server's certificate verified against our CA), then 401
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
            assert r.headers["x-content-type-options"] == "nosniff"
            assert c.get(base + "/metrics", auth=("prometheus", "wrong")).status_code == 401
            assert c.get(base + "/metrics", auth=("nobody", PASSWORD)).status_code == 401
            ok = c.get(base + "/metrics", auth=("prometheus", PASSWORD))
            assert ok.status_code == 200 and "graphmon_up" in ok.text
            assert c.get(base + "/status", auth=("prometheus", PASSWORD)).json()["config"]["tls"] is True
            # a basic-auth user may do what the token allows (exporter-toolkit: users have full access)
            assert c.post(base + "/capture", auth=("prometheus", PASSWORD), json={"replays": 1}).status_code == 200
            assert c.get(base + "/healthz").status_code == 200  # the probes' endpoint stays open
            head = c.head(base + "/metrics", auth=("prometheus", PASSWORD))
            assert head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("text/plain")
        # plain HTTP on the TLS port gets no answer; an unverified server certificate fails the handshake
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{ex.bound_port}/healthz", timeout=5)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(base + "/healthz", timeout=5)
    finally:
        ex.stop()


def test_bearer_token_from_a_file_also_passes_basic_auth(tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-from-secret\n")  # a Secret's file may end with a newline
    ex, _ = _serve(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n", token_file=str(token))
    base = f"http://127.0.0.1:{ex.bound_port}"
    try:
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
        r = httpx.get(base + "/metrics", headers={"Authorization": "Bearer tok-from-secret"}, timeout=5)
        assert r.status_code == 200
        assert httpx.get(base + "/metrics", headers={"Authorization": "Bearer tok"}, timeout=5).status_code == 401
    finally:
        ex.stop()


def test_client_certificates_are_required_and_verified(tmp_path):
    pki = make_pki(tmp_path)
    ex, _ = _serve(tmp_path, f"tls_server_config:\n  cert_file: {pki['cert']}\n  key_file: {pki['key']}\n"
                             f"  client_ca_file: {pki['ca']}\n  client_auth_type: RequireAndVerifyClientCert\n")
    base = f"https://127.0.0.1:{ex.bound_port}"
    try:
        ctx = ssl.create_default_context(cafile=pki["ca"])
        with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
            httpx.get(base + "/healthz", verify=ctx, timeout=5)
        ctx.load_cert_chain(pki["client_cert"], pki["client_key"])
        assert httpx.get(base + "/metrics", verify=ctx, timeout=5).status_code == 200
    finally:
        ex.stop()


def test_sighup_reload_takes_new_users_and_token_and_keeps_a_broken_file_out(tmp_path):
    token = tmp_path / "token"
    token.write_text("one")
    ex, cfg = _serve(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n", token_file=str(token))
    base = f"http://127.0.0.1:{ex.bound_port}"
    web = ex.app.state.web
    try:
        assert httpx.get(base + "/metrics", auth=("alice", PASSWORD), timeout=5).status_code == 200
        cfg.write_text(f"basic_auth_users:\n  bob: '{HASH}'\n")
        token.write_text("two")
        assert sorted(web.reload()) == ["basic_auth_users", "token"]
        assert httpx.get(base + "/metrics", auth=("alice", PASSWORD), timeout=5).status_code == 401
        assert httpx.get(base + "/metrics", auth=("bob", PASSWORD), timeout=5).status_code == 200
        assert httpx.get(base + "/metrics", headers={"Authorization": "Bearer two"}, timeout=5).status_code == 200
        cfg.write_text("basic_auth_users:\n  bob: plain-password\n")  # refused: bob's old hash stays
        assert web.reload() == []
        assert httpx.get(base + "/metrics", auth=("bob", PASSWORD), timeout=5).status_code == 200
    finally:
        ex.stop()


def test_a_correct_password_is_checked_once_then_cached(tmp_path, monkeypatch):
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(1) or real(pw, h))
    ex, _ = _serve(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    base = f"http://127.0.0.1:{ex.bound_port}"
    try:
        for _ in range(3):
            assert httpx.get(base + "/healthz", auth=("prometheus", PASSWORD), timeout=5).status_code == 200
            assert httpx.get(base + "/metrics", auth=("prometheus", PASSWORD), timeout=5).status_code == 200
        assert len(calls) == 1  # ~70 ms a check at cost 10: once per user and password
        for _ in range(2):
            assert httpx.get(base + "/metrics", auth=("prometheus", "nope"), timeout=5).status_code == 401
        assert len(calls) == 3  # a wrong password is checked every time (never cached)
    finally:
        ex.stop()


@pytest.mark.parametrize("text, why", [
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "tls_server_config.cipher_suites is not supported"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
     "without verifying them"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
     "client_ca_file is set but client_auth_type is NoClientCert"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
     "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
     "min_version TLS13 is above max_version TLS12"),
    ("basic_auth_users:\n  alice: hunter2\n", "must be a bcrypt hash"),
    ("basic_auth_users:\n  'a:b': '" + HASH + "'\n", "with a ':'"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  certfile: c\n", "tls_server_config.certfile: unknown key"),
    ("rate_limit:\n  interval: 1s\n  burst: 20\n", "rate_limit is not supported"),
    ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "not among exporter-toolkit's"),
    ("- a list\n", "expected a mapping"),
    ("tls_server_config: [\n", "not YAML"),
])
def test_what_is_refused_says_why(text, why):
    with pytest.raises(WebConfigError, match=why.replace("(", r"\(").replace(".", r"\.")):
        parse_web_config(text)


def test_exporter_toolkits_sample_parses():
    """exporter-toolkit's docs/web-config.yml, its rate_limit left out (graphmon refuses it)."""
    cfg = parse_web_config("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                           "basic_auth_users:\n"
                           "  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n"
                           "  bob: $2y$10$hLqFl9jSjoAAy95Z/zw8Ye8wkdMBM8c5Bn1ptYqP/AXyV0.oy0S8m\n")
    assert cfg.tls_server_config.cert_file == "server.crt" and sorted(cfg.basic_auth_users) == ["alice", "bob"]
    assert parse_web_config("").tls_server_config is None  # an empty file: plain HTTP, no users


def test_unreadable_files_are_one_line(tmp_path):
    with pytest.raises(WebConfigError, match="No such file"):
        load_web_config(str(tmp_path / "missing.yml"))
    (tmp_path / "w.yml").write_text(f"tls_server_config:\n  cert_file: {tmp_path}/nope.pem\n  key_file: k\n")
    with pytest.raises(WebConfigError, match="tls_server_config"):
        load_web_config(str(tmp_path / "w.yml"))


def test_basic_credentials_parse_like_rfc7617():
    from graphmon.export.webconfig import BasicAuth

    enc = lambda s: b"Basic " + base64.b64encode(s)  # noqa: E731
    assert BasicAuth.credentials(enc(b"u:p:with:colons")) == ("u", b"p:with:colons")
    assert BasicAuth.credentials(b"basic " + base64.b64encode(b"u:")) == ("u", b"")
    for bad in (None, b"", b"Bearer x", b"Basic !!!", enc(b"no-colon"), enc(b"\xff:p")):
        assert BasicAuth.credentials(bad) is None


def test_token_file_problems_are_clear(tmp_path):
    from pydantic import ValidationError

    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, why in ((tmp_path / "missing", "cannot read token file"), (empty, "is empty")):
        with pytest.raises(ValidationError, match=why):
            Settings(token_file=str(path))
    ok = tmp_path / "ok"
    ok.write_text("abc")
    with pytest.raises(ValidationError, match="give the token once"):
        Settings(token="x", token_file=str(ok))
    assert Settings(token_file=str(ok)).token == "abc"
