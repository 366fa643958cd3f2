"""node_exporter's web config file (``--web.config.file``): TLS, basic auth and headers.

The file is the Prometheus exporter-toolkit's format, read as strictly as its
``yaml.UnmarshalStrict`` reads it (docs/web-configuration.md and web/tls_config.go
of github.com/prometheus/exporter-toolkit), so one file serves node_exporter and
gpufleet on the same host::

    tls_server_config:        # TLS when it names a certificate, key, CA or client_auth_type
      cert_file: server.crt   # relative paths are relative to this file's folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...  # bcrypt

An unknown key is an error, as in exporter-toolkit, and so is what Python's ``ssl``
cannot honour, rather than a setting silently dropped:

- ``client_auth_type`` ``RequestClientCert`` and ``RequireAnyClientCert`` ask for a
  certificate without verifying it; OpenSSL through Python always verifies what it
  asks for. ``VerifyClientCertIfGiven`` and ``RequireAndVerifyClientCert`` map to
  ``CERT_OPTIONAL`` and ``CERT_REQUIRED``.
- ``max_version`` below TLS12: OpenSSL 3 refuses TLS 1.0 and 1.1 at its default
  security level (their MD5-SHA1 signatures are under 80 bits), so no handshake would
  succeed. ``min_version`` TLS10 or TLS11 is accepted; the floor stays TLS 1.2.
- ``curve_preferences`` with more than one curve: Python 3.11's ``ssl`` sets one
  (``set_ecdh_curve``).

``client_allowed_sans`` is checked at a connection's first request (403, closed):
Python's ``ssl`` has no hook in the handshake, where Go checks it.

``rate_limit`` is honoured (:class:`RateLimiter`, 429), and follows reloads. A scalar
where yaml.v2 expects text is taken as text (its test files have ``X-XSS-Protection: 1``).

Cipher suites are Go's names (``tls.CipherSuites()``, the secure list; Go's insecure
ones are refused as Go refuses them) mapped to OpenSSL's. TLS 1.3 suites are accepted
and not configurable, as in Go. ``http2`` is accepted; aiohttp speaks HTTP/1.1 only,
and ALPN says so.

Errors are :class:`ConfigError` naming the file and the dotted key, on one line.
Every value is bounded before work: the file (1 MiB), the users (1,000), the bcrypt
cost (at most 17, htpasswd's maximum: each check doubles per step, ~60 ms at 10).

Basic auth (:class:`Authenticator`) follows exporter-toolkit's ``webHandler``: an
unknown user still costs one bcrypt check against a dummy hash, so timing does not
tell which users exist, and verified (user, hash, password) triples are cached
(100 entries, as ``cacheSize``) because a check costs ~60 ms of CPU. The cache key
includes the hash, so a changed password invalidates it; it holds an HMAC of the
triple, not the password. Checks run in one worker thread (exporter-toolkit's
``bcryptMtx``) off the event loop, with at most :data:`MAX_PENDING_CHECKS` waiting:
beyond that a request is answered 503 at once, so a flood of wrong passwords costs
at most one core, and a scrape whose credentials are cached never waits behind it
(bench/auth_flood.py: all 200 during a 50-connection flood).

:class:`LiveWebConfig` re-reads the file, and the certificate, key and CA files it
names, when any of them changes (stat every second, then a hash of the contents):
new connections get the new TLS context and every request the new users and
headers, while open connections keep theirs. A broken file keeps the last good
config and logs one error line per broken version.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from exporter import bounded_file, validate
from exporter.bounded_file import Wording
from exporter.errors import ConfigError, quoted
from exporter.yamlfile import parse_mapping

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1024 * 1024  # the web config, a certificate, a key or a CA bundle
MAX_USERS = 1000
MAX_BCRYPT_COST = 17  # htpasswd -B's maximum; 2**17 rounds, ~8 s per check
CACHE_SIZE = 100  # exporter-toolkit's cacheSize
MAX_PENDING_CHECKS = 16  # bcrypt checks waiting for the worker; more get 503
RELOAD_INTERVAL = 1.0  # seconds between two looks at the files

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# client_auth_type -> what Python's ssl does with it; "" is Go's default, NoClientCert
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's policies that take a certificate without verifying it ("RequireClientCert" is
# exporter-toolkit's old name for RequireAnyClientCert)
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# Go's tls.CipherSuites() (the secure list) -> OpenSSL's name; None: TLS 1.3, which
# neither Go nor Python's ssl lets a server configure
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}

# Go's curve names (exporter-toolkit's curves map) -> OpenSSL's
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
          "X25519": "X25519"}

# exporter-toolkit's extraHTTPHeaders: the only headers a file may set, with the values
# allowed where the header has an enumeration (empty: any value)
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

# $2a$, $2b$, $2x$ or $2y$, a two-digit cost, then 53 characters of salt and hash
_BCRYPT = re.compile(r"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}")

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
             "client_ca_file", "cipher_suites", "curve_preferences", "min_version", "max_version",
             "prefer_server_cipher_suites", "client_allowed_sans")
_HTTP_KEYS = ("http2", "headers")


@dataclass(frozen=True)
class TLSServerConfig:
    """``tls_server_config``; paths are already joined to the file's folder."""

    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    key: str = field(default="", repr=False)
    client_ca: str = ""
    client_ca_file: str = ""
    client_auth_type: str = ""
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()
    client_allowed_sans: tuple[str, ...] | None = None

    @property
    def enabled(self) -> bool:
        """exporter-toolkit's ``IsEnabled``: TLS when a certificate, key, CA or policy is named;
        a section with only versions or ciphers serves plain HTTP, as there."""
        return any((self.cert_file, self.cert, self.key_file, self.key, self.client_ca_file,
                    self.client_ca, self.client_auth_type))

    def files(self) -> tuple[str, ...]:
        """The files this section reads, watched for changes with the web config file."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True)
class WebFile:
    """The parsed file. ``users`` maps a user name (bytes, as sent) to its bcrypt hash;
    ``rate_limit`` is (seconds between two requests, burst), None when off."""

    tls: TLSServerConfig = TLSServerConfig()
    http2: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    users: tuple[tuple[bytes, bytes], ...] = ()
    rate_limit: tuple[float, int] | None = None


# --- parsing -------------------------------------------------------------------------


def _string(value: Any, key: str) -> str:
    # yaml.v2 (exporter-toolkit) takes any scalar as text for a string field: its own test
    # file has "X-XSS-Protection: 1". PyYAML has already read 1 as a number: written back
    return validate.text(value, key, scalars=True)


def _strings(value: Any, key: str, limit: int = 100) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{key}: must be a list of strings, got {quoted(value)}")
    if len(value) > limit:
        raise ConfigError(f"{key}: at most {limit} entries, got {len(value):,}")
    return tuple(_string(v, f"{key}[{i}]") for i, v in enumerate(value))


def _join(folder: Path, path: str) -> str:
    """prometheus/common's ``JoinDir``: a relative path is relative to the file's folder."""
    return path if not path or os.path.isabs(path) else str(folder / path)


def _parse_tls(value: Any, folder: Path) -> TLSServerConfig:
    key = "tls_server_config"
    data = validate.mapping(value, key, _TLS_KEYS)
    strings = {k: _string(data[k], f"{key}.{k}") for k in
               ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
                "client_ca_file", "min_version", "max_version") if data.get(k) is not None}
    auth = strings.get("client_auth_type", "")
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise ConfigError(f"{key}.client_auth_type: {auth} cannot be honoured: Python's ssl "
                          "verifies every client certificate it asks for; use "
                          "VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"{key}.client_auth_type: must be one of NoClientCert, "
                          "VerifyClientCertIfGiven, RequireAndVerifyClientCert, got "
                          f"{quoted(auth)}")
    versions = {}
    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[k] = validate.one_of(strings.get(k, default), f"{key}.{k}", TLS_VERSIONS)
    if TLS_VERSIONS[versions["max_version"]] < ssl.TLSVersion.TLSv1_2:
        raise ConfigError(f"{key}.max_version: {versions['max_version']} cannot be honoured: "
                          "OpenSSL 3 refuses TLS 1.0 and 1.1 at its default security level")
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise ConfigError(f"{key}.min_version: {versions['min_version']} is above max_version "
                          f"{versions['max_version']}")
    ciphers = _strings(data.get("cipher_suites"), f"{key}.cipher_suites")
    for i, name in enumerate(ciphers):
        if name not in CIPHER_SUITES:
            raise ConfigError(f"{key}.cipher_suites[{i}]: unknown cipher {quoted(name)} "
                              "(Go's names from tls.CipherSuites(), e.g. "
                              "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    if (ciphers and all(CIPHER_SUITES[c] is None for c in ciphers)
            and versions["max_version"] != "TLS13"):
        raise ConfigError(f"{key}.cipher_suites: only TLS 1.3 suites, but max_version is "
                          f"{versions['max_version']}: no handshake could succeed")
    curves = _strings(data.get("curve_preferences"), f"{key}.curve_preferences")
    for i, name in enumerate(curves):
        if name not in CURVES:
            raise ConfigError(f"{key}.curve_preferences[{i}]: unknown curve {quoted(name)} "
                              f"(one of {', '.join(CURVES)})")
    if len(curves) > 1:
        raise ConfigError(f"{key}.curve_preferences: {len(curves)} curves cannot be honoured: "
                          "Python's ssl sets one curve (set_ecdh_curve); list one")
    sans = None
    if data.get("client_allowed_sans") is not None:
        sans = _strings(data["client_allowed_sans"], f"{key}.client_allowed_sans", 1000)
        if CLIENT_AUTH[auth] == ssl.CERT_NONE:
            raise ConfigError(f"{key}.client_allowed_sans: needs client_auth_type "
                              "VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    prefer = True
    if data.get("prefer_server_cipher_suites") is not None:
        prefer = validate.true_or_false(data["prefer_server_cipher_suites"],
                                        f"{key}.prefer_server_cipher_suites")
    tls = TLSServerConfig(
        cert_file=_join(folder, strings.get("cert_file", "")),
        key_file=_join(folder, strings.get("key_file", "")),
        cert=strings.get("cert", ""), key=strings.get("key", ""),
        client_ca=strings.get("client_ca", ""),
        client_ca_file=_join(folder, strings.get("client_ca_file", "")),
        client_auth_type=auth, min_version=versions["min_version"],
        max_version=versions["max_version"], cipher_suites=ciphers,
        prefer_server_cipher_suites=prefer, curve_preferences=curves, client_allowed_sans=sans)
    if tls.enabled:
        # exporter-toolkit's validateTLSPaths and ConfigToTLSConfig, in its order
        if not tls.cert_file and not tls.cert:
            raise ConfigError(f"{key}.cert_file: required when TLS is configured (or cert)")
        if not tls.key_file and not tls.key:
            raise ConfigError(f"{key}.key_file: required when TLS is configured (or key)")
        if (tls.client_ca_file or tls.client_ca) and CLIENT_AUTH[auth] == ssl.CERT_NONE:
            which = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise ConfigError(f"{key}.{which}: a client CA without a client_auth_type that "
                              "verifies certificates (VerifyClientCertIfGiven or "
                              "RequireAndVerifyClientCert)")
    return tls


def _parse_http(value: Any) -> tuple[bool, tuple[tuple[str, str], ...]]:
    key = "http_server_config"
    data = validate.mapping(value, key, _HTTP_KEYS)
    http2 = True if data.get("http2") is None else validate.true_or_false(data["http2"], f"{key}.http2")
    headers = []
    for name, text in validate.mapping(data.get("headers"), f"{key}.headers", None).items():
        where = f"{key}.headers.{name}"
        if name not in HEADERS:  # exact case, as Go's map lookup
            raise ConfigError(f"{where}: this header cannot be configured (allowed: "
                              f"{', '.join(HEADERS)})")
        text = _string(text, where)
        if HEADERS[name]:
            validate.one_of(text, where, HEADERS[name])
        if any(c in text for c in "\r\n\0"):
            raise ConfigError(f"{where}: no line breaks or NUL in a header value")
        if text:  # exporter-toolkit: "Unset if blank"
            headers.append((name, text))
    return http2, tuple(headers)


def _parse_users(value: Any) -> tuple[tuple[bytes, bytes], ...]:
    key = "basic_auth_users"
    data = validate.mapping(value, key, None)
    if len(data) > MAX_USERS:
        raise ConfigError(f"{key}: at most {MAX_USERS:,} users, got {len(data):,}")
    users = []
    for name, hashed in data.items():
        where = f"{key}.{name}"
        hashed = _string(hashed, where)
        match = _BCRYPT.fullmatch(hashed)
        if match is None:  # exporter-toolkit's validateUsers: bcrypt.Cost() on every hash
            raise ConfigError(f"{where}: not a bcrypt hash (make one with "
                              "htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        cost = int(match.group(1))
        if not 4 <= cost <= MAX_BCRYPT_COST:
            raise ConfigError(f"{where}: bcrypt cost {cost} is outside 4..{MAX_BCRYPT_COST} "
                              "(each step doubles the CPU of every check; 10 is ~60 ms)")
        users.append((name.encode("utf-8", "surrogateescape"), hashed.encode()))
    return tuple(users)


# Go's time.ParseDuration, which yaml.v2 applies to a time.Duration field: "1s", "1m30s",
# "1.5h", "250ms"; a bare integer is nanoseconds
_GO_DURATION = re.compile(r"((\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h))+")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_RATE_INTERVAL = 86400.0  # a day between two requests is already a switch, not a rate
MAX_BURST = 1_000_000


def _go_duration(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{key}: must be a Go duration such as 1s or 250ms, got {quoted(value)}")
    if isinstance(value, int):
        seconds = value * 1e-9
    elif value == "0":
        seconds = 0.0
    elif len(value) <= 64 and _GO_DURATION.fullmatch(value):
        seconds = sum(float(n) * _GO_UNITS[u]
                      for _, n, u in re.findall(r"((\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h))", value))
    else:
        raise ConfigError(f"{key}: must be a Go duration such as 1s or 250ms, got {quoted(value)}")
    if not 0 <= seconds <= MAX_RATE_INTERVAL:
        raise ConfigError(f"{key}: must be from 0 to 24h, got {quoted(value)}")
    return seconds


def _parse_rate_limit(value: Any) -> tuple[float, int] | None:
    """exporter-toolkit's ``rate_limit``: one token bucket for every request (Go's
    ``rate.NewLimiter(rate.Every(interval), burst)``), 429 when empty; interval 0: off.
    As there, burst 0 with an interval refuses every request."""
    key = "rate_limit"
    data = validate.mapping(value, key, ("interval", "burst"))
    interval = _go_duration(data.get("interval", 0), f"{key}.interval")
    burst = data.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= MAX_BURST:
        raise ConfigError(f"{key}.burst: must be an integer from 0 to {MAX_BURST:,}, "
                          f"got {quoted(burst)}")
    return None if interval == 0 else (interval, burst)


class RateLimiter:
    """A token bucket: ``burst`` tokens, one more every ``interval`` seconds (Go's
    ``rate.Limiter``, which starts full). ``clock`` is a parameter for tests."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) / self.interval)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


def parse(text: str, source: str, folder: Path) -> WebFile:
    """The web config file's text; relative paths resolve against ``folder``.

    Pure apart from nothing: the files it names are read by :func:`build_context`.
    """
    data = parse_mapping(text, source, ConfigError, empty_ok=True)
    try:
        for k in data:
            if k not in _TOP:
                raise ConfigError(f"{quoted(k)[1:-1] if isinstance(k, str) else quoted(k)}: "
                                  f"unknown key (allowed: {', '.join(_TOP)})")
        tls = _parse_tls(data.get("tls_server_config"), folder)
        http2, headers = _parse_http(data.get("http_server_config"))
        users = _parse_users(data.get("basic_auth_users"))
        rate_limit = _parse_rate_limit(data.get("rate_limit"))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return WebFile(tls=tls, http2=http2, headers=headers, users=users, rate_limit=rate_limit)


# exporter-toolkit's wording: the file that names it, the key, then the file
_WORDING = Wording(
    ConfigError, cannot_read="{source}: {key}: cannot read {path}: {reason}",
    over_limit="{source}: {key}: {path} is over {limit:,} bytes",
    grew_over_limit="{source}: {key}: {path} is over {limit:,} bytes",
    not_regular="{source}: {key}: {path} is not a regular file")


def read_bounded(path: str, key: str, source: str) -> bytes:
    """A regular file of at most :data:`MAX_FILE_BYTES`; ConfigError naming ``key`` otherwise
    (a FIFO named here must not hang the start or the reload thread)."""
    return bounded_file.read_bounded(path, MAX_FILE_BYTES, _WORDING, key=key, source=source)


def load(path: str | Path, key: str = "web.config_file") -> WebFile:
    """Read and parse the web config file (the files it names are read later)."""
    path = str(path)
    data = read_bounded(path, key, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: not UTF-8 at line {line} (byte 0x{data[exc.start]:02X})") from None
    return parse(text, path, Path(path).parent)


# --- TLS -------------------------------------------------------------------------------


@contextlib.contextmanager
def _pem_files(tls: TLSServerConfig, source: str) -> Iterator[tuple[str, str]]:
    """The certificate and key as files: ``ssl`` loads a chain only from files, so inline
    ``cert``/``key`` go to a private temporary folder (0700) for the moment of loading."""
    if tls.cert_file and tls.key_file:
        yield tls.cert_file, tls.key_file
        return
    with tempfile.TemporaryDirectory(prefix="gpufleet-tls-") as folder:
        cert, key = tls.cert_file, tls.key_file
        if not cert:
            cert = os.path.join(folder, "cert.pem")
            Path(cert).write_text(tls.cert)
        if not key:
            key = os.path.join(folder, "key.pem")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(tls.key)
        yield cert, key


def build_context(tls: TLSServerConfig, source: str) -> ssl.SSLContext:
    """The server's ``SSLContext``; ConfigError naming the key of a file that does not load."""
    key = "tls_server_config"
    cert_key = f"{key}.cert_file" if tls.cert_file else f"{key}.cert"
    pem = read_bounded(tls.cert_file, cert_key, source) if tls.cert_file else tls.cert.encode()
    if tls.key_file:
        read_bounded(tls.key_file, f"{key}.key_file", source)  # size and readability first
    try:  # the certificate alone first, so that a bad key is not blamed on it
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{source}: {cert_key}: no PEM certificate in it ({_reason(exc)})") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    with _pem_files(tls, source) as (cert_path, key_path):
        try:
            context.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, OSError) as exc:
            which = f"{key}.key_file" if tls.key_file else f"{key}.key"
            raise ConfigError(f"{source}: {which}: does not load with {cert_key} "
                              f"({_reason(exc)})") from None
    twelve = [CIPHER_SUITES[c] for c in tls.cipher_suites if CIPHER_SUITES[c] is not None]
    if twelve:
        try:
            context.set_ciphers(":".join(n for n in twelve if n))
        except ssl.SSLError:
            raise ConfigError(f"{source}: {key}.cipher_suites: this OpenSSL offers none of "
                              "them") from None
    elif tls.cipher_suites:  # only TLS 1.3 suites: Go then has none for TLS 1.2
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        context.set_ecdh_curve(CURVES[tls.curve_preferences[0]])
    context.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        try:
            if tls.client_ca_file:
                data = read_bounded(tls.client_ca_file, f"{key}.client_ca_file", source)
                context.load_verify_locations(cadata=data.decode("ascii", "replace"))
            elif tls.client_ca:
                context.load_verify_locations(cadata=tls.client_ca)
            else:  # Go verifies against the system roots when no client CA is given
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (ssl.SSLError, ValueError) as exc:
            which = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise ConfigError(f"{source}: {key}.{which}: no PEM certificate in it "
                              f"({_reason(exc)})") from None
    # aiohttp speaks HTTP/1.1 only: say so, and an HTTP/2 client (Prometheus) falls back
    context.set_alpn_protocols(["http/1.1"])
    return context


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc)[:120]


def san_allowed(peercert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """exporter-toolkit's ``VerifyPeerCertificate``: one of the client certificate's DNS,
    IP, e-mail or URI names is in ``allowed`` exactly (IPs compared as Go prints them)."""
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind == "IP Address":
            with contextlib.suppress(ValueError):
                value = str(ipaddress.ip_address(value.strip()))
        if kind in ("DNS", "IP Address", "email", "URI") and value in allowed:
            return True
    return False


# --- basic auth ------------------------------------------------------------------------


def parse_basic(header: str) -> tuple[bytes, bytes] | None:
    """Go's ``Request.BasicAuth``: "Basic " (any case), base64, user and password split at
    the first colon; None if the header is anything else."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


class Busy(Exception):
    """Too many bcrypt checks are waiting: answer 503, not 401."""


class Authenticator:
    """Basic auth checks against bcrypt hashes, cached, in one worker thread."""

    def __init__(self, cache_size: int = CACHE_SIZE, max_pending: int = MAX_PENDING_CHECKS) -> None:
        self._key = secrets.token_bytes(32)  # cache keys are HMACs under a per-process key
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_size = cache_size
        self._max_pending = max_pending
        self._pending = 0
        self._executor: ThreadPoolExecutor | None = None
        self._dummies: dict[int, bytes] = {}
        self.checks = 0  # bcrypt checks run (the cache's misses), for tests and logs

    def cache_key(self, user: bytes, hashed: bytes, password: bytes) -> bytes:
        # lengths first: no two triples share a key however the bytes are split
        message = b"%d:%d:" % (len(user), len(hashed)) + user + hashed + password
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def cached(self, user: bytes, hashed: bytes, password: bytes) -> bool:
        key = self.cache_key(user, hashed, password)
        if key in self._cache:
            self._cache.move_to_end(key)
            return True
        return False

    def remember(self, user: bytes, hashed: bytes, password: bytes) -> None:
        self._cache[self.cache_key(user, hashed, password)] = None
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def dummy(self, cost: int) -> bytes:
        """A hash of the same cost as the users', for an unknown user (made once per cost)."""
        if cost not in self._dummies:
            self._dummies[cost] = bcrypt.hashpw(b"gpufleet-unknown-user", bcrypt.gensalt(cost))
        return self._dummies[cost]

    def _compare(self, users: dict[bytes, bytes], user: bytes, password: bytes) -> bool:
        """The bcrypt check, blocking (in the worker thread): the cache is left to the
        caller, so that only the event loop's thread ever touches it."""
        hashed = users.get(user)
        if hashed is None:
            costs = [int(h[4:6]) for h in users.values()]
            hashed = self.dummy(max(costs) if costs else 10)
        self.checks += 1
        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:  # a password over 72 bytes: bcrypt 5 refuses it, as Go's does
            ok = False
        return ok and user in users

    def verify(self, users: dict[bytes, bytes], user: bytes, password: bytes) -> bool:
        """The whole check in the calling thread: the cache, then bcrypt (for tests)."""
        hashed = users.get(user)
        if hashed is not None and self.cached(user, hashed, password):
            return True
        ok = self._compare(users, user, password)
        if ok and hashed is not None:
            self.remember(user, hashed, password)
        return ok

    async def check(self, users: dict[bytes, bytes], header: str) -> bool:
        """True if ``header`` (the Authorization value) names a user with the right password.
        A cached success answers on the loop; anything else waits for the worker."""
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = users.get(user)
        if hashed is not None and self.cached(user, hashed, password):
            return True
        if self._pending >= self._max_pending:
            raise Busy
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="bcrypt")
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            ok = await asyncio.shield(loop.run_in_executor(
                self._executor, self._compare, users, user, password))
        finally:
            self._pending -= 1
        if ok and hashed is not None:
            self.remember(user, hashed, password)
        return ok

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


# --- live reload -----------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """One good version of the file: what the handlers and new connections use."""

    web: WebFile
    context: ssl.SSLContext | None
    users: dict[bytes, bytes]
    digest: bytes


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[int, int, int, int] | None, ...]:
    stamps: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            info = os.stat(p)
        except OSError:
            stamps.append(None)
        else:
            # size, inode and ctime too: a rewrite in one mtime tick, or a rename over the file
            stamps.append((info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns))
    return tuple(stamps)


def load_all(path: str, key: str = "web.config_file") -> Loaded:
    """The file, its TLS context and its users; ConfigError on any fault."""
    web = load(path, key)
    context = build_context(web.tls, path) if web.tls.enabled else None
    digest = hashlib.sha256(read_bounded(path, key, path))
    for p in web.tls.files():
        digest.update(b"\0" + read_bounded(p, "tls_server_config", path))
    return Loaded(web, context, dict(web.users), digest.digest())


class LiveWebConfig:
    """The web config file, read again when it or a file it names changes.

    :meth:`poll` (blocking: call it from a thread) looks at most once per
    :data:`RELOAD_INTERVAL`; the first load happens in the constructor, where an error
    stops the start. Turning TLS on or off needs a restart: the scrapers' scheme changes.
    """

    def __init__(self, path: str | Path, key: str = "web.config_file") -> None:
        self.path = str(path)
        self.key = key
        self.current = load_all(self.path, key)
        self._paths = (self.path, *self.current.web.tls.files())
        self._seen = _stamp(self._paths)
        self._failed: tuple[Any, ...] | None = None
        self.reloads = 0
        self.authenticator = Authenticator()
        self._limiter: RateLimiter | None = None

    def allow(self, clock: Callable[[], float] = time.monotonic) -> bool:
        """``rate_limit``: whether this request may go on. The bucket follows the file: a new
        interval or burst starts a new, full bucket (exporter-toolkit keeps the first one)."""
        setting = self.current.web.rate_limit
        if setting is None:
            return True
        limiter = self._limiter
        if limiter is None or (limiter.interval, limiter.burst) != setting:
            limiter = self._limiter = RateLimiter(*setting, clock)
        return limiter.allow()

    @property
    def tls(self) -> bool:
        return self.current.context is not None

    def read_well(self) -> bool:
        """False while the file on disk is a version that failed to load (the last good one
        stays in force): gpufleet_config_last_reload_successful reads it."""
        return self._failed is None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context a new connection gets: the current one."""
        return self.current.context

    def poll(self, force: bool = False) -> bool:
        """Reload if a watched file changed, or at once when ``force`` (SIGHUP); True when
        a new version was taken."""
        stamp = _stamp(self._paths)
        if stamp == self._seen and not force:
            return False
        self._seen = stamp
        try:
            loaded = load_all(self.path, self.key)
            if (loaded.context is None) != (self.current.context is None):
                raise ConfigError(f"{self.path}: tls_server_config: turning TLS "
                                  f"{'on' if loaded.context else 'off'} needs a restart")
        except ConfigError as exc:
            if force or self._failed != stamp:  # one line per broken version, or per SIGHUP
                self._failed = stamp
                log.error(f"web config not reloaded, keeping the last good one: {exc}")
            return False
        self._failed = None
        self._paths = (self.path, *loaded.web.tls.files())
        self._seen = _stamp(self._paths)
        if loaded.digest == self.current.digest:
            return False  # touched, not changed
        self.current = loaded
        self.reloads += 1
        log.info("web config reloaded", extra={"path": self.path, "tls": loaded.context is not None,
                                               "users": len(loaded.users)})
        return True

    async def watch(self, interval: float = RELOAD_INTERVAL) -> None:
        """Poll forever (a background task of the server)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.poll)
            except Exception:  # the watcher outlives any surprise; the last good config stays
                log.exception("web config reload failed")
