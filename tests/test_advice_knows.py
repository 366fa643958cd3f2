"""/v1/advice says what it knows: the samples a pool's statistics actually hold, and which of
the drains gpufleet advised the scheduler's own state confirms."""

from __future__ import annotations

import dataclasses
import json

from exporter.advisor.wire import health_json
from exporter.gpu_catalogue import default_catalogue
from exporter.health.monitor import HealthMonitor
from exporter.pool_load.tracker import LoadTracker
from exporter.snapshot import FleetSnapshot
from exporter.sources.slurm.parse import parse_scontrol_nodes, parse_sinfo_json, to_snapshot
from tests.helpers.health import T0, gpu, snap, xid_gpu
from tests.test_health_service import schema

NODES = [f"a-{n}" for n in range(8)]


def _fleet(at: float, failing: str | None = None, drained: frozenset[str] = frozenset()) -> FleetSnapshot:
    """Eight one-GPU nodes of pool a; ``failing`` with an XID 79 at T0 + 30; ``drained``: the
    nodes the scheduler shows drained."""
    base = snap(T0 + at, *(xid_gpu(n, 0, T0 + 30, pool="a") if n == failing else gpu(n, 0, "a")
                           for n in NODES))
    nodes = tuple(dataclasses.replace(n, drained=n.name in drained) for n in base.nodes)
    return dataclasses.replace(base, nodes=nodes)


def test_window_samples_are_the_samples_in_the_window_not_its_size():
    tracker = LoadTracker(window=60)
    for minute in range(3):
        tracker.observe(_fleet(60.0 * minute))
    assert [(a.pool, a.window_samples) for a in tracker.advice()] == [("a", 3)]
    for minute in range(3, 70):
        tracker.observe(_fleet(60.0 * minute))
    assert [(a.pool, a.window_samples) for a in tracker.advice()] == [("a", 60)]  # full


def test_a_drain_is_advised_until_the_scheduler_shows_it_drained():
    monitor = HealthMonitor()
    monitor.observe(_fleet(0))
    monitor.observe(_fleet(30, failing="a-3"))
    advice = monitor.advice()
    assert advice is not None and [node for node, _ in advice.drained] == ["a-3"]
    health = health_json(advice)
    assert sorted(schema("Health").iter_errors(health), key=str) == []
    assert [(d["node"], d["confirmed"]) for d in health["drained"]] == [("a-3", False)]
    # the scheduler drained it (gpufleet act, or an operator): confirmed
    monitor.observe(_fleet(60, failing="a-3", drained=frozenset({"a-3"})))
    health = health_json(monitor.advice())  # type: ignore[arg-type]
    assert [(d["node"], d["confirmed"]) for d in health["drained"]] == [("a-3", True)]
    # a node the scheduler shows drained that gpufleet never advised is not listed
    monitor.observe(_fleet(90, failing="a-3", drained=frozenset({"a-3", "a-5"})))
    health = health_json(monitor.advice())  # type: ignore[arg-type]
    assert [(d["node"], d["confirmed"]) for d in health["drained"]] == [("a-3", True)]
    assert json.loads(json.dumps(health))["drained"][0]["confirmed"] is True


def test_slurm_says_which_nodes_are_drained():
    text = "\n".join([
        "NodeName=n1 CPUTot=8 Gres=gpu:h100:2 State=IDLE+DRAIN Partitions=p",
        "NodeName=n2 CPUTot=8 Gres=gpu:h100:2 State=MIXED+DRAIN Partitions=p",  # draining
        "NodeName=n3 CPUTot=8 Gres=gpu:h100:2 State=DOWN*+DRAIN Partitions=p",
        "NodeName=n4 CPUTot=8 Gres=gpu:h100:2 State=MIXED Partitions=p",
        "NodeName=n5 CPUTot=8 Gres=gpu:h100:2 State=IDLE+RESERVED Partitions=p",
    ])
    nodes = parse_scontrol_nodes(text)
    assert [(n.name, n.drained) for n in nodes] == [
        ("n1", True), ("n2", True), ("n3", True), ("n4", False), ("n5", False)]
    snapshot = to_snapshot(T0, nodes, [], {"h100": "H100"}, default_catalogue())
    assert [(n.name, n.drained) for n in snapshot.nodes] == [
        ("n1", True), ("n2", True), ("n3", True), ("n4", False), ("n5", False)]
    # sinfo --json: the flag in state_flags, or in the state list (OpenAPI 0.0.39+)
    sinfo = json.dumps({"nodes": [
        {"name": "j1", "cpus": 8, "partitions": ["p"], "gres": "gpu:h100:2",
         "state": "idle", "state_flags": ["DRAIN"]},
        {"name": "j2", "cpus": 8, "partitions": ["p"], "gres": "gpu:h100:2",
         "state": ["MIXED", "DRAIN"]},
        {"name": "j3", "cpus": 8, "partitions": ["p"], "gres": "gpu:h100:2", "state": ["IDLE"]},
    ]})
    assert [(n.name, n.drained) for n in parse_sinfo_json(sinfo)] == [
        ("j1", True), ("j2", True), ("j3", False)]


def test_an_advisor_without_receivers_says_at_start_that_nothing_acts(tmp_path, caplog):
    from exporter.advisor.service import NO_RECEIVER, build_service
    from exporter.analysis.analyzer import LiveAnalyzer
    from exporter.config import AdvisorConfig, AnalysisConfig, ReceiverConfig

    caplog.set_level("WARNING", logger="exporter.advisor.service")
    alone = build_service(AdvisorConfig(outbox=str(tmp_path / "a.sqlite")),
                          LiveAnalyzer.from_config(AnalysisConfig()), environ={"T": "t"})
    alone.deliverer.store.close()
    assert [r.getMessage() for r in caplog.records].count(NO_RECEIVER) == 1
    assert "nothing carries out a move or a drain" in NO_RECEIVER
    caplog.clear()
    told = build_service(AdvisorConfig(outbox=str(tmp_path / "b.sqlite"), receivers=(
        ReceiverConfig("scheduler", "http://127.0.0.1:9/plans", secret_env="T"),)),
        LiveAnalyzer.from_config(AnalysisConfig()), environ={"T": "t"})
    told.deliverer.store.close()
    assert NO_RECEIVER not in [r.getMessage() for r in caplog.records]


def test_kubernetes_says_which_nodes_are_cordoned():
    from exporter.sources.kubernetes.source import node_record
    from exporter.sources.kubernetes.source import to_snapshot as kube_snapshot

    def node(name: str, **spec: object) -> dict:
        return {"metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}},
            "spec": spec, "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "64"}}}

    records = [node_record(node("k1", unschedulable=True)), node_record(node("k2")),
               node_record(node("k3", unschedulable="yes"))]  # not a boolean: not cordoned
    assert [(r.name, r.cordoned) for r in records if r is not None] == [
        ("k1", True), ("k2", False), ("k3", False)]
    snapshot, _ = kube_snapshot(T0, [r for r in records if r is not None], [], {}, [],
                                default_catalogue())
    assert [(n.name, n.drained) for n in snapshot.nodes] == [
        ("k1", True), ("k2", False), ("k3", False)]
