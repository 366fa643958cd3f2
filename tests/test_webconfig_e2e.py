"""The web config file against real components: certificates from Debian's ``openssl``, a
real Prometheus scraping over TLS with a client certificate and basic auth, plain HTTP
to the TLS port, a reload (new certificate, new password) under keep-alive load, and
the bearer token on GET /v1/snapshot with its gzip."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.servers import Server, start_exporter, start_prometheus, stop, wait_until
from tests.helpers.tls import Pki, bcrypt_hash, make_pki

pytestmark = pytest.mark.slow

TOKEN = "t0ken-for-reads"
CONFIG = "collect_interval: 60\n"  # one snapshot: every read in a test sees the same one


def _web_yml(pki: Pki, password: str, cert: Path | None = None, key: Path | None = None) -> str:
    return f"""tls_server_config:
  cert_file: {(cert or pki.cert).name}
  key_file: {(key or pki.key).name}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
http_server_config:
  headers:
    X-Content-Type-Options: nosniff
basic_auth_users:
  prometheus: {bcrypt_hash(password, 10)}
"""


def _client_context(pki: Pki, with_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def _auth(password: str, user: str = "prometheus") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _get(url: str, context: ssl.SSLContext, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _start(tmp_path: Path, pki: Pki, password: str = "secret") -> tuple[Server, str]:
    web = pki.folder / "web.yml"
    web.write_text(_web_yml(pki, password))
    exporter = start_exporter(tmp_path, "--web.config.file", str(web), config=CONFIG,
                              env={"GPUFLEET_ADVISOR_TOKEN": TOKEN}, ready=False, fleet="small")
    base = f"https://127.0.0.1:{exporter.port}"
    context = _client_context(pki)

    def ready() -> bool:
        if exporter.proc.poll() is not None:
            raise AssertionError(f"exporter exited: {exporter.log.read_text()[-2000:]}")
        try:
            return _get(f"{base}/-/ready", context, _auth(password))[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    try:
        wait_until("the exporter to answer over TLS", ready, timeout=60)
    except AssertionError:
        stop(exporter.proc)
        raise
    return exporter, base


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path, pki):
    exporter, base = _start(tmp_path, pki)
    try:
        jobs = []
        for job, password in (("gpufleet", "secret"), ("wrong-password", "nope")):
            jobs.append(f"""  - job_name: {job}
    scrape_interval: 3s
    scrape_timeout: 3s  # a 2-core machine shared with other work: room for one slow scrape
    scheme: https
    tls_config:
      ca_file: {pki.ca}
      cert_file: {pki.client_cert}
      key_file: {pki.client_key}
    basic_auth:
      username: prometheus
      password: {password}
    static_configs:
      - targets: ["127.0.0.1:{exporter.port}"]
""")
        prometheus = start_prometheus(tmp_path / "prometheus",
                                      "global:\n  scrape_interval: 3s\nscrape_configs:\n" + "".join(jobs))
        try:
            up = prometheus.wait_for('up{job="gpufleet"}',
                                     lambda r: r and r[0]["value"][1] == "1", timeout=60)
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{exporter.port}"
            wait_until("the exporter's GPUs in Prometheus", lambda: prometheus.query(
                'count(gpufleet_gpu_utilization_ratio{job="gpufleet"})'))
            gpus = prometheus.query('count(gpufleet_gpu_utilization_ratio{job="gpufleet"})')
            assert gpus[0]["value"][1] == "128"  # the tests' small simulated fleet
            wrong = prometheus.wait_for('up{job="wrong-password"}', lambda r: bool(r))
            assert wrong[0]["value"][1] == "0"
            targets = json.loads(urllib.request.urlopen(
                f"{prometheus.url}/api/v1/targets", timeout=10).read())["data"]["activeTargets"]
            errors = {t["labels"]["job"]: t["lastError"] for t in targets}
            assert errors == {"gpufleet": "", "wrong-password": "server returned HTTP status 401 "
                              "Unauthorized"}
        finally:
            stop(prometheus.proc)
        # the same from a plain client: 401 with the header, and the configured header
        status, headers, _ = _get(f"{base}/metrics", _client_context(pki), _auth("nope"))
        assert (status, headers["WWW-Authenticate"], headers["X-Content-Type-Options"]) == (
            401, "Basic", "nosniff")
        # RequireAndVerifyClientCert: no client certificate, no handshake
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            _get(f"{base}/metrics", _client_context(pki, with_cert=False), _auth("secret"))
        # plain HTTP to the TLS port: no HTTP answer at all
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError,
                            urllib.error.URLError)):
            urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10)
    finally:
        stop(exporter.proc)
    assert "Traceback" not in exporter.log.read_text()


class Hammer(threading.Thread):
    """GET /metrics in a loop on one keep-alive TLS connection; on a 401 it switches to the
    new password (as a scraper whose config was updated would)."""

    def __init__(self, port: int, context: ssl.SSLContext, passwords: list[str]) -> None:
        super().__init__(daemon=True)
        self.connection = http.client.HTTPSConnection("127.0.0.1", port, context=context,
                                                      timeout=30)
        self.passwords = passwords
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.sockets: set[int] = set()  # local ports used
        self.stop = threading.Event()

    def run(self) -> None:
        password = self.passwords[0]
        while not self.stop.is_set():
            try:
                self.connection.request("GET", "/metrics",
                                        headers={**_auth(password), "Accept-Encoding": "gzip"})
                response = self.connection.getresponse()
                response.read()
            except Exception as exc:  # counted: the test asserts there is none
                self.errors.append(repr(exc))
                return
            assert self.connection.sock is not None
            self.sockets.add(self.connection.sock.getsockname()[1])  # a reconnect: a new port
            self.statuses.append(response.status)
            if response.status == 401:
                password = self.passwords[1]


def test_reload_under_keepalive_load_drops_nothing(tmp_path, pki):
    exporter, base = _start(tmp_path, pki)
    try:
        hammers = [Hammer(exporter.port, _client_context(pki), ["secret", "n3w-secret"])
                   for _ in range(4)]
        for h in hammers:
            h.start()
        wait_until("requests before the reload", lambda: all(len(h.statuses) >= 5 for h in hammers))
        before = [len(h.statuses) for h in hammers]
        renewed = make_pki(pki.folder, "renewed")  # a new certificate from the same CA
        (pki.folder / "web.yml").write_text(_web_yml(pki, "n3w-secret", renewed.cert, renewed.key))
        wait_until("the reload", lambda: "web config reloaded" in exporter.log.read_text())
        # a new connection gets the new certificate; the old password is refused
        with _client_context(pki).wrap_socket(
                socket.create_connection(("127.0.0.1", exporter.port), timeout=10),
                server_hostname="127.0.0.1") as tls:
            served = tls.getpeercert(binary_form=True)
        assert served == ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
        assert _get(f"{base}/-/healthy", _client_context(pki), _auth("secret"))[0] == 401
        assert _get(f"{base}/-/healthy", _client_context(pki), _auth("n3w-secret"))[0] == 200
        wait_until("requests after the reload",
                   lambda: all(len(h.statuses) >= b + 20 for h, b in zip(hammers, before, strict=True)))
        for h in hammers:
            h.stop.set()
        for h in hammers:
            h.join(60)
        for h in hammers:
            assert h.errors == []
            assert len(h.sockets) == 1  # one keep-alive connection throughout: never dropped
            first_401 = h.statuses.index(401)
            # 200s with the old password, one 401 at the switch, 200s with the new one
            assert set(h.statuses[:first_401]) == {200}
            assert set(h.statuses[first_401 + 1:]) == {200}
        total = sum(len(h.statuses) for h in hammers)
        print(f"reload under load: {total} requests on 4 keep-alive connections, 0 errors")
    finally:
        stop(exporter.proc)
    log = exporter.log.read_text()
    assert log.count("web config reloaded") == 1
    assert "Traceback" not in log


def test_snapshot_needs_the_token_and_gzips_the_same_json(tmp_path, pki):
    exporter, base = _start(tmp_path, pki)
    try:
        context = _client_context(pki)
        status, headers, body = _get(f"{base}/v1/snapshot", context, _auth("secret"))
        assert (status, json.loads(body)) == (401, {"error": "missing bearer token"})
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        status, headers, plain = _get(f"{base}/v1/snapshot", context,
                                      {**bearer, "Accept-Encoding": "identity"})
        assert status == 200 and "Content-Encoding" not in headers
        status, headers, zipped = _get(f"{base}/v1/snapshot", context,
                                       {**bearer, "Accept-Encoding": "gzip"})
        assert (status, headers["Content-Encoding"], headers["Vary"]) == (200, "gzip",
                                                                          "Accept-Encoding")
        assert gzip.decompress(zipped) == plain
        snapshot = json.loads(plain, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
        assert len(snapshot["gpus"]) == 128
        assert len(zipped) * 5 < len(plain)
        # the openapi document stays public for the token (basic auth still applies)
        status, _, _ = _get(f"{base}/v1/openapi.json", context, _auth("secret"))
        assert status == 200
    finally:
        stop(exporter.proc)
    assert "Traceback" not in exporter.log.read_text()
