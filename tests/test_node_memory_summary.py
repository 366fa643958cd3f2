"""Each node's memory total (issue 45): node mode serves ``gpufleet_node_gpu_memory_total_bytes``
(one series a node, where all its GPUs report the same total), and cluster mode's prometheus
source, with ``node_summaries``, reads it instead of each GPU's memory total where it reads that
for every GPU (the first read), each GPU's only for the nodes it does not cover."""

from __future__ import annotations

import asyncio
import logging
import re

from exporter import metrics
from exporter.exposition import ExpositionOptions
from exporter.exposition.families import fleet_families, node_memory_totals
from exporter.snapshot import FleetSnapshot, Gpu
from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
from exporter.sources.prometheus.source import (
    MAX_NODES_NAMED,
    NODE_MEMORY,
    build_queries,
    memory_summarised,
)
from tests.test_prometheus_source_reads import FakeBackend

# the scrape target of each node in these tests: (instance, job)
TARGETS = {"a": ("10.0.0.1:9874", "nodes"), "b": ("10.0.0.2:9874", "nodes"),
           "c": ("10.0.0.3:9874", "nodes")}
GB = 1_000_000_000
# node -> each GPU's memory total (None: the GPU reports none): a's agree, b's differ, c's GPU 1
# reports none
FLEET = {"a": [80 * GB, 80 * GB], "b": [80 * GB, 40 * GB], "c": [141 * GB, None]}

PER_GPU_TOTAL = "max by (node, gpu, instance, job) (gpufleet_gpu_memory_total_bytes{"
NODE_TOTAL = "max by (node, instance, job) (gpufleet_node_gpu_memory_total_bytes{"


def _gpus(fleet: dict[str, list[int | None]]) -> list[Gpu]:
    """The GPUs as node mode reads them."""
    return [Gpu(node=node, index=i, uuid=f"GPU-{node}-{i}", model="H100", pool="p",
                memory_total_bytes=total)
            for node, totals in fleet.items() for i, total in enumerate(totals)]


def test_node_mode_serves_a_nodes_memory_total_only_where_its_gpus_agree():
    gpus = _gpus(FLEET)
    snapshot = FleetSnapshot(1.0, (), tuple(gpus))
    (family,) = [f for f in fleet_families(snapshot)
                 if f.name == metrics.NODE_GPU_MEMORY_TOTAL_BYTES.name]
    # b's GPUs differ, c's GPU 1 reports none: no series for either
    assert list(family.samples) == [((("node", "a"), ("pool", "p"), ("model", "H100")), 80e9)]
    assert family.type == "gauge"
    # one pool and model a node: GPUs of two models are no one node total either
    other = [*_gpus({"d": [80 * GB]}),
             Gpu(node="d", index=1, uuid="GPU-d-1", model="H800", pool="p",
                 memory_total_bytes=80 * GB)]
    assert node_memory_totals(other) == []
    assert node_memory_totals(_gpus({"d": [None, None]})) == []
    assert ExpositionOptions(per_gpu=True).serves(metrics.NODE_GPU_MEMORY_TOTAL_BYTES)  # node mode
    assert not ExpositionOptions(per_gpu=False).serves(metrics.NODE_GPU_MEMORY_TOTAL_BYTES)


def test_the_node_query_is_built_only_with_node_summaries():
    assert NODE_MEMORY not in build_queries(PrometheusConfig(node_summaries=False))
    queries = build_queries(PrometheusConfig(selector='job="n"'))  # on by default
    # by the scrape target too: a node's total is tied to the target that serves it
    assert queries[NODE_MEMORY] == (
        'max by (node, instance, job) (gpufleet_node_gpu_memory_total_bytes{job="n"})')


class _Answer:
    def __init__(self, series):
        self.series = series


def _row(node: str, gpu: str) -> tuple[str, ...]:
    """An identity row as the source holds it, served by the node's own target."""
    return (node, gpu, f"GPU-{node}-{gpu}", "H100", "p", *TARGETS.get(node, ("10.9.9.9:1", "x")))


def _total(node: str, value: str, by: tuple[str, str] | None = None) -> tuple[str, ...]:
    """A node total as the source decodes it (compact()'s row), from the node's own target
    unless ``by``."""
    return (node, "0", value, *(by or TARGETS[node]))


def test_a_nodes_total_stands_for_each_of_its_gpus_from_its_own_target_only():
    identity = [_row("a", "0"), _row("a", "1"), _row("b", "0"), _row("b", "1")]
    cover = memory_summarised(_Answer([_total("a", "8e+10")]), identity)
    assert cover is not None and not cover.every_gpu
    # as each GPU's series would have come: node, gpu, value, the node's own target
    assert cover.rows == [("a", "0", "8e+10", *TARGETS["a"]), ("a", "1", "8e+10", *TARGETS["a"])]
    assert cover.uncovered == ["b"] and cover.ignored == {}
    # b's total from a's target: not believed, b read per GPU; counted where it is logged
    lie = _total("b", "1e+12", by=TARGETS["a"])
    for own_b in ([], [_total("b", "8e+10")]):  # b's own beside the lie does not cover it
        cover = memory_summarised(_Answer([_total("a", "8e+10"), *own_b, lie]), identity)
        assert cover is not None and cover.uncovered == ["b"]
        assert [r[0] for r in cover.rows] == ["a", "a"]
        assert cover.ignored == {("b", "nodes/10.0.0.1:9874"):
                                 "the node's identity comes from nodes/10.0.0.2:9874"}
    # a node no identity lists: ignored, nothing read for it
    cover = memory_summarised(_Answer([_total("a", "8e+10"), _total("b", "8e+10"),
                                       ("z", "0", "8e+10", "10.0.0.1:9874", "nodes")]), identity)
    assert cover is not None and cover.uncovered == [] and len(cover.rows) == 4
    assert cover.ignored == {("z", "nodes/10.0.0.1:9874"): "no identity lists the node"}
    # two targets serve b's identity: no total speaks for b
    twice = [*identity, ("b", "0", "GPU-b-0", "H100", "p", "10.0.0.1:9874", "nodes")]
    cover = memory_summarised(_Answer([_total("a", "8e+10"), _total("b", "8e+10")]), twice)
    assert cover is not None and cover.uncovered == ["b"]
    assert cover.ignored == {("b", "nodes/10.0.0.2:9874"):
                             "several targets serve the node's identity"}
    # a total that is no legal byte count: the node's GPUs are read one by one
    for bad in ("NaN", "-1", "+Inf", "1e30", "x"):
        cover = memory_summarised(_Answer([_total("a", "8e+10"), _total("b", bad)]), identity)
        assert cover is not None and cover.uncovered == ["b"], bad


def test_every_gpus_total_is_read_where_the_nodes_totals_do_not_serve():
    identity = [_row("a", "0"), _row("b", "0")]
    assert memory_summarised(_Answer(None), identity) is None  # the query failed
    assert memory_summarised(None, identity) is None
    assert memory_summarised(_Answer([_total("a", "8e+10")]), []) is None  # no identity
    malformed = {"metric": {"node": "a"}, "value": [1.0, "8e+10"]}  # compact() kept it as it came
    assert memory_summarised(_Answer([malformed]), identity) is None
    # none covered (exporters that do not serve the family): every GPU's, not a selector naming all
    cover = memory_summarised(_Answer([]), identity)
    assert cover is not None and cover.every_gpu and cover.rows == []
    # past MAX_NODES_NAMED nodes uncovered: every GPU's
    many = [_row("a", "0")] + [(f"n{i}", "0", f"u{i}", "H100", "p", "10.1.0.1:1", "nodes")
                               for i in range(MAX_NODES_NAMED + 1)]
    cover = memory_summarised(_Answer([_total("a", "8e+10")]), many)
    assert cover is not None and cover.every_gpu
    cover = memory_summarised(_Answer([_total("a", "8e+10")]), many[:MAX_NODES_NAMED + 1])
    assert cover is not None and not cover.every_gpu and len(cover.uncovered) == MAX_NODES_NAMED


def _series(name: str, value: float | str, **labels: str) -> dict:
    return {"metric": {"__name__": name, **labels}, "value": [100.0, str(value)]}


def _node_mode(fleet: dict[str, list[int | None]], lies=(), fail_node_query: bool = False):
    """A query answerer over what node mode's exporters serve for ``fleet``, each node's series
    from its own target: identity, each GPU's up (1), stale (0) and memory total (none for a GPU
    that reports none), the nodes' summaries, and the nodes' memory totals as
    :func:`node_memory_totals` makes them, plus the series ``lies`` adds; a ``node=~`` matcher
    answers for those nodes only. ``fail_node_query``: the node totals' query fails (HTTP 500)."""
    gpus = _gpus(fleet)

    def labels(gpu: Gpu) -> dict[str, str]:
        instance, job = TARGETS[gpu.node]
        return {"node": gpu.node, "gpu": str(gpu.index), "uuid": gpu.uuid, "model": gpu.model,
                "pool": gpu.pool, "instance": instance, "job": job}

    def answer(expr: str, read: int) -> list[dict]:
        found = re.search(r'node=~"([^"]*)"', expr)
        named = [g for g in gpus if found is None or g.node in found.group(1).split("|")]
        if expr.startswith("gpufleet_gpu_info{"):
            return [_series("gpufleet_gpu_info", 1, **labels(g)) for g in named]
        if expr.startswith("max by (node, gpu, instance, job) (gpufleet_gpu_up{"):
            return [_series("gpufleet_gpu_up", 1, **labels(g)) for g in named]
        if expr.startswith("max by (node, gpu, instance, job) (gpufleet_gpu_stale{"):
            return [_series("gpufleet_gpu_stale", 0, **labels(g)) for g in named]
        if expr.startswith(PER_GPU_TOTAL):
            return [_series("gpufleet_gpu_memory_total_bytes", g.memory_total_bytes, **labels(g))
                    for g in named if g.memory_total_bytes is not None]
        if expr.startswith("sum by (node, state, instance, job) (gpufleet_node_gpus{"):
            return [{"metric": {"node": node, "state": "up", "instance": TARGETS[node][0],
                                "job": TARGETS[node][1]}, "value": [100.0, str(len(totals))]}
                    for node, totals in fleet.items()]
        if expr.startswith(NODE_TOTAL):
            if fail_node_query:
                raise RuntimeError("the backend failed")  # aiohttp answers 500
            own = [{"metric": {"node": dict(ls)["node"], "instance": TARGETS[dict(ls)["node"]][0],
                               "job": TARGETS[dict(ls)["node"]][1]}, "value": [100.0, f"{v:g}"]}
                   for ls, v in node_memory_totals(gpus)]
            return own + list(lies)
        return []
    return answer


def _totals(snapshot) -> list[tuple[str, int, int | None]]:
    return [(g.node, g.index, g.memory_total_bytes) for g in snapshot.gpus]


EXPECTED = [("a", 0, 80 * GB), ("a", 1, 80 * GB), ("b", 0, 80 * GB), ("b", 1, 40 * GB),
            ("c", 0, 141 * GB), ("c", 1, None)]


def test_the_first_read_takes_memory_total_from_the_nodes_and_each_gpus_where_they_differ():
    """a's total covers its GPUs; b's GPUs differ and c's GPU 1 reports none, so neither has a
    node series: their GPUs are read one by one, in one query naming them. Each GPU's memory
    total is what each GPU's own series gives (the read without node summaries)."""
    backend = FakeBackend(_node_mode(FLEET))
    snapshots = asyncio.run(backend.run({"node_summaries": True}, reads=2))
    assert [_totals(s) for s in snapshots] == [EXPECTED] * 2
    assert [q for q in backend.queries if q.startswith(PER_GPU_TOTAL)] == [
        PER_GPU_TOTAL + 'node=~"b|c"})']
    assert backend.count(NODE_TOTAL) == 1  # the first read only: memory total is then held
    assert (backend.source.node_memory_reads, backend.source.summaries_ignored) == (1, 0)
    # 11 queries at the first read (the node totals in place of each GPU's), 1 more for the
    # nodes they do not cover; 9 a read without identity
    assert len(backend.queries) == 11 + 1 + 9
    # the same totals as each GPU's own series, read without the summaries
    per_gpu = FakeBackend(_node_mode(FLEET))
    (alone,) = asyncio.run(per_gpu.run({"node_summaries": False}, reads=1))
    assert _totals(alone) == EXPECTED
    assert per_gpu.count(NODE_TOTAL) == 0 and per_gpu.count(PER_GPU_TOTAL + "})") == 1


def test_where_every_node_agrees_no_gpus_memory_total_is_queried():
    fleet = {"a": [80 * GB, 80 * GB], "b": [141 * GB] * 3}
    backend = FakeBackend(_node_mode(fleet))
    (snapshot,) = asyncio.run(backend.run({"node_summaries": True}, reads=1))
    assert _totals(snapshot) == [("a", 0, 80 * GB), ("a", 1, 80 * GB), ("b", 0, 141 * GB),
                                 ("b", 1, 141 * GB), ("b", 2, 141 * GB)]
    assert backend.count(PER_GPU_TOTAL) == 0 and backend.count(NODE_TOTAL) == 1
    assert len(backend.queries) == 11  # as before: the node query in place of each GPU's
    # the rows stand in for each GPU's series: nothing refused, nothing dropped
    assert snapshot.sources[0].parse_errors == 0


def test_a_total_from_another_target_is_not_believed_and_the_node_read_per_gpu(caplog):
    """a's target publishes a memory total for b (1 TB a GPU). Believed, b's GPUs would have it;
    tied to the target that serves b's identity, it is ignored, counted and logged once, and b's
    own series decide."""
    fleet = {"a": [80 * GB, 80 * GB], "b": [80 * GB, 80 * GB]}
    lie = {"metric": {"node": "b", "instance": TARGETS["a"][0], "job": "nodes"},
           "value": [100.0, "1e+12"]}
    backend = FakeBackend(_node_mode(fleet, lies=[lie]))
    with caplog.at_level(logging.WARNING, logger="exporter.sources.prometheus.source"):
        (snapshot,) = asyncio.run(backend.run({"node_summaries": True}, reads=1))
    assert _totals(snapshot) == [("a", 0, 80 * GB), ("a", 1, 80 * GB), ("b", 0, 80 * GB),
                                 ("b", 1, 80 * GB)]
    assert [q for q in backend.queries if q.startswith(PER_GPU_TOTAL)] == [
        PER_GPU_TOTAL + 'node=~"b"})']
    assert backend.source.summaries_ignored == 1
    assert backend.source.refused_by_target == {"nodes/10.0.0.1:9874": 1}
    assert snapshot.sources[0].parse_errors == 1  # the ignored series
    ignored = [r for r in caplog.records
               if r.getMessage().startswith("node memory total ignored")]
    assert [(r.node, r.target, r.err) for r in ignored] == [  # type: ignore[attr-defined]
        ("b", "nodes/10.0.0.1:9874", "the node's identity comes from nodes/10.0.0.2:9874")]


def test_a_failed_node_query_reads_every_gpus_memory_total():
    backend = FakeBackend(_node_mode(FLEET, fail_node_query=True))
    (snapshot,) = asyncio.run(backend.run({"node_summaries": True}, reads=1))
    assert _totals(snapshot) == EXPECTED
    assert [q for q in backend.queries if q.startswith(PER_GPU_TOTAL)] == [PER_GPU_TOTAL + "})"]
    assert backend.source.node_memory_reads == 0
    # the node query's failure is no field left out: every GPU's total stands in for it
    assert snapshot.sources[0].parse_errors == 0


def test_exporters_without_the_node_family_have_every_gpus_memory_total_read():
    """Older node exporters serve no node totals: every GPU's total is read in one query with
    no node named (a selector naming every node would cost the backend more)."""
    answer = _node_mode(FLEET)

    def without(expr: str, read: int) -> list[dict]:
        return [] if expr.startswith(NODE_TOTAL) else answer(expr, read)

    backend = FakeBackend(without)
    (snapshot,) = asyncio.run(backend.run({"node_summaries": True}, reads=1))
    assert _totals(snapshot) == EXPECTED
    assert [q for q in backend.queries if q.startswith(PER_GPU_TOTAL)] == [PER_GPU_TOTAL + "})"]
