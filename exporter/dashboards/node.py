"""``gpufleet-node.json``: the drill-down, per node and GPU.

Every per-GPU metric over time, the MIG instances, and the job holding each
GPU (from ``gpufleet_gpu_allocation_info``, the only series that carries job
metadata). Nodes are chosen one or a few at a time: 1,088 GPUs on one chart
answer no question.
"""

from __future__ import annotations

import re

from grafanalib import core

from exporter import metrics as m
from exporter.dashboards import panels as p
from exporter.dashboards import promql as q
from exporter.dashboards.levels import DashboardLevels

UID = "gpufleet-node"
FILE = "gpufleet-node.json"
TITLE = "gpufleet / Node and GPU"

DATA_ONLY_WHEN_FIRING: tuple[str, ...] = ()

GPU_LEGEND = "{{node}}/{{gpu}}"


def _per_gpu(title: str, metric_expr: str, unit: str, **options) -> core.TimeSeries:
    return p.timeseries(title, p.targets((metric_expr, GPU_LEGEND)), unit, **options)


def build(levels: DashboardLevels) -> core.Dashboard:
    g = q.selector(q.GPU)
    n = q.selector(q.NODE)
    layout = p.Layout()

    layout.row("Nodes")
    columns = ("GPUs", "GPUs allocated", "CPU cores", "CPU cores allocated")
    layout.add(p.table(
        "Nodes",
        p.targets(
            (f"count by (node, pool, model) ({m.GPU_INFO.name}{n})", ""),
            (f"sum by (node, pool, model) ({m.GPU_ALLOCATED_RATIO.name}{n})", ""),
            (f"sum by (node, pool, model) ({m.NODE_CPU_CORES.name}{n})", ""),
            (f"sum by (node, pool, model) ({m.NODE_CPU_ALLOCATED_CORES.name}{n})", ""),
            instant=True,
        ),
        "none",
        rename={f"Value #{chr(ord('A') + i)}": name for i, name in enumerate(columns)},
        order=("node", "pool", "model", *(f"Value #{chr(ord('A') + i)}" for i in range(4))),
        sort_by="node", descending=False,
    ), 14, 6)
    layout.add(p.stat("MIG instances",
                      p.targets((f"count({m.GPU_MIG_INSTANCE_INFO.name}{g}) or vector(0)", "")),
                      "none", graph=False,
                      description="MIG GPU instances on the selected GPUs."), 5, 6)
    layout.add(p.stat("Energy in the time range",
                      p.targets((f"sum(increase({m.GPU_ENERGY_JOULES_TOTAL.name}{g}[$__range]))",
                                 "")),
                      "joule", graph=False,
                      description="Energy the selected GPUs consumed over the dashboard's "
                                  "time range."), 5, 6)

    layout.row("Jobs and MIG instances")
    layout.add(p.table(
        "Job holding each GPU",
        p.targets((q.allocations(g), ""), instant=True), "none",
        hide=("Value", "uuid", "job", "exported_job", "model", "pool"),
        rename={"job_name": "job", "job_gpus": "job GPUs"},
        order=("node", "gpu", "job_name", "namespace", "pod", "job_gpus", "priority"),
        sort_by="gpu", descending=False,
        description=f"From {m.GPU_ALLOCATION_INFO.name}; a GPU shared by several jobs has one "
                    "row per job, an idle GPU none.",
    ), 12, 9)
    layout.add(p.table(
        "MIG instances",
        p.targets((f"{m.GPU_MIG_MEMORY_USED_BYTES.name}{g}", ""),
                  (f"{m.GPU_MIG_MEMORY_TOTAL_BYTES.name}{g}", ""), instant=True),
        "bytes",
        hide=("uuid", "job", "model", "pool"),
        rename={"Value #A": "memory used", "Value #B": "memory total"},
        order=("node", "gpu", "gpu_instance", "profile", "Value #A", "Value #B"),
        sort_by="gpu", descending=False,
        description="Empty unless the selected GPUs run in MIG mode.",
    ), 12, 9)
    layout.add(p.timeseries(
        "MIG instance memory used",
        p.targets((f"{m.GPU_MIG_MEMORY_USED_BYTES.name}{g}",
                   "{{node}}/{{gpu}} {{profile}} #{{gpu_instance}}")),
        "bytes", minimum=0,
        description="Empty unless the selected GPUs run in MIG mode.",
    ), 24, 8)

    layout.row("GPU metrics")
    layout.add(p.timeseries(
        "Up and stale",
        p.targets((f"{m.GPU_UP.name}{g}", f"{GPU_LEGEND} up"),
                  (f"{m.GPU_STALE.name}{g}", f"{GPU_LEGEND} stale")),
        "none", minimum=0, maximum=1, step_after=True, fill=0,
        description="up 1: the GPU answered its last read. stale 1: the values are the last "
                    "good reading because the source fails.",
    ), 12, 8)
    layout.add(_per_gpu("Allocated share", f"{m.GPU_ALLOCATED_RATIO.name}{g}", "percentunit",
                        minimum=0, maximum=1, step_after=True,
                        description="Share of the GPU held by jobs."), 12, 8)
    layout.add(_per_gpu("Utilization", f"{m.GPU_UTILIZATION_RATIO.name}{g}", "percentunit",
                        minimum=0, maximum=1), 12, 8)
    layout.add(_per_gpu("Memory used ratio", levels.query("gpu_memory_used", g), "percentunit",
                        steps=levels.steps("gpu_memory_used"), minimum=0, maximum=1,
                        description=f"Lines: the GPU memory alert's levels from "
                                    f"{levels.source}."), 12, 8)
    layout.add(p.timeseries(
        "Memory used and total",
        p.targets((f"{m.GPU_MEMORY_USED_BYTES.name}{g}", f"{GPU_LEGEND} used"),
                  (f"{m.GPU_MEMORY_TOTAL_BYTES.name}{g}", f"{GPU_LEGEND} total")),
        "bytes", minimum=0,
    ), 12, 8)
    layout.add(_per_gpu("Temperature", levels.query("gpu_temperature", g), "celsius",
                        steps=levels.steps("gpu_temperature"),
                        description=f"Lines: the temperature alert's levels from "
                                    f"{levels.source}."), 12, 8)
    layout.add(p.timeseries(
        "Power against limit",
        p.targets((f"{m.GPU_POWER_WATTS.name}{g}", f"{GPU_LEGEND} draw"),
                  (f"{m.GPU_POWER_LIMIT_WATTS.name}{g}", f"{GPU_LEGEND} limit")),
        "watt", minimum=0,
    ), 12, 8)
    layout.add(p.bar_gauge(
        "Power draw now",
        p.targets((levels.query("gpu_power", g), "{{model}} " + GPU_LEGEND)),
        "watt",
        overrides=[p.by_name_thresholds(f"^{re.escape(model)} ", steps, regex=True)
                   for model, steps in levels.power()],
        description=f"Coloured by the power alert's levels for each GPU's model from "
                    f"{levels.source}.",
    ), 12, 8)
    layout.add(_per_gpu("Power from the energy counter",
                        f"rate({m.GPU_ENERGY_JOULES_TOTAL.name}{g}[$__rate_interval])", "watt",
                        minimum=0,
                        description="Mean power over each interval, from "
                                    f"{m.GPU_ENERGY_JOULES_TOTAL.name}."), 12, 8)
    layout.add(p.timeseries(
        "NVLink traffic against capacity",
        p.targets(
            (f"rate({m.GPU_NVLINK_TRANSMIT_BYTES_TOTAL.name}{g}[$__rate_interval])",
             f"{GPU_LEGEND} transmit"),
            (f"rate({m.GPU_NVLINK_RECEIVE_BYTES_TOTAL.name}{g}[$__rate_interval])",
             f"{GPU_LEGEND} receive"),
            (f"{m.GPU_NVLINK_CAPACITY_BYTES_PER_SECOND.name}{g}", f"{GPU_LEGEND} capacity"),
        ),
        "Bps", minimum=0,
        description="Capacity is both directions together, from the GPU catalogue.",
    ), 12, 8)
    layout.add(_per_gpu("NVLink utilization", q.nvlink_utilization(g), "percentunit",
                        minimum=0, maximum=1,
                        description="Share of NVLink bandwidth in use over 5 min, of every GPU "
                                    "(the NVLink alert compares only busy GPUs of multi-GPU "
                                    "jobs)."),
                12, 8)

    _health_row(layout)

    return p.dashboard(
        uid=UID, title=TITLE, tags=("gpufleet",), layout=layout,
        description="Per node and GPU: every per-GPU metric, health counters, MIG instances "
                    "and the job holding each GPU.",
        variables=[
            *p.pool_and_model_variables(),
            p.query_variable("node", "Node",
                             f"label_values({m.GPU_INFO.name}{q.selector(q.FLEET)}, node)",
                             include_all=False),
            p.query_variable("gpu", "GPU", f"label_values({m.GPU_INFO.name}"
                             f"{q.selector((*q.CLUSTER, ('node', 'node')))}, gpu)"),
        ],
        links=[p.dashboard_link("Fleet overview", "gpufleet-fleet"),
               p.dashboard_link("Fragmentation", "gpufleet-fragmentation")],
    )


def _health_row(layout: p.Layout) -> None:
    """XID events, ECC, remapped rows, throttle reasons and NVLink errors (issue 16).

    Counters are drawn as events per interval (their increase), not as totals: a total of
    3 single-bit errors since the driver loaded says nothing about now. Where no event was
    ever seen, XIDs draw as 0 ("none"), not as "No data"."""
    g = q.selector(q.GPU)
    layout.row("Health")
    xids = f"sum by (cluster, node, gpu, xid) ({q.xid_events(g, '$__rate_interval')})"
    layout.add(_per_gpu_by(
        "XID errors", q.zero_filled_by_gpu(xids, g, "xid", "none"), "xid", "XID {{xid}}",
        description="XID events per interval, by code, from NVML's event set (a GPU's first "
                    "XID of a code included). XID none: no XID since the exporter started. "
                    f"The dcgm source relays only the last XID ({m.GPU_LAST_XID.name}), so "
                    "this stays at none there. GpuXidError pages on the table's critical "
                    "XIDs."), 12, 8)
    ecc = q.selector(q.GPU, 'counter="volatile"')
    layout.add(_per_gpu_by(
        "ECC errors", f"sum by (cluster, node, gpu, type) "
        f"(increase({m.GPU_ECC_ERRORS_TOTAL.name}{ecc}[$__rate_interval]))", "type", "{{type}}",
        description="ECC errors per interval (volatile counters). single_bit: corrected; "
                    "double_bit: uncorrected, GpuEccUncorrectable pages."), 12, 8)
    layout.add(p.timeseries(
        "Remapped rows and retired pages",
        p.targets((f"{m.GPU_REMAPPED_ROWS_TOTAL.name}{g} or {m.GPU_RETIRED_PAGES_TOTAL.name}{g}",
                   f"{GPU_LEGEND} {{{{cause}}}}")),
        "none", minimum=0, step_after=True,
        description="Memory rows the GPU remapped (Ampere and later; cause correctable or "
                    "uncorrectable), or pages it retired (earlier GPUs; cause single_bit or "
                    "double_bit), over the GPU's life."), 12, 8)
    layout.add(p.timeseries(
        "Row remap pending or failed",
        p.targets((f"{m.GPU_REMAPPED_ROWS_PENDING.name}{g}", f"{GPU_LEGEND} pending"),
                  (f"{m.GPU_REMAPPED_ROWS_FAILURE.name}{g}", f"{GPU_LEGEND} failed")),
        "none", minimum=0, maximum=1, step_after=True, fill=0,
        description="pending 1: a remap waits for a GPU reset (GpuRowRemapPending). failed 1: "
                    "no spare rows left, the GPU needs replacing (GpuRowRemapFailed)."), 12, 8)
    layout.add(p.timeseries(
        "Throttle reasons",
        p.targets((f"{m.GPU_CLOCK_EVENT_ACTIVE.name}{g}", f"{GPU_LEGEND} {{{{reason}}}}")),
        "none", minimum=0, maximum=1, step_after=True, fill=0,
        description="1 while the reason holds the GPU's clocks down. hw_thermal, sw_thermal, "
                    "hw_power_brake and hw_slowdown on a busy GPU for most of 10 min open "
                    "GpuClocksThrottled; sw_power_cap on a busy GPU, GpuPowerCapped; "
                    "hw_power_brake near the power limit, GpuPowerHigh; "
                    "sync_boost follows another GPU of the group."), 12, 8)
    layout.add(_per_gpu_by(
        "NVLink errors", f"sum by (cluster, node, gpu, type) "
        f"(increase({m.GPU_NVLINK_ERRORS_TOTAL.name}{g}[$__rate_interval]))", "type", "{{type}}",
        description="NVLink errors per interval, summed over the GPU's links. replay or "
                    "recovery: GpuNvlinkErrors; crc_flit and crc_data are corrected by replays "
                    "and open GpuNvlinkCrcErrors from 100 a second."), 12, 8)


def _per_gpu_by(title: str, expr: str, label: str, legend: str, *,
                description: str) -> core.TimeSeries:
    """A per-GPU series split by ``label``: one line per GPU and value of it."""
    assert f"{{{{{label}}}}}" in legend
    return p.timeseries(title, p.targets((expr, f"{GPU_LEGEND} {legend}")), "none", minimum=0,
                        description=description)
