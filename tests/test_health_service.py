"""Health in serve's cycle (issue 31): each snapshot's verdicts become families,
/v1/advice's ``health`` and remediation events; the events go through the signed outbox to a
receiver as ``X-Gpufleet-Event: remediation``, ``gpufleet act`` reads what it received, and
what gpufleet drained survives a restart."""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from exporter.advisor import openapi
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.service import AdvisorService
from exporter.advisor.store import Store
from exporter.advisor.webhook import EVENT_HEADER, IDEMPOTENCY_HEADER, Deliverer, Receiver
from exporter.advisor.wire import health_json
from exporter.analysis.analyzer import LiveAnalyzer
from exporter.config import AnalysisConfig
from exporter.cycle import Frame
from exporter.cycle.serving import HealthEffects, ServingCycle
from exporter.cycle.stages import HealthStage
from exporter.health.act import Actor, read_events
from exporter.health.monitor import HealthMonitor
from exporter.health.remediation import Drain, ResetGpu
from exporter.health.verdict import FAILING_SIGNALS, HealthSettings
from exporter.metrics import Family
from exporter.snapshot import FleetSnapshot
from tests.helpers import REPO, require_binary
from tests.helpers.health import T0, gpu, snap, xid_gpu
from tests.test_advisor_webhook import SECRET, Scheduler, _run_until

NODES = [f"a-{n}" for n in range(8)]


@dataclass
class HealthCycle:
    """The health stage and its side effects as serve's cycle runs them on each snapshot."""

    deliverer: Deliverer
    health: HealthMonitor

    def __post_init__(self) -> None:
        self.stage = HealthStage(self.health)
        self.effects = HealthEffects(self.health, self.deliverer)
        self.effects.restore()

    def observe_health(self, snapshot: FleetSnapshot) -> Frame:
        frame = self.stage.step(Frame(snapshot))
        self.effects.apply(frame)
        return frame


def service(path: Path, receivers: tuple[Receiver, ...] = ()) -> HealthCycle:
    deliverer = Deliverer(Store(path), receivers, base_delay=0.01, max_delay=0.05)
    return HealthCycle(deliverer, HealthMonitor(HealthSettings(critical_xids=(79,))))


def fleet(at: float, failing: str | None = None):
    return snap(T0 + at, *(xid_gpu(n, 0, T0 + 30, pool="a") if n == failing else gpu(n, 0, "a")
                           for n in NODES))


def schema(name: str) -> Draft202012Validator:
    document = openapi.document()
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                 "components": document["components"]})


def samples(families: list[Family], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    [family] = [f for f in families if f.name == name]
    return dict(family.samples)


async def test_an_xid_reaches_the_receiver_as_a_signed_drain_that_act_reads(aiohttp_server, tmp_path):
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    advisor = service(tmp_path / "outbox.sqlite", (receiver,))
    advisor.observe_health(fleet(0))
    assert advisor.deliverer.store.pending_count() == 0  # healthy: nothing to say
    advisor.observe_health(fleet(30, failing="a-3"))
    store = advisor.deliverer.store
    assert store.pending_count() == 2  # the drain and the reset advice
    await _run_until(advisor.deliverer, lambda: store.pending_count() == 0)
    assert scheduler.bad_signatures == 0
    assert [h[EVENT_HEADER] for h, _ in scheduler.requests] == ["remediation"] * 2
    bodies = [json.loads(body) for _, body in scheduler.requests]
    for body in bodies:
        assert sorted(schema("RemediationEvent").iter_errors(body), key=str) == []
        assert (body["event"], body["schema_version"]) == ("remediation", 1)
    assert {h[IDEMPOTENCY_HEADER] for h, _ in scheduler.requests} == {b["id"] for b in bodies}
    events = list(read_events(body.decode() for _, body in scheduler.requests))
    assert events == [Drain("a-3", "a", "XID 79 on GPU 0", T0 + 30),
                      ResetGpu("a-3", "a", 0, "XID 79 on GPU 0", T0 + 30)]
    out = io.StringIO()
    actor = Actor("slurm", "dry-run", tmp_path / "audit.jsonl", out, notes=io.StringIO())
    for event in events:
        actor.handle(event)
    assert out.getvalue() == 'scontrol update NodeName=a-3 State=DRAIN Reason="gpufleet: XID 79 on GPU 0"\n'
    # the same failing snapshot again: the drain is not queued twice
    advisor.observe_health(fleet(60, failing="a-3"))
    assert store.pending_count() == 0
    store.close()


def test_verdicts_are_families_and_advice_with_only_unhealthy_nodes_listed(tmp_path):
    advisor = service(tmp_path / "outbox.sqlite")
    advisor.observe_health(fleet(0))
    advisor.observe_health(fleet(30, failing="a-3"))
    assert advisor.health is not None
    families = advisor.health.families()
    assert samples(families, "gpufleet_node_health_verdict") == {
        (("node", "a-3"), ("pool", "a"), ("verdict", "failing")): 1.0}
    assert samples(families, "gpufleet_gpu_health_verdict") == {
        (("node", "a-3"), ("gpu", "0"), ("pool", "a"), ("verdict", "failing"), ("signal", "xid")): 1.0}
    nodes = samples(families, "gpufleet_health_nodes")
    assert (nodes[(("pool", "a"), ("verdict", "healthy"))],
            nodes[(("pool", "a"), ("verdict", "failing"))]) == (7.0, 1.0)
    assert samples(families, "gpufleet_remediation_events_total")[(("action", "drain"),)] == 1.0
    assert samples(families, "gpufleet_remediation_drained_nodes") == {(("pool", "a"),): 1.0}
    assert samples(families, "gpufleet_health_faults_total") == {
        (("pool", "a"), ("cause", c)): 1.0 if c == "xid" else 0.0 for c in FAILING_SIGNALS}
    assert samples(families, "gpufleet_node_faults") == {(("node", "a-3"), ("pool", "a")): 1.0}
    typed = advisor.health.advice()
    assert typed is not None
    health: dict[str, Any] = health_json(typed)
    assert sorted(schema("Health").iter_errors(health), key=str) == []
    assert [n["node"] for n in health["unhealthy_nodes"]] == ["a-3"]
    assert health["unhealthy_nodes"][0]["reasons"][0]["text"] == "XID 79 on GPU 0"
    assert [d["node"] for d in health["drained"]] == ["a-3"]
    assert [e["type"] for e in health["remediation"]] == ["drain", "reset_gpu"]
    assert (health["nodes"]["failing"], health["gpus"]["healthy"]) == (1, 7)
    # all families are on /metrics, right after the advisor's
    frame = advisor.observe_health(fleet(60, failing="a-3"))
    engine = AdvisorService(Advisor(DecisionSettings()), LiveAnalyzer.from_config(AnalysisConfig()),
                            advisor.deliverer, None, 1024 * 1024)
    cycle = ServingCycle([advisor.stage], advisor=engine)
    names = [f.name for f in cycle.families(frame)]
    assert names[-12:] == [f.name for f in families]
    assert names[-13] == engine.families(frame.snapshot)[-1].name
    advisor.deliverer.store.close()


def test_a_restarted_advisor_remembers_what_it_drained_and_does_not_drain_again(tmp_path):
    first = service(tmp_path / "outbox.sqlite", (Receiver("r", "http://127.0.0.1:9/", b"s"),))
    first.observe_health(fleet(0))
    first.observe_health(fleet(30, failing="a-3"))
    first.deliverer.store.close()
    again = service(tmp_path / "outbox.sqlite", (Receiver("r", "http://127.0.0.1:9/", b"s"),))
    assert again.health is not None and list(again.health.remediator.state.drained) == ["a-3"]
    pending = again.deliverer.store.pending_count()
    again.observe_health(fleet(60, failing="a-3"))  # a new tracker: the recent XID still fails it
    assert again.health.latest is not None and again.health.latest.events == ()
    assert again.deliverer.store.pending_count() == pending
    again.deliverer.store.close()


def test_time_to_drain_and_to_resume_are_counted_per_pool():
    monitor = HealthMonitor(HealthSettings(critical_xids=(79,)))
    monitor.observe(fleet(0))
    monitor.observe(fleet(30, failing="a-3"))
    resumed = [e for at in range(330, 4000, 300) for e in monitor.observe(fleet(at)).events]
    assert [type(e).__name__ for e in resumed] == ["Resume"]
    totals = {f.name: dict(f.samples) for f in monitor.families()}
    assert totals["gpufleet_remediation_fault_to_drain_seconds_total"] == {(("pool", "a"),): 0.0}
    assert totals["gpufleet_remediation_drain_to_resume_seconds_total"] == {
        (("pool", "a"),): resumed[0].at - (T0 + 30)}
    assert resumed[0].at - (T0 + 30) >= 3600  # min_drain_seconds
    assert totals["gpufleet_remediation_events_total"][(("action", "resume"),)] == 1.0


def test_fault_and_event_counters_start_at_zero_so_increase_counts_the_first_one(tmp_path):
    """Every (pool, cause) and every action is exported at 0 from the first collection, so
    Prometheus' increase() (which never counts a series' first sample) counts the first fault
    after an exporter start. The monitor's own values, one collection a minute, go through the
    committed recording rules in promtool; the same XID series born at 1 (the old exposition)
    counts nothing."""
    monitor = HealthMonitor(HealthSettings(critical_xids=(79,)))
    collected: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for minute in range(4):  # healthy, then a-3's XID 79 (at T0 + 30) from the second on
        monitor.observe(fleet(60 * minute, failing="a-3" if minute else None))
        for family in monitor.families():
            if family.name in ("gpufleet_health_faults_total", "gpufleet_remediation_events_total"):
                for labels, value in family.samples:
                    collected.setdefault((family.name, labels), []).append(value)
    first = {key: values[0] for key, values in collected.items()}
    assert first == {**{("gpufleet_health_faults_total", (("pool", "a"), ("cause", c))): 0.0
                        for c in FAILING_SIGNALS},
                     **{("gpufleet_remediation_events_total", (("action", t),)): 0.0
                        for t in ("drain", "reset_gpu", "resume", "replace", "page")}}
    xid = collected[("gpufleet_health_faults_total", (("pool", "a"), ("cause", "xid")))]
    assert xid == [0.0, 1.0, 1.0, 1.0]

    def series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in (("cluster", "c1"), *labels))
        return f"{name}{{{inner}}}"

    def case(name: str, inputs: list[dict[str, str]], expected: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "interval": "1m", "input_series": inputs, "promql_expr_test": [
            {"expr": "cluster:gpufleet_health_faults:increase7d", "eval_time": "3m",
             "exp_samples": expected},
            {"expr": 'sum(increase(gpufleet_remediation_events_total{action="drain"}[7d]))',
             "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 1}]}]}

    inputs = [{"series": series(name, labels), "values": " ".join(f"{v:g}" for v in values)}
              for (name, labels), values in sorted(collected.items())]
    drains = [i for i in inputs if 'action="drain"' in i["series"]]
    born_at_one = [{"series": series("gpufleet_health_faults_total", (("pool", "a"), ("cause", "xid"))),
                    "values": "_ 1 1 1"}]
    tests = {"rule_files": [str(REPO / "rules" / "gpufleet-recording.yaml")],
             "evaluation_interval": "1m",
             "tests": [
                 case("zero-initialised: the first XID counts", inputs,
                      [{"labels": f'cluster:gpufleet_health_faults:increase7d{{cluster="c1",cause="{c}"}}',
                        "value": 1 if c == "xid" else 0} for c in FAILING_SIGNALS]),
                 case("born at its first fault: not counted", born_at_one + drains,
                      [{"labels": 'cluster:gpufleet_health_faults:increase7d{cluster="c1",cause="xid"}',
                        "value": 0}])]}
    path = tmp_path / "first_fault.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([require_binary("promtool"), "test", "rules", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert result.returncode == 0, result.stdout


async def test_the_example_receiver_takes_a_remediation_event(aiohttp_client, capsys):
    from deploy.examples.receiver import make_app
    from exporter.advisor.webhook import sign
    from exporter.advisor.wire import event_body

    client = await aiohttp_client(make_app(SECRET))
    drain = Drain("a-3", "a", "XID 79 on GPU 0", T0)
    body = event_body(drain)
    headers = {"X-Gpufleet-Signature": sign(body, SECRET), EVENT_HEADER: "remediation",
               IDEMPOTENCY_HEADER: "drain:a-3:1764547200000"}
    answer = await client.post("/gpufleet/plan", data=body, headers=headers)
    assert (answer.status, await answer.json()) == (200, {"status": "accepted",
                                                          "event_id": "drain:a-3:1764547200000"})
    assert capsys.readouterr().out == "drain:a-3:1764547200000: drain a-3: XID 79 on GPU 0\n"


def test_an_event_the_outbox_cannot_take_is_kept_beside_a_kept_plan_and_written_later(tmp_path):
    from tests.test_advisor_store import full_disk_store

    store, connection = full_disk_store(tmp_path / "outbox.sqlite")
    deliverer = Deliverer(store, (Receiver("r", "http://127.0.0.1:9/", SECRET),))
    connection.full = True
    assert deliverer.enqueue("plan-abc", b'{"plan_id": "plan-abc"}', T0 + 900) == 0
    for n in range(3):
        assert deliverer.enqueue_event(f"drain:a-{n}:1", b"{}") == 0
    assert (deliverer.unwritten_plans(), deliverer.unwritten()) == (1, 4)  # no event displaced it
    connection.full = False
    assert deliverer.flush() == 4
    assert sorted(d.plan_id for d in store.pending()) == [
        "drain:a-0:1", "drain:a-1:1", "drain:a-2:1", "plan-abc"]
    assert deliverer.enqueue_event("drain:a-0:1", b"{}") == 0  # an event is queued once
    store.close()


def test_serves_config_sets_the_clean_window_and_the_minimum_drain(tmp_path):
    from exporter.advisor.service import build_service
    from exporter.config import Config, build
    from exporter.health.remediation import RemediationSettings
    from exporter.thresholds import load_thresholds

    default = build(Config, {"advisor": {"outbox": str(tmp_path / "a.sqlite")}}).advisor
    # one number each: the config's default is the threshold table's row, which is the
    # settings' default too
    table = load_thresholds().health
    assert table is not None
    assert (default.health.clean_window, default.health.min_drain) == (
        table.verdicts.clean_window_seconds, table.remediation.min_drain_seconds) == (
        HealthSettings().clean_window_seconds, RemediationSettings().min_drain_seconds) == (900, 3600)
    config = build(Config, {"advisor": {"outbox": str(tmp_path / "b.sqlite"),
                                        "health": {"clean_window": "2s", "min_drain": "1m30s"}}})
    built = build_service(config.advisor, LiveAnalyzer.from_config(config.analysis), environ={})
    assert built.health is not None
    assert built.health.tracker.settings.clean_window_seconds == 2.0
    assert built.health.remediator.settings.min_drain_seconds == 90.0
    built.deliverer.store.close()
