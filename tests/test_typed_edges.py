"""Typed to the edge: scaling hints, health and kept states are typed values until
exporter/advisor/wire.py writes them, and what it writes is the text the untyped code wrote.

The files under tests/golden/wire/ were written by the code before the types (the hints and
the health as dicts, the engine writing its own state): /v1/advice's answers, the advisor's
and the remediator's kept states, the remediation events' webhook bodies, all for the inputs
built here. An outbox written then must still restore.
"""

from __future__ import annotations

import ast
import json
import random
from types import SimpleNamespace

from exporter.advisor.advice import AdvisorState, ScopeStatus
from exporter.advisor.advise import advise
from exporter.advisor.api import AdvisorApi, add_routes
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction, TierMisplacement
from exporter.advisor.wire import (
    advice_json,
    advisor_state_from_text,
    advisor_state_text,
    event_body,
    health_json,
    plan_json,
    remediation_state_from_text,
    remediation_state_text,
)
from exporter.health.monitor import HealthAdvice, HealthMonitor
from exporter.health.remediation import RemediationSettings
from exporter.health.verdict import Verdict
from exporter.pool_load.tracker import LoadTracker, PoolAdvice
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    GpuHealth,
    GpuPerformance,
    JobRequest,
    Node,
    Placement,
    XidCount,
)
from exporter.thresholds import ScalingSettings, ScalingTable
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "golden" / "wire"
T0 = 1_764_547_200.0
TOKEN = b"t" * 32
STRAGGLING = Allocation("train", tuple(Placement(n, tuple(range(8)), 1.0, 32.0)
                                       for n in ("p-0", "p-1")), user="alice", account="ml")


def fleet(at: float, rng: random.Random, failing: tuple[str, ...] = ()) -> FleetSnapshot:
    """Pool p (4 nodes, a job over p-0 and p-1 with GPU p-1/5 at half speed) and pool q (3 nodes);
    ``failing`` nodes' GPU 0 reported XID 79 at ``at``."""
    nodes, gpus = [], []
    for pool, count in (("p", 4), ("q", 3)):
        for i in range(count):
            name = f"{pool}-{i}"
            nodes.append(Node(name, "h100", 64, pool, "hopper", 8))
            for g in range(8):
                noise = rng.uniform(0.95, 1.05)
                sm = 0.8 * noise * (0.5 if (name, g) == ("p-1", 5) else 1.0)
                health = (GpuHealth(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=at)
                          if name in failing and g == 0 else GpuHealth())
                gpus.append(Gpu(name, g, f"GPU-{name}-{g}", "h100", pool,
                                utilization_ratio=min(1.0, 0.97 * noise), power_watts=600 * noise,
                                memory_used_bytes=int(41e9 * noise), memory_total_bytes=int(80e9),
                                performance=GpuPerformance(sm_active_ratio=sm,
                                                           sm_clock_hertz=1.98e9 * noise),
                                health=health))
    return FleetSnapshot(at, tuple(nodes), tuple(gpus), (STRAGGLING,),
                         (JobRequest("w", 5, pool="q", gpu_share=0.7),))


def health_monitor() -> HealthMonitor:
    """Drains p-3 (XID 79), pages pool q (all three nodes failing), flags p-1/5 a straggler."""
    monitor = HealthMonitor(remediation=RemediationSettings(max_drained_pool_ratio=0.34))
    rng = random.Random(3)
    for at in range(0, 901, 30):
        failing = ("p-3", "q-0", "q-1", "q-2") if at >= 300 else ()
        monitor.observe(fleet(T0 + at, rng, failing))
    return monitor


def load_tracker() -> LoadTracker:
    """Two pools: p's demand over its band (scale up), q's under it (scale down)."""
    table = ScalingTable(ScalingSettings(min_nodes=1, max_nodes=8, hysteresis=2,
                                         cooldown_up_s=0, cooldown_down_s=0, min_samples=1))
    tracker = LoadTracker(window=4, table=table)
    rng = random.Random(5)
    for t in range(6):
        snapshot = fleet(T0 + 60 * t, rng)
        busy = tuple(Allocation(f"j{k}", (Placement(f"p-{2 + k // 8}", (k % 8,), 1.0, 1.0),))
                     for k in range(4 + 2 * t))
        waiting = tuple(JobRequest(f"w{k}", 8, pool="p") for k in range(t))
        tracker.observe(FleetSnapshot(snapshot.taken_at, snapshot.nodes, snapshot.gpus,
                                      snapshot.allocations + busy, snapshot.pending + waiting))
    return tracker


def report(cluster: float, pools: dict[str, float]):
    return SimpleNamespace(
        cluster=SimpleNamespace(index=cluster, allocated_ratio=0.97, idle_gpus=3),
        pools=[SimpleNamespace(name=n, index=v) for n, v in pools.items()])


def planner(snapshot, rep, scope, now):
    moves = tuple(Migration(f"j{i}", "ns", f"p{i}", Endpoint("p-0", (i,)), Endpoint("p-1", (i, i + 1)),
                            "checkpoint_then_migrate", None, 10.123456789, 0.5, 2.0, f"move {i}")
                  for i in range(2))
    return CompactionPlan(scope, snapshot.taken_at, now + 900, "compact", ("planned",),
                          Prediction(rep.cluster.index, 10.0), Prediction(30.1, 6.0),
                          {"h100": 1}, moves,
                          (TierMisplacement("big", "ns", "p-2", "h100", 12.5, ("l4",), "tier"),),
                          rejected_moves=3)


def engine() -> tuple[Advisor, list[float]]:
    clock = [T0]
    return Advisor(DecisionSettings(dwell_seconds=120.0, cooldown_seconds=1800.0,
                                    require_pending=False), clock=lambda: clock[0]), clock


def advisor_run(scaling: tuple[PoolAdvice, ...]):
    """Dwell, compaction on pool p, then a cooldown evaluation carrying the plan."""
    advisor, clock = engine()
    out = []
    for t, cluster, pool in ((0, 40.0, 61.123), (60, 40.5, 70.25), (180, 41.0, 72.5),
                             (240, 30.0, 40.0)):
        clock[0] = T0 + t
        rep = report(cluster, {"p": pool, "q": 12.75})
        out.append(advise(advisor, FleetSnapshot(T0 + t), rep, planner, "snapshot", scaling))
    return advisor, out


def golden_lines(name: str) -> list[str]:
    return (GOLDEN / name).read_text().splitlines()


def test_the_advice_with_its_hints_and_health_is_the_text_the_untyped_code_wrote():
    monitor = health_monitor()
    health = monitor.advice()
    tracker = load_tracker()
    scaling = tuple(tracker.advice())
    _, results = advisor_run(scaling)
    assert [r.decision for r in results] == ["none", "none", "compact", "cooldown"]
    # typed up to the wire: no dict rides in the advice or the health
    assert all(isinstance(r.scaling, tuple) and all(type(a) is PoolAdvice for a in r.scaling)
               for r in results)
    assert [(a.pool, a.action, a.mode, a.window_samples) for a in scaling] == [
        ("p", "scale_up", "reactive", 4), ("q", "scale_down", "reactive", 4)]
    assert isinstance(health, HealthAdvice)
    assert (health.nodes[Verdict.FAILING], [n.node for n in health.unhealthy_nodes]) == \
        (4, ["p-3", "q-0", "q-1", "q-2"])
    assert [node for node, _ in health.drained] == ["p-3"] and health.storms == (("q", T0 + 300),)
    written = [json.dumps({**advice_json(r), "health": health_json(health)}, allow_nan=False)
               for r in results]
    assert written == golden_lines("advice.jsonl")


async def test_get_advice_answers_the_bytes_it_answered(aiohttp_client):
    from aiohttp import web

    monitor = health_monitor()
    _, results = advisor_run(tuple(load_tracker().advice()))

    async def never(reason):
        raise AssertionError(reason)

    app = web.Application()
    add_routes(app, AdvisorApi(evaluate=never, what_if=never, current=lambda: results[-1],
                               token=TOKEN, max_body_bytes=1024, health=monitor.advice))
    client = await aiohttp_client(app)
    answer = await client.get("/v1/advice")
    assert answer.status == 200
    assert await answer.text() == golden_lines("advice.jsonl")[-1]


def test_the_advisor_state_is_the_text_it_was_and_an_old_one_restores():
    advisor, results = advisor_run(())
    state = advisor.durable_state()
    assert isinstance(state, AdvisorState) and state.carried is results[2].plan
    assert state.scopes["pool:p"] == ScopeStatus(40.0, True, T0)
    old = (GOLDEN / "advisor_state.json").read_text().rstrip("\n")
    assert advisor_state_text(state) == old
    # an outbox written by the untyped code: the same state comes back (the plan as its JSON
    # has it: a move's cost rounded to 3 places), and so the same text
    kept = advisor_state_from_text(old)
    assert kept is not None and kept.carried is not None and state.carried is not None
    assert (kept.last_plan_at, kept.carried_at, kept.scopes) == \
        (state.last_plan_at, state.carried_at, state.scopes)
    assert plan_json(kept.carried) == plan_json(state.carried)
    assert kept.carried.migrations[0].cost_gpu_seconds == 10.123
    restored, clock = engine()
    restored.restore(kept)
    assert advisor_state_text(restored.durable_state()) == old
    assert restored.plan is kept.carried and restored.carried_at == T0 + 180
    # and it is in the cooldown of the plan it carries, as the process that wrote it was
    clock[0] = T0 + 300
    again = advise(restored, FleetSnapshot(T0 + 300), report(41.0, {"p": 72.5, "q": 12.75}),
                   planner, "snapshot", None)
    assert (again.decision, again.plan, again.plan_proposed_at) == ("cooldown", kept.carried, T0 + 180)


def test_an_old_state_missing_keys_restores_what_it_has():
    assert advisor_state_from_text("null") is None
    assert advisor_state_from_text('{"last_plan_at": 5}') == AdvisorState(5.0, None, None, {})
    # a plan without the time it was proposed is not taken back (nor read)
    partial = advisor_state_from_text('{"carried": {"plan_id": "x"}, "carried_at": null, "scopes": '
                                      '{"cluster": {"index": 3, "above_since": null, "recommended": 1}}}')
    assert partial == AdvisorState(None, None, None, {"cluster": ScopeStatus(3.0, True, None)})
    for bad in ("[]", '{"scopes": {"cluster": {"index": 3}}}', "{"):
        try:
            advisor_state_from_text(bad)
        except (ValueError, KeyError) as exc:
            assert str(exc)
        else:
            raise AssertionError(f"{bad!r} was read")


def test_the_remediation_state_and_event_bodies_are_the_text_they_were():
    monitor = health_monitor()
    old = (GOLDEN / "remediation_state.json").read_text().rstrip("\n")
    assert remediation_state_text(monitor.remediator.state) == old
    kept = remediation_state_from_text(old)
    assert kept == monitor.remediator.state and remediation_state_from_text("null") is None
    assert [event_body(e).decode() for e in monitor.recent] == golden_lines("event_bodies.txt")


def test_the_typed_modules_write_no_json():
    """JSON is written in wire.py only: the modules whose values it writes import no JSON codec."""
    for path in ("exporter/advisor/advice.py", "exporter/advisor/engine.py",
                 "exporter/health/monitor.py", "exporter/pool_load/tracker.py"):
        tree = ast.parse((REPO / path).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not {m for m in imported if m == "json" or m.startswith(("json.", "msgspec"))}, path
