"""When to compact: dwell, hysteresis, cooldown, the gain gate and the reasons in words."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from exporter.advisor.advise import advise, what_if
from exporter.advisor.engine import (
    Advisor,
    DecisionSettings,
    gate,
    memory_peaks,
    with_measured_needs,
)
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.wire import advice_json, what_if_json
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, Node, Placement


def report(cluster: float, pools: dict[str, float] | None = None, allocated: float = 0.97):
    return SimpleNamespace(
        cluster=SimpleNamespace(index=cluster, allocated_ratio=allocated),
        pools=[SimpleNamespace(name=n, index=v) for n, v in (pools or {}).items()],
    )


def moves(n: int) -> tuple[Migration, ...]:
    return tuple(Migration(f"j{i}", "ns", f"p{i}", Endpoint("a", (i,)), Endpoint("b", (i,)),
                           "checkpoint_then_migrate", None, 10.0) for i in range(n))


class Planner:
    def __init__(self, migrations=2, recovered=4.0, freed=1):
        self.calls = 0
        self.migrations, self.recovered, self.freed = migrations, recovered, freed

    def __call__(self, snapshot, rep, scope, now):
        self.calls += 1
        return CompactionPlan(scope, snapshot.taken_at, now + 900, "compact", ("planned",),
                              Prediction(rep.cluster.index, 10.0),
                              Prediction(30.0, 10.0 - self.recovered),
                              {"gpu-h100": self.freed} if self.freed else {}, moves(self.migrations))


@dataclass
class Evaluated:
    """The engine and a stub planner, evaluated as the service evaluates (advise.advise);
    ``observe`` and ``what_if`` answer in the wire form a reader of /v1/advice gets."""

    engine: Advisor
    planner: Planner

    def advise(self, snapshot, rep, trigger="snapshot"):
        return advise(self.engine, snapshot, rep, self.planner, trigger)

    def observe(self, snapshot, rep, trigger="snapshot"):
        return advice_json(self.advise(snapshot, rep, trigger))

    def what_if(self, snapshot, rep):
        return what_if_json(what_if(self.engine, snapshot, rep, self.planner))


def run(advisor: Evaluated, clock: list[float], timeline: list[tuple[float, float]], typed=False):
    out = []
    for t, index in timeline:
        clock[0] = t
        evaluate = advisor.advise if typed else advisor.observe
        out.append(evaluate(FleetSnapshot(t), report(index)))
    return out


def make(planner=None, **settings):
    clock = [0.0]
    base = {"dwell_seconds": 600.0, "cooldown_seconds": 1800.0}
    advisor = Advisor(DecisionSettings(**{**base, **settings}), clock=lambda: clock[0])
    return Evaluated(advisor, planner or Planner()), clock


def test_dwell_must_pass_before_compaction_is_recommended():
    advisor, clock = make()
    first, early, due = run(advisor, clock, [(0, 63), (300, 63), (600, 63)])
    assert first["decision"] == early["decision"] == "none"
    assert early["reasons"] == ["cluster index 63 > 50 for 5 min, dwell is 10 min"]
    assert due["decision"] == "compact"
    assert due["reasons"][0] == ("cluster index 63 > 50 for 10 min; plan frees 1 whole gpu-h100 "
                                 "node and recovers 4.0 fragmented GPUs with 2 migrations")
    assert due["plan"]["plan_id"].startswith("plan-")


def test_hysteresis_keeps_the_recommendation_until_below_the_lower_bound():
    advisor, clock = make(cooldown_seconds=0)
    results = run(advisor, clock, [(0, 60), (600, 60), (700, 45), (800, 45), (900, 39), (1000, 45)])
    recommended = [r["scopes"]["cluster"]["recommended"] for r in results]
    assert recommended == [False, True, True, True, False, False]
    # a dip to 45 does not restart the dwell clock either; only falling below 40 does
    assert results[3]["scopes"]["cluster"]["above_since"] == 0


def test_index_hovering_at_the_trigger_does_not_flap():
    advisor, clock = make(dwell_seconds=0, cooldown_seconds=0)
    timeline = [(t, 51 if t % 2 else 49) for t in range(0, 20)]
    decisions = [r["scopes"]["cluster"]["recommended"] for r in run(advisor, clock, timeline)[1:]]
    assert all(decisions)  # once on, 49 (above 40) keeps it on


def test_cooldown_separates_plans():
    planner = Planner()
    advisor, clock = make(planner, dwell_seconds=0)
    results = run(advisor, clock, [(0, 70), (60, 70), (1799, 70), (1800, 70)])
    assert [r["decision"] for r in results] == ["compact", "cooldown", "cooldown", "compact"]
    assert planner.calls == 2
    assert "cooldown until" in results[1]["reasons"][1]


def test_gate_holds_plans_that_move_a_lot_for_little():
    advisor, clock = make(Planner(migrations=10, recovered=1.0, freed=0), dwell_seconds=0,
                          min_recovered_per_migration=0.5)
    (result,) = run(advisor, clock, [(0, 70)])
    assert result["decision"] == "hold" and result["plan"] is None
    assert ("recovers 1.0 fragmented GPUs with 10 migrations (0.10 per migration < 0.5)"
            in result["reasons"][1])
    plan = Planner(migrations=2, recovered=4.0, freed=0)(FleetSnapshot(0), report(70), "cluster", 0)
    assert gate(plan, DecisionSettings(min_nodes_freed_per_migration=0.5)).startswith("plan frees 0")
    assert gate(plan, DecisionSettings()) is None


def test_nothing_worth_moving_is_said_in_words():
    advisor, clock = make(Planner(migrations=0), dwell_seconds=0)
    (result,) = run(advisor, clock, [(0, 80)])
    assert result["decision"] == "hold"
    assert "index high but nothing worth moving: cluster 97% allocated" in result["reasons"]


def test_a_pool_can_trigger_on_its_own():
    advisor, clock = make(dwell_seconds=0)
    clock[0] = 0
    result = advisor.observe(FleetSnapshot(0), report(30, {"gpu-h100": 72, "gpu-a100": 10}))
    assert result["decision"] == "compact" and result["scope"] == "pool:gpu-h100"
    assert result["reasons"][0].startswith("pool gpu-h100 index 72 > 50 for 0 s; plan frees")


def test_what_if_changes_no_state():
    advisor, _clock = make()
    result = advisor.what_if(FleetSnapshot(0), report(70))
    assert result["decision"] == "compact" and result["what_if"] is True
    assert advisor.engine.scopes == {} and advisor.engine.last_plan_at is None \
        and advisor.engine.advice is None


def test_a_hold_is_not_replanned_on_every_snapshot_but_an_alert_replans():
    planner = Planner(migrations=0)
    advisor, clock = make(planner, dwell_seconds=0, hold_recheck_seconds=60)
    results = run(advisor, clock, [(0, 80), (5, 80), (30, 80)])
    assert [r["decision"] for r in results] == ["hold"] * 3
    assert planner.calls == 1
    assert results[2]["reasons"][1].startswith("index high but nothing worth moving")
    clock[0] = 35
    advisor.observe(FleetSnapshot(35), report(80), trigger="alertmanager: X firing")
    assert planner.calls == 2
    run(advisor, clock, [(100, 80)])  # past the recheck interval
    assert planner.calls == 3


def test_a_firing_fragmentation_alert_counts_as_dwell_served():
    advisor, clock = make(dwell_seconds=600)
    run(advisor, clock, [(0, 30)])  # the advisor measures the scopes
    clock[0] = 10
    result = advisor.observe(FleetSnapshot(10), report(30, {"gpu-h100": 72}))
    assert result["decision"] == "none" and result["reasons"] == [
        "pool gpu-h100 index 72 > 50 for 0 s, dwell is 10 min"]
    # Alertmanager waited its own 15 min 'for' before it sent this: no second wait
    alerts = [{"status": "firing", "labels": {"alertname": "GpuClusterFragmentationHigh",
                                               "pool": "gpu-h100"}},
              {"status": "firing", "labels": {"alertname": "GpuClusterFragmentationHigh",
                                               "pool": "no-such-pool"}},
              {"status": "firing", "labels": {"alertname": "GpuLost", "pool": "gpu-a100"}}]
    assert advisor.engine.alert_firing(alerts) == ["pool:gpu-h100"]
    clock[0] = 20
    result = advisor.observe(FleetSnapshot(20), report(30, {"gpu-h100": 72}),
                             trigger="alertmanager: GpuClusterFragmentationHigh firing")
    assert result["decision"] == "compact" and result["scope"] == "pool:gpu-h100"
    assert result["reasons"][0].startswith(
        "pool gpu-h100 index 72 > 50 for 10 s (Alertmanager's GpuClusterFragmentationHigh fired: "
        "its own 'for' served as dwell); plan frees")
    # once the index clears, the alert is spent: the next rise waits its dwell again
    run(advisor, clock, [(3000, 30)])
    clock[0] = 3010
    advisor.observe(FleetSnapshot(3010), report(30, {"gpu-h100": 10}))
    assert advisor.engine.alert_served == {}


def test_the_cluster_index_alert_serves_the_cluster_scopes_dwell():
    advisor, clock = make(dwell_seconds=600)
    run(advisor, clock, [(0, 30)])
    clock[0] = 10
    assert advisor.observe(FleetSnapshot(10), report(63))["decision"] == "none"
    # its pool label, if a relabelling added one, does not make it a pool's
    alerts = [{"status": "firing", "labels": {"alertname": "GpuFleetFragmentationHigh",
                                               "pool": "gpu-h100"}}]
    assert advisor.engine.alert_firing(alerts) == ["cluster"]
    clock[0] = 20
    result = advisor.observe(FleetSnapshot(20), report(63),
                             trigger="alertmanager: GpuFleetFragmentationHigh firing")
    assert result["decision"] == "compact" and result["scope"] == "cluster"
    assert result["reasons"][0].startswith(
        "cluster index 63 > 50 for 10 s (Alertmanager's GpuFleetFragmentationHigh fired: "
        "its own 'for' served as dwell); plan frees")


def test_a_plan_that_leaves_the_index_above_the_trigger_says_so():
    class Partial(Planner):
        def __call__(self, snapshot, rep, scope, now):
            plan = super().__call__(snapshot, rep, scope, now)
            return dataclasses.replace(plan, after=Prediction(66.9, 6.0))

    advisor, clock = make(Partial(), dwell_seconds=0)
    (result,) = run(advisor, clock, [(0, 70.6)])
    assert result["decision"] == "compact"
    short = ("partial plan: cluster index 70.6 -> 66.9, still above the trigger 50 within the "
             "migration budget; the recommendation stays, and another plan may follow the cooldown")
    assert result["reasons"][1] == short and result["plan"]["reasons"][1] == short
    assert short in advisor.what_if(FleetSnapshot(0), report(70.6))["reasons"]
    # a plan that reaches the trigger says nothing of the kind
    advisor, clock = make(dwell_seconds=0)
    (result,) = run(advisor, clock, [(0, 70.6)])
    assert not any(r.startswith("partial plan") for r in result["reasons"])


def _fleet(t: float, busy: dict[str, float]) -> FleetSnapshot:
    """Nodes b1 (B200), h1 (H200), a1 (A100-80GB), 8 GPUs each; one job per node on GPUs 0-3,
    at the utilization ``busy`` gives its node."""
    nodes = [Node(n, m, 64.0, f"pool-{n}", "x", 8) for n, m in
             (("b1", "B200"), ("h1", "H200"), ("a1", "A100-80GB"))]
    gpus = [Gpu(n.name, i, f"{n.name}-{i}", n.model, n.pool,
                utilization_ratio=busy[n.name] if i < 4 else 0.0) for n in nodes for i in range(8)]
    jobs = [Allocation(f"job-{n.name}", (Placement(n.name, (0, 1, 2, 3), 1.0, 8.0),),
                       namespace="ns", account=f"acct-{n.name}") for n in nodes]
    return FleetSnapshot(t, tuple(nodes), tuple(gpus), tuple(jobs))


def test_held_but_idle_gpus_are_listed_for_reclaiming_costliest_first():
    advisor, clock = make()
    idle = {"b1": 0.05, "h1": 0.02, "a1": 0.01}
    for t in (0.0, 3600.0):
        clock[0] = t
        assert advisor.observe(_fleet(t, idle), report(30))["reclaim"] == []  # not 2 h yet
    clock[0] = 7200.0
    # h1's job got busy for one snapshot at 1 h 30: its idle clock starts again
    advisor.observe(_fleet(5400.0, {**idle, "h1": 0.5}), report(30))
    clock[0] = 7200.0
    advisor.observe(_fleet(7200.0, idle), report(30))
    clock[0] = 7300.0
    result = advisor.observe(_fleet(7300.0, idle), report(30))["reclaim"]
    assert [(r["job"], r["model"], r["gpus"], r["gpu_hours_wasted"], r["account"], r["pool"])
            for r in result] == [("job-b1", "B200", 4.0, 8.111, "acct-b1", "pool-b1"),
                                 ("job-a1", "A100-80GB", 4.0, 8.111, "acct-a1", "pool-a1")]
    assert result[0]["reason"] == ("4 B200 GPUs under 10% busy for 122 min (threshold table "
                                   "GpuJobUtilizationLow): consider reclaiming them; never done "
                                   "automatically")
    # at 10% (the threshold) a job is not idle; a job that ends is forgotten
    clock[0] = 7400.0
    advisor.observe(_fleet(7400.0, {**idle, "b1": 0.1}), report(30))
    assert set(advisor.engine.idle_since) == {"job-h1", "job-a1"}


def test_multi_node_jobs_over_nvlink_generations_are_flagged():
    nodes = (Node("b1", "B200", 64.0, "p", "blackwell", 8), Node("h1", "H200", 64.0, "p", "hopper", 8),
             Node("h2", "H100", 64.0, "p", "hopper", 8))
    jobs = (Allocation("mixed", (Placement("b1", (0,), 1.0, 1.0), Placement("h1", (0,), 1.0, 1.0))),
            Allocation("hopper", (Placement("h1", (1,), 1.0, 1.0), Placement("h2", (0,), 1.0, 1.0))))
    advisor, _clock = make()
    result = advisor.observe(FleetSnapshot(0, nodes, (), jobs), report(30))
    assert result["nvlink_mixed"] == [{
        "job": "mixed", "namespace": "", "nodes": ["b1", "h1"], "nvlink_generations": [4, 5],
        "reason": "one job over NVLink generations [4, 5]: they do not interconnect, so its "
                  "traffic falls back to the network"}]
    # the nodes' generations are kept while snapshots share their nodes' tuple, and looked up
    # again when it changes: h1 an A100 (NVLink 3) now, so the hopper job spans two as well
    assert advisor.observe(FleetSnapshot(60, nodes, (), jobs), report(30))["nvlink_mixed"] == result[
        "nvlink_mixed"]
    a100 = (nodes[0], Node("h1", "A100-80GB", 64.0, "p", "ampere", 8), nodes[2])
    mixed = advisor.observe(FleetSnapshot(120, a100, (), jobs), report(30))["nvlink_mixed"]
    assert [(r["job"], r["nvlink_generations"]) for r in mixed] == [("hopper", [3, 4]), ("mixed", [3, 5])]


async def test_post_alerts_tells_the_advisor_before_it_evaluates(aiohttp_client, tmp_path):
    from exporter.advisor.service import AdvisorService
    from exporter.advisor.store import Store
    from exporter.advisor.webhook import Deliverer
    from exporter.analysis.analyzer import LiveAnalyzer
    from exporter.config import AnalysisConfig
    from tests.test_advisor_api import alertmanager_payload, auth, light_client

    seen: list[list[dict]] = []
    client = await light_client(aiohttp_client, on_alerts=seen.append)
    payload = alertmanager_payload()
    payload["alerts"][0]["labels"]["pool"] = "gpu-h100"
    resp = await client.post("/v1/alerts", json=payload, headers=auth())
    assert resp.status == 202
    assert [[a["labels"]["pool"] for a in alerts] for alerts in seen] == [["gpu-h100"]]
    # and gpufleet serve's service wires it to the advisor
    advisor, _clock = make()
    service = AdvisorService(advisor.engine, LiveAnalyzer.from_config(AnalysisConfig()),
                             Deliverer(Store(tmp_path / "o.sqlite"), ()), b"t", max_body_bytes=1024)
    assert service.api().on_alerts == advisor.engine.alert_firing


def test_memory_peaks_are_per_job_kept_over_snapshots_and_forgotten_when_the_job_ends():
    gpus = (Gpu("n1", 0, "u0", "H100", "p", memory_used_bytes=30 * 2**30),
            Gpu("n1", 1, "u1", "H100", "p", memory_used_bytes=50 * 2**30),
            Gpu("n1", 2, "u2", "H100", "p", memory_used_bytes=70 * 2**30),  # shared: not one job's
            Gpu("n1", 3, "u3", "H100", "p", memory_used_bytes=None))  # no telemetry
    whole = Allocation("whole", (Placement("n1", (0, 1), 1.0, 4.0),), gpu_memory_need_bytes=40 * 2**30)
    shared = Allocation("shared", (Placement("n1", (2,), 0.5, 1.0),), gpu_memory_need_bytes=10 * 2**30)
    blind = Allocation("blind", (Placement("n1", (3,), 1.0, 1.0),))
    snap = FleetSnapshot(0.0, (Node("n1", "H100", 64.0, "p", "hopper", 4),), gpus,
                         (whole, shared, blind))
    peaks = memory_peaks(snap, {})
    assert peaks == {"whole": 50 * 2**30}  # the larger of its two GPUs
    lower = dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, memory_used_bytes=2**30)
                                                 for g in gpus[:3]) + gpus[3:])
    assert memory_peaks(lower, peaks) == {"whole": 50 * 2**30}  # a peak, not the latest value
    ended = dataclasses.replace(lower, allocations=(shared, blind))
    assert memory_peaks(ended, {**peaks, "gone": 1.0}) == {}  # bounded by the running jobs
    # an advisor keeps its GPU reads while snapshots share one tuple of GPUs, and reads again
    # for another tuple: the peak follows the new readings, not the kept ones
    engine = Advisor(DecisionSettings(require_pending=False), clock=lambda: 0.0)
    engine.assess(snap, report(10.0))
    kept = engine._reads
    assert kept is not None and kept.gpus is gpus and engine.memory_peak == {"whole": 50 * 2**30}
    engine.assess(dataclasses.replace(snap, allocations=(whole,)), report(10.0))
    assert engine._reads is kept
    higher = dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, memory_used_bytes=90 * 2**30)
                                                  for g in gpus[:3]) + gpus[3:])
    engine.assess(higher, report(10.0))
    assert engine._reads is not kept and engine.memory_peak == {"whole": 90 * 2**30}
    # past a whole evaluation the reads are kept only once a snapshot repeated its GPUs (serve's
    # snapshots never do: nothing is held between its cycles)
    # the same tuples of GPUs as snap's and higher's, and no job that declares a memory need
    first, second = (dataclasses.replace(s, allocations=(blind,)) for s in (snap, higher))
    for snapshot, kept_after in ((first, False), (second, False), (second, True), (second, True),
                                 (first, False)):
        engine.decide(engine.assess(snapshot, report(10.0)))
        assert (engine._reads is not None) == kept_after
    # the peak raises a declared need, never creates one, never lowers one
    raised = with_measured_needs(snap, {"whole": 60 * 2**30, "blind": 70 * 2**30,
                                        "shared": 2**30})
    assert [a.gpu_memory_need_bytes for a in raised.allocations] == [60 * 2**30, 10 * 2**30, None]
    assert with_measured_needs(snap, {}) is snap


def test_the_plan_stays_in_the_advice_until_it_expires():
    """Cooldown, and none once the index cleared, carry the last plan (the same one, marked by
    plan_proposed_at and a reason) until its expires_at; from then on, no plan."""
    planner = Planner()  # plans expire 900 s after they are made
    advisor, clock = make(planner, dwell_seconds=0)
    results = run(advisor, clock, [(0, 70), (60, 70), (600, 30), (899, 70), (900, 70), (1800, 70)],
                  typed=True)
    assert [r.decision for r in results] == ["compact", "cooldown", "none", "cooldown",
                                             "cooldown", "compact"]
    first = results[0].plan
    assert first.expires_at == 900
    assert [r.plan is first for r in results] == [True, True, True, True, False, False]
    assert results[4].plan is None
    assert [r.plan_proposed_at for r in results] == [0, 0, 0, 0, None, 1800]
    assert list(results[1].reasons) == [
        "cluster index 70 > 50 for 1 min",
        "last plan 1 min ago; cooldown until 00:30:00 UTC",
        f"plan {first.plan_id} proposed 1 min ago stays valid until 00:15:00 UTC; this "
        "evaluation proposes no new one"]
    assert list(results[2].reasons) == [
        "cluster index 30 <= 50",
        f"plan {first.plan_id} proposed 10 min ago stays valid until 00:15:00 UTC; this "
        "evaluation proposes no new one"]
    assert list(results[4].reasons) == ["cluster index 70 > 50 for 1 s",
                                        "last plan 15 min ago; cooldown until 00:30:00 UTC"]
    # and so the wire: the plan carried is the plan proposed, byte for byte
    assert advice_json(results[3])["plan"] == advice_json(results[0])["plan"]
    assert planner.calls == 2  # carrying a plan never plans


def test_a_plan_that_expires_between_evaluations_is_not_served():
    advisor, clock = make(dwell_seconds=0)
    (advice,) = run(advisor, clock, [(0, 70)], typed=True)
    engine = advisor.engine
    clock[0] = 899
    assert engine.current() is advice
    clock[0] = 900
    served = engine.current()
    assert served is not None
    assert (served.decision, served.plan, served.plan_proposed_at) == ("compact", None, None)
    assert served.reasons[-1] == (f"plan {advice.plan.plan_id} expired at 00:15:00 UTC, "
                                  "after this evaluation")
    assert advice.plan.expires_at == 900 and engine.advice is advice  # kept as evaluated
    assert Advisor().current() is None  # nothing evaluated yet


def test_the_engine_decides_and_the_planner_plans_in_one_direction():
    """Neither reaches the other's job: the planner imports no engine (nor the evaluation
    that runs both), the engine never names the planner's function, and only advise.py
    runs the two."""
    from tests.helpers import REPO
    from tests.test_imports import package_graph

    graph = package_graph(REPO / "exporter")

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    advisor = "exporter.advisor."
    assert not reaches(advisor + "planner") & {advisor + "engine", advisor + "advise"}
    assert advisor + "advise" not in reaches(advisor + "engine")
    assert "plan_compaction" not in (REPO / "exporter" / "advisor" / "engine.py").read_text()
    callers = sorted(p.name for p in (REPO / "exporter" / "advisor").glob("*.py")
                     if "plan_compaction" in p.read_text())
    assert callers == ["advise.py", "planner.py", "service.py"]  # service: settings only


def test_an_assessment_that_asks_for_a_plan_is_decided_only_with_one():
    planner = Planner()
    advisor, clock = make(planner, dwell_seconds=0)
    assessment = advisor.engine.assess(FleetSnapshot(0), report(70))
    assert (assessment.plan_scope, assessment.decision, assessment.reasons) == (
        "cluster", "compact", ("cluster index 70 > 50 for 0 s",))
    with pytest.raises(ValueError) as caught:
        advisor.engine.decide(assessment)
    assert str(caught.value) == "the assessment of cluster needs its plan"
    advice = advisor.engine.decide(assessment, planner(assessment.measured, report(70), "cluster", 0))
    assert advice.decision == "compact" and advice.plan is not None and planner.calls == 1
    # in cooldown the engine asks for nothing: advise never calls the planner
    clock[0] = 60
    later = advisor.engine.assess(FleetSnapshot(60), report(70))
    assert (later.plan_scope, later.decision) == (None, "cooldown")
    assert advisor.observe(FleetSnapshot(60), report(70))["decision"] == "cooldown"
    assert planner.calls == 1
