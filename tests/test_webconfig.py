"""exporter/web/webconfig.py: the exporter-toolkit web config file, its TLS context, basic auth
with its cache, and reloading; and the server's middleware that applies them, in-process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collect import Collector
from exporter.config import Config, WebConfig
from exporter.errors import ConfigError
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.server import PROTECTION, Protection, make_app, start
from exporter.web.webconfig import (
    CIPHER_SUITES,
    MAX_FILE_BYTES,
    Authenticator,
    Busy,
    LiveWebConfig,
    RateLimiter,
    TLSServerConfig,
    WebFile,
    build_context,
    load,
    parse,
    parse_basic,
    san_allowed,
)
from tests.helpers.servers import closed_within
from tests.helpers.tls import Pki, bcrypt_hash, make_pki

START = 1_760_000_000.0
# bcrypt of "secret", cost 4, a fixed salt: the same test ids in every xdist worker
HASH = "$2b$04$gpufleetTestSaltOnly1.wfqSax00a4PPolBXtwq/aFn5TJjvaum"
FOLDER = Path("/etc/gpufleet")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _parse(text: str) -> WebFile:
    return parse(text, "web.yml", FOLDER)


def test_full_file_parses_to_exact_values():
    web = _parse(f"""
tls_server_config:
  cert_file: server.crt
  key_file: /abs/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  min_version: TLS13
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
  curve_preferences: [X25519]
  client_allowed_sans: [scraper.example]
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
    Content-Security-Policy: ""
basic_auth_users:
  prometheus: {HASH}
""")
    assert web == WebFile(
        tls=TLSServerConfig(
            cert_file="/etc/gpufleet/server.crt", key_file="/abs/server.key",
            client_ca_file="/etc/gpufleet/ca.crt", client_auth_type="RequireAndVerifyClientCert",
            min_version="TLS13", max_version="TLS13",
            cipher_suites=("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"),
            prefer_server_cipher_suites=False, curve_preferences=("X25519",),
            client_allowed_sans=("scraper.example",)),
        http2=False,
        # the blank header is left unset, as exporter-toolkit does
        headers=(("X-Frame-Options", "deny"), ("Strict-Transport-Security", "max-age=31536000")),
        users=((b"prometheus", HASH.encode()),),
    )
    assert web.tls.enabled


def test_empty_file_and_users_alone_serve_plain_http():
    assert _parse("") == WebFile()
    web = _parse(f"basic_auth_users:\n  u: {HASH}\ntls_server_config:\n  min_version: TLS13\n")
    assert not web.tls.enabled  # exporter-toolkit's IsEnabled: versions alone are no TLS
    assert web.users == ((b"u", HASH.encode()),)


TLS = "tls_server_config:\n  cert_file: c.crt\n  key_file: c.key\n"


@pytest.mark.parametrize("text, message", [
    ("bogus: 1\n", "web.yml: bogus: unknown key (allowed: tls_server_config, "
     "http_server_config, basic_auth_users, rate_limit)"),
    ("tls_server_config:\n  certfile: x\n", "web.yml: tls_server_config.certfile: unknown key "
     "(allowed: cert, key, client_ca, cert_file, key_file, client_auth_type, client_ca_file, "
     "cipher_suites, curve_preferences, min_version, max_version, prefer_server_cipher_suites, "
     "client_allowed_sans)"),
    ("http_server_config:\n  http3: true\n", "web.yml: http_server_config.http3: unknown key "
     "(allowed: http2, headers)"),
    ("http_server_config:\n  http2: maybe\n",
     "web.yml: http_server_config.http2: must be true or false, got 'maybe'"),
    ("tls_server_config: [1]\n", "web.yml: tls_server_config: must be a mapping, got [1]"),
    ("tls_server_config:\n  cert_file: [a]\n",
     "web.yml: tls_server_config.cert_file: must be a string, got ['a']"),
    ("tls_server_config:\n  key_file: k\n", "web.yml: tls_server_config.cert_file: required "
     "when TLS is configured (or cert)"),
    ("tls_server_config:\n  cert_file: c\n", "web.yml: tls_server_config.key_file: required "
     "when TLS is configured (or key)"),
    (TLS + "  client_auth_type: RequireAnyClientCert\n", "web.yml: "
     "tls_server_config.client_auth_type: RequireAnyClientCert cannot be honoured: Python's ssl "
     "verifies every client certificate it asks for; use VerifyClientCertIfGiven or "
     "RequireAndVerifyClientCert"),
    (TLS + "  client_auth_type: RequestClientCert\n", "web.yml: "
     "tls_server_config.client_auth_type: RequestClientCert cannot be honoured: Python's ssl "
     "verifies every client certificate it asks for; use VerifyClientCertIfGiven or "
     "RequireAndVerifyClientCert"),
    (TLS + "  client_auth_type: Always\n", "web.yml: tls_server_config.client_auth_type: must "
     "be one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert, got 'Always'"),
    (TLS + "  client_ca_file: ca.crt\n", "web.yml: tls_server_config.client_ca_file: a client CA "
     "without a client_auth_type that verifies certificates (VerifyClientCertIfGiven or "
     "RequireAndVerifyClientCert)"),
    (TLS + "  min_version: TLS14\n", "web.yml: tls_server_config.min_version: must be one of "
     "TLS10, TLS11, TLS12, TLS13, got 'TLS14'"),
    (TLS + "  max_version: TLS11\n", "web.yml: tls_server_config.max_version: TLS11 cannot be "
     "honoured: OpenSSL 3 refuses TLS 1.0 and 1.1 at its default security level"),
    (TLS + "  min_version: TLS13\n  max_version: TLS12\n", "web.yml: tls_server_config."
     "min_version: TLS13 is above max_version TLS12"),
    (TLS + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "web.yml: tls_server_config."
     "cipher_suites[0]: unknown cipher 'TLS_RSA_WITH_RC4_128_SHA' (Go's names from "
     "tls.CipherSuites(), e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)"),
    (TLS + "  max_version: TLS12\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "web.yml: "
     "tls_server_config.cipher_suites: only TLS 1.3 suites, but max_version is TLS12: no "
     "handshake could succeed"),
    (TLS + "  curve_preferences: [CurveP256, X25519]\n", "web.yml: tls_server_config."
     "curve_preferences: 2 curves cannot be honoured: Python's ssl sets one curve "
     "(set_ecdh_curve); list one"),
    (TLS + "  curve_preferences: [P256]\n", "web.yml: tls_server_config.curve_preferences[0]: "
     "unknown curve 'P256' (one of CurveP256, CurveP384, CurveP521, X25519)"),
    (TLS + "  client_allowed_sans: [a]\n", "web.yml: tls_server_config.client_allowed_sans: "
     "needs client_auth_type VerifyClientCertIfGiven or RequireAndVerifyClientCert"),
    ("http_server_config:\n  headers:\n    Server: gpufleet\n", "web.yml: http_server_config."
     "headers.Server: this header cannot be configured (allowed: Strict-Transport-Security, "
     "X-Content-Type-Options, X-Frame-Options, X-XSS-Protection, Content-Security-Policy)"),
    ("http_server_config:\n  headers:\n    x-frame-options: deny\n", "web.yml: "
     "http_server_config.headers.x-frame-options: this header cannot be configured (allowed: "
     "Strict-Transport-Security, X-Content-Type-Options, X-Frame-Options, X-XSS-Protection, "
     "Content-Security-Policy)"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "web.yml: "
     "http_server_config.headers.X-Frame-Options: must be one of deny, sameorigin, got 'allow'"),
    ("http_server_config:\n  headers:\n    X-Content-Type-Options: ''\n", "web.yml: "
     "http_server_config.headers.X-Content-Type-Options: must be one of nosniff, got ''"),
    ('http_server_config:\n  headers:\n    X-XSS-Protection: "1\\r\\nSet-Cookie: a"\n',
     "web.yml: http_server_config.headers.X-XSS-Protection: no line breaks or NUL in a header "
     "value"),
    ("basic_auth_users:\n  alice: hunter2\n", "web.yml: basic_auth_users.alice: not a bcrypt "
     "hash (make one with htpasswd -nBC 10 \"\" | tr -d ':\\n')"),
    ("basic_auth_users:\n  alice: $2y$31$" + "a" * 53 + "\n", "web.yml: basic_auth_users.alice: "
     "bcrypt cost 31 is outside 4..17 (each step doubles the CPU of every check; 10 is ~60 ms)"),
    ("basic_auth_users:\n  alice: {a: 1}\n", "web.yml: basic_auth_users.alice: must be a string, "
     "got {'a': 1}"),
    ("basic_auth_users:\n  null: " + HASH + "\n", "web.yml: basic_auth_users: keys must be "
     "strings, got None"),
    ("rate_limit:\n  interval: 1d\n  burst: 5\n", "web.yml: rate_limit.interval: must be a "
     "Go duration such as 1s or 250ms, got '1d'"),
    ("rate_limit:\n  interval: 25h\n", "web.yml: rate_limit.interval: must be from 0 to 24h, "
     "got '25h'"),
    ("rate_limit:\n  interval: 1s\n  burst: -1\n", "web.yml: rate_limit.burst: must be an "
     "integer from 0 to 1,000,000, got -1"),
    ("rate_limit:\n  every: 1s\n", "web.yml: rate_limit.every: unknown key (allowed: interval, "
     "burst)"),
    (f"basic_auth_users:\n  a: {HASH}\n  a: {HASH}\n",
     "web.yml: basic_auth_users.a: given twice, at lines 2 and 3; keep one"),
    ("- 1\n", "web.yml: top level: must be a mapping, got a list at line 1"),
])
def test_every_error_names_its_key(text, message):
    with pytest.raises(ConfigError) as raised:
        _parse(text)
    assert str(raised.value) == message


def test_rate_limit_as_exporter_toolkit_test_data():
    # web/testdata/web_config_rate_limiter_{nonblocking,one_second}.yaml
    assert _parse("rate_limit:\n  interval: 0\n  burst: 0\n").rate_limit is None
    assert _parse('rate_limit:\n  interval: "1s"\n  burst: 0\n').rate_limit == (1.0, 0)
    assert _parse("rate_limit:\n  interval: 1m30s\n  burst: 3\n").rate_limit == (90.0, 3)
    assert _parse("rate_limit:\n  interval: 500000000\n").rate_limit == (0.5, 0)  # nanoseconds


def test_rate_limiter_is_a_full_token_bucket():
    now = [100.0]
    limiter = RateLimiter(2.0, 3, lambda: now[0])
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]
    now[0] += 1.0
    assert not limiter.allow()  # half a token
    now[0] += 1.0
    assert [limiter.allow(), limiter.allow()] == [True, False]
    now[0] += 100.0
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]  # capped at burst
    never = RateLimiter(1.0, 0, lambda: now[0])  # burst 0 refuses everything, as in Go
    now[0] += 10
    assert not never.allow()


async def test_rate_limit_answers_429_and_follows_reloads(aiohttp_client, tmp_path):
    client = await aiohttp_client(_app(tmp_path, "rate_limit:\n  interval: 1h\n  burst: 2\n"))
    assert [(await client.get("/-/healthy")).status for _ in range(3)] == [200, 200, 429]
    live = client.app[PROTECTION].web
    (tmp_path / "web.yml").write_text("rate_limit:\n  interval: 1h\n  burst: 3\n")
    # taken by this poll, or by the server's own watcher (it polls every second) just before
    await asyncio.to_thread(live.poll)
    for _ in range(100):
        if live.reloads:
            break
        await asyncio.sleep(0.05)
    assert live.reloads == 1
    assert [(await client.get("/-/healthy")).status for _ in range(4)] == [200, 200, 200, 429]


def test_users_are_bounded():
    users = "".join(f"  u{i}: {HASH}\n" for i in range(1001))
    with pytest.raises(ConfigError, match=r"^web.yml: basic_auth_users: at most 1,000 users, "
                       r"got 1,001$"):
        _parse("basic_auth_users:\n" + users)


def test_file_size_and_encoding_are_checked_before_parsing(tmp_path):
    big = tmp_path / "big.yml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError) as raised:
        load(big)
    assert str(raised.value) == f"{big}: web.config_file: {big} is over 1,048,576 bytes"
    latin = tmp_path / "latin.yml"
    latin.write_bytes(b"basic_auth_users:\n  jos\xe9: x\n")
    with pytest.raises(ConfigError) as raised:
        load(latin)
    assert str(raised.value) == f"{latin}: not UTF-8 at line 2 (byte 0xE9)"
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)  # opened without a writer, a FIFO would block the start forever
    with pytest.raises(ConfigError) as raised:
        load(fifo)
    assert str(raised.value) == f"{fifo}: web.config_file: {fifo} is not a regular file"
    with pytest.raises(ConfigError) as raised:
        load(tmp_path / "missing.yml")
    assert str(raised.value) == (f"{tmp_path / 'missing.yml'}: web.config_file: cannot read "
                                 f"{tmp_path / 'missing.yml'}: No such file or directory")


# --- the TLS context ---------------------------------------------------------------------


def _tls(pki: Pki, **fields) -> TLSServerConfig:
    return TLSServerConfig(cert_file=str(pki.cert), key_file=str(pki.key), **fields)


def test_every_go_cipher_maps_to_an_openssl_cipher(pki):
    for go, openssl in CIPHER_SUITES.items():
        context = build_context(_tls(pki, cipher_suites=(go,)), "web.yml")
        twelve = [c["name"] for c in context.get_ciphers() if c["protocol"] != "TLSv1.3"]
        if openssl is None:  # TLS 1.3 only: TLS 1.2 has no suite left, as in Go
            assert context.minimum_version == ssl.TLSVersion.TLSv1_3, go
        else:
            assert twelve == [openssl], go


def test_cipher_order_versions_and_client_auth_are_applied(pki):
    context = build_context(_tls(
        pki, cipher_suites=("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
        min_version="TLS12", max_version="TLS12", client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(pki.ca)), "web.yml")
    assert [c["name"] for c in context.get_ciphers() if c["protocol"] != "TLSv1.3"] == [
        "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"]
    assert (context.minimum_version, context.maximum_version) == (
        ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "gpufleet test CA"),),)]
    optional = build_context(_tls(pki, client_auth_type="VerifyClientCertIfGiven",
                                  client_ca_file=str(pki.ca), prefer_server_cipher_suites=False),
                             "web.yml")
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    assert not optional.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert build_context(_tls(pki), "web.yml").verify_mode == ssl.CERT_NONE


def test_inline_certificate_key_and_ca(pki):
    context = build_context(TLSServerConfig(
        cert=pki.cert.read_text(), key=pki.key.read_text(), client_ca=pki.ca.read_text(),
        client_auth_type="RequireAndVerifyClientCert"), "web.yml")
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1


def test_files_that_do_not_load_name_their_key(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    other = make_pki(tmp_path / "other")  # a key of another certificate
    cases = [
        (TLSServerConfig(cert_file=str(tmp_path / "nope.crt"), key_file=str(pki.key)),
         f"web.yml: tls_server_config.cert_file: cannot read {tmp_path / 'nope.crt'}: "
         "No such file or directory"),
        (TLSServerConfig(cert_file=str(garbage), key_file=str(pki.key)),
         "web.yml: tls_server_config.cert_file: no PEM certificate in it"),
        (TLSServerConfig(cert_file=str(pki.cert), key_file=str(other.key)),
         "web.yml: tls_server_config.key_file: does not load with tls_server_config.cert_file"),
        (TLSServerConfig(cert_file=str(pki.cert), key_file=str(pki.key),
                         client_auth_type="RequireAndVerifyClientCert",
                         client_ca_file=str(garbage)),
         "web.yml: tls_server_config.client_ca_file: no PEM certificate in it"),
    ]
    for tls, message in cases:
        with pytest.raises(ConfigError) as raised:
            build_context(tls, "web.yml")
        assert str(raised.value).startswith(message), str(raised.value)
        assert "\n" not in str(raised.value)


def test_allowed_sans_match_exactly():
    cert = {"subjectAltName": (("DNS", "scraper.example"), ("IP Address", "2001:DB8:0:0:0:0:0:1"),
                               ("URI", "spiffe://a/b"), ("email", "p@example.org"))}
    assert san_allowed(cert, ("scraper.example",))
    assert san_allowed(cert, ("2001:db8::1",))  # as Go prints an IP
    assert san_allowed(cert, ("spiffe://a/b",))
    assert san_allowed(cert, ("p@example.org",))
    assert not san_allowed(cert, ("Scraper.example", "scraper"))
    assert not san_allowed(None, ("scraper.example",))


# --- basic auth --------------------------------------------------------------------------


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_parse_basic_as_go_does():
    assert parse_basic(_basic("u", "p:q")) == (b"u", b"p:q")
    assert parse_basic("basic " + base64.b64encode(b"u:").decode()) == (b"u", b"")
    assert parse_basic("Bearer abc") is None
    assert parse_basic("Basic !!!") is None
    assert parse_basic("Basic " + base64.b64encode(b"no colon").decode()) is None


def test_bcrypt_cache_hits_misses_and_invalidation():
    auth = Authenticator()
    users = {b"alice": HASH.encode()}
    assert auth.verify(users, b"alice", b"secret")
    assert auth.checks == 1
    assert auth.verify(users, b"alice", b"secret")
    assert auth.checks == 1  # cached: no second bcrypt
    assert not auth.verify(users, b"alice", b"wrong")
    assert not auth.verify(users, b"alice", b"wrong")
    assert auth.checks == 3  # failures are never cached
    assert not auth.verify(users, b"mallory", b"secret")
    assert auth.checks == 4  # an unknown user still costs one bcrypt check (timing)
    changed = {b"alice": bcrypt_hash("secret").encode()}  # same password, new salt
    assert auth.verify(changed, b"alice", b"secret")
    assert auth.checks == 5  # the hash is in the key: a changed hash is checked again
    assert not auth.verify(users, b"alice", b"x" * 73)  # bcrypt refuses over 72 bytes
    assert auth.checks == 6


def test_bcrypt_cache_is_bounded():
    auth = Authenticator(cache_size=2)
    users = {b"a": HASH.encode(), b"b": HASH.encode(), b"c": HASH.encode()}
    for user in (b"a", b"b", b"c"):
        assert auth.verify(users, user, b"secret")
    assert auth.checks == 3
    assert auth.verify(users, b"c", b"secret")
    assert auth.verify(users, b"b", b"secret")
    assert auth.checks == 3
    assert auth.verify(users, b"a", b"secret")  # the oldest was evicted
    assert auth.checks == 4


async def test_check_answers_cached_on_the_loop_and_refuses_a_queue():
    auth = Authenticator(max_pending=0)
    users = {b"alice": HASH.encode()}
    with pytest.raises(Busy):
        await auth.check(users, _basic("alice", "secret"))
    auth.verify(users, b"alice", b"secret")
    assert await auth.check(users, _basic("alice", "secret"))  # cached: no worker needed
    assert not await auth.check(users, "Bearer x")
    auth.close()
    queued = Authenticator()
    assert await queued.check(users, _basic("alice", "secret"))
    assert await queued.check(users, _basic("alice", "secret"))
    assert queued.checks == 1  # the worker's success was cached by the loop
    assert not await queued.check(users, _basic("alice", "nope"))
    assert queued.checks == 2
    queued.close()


# --- reloading ---------------------------------------------------------------------------


def test_reload_takes_a_good_file_and_keeps_the_last_good_one(tmp_path, caplog):
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {HASH}\n")
    live = LiveWebConfig(path)
    assert not live.poll()  # nothing changed
    second = bcrypt_hash("other")
    path.write_text(f"basic_auth_users:\n  bob: {second}\n")
    assert live.poll()
    assert live.current.users == {b"bob": second.encode()}
    assert live.reloads == 1
    caplog.set_level(logging.ERROR, logger="exporter.web.webconfig")
    path.write_text("basic_auth_users:\n  bob: plaintext\n")
    assert not live.poll()
    assert not live.poll()
    assert live.current.users == {b"bob": second.encode()}  # the last good config stays
    assert [r.getMessage() for r in caplog.records] == [
        "web config not reloaded, keeping the last good one: "
        f"{path}: basic_auth_users.bob: not a bcrypt hash (make one with "
        "htpasswd -nBC 10 \"\" | tr -d ':\\n')"]  # one line for the broken version
    path.write_text(f"basic_auth_users:\n  bob: {second}\n")  # fixed: the same as before
    assert not live.poll()
    assert live.reloads == 1


def test_reload_sees_a_renewed_certificate_and_refuses_turning_tls_off(tmp_path, pki, caplog):
    folder = tmp_path / "tls"
    first = make_pki(folder)
    path = folder / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    live = LiveWebConfig(path)
    assert live.tls
    before = live.ssl_context()
    renewed = make_pki(folder, "renewed")  # the same CA, a new certificate over the old file
    first.cert.write_bytes(renewed.cert.read_bytes())
    first.key.write_bytes(renewed.key.read_bytes())
    assert live.poll()
    assert live.ssl_context() is not before
    caplog.set_level(logging.ERROR, logger="exporter.web.webconfig")
    path.write_text("")
    assert not live.poll()
    assert live.tls
    assert caplog.records[0].getMessage() == (
        "web config not reloaded, keeping the last good one: "
        f"{path}: tls_server_config: turning TLS off needs a restart")


# --- the server's middleware, in-process -------------------------------------------------


def _app(tmp_path: Path, web_yml: str, reads_need_token: bool = False, token: bytes | None = None):
    path = tmp_path / "web.yml"
    path.write_text(web_yml)
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=60)
    collector = Collector([sim], config.source_timeout, clock=lambda: START)
    return make_app(config, collector, protection=Protection(LiveWebConfig(path), token,
                                                            reads_need_token))


async def test_basic_auth_on_every_endpoint_with_headers(aiohttp_client, tmp_path):
    client = await aiohttp_client(_app(tmp_path, f"basic_auth_users:\n  alice: {HASH}\n"
                                       "http_server_config:\n  headers:\n"
                                       "    X-Frame-Options: deny\n"))
    for path in ("/", "/metrics", "/-/healthy", "/-/ready", "/v1/snapshot", "/nowhere"):
        denied = await client.get(path)
        assert (denied.status, denied.headers["WWW-Authenticate"],
                denied.headers["X-Frame-Options"]) == (401, "Basic", "deny"), path
        wrong = await client.get(path, headers={"Authorization": _basic("alice", "nope")})
        assert wrong.status == 401, path
    ok = await client.get("/-/healthy", headers={"Authorization": _basic("alice", "secret")})
    assert (ok.status, await ok.text(), ok.headers["X-Frame-Options"]) == (
        200, "gpufleet is healthy.\n", "deny")


async def test_reads_need_the_bearer_token_and_skip_basic_auth(aiohttp_client, tmp_path):
    client = await aiohttp_client(_app(tmp_path, f"basic_auth_users:\n  alice: {HASH}\n",
                                       reads_need_token=True, token=b"t0ken"))
    basic = {"Authorization": _basic("alice", "secret")}
    # the bearer token guards /v1/*: basic credentials there are no bearer token
    denied = await client.get("/v1/snapshot", headers=basic)
    assert (denied.status, await denied.json()) == (401, {"error": "missing bearer token"})
    assert denied.headers["WWW-Authenticate"] == 'Bearer realm="gpufleet"'
    wrong = await client.get("/v1/snapshot", headers={"Authorization": "Bearer nope"})
    assert (wrong.status, await wrong.json()) == (401, {"error": "wrong bearer token"})
    for _ in range(200):  # the one collection, then the snapshot
        ok = await client.get("/v1/snapshot", headers={"Authorization": "Bearer t0ken"})
        if ok.status != 503:
            break
        await asyncio.sleep(0.05)
    assert ok.status == 200
    # outside /v1/ basic auth still applies, and the openapi document needs no token
    assert (await client.get("/metrics", headers={"Authorization": "Bearer t0ken"})).status == 401
    openapi = await client.get("/v1/openapi.json", headers=basic)
    assert openapi.status == 404  # not basic-auth refused: the route is the advisor's, absent here


# --- TLS behind the connection limits (connection_gate._TLSStart), in-process ---------------


@contextlib.asynccontextmanager
async def _tls_serving(tmp_path: Path, pki: Pki, limits: WebConfig) -> AsyncIterator[tuple[int, Any]]:
    """The exporter over TLS on a free port, with ``limits``: the port and its gate."""
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki.cert}\n  key_file: {pki.key}\n")
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=60, web=limits)
    app = make_app(config, Collector([sim], config.source_timeout, clock=lambda: START),
                   protection=Protection(LiveWebConfig(path)))
    sock = socket.create_server(("127.0.0.1", 0))
    runner = await start(app, sock, limits)
    try:
        (site,) = runner.sites
        yield sock.getsockname()[1], site.gate  # type: ignore[attr-defined]
    finally:
        await runner.cleanup()


async def _tls_get(port: int, pki: Pki, path: str = "/-/healthy") -> int:
    """The status of one GET over TLS without a client certificate; 0 for no HTTP answer
    (with TLS 1.3 a refused client certificate shows after the client's handshake)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                       server_hostname="127.0.0.1")
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
            raw = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
    except (ssl.SSLError, ConnectionError):
        return 0
    return int(raw.split(b" ", 2)[1]) if raw else 0


async def test_a_stalled_handshake_is_closed_after_the_header_timeout(tmp_path, pki):
    async with _tls_serving(tmp_path, pki, WebConfig(header_timeout=0.5)) as (port, gate):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # no ClientHello
        try:
            assert await closed_within(reader, 0.5 + 5.0)
        finally:
            writer.close()
        for _ in range(100):
            if not gate.guards:
                break
            await asyncio.sleep(0.05)
        assert gate.guards == set()  # a failed handshake never reached the guard, yet freed it
        assert await _tls_get(port, pki) == 200


async def test_connections_in_their_handshake_are_evicted_for_a_scraper(tmp_path, pki):
    async with _tls_serving(tmp_path, pki, WebConfig(max_connections=3, header_timeout=30)) as (
            port, gate):
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            for _ in range(100):
                if len(gate.guards) == 3:
                    break
                await asyncio.sleep(0.05)
            assert len(gate.guards) == 3
            assert await _tls_get(port, pki) == 200  # the longest-waiting silent one made room
            assert await closed_within(silent[0][0], 5.0)
        finally:
            for _, writer in silent:
                writer.close()
        for _ in range(100):
            if not gate.guards:
                break
            await asyncio.sleep(0.05)
        assert gate.guards == set()


def _request_in_the_handshakes_last_flight(port: int, pki: Pki) -> bytes:
    """A TLS 1.3 client that sends its Finished and a request in one write, as a client may:
    the server reads both at once, the request before start_tls has returned."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        while True:
            try:
                client.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        client.write(b"GET /-/healthy HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        sock.sendall(outgoing.read())  # the Finished and the request, in one segment
        answer = b""
        while not answer.startswith(b"HTTP/1.1 ") or b"\r\n" not in answer:
            try:
                answer += client.read(65536)
            except ssl.SSLWantReadError:
                data = sock.recv(65536)
                if not data:
                    break
                incoming.write(data)
        return answer


async def test_a_request_sent_with_the_handshakes_finished_is_answered(tmp_path, pki):
    """The first request can arrive in the handshake's last read: it must reach aiohttp
    after its connection_made, not be lost or delivered before it (_TLSStart keeps it)."""
    async with _tls_serving(tmp_path, pki, WebConfig()) as (port, gate):
        answer = await asyncio.to_thread(_request_in_the_handshakes_last_flight, port, pki)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]
        for _ in range(100):
            if not gate.guards:
                break
            await asyncio.sleep(0.05)
        assert gate.guards == set()


async def test_client_allowed_sans_refuse_another_client_certificate(tmp_path, pki):
    for allowed, expected in (("scraper.example", 200), ("other.example", 403)):
        path = tmp_path / "web.yml"
        path.write_text(f"""tls_server_config:
  cert_file: {pki.cert}
  key_file: {pki.key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca}
  client_allowed_sans: [{allowed}]
""")
        sim = sim_source(SimSource(seed=1), lambda: START)
        config = Config(collect_interval=60)
        app = make_app(config, Collector([sim], config.source_timeout, clock=lambda: START),
                       protection=Protection(LiveWebConfig(path)))
        sock = socket.create_server(("127.0.0.1", 0))
        runner = await start(app, sock, config.web)
        try:
            context = ssl.create_default_context(cafile=str(pki.ca))
            context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", sock.getsockname()[1], ssl=context, server_hostname="127.0.0.1")
            writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(), 10)
            writer.close()
        finally:
            await runner.cleanup()
        assert int(raw.split(b" ", 2)[1]) == expected, allowed


def test_a_bad_web_config_stops_serve_with_exit_2_on_one_line(tmp_path, capsys, monkeypatch):
    from exporter.cli import main

    monkeypatch.chdir(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    assert main(["serve", "--listen", "127.0.0.1:0", "--web.config.file", str(web)]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpufleet: {web}: tls_server_config.cert_file: cannot read "
                   f"{tmp_path / 'missing.crt'}: No such file or directory\n")
    assert list(tmp_path.iterdir()) == [web]  # nothing opened before the check (no outbox)
    config = tmp_path / "gpufleet.yaml"
    config.write_text(f"web:\n  config_file: {tmp_path / 'nope.yml'}\n")
    assert main(["serve", "--listen", "127.0.0.1:0", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"gpufleet: {tmp_path / 'nope.yml'}: web.config_file: cannot read "
        f"{tmp_path / 'nope.yml'}: No such file or directory\n")


async def test_a_reload_reaches_new_connections_whole_and_keeps_open_ones(tmp_path, pki):
    """Client auth switched on by a reload: a new connection without a client certificate
    fails its handshake, while a connection opened before keeps being served (a context per
    connection, not only the certificate an SNI callback could swap)."""
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki.cert}\n  key_file: {pki.key}\n")
    live = LiveWebConfig(path)
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=60)
    app = make_app(config, Collector([sim], config.source_timeout, clock=lambda: START),
                   protection=Protection(live))
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    runner = await start(app, sock, config.web)
    context = ssl.create_default_context(cafile=str(pki.ca))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                       server_hostname="127.0.0.1")

        async def healthy() -> bytes:
            writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            return head.split(b"\r\n")[0] + b" " + await reader.readexactly(length)

        assert await healthy() == b"HTTP/1.1 200 OK gpufleet is healthy.\n"
        path.write_text(f"tls_server_config:\n  cert_file: {pki.cert}\n  key_file: {pki.key}\n"
                        "  client_auth_type: RequireAndVerifyClientCert\n"
                        f"  client_ca_file: {pki.ca}\n")
        assert await asyncio.to_thread(live.poll)
        assert await _tls_get(port, pki) == 0  # no client certificate: no answer
        assert await healthy() == b"HTTP/1.1 200 OK gpufleet is healthy.\n"  # the old one stays
        writer.close()
        mutual = ssl.create_default_context(cafile=str(pki.ca))
        mutual.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=mutual,
                                                       server_hostname="127.0.0.1")
        assert await healthy() == b"HTTP/1.1 200 OK gpufleet is healthy.\n"
        writer.close()
    finally:
        await runner.cleanup()


# exporter-toolkit's own web/testdata files (github.com/prometheus/exporter-toolkit, Apache-2.0),
# as parse() takes them: the name, the file, and None where it parses or the start of our error
_TOOLKIT_FILES = [
    ("web_config_empty.yml", "", None),
    ("web_config_noAuth.good.yml", 'tls_server_config:\n  cert_file: "server.crt"\n  key_file: '
     '"server.key"\n  client_auth_type: "VerifyClientCertIfGiven"\n', None),
    ("web_config_headers.good.yml", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
     "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n"
     "    X-Content-Type-Options: nosniff\n    X-XSS-Protection: 1\n"
     "    Content-Security-Policy: \"default-src 'self' *.test.example.net\"\n", None),
    ("web_config_noAuth_someCiphers_noOrder.good.yml", 'tls_server_config:\n  cert_file: '
     '"server.crt"\n  key_file: "server.key"\n  client_auth_type: "VerifyClientCertIfGiven"\n'
     "  cipher_suites:\n  - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n"
     "  - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n  prefer_server_cipher_suites: false\n"
     "  min_version: TLS12\n  max_version: TLS12\n", None),
    ("web_config_noAuth_someCurves.good.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  client_auth_type: "VerifyClientCertIfGiven"\n'
     "  min_version: TLS13\n  curve_preferences:\n  - CurveP521\n", None),
    ("web_config_noAuth_noHTTP2.good.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  client_auth_type: "VerifyClientCertIfGiven"\n  cipher_suites:\n'
     "    - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n  max_version: TLS12\nhttp_server_config:\n"
     "  http2: false\n", None),
    # refused by us, accepted by Go: no unverified client certificates, one curve, cost <= 17
    ("tls_config_noAuth.requireanyclientcert.good.yml", 'tls_server_config:\n  cert_file: '
     '"server.crt"\n  key_file: "server.key"\n  client_auth_type: "RequireAnyClientCert"\n',
     "web.yml: tls_server_config.client_auth_type: RequireAnyClientCert cannot be honoured"),
    ("web_config_noAuth_allCurves.good.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  client_auth_type: "VerifyClientCertIfGiven"\n'
     "  curve_preferences:\n    - CurveP256\n    - CurveP384\n    - CurveP521\n    - X25519\n",
     "web.yml: tls_server_config.curve_preferences: 4 curves cannot be honoured"),
    ("web_config_users_noTLS.good.yml", "basic_auth_users:\n"
     "  alice: $2y$12$1DpfPeqF9HzHJt.EWswy1exHluGfbhnn3yXhR7Xes6m3WJqFg0Wby\n"
     "  bob: $2y$18$4VeFDzXIoPHKnKTU3O3GH.N.vZu06CVqczYZ8WvfzrddFU6tGqjR.\n",
     "web.yml: basic_auth_users.bob: bcrypt cost 18 is outside 4..17"),
    # refused by both
    ("web_config_junk_key.yml", 'tls_server_config:\n  cert_filse: "server.crt"\n',
     "web.yml: tls_server_config.cert_filse: unknown key"),
    ("web_config_junk.yml", "hWkNKCp3fvIx3jKnsaBI\nTuEjdwNS8A2vYdFbiKqr\n",
     "web.yml: top level: must be a mapping, got a string"),
    ("web_config_auth_user_list_invalid.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\nbasic_auth_users:\n  john: doe\n',
     "web.yml: basic_auth_users.john: not a bcrypt hash"),
    ("web_config_auth_clientCAs_invalid.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  client_ca_file: "somefile"\n',
     "web.yml: tls_server_config.client_ca_file: a client CA without a client_auth_type"),
    ("web_config_headers_extra_header.bad.yml", "http_server_config:\n  headers:\n"
     "    Content-Type: foo\n", "web.yml: http_server_config.headers.Content-Type: this header "
     "cannot be configured"),
    ("web_config_headers_content_type_options.bad.yml", "http_server_config:\n  headers:\n"
     "    X-Content-Type-Options: sniff\n", "web.yml: http_server_config.headers."
     "X-Content-Type-Options: must be one of nosniff, got 'sniff'"),
    ("web_config_noAuth_inventedCiphers.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  cipher_suites:\n  - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048\n',
     "web.yml: tls_server_config.cipher_suites[0]: unknown cipher"),
    ("web_config_noAuth_inventedCurves.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  curve_preferences:\n    - CurveP257\n',
     "web.yml: tls_server_config.curve_preferences[0]: unknown curve 'CurveP257'"),
    ("web_config_noAuth_wrongTLSVersion.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key_file: "server.key"\n  min_version: TLS111\n',
     "web.yml: tls_server_config.min_version: must be one of TLS10, TLS11, TLS12, TLS13"),
    ("web_config_noAuth_certPath_empty.bad.yml", 'tls_server_config:\n  cert_file: ""\n'
     '  key_file: "server.key"\n', "web.yml: tls_server_config.cert_file: required"),
    ("web_config_noAuth_key_empty.bad.yml", 'tls_server_config:\n  cert_file: "server.crt"\n'
     '  key: ""\n', "web.yml: tls_server_config.key_file: required"),
    ("web_config_noAuth_certPath_keyPath_empty.bad.yml", 'tls_server_config:\n  cert_file: ""\n'
     '  key_file: ""\n  client_auth_type: "x"\n',
     "web.yml: tls_server_config.client_auth_type: must be one of"),
]


@pytest.mark.parametrize("name, text, error", _TOOLKIT_FILES, ids=[f[0] for f in _TOOLKIT_FILES])
def test_exporter_toolkit_test_files(name, text, error):
    if error is None:
        _parse(text)
        return
    with pytest.raises(ConfigError) as raised:
        _parse(text)
    assert str(raised.value).startswith(error), str(raised.value)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                     st.floats(allow_nan=True), st.text(max_size=20),
                     st.sampled_from(["TLS12", "TLS13", "TLS10", "RequireAndVerifyClientCert",
                                      "RequireAnyClientCert", "nosniff", "deny", HASH, "1s",
                                      "TLS_AES_128_GCM_SHA256", "CurveP256", "/nonexistent"]))
_KEYS = st.sampled_from(["tls_server_config", "http_server_config", "basic_auth_users",
                         "rate_limit", "cert_file", "key_file", "client_auth_type",
                         "client_ca_file", "min_version", "max_version", "cipher_suites",
                         "curve_preferences", "headers", "http2", "X-Frame-Options",
                         "interval", "burst", "client_allowed_sans", "cert", "key", "bogus"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=5)), max_leaves=20)


@settings(max_examples=300)
@given(st.dictionaries(_KEYS, _VALUES, max_size=5))
def test_any_document_parses_or_fails_with_one_config_error_line(document):
    text = yaml.safe_dump(document)
    try:
        web = parse(text, "web.yml", FOLDER)
    except ConfigError as exc:
        assert str(exc).startswith("web.yml: ")
        assert "\n" not in str(exc)
    else:
        assert isinstance(web, WebFile)
