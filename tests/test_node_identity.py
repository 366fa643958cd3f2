"""A node is who its target is; reserved and set names are never node names (issue 39,
findings 1 and 8's newline).

A dcgm target speaks for its own node only: a ``Hostname`` other than the node its
configuration names (or the host of its URL) is refused, as is ``ALL``, a hostlist, a body
naming several nodes, and two targets naming one node with other GPUs. Names that are no
single node's are refused again where remediation is decided and in every renderer, and
every message about one stays one line. The last test runs it all in a real ``serve``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest
from aiohttp import web

from exporter.collect import Collector
from exporter.compose import compose
from exporter.config import ConfigError, load
from exporter.health.remediation import (
    Drain,
    DrainRecord,
    RemediationState,
    Remediator,
    ResetGpu,
    Resume,
    event_id,
)
from exporter.health.render import (
    RenderError,
    kubernetes_patch,
    node_name,
    slurm_argv,
    slurm_command_text,
)
from exporter.health.verdict import HealthTracker
from exporter.node_names import same_node
from exporter.snapshot import FleetSnapshot, Gpu, Node
from exporter.sources.dcgm.identity import Identity, Part, claim, conflicts, identity
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.dcgm.source import DcgmExporterSource, parse_targets_file
from tests.helpers import free_port, http_get, stop, wait_http, wait_until
from tests.helpers.exported import Exported
from tests.helpers.health import T0, gpu, snap, xid_gpu

H100 = "NVIDIA H100 80GB HBM3"

# -- names: one rule, refused everywhere, one line --------------------------------------------

NOT_NODES = ["ALL", "all", "All", "DEFAULT", "default", "gpu-[1-4]", "gpu-1,gpu-2", "gpu-1 gpu-2",
             "gpu-1\nreboot", "gpu-1\r", "gpu-1\u2028x", "gpu-\u0663", "-gpu", ".gpu", "",
             "gpu-1;reboot", "$(id)", "x" * 254, "gpu-1\x00"]
NODES = ["gpu-005", "gpu-node-1.cluster.local", "allgpu", "ALL1", "n", "x" * 253, "ip-10-0-0-5"]


@pytest.mark.parametrize("name", NOT_NODES)
def test_no_renderer_takes_a_name_that_is_no_single_node_and_says_so_in_one_line(name):
    for render in (lambda: node_name(name),
                   lambda: slurm_argv(Drain(name, "p", "XID 79 on GPU 3", T0)),
                   lambda: slurm_argv(Resume(name, "p", T0, T0 + 1)),
                   lambda: kubernetes_patch(Drain(name, "p", "XID 79", T0),
                                            {"metadata": {"name": name, "resourceVersion": "1"}})):
        with pytest.raises(RenderError) as caught:
            render()
        message = str(caught.value)
        assert message.startswith("node: ") and len(message) < 200
        assert len(message.splitlines()) == 1 and "\x00" not in message, message
    # an id carries the name into every audit record and message: one line too
    ident = event_id(Drain(name, "p", "x", T0))
    assert len(ident.splitlines()) == 1 and ident.isprintable()


def test_reserved_names_are_refused_in_any_case_and_real_names_pass():
    for name in NODES:
        assert node_name(name) == name
        assert slurm_argv(Drain(name, "p", "x", T0))[2] == f"NodeName={name}"  # type: ignore[index]
    with pytest.raises(RenderError, match="node: 'aLl' is reserved by Slurm"):
        node_name("aLl")
    # a real name's id is unchanged: act's audit log matches ids across versions
    assert event_id(Drain("gpu-005", "p", "x", T0)) == f"drain:gpu-005:{round(T0 * 1000)}"


def test_the_command_text_an_operator_pastes_is_checked_word_by_word():
    good = ["scontrol", "update", "NodeName=gpu-005", "State=DRAIN", "Reason=gpufleet: XID 79"]
    assert slurm_command_text(good) == \
        'scontrol update NodeName=gpu-005 State=DRAIN Reason="gpufleet: XID 79"'
    for bad, what in ((["scontrol", "update", "NodeName=ALL", "State=DRAIN"], "node: 'ALL'"),
                      (["scontrol", "update", "NodeName=a,b", "State=RESUME"], "node: 'a,b'"),
                      ([*good[:4], 'Reason=gpufleet: x"; id'], "reason: "),
                      ([*good[:4], "Reason=operator: x"], "reason: "),
                      (["scontrol", "update", "NodeName=n1", "State=$(id)"], "command: ")):
        with pytest.raises(RenderError, match=f"^{what}".replace("$", r"\$").replace("(", r"\(")
                           .replace(")", r"\)")):
            slurm_command_text(bad)


def test_plan_names_a_refused_node_holding_a_newline_in_one_line(tmp_path):
    from tests.test_health_plan import HISTORY, advice, plan

    evil = Drain("gpu-1\nscontrol update NodeName=ALL State=DRAIN", "h100", "XID 79", T0 + 900)
    done = plan(tmp_path, advice([HISTORY[0], evil]), "--format", "slurm")
    assert (done.returncode, done.stdout) == (
        1, 'scontrol update NodeName=gpu-003 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n')
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("gpufleet: drain:gpu-1\\nscontrol update NodeName=ALL State=DRAIN:")
    assert "is not a node name" in done.stderr


def _pool(at: float, broken: tuple[str, ...] = (), extra: tuple[str, ...] = ("ALL",)) -> FleetSnapshot:
    """Pool p: n1..n4 and ``extra`` (8 GPUs each); XID 79 on GPU 3 of each ``broken`` node."""
    return snap(T0 + at, *[xid_gpu(n, i, T0 + 30) if n in broken and i == 3 else gpu(n, i)
                           for n in ("n1", "n2", "n3", "n4", *extra) for i in range(8)])


def test_remediation_builds_no_event_for_a_name_that_is_no_node_and_spends_no_budget_on_it():
    tracker, remediator = HealthTracker(), Remediator()
    assert remediator.decide(tracker.observe(_pool(0))) == []
    events = remediator.decide(tracker.observe(_pool(30, broken=("n1", "ALL"))))
    # ALL is no node: neither drained nor counted, so n1 is drained within the pool's budget
    # (one of four nodes) rather than the two "failing" nodes paging as a storm
    assert events == [Drain("n1", "p", "XID 79 on GPU 3", T0 + 30),
                      ResetGpu("n1", "p", 3, "XID 79 on GPU 3", T0 + 30)]
    assert remediator.refused == ("ALL",)
    assert set(remediator.state.drained) == {"n1"} and "ALL" not in remediator.state.faults
    # a state saved by an older version that drained ALL: no resume is ever built for it
    state = RemediationState(drained={"ALL": DrainRecord("p", "XID 79", T0), "n2": DrainRecord(
        "p", "XID 79", T0)}, faults={"gpu-[1-2]": [T0]}, resets=["ALL/3"])
    remediator = Remediator(state=state)
    later = _pool(0, extra=())
    tracker = HealthTracker()
    tracker.observe(later)
    events = remediator.decide(tracker.observe(_pool(7200, extra=())))
    assert [type(e).__name__ for e in events] == ["Resume"] and events[0].node == "n2"
    assert state.drained == {} and state.faults == {} and state.resets == []


def test_the_monitor_logs_refused_names_once(caplog):
    from exporter.health.monitor import HealthMonitor

    monitor = HealthMonitor()
    with caplog.at_level(logging.WARNING, logger="exporter.health.monitor"):
        for at in (0, 30, 60, 90):
            monitor.observe(_pool(at, broken=("ALL",) if at else ()))
    logged = [r for r in caplog.records if "no remediation for them" in r.getMessage()]
    assert [r.nodes for r in logged] == [["'ALL'"]]  # type: ignore[attr-defined]
    assert monitor.events_total["drain"] == 0 and monitor.events_total["page"] == 0


# -- who a target is --------------------------------------------------------------------------

def test_a_target_knows_its_node_from_its_configuration_or_its_host_name():
    assert identity("10.0.0.8", "") == Identity("", False)
    assert identity("[::1]", "") == identity("::1", "") == Identity("", False)
    assert identity("localhost", "") == identity("LocalHost.", "") == Identity("", False)
    assert identity("gpu-008.cluster.local", "") == Identity("gpu-008.cluster.local", False)
    assert identity("10.0.0.8", "gpu-008") == Identity("gpu-008", True)
    assert same_node("gpu-008", "GPU-008.cluster.local") and same_node("Gpu-008.", "gpu-008")
    assert not same_node("gpu-008", "gpu-0080") and not same_node("gpu-008.a", "gpu-008.b")
    assert not same_node("gpu-008", "gpu-005.gpu-008")


def test_a_body_names_one_node_its_own():
    by_host, configured, address = identity("gpu-008.lab", ""), identity("10.0.0.8", "gpu-008"), \
        identity("10.0.0.8", "")
    assert claim(by_host, {"gpu-008"}) == ("gpu-008", "")  # dcgm-exporter's short name
    assert claim(configured, {"GPU-008.lab"}) == ("gpu-008", "")  # named as configured
    assert claim(address, {"gpu-005"}) == ("gpu-005", "")  # nothing to check it against
    assert claim(configured, {"gpu-005"})[1] == \
        "refused: Hostname 'gpu-005' is not this target's node 'gpu-008' (its configured node)"
    assert claim(by_host, {"gpu-005"})[1] == \
        "refused: Hostname 'gpu-005' is not this target's node 'gpu-008.lab' (the host of its URL)"
    assert claim(address, {"ALL"})[1] == \
        "refused: Hostname 'ALL' is reserved by Slurm (it names no single node), not a node name"
    assert claim(address, {"gpu-[1-8]"})[1].endswith("is not a node name (letters, digits, "
                                                     "'.', '_', '-')")
    assert claim(address, {"a", "b", "c", "d", "e"})[1] == (
        "refused: the body names 5 nodes ('a', 'b', 'c' and 2 more); a target speaks for its "
        "own node only")


def test_two_targets_naming_one_node_with_other_gpus_are_a_conflict():
    def part(url: str, node: str, uuids: str, known: str = "") -> Part:
        return Part(url, identity("10.0.0.1", known), node, frozenset(uuids.split()))

    # one node reached by two addresses: the same GPUs, no conflict
    assert conflicts([part("a", "gpu-005", "u1 u2"), part("b", "gpu-005", "u1 u2")]) == {}
    # nothing says which one lies: neither is used
    refused = conflicts([part("a", "gpu-005", "u1"), part("b", "GPU-005.lab", "u9")])
    assert refused == {
        "a": "refused: node 'gpu-005' is also named by b with other GPUs (a conflict; none of "
             "them is used)",
        "b": "refused: node 'GPU-005.lab' is also named by a with other GPUs (a conflict; none "
             "of them is used)"}
    # the target whose node it is keeps it, and a copy of its GPUs elsewhere is no conflict
    refused = conflicts([part("liar", "gpu-005", "u9"), part("copy", "gpu-005", "u1"),
                         part("own", "gpu-005", "u1", known="gpu-005")])
    assert refused == {"liar": "refused: node 'gpu-005' is also named by own with other GPUs "
                               "(a conflict; kept by the target whose node it is)"}


# -- the dcgm source ----------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def body(node: str, uuid_prefix: str, *, xid: int = 0, gpus: int = 2, pod: str = "") -> str:
    lines = []
    for i in range(gpus):
        labels = f'gpu="{i}",UUID="GPU-{uuid_prefix}-{i}",Hostname="{node}",modelName="{H100}"'
        if pod and i == 0:
            labels += f',pod="{pod}",namespace="ml"'
        lines += [f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 30", f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}"]
    return "\n".join(lines) + "\n"


class Bodies:
    """Local dcgm targets whose bodies a test changes between reads."""

    def __init__(self, aiohttp_server) -> None:
        self.server = aiohttp_server
        self.bodies: dict[str, str] = {}
        self.url = ""

    async def start(self) -> Bodies:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=self.bodies[request.match_info["name"]])

        app = web.Application()
        app.router.add_get("/{name}/metrics", handler)
        server = await self.server(app)
        self.url = f"http://127.0.0.1:{server.port}"
        return self

    def target(self, name: str, text: str) -> str:
        self.bodies[name] = text
        return f"{self.url}/{name}/metrics"


async def read(source: DcgmExporterSource, collector: Collector | None = None):
    collector = collector or Collector([source], timeout_seconds=10, clock=source.clock)
    snapshot = await collector.collect()
    return snapshot, {s.target: s for s in snapshot.sources if s.target}


async def test_a_target_naming_another_node_than_its_configured_one_is_refused(
        aiohttp_server, tmp_path, caplog):
    bodies = await Bodies(aiohttp_server).start()
    liar = bodies.target("gpu-008", body("gpu-008", "g8"))
    honest = bodies.target("gpu-005", body("gpu-005", "g5"))
    path = tmp_path / "targets.yaml"
    path.write_text(f"- targets: ['{liar}']\n  labels: {{node: gpu-008, pool: a}}\n"
                    f"- targets: ['{honest}']\n  labels: {{pool: a}}\n")
    source = DcgmExporterSource(DcgmConfig(enabled=True, targets_file=str(path)), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    caplog.set_level(logging.INFO, logger="exporter.sources.dcgm.source")
    try:
        first, _ = await read(source, collector)
        bodies.bodies["gpu-008"] = body("gpu-005", "g8", xid=79)  # claims gpu-005
        lied, statuses = await read(source, collector)
        source.clock.now += 5  # type: ignore[attr-defined]
        again, _ = await read(source, collector)
        bodies.bodies["gpu-008"] = body("gpu-008", "g8")
        honest_again, back = await read(source, collector)
    finally:
        await source.close()
    assert {g.node for g in first.gpus} == {"gpu-005", "gpu-008"}
    for snapshot in (lied, again):
        # the liar's GPUs reach no node, and its earlier reading of gpu-008 is not served stale
        assert sorted((g.node, g.uuid) for g in snapshot.gpus) == [
            ("gpu-005", "GPU-g5-0"), ("gpu-005", "GPU-g5-1")]
        assert [n.name for n in snapshot.nodes] == ["gpu-005"]
    assert (statuses[liar].up, statuses[liar].error) == (False, (
        "refused: Hostname 'gpu-005' is not this target's node 'gpu-008' (its configured node)"))
    assert statuses[honest].up
    out = Exported.of(lied)
    assert out.value("gpufleet_source_up", source="dcgm", target=liar) == 0
    assert out.value("gpufleet_source_up", source="dcgm", target=honest) == 1
    assert out.value("gpufleet_source_up", source="dcgm", target="") == 1
    assert len(out.all("gpufleet_gpu_up", node="gpu-005")) == 2
    refused = [r for r in caplog.records if r.getMessage().startswith("dcgm target refused")]
    assert [(r.target, r.err) for r in refused] == [(liar, statuses[liar].error)]  # type: ignore[attr-defined]
    assert [r.target for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage() == "dcgm target no longer refused"] == [liar]
    assert back[liar].up and {g.node for g in honest_again.gpus} == {"gpu-005", "gpu-008"}


async def test_a_target_at_an_address_naming_all_a_hostlist_or_two_nodes_is_refused(aiohttp_server):
    bodies = await Bodies(aiohttp_server).start()
    urls = {"ALL": bodies.target("a", body("ALL", "a", xid=79)),
            "all": bodies.target("b", body("all", "b")),
            "hostlist": bodies.target("c", body("gpu-[001-008]", "c")),
            "two": bodies.target("d", body("gpu-001", "d") + body("gpu-002", "e")),
            "good": bodies.target("f", body("gpu-006", "f"))}
    source = DcgmExporterSource(DcgmConfig(enabled=True, targets=tuple(urls.values())), Clock())
    try:
        snapshot, statuses = await read(source)
    finally:
        await source.close()
    assert {g.node for g in snapshot.gpus} == {"gpu-006"}
    errors = {kind: statuses[url].error for kind, url in urls.items()}
    assert errors == {
        "ALL": "refused: Hostname 'ALL' is reserved by Slurm (it names no single node), not a "
               "node name",
        "all": "refused: Hostname 'all' is reserved by Slurm (it names no single node), not a "
               "node name",
        "hostlist": "refused: Hostname 'gpu-[001-008]' is not a node name (letters, digits, "
                    "'.', '_', '-')",
        "two": "refused: the body names 2 nodes ('gpu-001', 'gpu-002'); a target speaks for its "
               "own node only",
        "good": ""}


async def test_two_targets_claiming_one_node_are_a_conflict_that_the_configured_one_wins(
        aiohttp_server):
    bodies = await Bodies(aiohttp_server).start()
    real = bodies.target("real", body("gpu-005", "g5"))
    impostor = bodies.target("impostor", body("gpu-005", "g8", xid=79))
    # two addresses, nothing configured: neither is believed
    source = DcgmExporterSource(DcgmConfig(enabled=True, targets=(impostor, real)), Clock())
    try:
        blind, statuses = await read(source)
    finally:
        await source.close()
    assert blind.gpus == () and not statuses[real].up and not statuses[impostor].up
    assert statuses[impostor].error == (
        f"refused: node 'gpu-005' is also named by {real} with other GPUs (a conflict; none of "
        "them is used)")
    # the real one's node configured: it keeps the node, listed first or not
    config = load_dcgm(f"targets: ['{impostor}']\n    target_groups: [{{targets: ['{real}'], "
                       "node: gpu-005}]")
    source = DcgmExporterSource(config, Clock())
    try:
        kept, statuses = await read(source)
    finally:
        await source.close()
    assert sorted(g.uuid for g in kept.gpus) == ["GPU-g5-0", "GPU-g5-1"]
    assert statuses[real].up and statuses[impostor].error == (
        f"refused: node 'gpu-005' is also named by {real} with other GPUs (a conflict; kept by "
        "the target whose node it is)")


async def test_a_configured_node_names_the_node_and_its_placements(aiohttp_server):
    bodies = await Bodies(aiohttp_server).start()
    url = bodies.target("n1", body("GPU-NODE-1.cluster.local", "n1", pod="train-0"))
    source = DcgmExporterSource(load_dcgm(f"target_groups: [{{targets: ['{url}'], "
                                          "node: gpu-node-1}]"), Clock())
    try:
        snapshot, statuses = await read(source)
    finally:
        await source.close()
    assert statuses[url].up
    assert {g.node for g in snapshot.gpus} == {n.name for n in snapshot.nodes} == {"gpu-node-1"}
    assert [p.node for a in snapshot.allocations for p in a.placements] == ["gpu-node-1"]


def load_dcgm(lines: str) -> DcgmConfig:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(f"sources:\n  dcgm:\n    enabled: true\n    {lines}\n")
    try:
        return load(f.name).sources.dcgm
    finally:
        os.unlink(f.name)


def test_a_configured_node_that_is_no_node_name_is_refused_where_it_is_written():
    with pytest.raises(ConfigError, match=r"^sources\.dcgm\.target_groups\[0\]\.node: 'ALL' is "
                                          r"reserved by Slurm"):
        load_dcgm("target_groups: [{targets: ['127.0.0.1:9400'], node: ALL}]")
    for node in ("ALL", "gpu-[1-4]", 5):
        with pytest.raises(ValueError, match=r"^t\.yaml\[0\]\.labels\.node: "):
            parse_targets_file([{"targets": ["127.0.0.1:9400"], "labels": {"node": node}}], "",
                               "t.yaml")


# -- composing: a UUID joins only within its node -----------------------------------------------

def test_a_telemetry_gpu_with_the_uuid_of_another_nodes_gpu_is_not_joined_to_it():
    scheduled = FleetSnapshot(0.0, nodes=(Node("gpu-005", "H100", 64, "p", "hopper", 1),),
                              gpus=(Gpu("gpu-005", 0, "GPU-x", "H100", "p"),))
    liar = Gpu("gpu-008", 0, "GPU-x", "H100", "", temperature_celsius=99.0)
    own = dataclasses.replace(liar, node="GPU-005.lab", temperature_celsius=30.0)
    joined = compose(1.0, scheduled, FleetSnapshot(0.0, gpus=(liar,)))
    # gpu-008's telemetry stays gpu-008's: it never lands on gpu-005
    assert sorted((g.node, g.temperature_celsius) for g in joined.gpus) == [
        ("gpu-005", None), ("gpu-008", 99.0)]
    assert [u.count for u in joined.unmatched] == [1, 1]
    # the node's own telemetry (its FQDN) still joins by UUID, even beside the liar
    joined = compose(1.0, scheduled, FleetSnapshot(0.0, gpus=(liar, own)))
    assert sorted((g.node, g.temperature_celsius) for g in joined.gpus) == [
        ("gpu-005", 30.0), ("gpu-008", 99.0)]


# -- the prometheus source reading dcgm-exporter's series ------------------------------------------

def test_a_prometheus_scrape_target_speaks_for_its_own_node_only():
    from exporter.sources.dcgm.fields import RateIntegrator
    from exporter.sources.gpu_models import catalogue_resolver
    from exporter.sources.prometheus.source import _Result, build_dcgm_snapshot

    def series(instance: str, node: str, uuid: str, value: float = 30.0) -> dict:
        return {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "instance": instance,
                           "Hostname": node, "UUID": uuid, "gpu": "0", "modelName": H100},
                "value": [1.0, str(value)]}

    temp = [series("10.0.0.5:9400", "gpu-005", "GPU-5"),
            series("10.0.0.8:9400", "gpu-005", "GPU-8"),  # claims gpu-005, other GPU
            series("gpu-006.lab:9400", "gpu-001", "GPU-6"),  # its host is gpu-006
            series("10.0.0.7:9400", "ALL", "GPU-7"),
            series("10.0.0.2:9400", "gpu-002", "GPU-2")]
    up = [{"metric": {"__name__": "up", "instance": s["metric"]["instance"]}, "value": [1.0, "1"]}
          for s in temp]
    results = {"DCGM_FI_DEV_GPU_TEMP": _Result("DCGM_FI_DEV_GPU_TEMP", temp),
               "targets": _Result("targets", up)}
    snapshot, statuses, failed = build_dcgm_snapshot(1.0, results, RateIntegrator(),
                                                     catalogue_resolver())
    assert [(g.node, g.uuid) for g in snapshot.gpus] == [("gpu-002", "GPU-2")]
    assert {s.target: (s.up, s.error) for s in statuses} == {
        "10.0.0.2:9400": (True, ""),
        "10.0.0.5:9400": (False, "refused: node 'gpu-005' is also named by 10.0.0.8:9400 with "
                                 "other GPUs (a conflict; none of them is used)"),
        "10.0.0.8:9400": (False, "refused: node 'gpu-005' is also named by 10.0.0.5:9400 with "
                                 "other GPUs (a conflict; none of them is used)"),
        "gpu-006.lab:9400": (False, "refused: Hostname 'gpu-001' is not this target's node "
                                    "'gpu-006.lab' (the host of its URL)"),
        "10.0.0.7:9400": (False, "refused: Hostname 'ALL' is reserved by Slurm (it names no "
                                 "single node), not a node name")}
    assert failed == 0


# -- the whole path: fake dcgm-exporters read by a real `gpufleet serve` ------------------------

@pytest.mark.slow
def test_a_target_claiming_another_node_or_all_drains_nothing_through_serve(
        tmp_path, exporter_factory):
    """Pools of three nodes each hold a liar: gpu-008 (its node configured) turns to naming
    gpu-005 and reports XID 79, gpu-007 (reached by address) turns to naming ALL with XID
    79. Both are refused, visibly on /metrics, and drain nothing; gpu-006's own XID 79, at
    the same time, is drained and printed alone (the path is live)."""
    from tests.test_advisor_e2e import ENV, Scheduler, metric
    from tests.test_health_slurm import dcgm_body, plan_slurm, publish

    root = tmp_path / "dcgm"
    root.mkdir()
    pools = {"p-a": ("gpu-004", "gpu-005", "gpu-008"), "p-b": ("gpu-001", "gpu-007"),
             "p-c": ("gpu-002", "gpu-006")}
    for node in (n for nodes in pools.values() for n in nodes):
        publish(root, node, dcgm_body(node))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduler = Scheduler(free_port()).start()

    def url(node: str) -> str:
        return f"http://127.0.0.1:{port}/{node}/metrics"

    groups = [{"targets": [url(n) for n in nodes if n != "gpu-008"], "labels": {"pool": pool}}
              for pool, nodes in pools.items()]
    groups.append({"targets": [url("gpu-008")], "labels": {"pool": "p-a", "node": "gpu-008"}})
    (tmp_path / "targets.json").write_text(json.dumps(groups))
    try:
        wait_http(url("gpu-001"), proc=server)
        exporter = exporter_factory("--source", "dcgm", env=ENV, config=f"""
collect_interval: 500ms
source_timeout: 3s
sources:
  dcgm:
    targets_file: {tmp_path / 'targets.json'}
    timeout: 2s
advisor:
  outbox: {tmp_path / 'outbox.sqlite'}
  retry_initial: 200ms
  retry_max: 1s
  receivers:
    - {{name: slurm, url: "http://127.0.0.1:{scheduler.port}/gpufleet/plan", timeout: 5s}}
""")
        wait_until("56 healthy GPUs", lambda: sum(
            metric(exporter.url, "gpufleet_health_gpus", pool=p, verdict="healthy")
            for p in pools) == 56)
        publish(root, "gpu-008", dcgm_body("gpu-008", xid_on_gpu=3).replace(
            'Hostname="gpu-008"', 'Hostname="gpu-005"'))
        publish(root, "gpu-007", dcgm_body("gpu-007", xid_on_gpu=3).replace(
            'Hostname="gpu-007"', 'Hostname="ALL"'))

        def refused() -> bool:
            return all(metric(exporter.url, "gpufleet_source_up", source="dcgm",
                              target=url(n)) == 0 for n in ("gpu-007", "gpu-008"))

        try:
            wait_until("both liars refused", refused, timeout=30)
        except AssertionError:
            raise AssertionError(f"liars not refused; delivered: {scheduler.accepted}") from None
        publish(root, "gpu-006", dcgm_body("gpu-006", xid_on_gpu=3))
        # the drain and the GPU reset are two deliveries, the reset after the drain: on a
        # loaded machine the second came more than two collections after the first
        wait_until("gpu-006's drain and reset delivered", lambda: {b["type"] for b in scheduler.accepted
                                                                   if b.get("node") == "gpu-006"}
                   >= {"drain", "reset_gpu"}, timeout=60)
        # a few more collections: whatever the liars caused would have been decided by now
        seen = metric(exporter.url, "gpufleet_snapshot_timestamp_seconds")
        wait_until("two more collections",
                   lambda: metric(exporter.url, "gpufleet_snapshot_timestamp_seconds") > seen + 1.5)
        assert sorted((b["type"], b.get("node")) for b in scheduler.accepted) == [
            ("drain", "gpu-006"), ("reset_gpu", "gpu-006")]
        assert plan_slurm(exporter.url) == (
            0, 'scontrol update NodeName=gpu-006 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n')
        assert metric(exporter.url, "gpufleet_remediation_events_total", action="page") == 0
        # the refusal is on /metrics, its reason in the snapshot's source status
        assert metric(exporter.url, "gpufleet_source_up", source="dcgm", target=url("gpu-005")) == 1
        assert refused()
        text = http_get(f"{exporter.url}/metrics").decode()
        assert 'node="ALL"' not in text and 'node="gpu-008"' not in text
        assert len([line for line in text.splitlines()
                    if line.startswith("gpufleet_gpu_up{") and 'node="gpu-005"' in line]) == 8
        sources = json.loads(http_get(f"{exporter.url}/v1/snapshot"))["sources"]
        errors = {s["target"]: s["error"] for s in sources if s.get("target")}
        assert errors[url("gpu-008")] == ("refused: Hostname 'gpu-005' is not this target's node "
                                          "'gpu-008' (its configured node)")
        assert errors[url("gpu-007")] == ("refused: Hostname 'ALL' is reserved by Slurm (it names "
                                          "no single node), not a node name")
        log = exporter.log.read_text()
        assert log.count("dcgm target refused") == 2, log[-3000:]
    finally:
        scheduler.close()
        stop(server)
