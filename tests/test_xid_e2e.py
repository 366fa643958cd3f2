"""Issue 16's must-show: an XID injected through NVML's event set pages, end to end.

The real exporter runs its NVML source on the fake pynvml
(tests.helpers.fake_nvml_exporter puts it where ``import pynvml`` finds it; no
exporter code is patched). Two GPUs: the driver reports XID 79 ("fallen off the
bus", in the table's critical_xids) on GPU 0 and XID 13 (an application's
fault, never a page) on GPU 1, both through the event set the source waits on
in each GPU's worker thread. A real Prometheus scrapes it every second and
evaluates the rules `gpufleet rules --for-scale` generates; a real Alertmanager
routes with the committed deploy/alertmanager.yml (webhooks pointed at a local
receiver, grouping waits 1 s).

Shown: both XIDs appear as counters on /metrics and in Prometheus, XID 79 reaches
the pager as GpuXidError with the GPU's labels, and XID 13 fires nothing.
"""

from __future__ import annotations

import json
import time

import pytest

from exporter.cli import main
from tests.helpers import REPO, stop
from tests.helpers.alerting import (
    WebhookReceiver,
    prometheus_config,
    routed_config,
    start_alertmanager,
)
from tests.helpers.exported import Exported
from tests.helpers.fake_nvml_exporter import ENV, parse_spec
from tests.helpers.servers import http_get

FOR_SCALE = "0.01"  # GpuXidError's 1m -> 600ms; its 10m windows are not scaled
DEADLINE = 60.0
NODE = "gpu-node-7"
INJECT_AFTER = 3  # seconds after the source registers each GPU for XID events
GPUS = [{"uuid": "GPU-7e57-0000", "name": "NVIDIA H100 80GB HBM3", "utilization": 90},
        {"uuid": "GPU-7e57-0001", "name": "NVIDIA H100 80GB HBM3", "utilization": 90}]

EXPORTER_CONFIG = f"""
collect_interval: 1s
sources:
  sim: {{enabled: false}}
  nvml: {{enabled: true, node: {NODE}, pool: gpu-h100}}
"""


@pytest.mark.slow
def test_an_xid_injected_through_the_event_set_is_counted_and_pages(
        tmp_path, exporter_factory, prometheus_factory, capsys):
    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", FOR_SCALE,
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    receiver = WebhookReceiver().start()
    manager = None
    try:
        started = time.monotonic()
        spec = {"gpus": GPUS, "xids": [[0, 79, INJECT_AFTER], [1, 13, INJECT_AFTER]]}
        exporter = exporter_factory(config=EXPORTER_CONFIG, module="tests.helpers.fake_nvml_exporter",
                                    env={ENV: json.dumps(spec)})
        manager = start_alertmanager(tmp_path / "alertmanager", routed_config(receiver.url))
        prom = prometheus_factory(prometheus_config(
            exporter.port, manager.port,
            [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]))
        deadline = started + DEADLINE

        # 1. GpuXidError for XID 79 on GPU 0 reaches the pager, with the GPU's labels
        def paged() -> list[dict]:
            return [a for _, a in receiver.alerts("pager")
                    if a["labels"].get("alertname") == "GpuXidError"]

        pages = _wait(paged, deadline, "GpuXidError at the pager receiver", prom, exporter)
        paged_at = time.monotonic() - started
        alert = pages[0]
        assert alert["status"] == "firing"
        labels = {k: v for k, v in alert["labels"].items() if k != "instance"}
        assert labels == {
            "alertname": "GpuXidError", "severity": "critical", "page": "true",
            "xid": "79", "node": NODE, "gpu": "0", "uuid": "GPU-7e57-0000", "model": "H100",
            "pool": "gpu-h100", "job": "gpufleet-nodes"}
        assert alert["labels"]["instance"] == f"127.0.0.1:{exporter.port}"
        assert alert["annotations"]["description"].startswith(
            f"GPU 0 on {NODE} (H100, pool gpu-h100) reported XID 79 (1 in the last 10m, "
            "or counted in all while gpufleet's health verdict holds the GPU failing; "
            "for 600ms), an error that needs a human")
        assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#gpuxiderror")

        # 2. both XIDs are counters on /metrics, one event each, with the last XID
        exported = Exported(http_get(f"{exporter.url}/metrics").decode())
        xids = sorted((lab["gpu"], lab["xid"], value) for lab, value in
                      exported.all("gpufleet_gpu_xid_errors_total", node=NODE))
        assert xids == [("0", "79", 1.0), ("1", "13", 1.0)]
        assert exported.value("gpufleet_gpu_last_xid", gpu="0") == 79
        assert exported.value("gpufleet_gpu_last_xid", gpu="1") == 13
        # ... and in Prometheus, so the rule saw XID 13 too and had to leave it out
        stored = sorted((r["metric"]["gpu"], r["metric"]["xid"], r["value"][1])
                        for r in prom.query("gpufleet_gpu_xid_errors_total"))
        assert stored == [("0", "79", "1"), ("1", "13", "1")]

        # 3. XID 13 (the application's) fires nothing: one GpuXidError, GPU 0's
        firing = prom.query('ALERTS{alertname="GpuXidError"}')
        assert [(r["metric"]["gpu"], r["metric"]["xid"], r["metric"]["alertstate"])
                for r in firing] == [("0", "79", "firing")]
        assert {(a["labels"]["gpu"], a["labels"]["xid"]) for a in paged()} == {("0", "79")}
        assert not [a for _, a in receiver.alerts("tickets")
                    if a["labels"].get("alertname") == "GpuXidError"]
        print(f"\nGpuXidError for XID 79 paged {paged_at:.1f}s after the exporter started "
              f"(XID injected {INJECT_AFTER}s after the source registered the GPU; "
              f"limit {DEADLINE:.0f}s)")
    finally:
        receiver.stop()
        if manager is not None:
            stop(manager.proc)


def _wait(found, deadline: float, what: str, prom, exporter) -> list:
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.25)
    counters = prom.query("gpufleet_gpu_xid_errors_total")
    firing = sorted({r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')})
    raise AssertionError(
        f"no {what} within {DEADLINE:.0f}s. Prometheus holds XID counters {counters} and "
        f"fires {firing}; exporter log tail: {exporter.log.read_text()[-1500:]}")


@pytest.mark.parametrize(("spec", "message"), [
    ("[]", f"{ENV}: must be an object with gpus and xids"),
    ('{"gpus": []}', f"{ENV}.gpus: must be a list of 1 to 64 GPUs"),
    ('{"gpus": [{"uuid": "GPU-1"}], "xids": [[1, 79, 3]]}',
     f"{ENV}.xids[0]: must be [gpu index, xid, after seconds]"),
    ('{"gpus": [{"uuid": "GPU-1"}], "xids": [[0, "79", 3]]}',
     f"{ENV}.xids[0]: must be [gpu index, xid, after seconds]"),
])
def test_the_launcher_refuses_a_bad_fake_description_naming_the_key(spec, message):
    with pytest.raises(ValueError) as info:
        parse_spec(spec)
    assert str(info.value) == message


def test_the_launcher_builds_the_described_gpus_and_schedule():
    gpus, xids = parse_spec(json.dumps({"gpus": GPUS, "xids": [[1, 13, 2.5]]}))
    assert [(g.uuid, g.utilization) for g in gpus] == [("GPU-7e57-0000", 90),
                                                       ("GPU-7e57-0001", 90)]
    assert xids == [(1, 13, 2.5)]
