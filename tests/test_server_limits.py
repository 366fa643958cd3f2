"""Connection limits of the served app: idle floods, slow-loris, keep-alive, requests in flight.

Each test runs the real listening path (:func:`exporter.web.server.start`: the gate in front of
aiohttp's protocol) on 127.0.0.1 with small limits, and talks to it over raw sockets, so
what is measured is what a hostile client sees. Timing bounds are generous (seconds of
slack): these tests prove that a connection is closed, not how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import re
import resource
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.collect import Collector
from exporter.config import Config, WebConfig
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.connection_gate import (
    WRITE_CHUNK,
    accept_error_handler,
    effective_max_connections,
    listen_backlog,
    shed_log,
)
from exporter.web.server import STATE, make_app, start
from tests.helpers.servers import closed_within

START = 1_760_000_000.0
SLACK = 5.0  # seconds a close may take beyond its timeout on a loaded 2-core machine


@contextlib.asynccontextmanager
async def serving(web_config: WebConfig, blocked: asyncio.Event | None = None,
                  apps: list[web.Application] | None = None) -> AsyncIterator[int]:
    """The exporter (seed-1 simulated fleet) on a free port; ``/block`` waits for ``blocked``."""
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=60, source_timeout=5, web=web_config)
    app = make_app(config, Collector([sim], config.source_timeout, clock=lambda: START))
    if blocked is not None:
        async def block(request: web.Request) -> web.Response:
            await blocked.wait()
            return web.Response(text="released\n")
        app.router.add_get("/block", block)


    async def echo(request: web.Request) -> web.Response:
        """The body's length, after ``?sleep=S`` seconds of work once it is in."""
        body = await request.read()
        await asyncio.sleep(float(request.query.get("sleep", 0)))
        return web.Response(text=f"{len(body)}\n")
    app.router.add_post("/echo", echo)
    if apps is not None:
        apps.append(app)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    runner = await start(app, sock, web_config)
    try:
        for _ in range(200):  # first collection
            status, _ = await get(port, "/-/ready")
            if status == 200:
                break
            await asyncio.sleep(0.05)
        yield port
    finally:
        if blocked is not None:
            blocked.set()
        await runner.cleanup()


async def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """One GET on a fresh connection (``Connection: close``): status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def shed_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("connections shed")]


async def test_idle_flood_leaves_metrics_served_and_logs_once(caplog):
    caplog.set_level(logging.INFO, logger="exporter")
    async with serving(WebConfig(max_connections=20)) as port:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(60)]
        try:
            await asyncio.sleep(0.2)
            status, body = await get(port, "/metrics")
            assert status == 200
            assert b"\ngpufleet_gpu_utilization_ratio{" in body
            # the oldest silent connections made room: at least 40 of the 60 are closed
            closed = [await closed_within(r, 0.5) for r, _ in idle]
            assert sum(closed) >= 40
        finally:
            for _, w in idle:
                w.close()
        await asyncio.sleep(0.1)
    # 40+ evictions in one burst are one summary line, not one per accept()
    lines = shed_lines(caplog)
    assert 1 <= len(lines) <= 2
    assert sum(getattr(r, "evicted", 0) for r in lines) >= 40


async def test_a_flood_of_silent_connections_never_closes_a_kept_alive_scraper():
    """Prometheus reuses its connection between scrapes. A flood of silent sockets over the
    limit is shed silent-first, so the scraper's idle kept-alive connection stays open and
    its next scrape never queues behind the flood's handshakes (docs/reliability.md, row 2);
    it was the longest-waiting idle connection, and closed first."""
    async with serving(WebConfig(max_connections=20)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def scrape() -> bytes:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
            length = re.search(rb"Content-Length: (\d+)", head, re.I)
            assert length is not None, head
            await asyncio.wait_for(reader.readexactly(int(length.group(1))), SLACK)
            return head

        try:
            assert (await scrape()).startswith(b"HTTP/1.1 200")
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(60)]
            try:
                await asyncio.sleep(0.2)
                assert (await scrape()).startswith(b"HTTP/1.1 200")  # on the same connection
                assert sum([await closed_within(r, 0.5) for r, _ in idle]) >= 40
            finally:
                for _, w in idle:
                    w.close()
        finally:
            writer.close()


async def test_only_kept_alive_connections_left_the_longest_idle_is_closed_for_a_new_one():
    """With no silent connection to shed, a new connection still gets a slot: the kept-alive
    connection idle longest is closed."""
    async with serving(WebConfig(max_connections=3)) as port:
        kept = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
            kept.append((reader, writer))
            await asyncio.sleep(0.05)
        try:
            assert (await get(port, "/-/healthy"))[0] == 200
            assert await closed_within(kept[0][0], SLACK)  # the longest idle
        finally:
            for _, w in kept:
                w.close()


async def test_full_gate_refuses_new_connections_at_once():
    blocked = asyncio.Event()
    async with serving(WebConfig(max_connections=2, max_requests=0), blocked) as port:
        busy = [asyncio.create_task(get(port, "/block")) for _ in range(2)]
        await asyncio.sleep(0.3)  # both requests in flight: no slot is evictable
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            assert await closed_within(reader, SLACK)
        finally:
            writer.close()
        blocked.set()
        assert [(await t)[0] for t in busy] == [200, 200]
        assert (await get(port, "/metrics"))[0] == 200


async def test_slow_loris_closed_after_header_timeout():
    async with serving(WebConfig(header_timeout=0.5, keepalive_timeout=60)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")  # headers never end
            await writer.drain()
            assert await closed_within(reader, 0.5 + SLACK)
        finally:
            writer.close()
        # a silent connection gets the same limit for its first request
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await closed_within(reader, 0.5 + SLACK)
        finally:
            writer.close()


async def test_idle_keepalive_connection_closed_after_keepalive_timeout():
    async with serving(WebConfig(header_timeout=0.3, keepalive_timeout=2.5)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(2):  # the connection is reused between "scrapes"
                writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: t\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            # idle, with no byte of a request: the header timeout does not apply...
            assert not await closed_within(reader, 1.0)
            # ...the keep-alive timeout does
            assert await closed_within(reader, 2.5 + SLACK)
        finally:
            writer.close()


async def test_max_requests_per_endpoint_answers_503():
    blocked = asyncio.Event()
    async with serving(WebConfig(max_requests=1), blocked) as port:
        first = asyncio.create_task(get(port, "/block"))
        await asyncio.sleep(0.3)
        status, body = await get(port, "/block")
        assert status == 503
        assert b"limit of concurrent requests reached (1)" in body
        assert (await get(port, "/metrics"))[0] == 200  # the limit is per endpoint
        blocked.set()
        assert (await first)[0] == 200
        assert (await get(port, "/block"))[0] == 200  # the slot is released


async def test_accept_errors_are_rate_limited(caplog):
    caplog.set_level(logging.INFO, logger="exporter")
    loop = asyncio.get_running_loop()
    others: list[dict] = []
    lines = shed_log(loop)
    handler = accept_error_handler(lines, fallback=lambda _loop, context: others.append(context))
    for _ in range(5000):  # what asyncio reports when accept() hits the open-file limit
        handler(loop, {"message": "socket.accept() out of system resource",
                       "exception": OSError(errno.EMFILE, "Too many open files")})
    handler(loop, {"message": "something else", "exception": RuntimeError("x")})
    await asyncio.sleep(0.1)
    lines.close()  # what is left is flushed at shutdown
    logged = shed_lines(caplog)
    assert len(logged) == 1
    assert logged[0].accept_errors == 5000
    assert logged[0].error == "Too many open files"
    assert [c["message"] for c in others] == ["something else"]


def test_max_connections_fits_the_open_file_limit():
    # two accept batches of 128 are kept free, and half of the rest
    assert effective_max_connections(1000, soft=1024) == 384
    assert effective_max_connections(1000, soft=512) == 128
    assert effective_max_connections(1000, soft=100_000) == 1000
    assert effective_max_connections(1000, soft=resource.RLIM_INFINITY) == 1000
    assert effective_max_connections(1000, soft=100) == 1


def test_listen_backlog_is_two_accept_batches_within_somaxconn(tmp_path):
    somaxconn = tmp_path / "somaxconn"
    for written, backlog in (("4096\n", 256), ("100", 100), ("x", 256)):
        somaxconn.write_text(written)
        assert listen_backlog(str(somaxconn)) == backlog
    assert listen_backlog(str(tmp_path / "missing")) == 256


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_the_listening_socket_queues_two_accept_batches():
    # asyncio listens with its accept batch, 128: wrk -c1000 overflowed it (1,592
    # ListenOverflows in 15 s) and the dropped handshakes waited 1 s or more to be retried
    async with serving(WebConfig()) as port:
        out = subprocess.run(["ss", "-Hlnt", f"sport = :{port}"], capture_output=True,
                             text=True, check=True).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert int(out[2]) == listen_backlog() == min(256, somaxconn)  # ss: a listener's Send-Q


async def test_a_large_metrics_body_is_written_whole_in_slices():
    apps: list[web.Application] = []
    async with serving(WebConfig(), apps=apps) as port:
        rendered = apps[0][STATE].current
        assert rendered is not None
        text = rendered.text
        assert len(text) > 4 * WRITE_CHUNK  # the simulated fleet's /metrics is sliced
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for method in ("GET", "HEAD", "GET"):  # one kept-alive connection
                writer.write(f"{method} /metrics HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                assert length == len(text)
                if method == "GET":
                    assert await asyncio.wait_for(reader.readexactly(length), 30) == text
        finally:
            writer.close()


async def _post(port: int, path: str, body: bytes, drip: float = 0.0) -> tuple[bytes, bool]:
    """A POST on a fresh connection, its body sent at once or a byte every ``drip`` seconds:
    the answer's head and whether the server closed the connection after it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
                     "\r\n".encode())
        if drip:
            async def dripping() -> None:
                with contextlib.suppress(ConnectionError):
                    for byte in body:
                        writer.write(bytes([byte]))
                        await writer.drain()
                        await asyncio.sleep(drip)
            sender = asyncio.create_task(dripping())
        else:
            writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        closed = await closed_within(reader, SLACK)
        if drip:
            sender.cancel()
        return head, closed
    finally:
        writer.close()


async def test_a_slow_drip_body_gets_408_and_its_slot_back():
    async with serving(WebConfig(body_timeout=0.5, max_requests=1)) as port:
        # 100 bytes at one per 0.2 s: 20 s if let through
        head, closed = await _post(port, "/echo", b"x" * 100, drip=0.2)
        assert head.startswith(b"HTTP/1.1 408 ")
        assert closed  # the rest of the body is never read
        # the endpoint's one slot is free again; a body that arrived in time is not cut,
        # however long the handler then works
        head, closed = await _post(port, "/echo?sleep=1.5", b"y" * 100)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert not closed


def test_no_private_asyncio_module_is_imported():
    """The gate wraps TLS with loop.start_tls (public); asyncio's sslproto, selector and
    base-loop modules are private and change between Python versions."""
    import re
    from pathlib import Path

    private = re.compile(r"asyncio\.(sslproto|base_events|selector_events|proactor_events|"
                         r"unix_events|transports\._)|from asyncio import .*\b(sslproto|base_events|"
                         r"selector_events)\b")
    found = [str(p) for p in Path("exporter").rglob("*.py") if private.search(p.read_text())]
    assert found == []
