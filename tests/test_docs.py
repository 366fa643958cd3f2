"""The catalogue (exporter/metrics.py) against what /metrics really serves, and docs/metrics.md against it.

What /metrics serves is read from the golden exposition, tests/golden/metrics.txt:
the default simulated fleet's real /metrics, which tests/test_golden.py checks
byte for byte against a live render. Not a grep of the source: a family dropped
from /metrics fails here even if its name is still written somewhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from exporter import metrics
from exporter.exposition import render_text
from exporter.fleet_sim.fleet import Simulation
from exporter.metrics import CATALOGUE
from exporter.snapshot import JobRequest, SourceStatus, TargetCount, UnmatchedGpus, XidCount
from exporter.sources.sim.options import SimSource
from tests.helpers.golden_metrics import GOLDEN
from tests.helpers.metrics_doc import DOC, generate

# Every family's HELP and TYPE lines are served even when it has no series, so each one is
# on the default fleet's /metrics. These have no *series* there, and why:
NO_SERIES_ON_THE_DEFAULT_FLEET = {
    "gpufleet_gpu_dcgm_nvlink_bandwidth_raw": "dcgm source only; the default fleet is simulated",
    "gpufleet_pending_jobs": "the default simulation queues no jobs",
    "gpufleet_gpu_nvlink_utilization_ratio": "one collection: a rate needs two readings",
    "gpufleet_pending_gpus": "the default simulation queues no jobs",
    "gpufleet_compose_unmatched_gpus": "only when an allocation and a telemetry source are composed",
    "gpufleet_source_series_refused_total": "prometheus source only, once a target spoke for a "
                                            "node not its own",
    "gpufleet_advisor_plan_nodes_freed": "no plan proposed after one collection",
    "gpufleet_advisor_webhook_deliveries_total": "no webhook receiver configured by default",
    "gpufleet_advisor_alertmanager_notifications_total": "no Alertmanager notification received",
    "gpufleet_gpu_fan_speed_ratio": "the simulated GPUs are passively cooled (as SXM boards)",
    "gpufleet_gpu_retired_pages_total": "no pre-Ampere GPU in the fleet: they remap rows instead",
    "gpufleet_gpu_retired_pages_pending": "no pre-Ampere GPU in the fleet: they remap rows instead",
    "gpufleet_gpu_xid_errors_total": "no XID on the default fleet (the xid scenario adds one)",
    "gpufleet_gpu_last_xid": "no XID on the default fleet (the xid scenario adds one)",
    "gpufleet_gpu_last_xid_timestamp_seconds": "no XID on the default fleet",
    "gpufleet_pool_idle_allocated_gpus": "one collection: no job has been idle for 2 h yet",
    "gpufleet_pool_idle_allocated_gpu_seconds": "one collection: no job has been idle for 2 h yet",
    "gpufleet_pool_right_sizing_gpus": "no pool of the default fleet is under pressure",
    "gpufleet_pool_right_sizing_gpu_seconds": "no pool of the default fleet is under pressure",
    "gpufleet_pool_load_last_change_timestamp_seconds": "one collection: no load change detected yet",
    "gpufleet_node_health_verdict": "every node of the default fleet is healthy (only others have series)",
    "gpufleet_gpu_health_verdict": "every GPU of the default fleet is healthy (only others have series)",
    "gpufleet_node_faults": "no node of the default fleet has a fault",
    "gpufleet_job_straggler_gpus": "one collection: no GPU has been out of step for 10 min",
    "gpufleet_job_preempted_wait_seconds": "the default simulation preempts no job",
    "gpufleet_job_preemption_lost_seconds": "the default simulation preempts no job",
    "gpufleet_node_drained": "the simulator says nothing of drains (slurm source only)",
    "gpufleet_gpu_owner_memory_used_bytes": "NVML source only: the simulator runs no processes",
    "gpufleet_gpu_owner_sm_utilization_ratio": "NVML source only: the simulator runs no processes",
    "gpufleet_gpu_owner_processes": "NVML source only: the simulator runs no processes",
    "gpufleet_gpu_processes_unattributed": "NVML source only: the simulator runs no processes",
    "gpufleet_gpu_processes_cut_total": "NVML source only: the simulator runs no processes",
}
# Labels a family's series may lack: (family, label) -> when the label is there.
OPTIONAL_LABELS = {
    ("gpufleet_source_up", "target"): "only on the series of one target of a multi-target source",
    ("gpufleet_gpu_info", "serial"): "only where the site exports GPU serials (off by default)",
}
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? \S+$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


@dataclasses.dataclass
class Served:
    type: str = ""
    help: str = ""
    label_sets: set[frozenset[str]] = dataclasses.field(default_factory=set)


def served(text: str) -> dict[str, Served]:
    """Family name -> its TYPE, HELP (as written, escaped) and label-name sets, in served order."""
    out: dict[str, Served] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            out.setdefault(name, Served()).help = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            out.setdefault(name, Served()).type = kind
        elif line:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            labels = frozenset(_LABEL.findall(match.group("labels") or ""))
            out[match.group("name")].label_sets.add(labels)
    return out


def _escaped(help_text: str) -> str:
    return help_text.replace("\\", r"\\").replace("\n", r"\n")


def test_the_catalogue_is_what_metrics_serves_in_order():
    golden = served(GOLDEN.read_text())
    assert list(golden) == list(CATALOGUE), "the catalogue lists the families /metrics serves, in order"
    for name, spec in CATALOGUE.items():
        assert golden[name].type == spec.type, name
        assert golden[name].help == _escaped(spec.help), name


def test_families_without_series_on_the_default_fleet_are_listed_with_a_reason():
    golden = served(GOLDEN.read_text())
    empty = {name for name, family in golden.items() if not family.label_sets}
    assert empty == set(NO_SERIES_ON_THE_DEFAULT_FLEET)
    assert set(NO_SERIES_ON_THE_DEFAULT_FLEET) <= set(CATALOGUE)


def _check_labels(families: dict[str, Served]) -> None:
    for name, family in families.items():
        assert name in CATALOGUE, f"served but not in exporter/metrics.py: {name}"
        declared = set(CATALOGUE[name].labels)
        optional = {label for (family_name, label) in OPTIONAL_LABELS if family_name == name}
        for labels in family.label_sets:
            assert declared - optional <= labels <= declared, (name, sorted(labels), sorted(declared))


def test_served_series_carry_the_declared_labels():
    _check_labels(served(GOLDEN.read_text()))


def test_families_the_default_fleet_leaves_empty_carry_the_declared_labels_too():
    """The exposition families the golden file has no series of, from a snapshot that has them."""
    snapshot = Simulation(SimSource(seed=3), start_time=1_760_000_000.0).snapshot()
    first = snapshot.gpus[0]
    health = dataclasses.replace(first.health, xid_counts=(XidCount(79, 1),), last_xid=79,
                                 last_xid_time=1_760_000_000.0, retired_pages_single_bit=2,
                                 retired_pages_double_bit=0, retired_pages_pending=False)
    performance = dataclasses.replace(first.performance, fan_speed_ratio=0.4)
    gpus = (dataclasses.replace(first, dcgm_nvlink_bandwidth_raw=12.5, health=health,
                                performance=performance, serial="1654923012345"),
            *snapshot.gpus[1:])
    snapshot = dataclasses.replace(
        snapshot, gpus=gpus,
        pending=(JobRequest("queued", 2, pool="gpu-h100"),),
        unmatched=(UnmatchedGpus("telemetry", 3),),
        sources=(SourceStatus("sim", True, 0.0, 1_760_000_000.0,
                              series_refused=(TargetCount("gpufleet-nodes/10.0.0.5:9874", 3),)),
                 SourceStatus("dcgm", True, 0.0, None, target="http://node:9400")))
    families = served(render_text(snapshot).decode())
    for name in ("gpufleet_gpu_dcgm_nvlink_bandwidth_raw", "gpufleet_pending_jobs",
                 "gpufleet_gpu_xid_errors_total", "gpufleet_gpu_last_xid",
                 "gpufleet_gpu_last_xid_timestamp_seconds", "gpufleet_gpu_retired_pages_total",
                 "gpufleet_gpu_retired_pages_pending", "gpufleet_gpu_fan_speed_ratio",
                 "gpufleet_pending_gpus", "gpufleet_compose_unmatched_gpus",
                 "gpufleet_source_series_refused_total"):
        assert families[name].label_sets, name
    assert frozenset({"source", "target"}) in families["gpufleet_source_up"].label_sets
    _check_labels(families)


def test_docs_tables_are_generated_from_the_catalogue():
    text = DOC.read_text()
    generated = generate(text)
    if generated != text:
        diff = difflib.unified_diff(text.splitlines(), generated.splitlines(), "docs/metrics.md",
                                    "generated", lineterm="", n=1)
        raise AssertionError("docs/metrics.md differs from the catalogue (make generate-docs "
                             "rewrites it):\n" + "\n".join(diff))


def test_every_family_has_exactly_one_row_in_the_docs():
    rows = re.findall(r"^\| `(gpufleet_[a-z0-9_]+)` \|", DOC.read_text(), re.M)
    assert sorted(rows) == sorted(CATALOGUE)
    assert metrics.GPU_UP.name in rows  # the pattern above really matches rows
