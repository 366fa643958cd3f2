"""Issue 44: the pager follows gpufleet's own verdicts, on a real Prometheus and Alertmanager.

The XID page resolved 10 minutes after the event while /v1/advice still said the GPU was
failing, and GpuLost re-paged every hour after its node was drained. Here one exposition,
what a cluster-mode gpufleet serves (GPU values, health verdicts, the scheduler's drain
state), is scraped every second by a real Prometheus running `gpufleet rules --time-scale`
from the committed table, and a real Alertmanager runs the committed routing and inhibit
rules (deploy/alertmanager.yml), every timer scaled the same (routed_config): repeat 1 h is
18 s here. The exposition changes between phases as gpufleet's would:

1. two lost GPUs of one pool (gpu-001 and gpu-002) and a GPU with a fresh XID 79 that its
   verdict holds failing (gpu-003): GpuLost pages both, GpuXidError pages gpu-003;
2. the scheduler drains gpu-001 (``gpufleet_node_drained``): GpuNodeDrained tickets it and
   Alertmanager mutes its page; over more than one repeat interval gpu-002 re-pages and
   gpu-001 never does, while the XID page stays firing long past its 10 min (3 s);
3. gpu-003's verdict clears: its XID page resolves.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exporter.cli import main
from tests.helpers import REPO, stop
from tests.helpers.alerting import (
    WebhookReceiver,
    prometheus_config,
    routed_config,
    start_alertmanager,
)

pytestmark = [pytest.mark.slow, pytest.mark.alone]

TIME_SCALE = 0.005  # for 5m -> 1.5 s, [10m] -> 3 s; Alertmanager's repeat 1h -> 18 s
REPEAT_SECONDS = 3600 * TIME_SCALE
POOL = 'pool="gpu-h100",model="H100"'


def _gpu(node: str, gpu: str) -> str:
    return f'node="{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",{POOL}'


class Exposition:
    """/metrics from this process; ``set`` swaps what the next scrape reads."""

    def __init__(self) -> None:
        self.body = b""
        exposition = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exposition.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, *, drained: bool, xid_failing: bool, xid_at: float) -> None:
        lines = [
            *(f"gpufleet_gpu_up{{{_gpu(n, '0')}}} 0" for n in ("gpu-001", "gpu-002")),
            f"gpufleet_gpu_up{{{_gpu('gpu-003', '1')}}} 1",
            f'gpufleet_gpu_xid_errors_total{{{_gpu("gpu-003", "1")},xid="79"}} 1',
            f"gpufleet_gpu_last_xid_timestamp_seconds{{{_gpu('gpu-003', '1')}}} {xid_at}",
            *(f'gpufleet_gpu_health_verdict{{node="{n}",gpu="0",pool="gpu-h100",'
              'verdict="failing",signal="gpu_lost"} 1' for n in ("gpu-001", "gpu-002")),
            *(f'gpufleet_node_health_verdict{{node="{n}",pool="gpu-h100",verdict="failing"}} 1'
              for n in ("gpu-001", "gpu-002")),
        ]
        if xid_failing:
            lines += ['gpufleet_gpu_health_verdict{node="gpu-003",gpu="1",pool="gpu-h100",'
                      'verdict="failing",signal="xid"} 1',
                      'gpufleet_node_health_verdict{node="gpu-003",pool="gpu-h100",'
                      'verdict="failing"} 1']
        if drained:
            lines.append('gpufleet_node_drained{node="gpu-001",pool="gpu-h100"} 1')
        self.body = ("\n".join(lines) + "\n").encode()


def _paged(receiver: WebhookReceiver, alertname: str, node: str, since: float = 0.0) -> list:
    return [(at, a) for at, a in receiver.alerts("pager") if at >= since
            and a["status"] == "firing" and a["labels"].get("alertname") == alertname
            and a["labels"].get("node") == node]


def _wait(what: str, found, timeout: float, prom, manager):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.25)
    firing = sorted({(r["metric"]["alertname"], r["metric"].get("node", ""))
                     for r in prom.query('ALERTS{alertstate="firing"}')})
    held = sorted({(a["labels"]["alertname"], a["labels"].get("node", ""), a["status"]["state"])
                   for a in manager.alerts()})
    raise AssertionError(f"no {what} within {timeout:.0f}s; Prometheus fires {firing}; "
                         f"Alertmanager holds {held}")


def test_the_xid_page_holds_while_failing_and_a_confirmed_drain_mutes_the_lost_gpus_page(
        tmp_path, prometheus_factory, capsys):
    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--time-scale", str(TIME_SCALE),
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    exposition = Exposition()
    xid_at = time.time()
    exposition.set(drained=False, xid_failing=True, xid_at=xid_at)
    receiver = WebhookReceiver().start()
    manager = None
    try:
        manager = start_alertmanager(tmp_path / "alertmanager",
                                     routed_config(receiver.url, time_scale=TIME_SCALE))
        prom = prometheus_factory(prometheus_config(
            exposition.port, manager.port,
            [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]))

        # 1. both lost GPUs page (one page for the pool: grouped), and the XID pages
        _wait("GpuLost pages for gpu-001 and gpu-002",
              lambda: _paged(receiver, "GpuLost", "gpu-001") and _paged(receiver, "GpuLost",
                                                                        "gpu-002"),
              60, prom, manager)
        _wait("a GpuXidError page for gpu-003",
              lambda: _paged(receiver, "GpuXidError", "gpu-003"), 60, prom, manager)

        # 2. the scheduler drains gpu-001: the ticket, and its page muted in Alertmanager
        exposition.set(drained=True, xid_failing=True, xid_at=xid_at)
        ticket = _wait("a GpuNodeDrained ticket for gpu-001", lambda: [
            a for _, a in receiver.alerts("tickets") if a["status"] == "firing"
            and a["labels"].get("alertname") == "GpuNodeDrained"], 60, prom, manager)
        assert ticket[0]["labels"]["node"] == "gpu-001"
        assert ticket[0]["labels"]["page"] == "false"
        assert not [a for _, a in receiver.alerts("pager")
                    if a["labels"].get("alertname") == "GpuNodeDrained"]

        def muted() -> list:
            return [a for a in manager.alerts(alertname="GpuLost", node="gpu-001")
                    if a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]]
        _wait("gpu-001's GpuLost inhibited in Alertmanager", muted, 60, prom, manager)
        muted_at = time.monotonic()
        assert [a["status"]["state"] for a in manager.alerts(alertname="GpuLost",
                                                             node="gpu-002")] == ["active"]

        # more than one repeat interval: the undrained GPU re-pages, the drained one never
        _wait("gpu-002's GpuLost re-paged after a repeat interval",
              lambda: _paged(receiver, "GpuLost", "gpu-002", since=muted_at + 1),
              REPEAT_SECONDS * 2, prom, manager)
        time.sleep(max(0.0, muted_at + REPEAT_SECONDS * 1.3 - time.monotonic()))
        assert _paged(receiver, "GpuLost", "gpu-001", since=muted_at) == []
        # GpuLost of gpu-001 still fires in Prometheus: muted, not resolved
        assert prom.query('ALERTS{alertname="GpuLost",node="gpu-001",alertstate="firing"}')

        # the XID page held past its 10 min window (3 s here) for as long as the verdict
        held_for = time.time() - xid_at
        assert held_for > 600 * TIME_SCALE * 5, held_for
        assert prom.query('ALERTS{alertname="GpuXidError",node="gpu-003",alertstate="firing"}')
        assert not [a for _, a in receiver.alerts("pager") if a["status"] == "resolved"
                    and a["labels"].get("alertname") == "GpuXidError"]

        # 3. the verdict clears: the XID page resolves
        exposition.set(drained=True, xid_failing=False, xid_at=xid_at)
        _wait("GpuXidError resolved at the pager", lambda: [
            a for _, a in receiver.alerts("pager") if a["status"] == "resolved"
            and a["labels"].get("alertname") == "GpuXidError"], 60, prom, manager)
        print(f"\nXID page held {held_for:.0f} s (its window: {600 * TIME_SCALE:.0f} s); "
              f"gpu-002 re-paged, gpu-001 muted for {time.monotonic() - muted_at:.0f} s")
    finally:
        receiver.stop()
        if manager is not None:
            stop(manager.proc)
        exposition.server.shutdown()
