"""A real Alertmanager and an aiohttp webhook receiver, for the alerting tests.

The receiver runs its own event loop in a thread, so a test can block on
process start-ups while Alertmanager's webhooks still land.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from exporter.durations import parse_duration
from tests.helpers.data import REPO
from tests.helpers.servers import Server, free_port, http_get, require_binary, start_server

DEPLOY_ALERTMANAGER = REPO / "deploy" / "alertmanager.yml"


class Alertmanager(Server):
    """A real Alertmanager, with the parts of its API the tests use."""

    def alerts(self, **matchers: str) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds, with their status (suppressed, inhibitedBy)."""
        query = urllib.parse.urlencode(
            [("filter", f'{k}="{v}"') for k, v in matchers.items()], doseq=True)
        return json.loads(http_get(f"{self.url}/api/v2/alerts?{query}"))

    def post(self, alerts: list[dict[str, Any]]) -> None:
        import urllib.request

        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200


def start_alertmanager(workdir: Path, config: dict[str, Any]) -> Alertmanager:
    binary = require_binary("prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    proc = start_server(
        "alertmanager", workdir, port,
        [binary, f"--config.file={path}", f"--storage.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address=",  # no gossip port: one instance, nothing to clash with
         "--log.level=debug"])
    return Alertmanager(proc, port, workdir, workdir / "alertmanager.log")


def prometheus_config(exporter_port: int, alertmanager_port: int, rules: list[str]) -> str:
    """deploy/prometheus.yml with 1s intervals, one exporter and these rule files.

    One exporter in node mode: the gpufleet-nodes job alone (a cluster-mode job with no
    target only adds GpufleetTargetDown for it, which the end-to-end tests do not look at).
    """
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = rules
    config["alerting"]["alertmanagers"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{alertmanager_port}"]}]
    scrape = config["scrape_configs"][0]
    config["scrape_configs"] = [scrape]
    scrape.update(scrape_interval="1s", scrape_timeout="1s",
                  static_configs=[{"targets": [f"127.0.0.1:{exporter_port}"]}])
    return yaml.safe_dump(config, sort_keys=False)


ADVISOR_TOKEN = "advisor-token-for-tests"


def routed_config(receiver_url: str, fast: bool = True,
                  time_scale: float | None = None) -> dict[str, Any]:
    """deploy/alertmanager.yml with every webhook pointing at ``receiver_url/<receiver>``.

    ``fast`` shortens the grouping waits to 1s for end-to-end tests; ``time_scale``
    instead multiplies every wait and interval by it (a replay at speed 60 uses 1/60,
    so the committed timers hold in simulated time). The routing tree, matchers and
    inhibit rules stay exactly as committed.
    """
    config = yaml.safe_load(DEPLOY_ALERTMANAGER.read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{receiver_url}/{receiver['name']}"
            auth = hook.get("http_config", {}).get("authorization")
            if auth and "credentials_file" in auth:  # the committed path exists only in production
                del auth["credentials_file"]
                auth["credentials"] = ADVISOR_TOKEN
    routes = [config["route"], *config["route"].get("routes", [])]
    if time_scale is not None:
        for route in routes:
            for key in ("group_wait", "group_interval", "repeat_interval"):
                if key in route:
                    scaled = parse_duration(route[key]) * time_scale
                    route[key] = f"{max(1, round(scaled * 1000))}ms"
    elif fast:
        for route in routes:
            for key in ("group_wait", "group_interval"):
                if key in route:
                    route[key] = "1s"
    return config


@dataclass
class Notification:
    receiver: str  # the path it was posted to: the Alertmanager receiver's name
    at: float  # time.monotonic() when it arrived
    payload: dict[str, Any]
    authorization: str = ""  # the Authorization header Alertmanager sent


@dataclass
class WebhookReceiver:
    """An aiohttp server that records every Alertmanager webhook it receives."""

    port: int = field(default_factory=free_port)
    received: list[Notification] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        with self._lock:
            self.received.append(Notification(request.match_info["receiver"], time.monotonic(),
                                              payload, request.headers.get("Authorization", "")))
        return web.Response(text="ok")

    def start(self) -> WebhookReceiver:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/{receiver}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="webhook-receiver", daemon=True)
        self._thread.start()
        assert started.wait(10), "webhook receiver did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def alerts(self, receiver: str) -> list[tuple[float, dict[str, Any]]]:
        """(arrival time, alert) for every alert notified to ``receiver`` so far."""
        with self._lock:
            return [(n.at, alert) for n in self.received if n.receiver == receiver
                    for alert in n.payload.get("alerts", [])]
