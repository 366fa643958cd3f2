"""The one outgoing HTTP client (exporter/http_client.py): no redirect is followed, no answer
is read past its cap, and every outgoing request in the exporter goes through it.

Real aiohttp servers on 127.0.0.1 throughout: a receiver (or apiserver) that redirects to a
second server, which records whatever reaches it; a receiver that streams 1.5 GB.
"""

from __future__ import annotations

import ast
import asyncio
import io
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter import http_client
from exporter.advisor.store import Store
from exporter.advisor.webhook import SIGNATURE_HEADER, Deliverer, Receiver
from exporter.health.act import MAX_RESPONSE_BYTES, ActError, Actor, KubernetesApi
from exporter.health.remediation import Drain
from tests.helpers import REPO
from tests.helpers.fake_apiserver import FakeApiserver

SECRET = b"s3cret-shared-with-the-scheduler"
TOKEN = "t0ken-for-the-apiserver-only"
T0 = 1_764_547_200.0


class Recorder:
    """The second host: records every request that reaches it, whatever its method or path,
    and answers 200 (so a request that did reach it would read as a success)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path, dict(request.headers),
                              await request.read()))
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


def redirector(status: int, to: str) -> web.Application:
    """A first host that answers every request with ``status`` pointing at ``to``."""
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, headers={"Location": to})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _run_until(deliverer: Deliverer, done, timeout: float = 10.0) -> None:
    task = asyncio.create_task(deliverer.run())
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- the webhook sender -----------------------------------------------------------------


@pytest.mark.parametrize("status", [302, 307])
async def test_a_receivers_redirect_is_not_followed_and_the_plan_stays_pending(
        aiohttp_server, tmp_path, status):
    """Before: a 302 became a body-less GET to the second host, whose 200 marked the plan
    delivered (advice lost); a 307 re-sent the signed body and its signature there."""
    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(status, str(other.make_url("/gpufleet"))))
    store = Store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(first.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=30, max_delay=30)
    body = json.dumps({"plan_id": "plan-r", "expires_at": T0 + 10**9}).encode()
    assert deliverer.enqueue("plan-r", body, time.time() + 600) == 1
    await _run_until(deliverer, lambda: sum(deliverer.results.values()) > 0)
    assert elsewhere.requests == []
    assert dict(deliverer.results) == {("slurm", "retry"): 1}
    assert store.status_of("slurm", "plan-r") == (
        "pending", 1, f"HTTP {status}: redirects are not followed")
    assert store.pending_count() == 1


async def test_deliver_due_refuses_a_redirect_on_any_session(aiohttp_server, tmp_path):
    """The request itself asks for no redirect: a plain aiohttp session (not the module's
    guarded one) is handed the 307, and the signed body goes nowhere else."""
    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(307, str(other.make_url("/gpufleet"))))
    store = Store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(first.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=30, max_delay=30)
    deliverer.enqueue("plan-s", b'{"plan_id": "plan-s"}', time.time() + 600)
    async with aiohttp.ClientSession() as session:
        await deliverer.deliver_due(session)
    assert elsewhere.requests == []
    assert store.status_of("slurm", "plan-s") == ("pending", 1, "HTTP 307: redirects are not followed")


GIB_AND_A_HALF = 1536 * (1 << 20)
SENDER = """
import asyncio, json, sys, time
from pathlib import Path
from exporter.advisor.store import Store
from exporter.advisor.webhook import Deliverer, Receiver

async def main(url, db):
    store = Store(Path(db))
    # a timeout long enough to read the whole answer: only the cap may stop the read
    deliverer = Deliverer(store, (Receiver("slurm", url, b"s", timeout=120),),
                          base_delay=60, max_delay=60)
    deliverer.enqueue("plan-big", b'{"plan_id": "plan-big"}', time.time() + 3600)
    task = asyncio.create_task(deliverer.run())
    while not deliverer.results:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
               if line.startswith("VmHWM:"))
    print(json.dumps({"results": {f"{r}/{k}": n for (r, k), n in deliverer.results.items()},
                      "status": store.status_of("slurm", "plan-big"), "hwm_kib": hwm}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
    except OSError:  # ended meanwhile
        return 0


async def test_a_receivers_1_5_gb_answer_keeps_the_sender_under_100_mb_and_the_plan_pending(
        aiohttp_server, tmp_path):
    """Before: ``resp.read()`` held the whole answer (36 MB -> 3.1 GB). The sender runs in a
    process of its own, so its high-water mark is its own; it is stopped (and the test
    fails) as soon as its RSS passes 100 MB."""
    streamed = [0]

    async def huge(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            while streamed[0] < GIB_AND_A_HALF:
                await response.write(chunk)
                streamed[0] += len(chunk)
        except (ConnectionError, RuntimeError):  # the sender hung up: what it should do
            pass
        return response

    app = web.Application()
    app.router.add_post("/gpufleet", huge)
    server = await aiohttp_server(app)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SENDER, str(server.make_url("/gpufleet")),
        str(tmp_path / "outbox.sqlite"), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    peak = 0
    try:
        deadline = time.monotonic() + 120
        while child.returncode is None and time.monotonic() < deadline:
            peak = max(peak, _rss_kib(child.pid))
            if peak > 100 * 1024:
                break
            await asyncio.sleep(0.02)
    finally:
        if child.returncode is None:
            child.kill()
        out, err = await child.communicate()
    assert peak <= 100 * 1024, f"sender RSS {peak // 1024} MiB while reading the answer"
    assert child.returncode == 0, err.decode()[-2000:]
    report = json.loads(out)
    assert report["hwm_kib"] < 100 * 1024
    assert report["results"] == {"slurm/retry": 1}
    assert report["status"] == ["pending", 1, "HTTP 200: answer over the 65,536-byte limit "
                                              "(read stopped there)"]
    assert streamed[0] < GIB_AND_A_HALF


async def test_an_answer_declared_over_the_cap_is_not_read_and_not_delivered(aiohttp_server, tmp_path):
    async def declared(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"x" * (1 << 20))

    app = web.Application()
    app.router.add_post("/gpufleet", declared)
    server = await aiohttp_server(app)
    store = Store(tmp_path / "outbox.sqlite")
    deliverer = Deliverer(store, (Receiver("slurm", str(server.make_url("/gpufleet")), SECRET,
                                            timeout=2),), base_delay=30, max_delay=30)
    deliverer.enqueue("plan-d", b'{"plan_id": "plan-d"}', time.time() + 600)
    await _run_until(deliverer, lambda: sum(deliverer.results.values()) > 0)
    assert store.status_of("slurm", "plan-d") == (
        "pending", 1, "HTTP 200: answer of 1,048,576 bytes, over the 65,536-byte limit")


async def test_a_small_answer_is_still_delivered_and_signed(aiohttp_server, tmp_path):
    """The cap leaves an ordinary receiver alone: a 200 with a small body is delivered."""
    received = Recorder()
    server = await aiohttp_server(received.app())
    store = Store(tmp_path / "outbox.sqlite")
    deliverer = Deliverer(store, (Receiver("slurm", str(server.make_url("/gpufleet")), SECRET,
                                            timeout=2),))
    deliverer.enqueue("plan-ok", b'{"plan_id": "plan-ok"}', time.time() + 600)
    await _run_until(deliverer, lambda: store.pending_count() == 0)
    assert store.status_of("slurm", "plan-ok") == ("delivered", 1, "")
    assert [(m, p) for m, p, _, _ in received.requests] == [("POST", "/gpufleet")]
    assert received.requests[0][2][SIGNATURE_HEADER].startswith("sha256=")


# --- act's Kubernetes client ------------------------------------------------------------


@pytest.mark.parametrize("status", [302, 307])
async def test_act_refuses_an_apiserver_redirect_and_never_sends_the_token_elsewhere(
        aiohttp_server, tmp_path, status):
    """Before: urllib followed the 3xx to the second host with ``Authorization`` kept, and
    built the patch from that host's node."""
    elsewhere = FakeApiserver()  # a real-looking apiserver, with the node, on another port
    elsewhere.add({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "gpu-node-1", "labels": {}}, "spec": {}})
    await elsewhere.start()
    try:
        first = await aiohttp_server(redirector(status, elsewhere.url + "/api/v1/nodes/gpu-node-1"))
        api = KubernetesApi(str(first.make_url("")).rstrip("/"), TOKEN, timeout=5)
        with pytest.raises(ActError) as raised:
            await asyncio.to_thread(api.get_node, "gpu-node-1")
        assert str(raised.value) == \
            f"GET /api/v1/nodes/gpu-node-1: HTTP {status}: redirects are not followed"
        out = io.StringIO()
        actor = Actor("kubernetes", "dry-run", tmp_path / "audit.jsonl", out, api)
        record = await asyncio.to_thread(
            actor.handle, Drain("gpu-node-1", "a", "XID 79 on GPU 3", T0))
        assert record["outcome"] == "failed"
        assert record["error"] == \
            f"GET /api/v1/nodes/gpu-node-1: HTTP {status}: redirects are not followed"
        assert out.getvalue() == ""  # no patch printed from another host's answer
        assert elsewhere.requests == []
    finally:
        await elsewhere.kill()


async def test_act_refuses_an_answer_over_its_cap_rather_than_parse_a_cut_one(aiohttp_server):
    """Before: the first MAX_RESPONSE_BYTES were parsed, and failed as bad JSON."""
    async def node(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()  # no Content-Length: the read itself must stop
        await response.prepare(request)
        await response.write(b'{"kind": "Node", "pad": "' + b"x" * (MAX_RESPONSE_BYTES + 10) + b'"}')
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{name}", node)
    server = await aiohttp_server(app)
    api = KubernetesApi(str(server.make_url("")).rstrip("/"), TOKEN, timeout=5)
    with pytest.raises(ActError) as raised:
        await asyncio.to_thread(api.get_node, "gpu-node-1")
    assert str(raised.value) == (f"GET /api/v1/nodes/gpu-node-1: answer over the "
                                 f"{MAX_RESPONSE_BYTES:,}-byte limit (read stopped there)")


async def test_act_gives_an_apiserver_error_in_one_bounded_line(aiohttp_server):
    async def refuse(request: web.Request) -> web.Response:
        message = "nodes is forbidden:\nline two\x1b[31m " + "y" * 5000
        return web.json_response({"kind": "Status", "code": 403, "message": message}, status=403)

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{name}", refuse)
    server = await aiohttp_server(app)
    api = KubernetesApi(str(server.make_url("")).rstrip("/"), TOKEN, timeout=5)
    with pytest.raises(ActError) as raised:
        await asyncio.to_thread(api.get_node, "gpu-node-1")
    text = str(raised.value)
    assert text.startswith("GET /api/v1/nodes/gpu-node-1: HTTP 403: nodes is forbidden: line two [31m yyy")
    assert "\n" not in text and "\x1b" not in text and text.endswith("...")
    assert len(text) == len("GET /api/v1/nodes/gpu-node-1: HTTP 403: ") + 300


# --- the other clients: the sources and gpufleet plan -----------------------------------


async def test_a_dcgm_targets_redirect_is_not_followed(aiohttp_server):
    """A target speaks for its own address: before, its 302 took the scrape to whatever
    host it named, and that host's GPUs were read as the target's."""
    from exporter.config import Duration
    from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
    from exporter.sources.dcgm.source import DcgmExporterSource

    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(302, str(other.make_url("/metrics"))))
    source = DcgmExporterSource(DcgmConfig(enabled=True, targets=(str(first.make_url("/metrics")),),
                                           timeout=Duration(5.0)), time.time)
    try:
        reading = await source.read()
    finally:
        await source.close()
    assert [(t.up, t.error) for t in reading.targets] == [
        (False, "ValueError: HTTP 302: redirects are not followed")]
    assert elsewhere.requests == []


async def test_the_prometheus_sources_query_is_not_sent_where_a_redirect_points(aiohttp_server):
    """Before: a 307 re-sent the query form (and its credentials' reach) to the other host."""
    from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
    from exporter.sources.prometheus.source import PrometheusFleetSource, PrometheusQueryError

    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(307, str(other.make_url("/api/v1/query"))))
    source = PrometheusFleetSource(PrometheusConfig(url=str(first.make_url("")).rstrip("/")),
                                   time.time)
    try:
        with pytest.raises(PrometheusQueryError, match="HTTP 307: redirects are not followed"):
            await source.read()
    finally:
        await source.close()
    assert elsewhere.requests == []


async def test_the_kubernetes_informer_lists_from_its_apiserver_only(aiohttp_server):
    from exporter.sources.kubernetes.informer import ApiError, Endpoint, Informer, Limits

    elsewhere = FakeApiserver()
    await elsewhere.start()
    try:
        first = await aiohttp_server(redirector(302, elsewhere.url + "/api/v1/pods"))

        async def auth() -> str:
            return f"Bearer {TOKEN}"

        async with http_client.client_session() as session:
            informer = Informer(session, Endpoint(str(first.make_url("")).rstrip("/"), None, auth),
                                "/api/v1/pods", lambda obj: obj, Limits(backoff_max=0.1))
            with pytest.raises(ApiError) as raised:
                await informer.relist()
        assert (raised.value.status, str(raised.value)) == (302, "HTTP 302: redirects are not followed")
        assert elsewhere.requests == []
    finally:
        await elsewhere.kill()


async def test_gpufleet_plan_refuses_a_redirect_with_the_clients_reason(aiohttp_server):
    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(302, str(other.make_url("/v1/advice"))))
    url = str(first.make_url("/v1/advice"))
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "plan", "--from", url, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await done.communicate()
    assert (done.returncode, out, err.decode()) == (
        1, b"", f"gpufleet: {url}: HTTP 302: redirects are not followed\n")
    assert elsewhere.requests == []


# --- the module itself ------------------------------------------------------------------


async def test_the_sessions_guard_refuses_a_redirect_a_caller_forgot_to_refuse(aiohttp_server):
    """A request sent without allow_redirects=False on the module's session fails with
    the 3xx before the next hop: nothing reaches the second host."""
    elsewhere = Recorder()
    other = await aiohttp_server(elsewhere.app())
    first = await aiohttp_server(redirector(307, str(other.make_url("/x"))))
    async with http_client.client_session() as session:
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            async with session.post(first.make_url("/x"), data=b"secret",
                                    headers={"Authorization": "Bearer t"}):
                pass
    assert raised.value.status == 307 and raised.value.message == "HTTP 307: redirects are not followed"
    assert elsewhere.requests == []
    with pytest.raises(TypeError):
        http_client.request(session, "GET", "http://127.0.0.1/", allow_redirects=True)


async def test_read_capped_stops_at_the_cap_and_reads_what_fits(aiohttp_server):
    async def body(request: web.Request) -> web.StreamResponse:
        size = int(request.query["size"])
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(size // 1000):
            await response.write(b"y" * 1000)
        return response

    app = web.Application()
    app.router.add_get("/", body)
    server = await aiohttp_server(app)
    async with http_client.client_session() as session:
        async with http_client.request(session, "GET", str(server.make_url("/?size=10000"))) as r:
            assert await http_client.read_capped(r, 10_000) == b"y" * 10_000
        async with http_client.request(session, "GET", str(server.make_url("/?size=11000"))) as r:
            with pytest.raises(http_client.AnswerTooLarge) as raised:
                await http_client.read_capped(r, 10_000)
    assert raised.value.declared is None and raised.value.limit == 10_000


def test_fetch_hands_back_a_redirect_and_follows_nothing():
    """The synchronous client: a 3xx is an Answer; urllib's handler would have followed it."""
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            if self.path == "/start":
                self.send_response(301)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        answer = http_client.fetch("GET", base + "/start", max_bytes=100, timeout=5)
        assert (answer.status, answer.body) == (301, b"")
        assert hits == ["/start"]
        assert http_client.fetch("GET", base + "/x", max_bytes=100, timeout=5).body == b"{}"
        with pytest.raises(http_client.AnswerTooLarge) as raised:
            http_client.fetch("GET", base + "/x", max_bytes=1, timeout=5)
        assert raised.value.declared == 2
    finally:
        server.shutdown()
        server.server_close()


# --- used everywhere --------------------------------------------------------------------

CLIENT_MODULE = "exporter/http_client.py"
REQUEST_METHODS = {"get", "post", "put", "patch", "delete", "head", "options", "request",
                   "ws_connect"}


def outgoing_requests_outside_the_client(source: str) -> list[str]:
    """What in ``source`` makes an HTTP request without the client module: a ClientSession
    made directly, urllib's or http.client's requests, aiohttp.request, or a request method
    called on a session object."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {n}" for n in names if n in ("urllib.request", "http.client",
                                                             "requests", "httpx")]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("ClientSession", "urlopen"):
            found.append(f"{name}()")
        if isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            if name in REQUEST_METHODS and "session" in receiver.lower():
                found.append(f"{receiver}.{name}()")
            if receiver == "aiohttp" and name == "request":
                found.append("aiohttp.request()")
    return found


def test_the_scan_finds_each_way_around_the_client():
    source = ("import urllib.request\n"
              "s = aiohttp.ClientSession()\n"
              "urllib.request.urlopen(r)\n"
              "self._session.get(url)\n"
              "session.post(url, allow_redirects=False)\n"
              "aiohttp.request('GET', url)\n"
              "request.get('x')\n")  # a web handler's request: not a client
    assert outgoing_requests_outside_the_client(source) == [
        "import urllib.request", "ClientSession()", "urlopen()", "self._session.get()",
        "session.post()", "aiohttp.request()"]


def test_every_outgoing_request_goes_through_the_client_module():
    found = {}
    for path in sorted((REPO / "exporter").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative == CLIENT_MODULE:
            continue
        if uses := outgoing_requests_outside_the_client(path.read_text()):
            found[relative] = uses
    assert found == {}
    assert Path(REPO / CLIENT_MODULE).is_file()
