"""Per-node summaries (issue 45, Build 2): node mode serves ``gpufleet_node_gpus`` (its GPUs by
state, one series a node and state), and cluster mode's prometheus source, with
``node_summaries``, reads it instead of each GPU's up and stale, falling back to each GPU's
series where a summary does not cover the fleet."""

from __future__ import annotations

import asyncio
import logging
import re

from exporter import metrics
from exporter.exposition import ExpositionOptions
from exporter.exposition.families import fleet_families
from exporter.snapshot import FleetSnapshot, Gpu
from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
from exporter.sources.prometheus.source import (
    MAX_NODES_NAMED,
    build_queries,
    nodes_matcher,
    summarised,
)
from tests.test_prometheus_source_reads import UP_QUERY, FakeBackend, _fleet, _series

STALE_QUERY = "max by (node, gpu, instance, job) (gpufleet_gpu_stale{"
OLD_QUERY = "max by (node, gpu, instance, job) (time() - timestamp(gpufleet_gpu_up{"


def _gpu(node: str, index: int, up: bool = True, stale: bool = False) -> Gpu:
    return Gpu(node=node, index=index, uuid=f"GPU-{node}-{index}", model="H100", pool="p",
               up=up, stale=stale)


def test_node_mode_serves_its_gpus_by_state_and_cluster_mode_does_not():
    snapshot = FleetSnapshot(1.0, (), (_gpu("a", 0), _gpu("a", 1), _gpu("a", 2, up=False),
                                       _gpu("b", 0, stale=True), _gpu("b", 1, up=False, stale=True)))
    (family,) = [f for f in fleet_families(snapshot) if f.name == metrics.NODE_GPUS.name]
    assert {dict(labels)["node"] + "/" + dict(labels)["state"]: value
            for labels, value in family.samples} == {"a/up": 2.0, "a/down": 1.0, "b/stale": 2.0}
    assert all(dict(labels)["model"] == "H100" and dict(labels)["pool"] == "p"
               for labels, _ in family.samples)
    assert ExpositionOptions(per_gpu=True).serves(metrics.NODE_GPUS)  # node mode
    assert not ExpositionOptions(per_gpu=False).serves(metrics.NODE_GPUS)  # cluster mode
    # where they are not served, the summaries over every GPU are not worked out either
    cluster = fleet_families(snapshot, ExpositionOptions(per_gpu=False).serves_name)
    assert [f.samples for f in cluster if f.name in (
        metrics.NODE_GPUS.name, metrics.NODE_GPU_MEMORY_TOTAL_BYTES.name)] == [[], []]


# the scrape target of each node's identity in these tests: (instance, job)
TARGETS = {"a": ("10.0.0.1:9874", "nodes"), "b": ("10.0.0.2:9874", "nodes")}


def _row(node: str, gpu: str, uuid: str) -> tuple[str, ...]:
    """An identity row as the source holds it, served by the node's own target."""
    return (node, gpu, uuid, "H100", "p", *TARGETS.get(node, ("10.0.0.9:9874", "nodes")))


def _summary(states: dict[str, dict[str, float]], by: str = "") -> list[dict]:
    """Summary series of each node, from the node's own target unless ``by`` (an instance)."""
    def target(node: str) -> dict[str, str]:
        instance, job = TARGETS.get(node, ("10.0.0.9:9874", "nodes"))
        return {"instance": by or instance, "job": job}

    return [{"metric": {"node": node, "state": state, **target(node)}, "value": [100.0, str(value)]}
            for node, by_state in states.items() for state, value in by_state.items()]


class _Answer:
    def __init__(self, series):
        self.series = series


def test_a_summary_stands_for_up_and_stale_of_the_nodes_it_covers():
    identity = [_row("a", "0", "u0"), _row("a", "1", "u1"), _row("b", "0", "u2")]
    ok = _summary({"a": {"up": 2}, "b": {"up": 1}})
    cover = summarised(_Answer(ok), _Answer([]), identity)
    assert cover is not None and cover.uncovered == []
    got = cover.results()
    # as the rows of each GPU's series, from the target that serves the node
    a, b = TARGETS["a"], TARGETS["b"]
    assert got[metrics.GPU_UP.name].series == [("a", "0", "1", *a), ("a", "1", "1", *a),
                                               ("b", "0", "1", *b)]
    assert got[metrics.GPU_STALE.name].series == [("a", "0", "0", *a), ("a", "1", "0", *a),
                                                  ("b", "0", "0", *b)]
    assert got["old"].series == []
    # a zero-count state is no GPU in it
    cover = summarised(_Answer(_summary({"a": {"up": 2, "down": 0}, "b": {"up": 1}})),
                       _Answer([]), identity)
    assert cover is not None and cover.uncovered == []
    for why, summary, old, uncovered in (
        ("a GPU down", _summary({"a": {"up": 1, "down": 1}, "b": {"up": 1}}), [], ["a"]),
        ("a GPU stale", _summary({"a": {"up": 2}, "b": {"stale": 1}}), [], ["b"]),
        ("a node without a summary", _summary({"a": {"up": 2}}), [], ["b"]),
        ("a node identity does not list", _summary({"a": {"up": 2}, "b": {"up": 1}, "c": {"up": 8}}),
         [], ["c"]),
        ("other counts than identity's", _summary({"a": {"up": 3}, "b": {"up": 1}}), [], ["a"]),
        ("an old summary", ok, [{"metric": {"node": "b", "instance": TARGETS["b"][0],
                                             "job": "nodes"}, "value": [100.0, "400"]}], ["b"]),
        ("a value that is no number", _summary({"a": {"up": "x"}, "b": {"up": 1}}), [], ["a"]),
    ):
        cover = summarised(_Answer(summary), _Answer(old), identity)
        assert cover is not None and cover.uncovered == uncovered, why
        assert cover.covered == [k for k in (("a", "0"), ("a", "1"), ("b", "0"))
                                 if k[0] not in uncovered], why
    assert summarised(_Answer(None), _Answer([]), identity) is None  # the query failed
    assert summarised(_Answer(ok), _Answer(None), identity) is None
    assert summarised(_Answer(ok), _Answer([]), []) is None  # no identity yet
    many = [_row(f"n{i}", "0", f"u{i}") for i in range(MAX_NODES_NAMED + 1)]
    cover = summarised(_Answer([]), _Answer([]), many)  # too many to name: every GPU
    assert cover is not None and cover.every_gpu and cover.covered == []


def test_the_nodes_matcher_names_exactly_those_nodes():
    assert nodes_matcher(["a", "b-1"]) == 'node=~"a|b-1"'
    # RE2's specials escaped, then PromQL's string escapes: n.1 is not n-1, a"b stays one name
    assert nodes_matcher(["n.1", 'a"b', "x|y"]) == r'node=~"n\\.1|a\"b|x\\|y"'


def test_the_summary_queries_only_with_node_summaries():
    assert "summary" not in build_queries(PrometheusConfig(node_summaries=False))
    assert "summary" in build_queries(PrometheusConfig())  # on by default
    queries = build_queries(PrometheusConfig(node_summaries=True, selector='job="n"'))
    # by the scrape target too: each summary is tied to the target that serves it
    assert queries["summary"] == (
        'sum by (node, state, instance, job) (gpufleet_node_gpus{job="n"})')
    assert queries["summary_old"].startswith(
        'max by (node, instance, job) (time() - timestamp(gpufleet_node_gpus{job="n"})) > ')


SUMMARY_QUERY = "sum by (node, state, instance, job) (gpufleet_node_gpus{"
SUMMARY_OLD_QUERY = "max by (node, instance, job) (time() - timestamp(gpufleet_node_gpus{"


def _with_summary(states_of_read, nodes=("a", "b"), listed=None, lies=lambda read: []):
    """The fleet of ``nodes`` (each GPU 0, its series served by its own target, TARGETS;
    identity lists ``listed``, ``nodes`` unless given); the summaries each read as
    ``states_of_read`` says, plus the series ``lies(read)`` adds; and each GPU's up, stale and
    old for the nodes a ``node=~`` matcher names (all without one): a node not in ``nodes``
    has no series but identity's."""
    base = _fleet(lambda r: list(listed or nodes), lambda r: list(nodes))
    summaries = []

    def named(expr: str, series: list[dict]) -> list[dict]:
        found = re.search(r'node=~"([^"]*)"', expr)
        return series if found is None else [
            s for s in series if s["metric"]["node"] in found.group(1).split("|")]

    def answer(expr: str, read: int) -> list[dict]:
        if expr.startswith(SUMMARY_QUERY):
            summaries.append(expr)
            return _summary(states_of_read(len(summaries))) + lies(len(summaries))
        if expr.startswith(SUMMARY_OLD_QUERY):
            return []
        if expr.startswith(STALE_QUERY):
            return own_target(named(expr, [
                _series("gpufleet_gpu_stale", 0, node=n, gpu="0", **GPU_LABELS) for n in nodes]))
        if expr.startswith(OLD_QUERY):
            return []
        return own_target(named(expr, base(expr, read)))

    def own_target(series: list[dict]) -> list[dict]:  # each node's series from its own target
        for sample in series:
            sample["metric"]["instance"], sample["metric"]["job"] = TARGETS[sample["metric"]["node"]]
        return series
    return answer


GPU_LABELS = {"uuid": "x", "model": "H100", "pool": "p"}


def test_cluster_mode_reads_the_summaries_and_each_gpu_only_of_the_nodes_they_do_not_cover():
    # read 1: every GPU up by the summaries; read 2: b's summary says down (its up series
    # says up: its own series decide); read 3: b's summary is gone; read 4: a's summary
    # counts two GPUs, identity one; read 5: all covered again
    def states(read: int) -> dict[str, dict[str, float]]:
        return {1: {"a": {"up": 1}, "b": {"up": 1}}, 2: {"a": {"up": 1}, "b": {"down": 1}},
                3: {"a": {"up": 1}}, 4: {"a": {"up": 2}, "b": {"up": 1}},
                5: {"a": {"up": 1}, "b": {"up": 1}}}[read]

    backend = FakeBackend(_with_summary(states))
    snapshots = asyncio.run(backend.run({"node_summaries": True}, reads=5))
    assert [[(g.node, g.up, g.stale) for g in s.gpus] for s in snapshots] == [
        [("a", True, False), ("b", True, False)]] * 5
    summary = SUMMARY_QUERY + "})"
    per_read = [q for q in backend.queries
                if q.startswith((SUMMARY_QUERY, UP_QUERY, STALE_QUERY, OLD_QUERY))]
    assert per_read[:1] == [summary] and per_read[-1:] == [summary]
    # reads 2 and 3 name b, read 4 names a
    assert sorted(q for q in per_read if q != summary) == sorted(
        [f'{UP_QUERY}node=~"b"}})', f'{STALE_QUERY}node=~"b"}})', f'{OLD_QUERY}node=~"b"}})) > 120'] * 2
        + [f'{UP_QUERY}node=~"a"}})', f'{STALE_QUERY}node=~"a"}})', f'{OLD_QUERY}node=~"a"}})) > 120'])
    assert per_read.count(summary) == 5
    # no query for every GPU's up: identity once, the summaries' counts agree with it but in
    # read 4, where a's own up series answers for the GPU identity lists
    assert backend.count(UP_QUERY + "})") == 0
    assert backend.count("gpufleet_gpu_info") == 1
    # 11 queries a read with identity, 9 without (memory total is read with identity; 12 and
    # 10 without summaries); 3 more where a node is not covered. The first read asks for the
    # nodes' memory totals in place of each GPU's, which this backend does not serve: every
    # GPU's after them, one more (tests/test_node_memory_summary.py: 11 where they are served)
    assert len(backend.queries) == 12 + 12 + 12 + 12 + 9
    assert (backend.source.summarised_reads, backend.source.summaries_ignored) == (5, 0)


def test_a_summary_from_another_target_is_ignored_and_the_node_read_per_gpu(caplog):
    """Node b's exporter stopped: its series are gone, its summary too. Node a's target
    publishes a summary for b saying all up (and b's GPU 0 stays listed by the identity held).
    Believed, it would keep b up and fresh; tied to its target, it is ignored, counted and
    logged once, and b's own series decide: none, so b's GPU is stale."""
    lie = [{"metric": {"node": "b", "state": "up", "instance": TARGETS["a"][0], "job": "nodes"},
            "value": [100.0, "1"]}]
    # identity still lists b (a TSDB's lookback, or the rows held since before it stopped)
    backend = FakeBackend(_with_summary(lambda read: {"a": {"up": 1}}, nodes=("a",),
                                        listed=("a", "b"), lies=lambda read: lie))
    with caplog.at_level(logging.WARNING, logger="exporter.sources.prometheus.source"):
        snapshots = asyncio.run(backend.run({"node_summaries": True}, reads=3))
    assert [[(g.node, g.stale) for g in s.gpus] for s in snapshots] == [
        [("a", False), ("b", True)]] * 3
    # b read per GPU each read, a never
    assert backend.count(f'{UP_QUERY}node=~"b"}})') == 3
    assert backend.count(f'{UP_QUERY}node=~"a') == 0 and backend.count(UP_QUERY + "})") == 0
    assert (backend.source.summarised_reads, backend.source.summaries_ignored) == (3, 3)
    assert snapshots[-1].sources[0].parse_errors == 3  # one ignored series a read
    ignored = [r for r in caplog.records if r.getMessage().startswith("node summary ignored")]
    assert [(r.node, r.target, r.err) for r in ignored] == [  # type: ignore[attr-defined]
        ("b", "nodes/10.0.0.1:9874", "the node's identity comes from nodes/10.0.0.2:9874")]


def test_a_summary_naming_a_node_without_identity_is_ignored_and_read_per_gpu():
    """Node a's target also names a node c that no identity lists: c is read per GPU (a new
    node would bring identity to be read again; this one has no series), nothing is made up."""
    lie = [{"metric": {"node": "c", "state": "up", "instance": TARGETS["a"][0], "job": "nodes"},
            "value": [100.0, "8"]}]
    backend = FakeBackend(_with_summary(lambda read: {"a": {"up": 1}, "b": {"up": 1}},
                                        lies=lambda read: lie))
    snapshots = asyncio.run(backend.run({"node_summaries": True}, reads=2))
    assert [[(g.node, g.up, g.stale) for g in s.gpus] for s in snapshots] == [
        [("a", True, False), ("b", True, False)]] * 2
    assert backend.count(f'{UP_QUERY}node=~"c"}})') == 2
    assert backend.count("gpufleet_gpu_info") == 1  # c's read found no GPU: identity stands
    assert (backend.source.summarised_reads, backend.source.summaries_ignored) == (2, 2)


def test_summaries_are_believed_only_from_the_target_serving_the_nodes_identity():
    identity = [_row("a", "0", "u0"), _row("b", "0", "u1")]
    own = _summary({"a": {"up": 1}, "b": {"up": 1}})
    cover = summarised(_Answer(own), _Answer([]), identity)
    assert cover is not None and (cover.uncovered, cover.ignored) == ([], {})
    # a's target speaks for b as well: b's own summary is not enough, b is read per GPU
    cover = summarised(_Answer(own + _summary({"b": {"up": 1}}, by=TARGETS["a"][0])),
                       _Answer([]), identity)
    assert cover is not None and cover.uncovered == ["b"]
    assert cover.covered == [("a", "0")]
    assert cover.ignored == {("b", "nodes/10.0.0.1:9874"):
                             "the node's identity comes from nodes/10.0.0.2:9874"}
    # the same instance under another job is another target
    other_job = [{"metric": {"node": "b", "state": "up", "instance": TARGETS["b"][0],
                             "job": "other"}, "value": [100.0, "1"]}]
    cover = summarised(_Answer(_summary({"a": {"up": 1}}) + other_job), _Answer([]), identity)
    assert cover is not None and cover.uncovered == ["b"] and len(cover.ignored) == 1
    # an old-sample answer from another target does not make a node's own summary old
    foreign_old = [{"metric": {"node": "a", "instance": TARGETS["b"][0], "job": "nodes"},
                    "value": [100.0, "400"]}]
    cover = summarised(_Answer(own), _Answer(foreign_old), identity)
    assert cover is not None and cover.uncovered == ["a"]  # ignored: the node is read per GPU
    assert list(cover.ignored) == [("a", "nodes/10.0.0.2:9874")]
    # two targets serve a's identity: no summary speaks for a
    twice = [*identity, ("a", "0", "u0", "H100", "p", TARGETS["b"][0], "nodes")]
    cover = summarised(_Answer(own), _Answer([]), twice)
    assert cover is not None and cover.uncovered == ["a"]
    assert cover.ignored == {("a", "nodes/10.0.0.1:9874"):
                             "several targets serve the node's identity"}
    # a summary for a node no identity lists, from a target no identity names either
    cover = summarised(_Answer(own + _summary({"c": {"up": 8}})), _Answer([]), identity)
    assert cover is not None and cover.uncovered == ["c"]
    assert cover.covered == [("a", "0"), ("b", "0")]
    assert cover.ignored == {("c", "nodes/10.0.0.9:9874"): "no identity lists the node"}
    # past MAX_NODES_NAMED ignored nodes: every GPU is read, the ignored still reported
    flood = _summary({f"x{i}": {"up": 8} for i in range(MAX_NODES_NAMED + 1)}, by="evil:1")
    cover = summarised(_Answer(own + flood), _Answer([]), identity)
    assert cover is not None and cover.every_gpu and len(cover.ignored) == MAX_NODES_NAMED + 1
