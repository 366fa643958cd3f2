"""Alert noise, replayed: the simulated fleet at speed N under a real Prometheus and Alertmanager.

Issue 15's noise budget is measured here, for ``bench/alert_noise.py`` and its quick
twin in the suite (tests/test_alert_noise.py). One run:

- the exporter serves the simulated fleet at ``speed`` (60: a simulated hour per wall
  minute) with the given scenarios, collecting every ``interval`` seconds;
- a real Prometheus scrapes it and evaluates the rules ``gpufleet rules`` generates
  from the committed table, every ``interval`` seconds, generated with
  ``--time-scale 1/speed``: every ``for``, range window (``[5m]``) and offset scaled
  together, so that the stock rules hold in simulated time;
- a real Alertmanager runs the committed routing tree (deploy/alertmanager.yml) with
  every wait and interval scaled by 1/speed, and posts to an aiohttp receiver.

Only the node-mode job runs, so the rules are those of a node-mode-only deployment,
``gpufleet rules --deployment node`` from the committed table: they watch ``gpufleet-nodes``
alone (a job that is not run would page as GpufleetJobDown, by design).

What counts: a *notification* is one webhook POST to a human receiver (``pager`` or
``tickets``), resolved and repeated ones included. A *page* is one incident at the pager:
an Alertmanager group (its ``groupKey``) that posted firing alerts there, however often
it was re-sent (a paging service folds a group's repeats into one incident by that key).
The advisor's receiver is a machine and is counted apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from exporter.cli import main as gpufleet
from exporter.thresholds import load_thresholds
from tests.helpers.alerting import WebhookReceiver, routed_config, start_alertmanager
from tests.helpers.data import REPO
from tests.helpers.servers import discard, start_exporter, start_prometheus, stop

NODE_JOB = "gpufleet-nodes"
HUMAN = ("pager", "tickets")
# alerts about the whole cluster (GpuFleetFragmentationHigh): one ticket per cluster is their
# grouping, as one per pool or account is the others'
CLUSTER_WIDE = frozenset(row.alert for row in load_thresholds().alerts
                         if row.metric.subject == "cluster")


@dataclass(frozen=True, slots=True)
class Fault:
    """A scenario of the simulator and what it must do to the pager."""

    name: str
    scenario: str  # one YAML flow mapping of sim.scenarios, without start_after
    pages: str | None  # the alert that must page for it, None: it must not page


# Node names of the default simulated fleet: gpu-001.. H200, gpu-033.. H100,
# gpu-097.. A100-80GB, gpu-129.. B200.
FAULTS: tuple[Fault, ...] = (
    Fault("overheat", "{kind: overheat, node: gpu-001, gpu: 3, value: 90}", "GpuTemperatureHigh"),
    Fault("gpu_lost", "{kind: gpu_lost, node: gpu-005, gpu: 2}", "GpuLost"),
    Fault("warm", "{kind: overheat, node: gpu-002, gpu: 1, value: 82}", None),
    Fault("idle_allocated", "{kind: idle_allocated, node: gpu-040, gpu: 0}", None),
    Fault("fragmented_pool", "{kind: fragmented_pool, pool: gpu-h100}", None),
)


# The suite's quick replay (tests/test_alert_noise.py) runs on the tests' medium fleet
# (tests/helpers/servers.py MEDIUM_POOLS): every pool and model, MIG on 2 A100 nodes, and the
# H100 pool at 32 nodes, where the scattered pool's index holds above the compaction alert's 50.
# FAULTS' nodes there: each on a node of the same pool, the XID on an A100 node without MIG,
# the idle job's on the 8th H100 node, the straggler on a GPU of a 16-GPU training job
# (gpu-003 and gpu-004 hold one from the start at seed 42).
QUICK_NODES = {"gpu-001": "gpu-001", "gpu-005": "gpu-004", "gpu-002": "gpu-002",
               "gpu-040": "gpu-012", "gpu-098": "gpu-038", "gpu-031": "gpu-003"}


def known_faults(fleet: str = "reference") -> tuple[Fault, ...]:
    """FAULTS plus the ones whose scenario the simulator has (``xid``, issue 16; ``straggler``,
    issue 31), on the nodes of the reference or the medium fleet (start_exporter's ``fleet``)."""
    from exporter.sources.sim.options import SCENARIO_KINDS

    extra = []
    if "xid" in SCENARIO_KINDS:
        extra.append(Fault("xid", "{kind: xid, node: gpu-098, gpu: 4, value: 79}", "GpuXidError"))
    if "straggler" in SCENARIO_KINDS:  # issue 31: one GPU of a 16-GPU job at half pace pages no one
        extra.append(Fault("straggler", "{kind: straggler, node: gpu-031, gpu: 5}", None))
    faults = FAULTS + tuple(extra)
    if fleet == "reference":
        return faults
    assert fleet == "medium", "the faults' nodes are named for two layouts"
    renamed = []
    for fault in faults:
        scenario = fault.scenario
        for old, new in QUICK_NODES.items():
            scenario = scenario.replace(f"node: {old},", f"node: {new},")
        renamed.append(dataclasses.replace(fault, scenario=scenario))
    return tuple(renamed)


@dataclass
class NoiseRun:
    """What one replay sent, in simulated time (seconds since the fleet started)."""

    label: str
    speed: float
    sim_seconds: float
    notifications: Counter[str] = field(default_factory=Counter)  # receiver -> POSTs
    paged: dict[str, float] = field(default_factory=dict)  # alertname -> first page (sim s)
    page_alerts: Counter[str] = field(default_factory=Counter)  # alertname -> distinct alerts paged
    ticket_groups: set[str] = field(default_factory=set)  # Alertmanager group keys
    pager_groups: set[str] = field(default_factory=set)  # incidents: groups that paged
    ticket_grouping: Counter[str] = field(default_factory=Counter)  # "pool"/"account"/"cluster"/other
    largest_notification: int = 0  # most alerts one human notification carried
    firing_at_end: Counter[str] = field(default_factory=Counter)  # alertname -> firing
    pending_rules: dict[str, float] = field(default_factory=dict)  # alertname -> for (sim s)
    scrapes: int = 0  # scrapes of the exporter Prometheus made
    failed_scrapes: int = 0  # of them, how many failed (up == 0)

    @property
    def pages(self) -> int:
        return len(self.pager_groups)

    @property
    def human_notifications(self) -> int:
        return sum(self.notifications[r] for r in HUMAN)


def _rules(workdir: Path, speed: float) -> tuple[list[str], dict[str, float]]:
    """The committed table's rules for node mode alone, in simulated time; and each paging
    alert's ``for`` in simulated seconds."""
    path = REPO / "rules" / "thresholds.yaml"
    out = workdir / "rules"
    with contextlib.redirect_stdout(io.StringIO()):
        assert gpufleet(["rules", "--thresholds", str(path), "--out", str(out),
                         "--deployment", "node", "--time-scale", f"{1 / speed:.10g}"]) == 0
    # --time-scale: every `for`, range window and offset in simulated time together
    files = [str(out / name) for name in ("gpufleet-recording.yaml", "gpufleet-alerts.yaml")]
    from exporter.thresholds import load_thresholds

    waits = {}
    for row in load_thresholds(path).alerts:
        critical = row.level("critical")
        if row.page and critical is not None:
            waits[row.alert] = critical.for_seconds
    return files, waits


def _prometheus_config(exporter_port: int, manager_port: int, rules: list[str],
                       interval: float) -> str:
    step = f"{round(interval * 1000)}ms"
    return yaml.safe_dump({
        "global": {"scrape_interval": step, "evaluation_interval": step,
                   "scrape_timeout": step},
        "rule_files": rules,
        "alerting": {"alertmanagers": [
            {"static_configs": [{"targets": [f"127.0.0.1:{manager_port}"]}]}]},
        "scrape_configs": [{"job_name": NODE_JOB,
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
    }, sort_keys=False)


def exporter_config(faults: tuple[Fault, ...], speed: float, start_after: float,
                    interval: float, seed: int, health: bool = True) -> str:
    # the fleet is collected 4 times per evaluation, so a fault reaches Prometheus within
    # a quarter of an evaluation interval, as with the defaults (5s collections, 15s scrapes)
    scenarios = "".join(
        f"      - {f.scenario[:-1]}, start_after: {start_after:g}s}}\n" for f in faults)
    return (f"collect_interval: {round(interval * 250)}ms\n"
            "sources:\n"
            "  sim:\n"
            f"    speed: {speed:g}\n"
            f"    seed: {seed}\n"
            f"    health: {'true' if health else 'false'}\n"
            + (f"    scenarios:\n{scenarios}" if faults else ""))


def replay(workdir: Path, label: str, faults: tuple[Fault, ...], speed: float = 60.0,
           sim_hours: float = 2.0, start_after: float = 600.0, interval: float = 1.0,
           seed: int = 42, health: bool = True, fleet: str = "reference") -> NoiseRun:
    """Run the stack for ``sim_hours`` of simulated time and count what reached whom, on
    start_exporter's ``fleet`` (the faults must name its nodes: ``known_faults(fleet)``).

    Scenarios start ``start_after`` simulated seconds in, so a page's latency is measured
    from a known moment. ``health: False`` drops the simulator's health and performance
    values (XIDs stay): a third of the series, for a machine that cannot scrape and
    evaluate 150k series every interval.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    rules, waits = _rules(workdir, speed)
    receiver = WebhookReceiver().start()
    procs = []
    prom_proc = None
    try:
        manager = start_alertmanager(workdir / "alertmanager",
                                     routed_config(receiver.url, time_scale=1 / speed))
        procs.append(manager.proc)
        exporter = start_exporter(workdir, config=exporter_config(
            faults, speed, start_after, interval, seed, health), fleet=fleet, timeout=120)
        started = time.monotonic()  # the fleet's clock started just before it was ready
        procs.append(exporter.proc)
        # Prometheus learns its targets up to 5 s after start (discovery's update throttle),
        # which the scaled rules would see as 5 simulated minutes of an absent job: load
        # the rules only once the exporter has been scraped, as a long-running one would.
        # Prometheus re-sends a firing alert every --rules.alert.resend-delay (1m), scaled
        # like every other timer: an alert that fires while a reload's discovery has not
        # yet re-announced the Alertmanager (up to 5 s) is otherwise lost for a wall minute.
        resend = f"--rules.alert.resend-delay={max(1, round(60_000 / speed))}ms"
        prom = start_prometheus(workdir / "prometheus", _prometheus_config(
            exporter.port, manager.port, [], interval), extra_args=(resend,))
        procs.append(prom_proc := prom.proc)
        prom.wait_for(f'up{{job="{NODE_JOB}"}} == 1', bool, timeout=60)
        (workdir / "prometheus" / "prometheus.yml").write_text(_prometheus_config(
            exporter.port, manager.port, rules, interval))
        urllib.request.urlopen(urllib.request.Request(f"{prom.url}/-/reload", method="POST"),
                               timeout=30).close()
        time.sleep(max(0.0, started + sim_hours * 3600 / speed - time.monotonic()))
        run = NoiseRun(label, speed, sim_hours * 3600, pending_rules=waits)
        for result in prom.query('ALERTS{alertstate="firing"}'):
            run.firing_at_end[result["metric"]["alertname"]] += 1
        window = f"{round(time.monotonic() - started) + 60}s"
        for expr, attr in ((f"count_over_time(up[{window}])", "scrapes"),
                           (f"count_over_time((up == 0)[{window}:{round(interval * 1000)}ms])",
                            "failed_scrapes")):
            result = prom.query(expr)
            setattr(run, attr, int(float(result[0]["value"][1])) if result else 0)
    finally:
        for proc in reversed(procs):
            if proc is prom_proc:  # its TSDB is not read again: no graceful stop to wait for
                discard(proc)
            else:
                stop(proc)
        receiver.stop()
    paged_alerts: set[tuple[tuple[str, str], ...]] = set()
    for note in receiver.received:
        run.notifications[note.receiver] += 1
        alerts = note.payload.get("alerts", [])
        if note.receiver in HUMAN:
            run.largest_notification = max(run.largest_notification, len(alerts))
        if note.receiver == "tickets":
            run.ticket_groups.add(note.payload.get("groupKey", ""))
            grouped = note.payload.get("groupLabels", {})
            run.ticket_grouping["pool" if "pool" in grouped
                                else "account" if "account" in grouped
                                else "cluster" if grouped.get("alertname") in CLUSTER_WIDE
                                else "other"] += 1
        if note.receiver == "pager":
            if any(alert.get("status") == "firing" for alert in alerts):
                run.pager_groups.add(note.payload.get("groupKey", ""))
            for alert in alerts:
                if alert.get("status") != "firing":
                    continue
                name = alert["labels"]["alertname"]
                identity = tuple(sorted(alert["labels"].items()))
                if identity not in paged_alerts:  # a repeat of a firing alert is not a new one
                    paged_alerts.add(identity)
                    run.page_alerts[name] += 1
                run.paged.setdefault(name, (note.at - started) * speed)
    return run


def page_deadline(run: NoiseRun, alert: str, start_after: float, interval: float) -> float:
    """When the page must have arrived, in simulated seconds: the scenario's start, the
    alert's ``for`` and two evaluation intervals (issue 15's bound)."""
    return start_after + run.pending_rules[alert] + 2 * interval * run.speed
